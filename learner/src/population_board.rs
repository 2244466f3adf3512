//! A population's TensorBoard runs: the log directory's own event file holds the
//! HParams experiment (every setting an agent has, the metrics to compare), and each
//! agent is a run of its own (`agents/agent-NNN`) whose session start records its
//! settings and configuration, with its evaluations as scalars and, when it ends, its
//! results and how it ended. TensorBoard's HParams view then lists the agents as a
//! table, seeds of one configuration grouped.
//!
//! Agents' files are opened for each write and closed again (evaluations are seconds
//! apart): a sweep of thousands of agents keeps no file open.

use std::path::{Path, PathBuf};

use crate::population_results::{AgentEnd, AgentResult, AgentSetup};
use crate::tensorboard::{self, Event, Summary};
use crate::tensorboard_hparams::{self as hparams, HValue, Status};
use millrace_core::dqn::agents::AgentHparams;

/// The metrics the HParams view compares: each agent's last value of these tags.
const METRICS: [(&str, &str); 5] = [
    (
        "eval/mean_return",
        "the latest greedy evaluation's mean return",
    ),
    ("result/best_eval", "the best evaluation's mean return"),
    (
        "result/env_steps",
        "env steps when the agent ended (solved: of the solving parameters)",
    ),
    (
        "result/solved",
        "1 if the agent reached its target, confirmed",
    ),
    (
        "result/wall_s",
        "seconds from the start of the run to the agent's end",
    ),
];

/// An agent's settings as HParams: its configuration's number and seed, then every
/// per-agent setting the run has ([`crate::per_agent::hparams`]): the numbers as
/// numbers, the rest as text. The Munchausen columns (the agent's own settings, else
/// the run's) are there under `--target munchausen`, the IQN ones with `--head iqn`,
/// `priority_alpha` with prioritized replay: every agent of a run has the same columns.
pub fn settings(
    config: usize,
    hp: &AgentHparams,
    setup: &AgentSetup,
) -> Vec<(&'static str, HValue)> {
    let mut out = vec![
        ("config", HValue::Number(config as f64)),
        ("seed", HValue::Number(hp.seed as f64)),
    ];
    out.extend(crate::per_agent::hparams(hp, setup));
    out
}

/// Writes the experiment into the log directory's own event file: the settings of
/// `example` name the hyperparameters and their types.
pub fn experiment(
    logdir: &Path,
    name: &str,
    example: &[(&'static str, HValue)],
) -> std::io::Result<()> {
    std::fs::create_dir_all(logdir)?;
    let event = Event::at(
        0,
        hparams::experiment(name, example, &METRICS, tensorboard::now()),
    );
    tensorboard::append(&logdir.join(tensorboard::file_name()), &[event])
}

/// One agent's run.
#[derive(Debug)]
pub struct AgentBoard {
    path: PathBuf,
}

impl AgentBoard {
    /// Starts the agent's run in `dir` with its settings, in its configuration's group.
    pub fn create(
        dir: &Path,
        config: usize,
        settings: &[(&'static str, HValue)],
    ) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let board = Self {
            path: dir.join(tensorboard::file_name()),
        };
        let start =
            hparams::session_start(settings, &format!("config-{config}"), tensorboard::now());
        tensorboard::append(&board.path, &[Event::at(0, start)])?;
        Ok(board)
    }

    /// Goes on with the agent's run in `dir` (a resumed agent: its session started in
    /// an earlier file).
    pub fn resume(dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        Ok(Self {
            path: dir.join(tensorboard::file_name()),
        })
    }

    /// Scalars at `env_steps`.
    pub fn scalars(&self, env_steps: u64, values: &[(&str, f64)]) -> std::io::Result<()> {
        tensorboard::append(
            &self.path,
            &[Event::at(env_steps, Summary::scalars(values))],
        )
    }

    /// The agent's results, and its session's end.
    pub fn end(&self, result: &AgentResult) -> std::io::Result<()> {
        let solved = result.end == AgentEnd::Solved;
        let nan = f64::NAN;
        let values = [
            ("result/best_eval", result.best_eval.map_or(nan, f64::from)),
            ("result/env_steps", result.env_steps as f64),
            ("result/solved", f64::from(u8::from(solved))),
            ("result/wall_s", result.wall_s),
        ];
        let status = match result.end {
            AgentEnd::Solved | AgentEnd::Budget => Status::Success,
            AgentEnd::Diverged | AgentEnd::Interrupted => Status::Failure,
        };
        tensorboard::append(
            &self.path,
            &[
                Event::at(result.env_steps, Summary::scalars(&values)),
                Event::at(
                    result.env_steps,
                    hparams::session_end(status, tensorboard::now()),
                ),
            ],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::population_results::{example_agent, AgentEnd};
    use millrace_core::dqn::iqn::IqnSampling;
    use millrace_core::dqn::Munchausen;

    fn names(s: &[(&'static str, HValue)]) -> Vec<&'static str> {
        s.iter().map(|(k, _)| *k).collect()
    }

    fn number(s: &[(&'static str, HValue)], name: &str) -> f64 {
        match s.iter().find(|(k, _)| *k == name) {
            Some((_, HValue::Number(x))) => *x,
            other => panic!("{name}: {other:?}"),
        }
    }

    #[test]
    fn munchausen_and_iqn_columns_are_there_only_when_the_run_has_them() {
        let a = example_agent(0, AgentEnd::Solved);
        let plain = settings(0, &a.hparams, &a.setup);
        assert!(!names(&plain)
            .iter()
            .any(|k| k.starts_with("munchausen") || k.starts_with("iqn")));

        // The run's Munchausen settings and IQN fractions.
        let mut setup = a.setup.clone();
        setup.munchausen = Some(Munchausen::default());
        setup.iqn = Some(IqnSampling {
            online: 8,
            target: 16,
            kappa: 1.0,
        });
        let run = settings(0, &a.hparams, &setup);
        assert_eq!(number(&run, "munchausen_tau"), 0.03);
        assert_eq!(number(&run, "munchausen_alpha"), 0.9);
        assert_eq!(number(&run, "munchausen_clip"), -1.0);
        assert_eq!(number(&run, "iqn_taus"), 8.0);
        assert_eq!(number(&run, "iqn_target_taus"), 16.0);

        // An agent's own (a sweep's) outrank the run's, in the same columns.
        let mut hp = a.hparams;
        hp.munchausen = Some(Munchausen {
            tau: 0.1,
            ..Munchausen::default()
        });
        let own = settings(0, &hp, &setup);
        assert_eq!(names(&own), names(&run));
        assert_eq!(number(&own, "munchausen_tau"), 0.1);
    }
}
