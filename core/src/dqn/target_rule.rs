//! The rule that makes a TD target from the next state, with the settings it needs on
//! the device: double DQN's, or Munchausen's with each agent's τ, α and clip
//! (`[K, 1, 1]` each, from [`Munchausen::per_agent`]; the values were checked where
//! they were given, [`Munchausen::new`]).

use tch::{Device, Tensor};

use super::agents::AgentHparams;
use super::config::{Bootstrap, Munchausen};

/// How the update bootstraps (`--target`), ready to run.
#[derive(Debug)]
pub(super) enum TargetRule {
    /// `r + γⁿ · Q_target(s′, argmax_a Q_online(s′, a))`.
    Double,
    /// Munchausen's soft target and bonus; each agent's `[τ, α, clip]`, `[K, 1, 1]`.
    Munchausen([Tensor; 3]),
}

impl TargetRule {
    /// The rule `bootstrap` names for `agents` (a sweep may give an agent its own
    /// Munchausen settings; the rest take `bootstrap`'s).
    pub(super) fn new(bootstrap: &Bootstrap, agents: &[AgentHparams], device: Device) -> Self {
        match bootstrap {
            Bootstrap::Double => Self::Double,
            Bootstrap::Munchausen(m) => {
                let own: Vec<Option<Munchausen>> = agents.iter().map(|a| a.munchausen).collect();
                Self::Munchausen(m.per_agent(&own, device))
            }
        }
    }

    /// The tensors it keeps on the device (for [`super::Dqn::storage`]).
    pub(super) fn tensors(&self) -> impl Iterator<Item = &Tensor> {
        match self {
            Self::Double => [].iter(),
            Self::Munchausen(settings) => settings.iter(),
        }
    }
}
