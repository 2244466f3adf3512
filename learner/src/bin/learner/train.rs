//! `learner` without a subcommand: check the flags into a configuration, take the run's
//! lock, install the signal handler, apply the GPU's math settings, and train (one
//! agent or a population).

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use millrace_core::handoff::Finished;
use millrace_learner::checkpoint;
use millrace_learner::cli::TrainArgs;
use millrace_learner::config::Mode;

use crate::logging::{init_logging, progress_bar};

pub(crate) fn train(
    args: TrainArgs,
    env_defaults: &millrace_learner::env_defaults::Flags,
) -> anyhow::Result<ExitCode> {
    let bar = progress_bar(args.max_steps, args.no_progress);
    init_logging(bar.clone());
    log_defaults(&args, env_defaults);
    let restarted = args.resume_if_present;
    let cfg = args.into_config()?;
    // This thread and every thread started from here that does not pin itself (the
    // run lock's, the metrics server's, the signal handler's) on the service CPUs.
    millrace_learner::cpu_plan::host::enter(
        &cfg.cpu_plan,
        millrace_learner::cpu_plan::host::Role::Service,
    );
    // One learner per log directory, from here to the end of the run.
    let _lock = millrace_learner::run_lock::RunLock::acquire(&cfg.logdir)?;
    if restarted {
        if let Some(code) = already_finished(&cfg)? {
            return Ok(code);
        }
    }
    // Bound before anything starts, so a taken port is one error line.
    let monitor = match cfg.metrics_addr {
        Some(addr) => Some(
            millrace_telemetry::start(addr, "the learner is starting")
                .with_context(|| format!("--metrics-addr {addr}: cannot listen"))?,
        ),
        None => None,
    };
    let interrupt = interrupt_flag()?;
    tracing::info!(
        "training {} on {} (CUDA available: {}, {} device(s)){}: {} actor(s) x {} envs, network {:?} (--hidden {:?} for an MLP)",
        cfg.env.id,
        cfg.device,
        tch::Cuda::is_available(),
        tch::Cuda::device_count(),
        if cfg.mode == Mode::LockStep {
            ", lock-step"
        } else {
            ""
        },
        match cfg.actors.auto {
            Some(_) => "auto (decided at start)".to_string(),
            None => cfg.actors.count.to_string(),
        },
        cfg.actors.envs_per_actor,
        cfg.network,
        cfg.hidden
    );
    apply_gpu_math(&cfg)?;
    let population = cfg.population().is_some();
    let saved_as = if population {
        // Each agent's, with its sweep settings applied.
        cfg.logdir.join("agents/agent-NNN/checkpoint/config.json")
    } else {
        cfg.checkpoint_dir().join("config.json")
    };
    tracing::info!(
        "effective configuration (the run saves it as {}):\n{}",
        saved_as.display(),
        cfg.to_json()
    );
    let endpoint = monitor.as_ref().map(|(e, _)| Arc::clone(e));
    if population {
        let summary = millrace_learner::run_population(&cfg, interrupt, endpoint)?;
        print!("{summary}");
        return Ok(ExitCode::from(summary.exit_code()));
    }
    let summary = millrace_learner::run(&cfg, interrupt, bar, endpoint)?;
    print!("{summary}");
    Ok(ExitCode::from(summary.reason.exit_code()))
}

/// Says which flags `learner/hyperparams.toml` (and `--preset`) set beneath the ones
/// given.
fn log_defaults(args: &TrainArgs, env_defaults: &millrace_learner::env_defaults::Flags) {
    if env_defaults.is_empty() {
        return;
    }
    let flags: Vec<String> = env_defaults
        .iter()
        .map(|(k, v)| format!("--{k} {v}"))
        .collect();
    let table = format!("learner/hyperparams.toml's {} table", args.env);
    let source = match args.preset {
        Some(p) => format!(
            "{table} and --preset {}",
            clap::ValueEnum::to_possible_value(&p)
                .map_or_else(String::new, |v| v.get_name().to_string())
        ),
        None => table,
    };
    tracing::info!(
        "settings from {source}, beneath the flags given: {}",
        flags.join(" ")
    );
}

/// The flag SIGINT and SIGTERM raise: the first stops the run cleanly (checkpoint
/// included); a second one exits at once.
fn interrupt_flag() -> anyhow::Result<Arc<AtomicBool>> {
    let interrupt = Arc::new(AtomicBool::new(false));
    let raised = Arc::clone(&interrupt);
    ctrlc::set_handler(move || {
        if raised.swap(true, Ordering::Relaxed) {
            std::process::exit(130);
        }
    })
    .context("installing the SIGINT/SIGTERM handler")?;
    Ok(interrupt)
}

/// What fp32 means on this run's GPUs, as libtorch reads it back (a mismatch is an
/// error: the figures would not mean what the configuration says). Nothing without a
/// GPU.
fn apply_gpu_math(cfg: &millrace_learner::RunConfig) -> anyhow::Result<()> {
    let cuda = std::iter::once(&cfg.device)
        .chain(cfg.population().map_or(&[][..], |p| &p.devices))
        .any(|d| matches!(d, millrace_learner::config::DeviceChoice::Cuda(_)));
    if cuda {
        let math =
            millrace_core::torch_settings::apply(cfg.gpu_math.tf32, cfg.gpu_math.cudnn_benchmark)
                .map_err(|e| anyhow::anyhow!("--tf32 {}: {e}", cfg.gpu_math.tf32))?;
        tracing::info!("GPU math: {math} (--tf32 {})", cfg.gpu_math.tf32);
    }
    Ok(())
}

/// A run restarted with `--resume-if-present` (a container's, a Job's pod) that already
/// ended for good is not trained again: solved, or out of the steps this invocation
/// allows. Says so; exit 0, so that a restart policy does not start it over and over.
/// (An explicit `--resume` continues as asked, e.g. towards a higher target.)
fn already_finished(cfg: &millrace_learner::RunConfig) -> anyhow::Result<Option<ExitCode>> {
    let Some(path) = &cfg.resume else {
        return Ok(None);
    };
    if cfg.population().is_some() {
        return Ok(None);
    }
    let meta = checkpoint::load_state_meta(path)?;
    if meta.env.id != cfg.env.id {
        // Not this run's state: resuming refuses it, saying so (checkpoint::check_fits).
        return Ok(None);
    }
    let done = match meta.run_finished {
        Some(Finished::Solved) => true,
        Some(Finished::MaxSteps) => meta.env_steps >= cfg.max_steps,
        None => false,
    };
    if !done {
        return Ok(None);
    }
    let how = meta
        .run_finished
        .map_or_else(String::new, |f| f.to_string());
    tracing::info!(
        "the run in {} is already finished ({how} at {} env steps, parameters v{}): nothing to do",
        path.display(),
        meta.env_steps,
        meta.params_version
    );
    println!(
        "already finished: {how} at {} env steps (parameters v{}); checkpoint {}",
        meta.env_steps,
        meta.params_version,
        path.display()
    );
    Ok(Some(ExitCode::SUCCESS))
}
