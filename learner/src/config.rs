//! The run's typed configuration: checked once (by `cli`), then each component gets
//! only its own part. The whole of it, defaults included, is printed at start and saved
//! beside the checkpoints as `config.json`, so a run says exactly what it ran with.

use std::path::PathBuf;

use millrace_actor::EpsilonSchedule;
use millrace_proto::{EnvConfig, EnvSpec};
use serde::Serialize;

use crate::replay_flags::{PriorityOptions, PRIORITIZED_PREFETCH_DEPTH};
use millrace_core::dqn::network::NetworkChoice;
use millrace_core::dqn::DqnConfig;
use millrace_server::ServerConfig;

pub use millrace_core::device::DeviceChoice;
pub use millrace_core::faults::{OomFault, OomSite};
pub use millrace_core::torch_settings::GpuMathConfig;
pub use millrace_core::update_loop::{LoopConfig, REPORT_EVERY};
pub use millrace_proto::durations::{opt_secs, secs};

/// Replay and rate-limiting settings.
#[derive(Clone, Debug, Serialize)]
pub struct ReplayOptions {
    pub capacity: usize,
    pub shards: usize,
    /// Items sampled per item inserted: `batch_size × updates ÷ env transitions`.
    pub samples_per_insert: f64,
    /// How far (in sampled items) the ratio may drift before one side blocks.
    pub tolerance: f64,
    /// Transitions stored before the first update (SB3's `learning_starts`).
    pub learning_starts: u64,
    /// Frames allocated per transition when replay stores frames of stacked
    /// observations (each episode start adds a stack, so short episodes need more).
    pub frames_per_item: f64,
    /// Prioritized replay's settings; `None` samples uniformly.
    pub priority: Option<PriorityOptions>,
    /// Staging buffers the sampler fills ahead (`None`: the memory-bound default, at
    /// most [`PRIORITIZED_PREFETCH_DEPTH`] with priorities).
    pub prefetch_depth: Option<usize>,
}

impl ReplayOptions {
    /// Staging buffers for the sampler, given the memory-bound default.
    pub fn prefetch_depth(&self, default: usize) -> usize {
        match (self.prefetch_depth, &self.priority) {
            (Some(d), _) => d,
            (None, Some(_)) => default.min(PRIORITIZED_PREFETCH_DEPTH),
            (None, None) => default,
        }
    }
}

/// The actors of this process (embedded mode) and how every actor, local or remote,
/// builds transitions.
#[derive(Clone, Debug, Serialize)]
pub struct ActorsConfig {
    /// Actor threads in this process.
    pub count: usize,
    pub envs_per_actor: usize,
    /// Transitions per batch an actor hands on (at least one step of every env).
    pub batch_rows: usize,
    pub n_step: usize,
    pub gamma: f32,
    pub epsilon: EpsilonSchedule,
    /// Ape-X's fixed ε per environment instead of `epsilon` (`--apex-epsilon`).
    pub apex_epsilon: bool,
    /// `--actors auto`: `count` is decided at start from measurements.
    pub auto: Option<crate::cpu_plan::auto::AutoActors>,
}

/// When and how policies are evaluated, and what counts as solved.
#[derive(Clone, Debug, Serialize)]
pub struct EvalConfig {
    /// Greedy evaluation every this many env steps.
    pub every: u64,
    pub episodes: usize,
    /// The run is solved once an evaluation's mean reaches this, and a second one on
    /// fresh episodes confirms it.
    pub target_return: Option<f32>,
}

/// Failures to inject, for tests of the shutdown path (`MILLRACE_INJECT_FAULT`; never
/// part of the saved configuration).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// The evaluator fails at its first evaluation.
    pub evaluator: bool,
    /// The sampler thread fails after its first batch.
    pub sampler: bool,
    /// The first actor thread fails after a few batches.
    pub actor: bool,
    /// The learner thread panics after a few updates.
    pub learner_panic: bool,
    /// The device runs out of memory after a few updates, at one site, as libtorch
    /// reports it (CPU- or CUDA-shaped).
    pub oom: Option<OomFault>,
    /// A population's group with agent 0 stops its rounds after the first (wedged)
    /// until the run stops, while the other groups train.
    pub stall_group: bool,
}

impl Faults {
    /// Parses `evaluator`, `sampler`, `actor`, `learner-panic`, `stall-group`,
    /// `learner-oom` (the update, CPU-shaped) or `oom:SITE[:cuda]` with SITE one of copy, update,
    /// priorities, publish, stats (comma-separated).
    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut f = Self::default();
        let sites = OomSite::ALL.map(OomSite::name).join(", ");
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "evaluator" => f.evaluator = true,
                "sampler" => f.sampler = true,
                "actor" => f.actor = true,
                "learner-panic" => f.learner_panic = true,
                "stall-group" => f.stall_group = true,
                "learner-oom" => {
                    f.oom = Some(OomFault {
                        site: OomSite::Update,
                        cuda: false,
                    })
                }
                oom if oom.starts_with("oom:") => {
                    let mut it = oom["oom:".len()..].split(':');
                    let site = it.next().unwrap_or_default();
                    let site = OomSite::ALL
                        .into_iter()
                        .find(|s| s.name() == site)
                        .ok_or_else(|| format!("unknown site {site:?} in {oom:?} ({sites})"))?;
                    let cuda = match it.next() {
                        None | Some("cpu") => false,
                        Some("cuda") => true,
                        Some(other) => return Err(format!("{oom:?}: {other:?} is not cpu or cuda")),
                    };
                    f.oom = Some(OomFault { site, cuda });
                }
                other => {
                    return Err(format!(
                        "unknown fault {other:?} (evaluator, sampler, actor, learner-panic, stall-group, learner-oom, oom:SITE[:cuda] with SITE {sites})"
                    ))
                }
            }
        }
        Ok(f)
    }
}

/// How a run drives its components (a server for remote actors, `--listen`, is
/// `RunConfig::server` in the threaded and population modes).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Mode {
    /// Actors, the sampler, the learner, the publisher and the checkpoint writer on
    /// threads of their own (the default).
    Threaded,
    /// `--deterministic`: actors, replay and learner advance in one thread at the
    /// exact replay ratio, so the same seed and flags give bit-identical results.
    LockStep,
    /// `--population K` or `--sweep FILE`: agents trained together by stacked updates,
    /// each group lock-step on a thread of its own.
    Population(PopulationMode),
}

/// A population's own settings.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PopulationMode {
    pub agents: Agents,
    /// Threads (groups of agents) a CPU population trains on; default: one per core.
    /// Results depend on it (an agent's batches wait for its group's).
    pub threads: Option<usize>,
    /// Most agents training at once (`None`: as many as memory holds); the rest queue
    /// and take finished agents' places.
    pub max_concurrent: Option<usize>,
    /// The devices it trains on, one learner thread each (`--gpu 0,1`; the first is
    /// the run's `device`).
    pub devices: Vec<DeviceChoice>,
    /// Only this part of the population (`--shard I/N`).
    pub shard: Option<crate::shard::Shard>,
}

impl PopulationMode {
    /// The group threads it runs on (before memory's limit on agents at once): one per
    /// CPU it may use unless `threads` says, one per GPU, one for a shard.
    pub fn group_threads(&self, device: DeviceChoice) -> usize {
        if self.shard.is_some() {
            1
        } else if device.device() == tch::Device::Cpu {
            self.threads
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        } else {
            self.devices.len()
        }
        .max(1)
    }
}

/// Which agents a population has.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Agents {
    /// `--population K`: K agents of the flags' configuration, seeds derived from the
    /// run's (agent 0's is the run's own).
    Count(usize),
    /// `--sweep FILE`: grids and draws of per-agent settings times seeds (see
    /// `docs/guide/sweep-file.md`).
    Sweep(PathBuf),
}

/// Everything a training run needs, checked once (see `cli`).
#[derive(Clone, Debug, Serialize)]
pub struct RunConfig {
    /// The environment and how to build it.
    pub env: EnvConfig,
    /// Its spaces, read once when the flags were checked (a bridged environment is
    /// built to read them); the checkpoint's metadata saves them.
    #[serde(skip)]
    pub env_spec: EnvSpec,
    /// Training rewards clipped to [-1, 1] (episode returns stay true).
    pub clip_rewards: bool,
    /// What a stored transition's values may be (`--max-abs-reward`, `--max-abs-obs`).
    pub value_bounds: millrace_proto::ValueBounds,
    /// The Q-network's architecture (`auto`: from the observations).
    pub network: NetworkChoice,
    pub seed: u64,
    /// How the run drives its components: threaded, lock-step or a population.
    pub mode: Mode,
    pub device: DeviceChoice,
    /// TF32 and cuDNN's benchmark mode on CUDA devices (`--tf32`, `--cudnn-benchmark`).
    pub gpu_math: GpuMathConfig,
    /// Hidden layer sizes of the Q-network's MLP.
    pub hidden: Vec<usize>,
    /// A LayerNorm in each hidden layer, before its ReLU (`--layer-norm`).
    pub layer_norm: bool,
    /// The residual torso of `--network impala` (`--impala-width`, `--impala-pool`).
    pub impala: millrace_proto::ImpalaTorso,
    /// The IQN head of `--head iqn` (`--iqn-embedding`, `--iqn-quantiles`).
    pub iqn: Option<millrace_proto::IqnHead>,
    pub dqn: DqnConfig,
    pub batch_size: usize,
    pub replay: ReplayOptions,
    pub actors: ActorsConfig,
    pub learner: LoopConfig,
    pub eval: EvalConfig,
    /// Stop after this many env steps if the target is not reached.
    pub max_steps: u64,
    pub logdir: PathBuf,
    pub resume: Option<PathBuf>,
    /// Serve remote actors (`learner --listen`).
    pub server: Option<ServerConfig>,
    /// Serve Prometheus metrics and health here (`--metrics-addr`).
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// `/livez` fails once training shows no sign of life for this long
    /// (`--live-limit-s`).
    #[serde(serialize_with = "secs")]
    pub live_limit: std::time::Duration,
    #[serde(skip)]
    pub faults: Faults,
    /// Where the learner, service and actor threads run (`--cpu-plan`).
    pub cpu_plan: crate::cpu_plan::CpuPlan,
}

impl RunConfig {
    /// The Q-network these settings give for their environment.
    pub fn network_spec(&self) -> Result<millrace_proto::NetworkSpec, millrace_proto::SpecError> {
        let spec = millrace_core::dqn::network::build(
            self.network,
            &self.env_spec,
            &self.hidden,
            self.layer_norm,
            &self.impala,
        )?;
        let spec = millrace_proto::NetworkSpec {
            iqn: self.iqn,
            ..spec
        };
        spec.validate()?;
        Ok(spec)
    }

    /// The population's settings, in population mode.
    pub fn population(&self) -> Option<&PopulationMode> {
        match &self.mode {
            Mode::Population(p) => Some(p),
            Mode::Threaded | Mode::LockStep => None,
        }
    }

    /// The |TD error| beyond which a replay item is poison, for these value bounds and
    /// this discount ([`millrace_core::poison::td_bound`]).
    pub fn poison_td(&self) -> f32 {
        millrace_core::poison::td_bound(
            self.value_bounds.reward,
            self.actors.gamma,
            self.batch_size,
        )
    }

    /// The checkpoint root: `latest/`, `best/`, `solved/` and `config.json`.
    pub fn checkpoint_dir(&self) -> PathBuf {
        self.logdir.join("checkpoint")
    }

    /// The configuration of local actor `id`; `seed_offset` moves its seed stream on
    /// (a resumed run's env steps, so it does not replay the same episodes).
    pub fn actor(&self, id: u32, seed_offset: u64) -> millrace_actor::ActorConfig {
        millrace_actor::ActorConfig {
            actor_id: id,
            env: self.env.clone(),
            num_envs: self.actors.envs_per_actor,
            seed: self.seed.wrapping_add(seed_offset),
            n_step: self.actors.n_step,
            gamma: self.actors.gamma,
            batch_rows: self.actors.batch_rows,
            epsilon: self.actors.epsilon,
            // Environment e of actor `id` is number id·E + e of the embedded actors' N.
            env_epsilons: self.actors.apex_epsilon.then(|| {
                let e = self.actors.envs_per_actor;
                let total = (self.actors.count * e).max(1) as u32;
                (0..e)
                    .map(|i| {
                        let index = (id as usize * e + i) as u32;
                        millrace_actor::apex_epsilon(index, total, 0.4, 7.0)
                    })
                    .collect()
            }),
            clip_rewards: self.clip_rewards,
            initial_priorities: self.replay.priority.is_some(),
            value_bounds: self.value_bounds,
        }
    }

    /// The configuration as pretty JSON (what `config.json` holds).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse_and_refuse_unknown_names() {
        let f = Faults::parse("sampler, learner-panic").unwrap();
        assert!(f.sampler && f.learner_panic && !f.actor && !f.evaluator);
        assert_eq!(Faults::parse("").unwrap(), Faults::default());
        assert!(Faults::parse("disk").unwrap_err().contains("unknown fault"));
        let oom = Faults::parse("oom:priorities:cuda").unwrap().oom.unwrap();
        assert_eq!((oom.site, oom.cuda), (OomSite::Priorities, true));
        assert!(oom
            .message()
            .contains("CUDA out of memory. Tried to allocate"));
        assert!(millrace_core::update_loop::is_out_of_memory(&oom.message()));
        let cpu = Faults::parse("learner-oom").unwrap().oom.unwrap();
        assert_eq!((cpu.site, cpu.cuda), (OomSite::Update, false));
        assert!(millrace_core::update_loop::is_out_of_memory(&cpu.message()));
        assert!(Faults::parse("oom:disk")
            .unwrap_err()
            .contains("copy, update"));
    }

    #[test]
    fn devices_print_as_users_write_them() {
        assert_eq!(DeviceChoice::Cuda(1).to_string(), "cuda:1");
        assert_eq!(
            serde_json::to_string(&DeviceChoice::Cpu).unwrap(),
            "\"cpu\""
        );
    }
}
