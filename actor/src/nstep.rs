//! n-step returns, computed where transitions are produced (Ape-X: actors compute them).

use millrace_proto::TransitionBatch;

use crate::env::Step;

/// Per-environment window of the last `n` steps that turns single steps into n-step
/// transitions `(s_t, a_t, Σ_{i<k} γ^i r_{t+i}, γ^k or 0, s_{t+k})`.
///
/// A transition is emitted once `n` steps have followed it, or when the episode ends: on
/// *termination* its discount is 0 (nothing follows), on *truncation* it keeps `γ^k` and
/// bootstraps from the last observation. Storage is preallocated; nothing allocates per
/// step.
#[derive(Debug)]
pub struct NStep {
    n: usize,
    gamma: f32,
    obs_dim: usize,
    /// Ring of the last `n` observations, `n * obs_dim`.
    obs: Vec<f32>,
    actions: Vec<i64>,
    rewards: Vec<f32>,
    /// Index of the oldest pending step.
    head: usize,
    len: usize,
}

impl NStep {
    /// # Panics
    /// If `n` is 0.
    pub fn new(n: usize, gamma: f32, obs_dim: usize) -> Self {
        assert!(n >= 1, "n-step needs n >= 1");
        Self {
            n,
            gamma,
            obs_dim,
            obs: vec![0.0; n * obs_dim],
            actions: vec![0; n],
            rewards: vec![0.0; n],
            head: 0,
            len: 0,
        }
    }

    /// Records that `action` taken in `obs` gave `step` and led to `next_obs`; appends
    /// every transition that is now complete to `out`.
    pub fn push(
        &mut self,
        obs: &[f32],
        action: i64,
        step: Step,
        next_obs: &[f32],
        out: &mut TransitionBatch,
    ) {
        let slot = (self.head + self.len) % self.n;
        self.obs[slot * self.obs_dim..(slot + 1) * self.obs_dim].copy_from_slice(obs);
        self.actions[slot] = action;
        self.rewards[slot] = step.reward;
        self.len += 1;

        if step.done() {
            while self.len > 0 {
                self.emit(step.terminated, next_obs, out);
            }
            self.head = 0;
        } else if self.len == self.n {
            self.emit(false, next_obs, out);
        }
    }

    /// Emits the oldest pending step as a `len`-step transition ending at `next_obs`.
    fn emit(&mut self, terminated: bool, next_obs: &[f32], out: &mut TransitionBatch) {
        let mut ret = 0.0f32;
        let mut scale = 1.0f32;
        for i in 0..self.len {
            ret += scale * self.rewards[(self.head + i) % self.n];
            scale *= self.gamma;
        }
        let discount = if terminated { 0.0 } else { scale };
        let h = self.head;
        out.push_f32(
            &self.obs[h * self.obs_dim..(h + 1) * self.obs_dim],
            self.actions[h],
            ret,
            discount,
            next_obs,
        );
        self.head = (self.head + 1) % self.n;
        self.len -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(reward: f32, terminated: bool, truncated: bool) -> Step {
        Step {
            reward,
            terminated,
            truncated,
        }
    }

    fn obs(b: &TransitionBatch, col: &[u8], i: usize) -> f32 {
        let row = &col[i * b.obs_row_bytes..(i + 1) * b.obs_row_bytes];
        f32::from_ne_bytes(row[..4].try_into().unwrap())
    }

    #[test]
    fn one_step_passes_transitions_through() {
        let mut ns = NStep::new(1, 0.9, 1);
        let mut out = TransitionBatch::with_capacity(4, 4);
        ns.push(&[0.0], 1, step(2.0, false, false), &[1.0], &mut out);
        ns.push(&[1.0], 0, step(3.0, true, false), &[2.0], &mut out);
        assert_eq!(out.rewards, [2.0, 3.0]);
        assert_eq!(out.discounts, [0.9, 0.0]);
        assert_eq!(out.actions, [1, 0]);
        assert_eq!(obs(&out, &out.next_obs, 1), 2.0);
    }

    #[test]
    fn three_step_returns_and_termination() {
        let g = 0.5f32;
        let mut ns = NStep::new(3, g, 1);
        let mut out = TransitionBatch::with_capacity(4, 8);
        // Rewards 1, 2, 4, 8 then terminate on the fourth step.
        ns.push(&[0.0], 0, step(1.0, false, false), &[1.0], &mut out);
        ns.push(&[1.0], 1, step(2.0, false, false), &[2.0], &mut out);
        assert!(out.is_empty(), "nothing complete before n steps");
        ns.push(&[2.0], 0, step(4.0, false, false), &[3.0], &mut out);
        assert_eq!(out.rewards, [1.0 + g * 2.0 + g * g * 4.0]);
        assert_eq!(out.discounts, [g * g * g]);
        assert_eq!(obs(&out, &out.next_obs, 0), 3.0);
        ns.push(&[3.0], 1, step(8.0, true, false), &[4.0], &mut out);
        // Terminal flush: from s1 (3 steps), s2 (2 steps), s3 (1 step), all discount 0.
        assert_eq!(out.len(), 4);
        assert_eq!(
            out.rewards[1..],
            [2.0 + g * 4.0 + g * g * 8.0, 4.0 + g * 8.0, 8.0]
        );
        assert_eq!(out.discounts[1..], [0.0, 0.0, 0.0]);
        for i in 0..4 {
            assert_eq!(obs(&out, &out.obs, i), i as f32);
        }
        for i in 1..4 {
            assert_eq!(
                obs(&out, &out.next_obs, i),
                4.0,
                "all bootstrap from the end"
            );
        }
    }

    #[test]
    fn truncation_keeps_the_bootstrap() {
        let g = 0.9f32;
        let mut ns = NStep::new(3, g, 1);
        let mut out = TransitionBatch::with_capacity(4, 8);
        ns.push(&[0.0], 0, step(1.0, false, false), &[1.0], &mut out);
        ns.push(&[1.0], 0, step(1.0, false, true), &[2.0], &mut out);
        assert_eq!(out.rewards, [1.0 + g, 1.0]);
        assert_eq!(out.discounts, [g * g, g]);
        // The window starts afresh for the next episode.
        ns.push(&[5.0], 1, step(1.0, true, false), &[6.0], &mut out);
        assert_eq!(out.len(), 3);
        assert_eq!(obs(&out, &out.obs, 2), 5.0);
        assert_eq!(out.discounts[2], 0.0);
    }
}
