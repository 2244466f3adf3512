//! Data that moves between components: transition batches (actors → replay) and
//! parameter snapshots (learner → actors).

use serde::{Deserialize, Serialize};

use crate::spec::SpecError;

/// Transitions as columns already in tensor layout (struct of arrays).
///
/// Row `i` is an n-step transition: from `obs[i]` the actor took `actions[i]`, collected
/// the discounted return `rewards[i]` over up to n steps, and reached `next_obs[i]`.
/// `discounts[i]` is `γ^k` for the k steps taken, or `0` when the episode *terminated*
/// inside them (a truncated episode still bootstraps), so the learner's target is simply
/// `r + discount · Q_target(next_obs)` and never needs γ, n or episode flags.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TransitionBatch {
    /// Which actor slot produced the batch.
    pub actor_id: u32,
    /// Per-actor sequence number, to spot gaps and duplicates.
    pub seq: u64,
    /// Parameter version of the policy that chose these actions.
    pub version: u64,
    /// Bytes of one observation row (`ObsSpec::row_bytes`).
    pub obs_row_bytes: usize,
    pub obs: Vec<u8>,
    pub next_obs: Vec<u8>,
    pub actions: Vec<i64>,
    pub rewards: Vec<f32>,
    pub discounts: Vec<f32>,
}

impl TransitionBatch {
    pub fn with_capacity(obs_row_bytes: usize, rows: usize) -> Self {
        Self {
            obs_row_bytes,
            obs: Vec::with_capacity(rows * obs_row_bytes),
            next_obs: Vec::with_capacity(rows * obs_row_bytes),
            actions: Vec::with_capacity(rows),
            rewards: Vec::with_capacity(rows),
            discounts: Vec::with_capacity(rows),
            ..Self::default()
        }
    }

    /// Number of transitions.
    pub fn len(&self) -> usize {
        self.actions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.actions.is_empty()
    }

    /// Appends one transition with `f32` observations.
    pub fn push_f32(
        &mut self,
        obs: &[f32],
        action: i64,
        reward: f32,
        discount: f32,
        next_obs: &[f32],
    ) {
        self.obs.extend_from_slice(bytemuck::cast_slice(obs));
        self.next_obs
            .extend_from_slice(bytemuck::cast_slice(next_obs));
        self.actions.push(action);
        self.rewards.push(reward);
        self.discounts.push(discount);
    }

    /// Removes all rows, keeping the allocations.
    pub fn clear(&mut self) {
        self.obs.clear();
        self.next_obs.clear();
        self.actions.clear();
        self.rewards.clear();
        self.discounts.clear();
    }

    /// Checks that every column has the same number of rows and the expected row size.
    /// Anything that arrives from outside goes through this before it is stored.
    pub fn validate(&self, obs_row_bytes: usize) -> Result<(), SpecError> {
        let rows = self.actions.len();
        let checks = [
            ("obs row bytes", obs_row_bytes, self.obs_row_bytes),
            ("obs column", rows * obs_row_bytes, self.obs.len()),
            ("next_obs column", rows * obs_row_bytes, self.next_obs.len()),
            ("rewards column", rows, self.rewards.len()),
            ("discounts column", rows, self.discounts.len()),
        ];
        for (what, expected, got) in checks {
            if expected != got {
                return Err(SpecError::Length {
                    what,
                    expected,
                    got,
                });
            }
        }
        Ok(())
    }
}

impl TransitionBatch {
    /// Checks the values a learner relies on, for batches from outside the process:
    /// actions in `0..num_actions`, finite rewards, discounts in `[0, 1]`.
    pub fn check_values(&self, num_actions: usize) -> Result<(), SpecError> {
        if let Some(a) = self
            .actions
            .iter()
            .find(|a| !(0..num_actions as i64).contains(a))
        {
            return Err(SpecError::BadValue(format!(
                "action {a} outside 0..{num_actions}"
            )));
        }
        if self.rewards.iter().any(|r| !r.is_finite()) {
            return Err(SpecError::BadValue("non-finite reward".into()));
        }
        if self.discounts.iter().any(|d| !(0.0..=1.0).contains(d)) {
            return Err(SpecError::BadValue("discount outside [0, 1]".into()));
        }
        Ok(())
    }
}

/// A published parameter snapshot: all agents' flat parameters, `[K, P]` row-major.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// Incremented by the learner each time it publishes.
    pub version: u64,
    pub population: usize,
    pub data: Vec<f32>,
}

impl Params {
    /// The flat parameters of agent `k`.
    pub fn agent(&self, k: usize) -> &[f32] {
        let p = self.data.len() / self.population.max(1);
        &self.data[k * p..(k + 1) * p]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_builds_aligned_columns() {
        let mut b = TransitionBatch::with_capacity(8, 2);
        b.push_f32(&[1.0, 2.0], 1, 0.5, 0.99, &[3.0, 4.0]);
        b.push_f32(&[5.0, 6.0], 0, 1.0, 0.0, &[7.0, 8.0]);
        assert_eq!(b.len(), 2);
        assert_eq!(b.validate(8), Ok(()));
        let next: &[f32] = bytemuck::cast_slice(&b.next_obs[8..]);
        assert_eq!(next, [7.0, 8.0]);
    }

    #[test]
    fn check_values_rejects_out_of_range_rows() {
        let mut b = TransitionBatch::with_capacity(4, 2);
        b.push_f32(&[1.0], 1, 0.5, 0.99, &[3.0]);
        assert_eq!(b.check_values(2), Ok(()));
        assert!(b.check_values(1).is_err(), "action 1 with one action");
        b.rewards[0] = f32::NAN;
        assert!(b.check_values(2).is_err());
        b.rewards[0] = 0.0;
        b.discounts[0] = 1.5;
        assert!(b.check_values(2).is_err());
    }

    #[test]
    fn validate_names_the_bad_column() {
        let mut b = TransitionBatch::with_capacity(8, 1);
        b.push_f32(&[1.0, 2.0], 1, 0.5, 0.99, &[3.0, 4.0]);
        b.rewards.push(1.0);
        assert_eq!(
            b.validate(8),
            Err(SpecError::Length {
                what: "rewards column",
                expected: 1,
                got: 2
            })
        );
        assert!(matches!(b.validate(4), Err(SpecError::Length { .. })));
    }
}
