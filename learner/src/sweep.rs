//! Sweep files (`learner --sweep sweep.toml`): the agents of a population as grids and
//! random draws of per-agent settings, times seeds, with a per-agent step budget. The
//! format, with an example, is `docs/guide/sweep-file.md`.
//!
//! A configuration is one point of the grid combined with one random draw; every
//! configuration runs once per seed. Three kinds of setting may differ per agent:
//! - what one stacked update can give each agent ([`AgentHparams`]): learning rate,
//!   gradient clip, target rule, Munchausen's τ, α and clip;
//! - how the agent's actors act and build transitions: γ, n-step, the ε schedule;
//! - what changes the update's shapes or pace (batch size, hidden layers, replay
//!   ratio, the IQN head's sampled fractions): agents that differ in these train in
//!   separate groups, one after another (see `run::population`).
//!
//! Everything a file does not set comes from the flags.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::config::RunConfig;
use crate::per_agent;
use millrace_core::dqn::agents::AgentHparams;
use millrace_core::dqn::iqn::IqnSampling;
use millrace_core::dqn::{Bootstrap, DqnConfig};

/// One agent of a sweep: its configuration's number, its learner hyperparameters and
/// the rest of what its file sets for it.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepAgent {
    pub config: usize,
    pub hparams: AgentHparams,
    pub settings: Settings,
    /// The configuration's values as the file gave them (`lr=0.001 n_step=3`; empty
    /// for `--population K`).
    pub label: String,
}

/// What a sweep sets for an agent besides its [`AgentHparams`] (`None`: the flags').
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Settings {
    pub gamma: Option<f32>,
    pub n_step: Option<usize>,
    pub eps_start: Option<f32>,
    pub eps_end: Option<f32>,
    pub eps_decay_steps: Option<u64>,
    pub batch_size: Option<usize>,
    pub hidden: Option<Vec<usize>>,
    pub samples_per_insert: Option<f64>,
    /// The IQN head's sampled fractions, N and N′ (`--iqn-taus`, `--iqn-target-taus`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iqn_taus: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iqn_target_taus: Option<usize>,
    /// Prioritized replay's α for this agent's replay (`--priority-alpha`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority_alpha: Option<f64>,
}

impl Settings {
    /// Why these settings do not fit the run's flags, if they do not.
    pub fn check(&self, cfg: &RunConfig) -> Result<(), String> {
        if (self.iqn_taus.is_some() || self.iqn_target_taus.is_some()) && cfg.iqn.is_none() {
            return Err("iqn_taus and iqn_target_taus need --head iqn".into());
        }
        if self.priority_alpha.is_some() && cfg.replay.priority.is_none() {
            return Err("priority_alpha needs --replay prioritized".into());
        }
        Ok(())
    }
}

impl SweepAgent {
    /// The run's configuration as this agent trains it: its seed and every setting the
    /// sweep gives it, the flags' for the rest.
    pub fn apply(&self, base: &RunConfig) -> RunConfig {
        let mut cfg = base.clone();
        cfg.seed = self.hparams.seed;
        per_agent::apply(&self.hparams, &self.settings, &mut cfg);
        cfg
    }
}

/// What puts agents in one group (one stacked update): the update's shapes and pace.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupKey {
    pub batch_size: usize,
    pub hidden: Vec<usize>,
    pub samples_per_insert: f64,
    /// The IQN head's sampled fractions, with one.
    pub iqn: Option<IqnSampling>,
}

impl GroupKey {
    pub fn of(cfg: &RunConfig) -> Self {
        Self {
            batch_size: cfg.batch_size,
            hidden: cfg.hidden.clone(),
            samples_per_insert: cfg.replay.samples_per_insert,
            iqn: cfg.iqn.map(|_| cfg.dqn.iqn),
        }
    }
}

impl std::fmt::Display for GroupKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "batch {}, hidden {:?}, {} samples per insert",
            self.batch_size, self.hidden, self.samples_per_insert
        )?;
        match &self.iqn {
            Some(s) => write!(f, ", IQN fractions {} and {}", s.online, s.target),
            None => Ok(()),
        }
    }
}

/// Checks what an agent's settings must satisfy together with the flags' (the checks
/// the flags get for a single run); the reason if not.
pub fn check_applied(cfg: &RunConfig) -> Result<(), String> {
    if cfg.replay.learning_starts < cfg.batch_size as u64 {
        return Err(format!(
            "batch_size {} is more than --learning-starts {}",
            cfg.batch_size, cfg.replay.learning_starts
        ));
    }
    let per_shard = cfg.replay.capacity.div_ceil(cfg.replay.shards);
    let batch_rows = cfg.actors.batch_rows.max(cfg.actors.envs_per_actor);
    let largest = batch_rows + cfg.actors.envs_per_actor * cfg.actors.n_step;
    if 2 * largest > per_shard {
        return Err(format!(
            "n_step {} makes actor batches of up to {largest} transitions, too many for {per_shard} per replay shard (--replay-capacity, --replay-shards)",
            cfg.actors.n_step
        ));
    }
    cfg.network_spec().map(|_| ()).map_err(|e| e.to_string())
}

/// A sweep read from its file.
#[derive(Debug)]
pub struct Sweep {
    pub agents: Vec<SweepAgent>,
    /// Each agent's env step budget, if the file sets one.
    pub max_steps: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    seeds: Seeds,
    max_steps: Option<u64>,
    #[serde(default)]
    grid: BTreeMap<String, Vec<Value>>,
    random: Option<Random>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Seeds {
    Count(u64),
    List(Vec<u64>),
}

#[derive(Debug, Deserialize)]
struct Random {
    samples: usize,
    #[serde(flatten)]
    fields: BTreeMap<String, Draw>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
enum Draw {
    Uniform([f64; 2]),
    LogUniform([f64; 2]),
    Choice(Vec<Value>),
}

/// A value in a sweep file: a number, or a list of numbers (`hidden`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Value {
    Number(f64),
    List(Vec<f64>),
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Number(x) => write!(f, "{x}"),
            Value::List(xs) => {
                let xs: Vec<String> = xs.iter().map(f64::to_string).collect();
                write!(f, "[{}]", xs.join(", "))
            }
        }
    }
}

/// Most agents one sweep file may describe.
pub const MAX_AGENTS: usize = 1 << 20;

/// Why a sweep file is refused (one line, naming the field and, for values, the agent).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SweepError {
    #[error("{0}: {1}")]
    Read(String, String),
    #[error("{file}: {field}: {why}")]
    Field {
        file: String,
        field: String,
        why: String,
    },
    #[error(
        "{file}: agent {agent} (configuration {config}, seed {seed}): {field} = {value}: {why}"
    )]
    Value {
        file: String,
        agent: usize,
        config: usize,
        seed: u64,
        field: String,
        value: String,
        why: String,
    },
    #[error("{file}: agent {agent} (configuration {config}, seed {seed}): {why}")]
    Settings {
        file: String,
        agent: usize,
        config: usize,
        seed: u64,
        why: String,
    },
}

impl Sweep {
    /// Reads a sweep file. `base` gives what the file does not set; `seed` seeds the
    /// random draws (so a sweep is reproducible).
    pub fn read(path: &Path, base: &DqnConfig, seed: u64) -> Result<Self, SweepError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| SweepError::Read(name.clone(), e.to_string()))?;
        Self::parse(&name, &text, base, seed)
    }

    /// [`Sweep::read`] on the file's text.
    pub fn parse(name: &str, text: &str, base: &DqnConfig, seed: u64) -> Result<Self, SweepError> {
        let file: File =
            toml::from_str(text).map_err(|e| SweepError::Read(name.into(), e.message().into()))?;
        let field_err = |field: &str, why: &str| SweepError::Field {
            file: name.into(),
            field: field.into(),
            why: why.into(),
        };
        file.check_fields()
            .map_err(|(f, why)| field_err(&f, &why))?;
        let seeds = file.seeds().map_err(|(f, why)| field_err(&f, &why))?;
        // Random draws, each combined with every grid point.
        let draws = file.draws(seed).map_err(|(f, why)| field_err(&f, &why))?;
        let points = file.grid_points();
        // What per-agent values start from.
        let run = per_agent::Base {
            munchausen: match base.bootstrap {
                Bootstrap::Munchausen(m) => Some(m),
                Bootstrap::Double => None,
            },
        };
        let configs = points.len() * draws.len();
        let mut agents = Vec::with_capacity(configs * seeds.len());
        for (c, (point, draw)) in points
            .iter()
            .flat_map(|p| draws.iter().map(move |d| (p, d)))
            .enumerate()
        {
            let values: BTreeMap<&String, &Value> = point.iter().chain(draw).collect();
            let mut label = String::new();
            for (field, value) in &values {
                let _ = write!(
                    label,
                    "{}{field}={value}",
                    if label.is_empty() { "" } else { " " }
                );
            }
            for &s in &seeds {
                let agent = agents.len();
                let bad = |field: &str, value: &Value, why: String| SweepError::Value {
                    file: name.into(),
                    agent,
                    config: c,
                    seed: s,
                    field: field.into(),
                    value: value.to_string(),
                    why,
                };
                let (hparams, settings) =
                    agent_values(&values, AgentHparams::from_config(base, s), &run)
                        .map_err(|(field, value, why)| bad(field, value, why))?;
                agents.push(SweepAgent {
                    config: c,
                    hparams,
                    settings,
                    label: label.clone(),
                });
            }
        }
        Ok(Self {
            agents,
            max_steps: file.max_steps,
        })
    }
}

/// One agent's values: `hp` (the flags' and its seed) with every field of its
/// configuration set; the field, its value and why, if one is refused.
fn agent_values<'v>(
    values: &BTreeMap<&'v String, &'v Value>,
    mut hp: AgentHparams,
    run: &per_agent::Base,
) -> Result<(AgentHparams, Settings), (&'v str, &'v Value, String)> {
    let mut settings = Settings::default();
    let mut agent = per_agent::Values {
        hp: &mut hp,
        settings: &mut settings,
    };
    for (field, value) in values {
        let setting = per_agent::named(field).expect("fields were checked");
        setting
            .set(value, &mut agent, run)
            .map_err(|why| (field.as_str(), *value, why))?;
    }
    if let (Some(tau), true) = (
        values.get(&"tau".to_string()),
        values.contains_key(&"target_period".to_string()),
    ) {
        return Err((
            "tau",
            *tau,
            "and target_period both set: one target rule".into(),
        ));
    }
    Ok((hp, settings))
}

/// A refusal of a field of the file: the field and why.
type FieldError = (String, String);

impl File {
    /// Every field a per-agent setting, and no empty list of values.
    fn check_fields(&self) -> Result<(), FieldError> {
        let random_fields = self.random.as_ref().map(|r| &r.fields);
        for field in self
            .grid
            .keys()
            .chain(random_fields.into_iter().flat_map(|f| f.keys()))
        {
            if per_agent::named(field).is_none() {
                let names: Vec<&str> = per_agent::SETTINGS.iter().map(|s| s.name).collect();
                return Err((
                    field.clone(),
                    format!(
                        "not a per-agent setting (a sweep sets {}; everything else comes from the flags)",
                        names.join(", ")
                    ),
                ));
            }
        }
        if let Some((field, _)) = self.grid.iter().find(|(_, v)| v.is_empty()) {
            return Err((field.clone(), "an empty list of values".into()));
        }
        Ok(())
    }

    /// The seeds, once the agents they make are counted: a grid's product, the draws
    /// and the seeds can each be huge, and nothing is built from them past
    /// [`MAX_AGENTS`].
    fn seeds(&self) -> Result<Vec<u64>, FieldError> {
        let seeds_err = |why: &str| Err(("seeds".to_string(), why.to_string()));
        let seed_count = match &self.seeds {
            Seeds::Count(0) => return seeds_err("at least one seed"),
            Seeds::Count(n) => usize::try_from(*n).unwrap_or(usize::MAX),
            Seeds::List(l) if l.is_empty() => return seeds_err("at least one seed"),
            Seeds::List(l) => l.len(),
        };
        let points_count = self
            .grid
            .values()
            .try_fold(1usize, |n, values| n.checked_mul(values.len()));
        let draws_count = self.random.as_ref().map_or(1, |r| r.samples);
        let agents_count = points_count
            .and_then(|p| p.checked_mul(draws_count))
            .and_then(|c| c.checked_mul(seed_count));
        if agents_count.is_none_or(|n| n > MAX_AGENTS) {
            let grid: Vec<String> = self
                .grid
                .iter()
                .map(|(f, v)| format!("{} {f}", v.len()))
                .collect();
            return seeds_err(&format!(
                "a grid of [{}] × {draws_count} random draws × {seed_count} seeds is over {MAX_AGENTS} agents",
                grid.join(", ")
            ));
        }
        if self.max_steps == Some(0) {
            return Err(("max_steps".into(), "at least one step".into()));
        }
        Ok(match &self.seeds {
            Seeds::Count(n) => (0..*n).collect(),
            Seeds::List(l) => l.clone(),
        })
    }

    /// Grid points: every combination, fields in name order.
    fn grid_points(&self) -> Vec<BTreeMap<String, Value>> {
        let mut points: Vec<BTreeMap<String, Value>> = vec![BTreeMap::new()];
        for (field, values) in &self.grid {
            points = points
                .into_iter()
                .flat_map(|p| {
                    values.iter().map(move |v| {
                        let mut q = p.clone();
                        q.insert(field.clone(), v.clone());
                        q
                    })
                })
                .collect();
        }
        points
    }

    /// The random draws (one empty draw without `[random]`), from `seed`.
    fn draws(&self, seed: u64) -> Result<Vec<BTreeMap<String, Value>>, FieldError> {
        let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eee_9000);
        let r = match &self.random {
            None => return Ok(vec![BTreeMap::new()]),
            Some(r) if r.samples == 0 => {
                return Err(("random.samples".into(), "at least one draw".into()))
            }
            Some(r) => r,
        };
        if let Some((field, _)) = r
            .fields
            .iter()
            .find(|(_, d)| matches!(d, Draw::Choice(v) if v.is_empty()))
        {
            return Err((field.clone(), "an empty list of choices".into()));
        }
        Ok((0..r.samples)
            .map(|_| {
                r.fields
                    .iter()
                    .map(|(field, d)| {
                        let v = match d {
                            Draw::Uniform([lo, hi]) => {
                                Value::Number(lo + (hi - lo) * rng.random::<f64>())
                            }
                            Draw::LogUniform([lo, hi]) => Value::Number(
                                (lo.ln() + (hi.ln() - lo.ln()) * rng.random::<f64>()).exp(),
                            ),
                            Draw::Choice(values) => {
                                values[rng.random_range(0..values.len())].clone()
                            }
                        };
                        (field.clone(), v)
                    })
                    .collect()
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use millrace_core::dqn::{Munchausen, TargetUpdate};

    fn parse(text: &str) -> Result<Sweep, SweepError> {
        Sweep::parse("s.toml", text, &DqnConfig::default(), 7)
    }

    #[test]
    fn grids_times_draws_times_seeds() {
        let s = parse(
            r#"
            seeds = [3, 4]
            max_steps = 5000
            [grid]
            lr = [1e-3, 2e-3]
            target_period = [100, 200, 300]
            [random]
            samples = 2
            max_grad_norm = { uniform = [1.0, 10.0] }
            "#,
        )
        .unwrap();
        assert_eq!(s.agents.len(), 2 * 3 * 2 * 2);
        assert_eq!(s.max_steps, Some(5000));
        // Seeds are innermost: consecutive agents are one configuration's seeds.
        assert_eq!(
            (s.agents[0].config, s.agents[1].config, s.agents[2].config),
            (0, 0, 1)
        );
        assert_eq!((s.agents[0].hparams.seed, s.agents[1].hparams.seed), (3, 4));
        let lrs: std::collections::BTreeSet<u64> = s
            .agents
            .iter()
            .map(|a| (a.hparams.lr * 1e6) as u64)
            .collect();
        assert_eq!(lrs.len(), 2);
        assert!(s
            .agents
            .iter()
            .all(|a| (1.0..=10.0).contains(&a.hparams.max_grad_norm)));
        assert!(s
            .agents
            .iter()
            .any(|a| a.hparams.target == TargetUpdate::Hard { period: 300 }));
        // The same file and seed draw the same values.
        let again = parse(
            "seeds = [3, 4]\nmax_steps = 5000\n[grid]\nlr = [1e-3, 2e-3]\ntarget_period = [100, 200, 300]\n[random]\nsamples = 2\nmax_grad_norm = { uniform = [1.0, 10.0] }\n",
        )
        .unwrap();
        assert_eq!(again.agents, s.agents);
    }

    #[test]
    fn a_count_of_seeds_and_defaults_from_the_flags() {
        let s = parse("seeds = 3\n[random]\nsamples = 1\ntau = { choice = [0.01] }\n").unwrap();
        assert_eq!(s.agents.len(), 3);
        assert_eq!(s.agents[2].hparams.seed, 2);
        assert_eq!(s.agents[0].hparams.lr, DqnConfig::default().lr);
        assert_eq!(
            s.agents[0].hparams.target,
            TargetUpdate::Polyak { tau: 0.01 }
        );
    }

    #[test]
    fn munchausen_and_iqn_settings_per_agent() {
        let base = DqnConfig {
            bootstrap: Bootstrap::Munchausen(Munchausen {
                tau: 0.05,
                ..Munchausen::default()
            }),
            ..DqnConfig::default()
        };
        let text = "seeds = 1\n[grid]\nmunchausen_alpha = [0.0, 0.9]\niqn_taus = [8, 32]\n";
        let s = Sweep::parse("s.toml", text, &base, 7).unwrap();
        assert_eq!(s.agents.len(), 4);
        // α from the file, τ and the clip from the flags.
        let m = s.agents[0].hparams.munchausen.unwrap();
        assert_eq!((m.tau, m.alpha, m.clip), (0.05, 0.0, -1.0));
        // Grid fields in name order: iqn_taus outermost.
        assert_eq!(s.agents[1].hparams.munchausen.unwrap().alpha, 0.9);
        assert_eq!(
            (s.agents[1].settings.iqn_taus, s.agents[2].settings.iqn_taus),
            (Some(8), Some(32))
        );
        // Without --target munchausen, or out of range: one line naming the field.
        let e = parse("seeds = 1\n[grid]\nmunchausen_tau = [0.03]\n").unwrap_err();
        assert!(e
            .to_string()
            .contains("munchausen_tau = 0.03: needs --target munchausen"));
        for (text, needle) in [
            (
                "seeds = 1\n[grid]\nmunchausen_clip = [0.5]\n",
                "must be negative",
            ),
            (
                "seeds = 1\n[grid]\nmunchausen_alpha = [2.0]\n",
                "must be in [0, 1]",
            ),
            ("seeds = 1\n[grid]\niqn_taus = [0]\n", "from 1 to 256"),
        ] {
            let e = Sweep::parse("s.toml", text, &base, 7)
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{e}");
        }
        // Agents without their own settings serialise as before (agent.json).
        let plain = parse("seeds = 1\n").unwrap();
        let json = serde_json::to_string(&plain.agents[0].hparams).unwrap();
        assert!(!json.contains("munchausen"), "{json}");
        let json = serde_json::to_string(&plain.agents[0].settings).unwrap();
        assert!(!json.contains("iqn"), "{json}");
    }

    #[test]
    fn huge_sweeps_are_refused_before_anything_is_built() {
        // 100^6 grid points, 10^15 draws, 10^18 seeds: each refused at once, in one line.
        let values: Vec<String> = (0..100).map(|i| format!("{}e-4", i + 1)).collect();
        let list = values.join(", ");
        let grid = format!(
            "seeds = 1\n[grid]\nlr = [{list}]\ntau = [{list}]\nmax_grad_norm = [{list}]\n\
             gamma = [{list}]\nsamples_per_insert = [{list}]\nn_step = [{list}]\n"
        );
        for text in [
            grid.as_str(),
            "seeds = 1\n[random]\nsamples = 1000000000000000\nlr = { uniform = [1e-4, 1e-3] }\n",
            "seeds = 1000000000000000000\n",
            "seeds = 2\n[random]\nsamples = 18446744073709551615\nlr = { choice = [1e-3] }\n",
        ] {
            let start = std::time::Instant::now();
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains("agents") && !e.contains('\n'), "{e}");
            assert!(start.elapsed() < std::time::Duration::from_secs(1), "{e}");
        }
    }

    #[test]
    fn bad_values_are_refused_naming_the_agent_and_the_field() {
        let e = parse("seeds = [5, 6]\n[grid]\nlr = [1e-3, -1.0]\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "s.toml: agent 2 (configuration 1, seed 5): lr = -1: must be positive"
        );
        for (text, needle) in [
            (
                "seeds = 2\n[grid]\nbuffer_size = [32]\n",
                "buffer_size: not a per-agent setting",
            ),
            (
                "seeds = 1\n[grid]\nn_step = [0]\n",
                "n_step = 0: must be a whole number",
            ),
            (
                "seeds = 1\n[grid]\ngamma = [1.5]\n",
                "gamma = 1.5: must be in [0, 1]",
            ),
            (
                "seeds = 1\n[grid]\nhidden = [64]\n",
                "hidden = 64: must be a list",
            ),
            (
                "seeds = 1\n[grid]\nhidden = [[64, 0]]\n",
                "hidden = [64, 0]: must be 1 to 8",
            ),
            (
                "seeds = 1\n[grid]\nlr = [[1, 2]]\n",
                "must be a number, not a list",
            ),
            (
                "seeds = 1\n[random]\nsamples = 1\nlr = { choice = [] }\n",
                "lr: an empty list of choices",
            ),
            ("seeds = 0\n", "seeds: at least one seed"),
            ("seeds = 1\nfoo = 1\n", "unknown field"),
            (
                "seeds = 1\n[grid]\ntarget_period = [2.5]\n",
                "target_period = 2.5",
            ),
            (
                "seeds = 1\n[grid]\ntau = [0.1]\ntarget_period = [10]\n",
                "one target rule",
            ),
            ("seeds = 1\n[grid]\nlr = []\n", "lr: an empty list"),
            (
                "seeds = 1\n[random]\nsamples = 1\nlr = { normal = [0, 1] }\n",
                "s.toml",
            ),
            ("seeds = [\n", "s.toml"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{text:?}: {e}");
        }
    }
}
