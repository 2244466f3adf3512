//! n-step returns, computed where transitions are produced (Ape-X: actors compute them).

use bytemuck::Pod;
use millrace_proto::TransitionBatch;

use crate::env::Step;

/// Where n-step windows put observations and transitions: whole rows of the batch being
/// built ([`TransitionBatch`], carried into the next one) or frames of an actor's stream
/// ([`crate::frames::FrameWriter`], which needs no carrying).
pub trait Rows {
    /// Stores observation `obs` of environment `env`; returns the id transitions name it by.
    fn store(&mut self, env: usize, obs: &[u8]) -> u64;

    /// Appends the transition `obs → next` (ids from [`Rows::store`]) of environment `env`.
    fn transition(
        &mut self,
        env: usize,
        obs: u64,
        action: i64,
        reward: f32,
        discount: f32,
        next: u64,
    );
}

/// Whole observation rows: an id is a row of this batch.
impl Rows for TransitionBatch {
    fn store(&mut self, _env: usize, obs: &[u8]) -> u64 {
        u64::from(self.push_obs_bytes(obs))
    }

    fn transition(
        &mut self,
        _env: usize,
        obs: u64,
        action: i64,
        reward: f32,
        discount: f32,
        next: u64,
    ) {
        self.push_transition(obs as u32, action, reward, discount, next as u32);
    }
}

/// Per-environment window of the last `n` steps that turns single steps into n-step
/// transitions `(s_t, a_t, Σ_{i<k} γ^i r_{t+i}, γ^k or 0, s_{t+k})`, storing each
/// observation once through [`Rows`].
///
/// A transition is emitted once `n` steps have followed it, or when the episode ends: on
/// *termination* its discount is 0 (nothing follows, so the terminal observation is not
/// stored and the transition points back at its own row), on *truncation* it keeps `γ^k`
/// and bootstraps from the last observation. In row mode pending steps refer to rows of
/// the batch being built, and [`NStep::carry`] moves them into the next batch when one is
/// handed on. Nothing allocates per step.
#[derive(Debug)]
pub struct NStep {
    n: usize,
    gamma: f32,
    /// The environment this window follows (what [`Rows`] is told).
    env: usize,
    /// Ring of the last `n` steps: the observation each started from, action, reward.
    rows: Vec<u64>,
    actions: Vec<i64>,
    rewards: Vec<f32>,
    /// Index of the oldest pending step.
    head: usize,
    len: usize,
    /// The current observation (the one the next action is taken in).
    current: Option<u64>,
}

impl NStep {
    /// A window for environment 0 (see [`NStep::for_env`]).
    ///
    /// # Panics
    /// If `n` is 0.
    pub fn new(n: usize, gamma: f32) -> Self {
        assert!(n >= 1, "n-step needs n >= 1");
        Self {
            n,
            gamma,
            env: 0,
            rows: vec![0; n],
            actions: vec![0; n],
            rewards: vec![0.0; n],
            head: 0,
            len: 0,
            current: None,
        }
    }

    /// The same window, following environment `env`.
    pub fn for_env(mut self, env: usize) -> Self {
        self.env = env;
        self
    }

    /// Starts an episode in `obs` (after a reset).
    pub fn start<O: Pod>(&mut self, obs: &[O], out: &mut impl Rows) {
        debug_assert_eq!(self.len, 0, "an episode starts with no pending steps");
        self.current = Some(out.store(self.env, bytemuck::cast_slice(obs)));
    }

    /// Records that the action taken in the current observation gave `step` and led to
    /// `next_obs`; appends every transition that is now complete to `out`. After a step
    /// that ends the episode, call [`NStep::start`] with the reset observation.
    ///
    /// # Panics
    /// If no episode was started.
    pub fn push<O: Pod>(&mut self, action: i64, step: Step, next_obs: &[O], out: &mut impl Rows) {
        let row = self.current.take().expect("NStep::start before push");
        let at = (self.head + self.len) % self.n;
        self.rows[at] = row;
        self.actions[at] = action;
        self.rewards[at] = step.reward;
        self.len += 1;

        if step.terminated {
            // Nothing bootstraps from a terminal observation: don't store it.
            while self.len > 0 {
                let own = self.rows[self.head];
                self.emit(true, own, out);
            }
            self.head = 0;
        } else {
            let next = out.store(self.env, bytemuck::cast_slice(next_obs));
            if step.truncated {
                while self.len > 0 {
                    self.emit(false, next, out);
                }
                self.head = 0;
            } else {
                if self.len == self.n {
                    self.emit(false, next, out);
                }
                self.current = Some(next);
            }
        }
    }

    /// Emits the oldest pending step as a `len`-step transition ending at `next`.
    fn emit(&mut self, terminated: bool, next: u64, out: &mut impl Rows) {
        let mut ret = 0.0f32;
        let mut scale = 1.0f32;
        for i in 0..self.len {
            ret += scale * self.rewards[(self.head + i) % self.n];
            scale *= self.gamma;
        }
        let discount = if terminated { 0.0 } else { scale };
        let h = self.head;
        out.transition(self.env, self.rows[h], self.actions[h], ret, discount, next);
        self.head = (self.head + 1) % self.n;
        self.len -= 1;
    }

    /// Row mode: copies the rows that pending steps and the current observation refer
    /// to from `old` (a batch about to be handed on) into `new`, and points at them
    /// there. This is the only duplication: at most `n` rows per environment per batch.
    pub fn carry(&mut self, old: &TransitionBatch, new: &mut TransitionBatch) {
        for i in 0..self.len {
            let at = (self.head + i) % self.n;
            self.rows[at] = u64::from(new.push_obs_bytes(old.obs_row(self.rows[at] as u32)));
        }
        if let Some(row) = self.current {
            self.current = Some(u64::from(new.push_obs_bytes(old.obs_row(row as u32))));
        }
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
            life_lost: false,
        }
    }

    fn row(b: &TransitionBatch, i: u32) -> f32 {
        f32::from_ne_bytes(b.obs_row(i)[..4].try_into().unwrap())
    }

    fn obs_of(b: &TransitionBatch, i: usize) -> f32 {
        row(b, b.obs_index[i])
    }

    fn next_of(b: &TransitionBatch, i: usize) -> f32 {
        row(b, b.next_index[i])
    }

    #[test]
    fn one_step_passes_transitions_through() {
        let mut ns = NStep::new(1, 0.9);
        let mut out = TransitionBatch::with_capacity(4, 4, 4);
        ns.start(&[0.0f32], &mut out);
        ns.push(1, step(2.0, false, false), &[1.0f32], &mut out);
        ns.push(0, step(3.0, false, false), &[2.0f32], &mut out);
        assert_eq!(out.rewards, [2.0, 3.0]);
        assert_eq!(out.discounts, [0.9, 0.9]);
        assert_eq!(out.actions, [1, 0]);
        assert_eq!((obs_of(&out, 1), next_of(&out, 1)), (1.0, 2.0));
        assert_eq!(out.obs_rows(), 3, "each observation stored once");
        out.validate(4, 1).unwrap();
    }

    #[test]
    fn three_step_returns_and_termination() {
        let g = 0.5f32;
        let mut ns = NStep::new(3, g);
        let mut out = TransitionBatch::with_capacity(4, 8, 8);
        // Rewards 1, 2, 4, 8 then terminate on the fourth step.
        ns.start(&[0.0f32], &mut out);
        ns.push(0, step(1.0, false, false), &[1.0f32], &mut out);
        ns.push(1, step(2.0, false, false), &[2.0f32], &mut out);
        assert!(out.is_empty(), "nothing complete before n steps");
        ns.push(0, step(4.0, false, false), &[3.0f32], &mut out);
        assert_eq!(out.rewards, [1.0 + g * 2.0 + g * g * 4.0]);
        assert_eq!(out.discounts, [g * g * g]);
        assert_eq!(next_of(&out, 0), 3.0);
        ns.push(1, step(8.0, true, false), &[4.0f32], &mut out);
        // Terminal flush: from s1 (3 steps), s2 (2 steps), s3 (1 step), all discount 0.
        assert_eq!(out.len(), 4);
        assert_eq!(
            out.rewards[1..],
            [2.0 + g * 4.0 + g * g * 8.0, 4.0 + g * 8.0, 8.0]
        );
        assert_eq!(out.discounts[1..], [0.0, 0.0, 0.0]);
        for i in 0..4 {
            assert_eq!(obs_of(&out, i), i as f32);
        }
        assert_eq!(out.obs_rows(), 4, "the terminal observation is not stored");
        out.validate(4, 1).unwrap();
    }

    #[test]
    fn truncation_keeps_the_bootstrap() {
        let g = 0.9f32;
        let mut ns = NStep::new(3, g);
        let mut out = TransitionBatch::with_capacity(4, 8, 8);
        ns.start(&[0.0f32], &mut out);
        ns.push(0, step(1.0, false, false), &[1.0f32], &mut out);
        ns.push(0, step(1.0, false, true), &[2.0f32], &mut out);
        assert_eq!(out.rewards, [1.0 + g, 1.0]);
        assert_eq!(out.discounts, [g * g, g]);
        assert_eq!((next_of(&out, 0), next_of(&out, 1)), (2.0, 2.0));
        // The window starts afresh for the next episode.
        ns.start(&[5.0f32], &mut out);
        ns.push(1, step(1.0, true, false), &[6.0f32], &mut out);
        assert_eq!(out.len(), 3);
        assert_eq!(obs_of(&out, 2), 5.0);
        assert_eq!(out.discounts[2], 0.0);
    }

    #[test]
    fn carry_moves_pending_steps_into_the_next_batch() {
        let g = 0.5f32;
        let mut ns = NStep::new(3, g);
        let mut a = TransitionBatch::with_capacity(4, 8, 8);
        ns.start(&[0.0f32], &mut a);
        for t in 1..=4 {
            ns.push(t, step(t as f32, false, false), &[t as f32], &mut a);
        }
        assert_eq!(a.len(), 2); // from s0 and s1; s2 and s3 pending, current s4
        let mut b = TransitionBatch::with_capacity(4, 8, 8);
        ns.carry(&a, &mut b);
        assert_eq!(b.obs_rows(), 3, "two pending rows and the current one");
        ns.push(5, step(5.0, false, false), &[5.0f32], &mut b);
        ns.push(6, step(6.0, false, false), &[6.0f32], &mut b);
        b.validate(4, 1).unwrap();
        assert_eq!(b.actions, [3, 4]);
        assert_eq!((obs_of(&b, 0), next_of(&b, 0)), (2.0, 5.0));
        assert_eq!((obs_of(&b, 1), next_of(&b, 1)), (3.0, 6.0));
        assert_eq!(b.rewards[0], 3.0 + g * 4.0 + g * g * 5.0);
    }
}
