//! Types every millrace component shares: what an environment looks like ([`EnvSpec`]),
//! how a Q-network is laid out ([`NetworkSpec`], [`ParamLayout`]), how transitions travel
//! ([`TransitionBatch`]), how parameters are published ([`Params`], [`ParamsCell`]) and
//! the run-wide env step count ([`StepCounter`]).
//!
//! This crate depends on nothing internal so that actors, replay and the learner can all
//! use it without cycles, and so that the wire format has one home: [`wire`] holds the
//! messages, [`codec`] the only code that turns bytes into them.

pub mod auth;
pub mod batch;
pub mod bounds;
#[cfg(feature = "tokio")]
pub mod budget;
pub mod codec;
pub mod durations;
pub mod env;
pub mod episode;
pub mod exploration;
pub mod frames;
#[cfg(feature = "tokio")]
pub mod io;
pub mod iqn;
pub mod panics;
pub mod params;
pub mod peer_text;
pub mod seeds;
pub mod spec;
pub mod torso;
pub mod wire;

pub use batch::TransitionBatch;
pub use bounds::ValueBounds;
pub use env::EnvConfig;
pub use episode::EpisodeStats;
pub use frames::{FrameLinks, NO_FRAME};
pub use iqn::IqnHead;
pub use params::{Params, ParamsCell, StepCounter};
pub use spec::{
    DType, EnvSpec, NetworkSpec, ObsSpec, ParamEntry, ParamLayout, SpecError, LAYER_NORM_EPS,
};
pub use torso::{ConvLayer, ImpalaTorso, Torso, TorsoStep, MINATAR_CONV, NATURE_CONV};
