//! `learner --population K` as users run it: K CartPole agents in one process, each
//! reaching its own target, reported in a table and `population.csv`, each agent's
//! saved policy playable by `learner eval`; the same seed and thread count twice give
//! the same results bit for bit; flags that do not combine with a population are
//! refused.

use std::path::Path;
use std::process::{Command, Output};

use millrace_tests::read_json;

fn learner(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_learner"))
        .args(args)
        .arg("--no-progress")
        .env("RUST_LOG", "warn")
        .env_remove("MILLRACE_INJECT_FAULT")
        .output()
        .expect("learner runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn population(logdir: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "--env",
        "CartPole-v1",
        "--cpu",
        "--population",
        "3",
        "--seed",
        "1",
        "--logdir",
        logdir.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    learner(&args)
}

/// The CSV's rows without the wall-time column (which differs between runs).
fn rows(logdir: &Path) -> Vec<Vec<String>> {
    let csv = std::fs::read_to_string(logdir.join("population.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let wall = header.iter().position(|h| *h == "wall_s").unwrap();
    lines
        .map(|l| {
            l.split(',')
                .enumerate()
                .filter(|(i, _)| *i != wall)
                .map(|(_, v)| v.to_string())
                .collect()
        })
        .collect()
}

#[test]
fn each_agent_of_a_cartpole_population_solves_and_its_policy_plays() {
    let dir = tempfile::tempdir().unwrap();
    // One thread: the three agents share one stacked update, and leave it one by one.
    let out = population(
        dir.path(),
        &["--max-steps", "100000", "--population-threads", "1"],
    );
    let log = text(&out);
    assert_eq!(out.status.code(), Some(0), "every agent solved: {log}");
    assert!(log.contains("3 solved"), "{log}");
    let rows = rows(dir.path());
    assert_eq!(rows.len(), 3, "one row per agent");
    let seeds: Vec<&str> = rows.iter().map(|r| r[1].as_str()).collect();
    assert_eq!(seeds[0], "1", "agent 0 has the run's seed");
    assert!(seeds[1] != seeds[2] && seeds[1] != "1");
    for (agent, row) in rows.iter().enumerate() {
        assert_eq!(row[5], "solved", "{row:?}");
        // The agent's solved policy, replayed on fresh episodes by `learner eval`.
        let ckpt = dir
            .path()
            .join(format!("agents/agent-{agent:03}/checkpoint"));
        let solved = read_json(&ckpt.join("solved/meta.json"));
        assert_eq!(solved["seed"].to_string(), row[1]);
        assert_eq!(solved["network"]["population"], 1);
        let out = Command::new(env!("CARGO_BIN_EXE_learner"))
            .args([
                "eval",
                "--episodes",
                "20",
                "--seed",
                "99",
                "--json",
                "--checkpoint",
            ])
            .arg(&ckpt)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let mean = result["mean"].as_f64().unwrap();
        assert!(
            mean >= 400.0,
            "agent {agent}'s saved policy returned {mean}"
        );
    }
}

#[test]
fn the_same_population_twice_gives_the_same_results() {
    // One stacked update for all three (agents leave it as they solve or spend their
    // 24,000 steps), then two groups on two threads.
    for threads in ["1", "2"] {
        twice(&["--max-steps", "24000", "--population-threads", threads]);
    }
}

fn twice(extra: &[&str]) {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (x, y) = (population(a.path(), extra), population(b.path(), extra));
    assert!(matches!(x.status.code(), Some(0 | 2)), "{}", text(&x));
    assert_eq!(x.status.code(), y.status.code(), "{}", text(&y));
    assert_eq!(rows(a.path()), rows(b.path()));
    for agent in 0..3 {
        let best = |d: &Path| {
            let ckpt = d.join(format!("agents/agent-{agent:03}/checkpoint/best"));
            let meta = read_json(&ckpt.join("meta.json"));
            std::fs::read(ckpt.join(meta["policy_file"].as_str().unwrap())).unwrap()
        };
        assert_eq!(best(a.path()), best(b.path()), "agent {agent}'s parameters");
    }
}

#[test]
fn flags_that_do_not_combine_with_a_population_are_refused() {
    for (args, needle) in [
        (vec!["--population", "0"], "--population must be at least 1"),
        (
            vec!["--population", "2", "--listen", "127.0.0.1:0"],
            "--listen",
        ),
    ] {
        let out = learner(&args);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
