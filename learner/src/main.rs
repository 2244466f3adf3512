//! `learner`: trains a DQN agent. Without a learner address to listen on, it runs the
//! embedded mode: actors as threads in this process.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use millrace_actor::EpsilonSchedule;
use millrace_learner::dqn::{DqnConfig, TargetUpdate};
use millrace_learner::{ReplayOptions, StopReason, TrainConfig};
use tch::Device;

/// Train a DQN agent with asynchronous actors (embedded mode: one process).
///
/// Defaults solve CartPole-v1 (100 greedy episodes averaging >= 475) in a few seconds
/// on two CPU cores. Exit status: 0 when the target return is reached, 2 when
/// --max-steps ends the run first, 130 when interrupted, 1 on errors.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    /// Gymnasium environment id: CartPole-v1, Acrobot-v1 or MountainCar-v0.
    #[arg(long, default_value = "CartPole-v1")]
    env: String,

    /// Actor threads in this process, each stepping --envs-per-actor environments with
    /// batched inference. Default: 1, or 0 with --listen (remote actors only).
    #[arg(long)]
    actors: Option<usize>,

    /// Serve remote actors (`actor --learner HOST:PORT`) on this address; `--listen`
    /// alone means 127.0.0.1:7787. Any address but loopback needs a token.
    #[arg(long, num_args = 0..=1, default_missing_value = "127.0.0.1:7787")]
    listen: Option<std::net::SocketAddr>,

    /// File holding the token remote actors must present (else MILLRACE_TOKEN).
    #[arg(long)]
    token_file: Option<PathBuf>,

    /// Remote actors explore with Ape-X's fixed per-slot ε (0.4^(1+7i/(N-1))) instead
    /// of following the run's decaying schedule (--eps-*) on the global env steps.
    #[arg(long, requires = "listen")]
    apex_epsilon: bool,

    /// Environments per actor. 8 keeps the inference batch useful without making
    /// transitions stale.
    #[arg(long, default_value_t = 8)]
    envs_per_actor: usize,

    /// Transitions per batch an actor sends to replay (at least --envs-per-actor).
    /// Larger batches duplicate fewer observation rows (each batch carries up to
    /// n-step rows per environment over from the last), at the cost of latency.
    #[arg(long, default_value_t = 16)]
    actor_batch: usize,

    /// Seed for networks, environments, exploration and sampling.
    #[arg(long, default_value_t = 0)]
    seed: u64,

    /// CUDA device index. Default: GPU 0 when CUDA is available, else the CPU.
    #[arg(long)]
    gpu: Option<usize>,

    /// Force the CPU even when a GPU is available.
    #[arg(long, conflicts_with = "gpu")]
    cpu: bool,

    /// Copy batches to the GPU on a side CUDA stream, overlapping the next copy with
    /// the current update. Experimental: not yet run on a GPU (without it, copies are
    /// non-blocking but queued behind the update on the default stream).
    #[arg(long, conflicts_with = "cpu")]
    copy_stream: bool,

    /// Stop after this many environment steps if the target is not reached.
    #[arg(long, default_value_t = 200_000)]
    max_steps: u64,

    /// Stop when a greedy evaluation's mean return reaches this. Default: the
    /// environment's Gymnasium reward threshold (475 for CartPole-v1).
    #[arg(long)]
    target_return: Option<f32>,

    /// Directory for TensorBoard event files and the checkpoint.
    #[arg(long, default_value = "runs/millrace")]
    logdir: PathBuf,

    /// Continue from a checkpoint directory (e.g. runs/millrace/checkpoint).
    #[arg(long)]
    resume: Option<PathBuf>,

    /// Hidden layer sizes. 128x128 is large enough to represent a stable balancing policy
    /// and small enough that an update costs well under a millisecond on one core.
    #[arg(long, value_delimiter = ',', default_value = "128,128")]
    hidden: Vec<usize>,

    /// Adam learning rate. High for DQN, as in rl-zoo3's CartPole setting (2.3e-3), since
    /// the Q-targets are small and the run is short.
    #[arg(long, default_value_t = 2.3e-3)]
    lr: f64,

    /// Minibatch size.
    #[arg(long, default_value_t = 64)]
    batch_size: usize,

    /// Discount factor.
    #[arg(long, default_value_t = 0.99)]
    gamma: f32,

    /// n-step returns: 3 propagates reward faster than 1 at little bias (Rainbow, Ape-X).
    #[arg(long, default_value_t = 3)]
    n_step: usize,

    /// Hard target-network sync period in updates (ignored with --tau).
    #[arg(long, default_value_t = 200)]
    target_period: u64,

    /// Polyak averaging coefficient per update, instead of hard syncs.
    #[arg(long)]
    tau: Option<f64>,

    /// Gradient L2-norm clip.
    #[arg(long, default_value_t = 10.0)]
    max_grad_norm: f64,

    /// Replay ratio as items sampled per item inserted. 32 with batch 64 is one update
    /// per two env steps, rl-zoo3's CartPole ratio (128 gradient steps per 256 steps).
    #[arg(long, default_value_t = 32.0)]
    samples_per_insert: f64,

    /// How far, in sampled items, the replay ratio may drift before the faster side
    /// blocks (at least two batches plus one insert's worth is enforced).
    #[arg(long, default_value_t = 2048.0)]
    samples_per_insert_tolerance: f64,

    /// Transitions collected before learning starts.
    #[arg(long, default_value_t = 1000)]
    learning_starts: u64,

    /// Replay capacity in transitions.
    #[arg(long, default_value_t = 100_000)]
    replay_capacity: usize,

    /// Replay shards (independent locks for concurrent actor inserts).
    #[arg(long, default_value_t = 4)]
    replay_shards: usize,

    /// Initial exploration rate.
    #[arg(long, default_value_t = 1.0)]
    eps_start: f32,

    /// Final exploration rate (rl-zoo3 CartPole: 0.04).
    #[arg(long, default_value_t = 0.04)]
    eps_end: f32,

    /// Env steps over which exploration decays linearly (rl-zoo3 CartPole: 0.16 x 50k).
    #[arg(long, default_value_t = 8_000)]
    eps_decay_steps: u64,

    /// Publish parameters to actors every this many updates.
    #[arg(long, default_value_t = 20)]
    publish_every: u64,

    /// Greedy evaluation every this many env steps.
    #[arg(long, default_value_t = 2_000)]
    eval_every: u64,

    /// Episodes per greedy evaluation (Gymnasium's CartPole criterion uses 100).
    #[arg(long, default_value_t = 100)]
    eval_episodes: usize,

    /// Also checkpoint every this many seconds (a final checkpoint is always written).
    #[arg(long)]
    checkpoint_every_s: Option<u64>,

    /// No progress bar (it is also hidden when stderr is not a terminal).
    #[arg(long)]
    no_progress: bool,
}

fn positive(name: &str, value: f64) -> anyhow::Result<()> {
    if !(value.is_finite() && value > 0.0) {
        bail!("--{name} must be a positive number, got {value}");
    }
    Ok(())
}

/// Checks flags and turns them into the typed configuration.
fn config(args: Args, bar: Option<ProgressBar>) -> anyhow::Result<TrainConfig> {
    let spec = millrace_actor::env::spec(&args.env)?;
    for (name, v) in [
        ("lr", args.lr),
        ("max-grad-norm", args.max_grad_norm),
        ("samples-per-insert", args.samples_per_insert),
    ] {
        positive(name, v)?;
    }
    let actors = args
        .actors
        .unwrap_or(if args.listen.is_some() { 0 } else { 1 });
    if actors == 0 && args.listen.is_none() {
        bail!("--actors 0 needs --listen (remote actors), or nothing would ever act");
    }
    let server = match args.listen {
        Some(addr) => {
            let token = millrace_actor::remote::read_token(args.token_file.as_deref())
                .context("--token-file")?;
            if token.is_none() && !addr.ip().is_loopback() {
                bail!("--listen {addr}: binding beyond loopback needs a token (--token-file or MILLRACE_TOKEN)");
            }
            let mut scfg = millrace_learner::server::ServerConfig::new(addr);
            scfg.token = token;
            scfg.apex_epsilon = args.apex_epsilon;
            Some(scfg)
        }
        None => None,
    };
    for (name, v) in [
        ("envs-per-actor", args.envs_per_actor),
        ("actor-batch", args.actor_batch),
        ("batch-size", args.batch_size),
        ("n-step", args.n_step),
        ("replay-capacity", args.replay_capacity),
        ("replay-shards", args.replay_shards),
        ("eval-episodes", args.eval_episodes),
    ] {
        if v == 0 {
            bail!("--{name} must be at least 1");
        }
    }
    // An actor's batch (up to --actor-batch plus a flush of n-step rows per env) must
    // fit a replay shard with room to spare, or replay could hold only that batch.
    let per_shard = args.replay_capacity.div_ceil(args.replay_shards);
    let largest_batch =
        args.actor_batch.max(args.envs_per_actor) + args.envs_per_actor * args.n_step;
    if 2 * largest_batch > per_shard {
        bail!(
            "--replay-capacity {} over --replay-shards {} leaves {per_shard} transitions per shard, \
             too few for actor batches of up to {largest_batch} (--actor-batch, --envs-per-actor, --n-step)",
            args.replay_capacity,
            args.replay_shards
        );
    }
    if args.hidden.is_empty() || args.hidden.contains(&0) {
        bail!("--hidden needs positive layer sizes, e.g. 128,128");
    }
    if !(0.0..=1.0).contains(&args.gamma) {
        bail!("--gamma must be in [0, 1], got {}", args.gamma);
    }
    for (name, v) in [("eps-start", args.eps_start), ("eps-end", args.eps_end)] {
        if !(0.0..=1.0).contains(&v) {
            bail!("--{name} must be in [0, 1], got {v}");
        }
    }
    if args.target_period == 0 || args.eval_every == 0 || args.publish_every == 0 {
        bail!("--target-period, --eval-every and --publish-every must be at least 1");
    }
    let target = match args.tau {
        Some(tau) if !(tau > 0.0 && tau <= 1.0) => bail!("--tau must be in (0, 1], got {tau}"),
        Some(tau) => TargetUpdate::Polyak { tau },
        None => TargetUpdate::Hard {
            period: args.target_period,
        },
    };
    if args.learning_starts < args.batch_size as u64 {
        bail!(
            "--learning-starts ({}) must be at least --batch-size ({})",
            args.learning_starts,
            args.batch_size
        );
    }
    if args.replay_capacity < args.learning_starts as usize {
        bail!("--replay-capacity must hold at least --learning-starts transitions");
    }
    let device = match (args.cpu, args.gpu) {
        (true, _) => Device::Cpu,
        (false, Some(i)) => {
            if !tch::Cuda::is_available() {
                bail!(
                    "--gpu {i}: CUDA is not available on this machine (drop --gpu to use the CPU)"
                );
            }
            let n = tch::Cuda::device_count() as usize;
            if i >= n {
                bail!("--gpu {i}: this machine has {n} CUDA device(s)");
            }
            Device::Cuda(i)
        }
        (false, None) => Device::cuda_if_available(),
    };
    if let Some(path) = &args.resume {
        if !path.exists() {
            bail!("--resume {}: no such checkpoint", path.display());
        }
    }
    Ok(TrainConfig {
        target_return: args.target_return.or(spec.reward_threshold),
        env_id: args.env,
        seed: args.seed,
        device,
        hidden: args.hidden,
        dqn: DqnConfig {
            lr: args.lr,
            max_grad_norm: args.max_grad_norm,
            target,
            ..DqnConfig::default()
        },
        batch_size: args.batch_size,
        replay: ReplayOptions {
            capacity: args.replay_capacity,
            shards: args.replay_shards,
            samples_per_insert: args.samples_per_insert,
            tolerance: args.samples_per_insert_tolerance,
            learning_starts: args.learning_starts,
        },
        actors,
        envs_per_actor: args.envs_per_actor,
        actor_batch: args.actor_batch,
        copy_stream: args.copy_stream,
        n_step: args.n_step,
        gamma: args.gamma,
        epsilon: EpsilonSchedule::Linear {
            start: args.eps_start,
            end: args.eps_end,
            steps: args.eps_decay_steps,
        },
        publish_every: args.publish_every,
        eval_every: args.eval_every,
        eval_episodes: args.eval_episodes,
        max_steps: args.max_steps,
        logdir: args.logdir,
        checkpoint_every: args.checkpoint_every_s.map(Duration::from_secs),
        resume: args.resume,
        progress: bar,
        server,
    })
}

/// Log output that shares the terminal with the progress bar.
#[derive(Clone)]
struct LogWriter(Option<ProgressBar>);

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match &self.0 {
            Some(bar) => bar.suspend(|| std::io::stderr().write_all(buf))?,
            None => std::io::stderr().write_all(buf)?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

fn run(args: Args) -> anyhow::Result<ExitCode> {
    let show_bar = !args.no_progress && std::io::stderr().is_terminal();
    let bar = show_bar.then(|| {
        let bar = ProgressBar::with_draw_target(Some(args.max_steps), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} steps  {msg}")
                .expect("static template")
                .progress_chars("=> "),
        );
        bar
    });
    let writer = LogWriter(bar.clone());
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(move || writer.clone())
        .init();

    let cfg = config(args, bar)?;
    let interrupt = Arc::new(AtomicBool::new(false));
    {
        let interrupt = Arc::clone(&interrupt);
        // The first signal stops the run cleanly (checkpoint included); a second one
        // exits at once.
        ctrlc::set_handler(move || {
            if interrupt.swap(true, Ordering::Relaxed) {
                std::process::exit(130);
            }
        })
        .context("installing the Ctrl-C/SIGTERM handler")?;
    }
    tracing::info!(
        "training {} on {:?} (CUDA available: {}, {} device(s)): {} actor(s) x {} envs, network {:?}",
        cfg.env_id,
        cfg.device,
        tch::Cuda::is_available(),
        tch::Cuda::device_count(),
        cfg.actors,
        cfg.envs_per_actor,
        cfg.hidden
    );
    let summary = millrace_learner::train(&cfg, interrupt)?;
    let s = &summary;
    let fmt_opt = |v: Option<f32>| v.map_or("n/a".to_string(), |v| format!("{v:.1}"));
    println!("run summary ({})", cfg.env_id);
    println!(
        "  result:          {}",
        match s.reason {
            StopReason::Solved => format!(
                "solved at {} env steps (target {})",
                s.solved_at_steps.unwrap_or(s.env_steps),
                fmt_opt(cfg.target_return)
            ),
            StopReason::MaxSteps =>
                format!("target not reached within {} env steps", cfg.max_steps),
            StopReason::Interrupted => "interrupted".to_string(),
        }
    );
    let per_s = |n: u64| n as f64 / s.wall_s.max(1e-9);
    println!("  wall time:       {:.2} s", s.wall_s);
    println!(
        "  env steps:       {} ({:.0}/s)",
        s.env_steps,
        per_s(s.env_steps)
    );
    println!(
        "  updates:         {} ({:.0}/s over the learner thread's {:.2} s)",
        s.updates,
        s.updates as f64 / s.stalls.total.max(1e-9),
        s.stalls.total
    );
    println!(
        "  throughput:      {:.0} samples/s, {:.0} inserts/s",
        per_s(s.replay.sampled),
        per_s(s.replay.inserted)
    );
    println!("  episodes:        {}", s.episodes);
    println!(
        "  eval return:     {}",
        s.last_eval.map_or("n/a".into(), |(steps, mean)| format!(
            "{mean:.1} (100 greedy episodes at {steps} steps)"
        ))
    );
    println!(
        "  train return:    {} (last 100 episodes)",
        fmt_opt(s.train_return_100)
    );
    println!(
        "  learner time:    {:.1}% update compute (duty cycle), {:.1}% waiting for data, {:.1}% host-to-device, {:.1}% publishing, {:.1}% metrics, {:.1}% checkpointing",
        100.0 * s.stalls.duty_cycle(),
        100.0 * s.stalls.wait_data / s.stalls.total.max(1e-9),
        100.0 * s.stalls.host_to_device / s.stalls.total.max(1e-9),
        100.0 * s.stalls.publish / s.stalls.total.max(1e-9),
        100.0 * s.stalls.metrics / s.stalls.total.max(1e-9),
        100.0 * s.stalls.checkpoint / s.stalls.total.max(1e-9),
    );
    let r = &s.replay;
    println!(
        "  replay:          {} transitions, {:.3} observation rows each ({:.0} bytes allocated per transition, {:.3}x one observation)",
        r.size,
        r.obs_rows as f64 / r.size.max(1) as f64,
        s.replay_bytes_per_item,
        s.replay_bytes_per_item / s.obs_row_bytes.max(1) as f64,
    );
    println!(
        "  replay ratio:    {:.1} samples per insert ({} inserted, {} sampled); blocked: actors {:.1} s, learner {:.1} s",
        r.sampled as f64 / r.inserted.max(1) as f64,
        r.inserted,
        r.sampled,
        r.insert_blocked_s,
        r.sample_blocked_s,
    );
    println!("  checkpoint:      {}", s.checkpoint.display());
    Ok(match s.reason {
        StopReason::Solved => ExitCode::SUCCESS,
        StopReason::MaxSteps => ExitCode::from(2),
        StopReason::Interrupted => ExitCode::from(130),
    })
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
