//! The millrace learner: it owns the device and runs off-policy DQN updates back to back
//! on batches that a prefetcher sampled from replay ahead of time.
//!
//! - [`dqn`]: the population-stacked Q-network, double-DQN loss and fused optimizer.
//! - [`prefetch`]: staging slots filled from replay by a sampler thread.
//! - [`update_loop`]: the learner thread, with stall accounting.
//! - [`embedded`]: the one-process mode, wiring actors, replay and learner together.
//! - [`checkpoint`], [`tensorboard`], [`metrics`]: persistence and observability.

pub mod checkpoint;
pub mod cuda_copy;
pub mod dqn;
pub mod embedded;
pub mod metrics;
pub mod prefetch;
pub mod server;
pub mod tensorboard;
pub mod update_loop;

pub use embedded::{train, ReplayOptions, StopReason, TrainConfig, TrainError, TrainSummary};
