//! `actor`: runs environments for a remote learner (`learner --listen`).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use millrace_actor::remote::{self, RemoteConfig};

/// Run N environments with batched CPU inference and stream transitions to a learner.
///
/// The learner decides the environment, network and exploration; this process only says
/// how many environments it runs. It reconnects by itself when the learner goes away.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    /// Environment instances to run, stepped together with one forward pass.
    #[arg(long, short = 'n', default_value_t = 64)]
    n: usize,

    /// Learner address.
    #[arg(long, default_value = "127.0.0.1:7787")]
    learner: String,

    /// File holding the shared token (else the MILLRACE_TOKEN variable; none on loopback).
    #[arg(long)]
    token_file: Option<std::path::PathBuf>,

    /// Name in the learner's logs.
    #[arg(long)]
    name: Option<String>,

    /// Seed for environments and exploration.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

fn run(args: Args) -> anyhow::Result<()> {
    if args.n == 0 || args.n > 4096 {
        bail!("--n must be between 1 and 4096, got {}", args.n);
    }
    let mut cfg = RemoteConfig::new(args.learner.clone(), args.n);
    cfg.token = remote::read_token(args.token_file.as_deref())
        .context("--token-file")?
        .unwrap_or_default();
    cfg.seed = args.seed;
    if let Some(name) = &args.name {
        cfg.name = name.clone();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(async move {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            let _ = tokio::signal::ctrl_c().await;
            let _ = stop_tx.send(true);
        });
        remote::run(cfg, stop_rx).await
    })?;
    runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
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
