//! `learner`: trains a DQN agent (embedded actors, remote actors with --listen, or
//! lock-step with --deterministic), and works on saved runs: `export`, `eval`, `merge`,
//! `doctor`.
//!
//! Exit status: 0 solved (or a subcommand succeeded), 2 the step budget ran out first,
//! 130 stopped by SIGINT/SIGTERM with a checkpoint written, 1 failed (one `error:` line).

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use millrace_core::handoff::Finished;
use millrace_learner::cli::{Command, TrainArgs, Which};
use millrace_learner::config::Mode;
use millrace_learner::{checkpoint, evaluation, export};

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

fn init_logging(bar: Option<ProgressBar>) {
    let writer = LogWriter(bar);
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(move || writer.clone())
        .init();
}

fn train(
    args: TrainArgs,
    env_defaults: &millrace_learner::env_defaults::Flags,
) -> anyhow::Result<ExitCode> {
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
    init_logging(bar.clone());
    if !env_defaults.is_empty() {
        let flags: Vec<String> = env_defaults
            .iter()
            .map(|(k, v)| format!("--{k} {v}"))
            .collect();
        let source = match args.preset {
            Some(p) => format!(
                "learner/hyperparams.toml's {} table and --preset {}",
                args.env,
                clap::ValueEnum::to_possible_value(&p)
                    .map_or_else(String::new, |v| v.get_name().to_string())
            ),
            None => format!("learner/hyperparams.toml's {} table", args.env),
        };
        tracing::info!(
            "settings from {source}, beneath the flags given: {}",
            flags.join(" ")
        );
    }
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
        .context("installing the SIGINT/SIGTERM handler")?;
    }
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
    // What fp32 means on this run's GPUs, as libtorch reads it back (a mismatch is an
    // error: the figures would not mean what the configuration says).
    let cuda = std::iter::once(&cfg.device)
        .chain(cfg.population().map_or(&[][..], |p| &p.devices))
        .any(|d| matches!(d, millrace_learner::config::DeviceChoice::Cuda(_)));
    if cuda {
        let math =
            millrace_core::torch_settings::apply(cfg.gpu_math.tf32, cfg.gpu_math.cudnn_benchmark)
                .map_err(|e| anyhow::anyhow!("--tf32 {}: {e}", cfg.gpu_math.tf32))?;
        tracing::info!("GPU math: {math} (--tf32 {})", cfg.gpu_math.tf32);
    }
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

fn health(args: &millrace_telemetry::HealthArgs) -> anyhow::Result<ExitCode> {
    let answer = args
        .check()
        .with_context(|| format!("{}{}", args.metrics_addr, args.path()))?;
    println!("{}", answer.trim());
    Ok(ExitCode::SUCCESS)
}

fn export_policy(
    checkpoint: &std::path::Path,
    which: Option<Which>,
    out: &std::path::Path,
) -> anyhow::Result<ExitCode> {
    init_logging(None);
    let e = export::export(checkpoint, which, out)?;
    let p = &e.policy;
    println!(
        "exported the {} policy of {} (parameters v{}, {} env steps, {} updates)",
        p.which.name(),
        p.env.id,
        p.params_version,
        p.env_steps,
        p.updates
    );
    println!("  weights:     {}", e.weights.display());
    println!("  description: {}", e.description.display());
    Ok(ExitCode::SUCCESS)
}

/// How `learner eval` plays a saved policy.
struct EvalArgs<'a> {
    episodes: usize,
    seed: u64,
    json: bool,
    /// `--allow-env-module`.
    allowed: &'a [String],
}

fn eval_policy(
    checkpoint: &std::path::Path,
    which: Option<Which>,
    args: &EvalArgs,
) -> anyhow::Result<ExitCode> {
    let EvalArgs {
        episodes,
        seed,
        json,
        allowed,
    } = *args;
    init_logging(None);
    if episodes == 0 {
        bail!("--episodes must be at least 1");
    }
    let p = checkpoint::load_policy(checkpoint, which)?;
    // The checkpoint's config.json names the environment; only this command line
    // decides what Python imports to build it.
    millrace_proto::env::check_modules_allowed(&p.env_config, allowed, "--allow-env-module")
        .map_err(|e| anyhow::anyhow!("{}: {e}", checkpoint.display()))?;
    let params = millrace_proto::Params {
        version: p.params_version,
        env_steps: p.env_steps,
        updates: p.updates,
        population: p.network.population,
        data: p.online.clone(),
    };
    let result = evaluation::evaluate(&p.env_config, &p.network, &params, episodes, seed)
        .map_err(anyhow::Error::msg)?;
    let rec = evaluation::EvalRecord::new(&params, seed, &result);
    if json {
        let out = serde_json::json!({
            "env": p.env.id,
            "which": p.which.name(),
            "params_version": p.params_version,
            "episodes": rec.episodes,
            "seed": seed,
            "mean": rec.mean,
            "std": rec.std,
            "stderr": rec.stderr,
            "min": rec.min,
            "max": rec.max,
            "returns": result.returns,
        });
        println!("{out}");
    } else {
        println!(
            "the {} policy of {} from {} (parameters v{}, {} env steps, {} updates)",
            p.which.name(),
            p.env.id,
            p.dir.display(),
            p.params_version,
            p.env_steps,
            p.updates
        );
        if let Some(saved) = &p.eval {
            println!("  when saved:  {saved}");
        }
        println!("  millrace:    {rec} (seed {seed})");
    }
    Ok(ExitCode::SUCCESS)
}

fn merge(root: &std::path::Path) -> anyhow::Result<ExitCode> {
    let merged = millrace_learner::shard_merge::merge(root)?;
    print!("{merged}");
    println!(
        "merged {} agents into {}",
        merged.agents.len(),
        root.join("population.csv").display()
    );
    Ok(ExitCode::SUCCESS)
}

fn doctor() -> anyhow::Result<ExitCode> {
    let report = millrace_learner::doctor::report();
    print!("{report}");
    if report.failed() {
        bail!("the set-up is broken (see the failed checks above)");
    }
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let parsed = millrace_learner::env_defaults::parse(&argv).unwrap_or_else(|e| e.exit());
    let args = parsed.args;
    let result = match args.command {
        None => train(args.train, &parsed.applied),
        Some(Command::Export { policy, out }) => policy
            .checkpoint_dir()
            .and_then(|c| export_policy(&c, policy.which, &out)),
        Some(Command::Eval {
            policy,
            episodes,
            seed,
            json,
            allow_env_modules,
        }) => policy.checkpoint_dir().and_then(|c| {
            eval_policy(
                &c,
                policy.which,
                &EvalArgs {
                    episodes,
                    seed,
                    json,
                    allowed: &allow_env_modules,
                },
            )
        }),
        Some(Command::Merge { logdir }) => merge(&logdir),
        Some(Command::Doctor) => doctor(),
        Some(Command::Health(h)) => health(&h),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
