//! What a population run reports: one row per agent (its hyperparameters, how it
//! ended, env steps and wall time to its target, final and best evaluations), the
//! mean and a 95% interval over the seeds of the configuration, printed and as CSV.

use std::fmt;
use std::path::Path;

use millrace_actor::EpsilonSchedule;
use serde::{Deserialize, Serialize};

use crate::config::RunConfig;
use crate::shard::Shard;
use millrace_core::dqn::agents::AgentHparams;
use millrace_core::dqn::{Bootstrap, Munchausen, TargetUpdate};

/// An agent's settings besides its [`AgentHparams`]: how its actors acted and the
/// shape and pace of its update (a sweep's values, or the flags').
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentSetup {
    pub gamma: f32,
    pub n_step: usize,
    pub epsilon: EpsilonSchedule,
    pub batch_size: usize,
    pub hidden: Vec<usize>,
    pub samples_per_insert: f64,
    /// The IQN head's sampled fractions, where the run has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iqn: Option<millrace_core::dqn::iqn::IqnSampling>,
    /// The run's Munchausen settings (`--munchausen-*`), under `--target munchausen`;
    /// an agent's own, from a sweep, are its [`AgentHparams::munchausen`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub munchausen: Option<Munchausen>,
    /// Prioritized replay's α, where the agent's replay is prioritized.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_alpha: Option<f64>,
}

impl AgentSetup {
    pub fn of(cfg: &RunConfig) -> Self {
        Self {
            gamma: cfg.actors.gamma,
            n_step: cfg.actors.n_step,
            epsilon: cfg.actors.epsilon,
            batch_size: cfg.batch_size,
            hidden: cfg.hidden.clone(),
            samples_per_insert: cfg.replay.samples_per_insert,
            iqn: cfg.iqn.map(|_| cfg.dqn.iqn),
            munchausen: match cfg.dqn.bootstrap {
                Bootstrap::Munchausen(m) => Some(m),
                Bootstrap::Double => None,
            },
            priority_alpha: cfg.replay.priority.as_ref().map(|p| p.alpha),
        }
    }
}

/// How an agent's training ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentEnd {
    /// Its target return, confirmed on fresh episodes.
    Solved,
    /// Its step budget ran out first.
    Budget,
    /// Its loss stopped being finite; the others went on.
    Diverged,
    /// The run was interrupted before it ended.
    Interrupted,
}

/// One agent's outcome (`result.json` in its directory once it ended).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentResult {
    pub agent: usize,
    /// Its configuration (a sweep's grid point and draw; 0 for `--population K`).
    pub config: usize,
    /// Its configuration's values as its sweep file gave them (empty for
    /// `--population K`).
    pub label: String,
    pub hparams: AgentHparams,
    pub setup: AgentSetup,
    pub end: AgentEnd,
    /// Env steps when it ended (for a solved agent: those of the solving snapshot).
    pub env_steps: u64,
    /// Seconds from the start of the run to its end.
    pub wall_s: f64,
    pub final_eval: Option<f32>,
    pub best_eval: Option<f32>,
}

/// Every agent's outcome, and the run's (`population.json` beside `population.csv`).
#[derive(Debug, Serialize, Deserialize)]
pub struct PopulationSummary {
    pub env: String,
    pub agents: Vec<AgentResult>,
    pub wall_s: f64,
    pub updates: u64,
    pub target: Option<f32>,
    /// Seconds spent stepping actors, in stacked updates, and evaluating, summed over
    /// the threads the agents trained on.
    pub split: [f64; 3],
    /// Groups of agents that share an update's shapes and pace (one after another on
    /// each thread), and the threads.
    pub groups: usize,
    pub threads: usize,
    /// Most agents that trained at once.
    pub concurrent: usize,
    /// Agents in the whole population or sweep; with `shard`, `agents` holds only the
    /// shard's.
    pub total_agents: usize,
    /// The part of the population this run trained (`--shard I/N`), if only a part.
    #[serde(default)]
    pub shard: Option<Shard>,
    /// A shard's [`Shard::fingerprint`]: every shard of one split has the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
}

/// Mean and half-width of a 95% confidence interval (Student's t) of `xs`.
pub fn mean_ci95(xs: &[f64]) -> Option<(f64, f64)> {
    let n = xs.len();
    if n == 0 {
        return None;
    }
    let mean = xs.iter().sum::<f64>() / n as f64;
    if n == 1 {
        return Some((mean, f64::NAN));
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    Some((mean, t95(n - 1) * (var / n as f64).sqrt()))
}

/// Student's t quantile at 0.975 for `df` degrees of freedom.
fn t95(df: usize) -> f64 {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::NAN,
        d if d <= 30 => TABLE[d - 1],
        d if d <= 60 => 2.000 + (2.042 - 2.000) * (60 - d) as f64 / 30.0,
        d if d <= 120 => 1.980 + (2.000 - 1.980) * (120 - d) as f64 / 60.0,
        _ => 1.960,
    }
}

/// A target rule as `hard/PERIOD` or `polyak/TAU`.
pub fn target_rule(t: &TargetUpdate) -> String {
    match t {
        TargetUpdate::Hard { period } => format!("hard/{period}"),
        TargetUpdate::Polyak { tau } => format!("polyak/{tau}"),
    }
}

fn opt(x: Option<f32>) -> String {
    x.map_or_else(|| "n/a".into(), |v| format!("{v:.1}"))
}

impl PopulationSummary {
    /// Agents that reached their target.
    pub fn solved(&self) -> usize {
        self.agents
            .iter()
            .filter(|a| a.end == AgentEnd::Solved)
            .count()
    }

    /// 0 when every agent solved, 2 when some ran out of steps (or diverged), 130 when
    /// interrupted: as a single run's statuses. A shard (`--shard`) exits 0 once all its
    /// agents have ended, solved or not: an array task that finished its part
    /// succeeded (so that Slurm's `afterok` and a Kubernetes Indexed Job count it
    /// done), and `learner merge` exits 0 or 2 for the whole population.
    pub fn exit_code(&self) -> u8 {
        if self.agents.iter().any(|a| a.end == AgentEnd::Interrupted) {
            130
        } else if self.shard.is_some() || self.solved() == self.agents.len() {
            0
        } else {
            2
        }
    }

    /// The table as CSV (one row per agent), a column per per-agent setting
    /// ([`crate::per_agent`]): the Munchausen columns are an agent's own settings (a
    /// sweep's; empty for the run's `--munchausen-*`), the IQN ones the fractions its
    /// update sampled (empty without an IQN head), `priority_alpha` its replay's α
    /// (empty for uniform replay).
    pub fn to_csv(&self) -> String {
        let mut out = format!(
            "agent,config,seed,{},end,env_steps,wall_s,final_eval,best_eval\n",
            crate::per_agent::csv_header().join(",")
        );
        for a in &self.agents {
            out.push_str(&format!(
                "{},{},{},{},{},{},{:.3},{},{}\n",
                a.agent,
                a.config,
                a.hparams.seed,
                crate::per_agent::csv_cells(&a.hparams, &a.setup).join(","),
                serde_json::to_value(a.end)
                    .ok()
                    .and_then(|v| v.as_str().map(String::from))
                    .unwrap_or_default(),
                a.env_steps,
                a.wall_s,
                a.final_eval.map_or(String::new(), |v| v.to_string()),
                a.best_eval.map_or(String::new(), |v| v.to_string()),
            ));
        }
        out
    }

    /// Writes `population.csv` and `population.json` into `dir`, each atomically (a
    /// temporary file renamed into place); returns the CSV's path.
    pub fn write(&self, dir: &Path) -> std::io::Result<std::path::PathBuf> {
        let json = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        atomic_write(&dir.join("population.json"), json.as_bytes())?;
        let csv = dir.join("population.csv");
        atomic_write(&csv, self.to_csv().as_bytes())?;
        Ok(csv)
    }

    /// Reads a `population.json` that [`write`](Self::write) wrote.
    pub fn read(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    }
}

fn atomic_write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

impl fmt::Display for PopulationSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "population of {} on {}: {} solved (target {}), {:.1} s, {} stacked updates",
            self.agents.len(),
            self.env,
            self.solved(),
            opt(self.target),
            self.wall_s,
            self.updates
        )?;
        let [act, update, eval] = self.split;
        writeln!(
            f,
            "  {} group(s) on {} thread(s), up to {} agents at once; time summed over threads: {act:.1} s acting, {update:.1} s in stacked updates, {eval:.1} s evaluating",
            self.groups, self.threads, self.concurrent
        )?;
        if let Some(shard) = self.shard {
            writeln!(
                f,
                "  shard {shard} of a population of {} (`learner merge` combines the shards)",
                self.total_agents
            )?;
        }
        writeln!(
            f,
            "  {:>5} {:>6} {:>20} {:>9} {:>6} {:>12} {:>10} {:>10} {:>8} {:>8}",
            "agent", "config", "seed", "lr", "clip", "target", "end", "env steps", "wall s", "best"
        )?;
        for a in &self.agents {
            let h = &a.hparams;
            writeln!(
                f,
                "  {:>5} {:>6} {:>20} {:>9.2e} {:>6.3} {:>12} {:>10} {:>10} {:>8.1} {:>8}",
                a.agent,
                a.config,
                h.seed,
                h.lr,
                h.max_grad_norm,
                target_rule(&h.target),
                format!("{:?}", a.end).to_lowercase(),
                a.env_steps,
                a.wall_s,
                opt(a.best_eval)
            )?;
        }
        // The configurations present (a merged file's numbers are not trusted to be
        // dense).
        let configs: std::collections::BTreeSet<usize> =
            self.agents.iter().map(|a| a.config).collect();
        let several = configs.len() > 1;
        for config in configs {
            let mine: Vec<&AgentResult> =
                self.agents.iter().filter(|a| a.config == config).collect();
            let Some(first) = mine.first() else {
                continue;
            };
            if several {
                writeln!(f, "  configuration {config} ({}):", first.label)?;
            }
            let solved: Vec<&&AgentResult> =
                mine.iter().filter(|a| a.end == AgentEnd::Solved).collect();
            let steps: Vec<f64> = solved.iter().map(|a| a.env_steps as f64).collect();
            let wall: Vec<f64> = solved.iter().map(|a| a.wall_s).collect();
            if let (Some((s, s_ci)), Some((w, w_ci))) = (mean_ci95(&steps), mean_ci95(&wall)) {
                writeln!(
                    f,
                    "  to target, {} of {} seeds: {s:.0} ± {s_ci:.0} env steps, {w:.1} ± {w_ci:.1} s (mean ± 95% interval)",
                    solved.len(),
                    mine.len()
                )?;
            }
            let best: Vec<f64> = mine
                .iter()
                .filter_map(|a| a.best_eval.map(f64::from))
                .collect();
            if let Some((b, b_ci)) = mean_ci95(&best) {
                writeln!(
                    f,
                    "  best evaluation: {b:.1} ± {b_ci:.1} (mean ± 95% interval over seeds)"
                )?;
            }
        }
        Ok(())
    }
}

/// An agent's result for tests: agent `i` with seed `i`, ended as `end`.
#[cfg(test)]
pub(crate) fn example_agent(i: usize, end: AgentEnd) -> AgentResult {
    AgentResult {
        agent: i,
        config: 0,
        label: String::new(),
        setup: AgentSetup {
            gamma: 0.99,
            n_step: 3,
            epsilon: EpsilonSchedule::Linear {
                start: 1.0,
                end: 0.04,
                steps: 8000,
            },
            batch_size: 32,
            hidden: vec![64, 64],
            samples_per_insert: 0.5,
            iqn: None,
            priority_alpha: None,
            munchausen: None,
        },
        hparams: AgentHparams {
            seed: i as u64,
            lr: 1e-3,
            max_grad_norm: 10.0,
            target: TargetUpdate::Hard { period: 100 },
            munchausen: None,
        },
        end,
        env_steps: 1000,
        wall_s: 1.5,
        final_eval: Some(500.0),
        best_eval: Some(500.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interval_uses_students_t() {
        let (m, h) = mean_ci95(&[1.0, 2.0, 3.0, 4.0]).unwrap();
        assert!((m - 2.5).abs() < 1e-12);
        // sd = 1.291, n = 4: t(3) = 3.182, half-width 3.182 · 1.291 / 2 = 2.054.
        assert!((h - 2.054).abs() < 1e-3, "{h}");
        assert!(mean_ci95(&[]).is_none());
        assert!(mean_ci95(&[5.0]).unwrap().1.is_nan());
    }

    #[test]
    fn csv_has_a_row_per_agent_and_the_exit_status_follows_the_ends() {
        let agent = example_agent;
        let mut s = PopulationSummary {
            env: "CartPole-v1".into(),
            agents: vec![agent(0, AgentEnd::Solved), agent(1, AgentEnd::Budget)],
            wall_s: 2.0,
            updates: 10,
            target: Some(475.0),
            split: [1.0, 0.5, 0.5],
            groups: 1,
            threads: 1,
            concurrent: 2,
            total_agents: 2,
            shard: None,
            plan: None,
        };
        let csv = s.to_csv();
        assert_eq!(csv.lines().count(), 3);
        assert!(csv.lines().nth(2).unwrap().starts_with(
            // The Munchausen, IQN and priority_alpha cells empty: the run has none.
            "1,0,1,0.001,10,hard/100,0.99,3,1,0.04,8000,32,64x64,0.5,,,,,,,budget,1000,"
        ));
        assert_eq!(s.exit_code(), 2);
        // A shard that finished its part succeeded, solved or not; stopped, it is not.
        s.shard = Some(Shard { index: 0, count: 2 });
        assert_eq!(s.exit_code(), 0);
        s.agents[0].end = AgentEnd::Interrupted;
        assert_eq!(s.exit_code(), 130);
        s.shard = None;
        s.agents[0].end = AgentEnd::Solved;
        s.agents[1].end = AgentEnd::Solved;
        assert_eq!(s.exit_code(), 0);
        assert!(s.to_string().contains("2 solved"));
    }
}
