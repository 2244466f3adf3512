//! Transition batches: what actors hand to replay, in process or over the wire.

use serde::{Deserialize, Serialize};

use crate::bounds::ValueBounds;
use crate::frames::FrameLinks;
use crate::spec::{DType, SpecError};

/// Transitions as columns already in tensor layout (struct of arrays), with each
/// observation stored once.
///
/// `obs` holds observation rows; transition `i` goes from row `obs_index[i]`, where the
/// actor took `actions[i]` and collected the discounted return `rewards[i]` over up to n
/// steps, to row `next_index[i]`. Consecutive steps of an environment share rows (the
/// next observation of one step is the observation of the following one), so a batch
/// of T transitions from E environments holds about T + E·n rows instead of 2T: replay
/// keeps roughly one observation per transition (no duplicated next observation).
/// `discounts[i]` is `γ^k` for the k steps taken, or `0` when the episode *terminated*
/// inside them (a truncated episode still bootstraps), so the learner's target is simply
/// `r + discount · Q_target(next)` and never needs γ, n or episode flags. A batch is
/// self-contained: indices refer to its own rows only.
///
/// Stacked pixel observations travel in *frame mode* instead (`frames` is set): `obs`
/// holds single frames, and [`FrameLinks`] says how they stack and which observations
/// the transitions go between, across batches of the same actor.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TransitionBatch {
    /// Which actor produced the batch (the learner overwrites what a remote actor
    /// claims with the identity of its connection).
    pub actor_id: u32,
    /// The population agent whose policy acted (0 for a single agent).
    pub agent: u32,
    /// Per-actor sequence number, to spot gaps and duplicates.
    pub seq: u64,
    /// Parameter version of the policy that chose these actions.
    pub version: u64,
    /// Bytes of one observation row (`ObsSpec::row_bytes`).
    pub obs_row_bytes: usize,
    /// Observation rows, `obs_row_bytes` each, as raw bytes (one `memcpy` to encode
    /// and decode, not one call per byte).
    #[serde(with = "serde_bytes")]
    pub obs: Vec<u8>,
    pub obs_index: Vec<u32>,
    pub next_index: Vec<u32>,
    pub actions: Vec<i64>,
    pub rewards: Vec<f32>,
    pub discounts: Vec<f32>,
    /// Initial replay priorities, one per transition (Ape-X: the actor's own TD
    /// errors), or empty to let replay choose.
    pub priorities: Vec<f32>,
    /// Frame mode: the stream links of the frames in `obs` (then `obs_index` and
    /// `next_index` are empty and `obs_row_bytes` is the size of one frame).
    pub frames: Option<Box<FrameLinks>>,
}

/// How far past its target an actor's batch may grow, for an actor of `envs`
/// environments building `n_step` returns: the one place the actor (sizing its
/// batches), the learner's server (choosing a remote actor's target) and replay
/// (sizing its observation store) read the bound from.
///
/// A batch is handed over once it holds its target of transitions, but the step that
/// reaches the target may complete one n-step flush per environment, and with whole
/// observations each environment carries its current and pending observations over,
/// plus an episode start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overshoot {
    /// Transitions past the target: `envs · n_step`.
    pub transitions: usize,
    /// Observation rows past the target: `envs · 2 · (n_step + 1)`.
    pub obs_rows: usize,
}

impl Overshoot {
    pub fn of(envs: usize, n_step: usize) -> Self {
        Self {
            transitions: envs.saturating_mul(n_step),
            obs_rows: envs
                .saturating_mul(2)
                .saturating_mul(n_step.saturating_add(1)),
        }
    }
}

impl TransitionBatch {
    /// Room for `rows` transitions and `obs_rows` observation rows.
    pub fn with_capacity(obs_row_bytes: usize, rows: usize, obs_rows: usize) -> Self {
        Self {
            obs_row_bytes,
            obs: Vec::with_capacity(obs_rows * obs_row_bytes),
            obs_index: Vec::with_capacity(rows),
            next_index: Vec::with_capacity(rows),
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

    /// Number of observation rows.
    pub fn obs_rows(&self) -> usize {
        self.obs.len().checked_div(self.obs_row_bytes).unwrap_or(0)
    }

    /// Observation row `i`.
    pub fn obs_row(&self, i: u32) -> &[u8] {
        let rb = self.obs_row_bytes;
        &self.obs[i as usize * rb..(i as usize + 1) * rb]
    }

    /// Appends an observation row given as raw bytes; returns its index.
    pub fn push_obs_bytes(&mut self, row: &[u8]) -> u32 {
        debug_assert_eq!(row.len(), self.obs_row_bytes);
        let i = self.obs_rows() as u32;
        self.obs.extend_from_slice(row);
        i
    }

    /// Appends an `f32` observation row; returns its index.
    pub fn push_obs_f32(&mut self, row: &[f32]) -> u32 {
        self.push_obs_bytes(bytemuck::cast_slice(row))
    }

    /// Appends a transition between two rows already in the batch.
    pub fn push_transition(
        &mut self,
        obs_index: u32,
        action: i64,
        reward: f32,
        discount: f32,
        next_index: u32,
    ) {
        self.obs_index.push(obs_index);
        self.next_index.push(next_index);
        self.actions.push(action);
        self.rewards.push(reward);
        self.discounts.push(discount);
    }

    /// Appends one transition with its own two `f32` observation rows (tests and
    /// synthetic load; actors share rows between steps instead).
    pub fn push_f32(
        &mut self,
        obs: &[f32],
        action: i64,
        reward: f32,
        discount: f32,
        next_obs: &[f32],
    ) {
        let o = self.push_obs_f32(obs);
        let n = self.push_obs_f32(next_obs);
        self.push_transition(o, action, reward, discount, n);
    }

    /// Empties the batch to be filled again with rows of `obs_row_bytes`, with room for
    /// `rows` transitions and `obs_rows` observation rows: its allocations are kept
    /// (grown where smaller), so a batch that comes back from where it was handed costs
    /// nothing to refill. Frame links, if any, are emptied and kept too: a caller
    /// building whole-observation batches sets `frames` to `None` itself.
    pub fn reuse(&mut self, obs_row_bytes: usize, rows: usize, obs_rows: usize) {
        self.clear();
        self.actor_id = 0;
        self.agent = 0;
        self.seq = 0;
        self.version = 0;
        self.obs_row_bytes = obs_row_bytes;
        // On an empty vector, `reserve(n)` makes the capacity at least `n`.
        self.obs.reserve(obs_rows * obs_row_bytes);
        self.obs_index.reserve(rows);
        self.next_index.reserve(rows);
        self.actions.reserve(rows);
        self.rewards.reserve(rows);
        self.discounts.reserve(rows);
    }

    /// Removes all rows, keeping the allocations.
    pub fn clear(&mut self) {
        self.obs.clear();
        self.obs_index.clear();
        self.next_index.clear();
        self.actions.clear();
        self.rewards.clear();
        self.discounts.clear();
        self.priorities.clear();
        if let Some(f) = &mut self.frames {
            f.clear();
        }
    }

    /// Checks that every column has the same number of rows, the expected row size, and
    /// indices that point at rows of this batch. Anything that arrives from outside goes
    /// through this before it is stored.
    ///
    /// `obs_row_bytes` is the size of a whole observation; `stack > 1` expects frame
    /// mode with that many frames of `obs_row_bytes / stack` bytes per observation.
    pub fn validate(&self, obs_row_bytes: usize, stack: usize) -> Result<(), SpecError> {
        let rows = self.actions.len();
        if stack > 1 {
            if !obs_row_bytes.is_multiple_of(stack) {
                return Err(SpecError::BadValue(format!(
                    "an observation of {obs_row_bytes} bytes is not {stack} equal frames"
                )));
            }
            return self.validate_frames(obs_row_bytes / stack, stack);
        }
        if self.frames.is_some() {
            return Err(SpecError::BadValue(
                "frame-mode batch where whole observations are expected".into(),
            ));
        }
        self.validate_rows(obs_row_bytes)?;
        let checks = [
            ("obs_index column", rows, self.obs_index.len()),
            ("next_index column", rows, self.next_index.len()),
        ];
        SpecError::check_lengths(&checks)?;
        let obs_rows = self.obs_rows();
        if let Some(i) = self
            .obs_index
            .iter()
            .chain(&self.next_index)
            .find(|i| **i as usize >= obs_rows)
        {
            return Err(SpecError::BadValue(format!(
                "observation index {i} outside the batch's {obs_rows} rows"
            )));
        }
        Ok(())
    }

    fn validate_frames(&self, frame_bytes: usize, stack: usize) -> Result<(), SpecError> {
        let Some(links) = &self.frames else {
            return Err(SpecError::BadValue(
                "whole observations where a frame-mode batch is expected".into(),
            ));
        };
        self.validate_rows(frame_bytes)?;
        if !(self.obs_index.is_empty() && self.next_index.is_empty()) {
            return Err(SpecError::BadValue(
                "a frame-mode batch with row indices".into(),
            ));
        }
        links.validate(stack, self.obs_rows(), self.len())
    }

    /// The row size, whole rows, and columns as long as the actions column.
    fn validate_rows(&self, obs_row_bytes: usize) -> Result<(), SpecError> {
        let rows = self.actions.len();
        if self.obs_row_bytes != obs_row_bytes {
            return Err(SpecError::Length {
                what: "obs row bytes",
                expected: obs_row_bytes,
                got: self.obs_row_bytes,
            });
        }
        if obs_row_bytes == 0 || !self.obs.len().is_multiple_of(obs_row_bytes) {
            return Err(SpecError::Length {
                what: "obs column (whole rows)",
                expected: self.obs_rows() * obs_row_bytes,
                got: self.obs.len(),
            });
        }
        if !self.priorities.is_empty() && self.priorities.len() != rows {
            return Err(SpecError::Length {
                what: "priorities column",
                expected: rows,
                got: self.priorities.len(),
            });
        }
        let checks = [
            ("rewards column", rows, self.rewards.len()),
            ("discounts column", rows, self.discounts.len()),
        ];
        SpecError::check_lengths(&checks)?;
        Ok(())
    }
}

impl TransitionBatch {
    /// Checks the values a learner relies on, for batches from an environment or from
    /// outside the process: actions in `0..num_actions`, rewards finite and within
    /// `bounds`, discounts in `[0, 1]`, and for `f32` observations every value finite and
    /// within `bounds` (one NaN observation, or one reward of 3e38, would poison every
    /// update that samples it). The error names the field, the row and the bound.
    /// Priorities are not refused here: replay screens them (one that is negative or
    /// not finite is counted and replaced, never stored), so an actor whose network
    /// diverged loses neither its connection nor its transitions.
    pub fn check_values(
        &self,
        num_actions: usize,
        obs: DType,
        bounds: &ValueBounds,
    ) -> Result<(), SpecError> {
        if let Some((i, a)) = self
            .actions
            .iter()
            .enumerate()
            .find(|(_, a)| !(0..num_actions as i64).contains(a))
        {
            return Err(SpecError::BadValue(format!(
                "actions[{i}] = {a}, outside 0..{num_actions}"
            )));
        }
        if let Some((i, r)) = self
            .rewards
            .iter()
            .enumerate()
            .find(|(_, r)| !r.is_finite())
        {
            return Err(SpecError::BadValue(format!(
                "non-finite reward: rewards[{i}] = {r}"
            )));
        }
        if let Some((i, r)) = self
            .rewards
            .iter()
            .enumerate()
            .find(|(_, r)| r.abs() > bounds.reward)
        {
            return Err(SpecError::BadValue(format!(
                "rewards[{i}] = {r:e}, out of bounds: {}",
                bounds.reward_reason()
            )));
        }
        if let Some((i, d)) = self
            .discounts
            .iter()
            .enumerate()
            .find(|(_, d)| !(0.0..=1.0).contains(*d))
        {
            return Err(SpecError::BadValue(format!(
                "discounts[{i}] = {d}, outside [0, 1]"
            )));
        }
        if obs == DType::F32 {
            let values = self
                .obs
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            for (i, v) in values.enumerate() {
                if !v.is_finite() {
                    return Err(SpecError::BadValue(format!(
                        "non-finite observation: obs value {i} = {v}"
                    )));
                }
                if v.abs() > bounds.obs {
                    return Err(SpecError::BadValue(format!(
                        "observation value {i} = {v:e}, out of bounds: at most {:e} (--max-abs-obs)",
                        bounds.obs
                    )));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_finite_rewards_and_observations_are_bad_values() {
        let good = || {
            let mut b = TransitionBatch::with_capacity(8, 1, 2);
            b.push_f32(&[1.0, 2.0], 1, 0.5, 0.99, &[3.0, 4.0]);
            b
        };
        assert_eq!(
            good().check_values(2, DType::F32, &ValueBounds::FINITE),
            Ok(())
        );
        let mut b = good();
        b.rewards[0] = f32::NAN;
        assert!(b.check_values(2, DType::F32, &ValueBounds::FINITE).is_err());
        let mut b = TransitionBatch::with_capacity(8, 1, 2);
        b.push_f32(&[1.0, f32::INFINITY], 1, 0.5, 0.99, &[3.0, 4.0]);
        let err = b
            .check_values(2, DType::F32, &ValueBounds::FINITE)
            .unwrap_err()
            .to_string();
        assert!(err.contains("non-finite observation"), "{err}");
        // Bytes are bytes: a u8 image has no non-finite values to find.
        assert_eq!(b.check_values(2, DType::U8, &ValueBounds::FINITE), Ok(()));
    }

    #[test]
    fn a_finite_but_huge_reward_or_observation_is_refused_naming_the_field() {
        // Regression (issue "One bad transition…", part 1): a reward of 3e38 is finite
        // and used to be stored; one such transition ended the run.
        let bounds = ValueBounds {
            reward: 3e6,
            obs: 1e9,
            reward_from: crate::bounds::RewardBound::Flag,
        };
        let mut b = TransitionBatch::with_capacity(8, 2, 4);
        b.push_f32(&[1.0, 2.0], 1, 0.5, 0.99, &[3.0, 4.0]);
        b.push_f32(&[1.0, 2.0], 0, 3e38, 0.99, &[3.0, 4.0]);
        let err = b
            .check_values(2, DType::F32, &bounds)
            .unwrap_err()
            .to_string();
        assert!(err.contains("rewards[1] = 3e38"), "{err}");
        assert!(err.contains("--max-abs-reward"), "{err}");
        assert_eq!(b.check_values(2, DType::F32, &ValueBounds::FINITE), Ok(()));
        b.rewards[1] = -3e6;
        assert_eq!(
            b.check_values(2, DType::F32, &bounds),
            Ok(()),
            "at the bound"
        );
        let mut b = TransitionBatch::with_capacity(8, 1, 2);
        b.push_f32(&[1.0, 2.0], 1, 0.5, 0.99, &[-3e38, 4.0]);
        let err = b
            .check_values(2, DType::F32, &bounds)
            .unwrap_err()
            .to_string();
        assert!(err.contains("observation value 2 = -3e38"), "{err}");
    }

    #[test]
    fn push_builds_aligned_columns() {
        let mut b = TransitionBatch::with_capacity(8, 2, 4);
        b.push_f32(&[1.0, 2.0], 1, 0.5, 0.99, &[3.0, 4.0]);
        b.push_f32(&[5.0, 6.0], 0, 1.0, 0.0, &[7.0, 8.0]);
        assert_eq!(b.len(), 2);
        assert_eq!(b.validate(8, 1), Ok(()));
        let next: &[f32] = bytemuck::cast_slice(b.obs_row(b.next_index[1]));
        assert_eq!(next, [7.0, 8.0]);
        // Shared rows: a third transition from the last next observation.
        let o = b.next_index[1];
        let n = b.push_obs_f32(&[9.0, 9.5]);
        b.push_transition(o, 1, 0.0, 0.99, n);
        assert_eq!((b.len(), b.obs_rows()), (3, 5));
        assert_eq!(b.validate(8, 1), Ok(()));
    }

    #[test]
    fn check_values_rejects_out_of_range_rows() {
        let mut b = TransitionBatch::with_capacity(4, 2, 4);
        b.push_f32(&[1.0], 1, 0.5, 0.99, &[3.0]);
        assert_eq!(b.check_values(2, DType::F32, &ValueBounds::FINITE), Ok(()));
        assert!(
            b.check_values(1, DType::F32, &ValueBounds::FINITE).is_err(),
            "action 1 with one action"
        );
        b.rewards[0] = f32::NAN;
        assert!(b.check_values(2, DType::F32, &ValueBounds::FINITE).is_err());
        b.rewards[0] = 0.0;
        b.discounts[0] = 1.5;
        assert!(b.check_values(2, DType::F32, &ValueBounds::FINITE).is_err());
        b.discounts[0] = 0.5;
        // Priorities are replay's to screen.
        b.priorities = vec![f32::NAN];
        assert_eq!(
            b.check_values(2, DType::F32, &ValueBounds::FINITE),
            Ok(()),
            "a NaN priority is replay's"
        );
        b.priorities = vec![0.0];
        assert_eq!(b.check_values(2, DType::F32, &ValueBounds::FINITE), Ok(()));
        b.priorities = vec![1.0, 2.0];
        assert!(b.validate(4, 1).is_err(), "one priority per transition");
    }

    #[test]
    fn validate_names_the_bad_column() {
        let mut b = TransitionBatch::with_capacity(8, 1, 2);
        b.push_f32(&[1.0, 2.0], 1, 0.5, 0.99, &[3.0, 4.0]);
        b.rewards.push(1.0);
        assert_eq!(
            b.validate(8, 1),
            Err(SpecError::Length {
                what: "rewards column",
                expected: 1,
                got: 2
            })
        );
        assert!(matches!(b.validate(4, 1), Err(SpecError::Length { .. })));
        b.rewards.pop();
        b.obs.pop();
        assert!(
            matches!(b.validate(8, 1), Err(SpecError::Length { .. })),
            "partial row"
        );
    }

    #[test]
    fn validate_rejects_indices_outside_the_batch() {
        let mut b = TransitionBatch::with_capacity(4, 1, 2);
        b.push_f32(&[1.0], 1, 0.5, 0.99, &[3.0]);
        b.next_index[0] = 2;
        assert!(matches!(b.validate(4, 1), Err(SpecError::BadValue(_))));
        b.next_index[0] = 1;
        b.obs_index[0] = u32::MAX;
        assert!(matches!(b.validate(4, 1), Err(SpecError::BadValue(_))));
    }
}
