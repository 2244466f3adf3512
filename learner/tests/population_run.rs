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
    let seeds: Vec<&str> = rows.iter().map(|r| r[2].as_str()).collect();
    assert_eq!(seeds[0], "1", "agent 0 has the run's seed");
    assert!(seeds[1] != seeds[2] && seeds[1] != "1");
    for (agent, row) in rows.iter().enumerate() {
        assert_eq!(row[6], "solved", "{row:?}");
        // The agent's solved policy, replayed on fresh episodes by `learner eval`.
        let ckpt = dir
            .path()
            .join(format!("agents/agent-{agent:03}/checkpoint"));
        let solved = read_json(&ckpt.join("solved/meta.json"));
        assert_eq!(solved["seed"].to_string(), row[2]);
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

#[test]
fn a_sweep_file_gives_each_agent_its_configuration_and_bad_ones_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let sweep = dir.path().join("sweep.toml");
    std::fs::write(
        &sweep,
        "seeds = [1, 2]\nmax_steps = 3000\n[grid]\nlr = [0.001, 0.002]\ntarget_period = [100]\n",
    )
    .unwrap();
    let logdir = dir.path().join("run");
    let out = learner(&[
        "--env",
        "CartPole-v1",
        "--cpu",
        "--target-return",
        "1000",
        "--sweep",
        sweep.to_str().unwrap(),
        "--logdir",
        logdir.to_str().unwrap(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "budgets, not targets: {}",
        text(&out)
    );
    let rows = rows(&logdir);
    // agent, config, seed, lr, clip, target rule, end, env steps, ...
    let got: Vec<(&str, &str, &str, &str, &str)> = rows
        .iter()
        .map(|r| {
            (
                r[1].as_str(),
                r[2].as_str(),
                r[3].as_str(),
                r[5].as_str(),
                r[6].as_str(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("0", "1", "0.001", "hard/100", "budget"),
            ("0", "2", "0.001", "hard/100", "budget"),
            ("1", "1", "0.002", "hard/100", "budget"),
            ("1", "2", "0.002", "hard/100", "budget"),
        ]
    );
    assert!(
        rows.iter().all(|r| r[7].parse::<u64>().unwrap() >= 3000),
        "{rows:?}"
    );
    assert!(
        text(&out).contains("configuration 1 (lr 2.00e-3"),
        "{}",
        text(&out)
    );

    std::fs::write(&sweep, "seeds = [5, 6]\n[grid]\nlr = [1e-3, -1.0]\n").unwrap();
    let out = learner(&["--sweep", sweep.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("agent 2 (configuration 1, seed 5): lr = -1: must be positive"),
        "{err}"
    );
}

#[test]
fn the_example_sweep_in_the_repository_is_valid() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sweeps/cartpole.toml");
    let sweep = millrace_learner::sweep::Sweep::read(
        &path,
        &millrace_learner::dqn::DqnConfig::default(),
        0,
    )
    .unwrap();
    assert_eq!(sweep.agents.len(), 2 * 3 * 2 * 5);
    assert_eq!(sweep.max_steps, Some(50_000));
}
