//! The `learner` binary as users run it: bad input gives one clear error line and exit
//! status 1, never a panic; a run checkpoints and `--resume` continues it; SIGTERM stops
//! it with a checkpoint (130); a component failing after threads started goes through
//! the shutdown path and exits 1 promptly, saying which component and what became of the
//! checkpoint.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use clap::CommandFactory;
use millrace_learner::cli::Args;
use millrace_tests::{error_line, read_json};

fn learner_cmd(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_learner"));
    c.args(args)
        .arg("--no-progress")
        .env("RUST_LOG", "warn")
        .env_remove("MILLRACE_TOKEN")
        .env_remove("MILLRACE_INJECT_FAULT");
    c
}

fn learner(args: &[&str]) -> Output {
    learner_cmd(args).output().expect("learner runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
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
            // CartPole-v1's table (the `classic` preset) sets batches of 256.
            vec!["--learning-starts", "10"],
            "--learning-starts (10) must be at least --batch-size (256)",
        ),
        (vec!["--resume", "/nonexistent/ckpt"], "no such checkpoint"),
        (
            vec!["--listen", "0.0.0.0:0"],
            "binding beyond loopback needs a token",
        ),
        (vec!["--actors", "0"], "--actors 0 needs --listen"),
        (
            vec!["--actors", "auto", "--deterministic"],
            "--actors auto sizes the actor threads of a threaded run",
        ),
        (
            vec!["--max-nonfinite", "0"],
            "--max-nonfinite must be at least 1",
        ),
        (
            vec!["--replay-capacity", "4000000000000", "--replay-shards", "1"],
            "lower --replay-capacity",
        ),
        (
            vec!["--lr-final=-1e-4"],
            "--lr-final must be a positive number",
        ),
    ] {
        // Refused before anything starts: the run's directory is never created.
        let dir = tempfile::tempdir().unwrap();
        let logdir = dir.path().join("run");
        let mut args = args;
        args.extend(["--logdir", logdir.to_str().unwrap()]);
        assert_clear_error(&learner(&args), needle);
        assert!(!logdir.exists(), "{needle}: wrote {}", logdir.display());
    }
    // Malformed values are clap's to report (exit status 2, usage shown).
    let out = learner(&["--max-steps", "many"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("invalid value 'many'"));
}

#[test]
fn a_gpu_that_is_not_there_is_a_clear_error() {
    let out = learner(&["--gpu", "7"]);
    if tch::Cuda::is_available() {
        // On a GPU host: an index beyond the devices, which are listed.
        assert_clear_error(&out, "--gpu 7: no such device; this machine has");
    } else {
        assert_clear_error(&out, "--gpu 7: CUDA is not available on this machine");
        assert!(stderr(&out).contains("learner doctor"), "{}", stderr(&out));
    }
}

#[test]
fn help_documents_every_flag() {
    let out = Command::new(env!("CARGO_BIN_EXE_learner"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    let cmd = Args::command();
    let mut checked = 0;
    for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
        let Some(long) = arg.get_long() else { continue };
        let flag = format!("--{long}");
        assert!(help.contains(&flag), "--help lacks {flag}");
        let doc = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
        assert!(doc.len() > 10, "{flag} has no real description: {doc:?}");
        checked += 1;
    }
    assert!(checked >= 35, "only {checked} flags found");
    for sub in ["export", "eval", "doctor"] {
        assert!(help.contains(sub), "--help lacks the {sub} subcommand");
        let out = Command::new(env!("CARGO_BIN_EXE_learner"))
            .args([sub, "--help"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{sub} --help");
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
    let text = stdout(&first);
    // CartPole cannot return 1000: the step budget ends the run (exit status 2).
    assert_eq!(first.status.code(), Some(2), "{text}\n{}", stderr(&first));
    assert!(
        text.contains("target 1000.0 not reached within 3000 env steps"),
        "{text}"
    );
    let ckpt = dir.path().join("checkpoint");
    let latest = read_json(&ckpt.join("latest/meta.json"));
    let steps = latest["env_steps"].as_u64().unwrap();
    let updates = latest["updates"].as_u64().unwrap();
    assert!(steps >= 3000 && updates > 0, "{latest}");
    assert_eq!(latest["run_finished"], "max steps");
    // Every evaluation's parameters are kept: best/ holds the best one's exactly.
    let best = read_json(&ckpt.join("best/meta.json"));
    assert_eq!(best["which"], "best");
    assert!(best["eval"]["mean"].as_f64().is_some() && best["eval"]["std"].as_f64().is_some());
    assert!(!ckpt.join("solved").exists(), "not solved");
    // The effective configuration, every setting, beside the checkpoints.
    let config = read_json(&ckpt.join("config.json"));
    assert_eq!(config["max_steps"], 3000);
    assert_eq!(
        config["dqn"]["lr"], 1e-3,
        "CartPole-v1's table (the classic preset) included"
    );
    assert_eq!(config["replay"]["learning_starts"], 500);
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

    // A new run there is refused: it would overwrite the first one's checkpoint.
    let out = short_run(dir.path(), "5000", &[]);
    assert_clear_error(&out, "already holds a run's checkpoint");
    // So is one that left only its configuration and best/ (killed before any latest/).
    let partial = tempfile::tempdir().unwrap();
    let kept = partial.path().join("checkpoint");
    std::fs::create_dir_all(kept.join("best")).unwrap();
    std::fs::copy(ckpt.join("best/meta.json"), kept.join("best/meta.json")).unwrap();
    std::fs::copy(ckpt.join("config.json"), kept.join("config.json")).unwrap();
    let out = short_run(partial.path(), "5000", &[]);
    assert_clear_error(&out, "already holds a run's checkpoint");
    assert!(
        !stderr(&out).contains("--resume"),
        "nothing to resume: {}",
        stderr(&out)
    );
    assert_eq!(
        std::fs::read(kept.join("best/meta.json")).unwrap(),
        std::fs::read(ckpt.join("best/meta.json")).unwrap()
    );
    // The continued run keeps best/ unless it beats it: mark the saved best as
    // unbeatable, and let the continuation evaluate often.
    let best_meta = ckpt.join("best/meta.json");
    let mut best = read_json(&best_meta);
    best["eval"]["mean"] = 99_999.0.into();
    std::fs::write(&best_meta, best.to_string()).unwrap();
    let second = short_run(
        dir.path(),
        "5000",
        &["--resume", ckpt.to_str().unwrap(), "--eval-every", "500"],
    );
    assert_eq!(second.status.code(), Some(2), "{}", stderr(&second));
    let text = stdout(&second);
    assert!(
        !text.contains("last eval:       n/a"),
        "it evaluated: {text}"
    );
    assert_eq!(read_json(&best_meta), best, "best/ kept: nothing beat it");
    let latest = read_json(&ckpt.join("latest/meta.json"));
    assert!(latest["env_steps"].as_u64().unwrap() >= 5000, "{latest}");
    assert!(
        latest["updates"].as_u64().unwrap() > updates,
        "updates continue from the checkpoint"
    );

    // The same checkpoint on another environment or network is refused clearly, and
    // the refused run changes nothing of the one it meant to continue.
    let logdir = dir.path().to_str().unwrap();
    let config_before = std::fs::read(ckpt.join("config.json")).unwrap();
    let resume = |extra: &[&str]| {
        let mut args = vec!["--logdir", logdir, "--resume", ckpt.to_str().unwrap()];
        args.extend_from_slice(extra);
        learner(&args)
    };
    let out = resume(&["--env", "Acrobot-v1"]);
    assert_clear_error(
        &out,
        "it was trained on CartPole-v1, this run is Acrobot-v1",
    );
    let out = resume(&["--hidden", "32"]);
    assert_clear_error(&out, "check --hidden");
    assert_eq!(
        std::fs::read(ckpt.join("config.json")).unwrap(),
        config_before,
        "a refused resume leaves the run's configuration alone"
    );

    // A damaged checkpoint is an error, not a panic.
    std::fs::write(ckpt.join("latest/meta.json"), b"{ not json").unwrap();
    let out = resume(&[]);
    assert_clear_error(&out, "not a millrace checkpoint");
}

/// Waits until a run has written its first TensorBoard point (training under way).
/// A resumed run takes up the learning-rate schedule where the saved one was, and says
/// so when its flags put the rate somewhere else (a longer --max-steps stretches a
/// decay whose length defaults to it).
#[test]
fn resuming_with_another_learning_rate_schedule_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    // Acrobot-v1: its table leaves --lr-decay-steps to default to --max-steps
    // (CartPole-v1's sets it).
    let decay = ["--env", "Acrobot-v1", "--lr-final", "2e-4"];
    let first = short_run(dir.path(), "3000", &decay);
    assert_eq!(first.status.code(), Some(2), "{}", stderr(&first));
    let resume = |max_steps: &str, extra: &[&str]| {
        let ckpt = dir.path().join("checkpoint");
        let mut args = vec!["--resume", ckpt.to_str().unwrap()];
        args.extend_from_slice(&decay);
        args.extend_from_slice(extra);
        let mut cmd = learner_cmd(&[]);
        cmd.args([
            "--logdir",
            dir.path().to_str().unwrap(),
            "--max-steps",
            max_steps,
        ])
        .args(["--target-return", "1000", "--learning-starts", "500"])
        .args(&args);
        cmd.output().unwrap()
    };
    // The decay ran over --max-steps 3000: this run's 4000 would put the rate back up.
    let stretched = resume("4000", &[]);
    assert_eq!(stretched.status.code(), Some(2), "{}", stderr(&stretched));
    assert!(
        stderr(&stretched).contains("the learning rate is")
            && stderr(&stretched).contains("it jumps here"),
        "{}",
        stderr(&stretched)
    );
    // The same schedule, spelled out: no warning.
    let same = resume("5000", &["--lr-decay-steps", "3000"]);
    assert_eq!(same.status.code(), Some(2), "{}", stderr(&same));
    assert!(
        !stderr(&same).contains("it jumps here"),
        "{}",
        stderr(&same)
    );
}

fn wait_for_training(logdir: &Path) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(100));
        let events = std::fs::read_dir(logdir).unwrap().flatten().find(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("events.out.tfevents")
        });
        if events.is_some_and(|e| e.metadata().unwrap().len() > 200) {
            return;
        }
    }
    panic!("training did not start within 60 s");
}

#[test]
fn sigterm_stops_cleanly_with_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let child = millrace_tests::KillOnDrop::spawn(
        learner_cmd(&["--target-return", "1000", "--max-steps", "100000000"])
            .arg("--logdir")
            .arg(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    wait_for_training(dir.path());
    millrace_tests::signal(&child, "-TERM");
    let out = child.into_inner().wait_with_output().unwrap();
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(130), "{text}\n{}", stderr(&out));
    assert!(text.contains("interrupted (checkpoint written)"), "{text}");
    let latest = read_json(&dir.path().join("checkpoint/latest/meta.json"));
    assert!(
        latest["run_finished"].is_null(),
        "a stopped run is not finished"
    );
}

/// Runs with `MILLRACE_INJECT_FAULT=<fault>` and returns the output and how long it took.
fn faulty_run(fault: &str, logdir: &Path) -> (Output, Duration) {
    let start = Instant::now();
    let out = learner_cmd(&["--target-return", "1000", "--max-steps", "100000000"])
        .arg("--logdir")
        .arg(logdir)
        .env("MILLRACE_INJECT_FAULT", fault)
        .output()
        .unwrap();
    (out, start.elapsed())
}

#[test]
fn a_component_failing_after_start_fails_the_run_promptly() {
    for (fault, component, checkpoint) in [
        (
            "evaluator",
            "the evaluator failed",
            "a checkpoint was written",
        ),
        (
            "sampler",
            "the learner failed: the sampler failed",
            "a checkpoint was written",
        ),
        (
            "actor",
            "the actor 0 failed: injected fault",
            "a checkpoint was written",
        ),
        (
            "learner-panic",
            "the learner failed: panicked: injected fault",
            "the last good checkpoint was kept",
        ),
        (
            "learner-oom",
            "the learner failed: out of memory on cpu: DefaultCPUAllocator: not enough memory",
            "--batch-size",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (out, took) = faulty_run(fault, dir.path());
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{fault}: {err}");
        let line = error_line(&err);
        assert!(line.contains(component), "{fault}: {line}");
        assert!(line.contains(checkpoint), "{fault}: {line}");
        assert!(took < Duration::from_secs(60), "{fault}: took {took:?}");
        assert!(
            !stdout(&out).contains("run summary"),
            "a failure is not a result"
        );
        if checkpoint.starts_with("a checkpoint") || fault == "learner-oom" {
            assert!(
                dir.path().join("checkpoint/latest/meta.json").exists(),
                "{fault}"
            );
        }
        if fault == "learner-oom" {
            assert!(
                line.contains("--batch-size") && line.contains("a checkpoint was written"),
                "{line}"
            );
        }
    }
}

#[test]
fn out_of_memory_at_each_device_site_ends_through_the_shutdown_path() {
    // CUDA's caching-allocator message, injected where the learner thread touches the
    // device: each ends the run with exit status 1, the sizes and what to change, and
    // a checkpoint kept.
    for site in ["copy", "update", "priorities", "publish", "stats"] {
        let dir = tempfile::tempdir().unwrap();
        let fault = format!("oom:{site}:cuda");
        let out = learner_cmd(&["--target-return", "1000", "--max-steps", "100000000"])
            .args(["--replay", "prioritized", "--logdir"])
            .arg(dir.path())
            .env("MILLRACE_INJECT_FAULT", &fault)
            .output()
            .unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{fault}: {err}");
        let line = error_line(&err);
        assert!(
            line.contains(
                "the learner failed: out of memory on cpu: CUDA out of memory. Tried to allocate 1024.00 GiB"
            )
                && line.contains(&format!("injected fault at {site}")),
            "{fault}: {line}"
        );
        assert!(
            line.contains("--batch-size") && line.contains("a checkpoint was written"),
            "{fault}: {line}"
        );
        let meta: serde_json::Value = read_json(&dir.path().join("checkpoint/latest/meta.json"));
        assert!(meta["updates"].as_u64().unwrap() >= 50, "{fault}: {meta}");
        assert!(meta["replay_file"].is_string(), "{fault}: replay kept too");
    }
}

#[test]
fn a_server_that_cannot_bind_fails_the_run_after_its_threads_started() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let start = Instant::now();
    let out = learner_cmd(&["--listen", &addr, "--actors", "1"])
        .arg("--logdir")
        .arg(dir.path())
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let line = err.lines().find(|l| l.starts_with("error:")).unwrap();
    assert!(line.contains(&format!("cannot listen on {addr}")), "{line}");
    assert!(line.contains("a checkpoint was written"), "{line}");
    assert!(start.elapsed() < Duration::from_secs(30));
    drop(taken);
}

#[test]
fn a_diverging_run_stops_with_the_last_good_checkpoint_kept() {
    let dir = tempfile::tempdir().unwrap();
    // A learning rate that blows the network up within a few updates.
    let out = short_run(
        dir.path(),
        "100000000",
        &[
            "--lr",
            "1e30",
            "--max-nonfinite",
            "20",
            "--checkpoint-every-s",
            "1",
        ],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let line = err.lines().find(|l| l.starts_with("error:")).unwrap();
    assert!(line.contains("non-finite loss"), "{line}");
    assert!(line.contains("the last good checkpoint was kept"), "{line}");
    assert!(line.contains("--lr"), "says what to change: {line}");
}

#[test]
fn doctor_reports_the_set_up_and_treats_no_gpu_as_a_warning() {
    let out = Command::new(env!("CARGO_BIN_EXE_learner"))
        .arg("doctor")
        .output()
        .unwrap();
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    for part in [
        "libtorch",
        "PyTorch 2.11.0",
        "tch",
        "0.24.0",
        "libtorch_cuda",
        "CUDA devices",
    ] {
        assert!(text.contains(part), "{part:?} missing:\n{text}");
    }
    if !tch::Cuda::is_available() {
        assert!(text.contains("warn"), "no GPU is a warning:\n{text}");
    }
}
