//! One learner per log directory: a second one is refused in one line while the first
//! runs, and the lock of a learner that was killed is taken over by the next.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use millrace_tests::wait_until;

fn learner(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_learner"));
    cmd.args(args)
        .args(["--no-progress", "--cpu"])
        .env("RUST_LOG", "warn")
        .env_remove("MILLRACE_INJECT_FAULT");
    cmd
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn a_second_learner_on_one_log_directory_is_refused_and_a_killed_ones_lock_is_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let logdir = dir.path().join("run");
    let d = logdir.to_str().unwrap();
    let mut first = millrace_tests::KillOnDrop::spawn(
        learner(&[
            "--logdir",
            d,
            "--max-steps",
            "100000000",
            "--target-return",
            "1e9",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null()),
    );
    let lock = logdir.join(".millrace.lock");
    wait_until(
        "the first learner holds the lock",
        Duration::from_secs(60),
        || lock.exists() && logdir.join("checkpoint/config.json").exists(),
    );

    // A restarted container's command, while the first still runs: refused at once.
    let second = learner(&["--logdir", d, "--resume-if-present", "--max-steps", "3000"])
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(1), "{}", text(&second));
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(
        err.contains(&format!("another learner is using it (PID {}", first.id())),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        first.try_wait().unwrap().is_none(),
        "the first learner runs on"
    );

    // Killed (no chance to remove its lock): the next learner takes the lock over.
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(lock.exists(), "a killed learner leaves its lock");
    let third = learner(&["--logdir", d, "--resume-if-present", "--max-steps", "3000"])
        .output()
        .unwrap();
    assert!(
        matches!(third.status.code(), Some(0 | 2)),
        "{}",
        text(&third)
    );
    let err = String::from_utf8_lossy(&third.stderr);
    assert!(err.contains("taking over the lock of PID"), "{err}");
    assert!(!lock.exists(), "removed when the run ended");
}
