//! `learner merge --logdir ROOT`: the shards of a population (`--shard I/N`, each run
//! in `ROOT/shard-I-of-N`) put back together as one result: `ROOT/population.csv` and
//! `ROOT/population.json` with every agent once, in agent order, and the table with
//! each configuration's means and 95% intervals over its seeds, printed, as a
//! one-process run prints them. `ROOT` is then one TensorBoard log directory: its own
//! event file holds the HParams experiment, and each agent's session is a run under it
//! (`shard-I-of-N/agents/agent-NNN`).
//!
//! It refuses, naming what is wrong, a root with a shard missing, a shard that has not
//! finished (no `population.json`, or agents stopped before they ended: resubmit its
//! task, which resumes), shards of different populations, and an agent in two shards
//! or in none. It only reads the shards, so it can be run again.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context};

use crate::population_board;
use crate::population_results::{AgentEnd, AgentResult, PopulationSummary};
use crate::shard::Shard;

/// Combines the shards under `root`, writes the merged results there, and returns them.
pub fn merge(root: &Path) -> anyhow::Result<PopulationSummary> {
    let shards = shards(root)?;
    let mut parts = Vec::with_capacity(shards.len());
    for shard in &shards {
        let dir = root.join(shard.dir_name());
        let path = dir.join("population.json");
        if !path.exists() {
            bail!(
                "shard {shard} has not finished: no {} (resubmit its task with the same command line; it resumes with --resume-if-present)",
                path.display()
            );
        }
        let part = PopulationSummary::read(&path).map_err(anyhow::Error::msg)?;
        let stopped: Vec<String> = part
            .agents
            .iter()
            .filter(|a| a.end == AgentEnd::Interrupted)
            .map(|a| a.agent.to_string())
            .collect();
        if !stopped.is_empty() {
            bail!(
                "shard {shard} was stopped before it finished (agent(s) {} interrupted): resubmit its task with the same command line; it resumes with --resume-if-present",
                stopped.join(", ")
            );
        }
        if part.shard != Some(*shard) {
            bail!(
                "{} is not shard {shard}'s results (it says {})",
                path.display(),
                part.shard
                    .map_or_else(|| "a whole population".into(), |s| format!("shard {s}"))
            );
        }
        parts.push(part);
    }
    let merged = combine(parts)?;
    merged
        .write(root)
        .with_context(|| format!("writing the merged results into {}", root.display()))?;
    if let Some(first) = merged.agents.first() {
        experiment(root, &merged.env, first)?;
    }
    Ok(merged)
}

/// The shards under `root`: every `shard-I-of-N` directory, all of one N, none missing.
fn shards(root: &Path) -> anyhow::Result<Vec<Shard>> {
    let entries =
        std::fs::read_dir(root).with_context(|| format!("--logdir {}", root.display()))?;
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("reading {}", root.display()))?;
        if let Some(shard) = entry.file_name().to_str().and_then(Shard::from_dir_name) {
            if entry.path().is_dir() {
                found.push(shard);
            }
        }
    }
    found.sort_by_key(|s| (s.count, s.index));
    let Some(count) = found.first().map(|s| s.count) else {
        bail!(
            "{} holds no shard-I-of-N directories: run the shards with --shard I/N --logdir {} first",
            root.display(),
            root.display()
        );
    };
    if let Some(other) = found.iter().find(|s| s.count != count) {
        bail!(
            "{} holds shards of {count} and of {}: one split per directory",
            root.display(),
            other.count
        );
    }
    let missing: Vec<String> = (0..count)
        .filter(|&i| !found.iter().any(|s| s.index == i))
        .map(|i| i.to_string())
        .collect();
    if !missing.is_empty() {
        bail!(
            "shard(s) {} of {count} have not run: no {}",
            missing.join(", "),
            missing
                .iter()
                .map(|i| root
                    .join(format!("shard-{i}-of-{count}"))
                    .display()
                    .to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(found)
}

/// One population from its shards' results (`parts` in shard order): every agent once;
/// the wall time the longest shard's (they run side by side), the work summed.
fn combine(parts: Vec<PopulationSummary>) -> anyhow::Result<PopulationSummary> {
    let first = parts.first().context("no shards")?;
    let (env, total, target) = (first.env.clone(), first.total_agents, first.target);
    let mut agents: BTreeMap<usize, (Shard, AgentResult)> = BTreeMap::new();
    let plan = first.plan.clone();
    let mut merged = PopulationSummary {
        env: env.clone(),
        agents: Vec::new(),
        wall_s: 0.0,
        updates: 0,
        target,
        split: [0.0; 3],
        groups: 0,
        threads: 0,
        concurrent: 0,
        total_agents: total,
        shard: None,
        plan: None,
    };
    for part in parts {
        let shard = part.shard.context("a shard's results name their shard")?;
        if part.env != env || part.total_agents != total || part.target != target {
            bail!(
                "shard {shard} trained {} agents of {} (target {:?}), shard 0 {total} of {env} (target {target:?}): not one population",
                part.total_agents,
                part.env,
                part.target
            );
        }
        if part.plan != plan {
            bail!(
                "shard {shard} is of another split than shard 0 (another seed, sweep, --max-concurrent-agents or number of shards): run every shard with the same command line"
            );
        }
        merged.wall_s = merged.wall_s.max(part.wall_s);
        merged.updates += part.updates;
        for (sum, x) in merged.split.iter_mut().zip(part.split) {
            *sum += x;
        }
        merged.groups = merged.groups.max(part.groups);
        merged.threads += part.threads;
        merged.concurrent += part.concurrent;
        for agent in part.agents {
            if agent.agent >= total {
                bail!(
                    "shard {shard} has agent {}, but the population has {total} (0 to {})",
                    agent.agent,
                    total.saturating_sub(1)
                );
            }
            if let Some((other, _)) = agents.get(&agent.agent) {
                bail!(
                    "agent {} is in shard {other} and in shard {shard}: shards of different splits in one directory?",
                    agent.agent
                );
            }
            agents.insert(agent.agent, (shard, agent));
        }
    }
    if agents.len() < total {
        // Every key is below `total`: the first missing ones are among the first
        // `agents.len() + 10` numbers, however large `total` claims to be.
        let missing: Vec<String> = (0..total)
            .filter(|i| !agents.contains_key(i))
            .take(10)
            .map(|i| i.to_string())
            .collect();
        bail!(
            "{} of the {total} agents are in no shard's results (agent(s) {}{})",
            total - agents.len(),
            missing.join(", "),
            if total - agents.len() > missing.len() {
                ", ..."
            } else {
                ""
            }
        );
    }
    merged.agents = agents.into_values().map(|(_, a)| a).collect();
    Ok(merged)
}

/// The HParams experiment in `root`'s own event file, once (a second merge finds it).
fn experiment(root: &Path, env: &str, example: &AgentResult) -> anyhow::Result<()> {
    let has_events = std::fs::read_dir(root)?.filter_map(Result::ok).any(|e| {
        e.file_name()
            .to_string_lossy()
            .starts_with("events.out.tfevents.")
    });
    if has_events {
        return Ok(());
    }
    let settings = population_board::settings(example.config, &example.hparams, &example.setup);
    population_board::experiment(root, env, &settings)
        .with_context(|| format!("writing the HParams experiment into {}", root.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::population_results::example_agent;

    fn part(shard: Shard, agents: &[usize], total: usize) -> PopulationSummary {
        let plan = Some(format!("split of {total} in {}", shard.count));
        PopulationSummary {
            env: "CartPole-v1".into(),
            agents: agents
                .iter()
                .map(|&i| example_agent(i, AgentEnd::Solved))
                .collect(),
            wall_s: 10.0 + shard.index as f64,
            updates: 100,
            target: Some(475.0),
            split: [1.0, 2.0, 3.0],
            groups: 1,
            threads: 1,
            concurrent: 2,
            total_agents: total,
            shard: Some(shard),
            plan,
        }
    }

    fn shard(index: usize, count: usize) -> Shard {
        Shard { index, count }
    }

    fn write(root: &Path, p: &PopulationSummary) {
        let dir = root.join(p.shard.unwrap().dir_name());
        std::fs::create_dir_all(&dir).unwrap();
        p.write(&dir).unwrap();
    }

    #[test]
    fn shards_merge_into_one_table_with_every_agent_once_in_order() {
        let root = tempfile::tempdir().unwrap();
        // Thread plans hand out consecutive agents per group: shard 0 has 0, 1 and 4.
        write(root.path(), &part(shard(0, 2), &[0, 1, 4], 6));
        write(root.path(), &part(shard(1, 2), &[2, 3, 5], 6));
        let merged = merge(root.path()).unwrap();
        let ids: Vec<usize> = merged.agents.iter().map(|a| a.agent).collect();
        assert_eq!(ids, [0, 1, 2, 3, 4, 5]);
        assert_eq!(merged.wall_s, 11.0);
        assert_eq!(
            (merged.updates, merged.threads, merged.concurrent),
            (200, 2, 4)
        );
        assert_eq!(merged.split, [2.0, 4.0, 6.0]);
        assert_eq!(merged.shard, None);
        let csv = std::fs::read_to_string(root.path().join("population.csv")).unwrap();
        assert_eq!(csv.lines().count(), 7, "{csv}");
        let again = PopulationSummary::read(&root.path().join("population.json")).unwrap();
        assert_eq!(again.agents, merged.agents);
        // Its HParams experiment, once however often it is merged.
        merge(root.path()).unwrap();
        let events = std::fs::read_dir(root.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with("events.out.tfevents.")
            })
            .count();
        assert_eq!(events, 1);
    }

    #[test]
    fn a_missing_or_unfinished_shard_is_named() {
        let root = tempfile::tempdir().unwrap();
        let err = merge(root.path()).unwrap_err().to_string();
        assert!(err.contains("no shard-I-of-N"), "{err}");
        write(root.path(), &part(shard(0, 3), &[0], 3));
        std::fs::create_dir_all(root.path().join("shard-2-of-3")).unwrap();
        let err = merge(root.path()).unwrap_err().to_string();
        assert!(err.contains("shard(s) 1 of 3 have not run"), "{err}");
        std::fs::create_dir_all(root.path().join("shard-1-of-3")).unwrap();
        let err = merge(root.path()).unwrap_err().to_string();
        assert!(err.contains("shard 1/3 has not finished"), "{err}");
        let mut stopped = part(shard(1, 3), &[1], 3);
        stopped.agents[0].end = AgentEnd::Interrupted;
        write(root.path(), &stopped);
        let err = merge(root.path()).unwrap_err().to_string();
        assert!(
            err.contains("shard 1/3 was stopped before it finished (agent(s) 1 interrupted)"),
            "{err}"
        );
    }

    #[test]
    fn agents_twice_or_nowhere_and_mixed_splits_are_refused() {
        let root = tempfile::tempdir().unwrap();
        write(root.path(), &part(shard(0, 2), &[0, 1], 4));
        write(root.path(), &part(shard(1, 2), &[1, 2], 4));
        let err = merge(root.path()).unwrap_err().to_string();
        assert!(
            err.contains("agent 1 is in shard 0/2 and in shard 1/2"),
            "{err}"
        );

        write(root.path(), &part(shard(1, 2), &[2], 4));
        let err = merge(root.path()).unwrap_err().to_string();
        assert!(
            err.contains("1 of the 4 agents are in no shard's results (agent(s) 3)"),
            "{err}"
        );

        write(root.path(), &part(shard(0, 3), &[0], 4));
        let err = merge(root.path()).unwrap_err().to_string();
        assert!(err.contains("shards of 2 and of 3"), "{err}");
    }

    #[test]
    fn shards_of_another_population_are_refused() {
        let root = tempfile::tempdir().unwrap();
        write(root.path(), &part(shard(0, 2), &[0], 2));
        let mut other = part(shard(1, 2), &[1], 2);
        other.env = "Acrobot-v1".into();
        write(root.path(), &other);
        let err = merge(root.path()).unwrap_err().to_string();
        assert!(err.contains("not one population"), "{err}");

        // The same population run with another seed, sweep or number of places.
        let mut other = part(shard(1, 2), &[1], 2);
        other.plan = Some("another".into());
        write(root.path(), &other);
        let err = merge(root.path()).unwrap_err().to_string();
        assert!(err.contains("shard 1/2 is of another split"), "{err}");

        // A file claiming a population of usize::MAX agents is refused, not allocated.
        let mut huge = part(shard(1, 2), &[1], usize::MAX);
        huge.plan = part(shard(0, 2), &[0], 2).plan;
        write(root.path(), &huge);
        let err = merge(root.path()).unwrap_err().to_string();
        assert!(err.contains("not one population"), "{err}");
        write(root.path(), &part(shard(0, 2), &[0], usize::MAX));
        write(root.path(), &part(shard(1, 2), &[1], usize::MAX));
        let err = merge(root.path()).unwrap_err().to_string();
        assert!(
            err.contains(
                "of the 18446744073709551615 agents are in no shard's results (agent(s) 2, 3,"
            ),
            "{err}"
        );
    }
}
