//! Bounds on the values a transition may carry into replay, beyond being finite.
//!
//! One finite but huge value is enough to end a run: a reward of 3e38 from one actor (or
//! a user's buggy environment) makes every update that samples it overflow, and the
//! learner stopped after `--max-nonfinite` of them (issue "One bad transition…", part
//! 1). Values are therefore screened before they are stored against bounds that follow
//! from the environment: a per-step bound a user can set (`--max-abs-reward`), else its
//! declared per-step reward range where it has one (the Rust ports), else a default no
//! real environment reaches; and a magnitude bound on `f32` observations
//! (`--max-abs-obs`; `u8` observations are bounded by their type). A stored reward is an
//! n-step return, so the per-step bound is scaled by n.

use serde::{Deserialize, Serialize};

use crate::spec::EnvSpec;

/// The default per-step bound on |reward|: well above any real environment's (Atari's
/// largest single rewards are in the thousands), well below where an update overflows.
pub const DEFAULT_MAX_ABS_REWARD: f32 = 1e6;
/// The default bound on |an observation's value| (`f32` observations): far above any
/// real environment's features (raw counters and timestamps included), far below where
/// a network's activations overflow.
pub const DEFAULT_MAX_ABS_OBS: f32 = 1e9;

/// What a stored transition's values may be.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ValueBounds {
    /// The largest |reward| a stored transition may carry (an n-step return).
    pub reward: f32,
    /// The largest |value| in an `f32` observation.
    pub obs: f32,
    /// Where `reward` comes from, for the refusal's message.
    #[serde(skip)]
    pub reward_from: RewardBound,
}

/// Where a reward bound comes from.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum RewardBound {
    /// The environment's declared per-step range, over n steps.
    EnvRange { per_step: f32, n_step: usize },
    /// `--max-abs-reward` per step, over n steps.
    #[default]
    Flag,
}

impl ValueBounds {
    /// Only finiteness (what was checked before bounds existed): for tests and tools.
    pub const FINITE: ValueBounds = ValueBounds {
        reward: f32::MAX,
        obs: f32::MAX,
        reward_from: RewardBound::Flag,
    };

    /// The bounds for `env` with `n_step` returns: `max_abs_reward` per step when a
    /// user set it, else the environment's declared per-step range where it has one (so
    /// CartPole's rewards are at most n), else [`DEFAULT_MAX_ABS_REWARD`];
    /// `max_abs_obs` for observations.
    pub fn new(
        env: &EnvSpec,
        n_step: usize,
        max_abs_reward: Option<f32>,
        max_abs_obs: f32,
    ) -> Self {
        let n = n_step.max(1);
        let (per_step, reward_from) = match (max_abs_reward, env.reward_range) {
            (Some(flag), _) => (flag, RewardBound::Flag),
            (None, Some((lo, hi))) => {
                let per_step = lo.abs().max(hi.abs());
                (
                    per_step,
                    RewardBound::EnvRange {
                        per_step,
                        n_step: n,
                    },
                )
            }
            (None, None) => (DEFAULT_MAX_ABS_REWARD, RewardBound::Flag),
        };
        // A little over n × the bound: an n-step sum of discounted rewards in f32.
        let reward = (per_step * n as f32 * (1.0 + 1e-4)).min(f32::MAX);
        Self {
            reward,
            obs: max_abs_obs,
            reward_from,
        }
    }

    /// Why a reward is out of bounds, naming the bound's source.
    pub fn reward_reason(&self) -> String {
        match self.reward_from {
            RewardBound::EnvRange { per_step, n_step } => format!(
                "the environment's rewards are at most {per_step} a step, {} over {n_step} steps",
                self.reward
            ),
            RewardBound::Flag => format!(
                "at most {:e} (--max-abs-reward per step, times n-step)",
                self.reward
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{DType, ObsSpec};

    fn env(reward_range: Option<(f32, f32)>) -> EnvSpec {
        EnvSpec {
            id: "e".into(),
            obs: ObsSpec {
                shape: vec![4],
                dtype: DType::F32,
            },
            num_actions: 2,
            max_episode_steps: 500,
            reward_threshold: None,
            reward_range,
            frame_stack: 1,
        }
    }

    #[test]
    fn a_declared_range_bounds_n_steps_of_rewards_and_otherwise_the_flag_does() {
        let b = ValueBounds::new(&env(Some((-1.0, 0.0))), 3, None, 1e9);
        assert!(b.reward >= 3.0 && b.reward < 3.01, "{}", b.reward);
        assert!(b.reward_reason().contains("at most 1 a step"));
        let b = ValueBounds::new(&env(None), 3, None, 1e9);
        assert!(b.reward >= 3e6 && b.reward < 3.01e6, "{}", b.reward);
        assert!(b.reward_reason().contains("--max-abs-reward"));
        assert_eq!(b.obs, 1e9);
        // A user's own bound wins over the declared range.
        let b = ValueBounds::new(&env(Some((-1.0, 0.0))), 3, Some(1e38), 1e9);
        assert!(b.reward >= 3e38, "{}", b.reward);
        assert_eq!(
            ValueBounds::new(&env(None), 1, Some(f32::MAX), 1.0).reward,
            f32::MAX
        );
    }
}
