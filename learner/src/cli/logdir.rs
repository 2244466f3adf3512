//! Where a run writes, and what it continues: `--resume`, `--resume-if-present` and
//! `--logdir` checked together, and a directory that holds another run's files refused.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use super::TrainArgs;

/// Settles `--resume` (set by `--resume-if-present` when the log directory holds a
/// state to continue) and returns the log directory; refuses one that holds another
/// run's or population's files.
pub(super) fn resume_and_logdir(args: &mut TrainArgs, population: bool) -> anyhow::Result<PathBuf> {
    if args.resume_if_present && population {
        // A restarted container or a requeued job: the population goes on from its
        // log directory if it holds one, else it starts there.
        let logdir = args.logdir.clone().expect("clap: requires logdir");
        if std::fs::read_dir(logdir.join("agents")).is_ok_and(|mut d| d.next().is_some()) {
            tracing::info!(
                "--resume-if-present: continuing the population saved in {}",
                logdir.display()
            );
            args.resume = Some(logdir);
        } else if crate::checkpoint::Layout::new(logdir.join("checkpoint"))
            .latest()
            .join("meta.json")
            .exists()
        {
            bail!(
                "--resume-if-present: {} holds a single run, not a population; choose another --logdir",
                logdir.display()
            );
        }
    } else if args.resume_if_present {
        let root = args
            .logdir
            .as_ref()
            .expect("clap: requires logdir")
            .join("checkpoint");
        if crate::checkpoint::Layout::new(&root)
            .latest()
            .join("meta.json")
            .exists()
        {
            tracing::info!(
                "--resume-if-present: continuing the run saved in {}",
                root.display()
            );
            args.resume = Some(root);
        } else if root.exists() {
            same_run_started_again(&root, &args.env)?;
            tracing::warn!(
                "--resume-if-present: {} holds no saved state (the run stopped before its first checkpoint): starting the run again",
                root.display()
            );
        }
    }
    if let Some(path) = &args.resume {
        if !path.exists() {
            bail!("--resume {}: no such checkpoint", path.display());
        }
    }
    let logdir = match (&args.logdir, args.resume.as_ref().filter(|_| population)) {
        // A population resumes in its own log directory.
        (None, Some(dir)) => dir.clone(),
        (Some(dir), Some(resume))
            if std::fs::canonicalize(dir).ok() != std::fs::canonicalize(resume).ok() =>
        {
            bail!(
                "--resume {} continues the population in that log directory; --logdir {} names another",
                resume.display(),
                dir.display()
            );
        }
        (Some(dir), _) => dir.clone(),
        (None, None) => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            // `gym:MinAtar/Breakout-v1` -> `gym-MinAtar-Breakout-v1`.
            let name = args.env.replace([':', '/'], "-");
            PathBuf::from("runs").join(format!("{name}__{}__{now}", args.seed))
        }
    };
    if population {
        refuse_to_overwrite_population(&logdir, args.resume.is_some())?;
    } else {
        // --resume-if-present found no state to continue: this run is the one
        // that left the directory's other files, started again.
        if !args.resume_if_present {
            refuse_to_overwrite(&logdir, args.resume.as_deref())?;
        }
    }
    Ok(logdir)
}

/// A population's log directory holds its agents (`agents/`): a new population there
/// is refused, and `--resume` needs one to continue.
fn refuse_to_overwrite_population(logdir: &Path, resume: bool) -> anyhow::Result<()> {
    let agents = logdir.join("agents");
    let holds_agents = std::fs::read_dir(&agents).is_ok_and(|mut d| d.next().is_some());
    match (holds_agents, resume) {
        (true, false) => bail!(
            "--logdir {}: it already holds a population ({}); continue it with --resume {} (and the same flags and sweep), or choose another --logdir",
            logdir.display(),
            agents.display(),
            logdir.display()
        ),
        (false, true) => bail!(
            "--resume {}: no population to continue here (no agents/)",
            logdir.display()
        ),
        _ => Ok(()),
    }
}

/// `--resume-if-present` found a checkpoint directory with no state to continue: it is
/// this run's own, left by a start that stopped before its first checkpoint, only if it
/// holds no population and its saved configuration (if any) is of the same
/// environment; anything else is another run's, and is not overwritten.
fn same_run_started_again(root: &Path, env: &str) -> anyhow::Result<()> {
    let logdir = root.parent().unwrap_or(root);
    if std::fs::read_dir(logdir.join("agents")).is_ok_and(|mut d| d.next().is_some()) {
        bail!(
            "--resume-if-present: {} holds a population, not this run; choose another --logdir",
            logdir.display()
        );
    }
    let config = root.join("config.json");
    let Ok(text) = std::fs::read_to_string(&config) else {
        return Ok(());
    };
    let saved: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("--resume-if-present: {}", config.display()))?;
    match saved["env"]["id"].as_str() {
        Some(id) if id == env => Ok(()),
        other => bail!(
            "--resume-if-present: {} holds a run of {}, not {env}; choose another --logdir",
            logdir.display(),
            other.unwrap_or("an unknown environment")
        ),
    }
}

/// A run writes its checkpoint into `<logdir>/checkpoint`: refuse a directory that
/// already holds anything of another run's (its configuration or a saved policy count,
/// with or without a `latest/` state), unless this run continues it (`--resume` of that
/// same checkpoint).
fn refuse_to_overwrite(
    logdir: &std::path::Path,
    resume: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let layout = crate::checkpoint::Layout::new(logdir.join("checkpoint"));
    let root = &layout.root;
    let holds_something = std::fs::read_dir(root).is_ok_and(|mut d| d.next().is_some());
    if !holds_something {
        return Ok(());
    }
    let same = |p: &std::path::Path| {
        crate::checkpoint::Layout::find(p)
            .ok()
            .and_then(|l| std::fs::canonicalize(l.root).ok())
            == std::fs::canonicalize(root).ok()
    };
    if resume.is_some_and(same) {
        return Ok(());
    }
    let how = if layout.latest().join("meta.json").exists() {
        format!("continue that run with --resume {}, or ", root.display())
    } else {
        String::new()
    };
    bail!(
        "--logdir {}: it already holds a run's checkpoint ({}); {how}choose another --logdir",
        logdir.display(),
        root.display(),
    );
}
