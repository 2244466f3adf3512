//! The messages of the actor ↔ learner link: one enum per direction.
//!
//! An actor opens with [`Hello`]; the learner answers [`Welcome`] (everything the actor
//! needs: the learner is the one source of truth for env, network and settings) or a
//! typed [`Refusal`] and closes. Afterwards the actor streams [`ActorMsg::Transitions`]
//! and [`ActorMsg::Stats`]; the learner sends the newest [`Params`] (latest-only) and
//! heartbeats. Either side may end with a typed [`Goodbye`].
//!
//! Version 3 reserves what the next features send, so that they do not each break
//! compatibility: per-item priorities in [`TransitionBatch`] (prioritized replay), an
//! agent id in [`Hello`], [`Welcome`] and every batch (population mode), feature names
//! in [`Capabilities`], and observation columns as raw bytes. Version 4 adds how the
//! environment is built ([`EnvConfig`]: bridged Gymnasium and Atari environments) and
//! reward clipping and the session's frame limit to [`Welcome`]; capabilities may name whole families
//! ([`crate::env::ANY_GYM`], [`crate::env::ANY_ATARI`]). Version 7 authenticates both
//! sides without sending the token ([`crate::auth`]): the [`Hello`] carries a nonce
//! instead, the learner answers with a [`LearnerMsg::Challenge`] and the actor with an
//! [`ActorMsg::Proof`]; the learner's messages after that are [`Sealed`] (parameters
//! are followed by a [`LearnerMsg::ParamsSeal`]).
//!
//! Whatever else changes, a [`Hello`] starts with its variant index and the protocol
//! version (two bincode varints, [`crate::codec::hello_version`]), so that a learner can
//! tell an actor of another version so (`ProtocolVersion`) rather than fail to decode it.

use serde::{Deserialize, Serialize};

use crate::batch::TransitionBatch;
use crate::env::EnvConfig;
use crate::params::Params;
use crate::spec::{EnvSpec, NetworkSpec};

/// Bytes of a nonce.
pub const NONCE_BYTES: usize = 32;
/// A fresh random challenge, one per side and session ([`crate::auth::fresh_nonce`]).
pub type Nonce = [u8; NONCE_BYTES];
/// An HMAC-SHA256 tag, or a SHA-256 digest, as the messages carry them (made and
/// checked in [`crate::auth`]).
pub type Tag = [u8; 32];

/// Bumped on any incompatible change to these messages or the framing.
pub const PROTOCOL_VERSION: u32 = 8;

/// Most environments one actor connection may ask for (a learner refuses more; an
/// actor checks its `--n` against it).
pub const MAX_ENVS_PER_ACTOR: u32 = 4096;

/// Most episode returns one [`ActorStats`] carries (a learner reads no more).
pub const MAX_RETURNS_PER_STATS: usize = 4096;

/// What an actor can do, announced in its [`Hello`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// Environment instances it will run.
    pub envs: u32,
    /// Environment ids it can run.
    pub env_ids: Vec<String>,
    /// Optional features it supports (e.g. `"priorities"`: it can send initial
    /// priorities); the learner uses only those both sides know.
    pub features: Vec<String>,
}

/// The first message on a connection, from the actor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// First, whatever the version: see the module's note on the preamble.
    pub protocol_version: u32,
    /// The actor's fresh challenge to the learner ([`crate::auth::fresh_nonce`]).
    pub nonce: Nonce,
    /// Free-form name for logs (host name, pod name).
    pub actor_name: String,
    pub capabilities: Capabilities,
    /// The population agent this actor asks to serve; `None` lets the learner choose.
    pub agent: Option<u32>,
}

/// The feature an actor names when it can send initial priorities with its batches,
/// and the learner echoes when its replay wants them.
pub const FEATURE_PRIORITIES: &str = "priorities";

/// The learner's answer to a valid [`Hello`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Welcome {
    /// Identifies the training run (changes when the learner restarts afresh).
    pub run_id: String,
    pub env: EnvSpec,
    /// How to build the environment (`env.id` with a bridged env's module and
    /// arguments).
    pub env_config: EnvConfig,
    /// Rewards clipped to [-1, 1] in the transitions (episode returns stay true).
    pub clip_rewards: bool,
    pub network: NetworkSpec,
    /// The population agent this actor acts for (0 for a single agent).
    pub agent: u32,
    /// Version of the parameters that follow this message.
    pub params_version: u64,
    /// Exploration index handed to each of this actor's environments: environment `i`
    /// explores with `epsilons[i]` (Ape-X gives every environment its own ε).
    pub env_indices: Vec<u32>,
    /// Exploration rate for each environment, in the same order (Ape-X), used when
    /// `epsilon_decay` is `None`.
    pub epsilons: Vec<f32>,
    /// The run's decaying exploration, followed on the learner's global env steps
    /// (`Params::env_steps`), so that remote actors explore as embedded ones do.
    pub epsilon_decay: Option<EpsilonDecay>,
    pub n_step: u32,
    pub gamma: f32,
    /// Transitions per batch the learner wants.
    pub batch_rows: u32,
    /// Features of the actor's [`Capabilities`] the learner will use.
    pub features: Vec<String>,
    /// The largest frame the learner reads from this actor (its batches are sized to
    /// fit; pixel runs raise it above the handshake's limit).
    pub max_frame: u64,
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
    /// Returns of episodes finished since the previous report (at most
    /// [`MAX_RETURNS_PER_STATS`]).
    pub episode_returns: Vec<f32>,
    pub params_version: u64,
}

/// Why the learner refused an actor or closed its connection. The kind, not the
/// message, decides what the actor does next (see [`RefusalCode::is_permanent`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RefusalCode {
    /// The token does not match.
    WrongToken,
    /// The actor speaks another protocol version.
    ProtocolVersion,
    /// The actor cannot run the run's environment (or its port differs).
    EnvUnsupported,
    /// The actor's batches would be too large for the learner's replay shards.
    BatchTooLarge,
    /// The request cannot be served as asked (no environments, an unknown agent).
    BadRequest,
    /// The actor sent something malformed or out of order.
    ProtocolViolation,
    /// The learner has as many connections as it takes; try again later.
    TooManyConnections,
    /// The learner is starting or stopping; try again later.
    NotReady,
    /// The connection went quiet for too long.
    Timeout,
}

impl RefusalCode {
    /// Whether retrying cannot help: the actor should stop (with a non-zero status)
    /// rather than reconnect.
    pub fn is_permanent(self) -> bool {
        match self {
            RefusalCode::WrongToken
            | RefusalCode::ProtocolVersion
            | RefusalCode::EnvUnsupported
            | RefusalCode::BatchTooLarge
            | RefusalCode::BadRequest
            | RefusalCode::ProtocolViolation => true,
            RefusalCode::TooManyConnections | RefusalCode::NotReady | RefusalCode::Timeout => false,
        }
    }
}

/// A refusal: its kind, and a message for people.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    pub code: RefusalCode,
    pub message: String,
}

impl Refusal {
    pub fn new(code: RefusalCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.code.is_permanent() {
            "permanent"
        } else {
            "temporary"
        };
        write!(f, "{} ({:?}, {kind})", self.message, self.code)
    }
}

/// Why a side is ending the session on purpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GoodbyeReason {
    /// The run is over (solved, or out of steps): actors should exit, successfully.
    RunFinished,
    /// The learner is stopping but the run is not over (a signal, e.g. before a
    /// restart): actors should keep reconnecting.
    LearnerStopping,
    /// The actor is shutting down.
    ActorStopping,
}

/// A deliberate end of a session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Goodbye {
    pub reason: GoodbyeReason,
    pub message: String,
}

/// Actor → learner.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ActorMsg {
    Hello(Hello),
    /// The answer to the learner's challenge: `HMAC(token, Hello ‖ challenge)`
    /// ([`crate::auth::actor_proof`]).
    Proof(Tag),
    Transitions(TransitionBatch),
    Stats(ActorStats),
    Heartbeat,
    Goodbye(Goodbye),
}

/// A learner message authenticated for one session ([`crate::auth::Seal`]): `body` is
/// an encoded [`LearnerMsg`] (a `Welcome`, `Heartbeat`, `Refused` or `Goodbye`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sealed {
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
    pub tag: Tag,
}

/// Learner → actor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum LearnerMsg {
    /// The learner's fresh challenge, its only answer to a `Hello` of the right version
    /// before the actor has proved the token.
    Challenge(Nonce),
    /// Boxed: sent once per connection, and much larger than the other variants. Only
    /// ever inside a [`LearnerMsg::Sealed`].
    Welcome(Box<Welcome>),
    /// Followed at once by its [`LearnerMsg::ParamsSeal`]; an actor uses it only then.
    Params(Params),
    /// The tag of the `Params` just sent ([`crate::auth::Seal::seal_params`]).
    ParamsSeal(Tag),
    /// Only ever inside a [`LearnerMsg::Sealed`].
    Heartbeat,
    /// The connection is refused or being closed; the code says whether to retry.
    /// Unsealed only before the actor has proved the token (`WrongToken`,
    /// `ProtocolVersion`, `Timeout`, `ProtocolViolation`).
    Refused(Refusal),
    /// Only ever inside a [`LearnerMsg::Sealed`].
    Goodbye(Goodbye),
    /// A `Welcome`, `Heartbeat`, `Refused` or `Goodbye` under the session's key.
    Sealed(Sealed),
}

impl ActorMsg {
    /// The message's kind, for logs (its contents come from the peer).
    pub fn kind(&self) -> &'static str {
        match self {
            ActorMsg::Hello(_) => "Hello",
            ActorMsg::Proof(_) => "Proof",
            ActorMsg::Transitions(_) => "Transitions",
            ActorMsg::Stats(_) => "Stats",
            ActorMsg::Heartbeat => "Heartbeat",
            ActorMsg::Goodbye(_) => "Goodbye",
        }
    }
}

impl LearnerMsg {
    /// The message's kind, for logs (its contents come from the peer).
    pub fn kind(&self) -> &'static str {
        match self {
            LearnerMsg::Challenge(_) => "Challenge",
            LearnerMsg::Welcome(_) => "Welcome",
            LearnerMsg::Params(_) => "Params",
            LearnerMsg::ParamsSeal(_) => "ParamsSeal",
            LearnerMsg::Heartbeat => "Heartbeat",
            LearnerMsg::Refused(_) => "Refused",
            LearnerMsg::Goodbye(_) => "Goodbye",
            LearnerMsg::Sealed(_) => "Sealed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `docs/reference/protocol.md` names the version and every message, refusal and
    /// goodbye. The matches are exhaustive: a new variant does not compile here until
    /// it is named, and then the page must name it too.
    #[test]
    fn the_protocol_reference_names_every_message() {
        let page = include_str!("../../docs/reference/protocol.md");
        assert!(
            page.contains(&format!("**version {PROTOCOL_VERSION}**")),
            "protocol.md does not say version {PROTOCOL_VERSION}"
        );
        let actor = |m: &ActorMsg| match m {
            ActorMsg::Hello(_) => "Hello",
            ActorMsg::Proof(_) => "Proof",
            ActorMsg::Transitions(_) => "Transitions",
            ActorMsg::Stats(_) => "Stats",
            ActorMsg::Heartbeat => "Heartbeat",
            ActorMsg::Goodbye(_) => "Goodbye",
        };
        let learner = |m: &LearnerMsg| match m {
            LearnerMsg::Challenge(_) => "Challenge",
            LearnerMsg::Welcome(_) => "Welcome",
            LearnerMsg::Params(_) => "Params",
            LearnerMsg::ParamsSeal(_) => "ParamsSeal",
            LearnerMsg::Heartbeat => "Heartbeat",
            LearnerMsg::Refused(_) => "Refused",
            LearnerMsg::Goodbye(_) => "Goodbye",
            LearnerMsg::Sealed(_) => "Sealed",
        };
        let goodbye = |r: GoodbyeReason| match r {
            GoodbyeReason::RunFinished => "RunFinished",
            GoodbyeReason::LearnerStopping => "LearnerStopping",
            GoodbyeReason::ActorStopping => "ActorStopping",
        };
        let refusal = |c: RefusalCode| match c {
            RefusalCode::WrongToken => "WrongToken",
            RefusalCode::ProtocolVersion => "ProtocolVersion",
            RefusalCode::EnvUnsupported => "EnvUnsupported",
            RefusalCode::BatchTooLarge => "BatchTooLarge",
            RefusalCode::BadRequest => "BadRequest",
            RefusalCode::ProtocolViolation => "ProtocolViolation",
            RefusalCode::TooManyConnections => "TooManyConnections",
            RefusalCode::NotReady => "NotReady",
            RefusalCode::Timeout => "Timeout",
        };
        let bye = Goodbye {
            reason: GoodbyeReason::ActorStopping,
            message: String::new(),
        };
        let mut names = vec![
            actor(&ActorMsg::Hello(Hello {
                protocol_version: PROTOCOL_VERSION,
                nonce: [0; 32],
                actor_name: String::new(),
                capabilities: Capabilities {
                    envs: 1,
                    env_ids: vec![],
                    features: vec![],
                },
                agent: None,
            })),
            actor(&ActorMsg::Proof([0; 32])),
            actor(&ActorMsg::Transitions(TransitionBatch::with_capacity(
                4, 0, 0,
            ))),
            actor(&ActorMsg::Stats(ActorStats::default())),
            actor(&ActorMsg::Heartbeat),
            actor(&ActorMsg::Goodbye(bye.clone())),
            learner(&LearnerMsg::Challenge([0; 32])),
            learner(&LearnerMsg::Params(Params::of_one(0, vec![]))),
            learner(&LearnerMsg::ParamsSeal([0; 32])),
            learner(&LearnerMsg::Sealed(Sealed {
                body: vec![],
                tag: [0; 32],
            })),
            learner(&LearnerMsg::Heartbeat),
            learner(&LearnerMsg::Refused(Refusal::new(RefusalCode::Timeout, ""))),
            learner(&LearnerMsg::Goodbye(bye)),
            "Welcome",
        ];
        names.extend(
            [
                GoodbyeReason::RunFinished,
                GoodbyeReason::LearnerStopping,
                GoodbyeReason::ActorStopping,
            ]
            .map(goodbye),
        );
        names.extend(
            [
                RefusalCode::WrongToken,
                RefusalCode::ProtocolVersion,
                RefusalCode::EnvUnsupported,
                RefusalCode::BatchTooLarge,
                RefusalCode::BadRequest,
                RefusalCode::ProtocolViolation,
                RefusalCode::TooManyConnections,
                RefusalCode::NotReady,
                RefusalCode::Timeout,
            ]
            .map(refusal),
        );
        for name in names {
            assert!(
                page.contains(&format!("`{name}`")),
                "protocol.md does not name `{name}`"
            );
        }
    }

    #[test]
    fn only_retryable_refusals_are_temporary() {
        let temporary = [
            RefusalCode::TooManyConnections,
            RefusalCode::NotReady,
            RefusalCode::Timeout,
        ];
        for code in [
            RefusalCode::WrongToken,
            RefusalCode::ProtocolVersion,
            RefusalCode::EnvUnsupported,
            RefusalCode::BatchTooLarge,
            RefusalCode::BadRequest,
            RefusalCode::ProtocolViolation,
        ] {
            assert!(code.is_permanent(), "{code:?}");
        }
        for code in temporary {
            assert!(!code.is_permanent(), "{code:?}");
        }
        let r = Refusal::new(RefusalCode::NotReady, "starting");
        assert_eq!(r.to_string(), "starting (NotReady, temporary)");
    }
}
