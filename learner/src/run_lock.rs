//! One learner per log directory: `LOGDIR/.millrace.lock` names its owner (host, PID
//! and the process's start time, so a reused PID is not mistaken for the owner) and
//! carries a heartbeat. A second learner on the same directory is refused with one line;
//! a stale lock (its owner gone, or no heartbeat for [`STALE_AFTER`], as after a
//! requeue on a shared file system) is taken over with a warning.
//!
//! Two learners writing one directory would overwrite each other's checkpoints (every
//! container is PID 1, so per-PID temporary names do not keep them apart).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::checkpoint::files::{read_json, write_json};

/// The lock file's name in the log directory.
pub const LOCK_FILE: &str = ".millrace.lock";
/// How often the owner rewrites its heartbeat.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(5);
/// A lock whose heartbeat is older than this (and whose owner cannot be checked on this
/// host) is stale.
pub const STALE_AFTER: Duration = Duration::from_secs(30);

/// Who holds a log directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub host: String,
    pub pid: u32,
    /// The process's start time in clock ticks since boot (`/proc/PID/stat`), 0 where
    /// unknown: with the PID, it names one process on a host.
    pub start: u64,
    /// Random per acquisition: tells two takers of one stale lock apart.
    pub nonce: u64,
    /// Unix seconds of the last heartbeat.
    pub heartbeat: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "--logdir {dir}: another learner is using it (PID {pid} on {host}, last heartbeat {age} s ago); \
         stop it first, or choose another --logdir (if that learner is gone, its lock is taken over \
         once {stale} s have passed without a heartbeat)"
    )]
    InUse {
        dir: PathBuf,
        pid: u32,
        host: String,
        age: u64,
        stale: u64,
    },
    #[error("--logdir {dir}: cannot lock it: {source}")]
    Io {
        dir: PathBuf,
        source: std::io::Error,
    },
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// A process's start time (field 22 of `/proc/PID/stat`), if it is running.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// This process as an owner, heartbeat now.
fn me(nonce: u64) -> Owner {
    let pid = std::process::id();
    Owner {
        host: hostname(),
        pid,
        start: start_time(pid).unwrap_or(0),
        nonce,
        heartbeat: now(),
    }
}

impl Owner {
    /// Whether this owner may still be running. On this host the process itself is
    /// checked (a PID alive with another start time is another process); elsewhere
    /// only the heartbeat can say.
    fn alive(&self, host: &str, now: u64) -> bool {
        if self.host == host && self.start != 0 {
            return start_time(self.pid) == Some(self.start);
        }
        now.saturating_sub(self.heartbeat) < STALE_AFTER.as_secs()
    }
}

/// The held lock: heartbeats on its own thread, removed when dropped.
#[derive(Debug)]
pub struct RunLock {
    path: PathBuf,
    /// The log directory, when this lock created it: removed with the lock if nothing
    /// else was written there (a run refused before it started leaves no trace).
    created: Option<PathBuf>,
    nonce: u64,
    stop: Arc<AtomicBool>,
    beat: Option<JoinHandle<()>>,
}

impl RunLock {
    /// Locks `dir` (created if missing) for this process, or says who holds it.
    pub fn acquire(dir: &Path) -> Result<Self, LockError> {
        let io = |source| LockError::Io {
            dir: dir.to_path_buf(),
            source,
        };
        let made_dir = (!dir.exists()).then(|| dir.to_path_buf());
        std::fs::create_dir_all(dir).map_err(io)?;
        let path = dir.join(LOCK_FILE);
        let nonce: u64 = rand::random();
        let mine = me(nonce);
        let created = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path);
        match created {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                match read_json::<Owner>(&path) {
                    Ok(held) if held.alive(&mine.host, now()) => {
                        return Err(LockError::InUse {
                            dir: dir.to_path_buf(),
                            pid: held.pid,
                            host: held.host,
                            age: now().saturating_sub(held.heartbeat),
                            stale: STALE_AFTER.as_secs(),
                        })
                    }
                    Ok(held) => tracing::warn!(
                        "--logdir {}: taking over the lock of PID {} on {} (gone: last heartbeat {} s ago)",
                        dir.display(),
                        held.pid,
                        held.host,
                        now().saturating_sub(held.heartbeat)
                    ),
                    Err(e) => tracing::warn!(
                        "--logdir {}: taking over a lock that cannot be read ({e})",
                        dir.display()
                    ),
                }
            }
            Err(e) => return Err(io(e)),
        }
        write_json(&path, &mine).map_err(|e| io(std::io::Error::other(e.to_string())))?;
        // Two takers of one stale lock both wrote it: the later rename won.
        match read_json::<Owner>(&path) {
            Ok(held) if held.nonce == nonce => {}
            Ok(held) => {
                return Err(LockError::InUse {
                    dir: dir.to_path_buf(),
                    pid: held.pid,
                    host: held.host,
                    age: 0,
                    stale: STALE_AFTER.as_secs(),
                })
            }
            Err(e) => return Err(io(std::io::Error::other(e.to_string()))),
        }
        let stop = Arc::new(AtomicBool::new(false));
        let beat = {
            let (path, stop) = (path.clone(), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("run-lock".into())
                .spawn(move || heartbeat(&path, nonce, &stop))
                .map_err(io)?
        };
        Ok(Self {
            path,
            created: made_dir,
            nonce,
            stop,
            beat: Some(beat),
        })
    }
}

/// Rewrites the heartbeat until stopped, or until the lock is no longer ours.
fn heartbeat(path: &Path, nonce: u64, stop: &AtomicBool) {
    let tick = Duration::from_millis(100);
    let mut waited = Duration::ZERO;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(tick);
        waited += tick;
        if waited < HEARTBEAT_EVERY {
            continue;
        }
        waited = Duration::ZERO;
        match read_json::<Owner>(path) {
            Ok(held) if held.nonce == nonce => {
                if let Err(e) = write_json(path, &me(nonce)) {
                    tracing::warn!("{}: heartbeat not written: {e}", path.display());
                }
            }
            Ok(held) => {
                tracing::error!(
                    "{}: another learner (PID {} on {}) took this log directory over; this one no longer holds it",
                    path.display(),
                    held.pid,
                    held.host
                );
                return;
            }
            Err(e) => tracing::warn!("{}: cannot read the lock: {e}", path.display()),
        }
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(beat) = self.beat.take() {
            let _ = beat.join();
        }
        // Only ours is removed (not one another learner took over).
        if read_json::<Owner>(&self.path).is_ok_and(|held| held.nonce == self.nonce) {
            let _ = std::fs::remove_file(&self.path);
            if let Some(dir) = &self.created {
                // Only if empty: a run that wrote anything keeps its directory.
                let _ = std::fs::remove_dir(dir);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_owner(dir: &Path, owner: &Owner) {
        write_json(&dir.join(LOCK_FILE), owner).unwrap();
    }

    #[test]
    fn a_second_learner_is_refused_and_the_lock_goes_with_its_owner() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        let lock = RunLock::acquire(&run).unwrap();
        let err = RunLock::acquire(&run).unwrap_err().to_string();
        assert!(err.contains("another learner is using it"), "{err}");
        assert!(
            err.contains(&format!("PID {}", std::process::id())),
            "{err}"
        );
        drop(lock);
        assert!(!run.join(LOCK_FILE).exists(), "removed with its owner");
        assert!(
            !run.exists(),
            "a directory the lock made, left empty, goes with it"
        );
        drop(RunLock::acquire(&run).unwrap());
    }

    #[test]
    fn a_live_process_elsewhere_holds_it_a_dead_one_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let live = Owner {
            host: hostname(),
            pid,
            start: start_time(pid).unwrap(),
            nonce: 1,
            heartbeat: now(),
        };
        write_owner(dir.path(), &live);
        let err = RunLock::acquire(dir.path()).unwrap_err().to_string();
        assert!(err.contains(&format!("PID {pid}")), "{err}");
        child.kill().unwrap();
        child.wait().unwrap();
        // Gone (a crash, a SIGKILL): taken over, whatever its heartbeat says.
        let lock = RunLock::acquire(dir.path()).unwrap();
        let held: Owner = read_json(&dir.path().join(LOCK_FILE)).unwrap();
        assert_eq!(held.pid, std::process::id());
        drop(lock);
    }

    #[test]
    fn a_reused_pid_is_another_process() {
        // A restarted container's learner is PID 1 again: the old lock's start time
        // tells it apart.
        let dir = tempfile::tempdir().unwrap();
        let mut old = me(7);
        old.start += 1;
        write_owner(dir.path(), &old);
        drop(RunLock::acquire(dir.path()).unwrap());
    }

    #[test]
    fn another_hosts_lock_holds_while_it_heartbeats() {
        let dir = tempfile::tempdir().unwrap();
        let mut other = Owner {
            host: "some-other-node".into(),
            pid: 4242,
            start: 99,
            nonce: 3,
            heartbeat: now(),
        };
        write_owner(dir.path(), &other);
        let err = RunLock::acquire(dir.path()).unwrap_err().to_string();
        assert!(err.contains("on some-other-node"), "{err}");
        // A requeued job on another node, once the heartbeat is stale.
        other.heartbeat = now() - STALE_AFTER.as_secs() - 1;
        write_owner(dir.path(), &other);
        drop(RunLock::acquire(dir.path()).unwrap());
    }

    #[test]
    fn an_unreadable_lock_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(LOCK_FILE), b"").unwrap();
        drop(RunLock::acquire(dir.path()).unwrap());
    }
}
