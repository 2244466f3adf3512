//! Several processes over loopback, as users run them: `learner --listen` and
//! `actor --n 8` processes train CartPole to the target and the actors exit by
//! themselves when told the run is finished; an actor SIGKILLed mid-run is replaced
//! and the replacement contributes; a learner that dies, or is stopped by SIGTERM and
//! resumed, is found again by the same actors, which retry meanwhile.
//!
//! The binaries must be built first (`cargo build --bins`; `scripts/test.sh` does).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use millrace_tests::{binary, signal, wait_until};

struct Learner {
    child: Child,
    addr: String,
    logdir: std::path::PathBuf,
    /// Every line the learner logged.
    log: Arc<Mutex<Vec<String>>>,
    /// The thread reading the log: done once the learner has exited (end of stream).
    reader: std::thread::JoinHandle<()>,
}

/// Starts `learner --listen <listen>` (plus `extra`) writing to `logdir` and reads the
/// address it bound from its log.
fn learner_on(listen: &str, logdir: &std::path::Path, extra: &[&str]) -> Learner {
    let budget: &[&str] = if extra.contains(&"--max-steps") {
        &[]
    } else {
        &["--max-steps", "200000"]
    };
    let mut child = Command::new(binary("learner"))
        .args(["--listen", listen, "--no-progress"])
        .args(budget)
        .args(extra)
        .arg("--logdir")
        .arg(logdir)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let lines = Arc::clone(&log);
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(at) = line.find("listening for actors on ") {
                let _ = tx.send(line[at + 24..].trim().to_string());
            }
            lines.lock().unwrap().push(line);
        }
    });
    let Ok(addr) = rx.recv_timeout(Duration::from_secs(30)) else {
        let _ = child.kill();
        let _ = child.wait();
        let _ = reader.join();
        panic!(
            "the learner did not listen:\n{}",
            log.lock().unwrap().join("\n")
        );
    };
    Learner {
        child,
        addr,
        logdir: logdir.to_path_buf(),
        log,
        reader,
    }
}

fn actor(addr: &str, seed: u64, name: &str) -> Child {
    Command::new(binary("actor"))
        .args(["--n", "8", "--learner", addr, "--seed", &seed.to_string()])
        .args(["--name", name])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Waits for the learner to exit (up to `limit`); returns its status code and stdout.
fn finish(mut l: Learner, limit: Duration) -> (Option<i32>, String, Vec<String>) {
    let start = Instant::now();
    loop {
        if let Some(status) = l.child.try_wait().unwrap() {
            let mut out = String::new();
            std::io::Read::read_to_string(l.child.stdout.as_mut().unwrap(), &mut out).unwrap();
            assert!(l.logdir.join("checkpoint/latest/meta.json").exists());
            // The learner has exited: its log ends, and the reader with it.
            l.reader.join().unwrap();
            let log = l.log.lock().unwrap().clone();
            return (status.code(), out, log);
        }
        if start.elapsed() > limit {
            let _ = l.child.kill();
            panic!("learner did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits for an actor to exit by itself (the learner's `log` explains a failure).
fn exits_by_itself(a: &mut Child, limit: Duration, log: &[String]) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = a.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > limit {
            let _ = a.kill();
            panic!(
                "the actor did not exit within {limit:?}; the learner's log:\n{}",
                log.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Bytes of TensorBoard events written so far: about 600 per second of training, a
/// cheap sign that training is under way.
fn tensorboard_bytes(logdir: &std::path::Path) -> u64 {
    std::fs::read_dir(logdir)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("events"))
                .map(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
                .sum()
        })
        .unwrap_or(0)
}

fn under_way(logdir: &std::path::Path, bytes: u64) {
    wait_until("training is under way", Duration::from_secs(60), || {
        tensorboard_bytes(logdir) >= bytes
    });
}

#[test]
fn a_learner_and_two_actor_processes_solve_cartpole_and_the_actors_exit() {
    let dir = tempfile::tempdir().unwrap();
    let l = learner_on("127.0.0.1:0", dir.path(), &[]);
    let mut actors = vec![actor(&l.addr, 1, "one"), actor(&l.addr, 2, "two")];
    let (code, out, log) = finish(l, Duration::from_secs(180));
    assert_eq!(code, Some(0), "not solved:\n{out}");
    assert!(out.contains("solved at"), "{out}");
    assert!(dir.path().join("checkpoint/solved/meta.json").exists());
    assert_eq!(
        log.iter()
            .filter(|l| l.contains("told RunFinished"))
            .count(),
        2,
        "both actors were told the run is finished:\n{}",
        log.join("\n")
    );
    // Told the run is finished, both actors exit 0 by themselves.
    for a in &mut actors {
        let status = exits_by_itself(a, Duration::from_secs(20), &log);
        assert!(status.success(), "{status}");
    }
}

#[test]
fn training_survives_an_actor_killed_mid_run_and_the_replacement_contributes() {
    let dir = tempfile::tempdir().unwrap();
    let l = learner_on("127.0.0.1:0", dir.path(), &[]);
    let mut first = actor(&l.addr, 1, "first");
    let mut second = actor(&l.addr, 2, "second");
    // Let training get under way, then SIGKILL one actor mid-batch and start another.
    under_way(dir.path(), 2_000);
    first.kill().unwrap();
    first.wait().unwrap();
    let mut replacement = actor(&l.addr, 3, "replacement");
    let (code, out, log) = finish(l, Duration::from_secs(180));
    assert_eq!(code, Some(0), "not solved after losing an actor:\n{out}");
    let joined = log
        .iter()
        .any(|l| l.contains("actor \"replacement\" joined"));
    assert!(joined, "the replacement was admitted:\n{}", log.join("\n"));
    assert!(
        received_from(&log, "replacement") > 0,
        "the replacement sent transitions:\n{}",
        log.join("\n")
    );
    for a in [&mut second, &mut replacement] {
        assert!(exits_by_itself(a, Duration::from_secs(20), &log).success());
    }
}

/// Transitions the learner's log says each named actor sent over its sessions.
fn received_from(log: &[String], name: &str) -> u64 {
    log.iter()
        .filter(|l| l.contains(&format!("actor \"{name}\"")))
        .filter_map(|l| {
            let at = l.find(" transitions received")?;
            l[..at].rsplit('(').next()?.parse::<u64>().ok()
        })
        .sum()
}

fn joined(l: &Learner, name: &str) -> bool {
    let needle = format!("actor \"{name}\" joined");
    l.log
        .lock()
        .unwrap()
        .iter()
        .any(|line| line.contains(&needle))
}

#[test]
fn actors_reconnect_to_a_learner_that_died_and_came_back() {
    let dir = tempfile::tempdir().unwrap();
    let first = learner_on("127.0.0.1:0", dir.path(), &[]);
    let addr = first.addr.clone();
    let mut actors = [actor(&addr, 1, "one"), actor(&addr, 2, "two")];
    under_way(dir.path(), 1_000);
    // The learner dies without a goodbye; a new one comes up on the same address.
    let mut dead = first;
    dead.child.kill().unwrap();
    dead.child.wait().unwrap();
    let fresh = tempfile::tempdir().unwrap();
    let second = learner_on(&addr, fresh.path(), &["--target-return", "1000"]);
    // Both find it by themselves (within their backoff) and feed it.
    wait_until("both actors rejoin", Duration::from_secs(60), || {
        joined(&second, "one") && joined(&second, "two")
    });
    under_way(fresh.path(), 1_000);
    signal(&second.child, "-TERM");
    let (code, out, log) = finish(second, Duration::from_secs(60));
    assert_eq!(code, Some(130), "{out}");
    for name in ["one", "two"] {
        assert!(
            received_from(&log, name) > 0,
            "{name} fed the restarted learner:\n{}",
            log.join("\n")
        );
    }
    // Told the learner is stopping (not that the run is over), they stay.
    for a in &mut actors {
        assert!(a.try_wait().unwrap().is_none(), "actors keep retrying");
        let _ = a.kill();
        let _ = a.wait();
    }
}

#[test]
fn a_learner_stopped_by_sigterm_resumes_and_its_actors_wait_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let first = learner_on("127.0.0.1:0", dir.path(), &["--target-return", "1000"]);
    let addr = first.addr.clone();
    let mut actors = [actor(&addr, 1, "one"), actor(&addr, 2, "two")];
    under_way(dir.path(), 1_000);
    signal(&first.child, "-TERM");
    let (code, out, log) = finish(first, Duration::from_secs(60));
    assert_eq!(code, Some(130), "{out}");
    assert_eq!(
        log.iter()
            .filter(|l| l.contains("told LearnerStopping"))
            .count(),
        2,
        "both actors were told the learner is stopping:\n{}",
        log.join("\n")
    );
    let ckpt = dir.path().join("checkpoint");
    let second = learner_on(&addr, dir.path(), &["--resume", ckpt.to_str().unwrap()]);
    let (code, out, log) = finish(second, Duration::from_secs(180));
    assert_eq!(code, Some(0), "the resumed learner did not solve:\n{out}");
    assert!(out.contains("solved at"), "{out}");
    // Every actor the resumed learner told the run is finished exits 0 by itself; one
    // still in its backoff when the run ended keeps retrying, as it should.
    let mut told = 0;
    for (a, name) in actors.iter_mut().zip(["one", "two"]) {
        if log
            .iter()
            .any(|l| l.contains(&format!("actor \"{name}\" told RunFinished")))
        {
            told += 1;
            assert!(
                exits_by_itself(a, Duration::from_secs(20), &log).success(),
                "{name}"
            );
        } else {
            assert!(a.try_wait().unwrap().is_none(), "{name} keeps retrying");
            let _ = a.kill();
            let _ = a.wait();
        }
    }
    assert!(
        told >= 1,
        "the resumed learner was fed:\n{}",
        log.join("\n")
    );
}

#[test]
fn remote_actors_serve_a_bridged_pixel_env_through_the_wire_into_replay() {
    // MinAtar through the Gymnasium bridge on both sides: the learner sends how to
    // build the environment in the welcome; the actor builds it, checks its spaces
    // against the learner's, and streams u8 image batches.
    let dir = tempfile::tempdir().unwrap();
    let l = learner_on(
        "127.0.0.1:0",
        dir.path(),
        &[
            "--env",
            "gym:MinAtar/Breakout-v1",
            "--cpu",
            "--max-steps",
            "3000",
            "--learning-starts",
            "256",
            "--batch-size",
            "32",
            "--replay-capacity",
            "8192",
            "--eval-every",
            "1000000",
            "--target-return",
            "1000",
        ],
    );
    let mut a = Command::new(binary("actor"))
        .args(["--n", "4", "--learner", &l.addr, "--name", "pixels"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (code, out, log) = finish(l, Duration::from_secs(180));
    // The step budget ends the run (MinAtar Breakout cannot return 1000).
    assert_eq!(code, Some(2), "{out}\n{}", log.join("\n"));
    assert!(received_from(&log, "pixels") >= 3000, "{}", log.join("\n"));
    let latest = millrace_tests::read_json(&dir.path().join("checkpoint/latest/meta.json"));
    assert_eq!(
        latest["env"]["obs"]["shape"],
        serde_json::json!([4, 10, 10])
    );
    assert!(latest["updates"].as_u64().unwrap() > 0, "{latest}");
    let status = exits_by_itself(&mut a, Duration::from_secs(20), &log);
    let mut err = String::new();
    std::io::Read::read_to_string(a.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{status}: {err}");
}

#[test]
fn an_actor_with_64_atari_games_sends_batches_the_learner_reads() {
    // Pong's 28,224-byte stacks: the learner sizes each actor's batches to fit the
    // frames it reads (64 MiB for images, told in the welcome), so `actor --n 64`
    // delivers instead of failing to encode.
    let dir = tempfile::tempdir().unwrap();
    let l = learner_on(
        "127.0.0.1:0",
        dir.path(),
        &[
            "--env",
            "PongNoFrameskip-v4",
            "--cpu",
            "--max-steps",
            "2000",
            "--learning-starts",
            "256",
            "--batch-size",
            "32",
            "--samples-per-insert",
            "1",
            "--replay-capacity",
            "16384",
            "--eval-every",
            "1000000",
        ],
    );
    let mut a = Command::new(binary("actor"))
        .args(["--n", "64", "--learner", &l.addr, "--name", "pong"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (code, out, log) = finish(l, Duration::from_secs(180));
    let status = exits_by_itself(&mut a, Duration::from_secs(30), &log);
    let mut err = String::new();
    std::io::Read::read_to_string(a.stderr.as_mut().unwrap(), &mut err).unwrap();
    // Pong has no reward threshold: the step budget ends the run (exit status 2).
    assert_eq!(code, Some(2), "{out}\n{}\nactor: {err}", log.join("\n"));
    assert!(received_from(&log, "pong") >= 2000, "{}", log.join("\n"));
    assert!(status.success(), "{status}: {err}");
}
