//! A sweep split over processes as a job array splits it (`--shard I/N`, each shard a
//! process of its own, all at once), then `learner merge`: the merged table has every
//! agent once, and its rows equal (wall time aside) those of the same sweep run in one
//! process with `--population-threads N` and the same `--max-concurrent-agents`;
//! TensorBoard's own HParams plugin reads one session per agent from the merged log
//! directory; a resubmitted shard resumes (nothing left to train); flags that cannot
//! make a shard are refused in one line.

use std::path::Path;
use std::process::{Command, Output};

use millrace_tests::{hparams_view, population_rows as rows};

fn learner() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_learner"));
    c.env("RUST_LOG", "info")
        .env_remove("MILLRACE_INJECT_FAULT");
    c
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Six CartPole agents in two groups (batch sizes), three places: the shards' plans
/// cut through both groups, and agents queue for places.
const SWEEP: &str = "seeds = [1, 2, 3]\nmax_steps = 1500\n[grid]\nbatch_size = [16, 32]\n";

/// The flags every run of a test's sweep shares, with `places` agents at once.
fn flags(sweep: &Path, places: usize) -> Vec<String> {
    [
        "--no-progress",
        "--env",
        "CartPole-v1",
        "--cpu",
        "--hidden",
        "32",
        "--samples-per-insert",
        "16",
        "--target-return",
        "1000",
        "--eval-every",
        "500",
        "--eval-episodes",
        "3",
        "--sweep",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([sweep.display().to_string()])
    .chain(["--max-concurrent-agents".into(), places.to_string()])
    .collect()
}

#[test]
fn shards_run_apart_and_merged_equal_the_one_process_run() {
    let dir = tempfile::tempdir().unwrap();
    let sweep = dir.path().join("sweep.toml");
    std::fs::write(&sweep, SWEEP).unwrap();
    let one = dir.path().join("one");
    let root = dir.path().join("array");

    let shard = |i: usize| {
        millrace_tests::KillOnDrop::spawn(
            learner()
                .args(flags(&sweep, 3))
                .args(["--shard", &format!("{i}/3"), "--logdir"])
                .arg(&root)
                .arg("--resume-if-present")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped()),
        )
    };
    // The three shards at once, as an array's tasks run, beside nothing else.
    let tasks: Vec<_> = (0..3).map(shard).collect();
    for (i, t) in tasks.into_iter().enumerate() {
        let out = t.into_inner().wait_with_output().unwrap();
        // A shard that finished its part exits 0 (budgets, not targets, ended them).
        assert_eq!(out.status.code(), Some(0), "shard {i}: {}", text(&out));
    }
    let out = learner()
        .args(flags(&sweep, 3))
        .args(["--population-threads", "3", "--logdir"])
        .arg(&one)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("on 3 thread(s), up to 3 agents at once"),
        "{}",
        text(&out)
    );

    let out = learner()
        .arg("merge")
        .arg("--logdir")
        .arg(&root)
        .output()
        .unwrap();
    let log = text(&out);
    assert_eq!(out.status.code(), Some(0), "{log}");
    assert!(log.contains("merged 6 agents"), "{log}");
    let (merged, reference) = (rows(&root), rows(&one));
    assert_eq!(merged.len(), 6, "{merged:?}");
    assert_eq!(
        merged, reference,
        "the shards' rows against the one-process run's"
    );
    // Each shard trained its own part, in its own directory.
    let mut seen = 0;
    for i in 0..3 {
        let part = rows(&root.join(format!("shard-{i}-of-3")));
        assert!(!part.is_empty(), "shard {i} trained no agent");
        seen += part.len();
    }
    assert_eq!(seen, 6);

    // TensorBoard's HParams plugin on the merged directory: every agent's session, once.
    let view = hparams_view(&root);
    let mut agents: Vec<String> = view["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["sessions"].as_array().unwrap().iter())
        .map(|s| {
            s["name"]
                .as_str()
                .unwrap()
                .rsplit('/')
                .next()
                .unwrap()
                .to_string()
        })
        .collect();
    agents.sort();
    let want: Vec<String> = (0..6).map(|i| format!("agent-{i:03}")).collect();
    assert_eq!(agents, want, "{view}");

    // A resubmitted task finds its shard ended: it trains nothing and keeps the rows.
    let out = shard(1).into_inner().wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = learner()
        .arg("merge")
        .arg("--logdir")
        .arg(&root)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(rows(&root), reference);
}

#[test]
fn flags_that_cannot_make_a_shard_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let sweep = dir.path().join("sweep.toml");
    std::fs::write(&sweep, SWEEP).unwrap();
    let logdir = dir.path().join("run");
    let cases: [(&[&str], &str); 4] = [
        (&["--shard", "3/3"], "I counts from 0 and must be below N"),
        (
            &["--shard", "0/4"],
            "6 agents, 3 at once, split into at most 3 shards",
        ),
        (
            &["--shard", "0/2", "--population-threads", "2"],
            "cannot be used with",
        ),
        // A resubmitted task resumes with --resume-if-present, in its own directory.
        (
            &["--shard", "0/2", "--resume", "elsewhere"],
            "cannot be used with",
        ),
    ];
    for (extra, want) in cases {
        let out = learner()
            .args(flags(&sweep, 3))
            .args(extra)
            .arg("--logdir")
            .arg(&logdir)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{extra:?}");
        assert!(err.contains(want), "{extra:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // Without --logdir, and without a population.
    let out = learner()
        .args(flags(&sweep, 3))
        .args(["--shard", "0/2"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--shard needs --logdir"),
        "{}",
        text(&out)
    );
    let out = learner()
        .args([
            "--env",
            "CartPole-v1",
            "--cpu",
            "--shard",
            "0/2",
            "--logdir",
        ])
        .arg(&logdir)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--shard is for a population"),
        "{}",
        text(&out)
    );
    // One shard is one thread of the one-process run: one device.
    let out = learner()
        .arg("--sweep")
        .arg(&sweep)
        .args(["--shard", "0/2", "--gpu", "0,1", "--logdir"])
        .arg(&logdir)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--shard trains on one device"),
        "{}",
        text(&out)
    );
    assert!(!logdir.exists(), "nothing is written by a refused run");
}

/// A task stopped mid-shard (SIGINT, as `scancel` or a time limit's SIGTERM) saves its
/// agents; the merge refuses the stopped shard, naming its interrupted agents; the same
/// command line again resumes the shard (`--resume-if-present`), and the merge takes
/// every agent once.
#[test]
fn a_stopped_shard_resumes_with_the_same_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let sweep = dir.path().join("sweep.toml");
    std::fs::write(
        &sweep,
        "seeds = 6\nmax_steps = 6000\n[grid]\nlr = [1e-3, 2e-3]\n",
    )
    .unwrap();
    let root = dir.path().join("array");
    // Two places over two shards: each trains its six agents one at a time.
    let task = |i: usize| {
        let mut c = learner();
        c.args(flags(&sweep, 2))
            .args(["--shard", &format!("{i}/2"), "--logdir"])
            .arg(&root)
            .arg("--resume-if-present")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        c
    };
    let child = millrace_tests::KillOnDrop::spawn(&mut task(0));
    let agent = |k: usize| root.join(format!("shard-0-of-2/agents/agent-{k:03}"));
    millrace_tests::wait_until(
        "shard 0's first agent ended and its second started",
        std::time::Duration::from_secs(120),
        || agent(0).join("result.json").exists() && agent(1).join("agent.json").exists(),
    );
    millrace_tests::signal(&child, "-INT");
    let out = child.into_inner().wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));

    let merge = || {
        learner()
            .arg("merge")
            .arg("--logdir")
            .arg(&root)
            .output()
            .unwrap()
    };
    let out = merge();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains("shard(s) 1 of 2 have not run"),
        "{}",
        text(&out)
    );
    let out = task(1).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = merge();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains(
            "shard 0/2 was stopped before it finished (agent(s) 1, 2, 3, 4, 5 interrupted)"
        ),
        "{}",
        text(&out)
    );

    let out = task(0).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("1 agent(s) ended before, 1 go on from their state, 4 start"),
        "{}",
        text(&out)
    );
    let out = merge();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let merged = rows(&root);
    assert_eq!(merged.len(), 12);
    assert!(merged.values().all(|r| r["end"] == "budget"), "{merged:?}");
}
