//! Pixel environments through the `learner` binary: an Atari game (ale-py) and MinAtar
//! (Gymnasium bridge) train embedded, checkpoint, and their saved CNN policies evaluate
//! and export; a bridged environment that cannot be built is one clear error line
//! before anything starts.
#![cfg(feature = "gym")]

use std::path::Path;
use std::process::{Command, Output};

use millrace_tests::{output_text as text, read_json};

fn learner(args: &[&str]) -> Output {
    learner_logging(args, "warn")
}

fn learner_logging(args: &[&str], log: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_learner"))
        .args(args)
        .arg("--no-progress")
        .env("RUST_LOG", log)
        .env_remove("MILLRACE_INJECT_FAULT")
        .output()
        .expect("learner runs")
}

/// A short CPU run on `env` into `logdir`, ending at its step budget (exit status 2).
fn short_run(env: &str, logdir: &Path, extra: &[&str]) -> Output {
    learner(&short_args(env, logdir, extra))
}

fn short_args<'a>(env: &'a str, logdir: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "--env",
        env,
        "--cpu",
        "--logdir",
        logdir.to_str().unwrap(),
        "--envs-per-actor",
        "4",
        "--actor-batch",
        "32",
        "--batch-size",
        "32",
        "--learning-starts",
        "256",
        "--replay-capacity",
        "4096",
        "--samples-per-insert",
        "1",
        "--target-return",
        "1000",
    ];
    args.extend_from_slice(extra);
    args
}

#[test]
fn a_short_embedded_atari_run_completes_checkpoints_and_exports() {
    let dir = tempfile::tempdir().unwrap();
    // No evaluation inside the budget: a Pong episode takes thousands of CNN steps.
    let out = short_run(
        "PongNoFrameskip-v4",
        dir.path(),
        &["--max-steps", "1200", "--eval-every", "1000000"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let latest = read_json(&dir.path().join("checkpoint/latest/meta.json"));
    assert_eq!(latest["env"]["id"], "PongNoFrameskip-v4");
    assert_eq!(
        latest["env"]["obs"]["shape"],
        serde_json::json!([4, 84, 84])
    );
    assert_eq!(latest["network"]["hidden"], serde_json::json!([512]));
    assert!(latest["updates"].as_u64().unwrap() > 0, "{latest}");
    let config = read_json(&dir.path().join("checkpoint/config.json"));
    assert_eq!(
        config["clip_rewards"], true,
        "Atari clips training rewards by default"
    );

    let export = dir.path().join("pong.safetensors");
    let out = Command::new(env!("CARGO_BIN_EXE_learner"))
        .args(["export", "--checkpoint"])
        .arg(dir.path().join("checkpoint"))
        .arg("--out")
        .arg(&export)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let description = read_json(&dir.path().join("pong.json"));
    assert_eq!(description["env_id"], "PongNoFrameskip-v4");
    assert_eq!(description["preprocessing"]["dtype"], "uint8");
    assert_eq!(description["layers"][0]["type"], "conv2d");
    assert_eq!(description["layers"][0]["out_channels"], 32);

    // Resuming reads replay back: each frame once, the links between them, the
    // transitions (frame mode), all of them.
    let ckpt = dir.path().join("checkpoint");
    let more = [
        "--resume",
        ckpt.to_str().unwrap(),
        "--max-steps",
        "1400",
        "--eval-every",
        "1000000",
    ];
    let out = learner_logging(&short_args("PongNoFrameskip-v4", dir.path(), &more), "info");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let log = text(&out);
    let line = log
        .lines()
        .find(|l| l.contains("replay: holds"))
        .unwrap_or_else(|| panic!("no replay line: {log}"));
    let held: usize = line
        .split("holds ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(held >= 1000, "most of 1,200 steps' transitions: {line}");
    assert!(line.contains(", 0 skipped"), "{line}");
    assert!(!log.contains("replay dropped"), "{log}");
}

#[test]
fn minatar_trains_embedded_and_its_saved_policy_evaluates() {
    let dir = tempfile::tempdir().unwrap();
    let out = short_run(
        "gym:MinAtar/Breakout-v1",
        dir.path(),
        &[
            "--max-steps",
            "3000",
            "--eval-every",
            "1500",
            "--eval-episodes",
            "4",
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let best = read_json(&dir.path().join("checkpoint/best/meta.json"));
    assert_eq!(best["env"]["obs"]["shape"], serde_json::json!([4, 10, 10]));
    assert_eq!(best["network"]["conv"][0]["out_channels"], 16);
    assert_eq!(best["eval"]["episodes"], 4);

    let out = Command::new(env!("CARGO_BIN_EXE_learner"))
        .args(["eval", "--episodes", "3", "--json", "--checkpoint"])
        .arg(dir.path().join("checkpoint"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["env"], "gym:MinAtar/Breakout-v1");
    assert_eq!(result["returns"].as_array().unwrap().len(), 3);
}

#[test]
fn a_bridged_env_that_cannot_be_built_is_one_error_line_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    for (args, needle) in [
        (vec!["--env", "gym:NoSuchEnv-v0"], "NoSuchEnv"),
        (vec!["--env", "gym:Pendulum-v1"], "not Discrete"),
        (
            vec!["--env", "gym:Foo-v0", "--env-module", "no_such_module_here"],
            "does not import",
        ),
        (
            vec!["--env", "gym:CartPole-v1", "--env-kwargs", "[1]"],
            "JSON object",
        ),
        (
            vec!["--env", "ALE/Pong-v5", "--network", "mlp"],
            "image observations",
        ),
    ] {
        let logdir = dir.path().join("run");
        let mut all = args.clone();
        all.extend(["--logdir", logdir.to_str().unwrap()]);
        let out = learner(&all);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(lines.len(), 1, "{args:?}: one error line: {err}");
        assert!(lines[0].contains(needle), "{args:?}: {err}");
        assert!(!logdir.exists(), "{args:?}: nothing written");
    }
}
