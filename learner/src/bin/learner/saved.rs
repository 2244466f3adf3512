//! The small subcommands: `export` and `merge` work on saved runs, `doctor` checks the
//! set-up, `health` asks a running learner.

use std::process::ExitCode;

use anyhow::{bail, Context};
use millrace_learner::cli::Which;
use millrace_learner::export;

use crate::logging::init_logging;

pub(crate) fn export_policy(
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

pub(crate) fn merge(root: &std::path::Path) -> anyhow::Result<ExitCode> {
    let merged = millrace_learner::shard_merge::merge(root)?;
    print!("{merged}");
    println!(
        "merged {} agents into {}",
        merged.agents.len(),
        root.join("population.csv").display()
    );
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn doctor() -> anyhow::Result<ExitCode> {
    let report = millrace_learner::doctor::report();
    print!("{report}");
    if report.failed() {
        bail!("the set-up is broken (see the failed checks above)");
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn health(args: &millrace_telemetry::HealthArgs) -> anyhow::Result<ExitCode> {
    let answer = args
        .check()
        .with_context(|| format!("{}{}", args.metrics_addr, args.path()))?;
    println!("{}", answer.trim());
    Ok(ExitCode::SUCCESS)
}
