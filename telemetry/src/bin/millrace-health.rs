//! `millrace-health`: the images' health probe. Asks a learner's or an actor's
//! `--metrics-addr` whether it is ready (`/healthz`) or, with `--live`, whether it
//! answers at all (`/livez`); exit status 0 when it is, 1 otherwise. The same check as
//! `learner health` and `actor health`, in a binary that links no libtorch and no
//! Python, so that a probe every few seconds costs milliseconds (`learner health`
//! spends about 0.25 s of CPU loading libtorch first).

use std::process::ExitCode;

use clap::Parser;
use millrace_telemetry::Probe;

fn main() -> ExitCode {
    let probe = Probe::parse();
    match probe.health.check() {
        Ok(body) => {
            println!("{}", body.trim());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!(
                "error: {}{}: {e}",
                probe.health.metrics_addr,
                probe.health.path()
            );
            ExitCode::FAILURE
        }
    }
}
