//! A population's per-agent hyperparameters, as the `[K, 1]` tensors one stacked update
//! applies to all agents at once.
//!
//! Agents of one population share the network's shapes, the batch size and the replay
//! ratio (one update serves them all); what may differ per agent is what scales or gates
//! an element-wise step: the learning rate, the gradient clip, how the target network
//! follows (a hard copy every `period` updates, or Polyak averaging with `tau`),
//! Munchausen's τ, α and clip (under `--target munchausen`), and the seed its parameters
//! start from. Agent k of a population learns exactly as a
//! one-agent run with the same seed and hyperparameters would, given the same batches.

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::dqn::config::{DqnConfig, Munchausen, TargetUpdate};
use crate::dqn::host_adam::Bias;

/// What may differ between the agents of one population.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentHparams {
    /// Seeds the agent's initial parameters.
    pub seed: u64,
    pub lr: f64,
    pub max_grad_norm: f64,
    pub target: TargetUpdate,
    /// This agent's Munchausen settings, where a sweep gives it its own (`None`: the
    /// run's, `--munchausen-*`); used only under `--target munchausen`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub munchausen: Option<Munchausen>,
}

impl AgentHparams {
    /// An agent with `config`'s settings.
    pub fn from_config(config: &DqnConfig, seed: u64) -> Self {
        Self {
            seed,
            lr: config.lr,
            max_grad_norm: config.max_grad_norm,
            target: config.target,
            munchausen: None,
        }
    }

    /// The seeds of `k` agents of one configuration: the run's seed for agent 0 (so a
    /// population of one is the single-agent run), seeds derived from it for the rest.
    pub fn seeds(seed: u64, k: usize) -> impl Iterator<Item = u64> {
        (0..k as u64).map(move |i| {
            if i == 0 {
                seed
            } else {
                millrace_proto::seeds::derive_seed(seed, 1 << 40 | i)
            }
        })
    }
}

/// The per-agent hyperparameters on the device, `[K, 1]` each (and on the host, for
/// the CPU's one-pass optimizer).
#[derive(Debug)]
pub struct AgentTensors {
    /// Each agent's learning rate now: its own ([`AgentHparams::lr`]) times the run's
    /// decay factor ([`AgentTensors::scale_lr`]).
    pub lr: Tensor,
    /// The factor `lr` holds now for each agent, and the agents' own rates it
    /// multiplies.
    lr_scale: Vec<f64>,
    lr_base: Tensor,
    pub max_grad_norm: Tensor,
    pub lr_host: Vec<f32>,
    pub max_grad_norm_host: Vec<f32>,
    /// Polyak τ per agent (0 for agents with hard copies), if any agent averages.
    pub tau: Option<Tensor>,
    /// Hard-copy period per agent (`None` for agents that average).
    pub periods: Vec<Option<u64>>,
    /// The period every agent shares, if they all copy alike (the common case: no
    /// per-agent work after each update).
    shared_period: Option<u64>,
    /// Each agent's settings, in population order.
    pub hparams: Vec<AgentHparams>,
    /// How many updates the population had made when each agent joined, less those
    /// the agent had made before (a resumed agent's): an agent's own update number,
    /// which its target period and Adam's bias corrections count, is the population's
    /// minus this. 0 for agents that started with the population.
    pub joined: Vec<i64>,
    /// Whether every agent joined at once (their update numbers agree).
    joined_together: bool,
}

impl AgentTensors {
    /// The tensors of `agents`, which joined after `joined[k]` population updates.
    ///
    /// # Panics
    /// If `joined` does not have one entry per agent.
    pub fn new(agents: &[AgentHparams], joined: &[i64], device: Device) -> Self {
        assert_eq!(agents.len(), joined.len(), "one join count per agent");
        let column = |f: &dyn Fn(&AgentHparams) -> f64| {
            let v: Vec<f64> = agents.iter().map(f).collect();
            Tensor::from_slice(&v)
                .to_kind(Kind::Float)
                .view([agents.len() as i64, 1])
                .to_device(device)
        };
        let taus: Vec<f64> = agents
            .iter()
            .map(|a| match a.target {
                TargetUpdate::Polyak { tau } => tau,
                TargetUpdate::Hard { .. } => 0.0,
            })
            .collect();
        let tau = taus.iter().any(|t| *t > 0.0).then(|| {
            Tensor::from_slice(&taus)
                .to_kind(Kind::Float)
                .view([agents.len() as i64, 1])
                .to_device(device)
        });
        let periods: Vec<Option<u64>> = agents
            .iter()
            .map(|a| match a.target {
                TargetUpdate::Hard { period } => Some(period.max(1)),
                TargetUpdate::Polyak { .. } => None,
            })
            .collect();
        let shared_period = periods
            .first()
            .copied()
            .flatten()
            .filter(|p| periods.iter().all(|q| *q == Some(*p)));
        Self {
            lr: column(&|a| a.lr),
            lr_scale: vec![1.0; agents.len()],
            lr_base: column(&|a| a.lr),
            max_grad_norm: column(&|a| a.max_grad_norm),
            lr_host: agents.iter().map(|a| a.lr as f32).collect(),
            max_grad_norm_host: agents.iter().map(|a| a.max_grad_norm as f32).collect(),
            tau,
            periods,
            shared_period,
            hparams: agents.to_vec(),
            joined: joined.to_vec(),
            joined_together: joined.windows(2).all(|w| w[0] == w[1]),
        }
    }

    /// Agent `k`'s own number for the population's update number `count`.
    pub fn own(&self, k: usize, count: u64) -> u64 {
        (count as i64).saturating_sub(self.joined[k]).max(0) as u64
    }

    /// Which agents copy their online network into their target after the population's
    /// update number `updates` (counted from 1), each by its own update number: all,
    /// some (a mask), or none.
    pub fn syncing(&self, updates: u64) -> Sync {
        if let (Some(p), true) = (self.shared_period, self.joined_together) {
            return if self.own(0, updates).is_multiple_of(p) {
                Sync::All
            } else {
                Sync::None
            };
        }
        let due: Vec<bool> = self
            .periods
            .iter()
            .enumerate()
            .map(|(k, p)| p.is_some_and(|p| self.own(k, updates).is_multiple_of(p)))
            .collect();
        if due.iter().all(|d| *d) {
            Sync::All
        } else if due.iter().any(|d| *d) {
            Sync::Some(due)
        } else {
            Sync::None
        }
    }
}

impl AgentTensors {
    /// The factor on the first agent's own learning rate now (1 without agents).
    pub fn lr_scale(&self) -> f64 {
        self.lr_scale.first().copied().unwrap_or(1.0)
    }

    /// The factor on each agent's own learning rate now.
    pub fn lr_scales(&self) -> &[f64] {
        &self.lr_scale
    }

    /// Sets each agent's learning rate to its own times its `scales` entry, on the
    /// device without a host sync: when every agent has the same factor it travels as
    /// a scalar of the operation, else as a `[K, 1]` column.
    ///
    /// # Panics
    /// If `scales` does not have one entry per agent.
    pub fn scale_lr(&mut self, scales: &[f64]) {
        assert_eq!(scales.len(), self.hparams.len(), "one factor per agent");
        self.lr_host = self
            .hparams
            .iter()
            .zip(scales)
            .map(|(a, s)| (a.lr * s) as f32)
            .collect();
        tch::no_grad(|| match scales {
            [first, rest @ ..] if rest.iter().all(|s| s == first) => {
                self.lr.copy_(&(&self.lr_base * *first));
            }
            _ => {
                let column = Tensor::from_slice(scales)
                    .to_kind(Kind::Float)
                    .view([scales.len() as i64, 1])
                    .to_device(self.lr.device());
                self.lr.copy_(&(&self.lr_base * column));
            }
        });
        self.lr_scale = scales.to_vec();
    }

    /// Adam's bias corrections for the population's step number `step`: one that every
    /// agent shares when they joined together, else one per agent by its own step
    /// number.
    pub fn biases(&self, step: u64, betas: (f64, f64)) -> Vec<Bias> {
        if self.joined_together {
            return vec![Bias::at(self.own(0, step).max(1), betas)];
        }
        (0..self.joined.len())
            .map(|k| Bias::at(self.own(k, step).max(1), betas))
            .collect()
    }
}

/// The agents whose target networks are copied after an update.
#[derive(Debug, PartialEq)]
pub enum Sync {
    All,
    Some(Vec<bool>),
    None,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(target: TargetUpdate) -> AgentHparams {
        AgentHparams {
            munchausen: None,
            seed: 0,
            lr: 1e-3,
            max_grad_norm: 10.0,
            target,
        }
    }

    #[test]
    fn each_agent_syncs_on_its_own_period() {
        let t = AgentTensors::new(
            &[
                agent(TargetUpdate::Hard { period: 2 }),
                agent(TargetUpdate::Hard { period: 3 }),
                agent(TargetUpdate::Polyak { tau: 0.01 }),
            ],
            &[0; 3],
            Device::Cpu,
        );
        assert_eq!(t.syncing(1), Sync::None);
        assert_eq!(t.syncing(2), Sync::Some(vec![true, false, false]));
        assert_eq!(t.syncing(6), Sync::Some(vec![true, true, false]));
        let tau = Vec::<f32>::try_from(t.tau.unwrap().view([-1])).unwrap();
        assert_eq!(tau, [0.0, 0.0, 0.01]);
        let same = AgentTensors::new(
            &[agent(TargetUpdate::Hard { period: 4 }); 2],
            &[0; 2],
            Device::Cpu,
        );
        assert_eq!((same.syncing(4), same.syncing(5)), (Sync::All, Sync::None));
        assert!(same.tau.is_none());
        assert_eq!(same.biases(3, (0.9, 0.999)).len(), 1);
    }

    #[test]
    fn an_agent_that_joined_later_counts_its_own_updates() {
        let t = AgentTensors::new(
            &[agent(TargetUpdate::Hard { period: 4 }); 2],
            &[0, 3],
            Device::Cpu,
        );
        // Update 4 is agent 0's fourth and agent 1's first; update 7 agent 1's fourth.
        assert_eq!(t.syncing(4), Sync::Some(vec![true, false]));
        assert_eq!(t.syncing(7), Sync::Some(vec![false, true]));
        let b = t.biases(4, (0.9, 0.999));
        assert_eq!(b, [Bias::at(4, (0.9, 0.999)), Bias::at(1, (0.9, 0.999))]);
    }

    #[test]
    fn agent_zero_keeps_the_runs_seed() {
        let seeds: Vec<u64> = AgentHparams::seeds(42, 3).collect();
        assert_eq!(seeds[0], 42);
        assert!(seeds[1] != seeds[2] && seeds[1] != 42);
    }
}
