//! The embedded mode: actors as threads, replay in memory, one learner thread, all wired
//! in [`train`]. The coordinator (the calling thread) watches progress, triggers greedy
//! evaluations, writes metrics and decides when to stop.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Sender, TrySendError};
use millrace_actor::{
    run_actor, ActorConfig, ActorControl, ActorSink, EpisodeStats, EpsilonSchedule, MlpPolicy,
    Policy,
};
use millrace_proto::{EnvSpec, NetworkSpec, Params, TransitionBatch};
use millrace_replay::{RateLimiterConfig, ReplayConfig, ReplayError, Table};
use tch::Device;

use crate::checkpoint;
use crate::dqn::{Dqn, DqnConfig};
use crate::metrics::Metrics;
use crate::prefetch::Prefetcher;
use crate::update_loop::{self, CheckpointContext, Command, LearnerReport, LoopConfig, StallTimes};
use millrace_actor::{ParamsSlot, SlotReader};

/// Replay and rate-limiting settings.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    pub capacity: usize,
    pub shards: usize,
    /// Items sampled per item inserted: `batch_size × updates ÷ env transitions`.
    pub samples_per_insert: f64,
    /// How far (in sampled items) the ratio may drift before one side blocks.
    pub tolerance: f64,
    /// Transitions stored before the first update (SB3's `learning_starts`).
    pub learning_starts: u64,
}

/// Everything a training run needs, checked once in the binary (see `main.rs`).
#[derive(Clone, Debug)]
pub struct TrainConfig {
    pub env_id: String,
    pub seed: u64,
    pub device: Device,
    pub hidden: Vec<usize>,
    pub dqn: DqnConfig,
    pub batch_size: usize,
    pub replay: ReplayOptions,
    pub actors: usize,
    pub envs_per_actor: usize,
    /// Transitions per batch an actor hands on (at least one step of every env).
    pub actor_batch: usize,
    pub n_step: usize,
    pub gamma: f32,
    pub epsilon: EpsilonSchedule,
    pub publish_every: u64,
    /// Greedy evaluation every this many env steps.
    pub eval_every: u64,
    pub eval_episodes: usize,
    /// Stop once the greedy evaluation's mean return reaches this.
    pub target_return: Option<f32>,
    pub max_steps: u64,
    pub logdir: PathBuf,
    pub checkpoint_every: Option<Duration>,
    pub resume: Option<PathBuf>,
    /// Progress bar to drive (the binary creates it so logging can share the terminal).
    pub progress: Option<indicatif::ProgressBar>,
    /// Also serve remote actors (`learner --listen`).
    pub server: Option<crate::server::ServerConfig>,
    /// Copy batches to the GPU on a side stream (`--copy-stream`; not yet verified on
    /// a GPU, see `cuda_copy`).
    pub copy_stream: bool,
}

impl TrainConfig {
    /// Transitions per batch an actor hands on: at least one step of every env.
    pub fn actor_batch_rows(&self) -> usize {
        self.actor_batch.max(self.envs_per_actor)
    }
}

/// Why a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    Solved,
    MaxSteps,
    Interrupted,
}

/// The end-of-run summary.
#[derive(Clone, Debug)]
pub struct TrainSummary {
    pub reason: StopReason,
    pub env_steps: u64,
    pub updates: u64,
    pub wall_s: f64,
    /// Env steps at the evaluation that met the target.
    pub solved_at_steps: Option<u64>,
    pub last_eval: Option<(u64, f32)>,
    pub train_return_100: Option<f32>,
    pub episodes: u64,
    pub stalls: StallTimes,
    pub checkpoint: PathBuf,
    /// Bytes allocated per transition of replay capacity.
    pub replay_bytes_per_item: f64,
    pub replay: millrace_replay::ReplayStats,
    pub obs_row_bytes: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Env(#[from] millrace_actor::EnvError),
    #[error(transparent)]
    Spec(#[from] millrace_proto::SpecError),
    #[error("cannot resume: {0}")]
    Checkpoint(#[from] checkpoint::CheckpointError),
    #[error(transparent)]
    RateLimiter(#[from] millrace_replay::RateLimiterError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("a {0} thread failed: {1}")]
    Thread(&'static str, String),
    #[error("final checkpoint failed: {0}")]
    FinalCheckpoint(checkpoint::CheckpointError),
    #[error("--copy-stream: {0}")]
    CopyStream(#[from] crate::cuda_copy::CopyStreamError),
    #[error("--copy-stream needs a CUDA device (this run is on {0:?})")]
    CopyStreamNeedsCuda(Device),
}

/// Actor output in the embedded mode: transitions go straight into replay (blocking
/// when the rate limiter says so), episode ends to the coordinator.
struct ReplaySink {
    table: Arc<Table>,
    episodes: Sender<EpisodeStats>,
}

impl ActorSink for ReplaySink {
    fn transitions(
        &mut self,
        batch: TransitionBatch,
    ) -> Result<(), millrace_actor::runner::SinkClosed> {
        match self.table.insert(&batch) {
            Ok(()) => Ok(()),
            Err(ReplayError::Closed) => Err(millrace_actor::runner::SinkClosed),
            Err(e @ (ReplayError::Malformed(_) | ReplayError::TooLarge(_))) => {
                // Our own actors built this batch: a malformed one is a bug, not input.
                tracing::error!("actor {} produced a bad batch: {e}", batch.actor_id);
                Err(millrace_actor::runner::SinkClosed)
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

struct EvalRequest {
    params: Arc<Params>,
    env_steps: u64,
}

struct EvalDone {
    env_steps: u64,
    mean: f32,
    result: Result<(), String>,
}

fn spawn<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<JoinHandle<T>> {
    std::thread::Builder::new().name(name.into()).spawn(f)
}

/// The shared ends that actors of either mode feed and read.
struct Links {
    env: EnvSpec,
    network: NetworkSpec,
    table: Arc<Table>,
    params: Arc<ParamsSlot>,
    control: Arc<ActorControl>,
    episodes: Sender<EpisodeStats>,
}

type ActorThread = JoinHandle<Result<u64, String>>;

/// Embedded mode: actors as threads of this process, inserting straight into replay.
fn wire_local_actors(
    cfg: &TrainConfig,
    links: &Links,
    seed_offset: u64,
) -> Result<Vec<ActorThread>, TrainError> {
    let mut actors = Vec::new();
    for id in 0..cfg.actors {
        let acfg = ActorConfig {
            actor_id: id as u32,
            env_id: cfg.env_id.clone(),
            num_envs: cfg.envs_per_actor,
            seed: cfg.seed.wrapping_add(seed_offset),
            n_step: cfg.n_step,
            gamma: cfg.gamma,
            batch_rows: cfg.actor_batch_rows(),
            epsilon: cfg.epsilon,
            env_epsilons: None,
        };
        let mut policy = MlpPolicy::new(links.network.clone(), 0)
            .map_err(|e| TrainError::Thread("actor", e.to_string()))?;
        let mut source = SlotReader(Arc::clone(&links.params));
        let mut sink = ReplaySink {
            table: Arc::clone(&links.table),
            episodes: links.episodes.clone(),
        };
        let control = Arc::clone(&links.control);
        actors.push(spawn(&format!("actor-{id}"), move || {
            run_actor(&acfg, &mut policy, &mut source, &mut sink, &control)
                .map_err(|e| e.to_string())
        })?);
    }
    Ok(actors)
}

/// Service mode: remote actor processes, through the server, into the same replay.
fn wire_remote_actors(
    cfg: &TrainConfig,
    scfg: &crate::server::ServerConfig,
    links: &Links,
    board: &Arc<crate::server::ActorBoard>,
) -> Result<crate::server::ServerHandle, TrainError> {
    let mut scfg = scfg.clone();
    scfg.n_step = cfg.n_step as u32;
    scfg.gamma = cfg.gamma;
    scfg.batch_rows = cfg.actor_batch_rows() as u32;
    scfg.batch_envs = cfg.envs_per_actor as u32;
    if !scfg.apex_epsilon {
        if let EpsilonSchedule::Linear { start, end, steps } = cfg.epsilon {
            scfg.epsilon_decay = Some(millrace_proto::wire::EpsilonDecay { start, end, steps });
        }
    }
    let ctx = crate::server::ServerContext {
        env: links.env.clone(),
        network: links.network.clone(),
        run_id: format!("{}-{}-{}", links.env.id, cfg.seed, std::process::id()),
        table: Arc::clone(&links.table),
        params: Arc::clone(&links.params),
        episodes: links.episodes.clone(),
        control: Arc::clone(&links.control),
        board: Arc::clone(board),
    };
    Ok(crate::server::spawn(scfg, ctx)?)
}

/// Trains until the target return, `max_steps` or `interrupt`; then checkpoints.
pub fn train(cfg: &TrainConfig, interrupt: Arc<AtomicBool>) -> Result<TrainSummary, TrainError> {
    let started = Instant::now();
    let env: EnvSpec = millrace_actor::env::spec(&cfg.env_id)?;
    let network = NetworkSpec::mlp(&env.obs, &cfg.hidden, env.num_actions, 1)?;

    // State: fresh or from a checkpoint.
    let (dqn, resumed) = match &cfg.resume {
        Some(path) => {
            let (meta, state) = checkpoint::load(path)?;
            checkpoint::check_fits(&meta, &env, &network)?;
            tracing::info!(
                "resuming from {} ({} updates, {} env steps)",
                path.display(),
                meta.updates,
                meta.env_steps
            );
            (
                Dqn::from_state(network.clone(), cfg.dqn.clone(), cfg.device, state),
                Some(meta),
            )
        }
        None => (
            Dqn::new(network.clone(), cfg.dqn.clone(), cfg.device, cfg.seed),
            None,
        ),
    };
    let control = Arc::new(ActorControl::default());
    let version = match &resumed {
        Some(m) => {
            control.env_steps.store(m.env_steps, Ordering::Relaxed);
            m.params_version
        }
        None => 0,
    };
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
    let table = Arc::new(Table::new(&ReplayConfig {
        capacity: cfg.replay.capacity,
        shards: cfg.replay.shards,
        obs_row_bytes: env.obs.row_bytes(),
        obs_rows_per_item: ReplayConfig::obs_rows_for(
            cfg.envs_per_actor,
            cfg.n_step,
            cfg.actor_batch_rows(),
        ),
        limiter,
    }));
    if let (Some(path), Some(meta)) = (&cfg.resume, &resumed) {
        let restored = checkpoint::load_replay(path, meta, &table)?;
        tracing::info!(
            "replay: restored {restored} transitions; rate limiter at {} inserts, {} samples",
            meta.replay_inserts,
            meta.replay_samples
        );
    }
    let params = Arc::new(ParamsSlot::new(Params {
        version,
        env_steps: control.env_steps.load(Ordering::Relaxed),
        population: 1,
        data: dqn.online_params(),
    }));

    // Fallible set-up first, so that an error here leaves no threads running.
    let mut metrics = Metrics::new(
        &cfg.logdir,
        cfg.progress.clone(),
        control.env_steps.load(Ordering::Relaxed),
    )?;
    let pinned = cfg.device != Device::Cpu && tch::Cuda::is_available();
    let copy_stream = match (cfg.copy_stream, cfg.device) {
        (false, _) => None,
        (true, Device::Cuda(i)) if pinned => Some(crate::cuda_copy::CopyStream::new(i)?),
        (true, other) => return Err(TrainError::CopyStreamNeedsCuda(other)),
    };
    // The first thread: it ends by itself when dropped, wherever set-up fails later.
    let publisher = update_loop::Publisher::spawn(Arc::clone(&params))
        .map_err(|e| TrainError::Thread("publish", e.to_string()))?;

    let (episode_tx, episode_rx) = crossbeam_channel::bounded::<EpisodeStats>(4096);
    // Where transitions come from: the two modes differ only here.
    let links = Links {
        env: env.clone(),
        network: network.clone(),
        table: Arc::clone(&table),
        params: Arc::clone(&params),
        control: Arc::clone(&control),
        episodes: episode_tx.clone(),
    };
    let board = Arc::new(crate::server::ActorBoard::default());
    let server = match &cfg.server {
        Some(scfg) => Some(wire_remote_actors(cfg, scfg, &links, &board)?),
        None => None,
    };
    let actors = wire_local_actors(cfg, &links, resumed.as_ref().map_or(0, |m| m.env_steps))?;
    drop((links, episode_tx));

    // Prefetcher and learner.
    let depth = crate::prefetch::default_depth(&env.obs, cfg.batch_size, pinned);
    let prefetcher = match &copy_stream {
        Some(stream) => Prefetcher::spawn_on_copy_stream(
            Arc::clone(&table),
            &env.obs,
            cfg.batch_size,
            depth,
            cfg.device,
            stream,
            cfg.seed ^ 0x5eed,
        )?,
        None => Prefetcher::spawn(
            Arc::clone(&table),
            &env.obs,
            cfg.batch_size,
            depth,
            pinned.then_some(cfg.device),
            cfg.seed ^ 0x5eed,
        )?,
    };
    let (cmd_tx, cmd_rx) = crossbeam_channel::bounded::<Command>(1);
    let (report_tx, report_rx) = crossbeam_channel::bounded::<LearnerReport>(64);
    let loop_cfg = LoopConfig {
        publish_every: cfg.publish_every,
        report_every: Duration::from_millis(500),
        checkpoint_every: cfg.checkpoint_every,
    };
    let ckpt = CheckpointContext {
        dir: cfg.logdir.join("checkpoint"),
        env: env.clone(),
        seed: cfg.seed,
        control: Arc::clone(&control),
        table: Arc::clone(&table),
    };
    let learner = spawn("learner", move || {
        // The learner gets one intra-op thread: actors and the sampler need the rest.
        tch::set_num_threads(1);
        let outcome = update_loop::run(
            dqn,
            &loop_cfg,
            &prefetcher,
            &publisher,
            &cmd_rx,
            &report_tx,
            &ckpt,
        );
        prefetcher.join();
        drop(publisher);
        outcome
    })?;

    // Evaluator.
    let (eval_tx, eval_rx) = crossbeam_channel::bounded::<EvalRequest>(1);
    let (done_tx, done_rx) = crossbeam_channel::bounded::<EvalDone>(4);
    let evaluator = {
        let env = env.clone();
        let network = network.clone();
        let episodes = cfg.eval_episodes;
        let seed = cfg.seed ^ 0xe7a1;
        spawn("eval", move || {
            let mut policy = MlpPolicy::new(network, 0).expect("agent 0 exists");
            for req in eval_rx {
                let out = policy
                    .load(&req.params)
                    .map_err(|e| e.to_string())
                    .and_then(|()| {
                        // Fresh start states for every evaluation, reproducible per step.
                        let seed = millrace_actor::derive_seed(seed, req.env_steps);
                        millrace_actor::evaluate(&env, &mut policy, episodes, seed)
                            .map_err(|e| e.to_string())
                    });
                let done = match out {
                    Ok(r) => EvalDone {
                        env_steps: req.env_steps,
                        mean: r.mean(),
                        result: Ok(()),
                    },
                    Err(e) => EvalDone {
                        env_steps: req.env_steps,
                        mean: f32::NAN,
                        result: Err(e),
                    },
                };
                if done_tx.send(done).is_err() {
                    break;
                }
            }
        })?
    };

    // Coordinator.
    let mut window: VecDeque<f32> = VecDeque::with_capacity(100);
    let mut episodes = 0u64;
    let start_steps = control.env_steps.load(Ordering::Relaxed);
    let mut next_eval = (start_steps / cfg.eval_every.max(1) + 1) * cfg.eval_every.max(1);
    let mut eval_in_flight = false;
    let mut last_eval = None;
    let mut solved_at = None;
    let mut report = LearnerReport::default();
    let reason = loop {
        std::thread::sleep(Duration::from_millis(20));
        let steps = control.env_steps.load(Ordering::Relaxed);
        for ep in episode_rx.try_iter() {
            episodes += 1;
            if window.len() == 100 {
                window.pop_front();
            }
            window.push_back(ep.episode_return);
        }
        for r in report_rx.try_iter() {
            report = r;
        }
        for done in done_rx.try_iter() {
            eval_in_flight = false;
            if let Err(e) = &done.result {
                tracing::error!("evaluation failed: {e}");
                continue;
            }
            tracing::info!(
                "eval at {} env steps: mean return {:.1} over {} episodes",
                done.env_steps,
                done.mean,
                cfg.eval_episodes
            );
            metrics.eval(done.env_steps, done.mean);
            last_eval = Some((done.env_steps, done.mean));
            if cfg.target_return.is_some_and(|t| done.mean >= t) && solved_at.is_none() {
                solved_at = Some(done.env_steps);
            }
        }
        if solved_at.is_some() {
            break StopReason::Solved;
        }
        // Past the step budget no new evaluation starts; the one in flight may finish.
        if !eval_in_flight && steps >= next_eval && steps < cfg.max_steps {
            let sent = eval_tx.try_send(EvalRequest {
                params: params.latest(),
                env_steps: steps,
            });
            if sent.is_ok() {
                eval_in_flight = true;
                next_eval = (steps / cfg.eval_every.max(1) + 1) * cfg.eval_every.max(1);
            }
        }
        let train_mean =
            (!window.is_empty()).then(|| window.iter().sum::<f32>() / window.len() as f32);
        let eps = cfg.epsilon.value(steps);
        let remote = server.as_ref().map(|_| &*board);
        metrics.tick(steps, &report, train_mean, eps, &table, remote);
        if interrupt.load(Ordering::Relaxed) {
            break StopReason::Interrupted;
        }
        if steps >= cfg.max_steps && !eval_in_flight {
            break StopReason::MaxSteps;
        }
        // A thread that ends on its own has failed; joining below reports why.
        if learner.is_finished()
            || evaluator.is_finished()
            || actors.iter().any(JoinHandle::is_finished)
        {
            break StopReason::Interrupted;
        }
    };

    // Shutdown: stop actors, close replay (wakes anything blocked), stop the learner.
    control.stop.store(true, Ordering::Relaxed);
    let _ = cmd_tx.try_send(Command::Stop);
    table.close();
    if let Some(server) = server {
        server.shutdown();
    }
    drop(eval_tx);
    let outcome = learner
        .join()
        .map_err(|_| TrainError::Thread("learner", "panicked".into()))?;
    for actor in actors {
        match actor.join() {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(TrainError::Thread("actor", e)),
            Err(_) => return Err(TrainError::Thread("actor", "panicked".into())),
        }
    }
    let _ = evaluator.join();
    let env_steps = control.env_steps.load(Ordering::Relaxed);
    let checkpoint = outcome.checkpoint.map_err(TrainError::FinalCheckpoint)?;
    let summary = TrainSummary {
        reason,
        env_steps,
        updates: outcome.last.updates,
        wall_s: started.elapsed().as_secs_f64(),
        solved_at_steps: solved_at,
        last_eval,
        train_return_100: (!window.is_empty())
            .then(|| window.iter().sum::<f32>() / window.len() as f32),
        episodes,
        stalls: outcome.last.stalls,
        checkpoint,
        replay_bytes_per_item: table.bytes_per_item(),
        replay: table.stats(),
        obs_row_bytes: table.obs_row_bytes(),
    };
    metrics.finish(&summary);
    Ok(summary)
}
