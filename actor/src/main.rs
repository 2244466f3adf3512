//! `actor`: runs environments for a remote learner (`learner --listen`).
//!
//! Exit status: 0 when the learner says the run is finished, or when stopped by SIGINT
//! or SIGTERM; 1 on errors, a permanent refusal by the learner among them (wrong token,
//! another protocol version, an environment this actor cannot run).

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use millrace_actor::cli::{Args, Command};
use millrace_actor::remote::{self, Finished, RemoteConfig};
use millrace_proto::wire::MAX_ENVS_PER_ACTOR;

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

/// This actor's `--metrics-addr` endpoint and the thread that refreshes its page and
/// readiness (connected to a learner) every [`REFRESH`]; dropping it stops both.
struct Monitor {
    stop: Arc<AtomicBool>,
    refresher: Option<std::thread::JoinHandle<()>>,
    _server: millrace_telemetry::ServerHandle,
}

const REFRESH: Duration = Duration::from_millis(500);

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.refresher.take() {
            let _ = t.join();
        }
    }
}

fn serve_metrics(addr: std::net::SocketAddr, cfg: &RemoteConfig) -> anyhow::Result<Monitor> {
    let (endpoint, server) = millrace_telemetry::start(addr, "not connected to a learner yet")
        .with_context(|| format!("--metrics-addr {addr}: cannot listen"))?;
    let (status, name, envs) = (Arc::clone(&cfg.status), cfg.name.clone(), cfg.envs);
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = Arc::clone(&stop);
    let refresher = std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            while !stopping.load(Ordering::Relaxed) {
                endpoint.publish(status.page(&name, envs));
                if status.is_connected() {
                    endpoint.set_ready();
                } else {
                    endpoint.set_not_ready("not connected to a learner");
                }
                std::thread::sleep(REFRESH);
            }
        })
        .context("starting the metrics thread")?;
    Ok(Monitor {
        stop,
        refresher: Some(refresher),
        _server: server,
    })
}

fn run(args: Args) -> anyhow::Result<()> {
    if let Some(Command::Doctor { libtorch }) = &args.command {
        let mut report = millrace_probe::libtorch_checks(&millrace_probe::libtorch_candidates(
            libtorch.as_deref(),
        ));
        report.0.extend(millrace_actor::doctor::bridge_checks().0);
        print!("{report}");
        if report.failed() {
            bail!("the set-up is broken (see the failed checks above)");
        }
        return Ok(());
    }
    if let Some(Command::Health(h)) = &args.command {
        let answer = h
            .check()
            .with_context(|| format!("{}{}", h.metrics_addr, h.path()))?;
        println!("{}", answer.trim());
        return Ok(());
    }
    if args.n == 0 || args.n > MAX_ENVS_PER_ACTOR as usize {
        bail!(
            "--n must be between 1 and {MAX_ENVS_PER_ACTOR}, got {}",
            args.n
        );
    }
    let mut cfg = RemoteConfig::new(args.learner.clone(), args.n);
    cfg.allowed_modules = args.allow_env_modules.clone();
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
    let _monitor = match args.metrics_addr {
        Some(addr) => Some(serve_metrics(addr, &cfg)?),
        None => None,
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
