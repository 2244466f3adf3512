//! The acting side of millrace: environments, batched CPU inference, n-step transition
//! building and the actor loop that streams [`TransitionBatch`]es to replay.
//!
//! Nothing here links libtorch: actors run the Q-network's forward pass in plain Rust over
//! the flat parameters the learner publishes ([`policy::MlpPolicy`], its products in
//! [`gemm`]), so an actor is a small CPU-only process and its tests build in seconds.
//!
//! [`TransitionBatch`]: millrace_proto::TransitionBatch

pub mod cli;
pub mod cnn;
pub mod doctor;
pub mod env;
pub mod eval;
pub mod frames;
pub mod gemm;
pub mod nstep;
pub mod packed;
pub mod policy;
pub mod remote;
pub mod runner;
pub mod schedule;
pub mod status;

pub use cnn::CnnPolicy;
pub use env::{make, make_pixels, make_vec, AnyVecEnv, Env, EnvError, Step, VecEnv};
pub use eval::{evaluate, EvalError, EvalResult};
pub use nstep::NStep;
pub use packed::{PackShelf, SharedParams};
pub use policy::{MlpPolicy, Policy, PolicyError};
pub use runner::{
    make_envs, run_actor, run_actor_with, ActorConfig, ActorError, ActorLoop, ActorSink, AnyActor,
    EpisodeStats, NoParams, ParamsSource,
};
pub use schedule::{apex_epsilon, EpsilonSchedule};

pub use millrace_proto::seeds::derive_seed;
