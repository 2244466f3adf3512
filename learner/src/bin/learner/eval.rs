//! `learner eval`: plays a saved policy and reports its returns, as text or JSON.

use std::process::ExitCode;

use anyhow::bail;
use millrace_learner::cli::Which;
use millrace_learner::{checkpoint, evaluation};

use crate::logging::init_logging;

/// How `learner eval` plays a saved policy.
pub(crate) struct EvalArgs<'a> {
    pub(crate) episodes: usize,
    pub(crate) seed: u64,
    pub(crate) json: bool,
    /// `--allow-env-module`.
    pub(crate) allowed: &'a [String],
}

pub(crate) fn eval_policy(
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
    let result = evaluation::evaluate(&p.env_config, &p.network, &params, episodes, seed)?;
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
