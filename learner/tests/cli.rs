//! The `learner` binary as users run it: bad input gives one clear error line and a
//! non-zero exit, never a panic; a run checkpoints and `--resume` continues it.

use std::path::Path;
use std::process::{Command, Output};

fn learner(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_learner"))
        .args(args)
        .arg("--no-progress")
        .env("RUST_LOG", "warn")
        .env_remove("MILLRACE_TOKEN")
        .output()
        .expect("learner runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A clean failure: exit status 1, one `error:` line, no panic.
fn assert_clear_error(out: &Output, needle: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "one error line: {err}");
    assert!(
        lines[0].contains(needle),
        "{:?} does not mention {needle:?}",
        lines[0]
    );
}

#[test]
fn unknown_env_id_is_one_clear_error() {
    let out = learner(&["--env", "Pong-v5"]);
    assert_clear_error(&out, "unknown environment id \"Pong-v5\"");
    assert!(stderr(&out).contains("CartPole-v1"), "lists the known ids");
}

#[test]
fn bad_flag_values_are_rejected_before_training() {
    for (args, needle) in [
        (vec!["--lr=-1"], "--lr must be a positive number"),
        (vec!["--batch-size", "0"], "--batch-size must be at least 1"),
        (vec!["--gamma", "1.5"], "--gamma must be in [0, 1]"),
        (
            vec!["--hidden", "64,0"],
            "--hidden needs positive layer sizes",
        ),
        (vec!["--tau", "2"], "--tau must be in (0, 1]"),
        (
            vec!["--learning-starts", "10"],
            "--learning-starts (10) must be at least --batch-size (64)",
        ),
        (vec!["--resume", "/nonexistent/ckpt"], "no such checkpoint"),
        (
            vec!["--listen", "0.0.0.0:0"],
            "binding beyond loopback needs a token",
        ),
        (vec!["--actors", "0"], "--actors 0 needs --listen"),
    ] {
        assert_clear_error(&learner(&args), needle);
    }
    // Malformed values are clap's to report (exit status 2, usage shown).
    let out = learner(&["--max-steps", "many"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("invalid value 'many'"));
}

#[test]
fn help_documents_every_flag() {
    let out = Command::new(env!("CARGO_BIN_EXE_learner"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--env",
        "--actors",
        "--seed",
        "--gpu",
        "--max-steps",
        "--target-return",
        "--logdir",
        "--resume",
        "--samples-per-insert",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}");
    }
}

fn short_run(logdir: &Path, max_steps: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "--logdir",
        logdir.to_str().unwrap(),
        "--max-steps",
        max_steps,
        "--target-return",
        "1000",
        "--learning-starts",
        "500",
    ];
    args.extend_from_slice(extra);
    learner(&args)
}

#[test]
fn a_run_checkpoints_and_resume_continues_it() {
    let dir = tempfile::tempdir().unwrap();
    let first = short_run(dir.path(), "3000", &[]);
    let text = String::from_utf8_lossy(&first.stdout);
    // CartPole cannot return 1000: the step budget ends the run (exit status 2).
    assert_eq!(first.status.code(), Some(2), "{text}\n{}", stderr(&first));
    assert!(
        text.contains("target not reached within 3000 env steps"),
        "{text}"
    );
    let ckpt = dir.path().join("checkpoint");
    assert!(ckpt.join("meta.json").exists());
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ckpt.join("meta.json")).unwrap()).unwrap();
    let steps = meta["env_steps"].as_u64().unwrap();
    let updates = meta["updates"].as_u64().unwrap();
    assert!(steps >= 3000 && updates > 0, "{meta}");
    let events = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("events.out.tfevents")
        })
        .count();
    assert_eq!(events, 1, "one TensorBoard event file");

    let second = short_run(dir.path(), "5000", &["--resume", ckpt.to_str().unwrap()]);
    assert_eq!(second.status.code(), Some(2), "{}", stderr(&second));
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ckpt.join("meta.json")).unwrap()).unwrap();
    assert!(meta["env_steps"].as_u64().unwrap() >= 5000, "{meta}");
    assert!(
        meta["updates"].as_u64().unwrap() > updates,
        "updates continue from the checkpoint"
    );

    // The same checkpoint on another environment or network is refused clearly.
    let out = learner(&["--env", "Acrobot-v1", "--resume", ckpt.to_str().unwrap()]);
    assert_clear_error(
        &out,
        "it was trained on CartPole-v1, this run is Acrobot-v1",
    );
    let out = learner(&["--hidden", "32", "--resume", ckpt.to_str().unwrap()]);
    assert_clear_error(&out, "check --hidden");

    // A damaged checkpoint is an error, not a panic.
    std::fs::write(ckpt.join("meta.json"), b"{ not json").unwrap();
    let out = learner(&["--resume", ckpt.to_str().unwrap()]);
    assert_clear_error(&out, "not a millrace checkpoint");
}

#[test]
fn sigterm_stops_cleanly_with_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_learner"))
        .args([
            "--no-progress",
            "--target-return",
            "1000",
            "--max-steps",
            "100000000",
        ])
        .arg("--logdir")
        .arg(dir.path())
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until training is under way (the first TensorBoard point is written).
    let start = std::time::Instant::now();
    while start.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(200));
        let events = std::fs::read_dir(dir.path()).unwrap().flatten().find(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("events.out.tfevents")
        });
        if events.is_some_and(|e| e.metadata().unwrap().len() > 200) {
            break;
        }
    }
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(130), "{text}\n{}", stderr(&out));
    assert!(text.contains("interrupted"), "{text}");
    assert!(
        dir.path().join("checkpoint/meta.json").exists(),
        "checkpoint written on the way out"
    );
}
