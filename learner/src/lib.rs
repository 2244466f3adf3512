//! The millrace learner: it owns the device and runs off-policy DQN updates back to back
//! on batches that a prefetcher sampled from replay ahead of time.
//!
//! - [`cli`] → [`config`]: flags checked once into a typed configuration.
//! - [`run`]: a training run: set-up, the wiring of the threaded mode, its coordinator
//!   and one shutdown path, and the lock-step mode.
//! - [`update_loop`]: the learner thread, with stall accounting; [`dqn`]: the
//!   population-stacked Q-network, double-DQN loss and fused optimizer, with
//!   [`population`]'s per-agent hyperparameters; [`prefetch`]:
//!   staging buffers filled from replay by a sampler thread; [`publisher`]: parameters
//!   out to actors; [`cuda`]: what tch does not expose of the CUDA runtime.
//! - [`evaluation`]: greedy evaluation of published snapshots, and what the run keeps.
//! - `millrace_server`: remote actors over TCP (a crate of its own, without libtorch).
//! - [`checkpoint`], [`export`]: what a run keeps, and the policy in PyTorch's names.
//! - [`summary`], [`metrics`], [`tensorboard`], [`tensorboard_hparams`]: what a run
//!   reports.
//! - [`doctor`], [`memory`]: the set-up checked, and failures explained.

pub mod ceiling;
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod cuda;
pub mod doctor;
pub mod dqn;
pub mod dueling;
pub mod env_defaults;
pub mod evaluation;
pub mod export;
pub mod host_adam;
pub mod lr_schedule;
pub mod memory;
pub mod metrics;
pub mod network;
pub mod population;
pub mod population_board;
pub mod population_results;
pub mod precision;
pub mod prefetch;
pub mod presets;
pub mod priority_feedback;
pub mod prometheus;
pub mod publisher;
pub mod replay_flags;
pub mod run;
pub mod step;
pub mod summary;
pub mod sweep;
pub mod tensorboard;
pub mod tensorboard_hparams;
pub mod torch_settings;
pub mod update_loop;

pub use config::RunConfig;
pub use run::{run, run_population, RunError};
pub use summary::{RunSummary, StopReason};

pub use millrace_proto::panics::{joined, panic_message};
