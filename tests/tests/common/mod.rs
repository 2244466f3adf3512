//! Helpers shared by the multi-process tests: a `learner --listen` child with its log
//! read as it runs, waiting for it and for actors to exit, and reading its log.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use millrace_tests::{binary, KillOnDrop};

pub mod prometheus;
pub mod reference;

pub struct Learner {
    /// Killed when the test ends, also when it fails.
    pub child: KillOnDrop,
    pub addr: String,
    pub logdir: std::path::PathBuf,
    /// Every line the learner logged.
    pub log: Arc<Mutex<Vec<String>>>,
    /// The thread reading the log: done once the learner has exited (end of stream).
    pub reader: std::thread::JoinHandle<()>,
}

/// Starts `learner --listen <listen>` (plus `extra`) writing to `logdir` and reads the
/// address it bound from its log.
pub fn learner_on(listen: &str, logdir: &std::path::Path, extra: &[&str]) -> Learner {
    let budget: &[&str] = if extra.contains(&"--max-steps") {
        &[]
    } else {
        &["--max-steps", "200000"]
    };
    let mut child = KillOnDrop::spawn(
        Command::new(binary("learner"))
            .args(["--listen", listen, "--no-progress"])
            .args(budget)
            .args(extra)
            .arg("--logdir")
            .arg(logdir)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
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

/// An `actor --n 8` process named `name`, serving the learner at `addr`, quiet; killed
/// when dropped.
pub fn actor(addr: &str, seed: u64, name: &str) -> KillOnDrop {
    KillOnDrop::spawn(
        Command::new(binary("actor"))
            .args(["--n", "8", "--learner", addr, "--seed", &seed.to_string()])
            .args(["--name", name])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
}

/// Waits for the learner to exit (up to `limit`); returns its status code and stdout.
pub fn finish(mut l: Learner, limit: Duration) -> (Option<i32>, String, Vec<String>) {
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
pub fn exits_by_itself(a: &mut Child, limit: Duration, log: &[String]) -> ExitStatus {
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

/// Transitions the learner's log says each named actor sent over its sessions.
pub fn received_from(log: &[String], name: &str) -> u64 {
    log.iter()
        .filter(|l| l.contains(&format!("actor \"{name}\"")))
        .filter_map(|l| {
            let at = l.find(" transitions received")?;
            l[..at].rsplit('(').next()?.parse::<u64>().ok()
        })
        .sum()
}
