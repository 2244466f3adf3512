//! The millrace learner application: flags, configuration, run modes, checkpoints,
//! evaluation, export and reports around the device core (`millrace_core`: the DQN,
//! the learner step and thread, prefetch, publishing, CUDA) and the network service
//! (`millrace_server`, without libtorch).
//!
//! - [`cli`] → [`config`]: flags checked once into a typed configuration.
//! - [`run`]: a training run: set-up, the wiring of the threaded mode, its coordinator
//!   and one shutdown path, the lock-step mode, and population mode.
//! - [`evaluation`]: greedy evaluation of published snapshots, and what the run keeps.
//! - [`checkpoint`], [`export`]: what a run keeps, and the policy in PyTorch's names.
//! - [`summary`], [`metrics`], [`prometheus`], [`tensorboard`], [`tensorboard_hparams`],
//!   [`population_results`], [`population_board`]: what a run reports.
//! - [`shard`], [`shard_merge`]: a population split over a job array, and put back
//!   together.
//! - [`sweep`], [`presets`], [`env_defaults`], [`replay_flags`]: what the flags expand to.
//! - [`doctor`]: the set-up checked.

pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod cpu_plan;
pub mod doctor;
pub mod env_defaults;
pub mod evaluation;
pub mod export;
pub mod metrics;
pub mod per_agent;
pub mod population_board;
pub mod population_results;
pub mod presets;
pub mod prometheus;
pub mod replay_flags;
pub mod run;
pub mod run_lock;
pub mod shard;
pub mod shard_merge;
pub mod summary;
pub mod sweep;
pub mod tensorboard;
pub mod tensorboard_hparams;

pub use config::RunConfig;
pub use run::{run, run_population, RunError};
pub use summary::{RunSummary, StopReason};

pub use millrace_proto::panics::{joined, panic_message};
