//! Types every millrace component shares: what an environment looks like ([`EnvSpec`]),
//! how a Q-network is laid out ([`NetworkSpec`], [`ParamLayout`]), how transitions travel
//! ([`TransitionBatch`]) and how parameters are published ([`Params`]).
//!
//! This crate depends on nothing internal so that actors, replay and the learner can all
//! use it without cycles, and so that the wire format (a later codec module) has one home.

pub mod batch;
pub mod spec;

pub use batch::{Params, TransitionBatch};
pub use spec::{DType, EnvSpec, NetworkSpec, ObsSpec, ParamEntry, ParamLayout, SpecError};
