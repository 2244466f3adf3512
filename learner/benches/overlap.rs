//! Does the learner ever wait? One command, one run, one table:
//!
//! (a) ceiling: `Dqn::update` on a batch already on the device (the "100% busy" loop),
//!     on the learner's CPU;
//! (b) end to end: actor threads → replay (rate limited) → prefetcher → the learner
//!     thread of a real run; efficiency = (b) / (a). Everything in a row is measured
//!     in one window of steady state (a warm-up after learning starts is discarded):
//!     updates/s, the actors' total env steps/s and transitions inserted/s (as the
//!     rate limiter counts them), the most transitions
//!     admitted between two samples (`ReplayStats::burst`), the learner's time split,
//!     and each kind of thread's CPU time (`/proc/self/task`, in cores). The window is
//!     `--seconds` or four admission cycles (the time the learner takes to consume one
//!     actor batch at its ceiling), whichever is longer, at most `--max-window`;
//! (c) replay: insert and sample+collate throughput against `memcpy` of the same bytes,
//!     and replay memory per transition against one observation;
//! (d) one actor alone: one actor thread's env steps/s (batched inference, 8 envs), on
//!     the actors' CPUs with nothing else running.
//!
//! for the CartPole MLP (64×64) and the Nature CNN on `CatchPixels-v0` (4×84×84 `u8`),
//! at batch 32 and 512, for each actor count in `--actors` (default `1,2,4,…` up to
//! the CPU plan's actor CPUs, and `auto`: the count `learner --actors auto` picks from
//! (a) and (d)). Threads run where the learner binary's CPU plan puts them
//! (`learner::cpu_plan`; `--cpu-plan off` pins nothing), with one intra-op thread.
//!
//! With `--checkpoint-every S`, (b) starts from a full replay and checkpoints every S
//! seconds, and a second table shows what that costs the learner thread: its longest
//! stall per checkpoint (copying the networks to the host and handing them to the
//! writer thread, which snapshots replay batch by batch while actors keep inserting),
//! against the writer's time per checkpoint, and updates/s against the same run (full
//! replay too) without checkpoints.
//!
//! The learner's feedback into replay is a real run's: poison checks every 8 updates
//! (uniform replay) or priorities every 8 with `--replay prioritized` (α 0.6, β 0.4),
//! applied on a thread of their own (`--priorities thread`, the learner's way) or on
//! the learner thread (`inline`, the lock-step drivers' way); `--priorities
//! inline,thread` gives a row each, side by side, and the "priorities" column is the
//! learner thread's time handing TD errors to replay.
//!
//! Parameters are published every 20 updates, the learner's default; `--publish-every
//! 1,20,200` gives a row each, and the "publish" column is the learner thread's time
//! publishing (on a GPU: the snapshot on the compute stream and an event after it; the
//! copy off the device is the publisher thread's, on a stream of its own).
//!
//! `cargo bench -p millrace-learner --bench overlap -- [--seconds S] [--max-window S] [--only mlp|cnn] [--batch 32,512] [--actors 1,2,auto] [--replay uniform|prioritized] [--priorities inline,thread] [--publish-every 1,20,200] [--cpu-plan on|off] [--copy-stream] [--cpu | --gpu N] [--tf32 off|conv|all] [--checkpoint-every S]`

mod common;

use common::threads;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use millrace_actor::runner::{ActorSink, EpisodeStats, SinkClosed};
use millrace_actor::{make, make_pixels, run_actor, ActorConfig, EpsilonSchedule};
use millrace_core::cuda::CopyStream;
use millrace_core::dqn::{Dqn, DqnConfig};
use millrace_core::memory::Footprint;
use millrace_core::prefetch::{Prefetcher, SamplerConfig, StagingBuffer};
use millrace_core::priority_feedback::{BetaSchedule, PriorityFeedback};
use millrace_core::publisher::Publisher;
use millrace_core::update_loop::{self, LearnerParts};
use millrace_learner::checkpoint::writer::{CheckpointContext, CheckpointWriter};
use millrace_learner::checkpoint::Layout;
use millrace_learner::config::{DeviceChoice, LoopConfig};
use millrace_learner::cpu_plan::auto::AutoChoice;
use millrace_learner::cpu_plan::host::{self, Role};
use millrace_learner::cpu_plan::{ActorCount, CpuPlan};
use millrace_proto::EnvConfig;
use millrace_proto::{EnvSpec, NetworkSpec, Params, ParamsCell, StepCounter, TransitionBatch};
use millrace_replay::{PriorityConfig, RateLimiterConfig, ReplayConfig, Table};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use tch::Device;

const ENVS: usize = 8;
const N_STEP: usize = 3;
const SPI: f64 = 32.0;

#[derive(Clone, Copy, PartialEq)]
enum Net {
    Mlp,
    Cnn,
}

impl Net {
    fn name(self) -> &'static str {
        match self {
            Net::Mlp => "MLP 64x64 / CartPole",
            Net::Cnn => "Nature CNN / CatchPixels",
        }
    }

    fn env(self) -> EnvSpec {
        match self {
            Net::Mlp => make("CartPole-v1", 0).unwrap().spec().clone(),
            Net::Cnn => make_pixels("CatchPixels-v0", 0).unwrap().spec().clone(),
        }
    }

    fn network(self) -> NetworkSpec {
        let env = self.env();
        match self {
            Net::Mlp => NetworkSpec::mlp(&env.obs, &[64, 64], env.num_actions, 1).unwrap(),
            Net::Cnn => NetworkSpec::nature_cnn(&env.obs, env.num_actions).unwrap(),
        }
    }

    /// Transitions per actor batch: large enough for pixels that carried rows cost
    /// under 10% (see `ReplayConfig::obs_rows_for`).
    fn actor_batch(self) -> usize {
        match self {
            Net::Mlp => 16,
            Net::Cnn => 512,
        }
    }

    fn capacity(self) -> usize {
        match self {
            Net::Mlp => 100_000,
            Net::Cnn => 20_000,
        }
    }
}

/// Where the learner's TD errors are applied to replay.
#[derive(Clone, Copy, PartialEq)]
enum Apply {
    /// On the learner thread (the lock-step drivers' way).
    Inline,
    /// On a thread of their own (the learner thread's way in a real run).
    Thread,
}

impl Apply {
    fn name(self) -> &'static str {
        match self {
            Apply::Inline => "inline",
            Apply::Thread => "own thread",
        }
    }
}

/// Updates per round of feedback: the learner's `--priority-feedback-every` default
/// and its poison checks' cadence with uniform replay.
const FEEDBACK_EVERY: usize = 8;

/// What actor threads share: a stop flag and the run's step counter.
#[derive(Default)]
struct Control {
    stop: AtomicBool,
    steps: StepCounter,
}

struct Opts {
    /// The shortest end-to-end window, and how long (a), (c) and (d) measure.
    seconds: f64,
    /// The longest end-to-end window.
    max_window: f64,
    /// `--cpu-plan off`: pin nothing.
    cpu_plan: bool,
    /// Checkpoint every this often in (b), once replay is full.
    checkpoint_every: Option<f64>,
    /// Actor thread counts feeding replay in (b), 8 envs each, one row each (`None`:
    /// 1, 2, 4, … up to the plan's actor CPUs, and `auto`).
    actors: Option<Vec<ActorCount>>,
    /// Copy batches on a side CUDA stream in (b) (`--copy-stream`).
    copy_stream: bool,
    /// `--replay prioritized`.
    prioritized: bool,
    /// Where TD errors are applied in (b), one row each.
    priorities: Vec<Apply>,
    /// Updates between two parameter publications in (b), one row each.
    publish_every: Vec<u64>,
    nets: Vec<Net>,
    batches: Vec<usize>,
    device: Device,
    tf32: millrace_core::torch_settings::Tf32,
}

fn parse() -> Opts {
    let mut o = Opts {
        seconds: 4.0,
        max_window: 90.0,
        cpu_plan: true,
        checkpoint_every: None,
        actors: None,
        copy_stream: false,
        prioritized: false,
        priorities: vec![Apply::Thread],
        publish_every: vec![20],
        nets: vec![Net::Mlp, Net::Cnn],
        batches: vec![32, 512],
        device: Device::cuda_if_available(),
        tf32: millrace_core::torch_settings::Tf32::Conv,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let next = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--seconds" => o.seconds = next.parse().expect("--seconds S"),
            "--checkpoint-every" => {
                o.checkpoint_every = Some(next.parse().expect("--checkpoint-every S"))
            }
            "--max-window" => o.max_window = next.parse().expect("--max-window S"),
            "--cpu-plan" => {
                o.cpu_plan = match next.as_str() {
                    "on" => true,
                    "off" => false,
                    other => panic!("--cpu-plan on|off, got {other}"),
                }
            }
            "--actors" => {
                o.actors = Some(
                    next.split(',')
                        .map(|x| x.parse().expect("--actors 1,2,auto"))
                        .collect(),
                )
            }
            "--replay" => {
                o.prioritized = match next.as_str() {
                    "uniform" => false,
                    "prioritized" => true,
                    other => panic!("--replay uniform|prioritized, got {other}"),
                }
            }
            "--priorities" => {
                o.priorities = next
                    .split(',')
                    .map(|x| match x {
                        "inline" => Apply::Inline,
                        "thread" => Apply::Thread,
                        other => panic!("--priorities inline,thread, got {other}"),
                    })
                    .collect()
            }
            "--publish-every" => {
                o.publish_every = next
                    .split(',')
                    .map(|x| x.parse().expect("--publish-every 1,20,200"))
                    .collect()
            }
            "--only" => {
                o.nets = match next.as_str() {
                    "mlp" => vec![Net::Mlp],
                    "cnn" => vec![Net::Cnn],
                    other => panic!("--only mlp|cnn, got {other}"),
                }
            }
            "--batch" => {
                o.batches = next
                    .split(',')
                    .map(|x| x.parse().expect("--batch 32,512"))
                    .collect()
            }
            "--cpu" => {
                o.device = Device::Cpu;
                i -= 1;
            }
            "--gpu" => o.device = common::gpu(&next),
            "--tf32" => o.tf32 = common::tf32(&next),
            "--copy-stream" => {
                o.copy_stream = true;
                i -= 1;
            }
            "--bench" => i -= 1,
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    if o.copy_stream && !matches!(o.device, Device::Cuda(_)) {
        eprintln!(
            "error: --copy-stream needs a CUDA device (this run is on {:?})",
            o.device
        );
        std::process::exit(2);
    }
    o
}

/// Runs `f` in a thread pinned where `plan` puts `role` (named `name`, which the
/// per-thread CPU table reads), and returns what it returns.
fn on<T: Send + 'static>(
    plan: &CpuPlan,
    role: Role,
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let plan = plan.clone();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            host::enter(&plan, role);
            tch::set_num_threads(1);
            f()
        })
        .expect("a thread starts")
        .join()
        .expect("the thread ends without panicking")
}

/// (a) updates/s on a batch already on the device, on the learner's CPU, optionally
/// with an unthrottled actor busy on the actors' CPUs (to tell interference between
/// cores from pipeline overhead). With `copy_stream`, on the side-stream learner's
/// cadence (it never waits for the device).
fn ceiling(
    net: Net,
    b: usize,
    device: Device,
    seconds: f64,
    busy_neighbour: bool,
    copy_stream: bool,
    plan: &CpuPlan,
) -> f64 {
    let control = Arc::new(Control::default());
    let neighbour = busy_neighbour.then(|| {
        let (control, plan) = (Arc::clone(&control), plan.clone());
        std::thread::spawn(move || {
            host::enter(&plan, Role::Actor);
            let params = random_params(net);
            run_one_actor(net, 0, &params, &mut Discard(Arc::default()), &control);
        })
    });
    let rate = on(plan, Role::Learner(0), "learner", move || {
        ceiling_loop(net, b, device, seconds, copy_stream)
    });
    control.stop.store(true, Ordering::Relaxed);
    if let Some(h) = neighbour {
        h.join().unwrap();
    }
    rate
}

fn ceiling_loop(net: Net, b: usize, device: Device, seconds: f64, copy_stream: bool) -> f64 {
    let env = net.env();
    let mut dqn = Dqn::new(net.network(), DqnConfig::default(), device, 0);
    let batch = millrace_core::ceiling::random_batch(&env.obs, env.num_actions, b, device);
    // At least 20 updates, however slow one is (the Nature CNN at batch 512 on a CPU).
    let cadence = common::learner_cadence(&env.obs, b, device, copy_stream);
    millrace_core::ceiling::updates_per_s(&mut dqn, &batch, device, seconds, 20, cadence)
}

/// Inserts into replay, blocking under its rate limiter.
struct ReplaySink(Arc<Table>);

impl ActorSink for ReplaySink {
    fn transitions(&mut self, batch: &mut TransitionBatch) -> Result<(), SinkClosed> {
        self.0.insert(batch).map_err(|_| SinkClosed)
    }
    fn episode(&mut self, _: EpisodeStats) {}
}

/// Puts batches straight into replay, outside the rate limiter, until it is full (the
/// first eviction: shards fill in turn, so replay then holds all but about one batch
/// per shard).
struct RestoreSink {
    table: Arc<Table>,
    batches: usize,
    stop: Arc<Control>,
    capacity: usize,
}

impl ActorSink for RestoreSink {
    fn transitions(&mut self, batch: &mut TransitionBatch) -> Result<(), SinkClosed> {
        let before = self.table.len();
        self.table
            .restore(self.batches, batch)
            .map_err(|_| SinkClosed)?;
        self.batches += 1;
        // Full once batches start being evicted (shards hold whole batches, so this
        // can be a batch short of the capacity).
        if self.table.len() < before + batch.len() || self.table.len() >= self.capacity {
            self.stop.stop.store(true, Ordering::Relaxed);
        }
        Ok(())
    }
    fn episode(&mut self, _: EpisodeStats) {}
}

/// Counts and drops.
struct Discard(Arc<AtomicU64>);

impl ActorSink for Discard {
    fn transitions(&mut self, batch: &mut TransitionBatch) -> Result<(), SinkClosed> {
        self.0.fetch_add(batch.len() as u64, Ordering::Relaxed);
        Ok(())
    }
    fn episode(&mut self, _: EpisodeStats) {}
}

fn actor_config(net: Net, id: u32) -> ActorConfig {
    ActorConfig {
        actor_id: id,
        env: EnvConfig::new(net.env().id),
        num_envs: ENVS,
        seed: 7,
        n_step: N_STEP,
        gamma: 0.99,
        batch_rows: net.actor_batch(),
        epsilon: EpsilonSchedule::Constant(0.1),
        env_epsilons: None,
        clip_rewards: false,
        initial_priorities: false,
        value_bounds: millrace_proto::ValueBounds::FINITE,
    }
}

/// Runs one actor of `net` on this thread until `control` stops it.
fn run_one_actor(
    net: Net,
    id: u32,
    params: &Arc<ParamsCell>,
    sink: &mut dyn ActorSink,
    control: &Control,
) {
    let cfg = actor_config(net, id);
    let mut source = Arc::clone(params);
    let result = run_actor(
        &cfg,
        &net.network(),
        &mut source,
        sink,
        &control.steps,
        &control.stop,
    );
    result.expect("actor runs");
}

fn random_params(net: Net) -> Arc<ParamsCell> {
    let dqn = Dqn::new(net.network(), DqnConfig::default(), Device::Cpu, 1);
    Arc::new(ParamsCell::new(Params {
        version: 1,
        env_steps: 0,
        updates: 0,
        population: 1,
        data: dqn.online_params(),
    }))
}

/// (d) env steps/s of one actor thread alone, with inference on, on the actors' CPUs.
fn actor_steps(net: Net, seconds: f64, plan: &CpuPlan) -> f64 {
    let params = random_params(net);
    let count = Arc::new(AtomicU64::new(0));
    let control = Arc::new(Control::default());
    let handle = {
        let (count, control, plan) = (Arc::clone(&count), Arc::clone(&control), plan.clone());
        std::thread::spawn(move || {
            host::enter(&plan, Role::Actor);
            run_one_actor(net, 0, &params, &mut Discard(count), &control);
        })
    };
    std::thread::sleep(Duration::from_secs_f64(seconds * 0.2));
    let s0 = control.steps.get();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    let steps = control.steps.get() - s0;
    let dt = t0.elapsed().as_secs_f64();
    control.stop.store(true, Ordering::Relaxed);
    handle.join().unwrap();
    steps as f64 / dt
}

struct EndToEnd {
    /// The window measured, seconds.
    window_s: f64,
    updates_per_s: f64,
    /// The actors' total env steps/s in the window.
    steps_per_s: f64,
    /// The most transitions admitted between two samples in the window.
    burst: u64,
    /// Cores' worth of CPU per kind of thread in the window.
    cpu: BTreeMap<String, f64>,
    duty: f64,
    wait: f64,
    h2d: f64,
    publish: f64,
    /// The learner thread's time handing TD errors to replay.
    priorities: f64,
    metrics: f64,
    inserts_per_s: f64,
    bytes_per_obs_byte: f64,
    checkpoint: Option<CheckpointCost>,
}

/// The counters at one report of (b).
struct Mark {
    at: Instant,
    report: update_loop::LearnerReport,
    inserted: u64,
    steps: u64,
    threads: threads::Snapshot,
}

/// The per-thread CPU table's columns, from thread names.
fn thread_kind(name: &str) -> String {
    let kind = if name.starts_with("actor") {
        "actors"
    } else if name == "learner" {
        "learner"
    } else if name.starts_with("pt_autograd") {
        "autograd"
    } else if name == "prefetch" {
        "sampler"
    } else if name == "publish" {
        "publisher"
    } else if name == "checkpoint" {
        "writer"
    } else if name == "priorities" {
        "priorities"
    } else {
        "other"
    };
    kind.into()
}

/// What periodic checkpoints cost during (b).
struct CheckpointCost {
    written: u64,
    /// The writer thread's time for the last one (model and replay).
    write_s: f64,
    /// The learner thread's longest single hand-over.
    stall_max_s: f64,
    /// The learner thread's time in checkpoint hand-overs, as a fraction of its time.
    stall_frac: f64,
    replay_items: usize,
    replay_bytes: f64,
}

fn table(net: Net, batch: usize, prioritized: bool) -> Arc<Table> {
    let env = net.env();
    Arc::new(
        Table::new(&ReplayConfig {
            capacity: net.capacity(),
            shards: 4,
            obs_row_bytes: env.obs.row_bytes(),
            // CatchPixels' actors send frame streams (each frame once).
            stack: env.frame_stack,
            obs_rows_per_item: if env.frame_stack > 1 {
                ReplayConfig::FRAMES_PER_ITEM
            } else {
                ReplayConfig::obs_rows_for(ENVS, N_STEP, net.actor_batch())
            },
            limiter: RateLimiterConfig::sample_to_insert_ratio(
                SPI,
                1000,
                // The learner binary's default (--samples-per-insert-tolerance 2048), widened
                // as it is to hold two sampled batches and one actor batch.
                2048f64
                    .max(2.0 * (SPI + batch as f64))
                    .max(SPI * net.actor_batch() as f64),
                batch as u64,
            )
            .unwrap(),
            priority: prioritized.then_some(PriorityConfig {
                alpha: 0.6,
                beta: 0.4,
            }),
        })
        .unwrap(),
    )
}

/// (b) the learner thread of a real run, fed by actor threads through replay.
#[allow(clippy::too_many_arguments)] // a benchmark's knobs, each set by one flag
fn end_to_end(
    net: Net,
    b: usize,
    device: Device,
    window: f64,
    actors: usize,
    copy_stream: bool,
    checkpoint_every: Option<f64>,
    prefill: bool,
    (prioritized, apply, publish_every): (bool, Apply, u64),
    plan: &CpuPlan,
) -> EndToEnd {
    let env = net.env();
    let table = table(net, b, prioritized);
    let dqn = Dqn::new(net.network(), DqnConfig::default(), device, 0);
    let params = Arc::new(ParamsCell::new(Params {
        version: 0,
        env_steps: 0,
        updates: 0,
        population: 1,
        data: dqn.online_params(),
    }));
    let control = Arc::new(Control::default());
    // This thread is on the service CPUs (main): the sampler and publisher inherit that.
    let actor_threads: Vec<_> = (0..actors as u32)
        .map(|id| {
            let (table, params, control, plan) = (
                Arc::clone(&table),
                Arc::clone(&params),
                Arc::clone(&control),
                plan.clone(),
            );
            std::thread::Builder::new()
                .name(format!("actor-{id}"))
                .spawn(move || {
                    host::enter(&plan, Role::Actor);
                    run_one_actor(net, id, &params, &mut ReplaySink(table), &control);
                })
                .unwrap()
        })
        .collect();
    let pin_for = matches!(device, Device::Cuda(_)).then_some(device);
    let sampler = SamplerConfig {
        depth: millrace_core::prefetch::default_depth(&env.obs, b, pin_for.is_some()),
        seed: 0,
        fail_after: None,
    };
    let prefetcher = match (copy_stream, device) {
        (true, Device::Cuda(i)) => {
            let stream = CopyStream::new(i).expect("--copy-stream needs CUDA");
            Prefetcher::spawn_on_copy_stream(
                Arc::clone(&table),
                &env.obs,
                b,
                device,
                &stream,
                sampler,
            )
            .unwrap()
        }
        (true, _) => panic!("--copy-stream needs a CUDA device"),
        (false, _) => Prefetcher::spawn(Arc::clone(&table), &env.obs, b, pin_for, sampler).unwrap(),
    };
    // Checkpoints measure a full replay: fill it first, outside the rate limiter (which
    // would hold actors back long before), with real actor batches.
    if prefill {
        let filler = Arc::new(Control::default());
        let mut sink = RestoreSink {
            table: Arc::clone(&table),
            batches: 0,
            stop: Arc::clone(&filler),
            capacity: net.capacity(),
        };
        run_one_actor(net, 99, &params, &mut sink, &filler);
    }
    let (cmd_tx, cmd_rx) = crossbeam_channel::bounded(1);
    let (rep_tx, rep_rx) = crossbeam_channel::bounded(64);
    let publisher = Publisher::spawn(Arc::clone(&params), device).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Arc::new(CheckpointContext {
        layout: Layout::new(dir.path()),
        env: env.clone(),
        network: net.network(),
        seed: 0,
        table: Arc::clone(&table),
        last_eval: Mutex::new(None),
    });
    let writer = Arc::new(CheckpointWriter::spawn(ckpt).unwrap());
    let learner = {
        let writer = Arc::clone(&writer);
        let parts = LearnerParts {
            dqn,
            prefetcher,
            publisher,
            steps: Arc::new(StepCounter::default()),
            footprint: Footprint {
                device: match device {
                    Device::Cuda(i) => DeviceChoice::Cuda(i),
                    _ => DeviceChoice::Cpu,
                },
                params_bytes: 0,
                batch_bytes: 0,
                staging_bytes: 0,
                replay_bytes: 0,
                batch_size: b,
            },
            feedback: Some({
                let beta = BetaSchedule {
                    start: 0.4,
                    end: 0.4,
                    steps: 0,
                };
                // Started here, on the service CPUs, as the learner starts it.
                let fb = PriorityFeedback::new(
                    Arc::clone(&table),
                    prioritized.then_some(beta),
                    FEEDBACK_EVERY,
                    device,
                    0,
                    millrace_core::poison::td_bound(
                        millrace_proto::bounds::DEFAULT_MAX_ABS_REWARD,
                        0.99,
                        b,
                    ),
                );
                match apply {
                    Apply::Inline => fb,
                    Apply::Thread => fb.on_own_thread().unwrap(),
                }
            }),
            panic_after: None,
            oom: None,
            alive: Default::default(),
        };
        let plan = plan.clone();
        std::thread::Builder::new()
            .name("learner".into())
            .spawn(move || {
                host::enter(&plan, Role::Learner(0));
                tch::set_num_threads(1);
                let cfg = LoopConfig {
                    publish_every,
                    report_every: Duration::from_millis(100),
                    checkpoint_every: checkpoint_every.map(Duration::from_secs_f64),
                    max_nonfinite: u64::MAX,
                    copy_stream,
                };
                update_loop::run(parts, &cfg, &cmd_rx, &rep_tx, &*writer)
            })
            .unwrap()
    };
    // Steady state: the window opens at the first report `warmup` after learning
    // started and closes at the first report `window` later.
    let warmup = Duration::from_secs_f64((window * 0.25).clamp(1.0, 10.0));
    let deadline = Instant::now() + Duration::from_secs_f64(window * 3.0 + 120.0);
    let mut learning = None;
    let mut first: Option<Mark> = None;
    let mut last: Option<Mark> = None;
    while Instant::now() < deadline {
        let Ok(r) = rep_rx.recv_timeout(Duration::from_millis(200)) else {
            continue;
        };
        if r.updates == 0 {
            continue;
        }
        let now = Instant::now();
        let since = now - *learning.get_or_insert(now);
        let mark = |report| Mark {
            at: now,
            report,
            inserted: table.stats().inserted,
            steps: control.steps.get(),
            threads: threads::Snapshot::now(),
        };
        match &first {
            None if since < warmup => {}
            None => {
                table.take_burst();
                first = Some(mark(r));
            }
            Some(f) => {
                let done = now - f.at >= Duration::from_secs_f64(window)
                    && r.updates >= f.report.updates + 20;
                last = Some(mark(r));
                if done {
                    break;
                }
            }
        }
    }
    let burst = table.stats().burst;
    let _ = cmd_tx.send(update_loop::Command::Stop {
        checkpoint: false,
        run_finished: None,
    });
    table.close();
    control.stop.store(true, Ordering::Relaxed);
    let outcome = learner.join().unwrap();
    assert!(outcome.error.is_none(), "{:?}", outcome.error);
    for a in actor_threads {
        a.join().unwrap();
    }
    let written = Arc::try_unwrap(writer)
        .map_err(|_| ())
        .and_then(|w| w.finish().map_err(|_| ()));
    let (f, l) = (
        first.expect("learning started"),
        last.expect("two reports in the window"),
    );
    let dt = (l.at - f.at).as_secs_f64();
    let d = |a: f64, b: f64| (a - b) / (l.report.stalls.total - f.report.stalls.total).max(1e-9);
    let (ls, fs) = (l.report.stalls, f.report.stalls);
    let stats = table.stats();
    let checkpoint = match (checkpoint_every, written) {
        (Some(_), Ok(w)) => Some(CheckpointCost {
            written: w.written,
            write_s: w.last_write_s,
            stall_max_s: l.report.checkpoint_stall_max,
            stall_frac: d(ls.checkpoint, fs.checkpoint),
            replay_items: stats.size,
            replay_bytes: table.bytes_per_item() * net.capacity() as f64,
        }),
        _ => None,
    };
    EndToEnd {
        checkpoint,
        window_s: dt,
        updates_per_s: (l.report.updates - f.report.updates) as f64 / dt,
        steps_per_s: (l.steps - f.steps) as f64 / dt,
        burst,
        cpu: f.threads.cores_since(&l.threads, thread_kind),
        duty: d(ls.compute, fs.compute),
        wait: d(ls.wait_data, fs.wait_data),
        h2d: d(ls.host_to_device, fs.host_to_device),
        publish: d(ls.publish, fs.publish),
        priorities: d(ls.priorities, fs.priorities),
        metrics: d(ls.metrics, fs.metrics),
        inserts_per_s: (l.inserted - f.inserted) as f64 / dt,
        bytes_per_obs_byte: (stats.obs_rows as f64 * env.obs.row_bytes() as f64
            + stats.size as f64 * 32.0)
            / (stats.size.max(1) as f64 * env.obs.row_bytes() as f64),
    }
}

/// memcpy bandwidth for blocks of `block` bytes, in bytes/s.
fn memcpy_bw(block: usize, seconds: f64) -> f64 {
    let src = vec![1u8; 64 << 20];
    let mut dst = vec![0u8; 64 << 20];
    let blocks = src.len() / block;
    let start = Instant::now();
    let mut bytes = 0usize;
    let mut i = 0;
    while start.elapsed().as_secs_f64() < seconds {
        for _ in 0..64 {
            let o = (i % blocks) * block;
            dst[o..o + block].copy_from_slice(&src[o..o + block]);
            i += 1;
            bytes += block;
        }
    }
    std::hint::black_box(&dst);
    bytes as f64 / start.elapsed().as_secs_f64()
}

/// (c) replay insert (actor-shaped batches) and sample+collate (into a staging buffer),
/// in bytes/s of observation data moved.
fn replay_throughput(net: Net, b: usize, seconds: f64) -> (f64, f64) {
    let env = net.env();
    let rb = env.obs.row_bytes();
    // An actor's batch: ENVS interleaved streams, N_STEP rows carried per stream.
    let items = net.actor_batch();
    let rows = items + ENVS * N_STEP;
    let mut batch = TransitionBatch::with_capacity(rb, items, rows);
    for r in 0..rows {
        batch.push_obs_bytes(&vec![(r % 251) as u8; rb]);
    }
    for i in 0..items as u32 {
        batch.push_transition(i, 0, 1.0, 0.99, i + (ENVS * N_STEP) as u32);
    }
    let t = Arc::new(
        Table::new(&ReplayConfig {
            capacity: net.capacity(),
            shards: 4,
            obs_row_bytes: rb,
            stack: 1,
            obs_rows_per_item: ReplayConfig::obs_rows_for(ENVS, N_STEP, items),
            limiter: RateLimiterConfig::sample_to_insert_ratio(1e-9, 1, 1e18, 1).unwrap(),
            priority: None,
        })
        .unwrap(),
    );
    let start = Instant::now();
    let mut inserted = 0usize;
    while start.elapsed().as_secs_f64() < seconds || inserted < net.capacity() {
        batch.seq += 1;
        t.insert(&batch).unwrap();
        inserted += items;
    }
    let insert_bw = (inserted / items * rows * rb) as f64 / start.elapsed().as_secs_f64();
    let mut buf = StagingBuffer::new(&env.obs, b, None);
    let mut rng = SmallRng::seed_from_u64(0);
    let start = Instant::now();
    let mut sampled = 0usize;
    while start.elapsed().as_secs_f64() < seconds {
        buf.fill(&t, &mut rng).unwrap();
        sampled += b;
    }
    let sample_bw = (sampled * 2 * rb) as f64 / start.elapsed().as_secs_f64();
    (insert_bw, sample_bw)
}

/// 1, 2, 4, … up to `budget` (and at least 2), then `budget`, then `auto`.
fn default_counts(budget: usize) -> Vec<ActorCount> {
    let mut counts = Vec::new();
    let mut n = 1;
    while n <= budget.max(2) {
        counts.push(ActorCount::Count(n));
        n *= 2;
    }
    if !counts.contains(&ActorCount::Count(budget)) {
        counts.push(ActorCount::Count(budget));
    }
    counts.push(ActorCount::Auto);
    counts
}

/// One end-to-end row: its actor count's label, and what it measured.
struct Scaled {
    label: String,
    threads: usize,
    apply: Apply,
    publish_every: u64,
    cycle_s: f64,
    e: EndToEnd,
}

/// Everything measured for one network and batch size.
struct Row {
    net: Net,
    b: usize,
    ceiling: f64,
    ceiling_busy: f64,
    alone: f64,
    insert_bw: f64,
    sample_bw: f64,
    memcpy: f64,
    scaled: Vec<Scaled>,
    baseline: Option<f64>,
}

/// The CPU columns, in this order.
const CPU_KINDS: [&str; 8] = [
    "learner",
    "autograd",
    "sampler",
    "publisher",
    "priorities",
    "writer",
    "actors",
    "other",
];

fn main() {
    let o = parse();
    tch::set_num_threads(1);
    common::gpu_math(o.device, o.tf32);
    let machine = host::machine();
    let plan = if o.cpu_plan {
        millrace_learner::cpu_plan::plan(&machine, 1)
    } else {
        CpuPlan::off(&machine, "--cpu-plan off: nothing pinned")
    };
    println!("{plan}");
    // This thread, and what it starts without pinning itself, on the service CPUs.
    host::enter(&plan, Role::Service);
    let counts = o
        .actors
        .clone()
        .unwrap_or_else(|| default_counts(plan.actor_budget()));
    println!(
        "device {:?}{}; {} replay, TD errors back every {FEEDBACK_EVERY} updates; {ENVS} envs per actor thread, 1 intra-op thread; (a), (c), (d) {} s each; end-to-end windows of at least {} s, four admission cycles where longer, at most {} s",
        o.device,
        if o.copy_stream { " (copies on a side stream)" } else { "" },
        if o.prioritized { "prioritized" } else { "uniform" },
        o.seconds,
        o.seconds,
        o.max_window,
    );
    let mut rows = Vec::new();
    for &net in &o.nets {
        let alone = actor_steps(net, o.seconds, &plan);
        let row_bytes = net.env().obs.row_bytes();
        let memcpy = memcpy_bw(row_bytes.max(64), o.seconds.min(2.0));
        for &b in &o.batches {
            let a = ceiling(net, b, o.device, o.seconds, false, o.copy_stream, &plan);
            let a_busy = ceiling(net, b, o.device, o.seconds, true, o.copy_stream, &plan);
            // An admission cycle: the learner consuming one actor batch at its ceiling.
            let cycle_s = net.actor_batch() as f64 * SPI / (a * b as f64);
            let window = (4.0 * cycle_s).max(o.seconds).min(o.max_window);
            let prefill = o.checkpoint_every.is_some();
            let mut scaled = Vec::new();
            let settings = o
                .priorities
                .iter()
                .flat_map(|&p| o.publish_every.iter().map(move |&every| (p, every)));
            for (&count, (apply, publish_every)) in counts
                .iter()
                .flat_map(|c| settings.clone().map(move |s| (c, s)))
            {
                let (label, threads) = match count {
                    ActorCount::Count(n) => (n.to_string(), n),
                    ActorCount::Auto => {
                        let c = AutoChoice::new(a, b, SPI, alone, plan.actor_budget());
                        (format!("auto ({})", c.threads), c.threads)
                    }
                };
                let e = end_to_end(
                    net,
                    b,
                    o.device,
                    window,
                    threads,
                    o.copy_stream,
                    o.checkpoint_every,
                    prefill,
                    (o.prioritized, apply, publish_every),
                    &plan,
                );
                println!(
                    "{} b{b} actors {label}, TD errors applied {}, publish every {publish_every}: ceiling {a:.1}/s ({a_busy:.1}/s with the actors' CPUs busy), end-to-end {:.1}/s in {:.1} s, actors {:.0} env steps/s, {:.1} inserts/s, burst {}, duty {:.1}%, wait {:.1}%, priorities {:.2}%",
                    net.name(),
                    apply.name(),
                    e.updates_per_s,
                    e.window_s,
                    e.steps_per_s,
                    e.inserts_per_s,
                    e.burst,
                    100.0 * e.duty,
                    100.0 * e.wait,
                    100.0 * e.priorities,
                );
                scaled.push(Scaled {
                    label,
                    threads,
                    apply,
                    publish_every,
                    cycle_s,
                    e,
                });
            }
            // With checkpoints, the same run without them (first actor count), for
            // what they cost.
            let baseline = o.checkpoint_every.map(|_| {
                end_to_end(
                    net,
                    b,
                    o.device,
                    window,
                    scaled[0].threads,
                    o.copy_stream,
                    None,
                    true,
                    (o.prioritized, scaled[0].apply, scaled[0].publish_every),
                    &plan,
                )
                .updates_per_s
            });
            let (insert_bw, sample_bw) = replay_throughput(net, b, o.seconds.min(2.0));
            rows.push(Row {
                net,
                b,
                ceiling: a,
                ceiling_busy: a_busy,
                alone,
                insert_bw,
                sample_bw,
                memcpy,
                scaled,
                baseline,
            });
        }
    }
    println!();
    println!(
        "| network | batch | (a) ceiling upd/s | ceiling, actors' CPUs busy | (c) insert / memcpy | sample+collate / memcpy | replay bytes per obs byte | (d) one actor alone, env steps/s |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.2} | {:.2} | {:.3} | {:.0} |",
            r.net.name(),
            r.b,
            r.ceiling,
            r.ceiling_busy,
            r.insert_bw / r.memcpy,
            r.sample_bw / r.memcpy,
            r.scaled[0].e.bytes_per_obs_byte,
            r.alone,
        );
    }
    println!();
    println!(
        "| network | batch | actor threads | TD errors applied | publish every | window s (admission cycles) | (b) end-to-end upd/s | b/a | actors' env steps/s | × one actor alone | transitions inserted/s | most admitted between two samples | duty | wait data | h2d | publish | priorities | metrics | CPU cores: {} |",
        CPU_KINDS.join(" / ")
    );
    println!(
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    );
    for r in &rows {
        for s in &r.scaled {
            let e = &s.e;
            let cpu: Vec<String> = CPU_KINDS
                .iter()
                .map(|k| format!("{:.2}", e.cpu.get(*k).copied().unwrap_or(0.0)))
                .collect();
            println!(
                "| {} | {} | {} | {} | {} | {:.1} ({:.1}) | {:.1} | **{:.2}** | {:.0} | {:.2} | {:.1} | {} | {:.1}% | {:.1}% | {:.1}% | {:.1}% | {:.2}% | {:.1}% | {} |",
                r.net.name(),
                r.b,
                s.label,
                s.apply.name(),
                s.publish_every,
                e.window_s,
                e.window_s / s.cycle_s,
                e.updates_per_s,
                e.updates_per_s / r.ceiling,
                e.steps_per_s,
                e.steps_per_s / r.alone,
                e.inserts_per_s,
                e.burst,
                100.0 * e.duty,
                100.0 * e.wait,
                100.0 * e.h2d,
                100.0 * e.publish,
                100.0 * e.priorities,
                100.0 * e.metrics,
                cpu.join(" / "),
            );
        }
    }
    if o.checkpoint_every.is_some() {
        println!();
        println!(
            "| network | batch | replay (items, MiB) | checkpoints written | writer s per checkpoint | learner stall, longest (ms) | learner time in checkpoints | end-to-end upd/s with checkpoints | without |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for r in &rows {
            if let Some(c) = &r.scaled[0].e.checkpoint {
                println!(
                    "| {} | {} | {}, {:.0} | {} | {:.2} | {:.2} | {:.3}% | {:.1} | {:.1} |",
                    r.net.name(),
                    r.b,
                    c.replay_items,
                    c.replay_bytes / f64::from(1u32 << 20),
                    c.written,
                    c.write_s,
                    1e3 * c.stall_max_s,
                    100.0 * c.stall_frac,
                    r.scaled[0].e.updates_per_s,
                    r.baseline.unwrap_or(f64::NAN),
                );
            }
        }
    }
}
