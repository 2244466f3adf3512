//! Several processes over loopback, as users run them: `learner --listen` and
//! `actor --n 8` processes train CartPole to the target, also when an actor is killed
//! with SIGKILL mid-run and another joins.
//!
//! The binaries must be built first (`cargo build --bins`; `scripts/test.sh` does).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn binary(name: &str) -> PathBuf {
    // Test executables live in target/<profile>/deps; binaries one level up.
    let exe = std::env::current_exe().unwrap();
    let path = exe.parent().unwrap().parent().unwrap().join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --bins` first (scripts/test.sh does)",
        path.display()
    );
    path
}

struct Learner {
    child: Child,
    addr: String,
    logdir: tempfile::TempDir,
}

/// Starts `learner --listen <listen>` and reads the address it bound from its log.
fn learner_on(listen: &str) -> Learner {
    let logdir = tempfile::tempdir().unwrap();
    let mut child = Command::new(binary("learner"))
        .args(["--listen", listen, "--no-progress", "--max-steps", "200000"])
        .arg("--logdir")
        .arg(logdir.path())
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(at) = line.find("listening for actors on ") {
                let addr = line[at + 24..].trim().to_string();
                let _ = tx.send(addr);
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("learner listens");
    Learner {
        child,
        addr,
        logdir,
    }
}

fn learner() -> Learner {
    learner_on("127.0.0.1:0")
}

fn actor(addr: &str, seed: u64) -> Child {
    Command::new(binary("actor"))
        .args(["--n", "8", "--learner", addr, "--seed", &seed.to_string()])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Waits for the learner to exit (up to `limit`); returns its stdout.
fn finish(mut l: Learner, limit: Duration) -> (Option<i32>, String) {
    let start = Instant::now();
    loop {
        if let Some(status) = l.child.try_wait().unwrap() {
            let mut out = String::new();
            std::io::Read::read_to_string(l.child.stdout.as_mut().unwrap(), &mut out).unwrap();
            assert!(l.logdir.path().join("checkpoint/meta.json").exists());
            return (status.code(), out);
        }
        if start.elapsed() > limit {
            let _ = l.child.kill();
            panic!("learner did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Bytes of TensorBoard events written so far: about 600 per second of training, a
/// cheap sign that training is under way.
fn tensorboard_bytes(logdir: &std::path::Path) -> u64 {
    std::fs::read_dir(logdir)
        .map(|d| {
            d.flatten()
                .map(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
                .sum()
        })
        .unwrap_or(0)
}

#[test]
fn a_learner_and_two_actor_processes_solve_cartpole() {
    let l = learner();
    let mut actors = vec![actor(&l.addr, 1), actor(&l.addr, 2)];
    let (code, out) = finish(l, Duration::from_secs(180));
    for a in &mut actors {
        let _ = a.kill();
        let _ = a.wait();
    }
    assert_eq!(code, Some(0), "not solved:\n{out}");
    assert!(out.contains("solved at"), "{out}");
}

#[test]
fn training_survives_an_actor_killed_mid_run() {
    let l = learner();
    let mut first = actor(&l.addr, 1);
    let mut second = actor(&l.addr, 2);
    // Let training get under way, then SIGKILL one actor mid-batch and start another.
    let start = Instant::now();
    while tensorboard_bytes(l.logdir.path()) < 2_000 && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(100));
    }
    first.kill().unwrap();
    first.wait().unwrap();
    let mut third = actor(&l.addr, 3);
    let (code, out) = finish(l, Duration::from_secs(180));
    for a in [&mut second, &mut third] {
        let _ = a.kill();
        let _ = a.wait();
    }
    assert_eq!(code, Some(0), "not solved after losing an actor:\n{out}");
}

#[test]
fn actors_reconnect_to_a_restarted_learner_by_themselves() {
    let first = learner();
    let addr = first.addr.clone();
    let mut actors = vec![actor(&addr, 1), actor(&addr, 2)];
    let start = Instant::now();
    while tensorboard_bytes(first.logdir.path()) < 1_000
        && start.elapsed() < Duration::from_secs(30)
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    // The learner dies without a goodbye; a new one comes up on the same address.
    let mut dead = first;
    dead.child.kill().unwrap();
    dead.child.wait().unwrap();
    let second = learner_on(&addr);
    let (code, out) = finish(second, Duration::from_secs(180));
    for a in &mut actors {
        let _ = a.kill();
        let _ = a.wait();
    }
    assert_eq!(code, Some(0), "the restarted learner was not fed:\n{out}");
}
