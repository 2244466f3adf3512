//! What both modes set up before anything runs: the networks (fresh or resumed),
//! replay (restored), the parameter cell, the step counter, the checkpoint layout with
//! the saved configuration, and metrics. Everything here can fail without leaving a
//! thread behind.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use indicatif::ProgressBar;
use millrace_proto::{EnvSpec, NetworkSpec, ParamsCell, StepCounter};
use millrace_replay::{RateLimiterConfig, ReplayConfig, Table};

use super::RunError;
use crate::checkpoint::{self, Layout, Which};
use crate::config::{DeviceChoice, RunConfig};
use crate::evaluation::EvalRecord;
use crate::metrics::Metrics;
use millrace_core::dqn::Dqn;
use millrace_core::memory::Footprint;

/// The run's state before any thread starts.
#[derive(Debug)]
pub struct Setup {
    pub env: EnvSpec,
    pub network: NetworkSpec,
    /// Moved into the learner thread (threaded mode) or driven in place (lock-step).
    pub dqn: Option<Dqn>,
    /// Env steps already taken (those of the resumed run; 0 for a new one).
    pub start_steps: u64,
    /// The best evaluation so far (a resumed run's, from its `best/`): a continued run
    /// replaces `best/` only with a better one.
    pub best: Option<EvalRecord>,
    pub table: Arc<Table>,
    pub params: Arc<ParamsCell>,
    pub steps: Arc<StepCounter>,
    pub layout: Layout,
    pub metrics: Metrics,
    /// Remote actors' statistics (service mode).
    pub board: Arc<millrace_server::ActorBoard>,
    pub started: Instant,
    pub footprint: Footprint,
    /// Staging buffers in the prefetcher's ring (threaded mode).
    pub staging_depth: usize,
}

/// The replay configuration for this run (its rate limiter checked so it cannot
/// deadlock).
pub fn replay_config(cfg: &RunConfig, env: &EnvSpec) -> Result<ReplayConfig, RunError> {
    let batch = cfg.batch_size as u64;
    // The band must hold one insert plus one sampled batch (see RateLimiterConfig).
    let tolerance = cfg
        .replay
        .tolerance
        .max(2.0 * (cfg.replay.samples_per_insert + batch as f64));
    let limiter = RateLimiterConfig::sample_to_insert_ratio(
        cfg.replay.samples_per_insert,
        cfg.replay.learning_starts,
        tolerance,
        batch,
    )?;
    Ok(ReplayConfig {
        capacity: cfg.replay.capacity,
        shards: cfg.replay.shards,
        obs_row_bytes: env.obs.row_bytes(),
        stack: env.frame_stack,
        obs_rows_per_item: if env.frame_stack > 1 {
            cfg.replay.frames_per_item
        } else {
            ReplayConfig::obs_rows_for(
                cfg.actors.envs_per_actor,
                cfg.actors.n_step,
                cfg.actors.batch_rows,
            )
        },
        limiter,
        priority: cfg
            .replay
            .priority
            .map(|p| millrace_replay::PriorityConfig {
                alpha: p.alpha,
                beta: p.beta.start,
            }),
    })
}

/// Refuses replay of `needed` bytes where this machine cannot hold it: replay is
/// allocated up front, so refuse before anything starts rather than be killed later.
pub fn check_memory(cfg: &RunConfig, needed: u64) -> Result<(), RunError> {
    if let Some(available) = available_memory().filter(|a| needed > *a) {
        return Err(RunError::ReplayTooLarge {
            capacity: cfg.replay.capacity,
            needed,
            available,
        });
    }
    Ok(())
}

/// The replay table for this run.
pub fn replay_table(cfg: &RunConfig, env: &EnvSpec) -> Result<Table, RunError> {
    let config = replay_config(cfg, env)?;
    check_memory(cfg, config.bytes() as u64)?;
    Ok(Table::new(&config)?)
}

/// Memory this machine can still give (`MemAvailable`), if it says.
pub(super) fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// `--copy-stream` copies on a CUDA stream: refused, in one line, without a device.
pub(super) fn check_copy_stream(cfg: &RunConfig) -> Result<(), RunError> {
    let cuda = matches!(cfg.device, DeviceChoice::Cuda(_)) && tch::Cuda::is_available();
    if cfg.learner.copy_stream && !cuda {
        return Err(RunError::CopyStreamNeedsCuda(cfg.device));
    }
    Ok(())
}

pub fn prepare(
    cfg: &RunConfig,
    bar: Option<ProgressBar>,
    monitor: Option<Arc<millrace_telemetry::Endpoint>>,
) -> Result<Setup, RunError> {
    let started = Instant::now();
    check_copy_stream(cfg)?;
    let cuda = matches!(cfg.device, DeviceChoice::Cuda(_)) && tch::Cuda::is_available();
    let env = cfg.env_spec.clone();
    let network = cfg.network_spec()?;
    tracing::info!(
        "{}: {:?} {:?} observations, {} actions; network: {}",
        env.id,
        env.obs.shape,
        env.obs.dtype,
        env.num_actions,
        millrace_core::dqn::network::describe(&network)
    );
    let device = cfg.device.device();

    let layout = Layout::new(cfg.checkpoint_dir());
    layout.remove_leftovers();
    // Replay first: whether this machine can hold it is the cheapest check.
    let table = Arc::new(replay_table(cfg, &env)?);

    // Networks: fresh, or from the checkpoint. Allocating on a device can fail.
    let (resumed, state_dir) = match &cfg.resume {
        Some(path) => {
            let (meta, state, dir) = checkpoint::load_state(path).map_err(RunError::Resume)?;
            checkpoint::check_fits(&meta, &env, &network).map_err(RunError::Resume)?;
            if meta.dueling != cfg.dqn.dueling {
                let (had, has) = (meta.dueling, cfg.dqn.dueling);
                return Err(RunError::Resume(checkpoint::CheckpointError::Mismatch(
                    format!(
                        "it was trained {} a dueling head, this run is {} one (check --dueling)",
                        if had { "with" } else { "without" },
                        if has { "with" } else { "without" }
                    ),
                )));
            }
            tracing::info!(
                "resuming from {} ({} updates, {} env steps)",
                dir.display(),
                meta.updates,
                meta.env_steps
            );
            let now = cfg.dqn.lr * cfg.dqn.lr_decay.map_or(1.0, |d| d.scale_at(meta.env_steps));
            if let Some(saved) = checkpoint::saved_learning_rate(path, meta.env_steps) {
                if (now - saved).abs() > 1e-9 * saved.abs().max(now.abs()) {
                    tracing::warn!(
                        "--resume: at env step {} the learning rate is {now:.3e} under this run's \
                         flags, {saved:.3e} under the saved run's: it jumps here (--lr, --lr-final, \
                         --lr-decay-steps, whose default is --max-steps)",
                        meta.env_steps
                    );
                }
            }
            (Some((meta, state)), Some(dir))
        }
        None => (None, None),
    };
    let (dqn, resumed) = {
        let (dqn_cfg, spec) = (cfg.dqn.clone(), network.clone());
        let made = catch_unwind(AssertUnwindSafe(move || match resumed {
            Some((meta, state)) => (Dqn::from_state(spec, dqn_cfg, device, state), Some(meta)),
            None => (Dqn::new(spec, dqn_cfg, device, cfg.seed), None),
        }));
        made.map_err(|p| {
            RunError::Device(format!(
                "cannot put the networks on {}: {}",
                cfg.device,
                crate::panic_message(&*p)
            ))
        })?
    };

    let start_steps = resumed.as_ref().map_or(0, |m| m.env_steps);
    let steps = Arc::new(StepCounter::new(start_steps));
    let mut best = None;
    if let (Some(dir), Some(meta)) = (&state_dir, &resumed) {
        let restored = checkpoint::restore_replay(dir, meta, &table, cfg.replay.learning_starts)
            .map_err(RunError::Resume)?;
        let stats = table.stats();
        tracing::info!(
            "replay: holds {} transitions ({} read back, {} skipped: in batches too large for this replay, or stored whole before replay stored frames once); rate limiter at {} inserts, {} samples",
            restored.held,
            restored.read,
            restored.skipped,
            stats.inserted,
            stats.sampled
        );
        // This run's own `best/`, which it will write to: there only when it continues
        // the run that wrote it.
        best = checkpoint::saved_eval(&layout, Which::Best).map_err(RunError::Resume)?;
    }
    let params = Arc::new(ParamsCell::new(dqn.params(
        resumed.as_ref().map_or(0, |m| m.params_version),
        start_steps,
    )));
    // The configuration once the set-up holds (a refused resume must not overwrite
    // the configuration of the run it was meant to continue), before any thread starts.
    std::fs::create_dir_all(&layout.root)
        .map_err(|e| RunError::Config(checkpoint::files::io(&layout.root)(e)))?;
    checkpoint::files::write_json(&layout.config(), cfg).map_err(RunError::Config)?;
    let metrics = Metrics::new(&cfg.logdir, bar, monitor, steps.get())?;
    let staging_depth = cfg
        .replay
        .prefetch_depth(millrace_core::prefetch::default_depth(
            &env.obs,
            cfg.batch_size,
            cuda,
        ));
    let footprint = Footprint::of(
        cfg.device,
        network.layout().len,
        network.population,
        cfg.batch_size,
        env.obs.row_bytes(),
        staging_depth,
        table.bytes_per_item() as usize * cfg.replay.capacity,
    );
    Ok(Setup {
        env,
        network,
        dqn: Some(dqn),
        start_steps,
        best,
        table,
        params,
        steps,
        layout,
        metrics,
        board: Arc::default(),
        started,
        footprint,
        staging_depth,
    })
}
