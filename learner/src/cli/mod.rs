//! The `learner` command line: flags as users type them ([`Args`]), checked once into
//! the typed [`RunConfig`] (ripgrep's low-level args → high-level args). Lives in the
//! library so that tests can hold `--help` against every flag the parser knows.

mod checks;
mod logdir;

use std::path::{Path, PathBuf};

use anyhow::bail;
use clap::{Parser, Subcommand};

pub use crate::checkpoint::Which;
use crate::config::DeviceChoice;
#[cfg(doc)]
use crate::config::RunConfig;
use crate::replay_flags::ReplayFlags;
use millrace_core::dqn::network::NetworkChoice;
use millrace_core::dqn::TargetKind;

/// `--head`: what the Q-network outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HeadChoice {
    /// One Q-value per action.
    Q,
    /// Implicit quantiles of the return (IQN).
    Iqn,
}

/// Train a DQN agent with asynchronous actors (embedded mode: one process), or serve
/// remote actors with --listen. `export`, `eval` and `doctor` work on saved runs and
/// on the set-up.
///
/// Defaults solve CartPole-v1 (100 greedy episodes averaging >= 475, confirmed on 100
/// fresh episodes) in a few seconds on two CPU cores. Exit status: 0 solved, 2 the step
/// budget ran out first, 130 stopped by SIGINT/SIGTERM (a checkpoint was written), 1
/// failed (one `error:` line says why).
#[derive(Parser, Debug)]
#[command(version, about, long_about = None, args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub train: TrainArgs,
}

/// What to do besides training.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Write a saved policy as a PyTorch `nn.Sequential` state_dict (safetensors) plus a
    /// JSON description of the network and the observation preprocessing.
    Export {
        #[command(flatten)]
        policy: PolicyArgs,
        /// Output file (`.safetensors`); the JSON goes beside it with a `.json` suffix.
        #[arg(long)]
        out: PathBuf,
    },
    /// Play a saved policy greedily in millrace's own environments and print the mean
    /// return with its spread.
    Eval {
        #[command(flatten)]
        policy: PolicyArgs,
        /// Episodes to play.
        #[arg(long, default_value_t = 100)]
        episodes: usize,
        /// Seed for the episodes' start states.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Print the result as one JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// A Python package the saved run's `gym:` environment may import (its
        /// --env-module, or the `pkg` of a `gym:pkg:Env` id); repeatable. A checkpoint
        /// naming any other is refused: a file alone never decides what is imported.
        #[arg(long = "allow-env-module", value_name = "PKG")]
        allow_env_modules: Vec<String>,
    },
    /// Combine the shards of a population run as a job array (`--shard I/N --logdir
    /// LOGDIR`, each in LOGDIR/shard-I-of-N) into LOGDIR/population.csv and
    /// population.json with every agent once, print the table with each
    /// configuration's means and intervals, and make LOGDIR one TensorBoard log
    /// directory with every agent's HParams session. Exit status 0 when merged (the
    /// table says how many agents solved), 1 when a shard is missing, unfinished or was
    /// stopped (named: resubmit its task).
    Merge {
        /// The log directory the shards share.
        #[arg(long)]
        logdir: PathBuf,
    },
    /// Check libtorch, CUDA, the GPUs and pinned memory, and explain any mismatch.
    /// Exit status 0 when training can run (no GPU is a warning), 1 when broken.
    Doctor,
    /// Ask a learner's --metrics-addr whether it is ready (accepts actors), for
    /// container health checks and probes. Exit status 0 when it is, 1 otherwise.
    Health(millrace_telemetry::HealthArgs),
}

/// The saved policy `export` and `eval` read.
#[derive(clap::Args, Debug)]
pub struct PolicyArgs {
    /// A run's checkpoint directory (`<logdir>/checkpoint`), or with --agent a
    /// population's log directory.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// A population's agent (its number in population.csv): its checkpoint under the
    /// log directory --checkpoint names (`agents/agent-NNN/checkpoint`).
    #[arg(long)]
    pub agent: Option<usize>,
    /// Which saved policy: the last state, the best evaluation, or the one that solved
    /// the run. Default: solved, else best, else latest.
    #[arg(long, value_enum)]
    pub which: Option<Which>,
}

impl PolicyArgs {
    /// The checkpoint directory they name (see [`agent_checkpoint`]).
    pub fn checkpoint_dir(&self) -> anyhow::Result<PathBuf> {
        agent_checkpoint(&self.checkpoint, self.agent)
    }
}

/// Training flags (plain `learner`).
#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// Environment: a Rust port (CartPole-v1, Acrobot-v1, MountainCar-v0), an Atari
    /// game through ale-py (ALE/Pong-v5: Gymnasium's v5 convention; PongNoFrameskip-v4:
    /// the DQN papers' and SB3's), or any Gymnasium id as gym:<id>
    /// (gym:MinAtar/Breakout-v1, gym:CartPole-v1, gym:my_pkg/MyEnv-v0).
    #[arg(long, default_value = "CartPole-v1")]
    pub env: String,

    /// For gym: ids, a module to import first (`my_pkg`, or `my_pkg:register_fn` to
    /// also call its registration function). MinAtar registers by itself.
    #[arg(long)]
    pub env_module: Option<String>,

    /// For gym: ids, keyword arguments for gymnasium.make, as a JSON object.
    #[arg(long)]
    pub env_kwargs: Option<String>,

    /// Atari: a lost life ends the bootstrapping chain (as SB3's AtariWrapper and the
    /// DQN papers train); episodes and scores still run to game over.
    #[arg(long)]
    pub terminal_on_life_loss: bool,

    /// Clip training rewards to [-1, 1] (episode returns stay true scores). Default: on
    /// for Atari games, off otherwise.
    #[arg(long)]
    pub clip_rewards: Option<bool>,

    /// Q-network: auto picks the MLP for vector observations, the Nature CNN for
    /// 84x84 frames and the MinAtar CNN for 10x10 ones; impala is the IMPALA network's
    /// residual torso (Espeholt et al. 2018) for image observations of any size.
    #[arg(long, value_enum, default_value_t = NetworkChoice::Auto)]
    pub network: NetworkChoice,

    /// --network impala: its channels (16, 32, 32) times this (2 in Schmidt & Schmied
    /// 2021 and Beyond The Rainbow).
    #[arg(long, default_value_t = 1)]
    pub impala_width: usize,

    /// --network impala: an adaptive max-pool of the last stage's output to NxN where
    /// it is larger (Beyond The Rainbow's 6: Atari's 11x11 becomes 6x6); 0 for none.
    #[arg(long, default_value_t = 6)]
    pub impala_pool: usize,

    /// Actor threads in this process, each stepping --envs-per-actor environments with
    /// batched inference: a number, or `auto` (as many as the learner's consumption
    /// needs, measured for a second at start, and the CPU plan's actor CPUs allow).
    /// Default: 1, or 0 with --listen (remote actors only).
    #[arg(long)]
    pub actors: Option<crate::cpu_plan::ActorCount>,

    /// The CPU plan (printed at start, kept in config.json): `on` gives the learner
    /// thread a physical core of its own (its SMT siblings idle, not CPU 0), the
    /// sampler, publisher, priority thread, writer and server a second, and actor
    /// threads the rest, from
    /// the CPUs this process may use (its affinity mask and cgroup quota); `off` pins
    /// nothing.
    #[arg(long, value_enum, default_value_t = crate::cpu_plan::PlanChoice::On)]
    pub cpu_plan: crate::cpu_plan::PlanChoice,

    /// Serve remote actors (`actor --learner HOST:PORT`) on this address; `--listen`
    /// alone means 127.0.0.1:7787. Any address but loopback needs a token.
    #[arg(long, num_args = 0..=1, default_missing_value = "127.0.0.1:7787")]
    pub listen: Option<std::net::SocketAddr>,

    /// File holding the token remote actors must present (else MILLRACE_TOKEN).
    #[arg(long)]
    pub token_file: Option<PathBuf>,

    /// Actors explore with Ape-X's fixed per-environment ε (0.4^(1+7i/(N-1)) over the
    /// N environments of the embedded actors, or of the remote ones) instead of
    /// following the run's decaying schedule (--eps-*).
    /// (`--apex-epsilon false` turns off what `--preset apex` turned on.)
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value_t = false, action = clap::ArgAction::Set)]
    pub apex_epsilon: bool,

    /// A configuration beneath the command line (explicit flags win) and above the
    /// environment's table in learner/hyperparams.toml: `apex` (Ape-X DQN's), `classic`
    /// (small vector tasks, measured here), `minatar` (the MinAtar paper's DQN) or
    /// `atari` (Munchausen DQN's, from the literature); docs/guide/learning-options.md,
    /// "Presets".
    #[arg(long, value_enum)]
    pub preset: Option<crate::presets::Preset>,

    /// Bytes (MiB) that frames being received from remote actors may hold at once, all
    /// connections together; readers wait beyond it.
    #[arg(long, default_value_t = 256, requires = "listen")]
    pub max_inflight_mb: usize,

    /// Environments per actor. 8 keeps the inference batch useful without making
    /// transitions stale.
    #[arg(long, default_value_t = 8)]
    pub envs_per_actor: usize,

    /// Transitions per batch an actor sends to replay (at least --envs-per-actor).
    /// Larger batches duplicate fewer observation rows (each batch carries up to
    /// n-step rows per environment over from the last), at the cost of latency.
    /// Default: 16 for vector observations, 256 for images (whose rows are large: at 16,
    /// replay would hold 2.5 stacked observations per Atari transition instead of 1.14).
    #[arg(long)]
    pub actor_batch: Option<usize>,

    /// Seed for networks, environments, exploration and sampling.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// Train K agents of this configuration together, their networks stacked into one
    /// update: each with its own seed (agent 0 the run's, the others derived from it),
    /// replay, actors, exploration and evaluation; lock-step, so bit-reproducible. Each
    /// agent stops at its target (confirmed) or after --max-steps of its own; the
    /// results table is printed and written to LOGDIR/population.csv, each agent's
    /// policies to LOGDIR/agents/agent-NNN/checkpoint.
    #[arg(long)]
    pub population: Option<usize>,

    /// Threads a CPU population trains on, each a group of agents with a stacked update
    /// of its own (default: one per core). Results are reproducible for a given number.
    #[arg(long)]
    pub population_threads: Option<usize>,

    /// Train a sweep as one population: its agents from a file of grids and random
    /// draws of per-agent settings (learning rate, gradient clip, target period or τ,
    /// γ, n-step, ε schedule; batch size, hidden layers and replay ratio, which put
    /// agents in separate groups) times seeds, with a per-agent step budget; every
    /// other setting from the flags. The format: docs/guide/sweep-file.md; an example:
    /// sweeps/cartpole.toml.
    #[arg(long, conflicts_with = "population")]
    pub sweep: Option<PathBuf>,

    /// Most agents of a population training at once (default: as many as memory
    /// holds). The rest wait in a queue and take the places of agents that finish, so
    /// a sweep of any size runs as a stream.
    #[arg(long)]
    pub max_concurrent_agents: Option<usize>,

    /// Train only part I of N of the population or sweep (0-based: `0/3`), for a job
    /// array (`$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT`; a Kubernetes Indexed Job's
    /// `$(JOB_COMPLETION_INDEX)/N`): exactly thread I's agents and places of the same run
    /// with --population-threads N (on GPUs: --gpu over N devices) and the same
    /// --max-concurrent-agents, so its results equal that run's. Writes under LOGDIR/shard-I-of-N; `learner merge --logdir
    /// LOGDIR` combines the shards.
    #[arg(long, value_name = "I/N", conflicts_with_all = ["population_threads", "resume"])]
    pub shard: Option<crate::shard::Shard>,

    /// Lock-step mode: actors, replay and learner advance in one thread at the exact
    /// replay ratio, so the same seed and flags give bit-identical parameters and
    /// results on the same machine (CPU, embedded mode; slower than the default).
    #[arg(long, conflicts_with_all = ["listen", "gpu", "copy_stream"])]
    pub deterministic: bool,

    /// CUDA device index. Default: GPU 0 when CUDA is available, else the CPU. A
    /// population (--population, --sweep) takes a list, `--gpu 0,1,2,3`: one learner
    /// thread per device, each with its share of every group of agents.
    #[arg(long, value_delimiter = ',')]
    pub gpu: Vec<usize>,

    /// Force the CPU even when a GPU is available.
    #[arg(long, conflicts_with = "gpu")]
    pub cpu: bool,

    /// Copy batches to the GPU on a side CUDA stream, overlapping the next copy with
    /// the current update (a population: each group's stacked batches, on a stream of
    /// its own). Without it, copies are non-blocking but queued behind the update on
    /// the default stream. On an H200 it gave a population the same results and, in
    /// the overlap bench, 0.26–0.31 of the learner's ceiling against 0.06 without
    /// (docs/results/gpu.md).
    #[arg(long, conflicts_with = "cpu")]
    pub copy_stream: bool,

    /// Where fp32 work on a GPU may use TF32 tensor cores: `conv` (PyTorch's default:
    /// cuDNN's convolutions in TF32, cuBLAS's matmuls in full fp32), `all`, or `off`
    /// (full fp32 everywhere: to compare --precision bf16 with true fp32). Read back
    /// from libtorch and logged at start; no effect on the CPU.
    #[arg(long, value_enum, default_value_t = millrace_core::torch_settings::Tf32::Conv)]
    pub tf32: millrace_core::torch_settings::Tf32,

    /// cuDNN's benchmark mode: it times its algorithms once per shape and keeps the
    /// fastest (the learner's shapes are fixed). On by default on a GPU, off under
    /// --deterministic; `--cudnn-benchmark false` turns it off.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub cudnn_benchmark: Option<bool>,

    /// Stop after this many environment steps if the target is not reached.
    #[arg(long, default_value_t = 200_000)]
    pub max_steps: u64,

    /// Stop when a greedy evaluation's mean return reaches this, and a second one on
    /// fresh episodes confirms it. Default: the environment's Gymnasium reward
    /// threshold (475 for CartPole-v1). Negative values as typed (`--target-return -80`).
    #[arg(long, allow_negative_numbers = true)]
    pub target_return: Option<f32>,

    /// Directory for TensorBoard event files and the checkpoint (`checkpoint/`).
    /// Default: a new one per run, runs/<env>__<seed>__<unix time>. A directory that
    /// already holds a run's checkpoint is refused unless --resume continues that run.
    #[arg(long)]
    pub logdir: Option<PathBuf>,

    /// Continue from a checkpoint directory (e.g. runs/CartPole-v1__0__1796082432/checkpoint).
    /// A population (--population, --sweep) continues from its log directory, with the
    /// same flags and sweep file: ended agents keep their results, stopped ones go on
    /// from their saved state, the rest start.
    #[arg(long)]
    pub resume: Option<PathBuf>,

    /// With --logdir: continue the run saved in LOGDIR/checkpoint when there is one,
    /// else start it there (what a restarted container or a requeued job does; a run
    /// that crashed before its first checkpoint starts again). A run that is already
    /// finished is not trained again: the learner says so and exits 0. A population
    /// (--population, --sweep) continues as --resume LOGDIR would when LOGDIR holds
    /// its agents, else starts there.
    #[arg(long, requires = "logdir", conflicts_with = "resume")]
    pub resume_if_present: bool,

    /// Serve Prometheus metrics (GET /metrics: the TensorBoard scalars, counters and
    /// one series per remote actor) and health (/healthz: 200 once the learner accepts
    /// actors, 503 before and while stopping; /livez) on this address, e.g.
    /// 0.0.0.0:9100. `learner health` checks it.
    #[arg(long)]
    pub metrics_addr: Option<std::net::SocketAddr>,

    /// Seconds without a sign of life, once training has started, before /livez fails
    /// (503) and a liveness probe restarts the learner: the learner thread's (an
    /// update, or a second of waiting for data), or any one group's round in a
    /// population.
    #[arg(long, default_value_t = 120.0)]
    pub live_limit_s: f64,

    /// Hidden layer sizes. 128x128 is large enough to represent a stable balancing policy
    /// and small enough that an update costs well under a millisecond on one core.
    #[arg(long, value_delimiter = ',', default_value = "128,128")]
    pub hidden: Vec<usize>,

    /// A LayerNorm (learned gain and bias) after each hidden layer's linear map, before
    /// its ReLU, as in PQN (Gallici et al. 2024): it keeps the features' scale fixed
    /// while the targets move, which steadies long runs. Exported policies carry it
    /// (`nn.LayerNorm`).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value_t = false, action = clap::ArgAction::Set)]
    pub layer_norm: bool,

    /// Adam learning rate. High for DQN, as in rl-zoo3's CartPole setting (2.3e-3), since
    /// the Q-targets are small and the run is short.
    #[arg(long, default_value_t = 2.3e-3)]
    pub lr: f64,

    /// Decay the learning rate linearly from --lr to this over --lr-decay-steps env
    /// steps, then hold it (default: constant): fast early, steady late.
    #[arg(long)]
    pub lr_final: Option<f64>,

    /// Env steps over which the learning rate reaches --lr-final (default: --max-steps).
    #[arg(long, requires = "lr_final")]
    pub lr_decay_steps: Option<u64>,

    /// Minibatch size.
    #[arg(long, default_value_t = 64)]
    pub batch_size: usize,

    /// Discount factor.
    #[arg(long, default_value_t = 0.99)]
    pub gamma: f32,

    /// n-step returns: 3 propagates reward faster than 1 at little bias (Rainbow, Ape-X).
    #[arg(long, default_value_t = 3)]
    pub n_step: usize,

    /// Hard target-network sync period in updates (ignored with --tau).
    #[arg(long, default_value_t = 200)]
    pub target_period: u64,

    /// Polyak averaging coefficient per update, instead of hard syncs.
    #[arg(long)]
    pub tau: Option<f64>,

    /// The TD target: double (double DQN, van Hasselt et al. 2016: the target
    /// network's value at the online network's argmax), or munchausen (M-DQN,
    /// Vieillard et al. 2020: a soft target over softmax(q/τ) of the target network,
    /// plus α·clip(τ·log π(a|s), clip, 0) for the action taken; with --n-step the
    /// bonus is the first step's, as intermediate states are not stored). Munchausen
    /// replaces double DQN's argmax: its soft value already averages over actions.
    #[arg(long, value_enum, default_value_t = TargetKind::Double)]
    pub target: TargetKind,

    /// Munchausen's entropy temperature τ (the paper's 0.03).
    #[arg(long, default_value_t = 0.03)]
    pub munchausen_tau: f64,

    /// Munchausen's bonus scale α, in [0, 1] (the paper's 0.9).
    #[arg(long, default_value_t = 0.9)]
    pub munchausen_alpha: f64,

    /// Munchausen's lower clip of τ·log π, negative (the paper's −1).
    #[arg(long, default_value_t = -1.0, allow_negative_numbers = true)]
    pub munchausen_clip: f64,

    /// The Q-network's output: q (one value per action), or iqn (implicit quantiles,
    /// Dabney et al. 2018: the first hidden layer's output times an embedding of a
    /// quantile fraction τ, one return quantile per action and τ, the quantile Huber
    /// loss; actors act on the mean over --iqn-quantiles fixed fractions). With
    /// --target munchausen it is M-IQN. Not with --precision bf16.
    #[arg(long, value_enum, default_value_t = HeadChoice::Q)]
    pub head: HeadChoice,

    /// --head iqn: cosines in the fraction's embedding (the paper's 64).
    #[arg(long, default_value_t = 64)]
    pub iqn_embedding: usize,

    /// --head iqn: fractions the learner samples for the online network's quantiles,
    /// N (the paper's 8).
    #[arg(long, default_value_t = 8)]
    pub iqn_taus: usize,

    /// --head iqn: fractions the learner samples for the target's quantiles, N′ (the
    /// paper's 8).
    #[arg(long, default_value_t = 8)]
    pub iqn_target_taus: usize,

    /// --head iqn: the fixed fractions (j + ½)/m actors and evaluation average over, m
    /// (the paper's 32).
    #[arg(long, default_value_t = 32)]
    pub iqn_quantiles: usize,

    /// Gradient L2-norm clip.
    #[arg(long, default_value_t = 10.0)]
    pub max_grad_norm: f64,

    /// A dueling head (Wang et al. 2016): the last hidden layer split into a value and
    /// an advantage stream, Q = V + A − mean(A). Published policies stay plain MLPs.
    /// (`--dueling false` turns off what `--preset apex` turned on.)
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value_t = false, action = clap::ArgAction::Set)]
    pub dueling: bool,

    /// The optimizer: adam, or rmsprop (centred, no momentum, decay 0.95, ε 1.5e-7:
    /// Ape-X's learner).
    #[arg(long, value_enum, default_value_t = millrace_core::dqn::Optimizer::Adam)]
    pub optimizer: millrace_core::dqn::Optimizer,

    /// The forward and backward passes' arithmetic: fp32, or bf16 with fp32 master
    /// weights, gradients and optimizer state (mixed precision, for GPUs with native
    /// bf16: compute capability 8.0 or newer; refused on older ones).
    #[arg(long, value_enum, default_value_t = millrace_core::dqn::precision::Precision::Fp32)]
    pub precision: millrace_core::dqn::precision::Precision,

    /// Replay ratio as items sampled per item inserted. 32 with batch 64 is one update
    /// per two env steps, rl-zoo3's CartPole ratio (128 gradient steps per 256 steps).
    #[arg(long, default_value_t = 32.0)]
    pub samples_per_insert: f64,

    /// How far, in sampled items, the replay ratio may drift before the faster side
    /// blocks (at least two batches plus one insert's worth is enforced).
    #[arg(long, default_value_t = 2048.0)]
    pub samples_per_insert_tolerance: f64,

    /// Transitions collected before learning starts.
    #[arg(long, default_value_t = 1000)]
    pub learning_starts: u64,

    /// Replay capacity in transitions.
    #[arg(long, default_value_t = 100_000)]
    pub replay_capacity: usize,

    /// Replay shards (independent locks for concurrent actor inserts).
    #[arg(long, default_value_t = 4)]
    pub replay_shards: usize,

    /// Frames allocated per transition where replay stores each frame of stacked
    /// observations once (Atari): one per step plus a stack per episode start. 1.05
    /// covers Atari's long episodes (Pong measured 1.009); raise it for short episodes
    /// (CatchPixels: 1.4), or replay holds fewer transitions than its capacity.
    #[arg(long, default_value_t = 1.05)]
    pub replay_frames_per_item: f64,

    #[command(flatten)]
    pub sampling: ReplayFlags,

    /// Initial exploration rate.
    #[arg(long, default_value_t = 1.0)]
    pub eps_start: f32,

    /// Final exploration rate (rl-zoo3 CartPole: 0.04).
    #[arg(long, default_value_t = 0.04)]
    pub eps_end: f32,

    /// Env steps over which exploration decays linearly (rl-zoo3 CartPole: 0.16 x 50k).
    #[arg(long, default_value_t = 8_000)]
    pub eps_decay_steps: u64,

    /// Publish parameters to actors every this many updates.
    #[arg(long, default_value_t = 20)]
    pub publish_every: u64,

    /// Greedy evaluation every this many env steps.
    #[arg(long, default_value_t = 2_000)]
    pub eval_every: u64,

    /// Episodes per greedy evaluation (Gymnasium's CartPole criterion uses 100).
    #[arg(long, default_value_t = 100)]
    pub eval_episodes: usize,

    /// Also checkpoint every this many seconds (a final checkpoint is always written).
    #[arg(long)]
    pub checkpoint_every_s: Option<u64>,

    /// Stop the run (keeping the last good checkpoint) after this many consecutive
    /// updates whose loss is not finite; such updates are skipped on the device.
    #[arg(long, default_value_t = 100)]
    pub max_nonfinite: u64,

    /// The largest |reward| one environment step may give (times n-step for a stored
    /// transition); a transition beyond it is refused before it is stored (a remote
    /// actor sending one is disconnected, naming the field). Default: the environment's
    /// declared range where it has one (the Rust ports), else 1e6, beyond any real
    /// environment's.
    #[arg(long)]
    pub max_abs_reward: Option<f32>,

    /// The largest |value| an `f32` observation may hold; a transition beyond it is
    /// refused before it is stored, as for --max-abs-reward.
    #[arg(long, default_value_t = millrace_proto::bounds::DEFAULT_MAX_ABS_OBS)]
    pub max_abs_obs: f32,

    /// No progress bar (it is also hidden when stderr is not a terminal).
    #[arg(long)]
    pub no_progress: bool,
}

/// The checkpoint directory `--checkpoint` and `--agent` name: `checkpoint` itself, or
/// agent `k`'s in the population whose log directory `checkpoint` is.
fn agent_checkpoint(checkpoint: &Path, agent: Option<usize>) -> anyhow::Result<PathBuf> {
    let Some(k) = agent else {
        return Ok(checkpoint.to_path_buf());
    };
    let dir = checkpoint
        .join("agents")
        .join(format!("agent-{k:03}"))
        .join("checkpoint");
    if !dir.is_dir() {
        bail!(
            "--agent {k}: no {} (with --agent, --checkpoint is a population's log directory; its population.csv lists the agents)",
            dir.display()
        );
    }
    Ok(dir)
}

/// The device to train on: `--cpu`, `--gpu N` (checked against the devices that
/// exist), or GPU 0 when CUDA is available.
pub fn resolve_device(cpu: bool, gpu: Option<usize>) -> anyhow::Result<DeviceChoice> {
    match (cpu, gpu) {
        (true, _) => Ok(DeviceChoice::Cpu),
        (false, Some(i)) => {
            if !tch::Cuda::is_available() {
                let why = match millrace_probe::driver_cuda_version() {
                    Ok(_) => "the NVIDIA driver is present but libtorch sees no device".to_string(),
                    Err(e) => format!("no NVIDIA driver ({e})"),
                };
                bail!(
                    "--gpu {i}: CUDA is not available on this machine: {why}; drop --gpu to \
                     train on the CPU, or run `learner doctor`"
                );
            }
            let devices = millrace_probe::cuda_devices();
            if i >= devices.len() {
                let list: Vec<String> = devices.iter().map(ToString::to_string).collect();
                bail!(
                    "--gpu {i}: no such device; this machine has {} CUDA device(s): {}",
                    devices.len(),
                    list.join("; ")
                );
            }
            Ok(DeviceChoice::Cuda(i))
        }
        (false, None) if tch::Cuda::is_available() => Ok(DeviceChoice::Cuda(0)),
        (false, None) => Ok(DeviceChoice::Cpu),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_parser_is_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn defaults_make_a_valid_config() {
        let args = Args::try_parse_from(["learner", "--cpu"]).unwrap();
        let cfg = args.train.into_config().unwrap();
        assert_eq!(cfg.eval.target_return, Some(475.0));
        assert_eq!(cfg.actors.count, 1);
        let json: serde_json::Value = serde_json::from_str(&cfg.to_json()).unwrap();
        assert_eq!(json["dqn"]["lr"], 2.3e-3);
        assert_eq!(json["replay"]["capacity"], 100_000);
        assert_eq!(json["device"], "cpu");
    }

    #[test]
    fn the_iqn_head_and_the_impala_network_take_their_settings_and_refuse_bad_ones() {
        let config = |extra: &[&str]| {
            let mut all = vec!["learner", "--cpu"];
            all.extend_from_slice(extra);
            Args::try_parse_from(all).unwrap().train.into_config()
        };
        let cfg = config(&["--head", "iqn", "--iqn-taus", "16", "--iqn-quantiles", "8"]).unwrap();
        let spec = cfg.network_spec().unwrap();
        assert_eq!(
            spec.iqn,
            Some(millrace_proto::IqnHead {
                embedding: 64,
                quantiles: 8
            })
        );
        assert_eq!((cfg.dqn.iqn.online, cfg.dqn.iqn.target), (16, 8));
        let json: serde_json::Value = serde_json::from_str(&cfg.to_json()).unwrap();
        assert_eq!(json["iqn"]["embedding"], 64);
        let err = |extra: &[&str]| config(extra).unwrap_err().to_string();
        assert!(err(&["--head", "iqn", "--precision", "bf16"]).contains("fp32 only"));
        assert!(err(&["--head", "iqn", "--iqn-taus", "0"]).contains("--iqn-taus must be in"));
        assert!(err(&["--head", "iqn", "--iqn-embedding", "0"]).contains("cosines"));
        // The flags do nothing without the head: no IQN in the spec.
        assert!(config(&["--iqn-taus", "0"])
            .unwrap()
            .network_spec()
            .unwrap()
            .iqn
            .is_none());
        assert!(err(&["--network", "impala"]).contains("needs [C, H, W] observations"));
        assert!(err(&[
            "--network",
            "impala",
            "--env",
            "CatchPixels-v0",
            "--impala-width",
            "0"
        ])
        .contains("--impala-width must be in 1..=16"));
        let cfg = config(&[
            "--network",
            "impala",
            "--env",
            "CatchPixels-v0",
            "--impala-width",
            "2",
        ])
        .unwrap();
        let spec = cfg.network_spec().unwrap();
        assert_eq!(spec.impala.unwrap().channels, [32, 64, 64]);
        assert_eq!(spec.obs_dim, 64 * 6 * 6, "Atari-sized frames pooled to 6x6");
    }

    #[test]
    fn munchausen_targets_take_their_settings_and_refuse_bad_ones() {
        let config = |extra: &[&str]| {
            let mut all = vec!["learner", "--cpu", "--target", "munchausen"];
            all.extend_from_slice(extra);
            Args::try_parse_from(all).unwrap().train.into_config()
        };
        let cfg = config(&["--munchausen-clip", "-2"]).unwrap();
        assert_eq!(
            cfg.dqn.bootstrap,
            millrace_core::dqn::Bootstrap::Munchausen(millrace_core::dqn::Munchausen {
                tau: 0.03,
                alpha: 0.9,
                clip: -2.0,
            })
        );
        let json: serde_json::Value = serde_json::from_str(&cfg.to_json()).unwrap();
        assert_eq!(json["dqn"]["bootstrap"]["kind"], "munchausen");
        let err = |extra: &[&str]| config(extra).unwrap_err().to_string();
        assert!(err(&["--munchausen-tau", "0"]).contains("--munchausen-tau must be a positive"));
        assert!(
            err(&["--munchausen-alpha", "1.5"]).contains("--munchausen-alpha must be in [0, 1]")
        );
        assert!(err(&["--munchausen-clip", "0.5"]).contains("--munchausen-clip must be negative"));
        let plain = Args::try_parse_from(["learner", "--cpu"]).unwrap();
        let cfg = plain.train.into_config().unwrap();
        assert_eq!(cfg.dqn.bootstrap, millrace_core::dqn::Bootstrap::Double);
    }

    #[test]
    fn negative_targets_parse_as_typed() {
        let args =
            Args::try_parse_from(["learner", "--env", "Acrobot-v1", "--target-return", "-80"])
                .unwrap();
        assert_eq!(args.train.target_return, Some(-80.0));
    }

    #[test]
    fn a_list_of_gpus_is_for_populations_and_each_is_checked() {
        let err = |args: &[&str]| {
            let mut all = vec!["learner"];
            all.extend_from_slice(args);
            let args = Args::try_parse_from(all).unwrap();
            args.train.into_config().unwrap_err().to_string()
        };
        assert!(err(&["--gpu", "0,1"]).contains("a list is for a population"));
        assert!(err(&["--gpu", "0,1,0", "--population", "2"]).contains("--gpu 0 is listed twice"));
        if !tch::Cuda::is_available() {
            // Every listed device is resolved: here, none exists.
            assert!(err(&["--gpu", "0,1", "--population", "2"]).contains("CUDA is not available"));
        }
    }

    #[test]
    fn subcommands_parse_beside_the_training_flags() {
        let args = Args::try_parse_from([
            "learner",
            "export",
            "--checkpoint",
            "c",
            "--which",
            "best",
            "--out",
            "p.safetensors",
        ])
        .unwrap();
        assert!(matches!(
            args.command,
            Some(Command::Export {
                policy: PolicyArgs {
                    which: Some(Which::Best),
                    ..
                },
                ..
            })
        ));
        assert!(Args::try_parse_from(["learner", "--seed", "3", "doctor"]).is_err());
    }
}
