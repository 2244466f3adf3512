//! A training run: set-up shared by both modes ([`setup`]), then either the threaded
//! mode (components wired in [`wiring`], watched and shut down by [`coordinator`]) or
//! the lock-step mode ([`lockstep`]) for bit-reproducible runs; populations of agents
//! trained by one stacked update run in [`population`], lock-step too.

mod actors_auto;
mod coordinator;
mod failure;
mod lockstep;
mod population;
mod setup;
mod train_returns;
mod wiring;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use indicatif::ProgressBar;

use crate::checkpoint::CheckpointError;
use crate::config::RunConfig;
use crate::cpu_plan::host::{self, Role};
use crate::summary::RunSummary;
pub use failure::{CheckpointFate, Component, Failure};

/// Why a run failed (exit status 1). Outcomes that are not failures (solved, out of
/// steps, interrupted) are a [`RunSummary`]'s `reason`.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Env(#[from] millrace_actor::EnvError),
    #[error("actor: {0}")]
    Actor(#[from] millrace_actor::ActorError),
    #[error(transparent)]
    Spec(#[from] millrace_proto::SpecError),
    #[error("cannot resume: {0}")]
    Resume(CheckpointError),
    #[error(transparent)]
    RateLimiter(#[from] millrace_replay::RateLimiterError),
    #[error("replay: {0}")]
    Replay(#[from] millrace_replay::ReplayError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("--copy-stream: {0}")]
    CopyStream(#[from] millrace_core::cuda::CopyStreamError),
    #[error("--copy-stream needs a CUDA device (this run is on {0})")]
    CopyStreamNeedsCuda(crate::config::DeviceChoice),
    #[error("{0}")]
    Device(String),
    #[error(
        "--replay-capacity {capacity}: replay needs {:.1} GiB but this machine has {:.1} GiB \
         available; lower --replay-capacity",
        gib(*needed), gib(*available)
    )]
    ReplayTooLarge {
        capacity: usize,
        needed: u64,
        available: u64,
    },
    #[error("cannot save the run's configuration: {0}")]
    Config(CheckpointError),
    /// A component failed after threads had started; the run went through its shutdown.
    #[error("the {component} failed: {message}; {checkpoint}")]
    Failed {
        component: Component,
        message: String,
        /// What became of the checkpoint.
        checkpoint: CheckpointFate,
    },
    #[error("final checkpoint failed: {0}")]
    FinalCheckpoint(CheckpointError),
    #[error("cannot save the {0} policy: {1}")]
    SavePolicy(crate::checkpoint::Which, CheckpointError),
    #[error(transparent)]
    Sweep(#[from] crate::sweep::SweepError),
}

/// Bytes as GiB, for messages.
fn gib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 30)
}

/// The agents of a population run (`--population K` or `--sweep`), each with its
/// configuration as it trains, and each agent's env step budget; a sweep whose
/// settings do not hold together with the flags is refused, naming the agent.
pub fn population_agents(cfg: &RunConfig) -> Result<(Vec<population::Member>, u64), RunError> {
    population::agents(cfg)
}

/// Trains a population (`--population K`) until every agent reached its target
/// (confirmed), spent `max_steps`, or diverged, or until `interrupt`.
/// Trains a population (`--population`, `--sweep`) until every agent ended or
/// `interrupt`; `monitor` is the `--metrics-addr` endpoint (per-agent series), if any.
pub fn run_population(
    cfg: &RunConfig,
    interrupt: Arc<AtomicBool>,
    monitor: Option<Arc<millrace_telemetry::Endpoint>>,
) -> Result<crate::population_results::PopulationSummary, RunError> {
    let metrics = monitor.map(|m| population::PopulationMetrics::new(m, cfg.live_limit));
    population::run(cfg, &interrupt, metrics.as_ref())
}

/// Trains until the target return (confirmed), `max_steps` or `interrupt`; then
/// checkpoints. `bar` is the progress bar to drive, if any; `monitor` the
/// `--metrics-addr` endpoint (its page and readiness), if any.
pub fn run(
    cfg: &RunConfig,
    interrupt: Arc<AtomicBool>,
    bar: Option<ProgressBar>,
    monitor: Option<Arc<millrace_telemetry::Endpoint>>,
) -> Result<RunSummary, RunError> {
    tracing::info!("{}", cfg.cpu_plan);
    // This thread, and every thread it starts that does not pin itself (sampler,
    // publisher, writer, evaluator, server), runs on the service CPUs.
    let _on_service_cpus = host::enter_for_now(&cfg.cpu_plan, Role::Service);
    let cfg = &actors_auto::resolve(cfg)?;
    let mut setup = setup::prepare(cfg, bar, monitor)?;
    if cfg.mode == crate::config::Mode::LockStep {
        setup.metrics.ready();
        lockstep::run(cfg, setup, &interrupt)
    } else {
        let (running, links) = wiring::connect(cfg, &mut setup)?;
        // Every component runs, the server (if any) accepts actors.
        setup.metrics.ready();
        coordinator::run(cfg, setup, running, links, &interrupt)
    }
}
