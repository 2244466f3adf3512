//! The learning rate over a run: constant, or decayed linearly over env steps.
//!
//! A high learning rate finds a CartPole policy fast and then keeps knocking it over
//! (docs/results/learning.md: every seed reached 500, then lost it in a quarter to a half of the
//! later evaluations); a lower one holds it better but finds it later. Decaying from
//! one to the other is meant to get both, as SB3's linear schedules and CleanRL's
//! annealing do. The decay runs on env steps, like ε's, so a resumed run with the same
//! schedule continues it where it was (the learner warns when a resumed run's flags
//! put the rate elsewhere).

use serde::{Deserialize, Serialize};

/// Linear decay of each agent's learning rate to `end_fraction` of it over the first
/// `steps` env steps, then held.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LrDecay {
    /// The final learning rate as a fraction of the initial one (`--lr-final` over
    /// `--lr`; every agent of a population decays by the same fraction).
    pub end_fraction: f64,
    /// Env steps over which it decays.
    pub steps: u64,
}

impl LrDecay {
    /// The factor on the initial learning rate after `env_steps` env steps.
    pub fn scale_at(&self, env_steps: u64) -> f64 {
        if self.steps == 0 || env_steps >= self.steps {
            return self.end_fraction;
        }
        let progress = env_steps as f64 / self.steps as f64;
        1.0 + (self.end_fraction - 1.0) * progress
    }

    /// The smallest change of the factor worth applying: a thousandth of the way, so a
    /// decay touches the device's learning rates at most a thousand times, not once per
    /// update.
    pub fn resolution(&self) -> f64 {
        (1.0 - self.end_fraction).abs() / 1000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decays_linearly_then_holds() {
        let d = LrDecay {
            end_fraction: 0.1,
            steps: 1000,
        };
        assert_eq!(d.scale_at(0), 1.0);
        assert!((d.scale_at(500) - 0.55).abs() < 1e-12);
        assert!((d.scale_at(999) - 0.1009).abs() < 1e-12);
        assert_eq!(d.scale_at(1000), 0.1);
        assert_eq!(d.scale_at(10_000), 0.1);
        assert!((d.resolution() - 0.0009).abs() < 1e-12);
    }

    /// The learner follows the schedule on both optimizer paths (the CPU's one-pass
    /// Adam reads host copies of the rates, the tensor path the device's), touches the
    /// rates only when they move by the resolution, and reports the rate it uses.
    #[test]
    fn the_learner_follows_the_schedule_and_reports_its_rate() {
        use crate::dqn::{Batch, Dqn};
        use millrace_proto::{DType, NetworkSpec, ObsSpec};
        use tch::{Device, Kind, Tensor};

        let obs = ObsSpec {
            shape: vec![3],
            dtype: DType::F32,
        };
        let spec = NetworkSpec::mlp(&obs, &[8], 2, 1).unwrap();
        let batch = Batch {
            obs2: Tensor::ones([1, 8, 3], (Kind::Float, Device::Cpu)),
            actions: Tensor::zeros([1, 4, 1], (Kind::Int64, Device::Cpu)),
            rewards: Tensor::full([1, 4, 1], 3.0, (Kind::Float, Device::Cpu)),
            discounts: Tensor::zeros([1, 4, 1], (Kind::Float, Device::Cpu)),
            weights: None,
        };
        for tensor_path in [false, true] {
            let mut dqn = Dqn::new(spec.clone(), dqn_config(), Device::Cpu, 0);
            if tensor_path {
                dqn.use_tensor_optimizer();
            }
            // Under the resolution (0.0009 of the factor per step here): unchanged.
            dqn.anneal_lr(&[0]);
            assert_eq!(dqn.lr_scale(), 1.0);
            let _ = dqn.update(&batch);
            assert!((dqn.take_stats().learning_rate - 1e-2).abs() < 1e-12);
            dqn.anneal_lr(&[500]);
            assert!((dqn.lr_scale() - 0.55).abs() < 1e-12);
            // The step an update takes shrinks with the rate: Adam's first steps are
            // lr-sized whatever the gradient.
            let fresh = |scale_at: u64| {
                let mut d = Dqn::new(spec.clone(), dqn_config(), Device::Cpu, 0);
                if tensor_path {
                    d.use_tensor_optimizer();
                }
                d.anneal_lr(&[scale_at]);
                let before = d.state().online;
                let _ = d.update(&batch);
                (d.state().online - before).abs().max().double_value(&[])
            };
            let (early, late) = (fresh(0), fresh(5000));
            assert!(
                (late / early - 0.1).abs() < 1e-3,
                "steps {early} and {late}: the rate fell to a tenth"
            );
            dqn.anneal_lr(&[5000]);
            assert_eq!(dqn.lr_scale(), 0.1, "the end is reached exactly");
            let _ = dqn.update(&batch);
            assert!((dqn.take_stats().learning_rate - 1e-3).abs() < 1e-12);
        }
    }

    /// In a population each agent's rate follows its own env steps, and an agent
    /// steps as it would alone at those steps, on both optimizer paths.
    #[test]
    fn each_agent_of_a_population_decays_by_its_own_steps() {
        use crate::dqn::agents::AgentHparams;
        use crate::dqn::{Batch, Dqn};
        use millrace_proto::{DType, NetworkSpec, ObsSpec};
        use tch::{Device, Kind, Tensor};

        let obs = ObsSpec {
            shape: vec![3],
            dtype: DType::F32,
        };
        let spec = |k| NetworkSpec::mlp(&obs, &[8], 2, k).unwrap();
        let batch = |k: i64| Batch {
            obs2: Tensor::ones([k, 8, 3], (Kind::Float, Device::Cpu)),
            actions: Tensor::zeros([k, 4, 1], (Kind::Int64, Device::Cpu)),
            rewards: Tensor::full([k, 4, 1], 3.0, (Kind::Float, Device::Cpu)),
            discounts: Tensor::zeros([k, 4, 1], (Kind::Float, Device::Cpu)),
            weights: None,
        };
        let hp: Vec<AgentHparams> = [7, 8]
            .iter()
            .map(|s| AgentHparams::from_config(&dqn_config(), *s))
            .collect();
        for tensor_path in [false, true] {
            let make = |hp: &[AgentHparams]| {
                let mut d = Dqn::population(spec(hp.len()), dqn_config(), hp, Device::Cpu);
                if tensor_path {
                    d.use_tensor_optimizer();
                }
                d
            };
            let mut both = make(&hp);
            both.anneal_lr(&[0, 1000]);
            assert_eq!(both.lr_scale(), 1.0, "the first agent's");
            let _ = both.update(&batch(2));
            for (row, steps) in [(0, 0), (1, 1000)] {
                let mut alone = make(&hp[row..=row]);
                alone.anneal_lr(&[steps]);
                let _ = alone.update(&batch(1));
                let together = both.agent_state(row).online;
                let diff = (together - alone.state().online).abs().max();
                assert!(
                    diff.double_value(&[]) < 1e-6,
                    "agent {row} at {steps} steps, tensor path {tensor_path}: {diff}"
                );
            }
        }
    }

    fn dqn_config() -> crate::dqn::DqnConfig {
        crate::dqn::DqnConfig {
            lr: 1e-2,
            lr_decay: Some(LrDecay {
                end_fraction: 0.1,
                steps: 1000,
            }),
            ..crate::dqn::DqnConfig::default()
        }
    }

    #[test]
    fn a_decay_of_no_steps_starts_at_its_end() {
        let d = LrDecay {
            end_fraction: 0.5,
            steps: 0,
        };
        assert_eq!(d.scale_at(0), 0.5);
    }
}
