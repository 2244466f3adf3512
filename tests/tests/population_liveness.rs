//! `/livez` watches each of a population's groups on its own: with one group wedged
//! (the injected fault `stall-group`: agent 0's group stops its rounds) while the other
//! trains, `learner --population 2 --population-threads 2 --live-limit-s 2` answers
//! 503 naming the wedged group's agent, and the other agent's steps still grow.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use millrace_telemetry::{check, HealthError};
use millrace_tests::{binary, signal, wait_until};

mod common;
use common::prometheus::{page, parsed, serving, Served};

#[test]
fn one_wedged_group_fails_livez_while_the_other_trains() {
    let dir = tempfile::tempdir().unwrap();
    let Served {
        mut child,
        addr,
        log,
        reader,
    } = serving(
        Command::new(binary("learner"))
            .args(["--env", "CartPole-v1", "--cpu", "--seed", "3"])
            .args(["--population", "2", "--population-threads", "2"])
            .args(["--max-steps", "1000000", "--target-return", "1000"])
            .args(["--live-limit-s", "2"])
            .args(["--metrics-addr", "127.0.0.1:0", "--no-progress"])
            .arg("--logdir")
            .arg(dir.path().join("pop"))
            .env("RUST_LOG", "info")
            .env("MILLRACE_INJECT_FAULT", "stall-group")
            .stdout(Stdio::null()),
    );
    let steps = |agent: &str| {
        let f = parsed(&page(&addr));
        f.get("millrace_agent_env_steps")
            .and_then(|fam| fam["samples"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .find(|s| s["labels"]["agent"] == agent)
            .and_then(|s| s["value"].as_f64())
            .unwrap_or(0.0)
    };
    // Wedged after its first round, agent 0's group shows no further sign of life:
    // /livez fails within the 2 s limit (and a probe's margin), naming it.
    let start = Instant::now();
    let why = loop {
        match check(&addr, "/livez", Duration::from_secs(2)) {
            Err(HealthError::Status(503, body)) => break body,
            Ok(_) => {}
            Err(e) => panic!("/livez: {e}"),
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "/livez never failed: {}",
            log.lock().unwrap().join("\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        why.contains("the group of agents 000: no progress"),
        "{why}"
    );
    // The other group trains on meanwhile: it is no sign of the wedged one's life.
    let before = steps("001");
    wait_until(
        "agent 1 trains on while agent 0's group is wedged",
        Duration::from_secs(30),
        || steps("001") > before,
    );
    assert!(
        matches!(
            check(&addr, "/livez", Duration::from_secs(2)),
            Err(HealthError::Status(503, _))
        ),
        "still failing while agent 1 progresses"
    );
    signal(&child, "-TERM");
    let status = child.wait().unwrap();
    reader.join().unwrap();
    assert!(
        status.code().is_some(),
        "stopped on SIGTERM: {status:?}\n{}",
        log.lock().unwrap().join("\n")
    );
}
