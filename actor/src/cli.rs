//! The `actor` binary's flags, here rather than in `main.rs` so that tests can check
//! what deployments pass it (docker-compose, Kubernetes) against the real parser.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Run N environments with batched CPU inference and stream transitions to a learner.
///
/// The learner decides the environment, network and exploration; this process only says
/// how many environments it runs. It reconnects by itself when the learner goes away or
/// restarts, and exits 0 when the learner says the run is over.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None, args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Environment instances to run, stepped together with one forward pass.
    #[arg(long, short = 'n', default_value_t = 64)]
    pub n: usize,

    /// Learner address.
    #[arg(long, default_value = "127.0.0.1:7787")]
    pub learner: String,

    /// File holding the shared token (else the MILLRACE_TOKEN variable; none on loopback).
    #[arg(long)]
    pub token_file: Option<PathBuf>,

    /// Name in the learner's logs (default: this host's name and the process id).
    #[arg(long)]
    pub name: Option<String>,

    /// Seed for environments and exploration.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// A Python package the learner may have this actor import to build a `gym:`
    /// environment (its --env-module, or the `pkg` of a `gym:pkg:Env` id); submodules
    /// included. Repeatable. None by default: a learner naming any other is refused.
    #[arg(long = "allow-env-module", value_name = "PKG")]
    pub allow_env_modules: Vec<String>,

    /// Serve Prometheus metrics (GET /metrics) and health (/healthz: 200 while
    /// connected to a learner; /livez) on this address, e.g. 0.0.0.0:9101.
    #[arg(long)]
    pub metrics_addr: Option<std::net::SocketAddr>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Check that a learner could run here: finds libtorch, loads it as the learner
    /// would, checks its version and the NVIDIA driver against its CUDA build, and
    /// explains anything missing. Exit status 1 when the set-up is broken.
    Doctor {
        /// libtorch's `lib` directory (default: $LIBTORCH/lib, the project virtualenv,
        /// then beside this binary).
        #[arg(long)]
        libtorch: Option<PathBuf>,
    },
    /// Ask an actor's --metrics-addr whether it is connected to a learner (or, with
    /// --live, whether it answers at all), for container health checks and probes.
    /// Exit status 0 when it is, 1 otherwise.
    Health(millrace_telemetry::HealthArgs),
}
