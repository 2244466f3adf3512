//! The threaded mode's wiring: every component and every link between them, in one
//! place (Sample Factory's `connect_components`). Each component gets only its own
//! configuration. The embedded and service modes differ only in where transitions
//! come from: actor threads here, or the server's connections (or both).
//!
//! Threads start in dependency order: the checkpoint writer, the publisher and the
//! sampler, the learner, the evaluator, the actors, and the server last. Whatever fails
//! after the first of them has started goes through the coordinator's one shutdown path
//! (see [`super::coordinator::Running::shutdown`]), so nothing is left running and a
//! checkpoint is attempted.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crossbeam_channel::{Sender, TrySendError};
use millrace_actor::runner::SinkClosed;
use millrace_actor::{run_actor, ActorSink, EpisodeStats, SharedParams};
use millrace_proto::TransitionBatch;
use millrace_replay::{ReplayError, Table};

use super::coordinator::{Links, Running};
use super::setup::Setup;
use super::RunError;
use super::{Component, Failure};
use crate::checkpoint::writer::{CheckpointContext, CheckpointWriter};
use crate::config::{DeviceChoice, RunConfig};
use crate::cpu_plan::host::{self, Role};
use crate::evaluation::Evaluator;
use crate::summary::StopReason;
use millrace_core::prefetch::{Prefetcher, SamplerConfig};
use millrace_core::publisher::Publisher;
use millrace_core::update_loop::{self, Command, LearnerParts, LearnerReport};
use millrace_server::{Route, Routes, ServerContext};

/// Actor output in the embedded mode: transitions go straight into replay (blocking
/// when the rate limiter says so), episode ends to the coordinator.
struct ReplaySink {
    table: Arc<Table>,
    episodes: Sender<EpisodeStats>,
    /// Close after this many batches and report a failure (tests of the shutdown path).
    fail_after: Option<u64>,
    batches: u64,
    failed: bool,
}

impl ActorSink for ReplaySink {
    fn transitions(&mut self, batch: &mut TransitionBatch) -> Result<(), SinkClosed> {
        self.batches += 1;
        if self.fail_after.is_some_and(|n| self.batches > n) {
            self.failed = true;
            return Err(SinkClosed);
        }
        match self.table.insert(batch) {
            Ok(()) => Ok(()),
            Err(ReplayError::Closed) => Err(SinkClosed),
            Err(e) => {
                // Our own actors built this batch: a malformed one is a bug, not input.
                tracing::error!("actor {} produced a bad batch: {e}", batch.actor_id);
                self.failed = true;
                Err(SinkClosed)
            }
        }
    }

    fn episode(&mut self, stats: EpisodeStats) {
        // Statistics only: drop rather than block an actor if the coordinator lags.
        if let Err(TrySendError::Full(_)) = self.episodes.try_send(stats) {
            tracing::trace!("episode stats dropped");
        }
    }
}

fn spawn<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<JoinHandle<T>> {
    std::thread::Builder::new().name(name.into()).spawn(f)
}

/// Starts every component of the threaded mode and connects them.
pub fn connect(cfg: &RunConfig, setup: &mut Setup) -> Result<(Running, Links), RunError> {
    let dqn = setup.dqn.take().expect("the networks are set up once");
    let device = cfg.device.device();
    // Threads that end by themselves when dropped, if anything below fails first.
    let ckpt = Arc::new(CheckpointContext {
        layout: setup.layout.clone(),
        env: setup.env.clone(),
        network: setup.network.clone(),
        seed: cfg.seed,
        table: Arc::clone(&setup.table),
        last_eval: Mutex::new(None),
    });
    let writer = Arc::new(CheckpointWriter::spawn(Arc::clone(&ckpt))?);
    let publisher = Publisher::spawn(Arc::clone(&setup.params), device)?;
    let prefetcher = spawn_prefetcher(cfg, setup)?;

    // The learner thread. From here on, failures go through the shutdown path.
    let (cmd_tx, cmd_rx) = crossbeam_channel::bounded::<Command>(1);
    let (report_tx, report_rx) = crossbeam_channel::bounded::<LearnerReport>(64);
    // `/livez` follows the learner thread's signs of life.
    let alive = Arc::new(std::sync::atomic::AtomicU64::new(0));
    setup
        .metrics
        .watch_learner(Arc::clone(&alive), cfg.live_limit);
    let parts = LearnerParts {
        dqn,
        prefetcher,
        publisher,
        steps: Arc::clone(&setup.steps),
        footprint: setup.footprint,
        // Applied by a thread of its own (started here, on the service CPUs): the
        // learner thread never takes replay's shard locks for them.
        feedback: Some(
            crate::replay_flags::feedback(
                cfg.replay.priority.as_ref(),
                &setup.table,
                device,
                setup.steps.get(),
                cfg.poison_td(),
            )
            .on_own_thread()?,
        ),
        panic_after: cfg.faults.learner_panic.then_some(50),
        oom: cfg.faults.oom.map(|f| (f, 50)),
        alive: Arc::clone(&alive),
    };
    let loop_cfg = cfg.learner.clone();
    let learner_writer = Arc::clone(&writer);
    let plan = cfg.cpu_plan.clone();
    let learner = spawn("learner", move || {
        // Pinned before its first libtorch call, so the autograd worker libtorch starts
        // for a CUDA device inherits the learner's CPU.
        host::enter(&plan, Role::Learner(0));
        // The learner gets one intra-op thread: actors and the sampler need the rest.
        tch::set_num_threads(1);
        update_loop::run(parts, &loop_cfg, &cmd_rx, &report_tx, &*learner_writer)
    })?;
    let (episode_tx, episode_rx) = crossbeam_channel::bounded::<EpisodeStats>(4096);
    let mut running = Running {
        stop_actors: Arc::new(AtomicBool::new(false)),
        table: Arc::clone(&setup.table),
        commands: cmd_tx,
        learner: Some(learner),
        writer,
        ckpt,
        evaluator: None,
        actors: Vec::new(),
        server: None,
    };
    let links = Links {
        episodes: episode_rx,
        reports: report_rx,
    };

    // The rest can fail after threads started: shut down what runs, then report.
    let rest = (|| -> Result<(), RunError> {
        running.evaluator = Some(Evaluator::spawn(
            cfg.env.clone(),
            setup.network.clone(),
            cfg.eval.episodes,
            cfg.faults.evaluator,
        )?);
        spawn_actors(cfg, setup, &mut running, &episode_tx)?;
        if let Some(scfg) = &cfg.server {
            let ctx = ServerContext {
                env: setup.env.clone(),
                env_config: cfg.env.clone(),
                clip_rewards: cfg.clip_rewards,
                network: setup.network.clone(),
                run_id: format!("{}-{}-{}", setup.env.id, cfg.seed, std::process::id()),
                routes: Routes::One(Route {
                    table: Arc::clone(&setup.table),
                    params: Arc::clone(&setup.params),
                    steps: Arc::clone(&setup.steps),
                }),
                episodes: episode_tx.clone(),
                board: Arc::clone(&setup.board),
            };
            running.server = Some(millrace_server::spawn(scfg.clone(), ctx)?);
        }
        Ok(())
    })();
    if let Err(e) = rest {
        let ended = running.shutdown(StopReason::Failed);
        return Err(ended.into_error(Failure::new(Component::SetUp, e.to_string())));
    }
    Ok((running, links))
}

/// The sampler thread, drawing batches into staging ahead of the learner: pinned
/// buffers copied without blocking on a GPU, or copied on a side stream of their own
/// (`--copy-stream`; `setup::prepare` refused one without CUDA).
fn spawn_prefetcher(cfg: &RunConfig, setup: &Setup) -> Result<Prefetcher, RunError> {
    let device = cfg.device.device();
    let cuda = cfg.device != DeviceChoice::Cpu && tch::Cuda::is_available();
    let sampler = SamplerConfig {
        depth: setup.staging_depth,
        seed: cfg.seed ^ 0x5eed,
        fail_after: cfg.faults.sampler.then_some(1),
    };
    let table = Arc::clone(&setup.table);
    let obs = &setup.env.obs;
    Ok(match cfg.device {
        DeviceChoice::Cuda(i) if cfg.learner.copy_stream => {
            let stream = millrace_core::cuda::CopyStream::new(i)?;
            Prefetcher::spawn_on_copy_stream(table, obs, cfg.batch_size, device, &stream, sampler)?
        }
        _ => Prefetcher::spawn(table, obs, cfg.batch_size, cuda.then_some(device), sampler)?,
    })
}

/// The embedded actor threads, each stepping its environments into replay until
/// `running` stops them; episodes go to `episodes`. Each one started joins `running`
/// at once, so a failure to start the next shuts it down with the rest.
fn spawn_actors(
    cfg: &RunConfig,
    setup: &Setup,
    running: &mut Running,
    episodes: &Sender<EpisodeStats>,
) -> Result<(), RunError> {
    let seed_offset = setup.start_steps;
    // The actors pack each parameter version once between them.
    let shared = SharedParams::new(Arc::clone(&setup.params));
    for id in 0..cfg.actors.count {
        let acfg = cfg.actor(id as u32, seed_offset);
        let network = setup.network.clone();
        let mut params = shared.clone();
        let mut sink = ReplaySink {
            table: Arc::clone(&setup.table),
            episodes: episodes.clone(),
            fail_after: (cfg.faults.actor && id == 0).then_some(20),
            batches: 0,
            failed: false,
        };
        let (steps, stop) = (Arc::clone(&setup.steps), Arc::clone(&running.stop_actors));
        let plan = cfg.cpu_plan.clone();
        let handle = spawn(&format!("actor-{id}"), move || {
            host::enter(&plan, Role::Actor);
            let taken = run_actor(&acfg, &network, &mut params, &mut sink, &steps, &stop)
                .map_err(|e| e.to_string())?;
            if sink.failed {
                return Err(match sink.fail_after {
                    Some(n) => format!("injected fault after {n} batches"),
                    None => "produced a malformed batch (see the log)".into(),
                });
            }
            Ok(taken)
        })?;
        running.actors.push((id as u32, handle));
    }
    Ok(())
}
