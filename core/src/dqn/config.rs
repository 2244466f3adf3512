//! The DQN's settings: the learner's own configuration (actors have theirs), beside the
//! networks that read it.

use serde::{Deserialize, Serialize};

use crate::dqn::precision::Precision;
use crate::dqn::schedules::LrDecay;

/// How the target network follows the online one.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetUpdate {
    /// Copy every `period` updates (Mnih et al. 2015).
    Hard { period: u64 },
    /// `target ← (1 − tau)·target + tau·online` after every update.
    Polyak { tau: f64 },
}

/// `learner --target`: which [`Bootstrap`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TargetKind {
    Double,
    Munchausen,
}

/// How the TD target bootstraps (`learner --target`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Bootstrap {
    /// Double DQN (van Hasselt et al. 2016): the target network's value at the online
    /// network's argmax.
    Double,
    /// Munchausen DQN (Vieillard et al. 2020): a soft target plus the scaled, clipped
    /// log-policy of the action taken ([`Munchausen`]).
    Munchausen(Munchausen),
}

/// Munchausen-DQN's settings, the paper's defaults: τ 0.03, α 0.9, clip −1.
///
/// With π = softmax(q̄/τ) of the target network q̄, the target of `(s, a, r, s')` is
/// `r + α·clip(τ·log π(a|s), clip, 0) + γ Σ_a' π(a'|s') (q̄(s', a') − τ·log π(a'|s'))`.
/// With n-step returns `r` is the n-step return, `γ` is `γⁿ`, and the bonus is the
/// first step's only (the intermediate states are not stored).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Munchausen {
    /// The entropy temperature τ.
    pub tau: f64,
    /// The bonus's scale α.
    pub alpha: f64,
    /// The bonus's lower clip l₀ (negative).
    pub clip: f64,
}

impl Default for Munchausen {
    fn default() -> Self {
        Self {
            tau: 0.03,
            alpha: 0.9,
            clip: -1.0,
        }
    }
}

/// A Munchausen setting out of its range: which one, and why ([`Munchausen::new`]).
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
pub enum MunchausenError {
    #[error("must be a positive number, got {0}")]
    Tau(f64),
    #[error("must be in [0, 1], got {0}")]
    Alpha(f64),
    #[error("must be negative (τ·log π is at most 0), got {0}")]
    Clip(f64),
}

impl MunchausenError {
    /// The setting's name: `tau`, `alpha` or `clip`.
    pub fn setting(&self) -> &'static str {
        match self {
            Self::Tau(_) => "tau",
            Self::Alpha(_) => "alpha",
            Self::Clip(_) => "clip",
        }
    }
}

impl Munchausen {
    /// Checked settings: τ positive, α in [0, 1], the clip negative. The command line
    /// and a sweep's per-agent values are both checked here.
    pub fn new(tau: f64, alpha: f64, clip: f64) -> Result<Self, MunchausenError> {
        if !(tau.is_finite() && tau > 0.0) {
            return Err(MunchausenError::Tau(tau));
        }
        if !(0.0..=1.0).contains(&alpha) {
            return Err(MunchausenError::Alpha(alpha));
        }
        if !(clip.is_finite() && clip < 0.0) {
            return Err(MunchausenError::Clip(clip));
        }
        Ok(Self { tau, alpha, clip })
    }

    /// Each agent's τ, α and clip as `[K, 1, 1]` tensors on `device`: `agents[k]`'s own
    /// where it has them, else these.
    pub fn per_agent(
        &self,
        agents: &[Option<Munchausen>],
        device: tch::Device,
    ) -> [tch::Tensor; 3] {
        let column = |f: fn(&Munchausen) -> f64| {
            let v: Vec<f32> = agents
                .iter()
                .map(|a| f(a.as_ref().unwrap_or(self)) as f32)
                .collect();
            tch::Tensor::from_slice(&v)
                .view([-1, 1, 1])
                .to_device(device)
        };
        [column(|m| m.tau), column(|m| m.alpha), column(|m| m.clip)]
    }
}

/// The optimizer of the online network.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Optimizer {
    /// Adam (`adam_betas`, `adam_eps`).
    Adam,
    /// Centred RMSProp without momentum, as Ape-X's learner (decay 0.95, ε 1.5e-7):
    /// PyTorch's `RMSprop(centered=True)`, `p -= lr·g / (√(E[g²] − E[g]²) + ε)`.
    Rmsprop,
}

/// Centred RMSProp's decay and ε (Ape-X's).
pub const RMSPROP_DECAY: f64 = 0.95;
pub const RMSPROP_EPS: f64 = 1.5e-7;

/// DQN hyperparameters (the learner's own config; actors have theirs).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DqnConfig {
    /// Adam learning rate.
    pub lr: f64,
    pub adam_betas: (f64, f64),
    pub adam_eps: f64,
    /// Clip each agent's gradient to this global L2 norm.
    pub max_grad_norm: f64,
    /// Huber loss threshold between quadratic and linear.
    pub huber_delta: f64,
    pub target: TargetUpdate,
    /// A dueling head (value and advantage streams, [`crate::dqn::dueling`]).
    pub dueling: bool,
    /// Adam, or centred RMSProp (whose running means live where Adam's moments do).
    pub optimizer: Optimizer,
    /// The forward and backward passes' arithmetic ([`crate::dqn::precision`]).
    pub precision: Precision,
    /// The learning rate's decay over env steps (`None`: constant).
    pub lr_decay: Option<LrDecay>,
    /// Double DQN's target, or Munchausen's.
    pub bootstrap: Bootstrap,
    /// How an IQN head's update samples quantile fractions (used only with one).
    pub iqn: crate::dqn::iqn::IqnSampling,
}

impl Default for DqnConfig {
    /// Adam's usual settings at lr 1e-4, gradients clipped to norm 10, Huber δ = 1,
    /// a hard target sync every 200 updates.
    fn default() -> Self {
        Self {
            lr: 1e-4,
            adam_betas: (0.9, 0.999),
            adam_eps: 1e-8,
            max_grad_norm: 10.0,
            huber_delta: 1.0,
            target: TargetUpdate::Hard { period: 200 },
            dueling: false,
            optimizer: Optimizer::Adam,
            precision: Precision::Fp32,
            lr_decay: None,
            bootstrap: Bootstrap::Double,
            iqn: crate::dqn::iqn::IqnSampling::default(),
        }
    }
}
