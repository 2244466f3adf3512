//! The flags checked per component into typed configurations: the environment, the
//! counts, a population's flags, replay's shards, the network, the devices, the server,
//! the learning-rate decay. [`TrainArgs::into_config`] puts them together.

use std::time::Duration;

use anyhow::{bail, Context};
use millrace_actor::EpsilonSchedule;
use millrace_core::dqn::schedules::LrDecay;
use millrace_core::dqn::{Bootstrap, DqnConfig, Munchausen, TargetKind, TargetUpdate};
use millrace_proto::env::Family;
use millrace_proto::{EnvConfig, EnvSpec, ValueBounds};
use millrace_server::ServerConfig;

use super::{logdir, resolve_device, TrainArgs};
use crate::config::{
    ActorsConfig, Agents, DeviceChoice, EvalConfig, Faults, GpuMathConfig, LoopConfig, Mode,
    PopulationMode, ReplayOptions, RunConfig,
};
use crate::cpu_plan::auto::AutoActors;
use crate::cpu_plan::{ActorCount, CpuPlan, PlanChoice};

fn positive(name: &str, value: f64) -> anyhow::Result<()> {
    if !(value.is_finite() && value > 0.0) {
        bail!("--{name} must be a positive number, got {value}");
    }
    Ok(())
}

/// The environment as the flags name it, and its spaces (a bridged environment is
/// built once here: a missing package, an unknown id or an unsupported space is one
/// error line before anything starts).
fn environment(args: &TrainArgs) -> anyhow::Result<(EnvConfig, EnvSpec)> {
    if let Some(kwargs) = &args.env_kwargs {
        match serde_json::from_str::<serde_json::Value>(kwargs) {
            Ok(serde_json::Value::Object(_)) => {}
            _ => bail!("--env-kwargs must be a JSON object, e.g. '{{\"difficulty\": 1}}'"),
        }
    }
    let env = EnvConfig {
        id: args.env.clone(),
        module: args.env_module.clone(),
        kwargs: args.env_kwargs.clone(),
        terminal_on_life_loss: args.terminal_on_life_loss,
    };
    let spec = millrace_actor::env::spec_of(&env)?;
    Ok((env, spec))
}

/// `--target` and its settings.
fn bootstrap(args: &TrainArgs) -> anyhow::Result<Bootstrap> {
    Ok(match args.target {
        TargetKind::Double => Bootstrap::Double,
        TargetKind::Munchausen => Bootstrap::Munchausen(
            Munchausen::new(
                args.munchausen_tau,
                args.munchausen_alpha,
                args.munchausen_clip,
            )
            .map_err(|e| anyhow::anyhow!("--munchausen-{} {e}", e.setting()))?,
        ),
    })
}

/// `--head` and its settings: the network's IQN head and the update's sampling.
fn iqn_head(
    args: &TrainArgs,
) -> anyhow::Result<(
    Option<millrace_proto::IqnHead>,
    millrace_core::dqn::iqn::IqnSampling,
)> {
    let sampling = millrace_core::dqn::iqn::IqnSampling {
        online: args.iqn_taus,
        target: args.iqn_target_taus,
        ..Default::default()
    };
    if args.head == super::HeadChoice::Q {
        return Ok((None, sampling));
    }
    if args.precision != millrace_core::dqn::precision::Precision::Fp32 {
        bail!("--head iqn runs in fp32 only: its update goes through autograd, which the bf16 copies do not");
    }
    let sampling = millrace_core::dqn::iqn::IqnSampling::new(args.iqn_taus, args.iqn_target_taus)
        .map_err(|e| {
        let flag = match e.which {
            "online" => "iqn-taus",
            _ => "iqn-target-taus",
        };
        anyhow::anyhow!("--{flag} {e}")
    })?;
    let head = millrace_proto::IqnHead {
        embedding: args.iqn_embedding,
        quantiles: args.iqn_quantiles,
    };
    head.check()
        .map_err(|e| anyhow::anyhow!("--iqn-embedding/--iqn-quantiles: {e}"))?;
    Ok((Some(head), sampling))
}

/// Counts and rates that must be positive; the actors' count.
fn counts(args: &TrainArgs, actor_batch: usize) -> anyhow::Result<usize> {
    for (name, v) in [
        ("lr", args.lr),
        ("max-grad-norm", args.max_grad_norm),
        ("samples-per-insert", args.samples_per_insert),
        ("live-limit-s", args.live_limit_s),
    ] {
        positive(name, v)?;
    }
    let actors = match args.actors {
        None => usize::from(args.listen.is_none()),
        Some(ActorCount::Count(n)) => n,
        Some(ActorCount::Auto) => {
            if args.deterministic || args.population.is_some() || args.sweep.is_some() {
                bail!(
                    "--actors auto sizes the actor threads of a threaded run; lock-step runs and populations act in their own threads: give a number"
                );
            }
            // Resolved at start, once the learner has been measured (run::actors_auto).
            1
        }
    };
    if actors == 0 && args.listen.is_none() {
        bail!("--actors 0 needs --listen (remote actors), or nothing would ever act");
    }
    for (name, v) in [
        ("population", args.population.unwrap_or(1)),
        ("population-threads", args.population_threads.unwrap_or(1)),
        ("envs-per-actor", args.envs_per_actor),
        ("actor-batch", actor_batch),
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
    if !(1.0..=8.0).contains(&args.replay_frames_per_item) {
        bail!(
            "--replay-frames-per-item must be between 1 and 8, got {}",
            args.replay_frames_per_item
        );
    }
    Ok(actors)
}

/// A population's own flags, refused without one; whether this is a population.
fn population_flags(args: &TrainArgs) -> anyhow::Result<bool> {
    let population = args.population.is_some() || args.sweep.is_some();
    if args.population_threads.is_some() && !population {
        bail!("--population-threads is for a population (--population or --sweep)");
    }
    if args.max_concurrent_agents.is_some() && !population {
        bail!("--max-concurrent-agents is for a population (--population or --sweep)");
    }
    if args.max_concurrent_agents == Some(0) || args.population_threads == Some(0) {
        bail!("--max-concurrent-agents and --population-threads must be at least 1");
    }
    let agents = match &args.sweep {
        Some(path) => {
            // Read now, so a bad file is one clear line before anything starts.
            let base = DqnConfig {
                bootstrap: bootstrap(args)?,
                ..DqnConfig::default()
            };
            crate::sweep::Sweep::read(path, &base, args.seed)?
                .agents
                .len()
        }
        None => args.population.unwrap_or(1),
    };
    if let Some(shard) = args.shard {
        if !population {
            bail!("--shard is for a population (--population or --sweep)");
        }
        if args.logdir.is_none() {
            bail!("--shard needs --logdir: the directory the shards share (each writes under its shard-I-of-N)");
        }
        if args.gpu.len() > 1 {
            bail!("--shard trains on one device (thread I of the one-process run): give one --gpu");
        }
        // Thread I of N exists in the one-process run only if N threads get places.
        let places = args.max_concurrent_agents.unwrap_or(agents).min(agents);
        if shard.count > places {
            bail!(
                "--shard {shard}: {agents} agents, {places} at once, split into at most {places} shards"
            );
        }
    }
    Ok(population)
}

/// Replay's shards must each hold an actor's batches with room to spare.
fn replay_shards(args: &TrainArgs, actor_batch: usize) -> anyhow::Result<usize> {
    if args.replay_shards > usize::from(u16::MAX) {
        bail!("--replay-shards must be at most {}", u16::MAX);
    }
    // An actor's batch (up to --actor-batch plus a flush of n-step rows per env) must
    // fit a replay shard with room to spare, or replay could hold only that batch.
    let per_shard = args.replay_capacity.div_ceil(args.replay_shards);
    let batch_rows = actor_batch.max(args.envs_per_actor);
    let largest_batch = batch_rows + args.envs_per_actor * args.n_step;
    if 2 * largest_batch > per_shard {
        bail!(
            "--replay-capacity {} over --replay-shards {} leaves {per_shard} transitions per shard, \
             too few for actor batches of up to {largest_batch} (--actor-batch, --envs-per-actor, --n-step)",
            args.replay_capacity,
            args.replay_shards
        );
    }
    Ok(batch_rows)
}

/// The residual torso `--network impala` builds (`--impala-width`, `--impala-pool`).
fn impala_torso(args: &TrainArgs) -> anyhow::Result<millrace_proto::ImpalaTorso> {
    if !(1..=16).contains(&args.impala_width) {
        bail!(
            "--impala-width must be in 1..=16, got {}",
            args.impala_width
        );
    }
    if args.impala_pool > 64 {
        bail!(
            "--impala-pool must be in 0..=64 (0: none), got {}",
            args.impala_pool
        );
    }
    Ok(millrace_proto::ImpalaTorso::new(
        args.impala_width,
        args.impala_pool,
    ))
}

/// The network the flags give for `spec` (its head aside).
fn network(args: &TrainArgs, spec: &EnvSpec) -> anyhow::Result<millrace_proto::NetworkSpec> {
    Ok(millrace_core::dqn::network::build(
        args.network,
        spec,
        &args.hidden,
        args.layer_norm,
        &impala_torso(args)?,
    )?)
}

/// The network and the DQN's own numbers; how the target follows.
fn network_and_targets(args: &TrainArgs, spec: &EnvSpec) -> anyhow::Result<TargetUpdate> {
    if args.hidden.is_empty() || args.hidden.contains(&0) {
        bail!("--hidden needs positive layer sizes, e.g. 128,128");
    }
    network(args, spec)?;
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
    if args.max_nonfinite == 0 {
        bail!("--max-nonfinite must be at least 1");
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
    Ok(target)
}

/// The devices (`--cpu`, `--gpu`, a list for a population), each able to run the
/// precision asked for.
fn devices(args: &TrainArgs, population: bool) -> anyhow::Result<Vec<DeviceChoice>> {
    if args.gpu.len() > 1 && !population {
        bail!(
            "--gpu takes one device for a single run; a list is for a population (--population or --sweep), one learner thread per device"
        );
    }
    if let Some(i) = args
        .gpu
        .iter()
        .enumerate()
        .find_map(|(n, i)| args.gpu[..n].contains(i).then_some(i))
    {
        bail!("--gpu {i} is listed twice");
    }
    let devices = if args.deterministic {
        vec![DeviceChoice::Cpu]
    } else if args.gpu.is_empty() {
        vec![resolve_device(args.cpu, None)?]
    } else {
        args.gpu
            .iter()
            .map(|&i| resolve_device(args.cpu, Some(i)))
            .collect::<anyhow::Result<Vec<_>>>()?
    };
    if args.precision != millrace_core::dqn::precision::Precision::Fp32 {
        let gpus = millrace_probe::cuda_devices();
        for &d in &devices {
            let info = match d {
                DeviceChoice::Cuda(i) => gpus.iter().find(|g| g.index == i),
                DeviceChoice::Cpu => None,
            };
            millrace_core::dqn::precision::check(
                args.precision,
                d,
                info.map_or("", |g| g.name.as_str()),
                info.and_then(|g| g.compute_capability),
            )
            .map_err(anyhow::Error::msg)?;
        }
    }
    Ok(devices)
}

/// What a stored transition's values may be (`--max-abs-reward`, `--max-abs-obs`).
fn value_bounds(args: &TrainArgs, spec: &EnvSpec) -> anyhow::Result<ValueBounds> {
    for (flag, v) in [
        ("--max-abs-reward", args.max_abs_reward.unwrap_or(1.0)),
        ("--max-abs-obs", args.max_abs_obs),
    ] {
        if !(v.is_finite() && v > 0.0) {
            bail!("{flag} {v}: must be a positive finite number");
        }
    }
    Ok(ValueBounds::new(
        spec,
        args.n_step,
        args.max_abs_reward,
        args.max_abs_obs,
    ))
}

/// The server for remote actors (`--listen`), if any.
fn server(
    args: &TrainArgs,
    spec: &EnvSpec,
    batch_rows: usize,
) -> anyhow::Result<Option<ServerConfig>> {
    let server = match args.listen {
        Some(addr) => {
            let token = millrace_actor::remote::read_token(args.token_file.as_deref())
                .context("--token-file")?;
            if token.is_none() && !addr.ip().is_loopback() {
                bail!("--listen {addr}: binding beyond loopback needs a token (--token-file or MILLRACE_TOKEN)");
            }
            let mut scfg = ServerConfig::new(addr);
            scfg.token = token;
            scfg.n_step = args.n_step as u32;
            scfg.gamma = args.gamma;
            scfg.batch_rows = batch_rows as u32;
            scfg.batch_envs = args.envs_per_actor as u32;
            scfg.apex_epsilon = args.apex_epsilon;
            scfg.epsilon_decay =
                (!args.apex_epsilon).then_some(millrace_proto::wire::EpsilonDecay {
                    start: args.eps_start,
                    end: args.eps_end,
                    steps: args.eps_decay_steps,
                });
            if spec.obs.dtype == millrace_proto::DType::U8 {
                // Image rows are large: batches of a few hundred need more than the
                // handshake's 16 MiB frames (an actor learns the limit in its welcome).
                scfg.max_frame = millrace_proto::codec::MAX_FRAME_CEILING;
            }
            scfg.max_inflight_bytes = args.max_inflight_mb.saturating_mul(1 << 20);
            if scfg.max_inflight_bytes < scfg.max_frame {
                bail!(
                    "--max-inflight-mb {} is smaller than one frame ({} MiB)",
                    args.max_inflight_mb,
                    scfg.max_frame >> 20
                );
            }
            Some(scfg)
        }
        None => None,
    };
    Ok(server)
}

/// The dueling head fits the network; the learning rate's decay, if any.
fn dueling_and_decay(args: &TrainArgs, spec: &EnvSpec) -> anyhow::Result<Option<LrDecay>> {
    if args.dueling {
        millrace_core::dqn::dueling::DuelingHead::new(&network(args, spec)?, tch::Device::Cpu)
            .map_err(|e| anyhow::anyhow!("--dueling: {e}"))?;
    }
    let lr_decay = match args.lr_final {
        None => None,
        Some(end) if !(end.is_finite() && end > 0.0) => {
            bail!("--lr-final must be a positive number, got {end}")
        }
        Some(end) if end > args.lr => {
            bail!(
                "--lr-final ({end}) must not exceed --lr ({}): it is where the rate decays to",
                args.lr
            )
        }
        Some(_) if args.lr_decay_steps == Some(0) => {
            bail!("--lr-decay-steps must be at least 1")
        }
        Some(end) => Some(LrDecay {
            end_fraction: end / args.lr,
            steps: args.lr_decay_steps.unwrap_or(args.max_steps),
        }),
    };
    Ok(lr_decay)
}

/// The learner threads the CPU plan gives a core each: one, or a population's group
/// threads.
fn learner_threads(args: &TrainArgs, population: bool, devices: &[DeviceChoice]) -> usize {
    if !population {
        return 1;
    }
    let mode = PopulationMode {
        agents: Agents::Count(1),
        threads: args.population_threads,
        max_concurrent: None,
        devices: devices.to_vec(),
        shard: args.shard,
    };
    mode.group_threads(devices[0])
}

impl TrainArgs {
    /// Checks the flags, component by component, and turns them into the typed
    /// configuration.
    pub fn into_config(self) -> anyhow::Result<RunConfig> {
        let mut args = self;
        let (env, spec) = environment(&args)?;
        let clip_rewards = args.clip_rewards.unwrap_or(env.family() == Family::Atari);
        let actor_batch = args.actor_batch.unwrap_or(match spec.obs.dtype {
            millrace_proto::DType::U8 => 256,
            millrace_proto::DType::F32 => 16,
        });
        let actors = counts(&args, actor_batch)?;
        let population = population_flags(&args)?;
        let impala = impala_torso(&args)?;
        let batch_rows = replay_shards(&args, actor_batch)?;
        let target = network_and_targets(&args, &spec)?;
        let devices = devices(&args, population)?;
        let device = devices[0];
        if let (Some(shard), Some(root)) = (args.shard, &args.logdir) {
            args.logdir = Some(root.join(shard.dir_name()));
        }
        let logdir = logdir::resume_and_logdir(&mut args, population)?;
        let epsilon = EpsilonSchedule::Linear {
            start: args.eps_start,
            end: args.eps_end,
            steps: args.eps_decay_steps,
        };
        let value_bounds = value_bounds(&args, &spec)?;
        let mut server = server(&args, &spec, batch_rows)?;
        if let Some(s) = &mut server {
            s.value_bounds = value_bounds;
        }
        let lr_decay = dueling_and_decay(&args, &spec)?;
        let priority = args.sampling.priority(args.max_steps)?;
        let faults = match std::env::var("MILLRACE_INJECT_FAULT") {
            Ok(spec) => Faults::parse(&spec).map_err(anyhow::Error::msg)?,
            Err(_) => Faults::default(),
        };
        let bootstrap = bootstrap(&args)?;
        let (iqn, iqn_sampling) = iqn_head(&args)?;
        let machine = crate::cpu_plan::host::machine();
        let cpu_plan = match args.cpu_plan {
            PlanChoice::On if args.deterministic => CpuPlan::off(
                &machine,
                "lock-step: one thread acts and learns; nothing pinned",
            ),
            PlanChoice::On => {
                crate::cpu_plan::plan(&machine, learner_threads(&args, population, &devices))
            }
            PlanChoice::Off => CpuPlan::off(&machine, "--cpu-plan off: nothing pinned"),
        };
        let cfg = RunConfig {
            eval: EvalConfig {
                every: args.eval_every,
                episodes: args.eval_episodes,
                target_return: args.target_return.or(spec.reward_threshold),
            },
            env,
            env_spec: spec,
            clip_rewards,
            value_bounds,
            network: args.network,
            seed: args.seed,
            mode: if population {
                Mode::Population(PopulationMode {
                    agents: match &args.sweep {
                        Some(path) => Agents::Sweep(path.clone()),
                        None => Agents::Count(args.population.unwrap_or(1)),
                    },
                    threads: args.population_threads,
                    max_concurrent: args.max_concurrent_agents,
                    devices,
                    shard: args.shard,
                })
            } else if args.deterministic {
                Mode::LockStep
            } else {
                Mode::Threaded
            },
            device,
            gpu_math: GpuMathConfig {
                tf32: args.tf32,
                cudnn_benchmark: args.cudnn_benchmark.unwrap_or(!args.deterministic),
            },
            hidden: args.hidden,
            layer_norm: args.layer_norm,
            impala,
            iqn,
            dqn: DqnConfig {
                bootstrap,
                iqn: iqn_sampling,
                lr: args.lr,
                max_grad_norm: args.max_grad_norm,
                target,
                dueling: args.dueling,
                optimizer: args.optimizer,
                precision: args.precision,
                lr_decay,
                ..DqnConfig::default()
            },
            batch_size: args.batch_size,
            replay: ReplayOptions {
                capacity: args.replay_capacity,
                shards: args.replay_shards,
                samples_per_insert: args.samples_per_insert,
                tolerance: args.samples_per_insert_tolerance,
                learning_starts: args.learning_starts,
                frames_per_item: args.replay_frames_per_item,
                priority,
                prefetch_depth: args.sampling.prefetch_depth,
            },
            actors: ActorsConfig {
                count: actors,
                auto: (args.actors == Some(ActorCount::Auto)).then_some(AutoActors::Pending),
                envs_per_actor: args.envs_per_actor,
                batch_rows,
                n_step: args.n_step,
                gamma: args.gamma,
                epsilon,
                apex_epsilon: args.apex_epsilon,
            },
            learner: LoopConfig {
                publish_every: args.publish_every,
                report_every: crate::config::REPORT_EVERY,
                checkpoint_every: args.checkpoint_every_s.map(Duration::from_secs),
                max_nonfinite: args.max_nonfinite,
                copy_stream: args.copy_stream,
            },
            max_steps: args.max_steps,
            logdir,
            resume: args.resume,
            server,
            metrics_addr: args.metrics_addr,
            live_limit: std::time::Duration::try_from_secs_f64(args.live_limit_s)
                .context("--live-limit-s")?,
            faults,
            cpu_plan,
        };
        if cfg
            .population()
            .is_some_and(|p| matches!(p.agents, Agents::Sweep(_)))
        {
            // Each agent's settings against the flags', so a bad combination is one
            // clear line before anything starts.
            crate::run::population_agents(&cfg)?;
        }
        Ok(cfg)
    }
}
