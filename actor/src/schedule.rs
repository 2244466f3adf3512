//! Exploration schedules.

use serde::{Deserialize, Serialize};

/// ε for ε-greedy action selection as a function of global environment steps.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EpsilonSchedule {
    /// A fixed ε (Ape-X gives every actor its own).
    Constant(f32),
    /// From `start` down to `end` linearly over the first `steps` env steps, then `end`
    /// (DQN's and SB3's `exploration_fraction` schedule).
    Linear { start: f32, end: f32, steps: u64 },
}

impl EpsilonSchedule {
    /// `(start, end, steps)` of the schedule as a linear one (a constant ε decays over
    /// no steps).
    pub fn as_linear(&self) -> (f32, f32, u64) {
        match *self {
            EpsilonSchedule::Linear { start, end, steps } => (start, end, steps),
            EpsilonSchedule::Constant(e) => (e, e, 0),
        }
    }

    pub fn value(&self, env_steps: u64) -> f32 {
        match *self {
            EpsilonSchedule::Constant(eps) => eps,
            EpsilonSchedule::Linear { start, end, steps } => {
                if steps == 0 || env_steps >= steps {
                    end
                } else {
                    let frac = env_steps as f32 / steps as f32;
                    start + (end - start) * frac
                }
            }
        }
    }
}

/// Ape-X's per-actor ε, which the learner's server also hands remote actors.
pub use millrace_proto::exploration::apex_epsilon;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_decays_then_holds() {
        let s = EpsilonSchedule::Linear {
            start: 1.0,
            end: 0.1,
            steps: 100,
        };
        assert_eq!(s.value(0), 1.0);
        assert!((s.value(50) - 0.55).abs() < 1e-6);
        assert_eq!(s.value(100), 0.1);
        assert_eq!(s.value(10_000), 0.1);
        assert_eq!(EpsilonSchedule::Constant(0.3).value(7), 0.3);
    }
}
