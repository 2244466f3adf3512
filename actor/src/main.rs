//! `actor`: runs environments for a remote learner (`learner --listen`).
//!
//! Exit status: 0 when the learner says the run is finished, or when stopped by SIGINT
//! or SIGTERM; 1 on errors, a permanent refusal by the learner among them (wrong token,
//! another protocol version, an environment this actor cannot run).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use millrace_actor::remote::{self, Finished, RemoteConfig};
use millrace_proto::wire::MAX_ENVS_PER_ACTOR;

/// Run N environments with batched CPU inference and stream transitions to a learner.
///
/// The learner decides the environment, network and exploration; this process only says
/// how many environments it runs. It reconnects by itself when the learner goes away or
/// restarts, and exits 0 when the learner says the run is over.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None, args_conflicts_with_subcommands = true)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,

    /// Environment instances to run, stepped together with one forward pass.
    #[arg(long, short = 'n', default_value_t = 64)]
    n: usize,

    /// Learner address.
    #[arg(long, default_value = "127.0.0.1:7787")]
    learner: String,

    /// File holding the shared token (else the MILLRACE_TOKEN variable; none on loopback).
    #[arg(long)]
    token_file: Option<PathBuf>,

    /// Name in the learner's logs (default: this host's name and the process id).
    #[arg(long)]
    name: Option<String>,

    /// Seed for environments and exploration.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Check that a learner could run here: finds libtorch, loads it as the learner
    /// would, checks its version and the NVIDIA driver against its CUDA build, and
    /// explains anything missing. Exit status 1 when the set-up is broken.
    Doctor {
        /// libtorch's `lib` directory (default: $LIBTORCH/lib, the project virtualenv,
        /// then beside this binary).
        #[arg(long)]
        libtorch: Option<PathBuf>,
    },
}

/// This machine's host name, for the default actor name (containers: the container's).
fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
}

/// Turns SIGINT and SIGTERM (what `docker stop` and Kubernetes send) into a stop request.
async fn stop_on_signal(stop: tokio::sync::watch::Sender<bool>) {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    match term {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
                _ = term.recv() => tracing::info!("SIGTERM: stopping"),
            }
        }
        Err(e) => {
            tracing::warn!("cannot watch for SIGTERM ({e}); only SIGINT stops this actor");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    let _ = stop.send(true);
}

fn run(args: Args) -> anyhow::Result<()> {
    if let Some(Command::Doctor { libtorch }) = &args.command {
        let mut report = millrace_actor::doctor::libtorch_checks(
            &millrace_actor::doctor::libtorch_candidates(libtorch.as_deref()),
        );
        report.0.extend(millrace_actor::doctor::bridge_checks().0);
        print!("{report}");
        if report.failed() {
            bail!("the set-up is broken (see the failed checks above)");
        }
        return Ok(());
    }
    if args.n == 0 || args.n > MAX_ENVS_PER_ACTOR as usize {
        bail!(
            "--n must be between 1 and {MAX_ENVS_PER_ACTOR}, got {}",
            args.n
        );
    }
    let mut cfg = RemoteConfig::new(args.learner.clone(), args.n);
    cfg.token = remote::read_token(args.token_file.as_deref())
        .context("--token-file")?
        .unwrap_or_default();
    cfg.seed = args.seed;
    cfg.name = match &args.name {
        Some(name) => name.clone(),
        None => match hostname() {
            Some(host) => format!("{host}-{}", std::process::id()),
            None => cfg.name,
        },
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let outcome = runtime.block_on(async move {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(stop_on_signal(stop_tx));
        remote::run(cfg, stop_rx).await
    });
    runtime.shutdown_timeout(Duration::from_secs(1));
    match outcome? {
        Finished::Stopped => tracing::info!("stopped"),
        Finished::RunFinished(message) => tracing::info!("the run is finished: {message}"),
    }
    Ok(())
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
