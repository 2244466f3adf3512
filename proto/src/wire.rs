//! The messages of the actor ↔ learner link: one enum per direction.
//!
//! An actor opens with [`Hello`]; the learner answers [`Welcome`] (everything the actor
//! needs: the learner is the one source of truth for env, network and settings) or
//! [`LearnerMsg::Error`] and closes. Afterwards the actor streams
//! [`ActorMsg::Transitions`] and [`ActorMsg::Stats`]; the learner sends the newest
//! [`Params`] (latest-only) and heartbeats. Either side may end with `Goodbye`.

use serde::{Deserialize, Serialize};

use crate::batch::{Params, TransitionBatch};
use crate::spec::{EnvSpec, NetworkSpec};

/// Bumped on any incompatible change to these messages or the framing.
pub const PROTOCOL_VERSION: u32 = 2;

/// What an actor can do, announced in its [`Hello`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// Environment instances it will run.
    pub envs: u32,
    /// Environment ids it can run.
    pub env_ids: Vec<String>,
}

/// The first message on a connection, from the actor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol_version: u32,
    /// Shared secret; compared in constant time (see [`crate::codec::tokens_equal`]).
    pub token: String,
    /// Free-form name for logs (host name, pod name).
    pub actor_name: String,
    pub capabilities: Capabilities,
}

/// The learner's answer to a valid [`Hello`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Welcome {
    /// Identifies the training run (changes when the learner restarts afresh).
    pub run_id: String,
    pub env: EnvSpec,
    pub network: NetworkSpec,
    /// Version of the parameters that follow this message.
    pub params_version: u64,
    /// Actor slot handed to each of this actor's environments (Ape-X ε per slot).
    pub slots: Vec<u32>,
    /// Exploration rate for each slot, in the same order (Ape-X), used when
    /// `epsilon_decay` is `None`.
    pub epsilons: Vec<f32>,
    /// The run's decaying exploration, followed on the learner's global env steps
    /// (`Params::env_steps`), so that remote actors explore as embedded ones do.
    pub epsilon_decay: Option<EpsilonDecay>,
    pub n_step: u32,
    pub gamma: f32,
    /// Transitions per batch the learner wants.
    pub batch_rows: u32,
}

/// ε from `start` down to `end` linearly over the first `steps` global env steps.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct EpsilonDecay {
    pub start: f32,
    pub end: f32,
    pub steps: u64,
}

/// Periodic actor statistics.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ActorStats {
    pub env_steps: u64,
    pub episodes: u64,
    /// Returns of episodes finished since the previous report.
    pub episode_returns: Vec<f32>,
    pub params_version: u64,
}

/// Actor → learner.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ActorMsg {
    Hello(Hello),
    Transitions(TransitionBatch),
    Stats(ActorStats),
    Heartbeat,
    Goodbye { reason: String },
}

/// Learner → actor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum LearnerMsg {
    /// Boxed: sent once per connection, and much larger than the other variants.
    Welcome(Box<Welcome>),
    Params(Params),
    Heartbeat,
    /// The connection is refused or being closed because of something the actor did.
    Error {
        reason: String,
    },
    Goodbye {
        reason: String,
    },
}
