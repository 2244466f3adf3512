//! `learner`: trains a DQN agent (embedded actors, remote actors with --listen, or
//! lock-step with --deterministic), and works on saved runs: `export`, `eval`, `merge`,
//! `doctor`.
//!
//! Exit status: 0 solved (or a subcommand succeeded), 2 the step budget ran out first,
//! 130 stopped by SIGINT/SIGTERM with a checkpoint written, 1 failed (one `error:` line).

mod eval;
mod logging;
mod saved;
mod train;

use std::process::ExitCode;

use millrace_learner::cli::Command;

use crate::eval::{eval_policy, EvalArgs};
use crate::saved::{doctor, export_policy, health, merge};
use crate::train::train;

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
