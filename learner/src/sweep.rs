//! Sweep files (`learner --sweep sweep.toml`): the agents of a population as grids and
//! random draws of per-agent hyperparameters, times seeds, with a per-agent step
//! budget. The format, with an example, is `sweeps/README.md`.
//!
//! A configuration is one point of the grid combined with one random draw; every
//! configuration runs once per seed. What may differ per agent is what one stacked
//! update can give each agent ([`AgentHparams`]): learning rate, gradient clip, target
//! rule. Settings that change shapes or the replay ratio (batch size, network, samples
//! per insert) come from the flags, for the whole sweep.

use std::collections::BTreeMap;
use std::path::Path;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Deserialize;

use crate::dqn::{DqnConfig, TargetUpdate};
use crate::population::AgentHparams;

/// One agent of a sweep: its configuration's number and its hyperparameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SweepAgent {
    pub config: usize,
    pub hparams: AgentHparams,
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
    grid: BTreeMap<String, Vec<f64>>,
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
    Choice(Vec<f64>),
}

/// The fields a sweep may set per agent.
const FIELDS: [&str; 4] = ["lr", "max_grad_norm", "target_period", "tau"];

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
        value: f64,
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
        let random_fields = file.random.as_ref().map(|r| &r.fields);
        for field in file
            .grid
            .keys()
            .chain(random_fields.into_iter().flat_map(|f| f.keys()))
        {
            if !FIELDS.contains(&field.as_str()) {
                return Err(field_err(
                    field,
                    &format!(
                        "not a per-agent setting (a sweep sets {}; batch size, network and replay ratio come from the flags)",
                        FIELDS.join(", ")
                    ),
                ));
            }
        }
        if let Some((field, _)) = file.grid.iter().find(|(_, v)| v.is_empty()) {
            return Err(field_err(field, "an empty list of values"));
        }
        let seeds: Vec<u64> = match file.seeds {
            Seeds::Count(0) => return Err(field_err("seeds", "at least one seed")),
            Seeds::Count(n) => (0..n).collect(),
            Seeds::List(l) if l.is_empty() => return Err(field_err("seeds", "at least one seed")),
            Seeds::List(l) => l,
        };
        if file.max_steps == Some(0) {
            return Err(field_err("max_steps", "at least one step"));
        }

        // Grid points: every combination, fields in name order.
        let mut points: Vec<BTreeMap<String, f64>> = vec![BTreeMap::new()];
        for (field, values) in &file.grid {
            points = points
                .into_iter()
                .flat_map(|p| {
                    values.iter().map(move |v| {
                        let mut q = p.clone();
                        q.insert(field.clone(), *v);
                        q
                    })
                })
                .collect();
        }
        // Random draws, each combined with every grid point.
        let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eee_9000);
        let draws: Vec<BTreeMap<String, f64>> = match &file.random {
            None => vec![BTreeMap::new()],
            Some(r) if r.samples == 0 => {
                return Err(field_err("random.samples", "at least one draw"))
            }
            Some(r) => (0..r.samples)
                .map(|_| {
                    r.fields
                        .iter()
                        .map(|(field, d)| {
                            let v = match d {
                                Draw::Uniform([lo, hi]) => lo + (hi - lo) * rng.random::<f64>(),
                                Draw::LogUniform([lo, hi]) => {
                                    (lo.ln() + (hi.ln() - lo.ln()) * rng.random::<f64>()).exp()
                                }
                                Draw::Choice(values) if values.is_empty() => f64::NAN,
                                Draw::Choice(values) => values[rng.random_range(0..values.len())],
                            };
                            (field.clone(), v)
                        })
                        .collect()
                })
                .collect(),
        };
        let configs = points.len().saturating_mul(draws.len());
        if configs.saturating_mul(seeds.len()) > MAX_AGENTS {
            return Err(field_err(
                "seeds",
                &format!(
                    "{configs} configurations × {} seeds is over {MAX_AGENTS} agents",
                    seeds.len()
                ),
            ));
        }
        let mut agents = Vec::with_capacity(configs * seeds.len());
        for (c, (point, draw)) in points
            .iter()
            .flat_map(|p| draws.iter().map(move |d| (p, d)))
            .enumerate()
        {
            for &s in &seeds {
                let agent = agents.len();
                let values: BTreeMap<&String, f64> =
                    point.iter().chain(draw).map(|(k, v)| (k, *v)).collect();
                let bad = |field: &str, value: f64, why: &str| SweepError::Value {
                    file: name.into(),
                    agent,
                    config: c,
                    seed: s,
                    field: field.into(),
                    value,
                    why: why.into(),
                };
                let mut hp = AgentHparams::from_config(base, s);
                for (field, &v) in &values {
                    match field.as_str() {
                        "lr" if !(v.is_finite() && v > 0.0) => {
                            return Err(bad(field, v, "must be positive"))
                        }
                        "lr" => hp.lr = v,
                        "max_grad_norm" if !(v.is_finite() && v > 0.0) => {
                            return Err(bad(field, v, "must be positive"))
                        }
                        "max_grad_norm" => hp.max_grad_norm = v,
                        "target_period" if !(v >= 1.0 && v.fract() == 0.0 && v <= 1e12) => {
                            return Err(bad(
                                field,
                                v,
                                "must be a whole number of updates, at least 1",
                            ))
                        }
                        "target_period" => hp.target = TargetUpdate::Hard { period: v as u64 },
                        "tau" if !(v > 0.0 && v <= 1.0) => {
                            return Err(bad(field, v, "must be in (0, 1]"))
                        }
                        "tau" => hp.target = TargetUpdate::Polyak { tau: v },
                        _ => unreachable!("fields were checked"),
                    }
                }
                if values.keys().any(|k| *k == "tau")
                    && values.keys().any(|k| *k == "target_period")
                {
                    return Err(bad(
                        "tau",
                        values[&"tau".to_string()],
                        "and target_period both set: one target rule",
                    ));
                }
                agents.push(SweepAgent {
                    config: c,
                    hparams: hp,
                });
            }
        }
        Ok(Self {
            agents,
            max_steps: file.max_steps,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn bad_values_are_refused_naming_the_agent_and_the_field() {
        let e = parse("seeds = [5, 6]\n[grid]\nlr = [1e-3, -1.0]\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "s.toml: agent 2 (configuration 1, seed 5): lr = -1: must be positive"
        );
        for (text, needle) in [
            (
                "seeds = 2\n[grid]\nbatch_size = [32]\n",
                "batch_size: not a per-agent setting",
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
