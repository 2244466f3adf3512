//! The checkpoint writer: a thread that writes the learner's state (and a snapshot of
//! replay, which for pixels is gigabytes) to `latest/`, so the learner thread only
//! copies its tensors to the host and hands them over.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use millrace_proto::panics::Panicked;
use millrace_proto::{EnvSpec, NetworkSpec};
use millrace_replay::Table;

use super::{save_state, CheckpointError, Layout, StateMeta};
use crate::evaluation::EvalRecord;
use millrace_core::handoff::{CheckpointSink, SaveJob};

/// What a state checkpoint needs besides the learner's tensors, shared with the thread
/// that writes it.
#[derive(Debug)]
pub struct CheckpointContext {
    pub layout: Layout,
    pub env: EnvSpec,
    pub network: NetworkSpec,
    pub seed: u64,
    pub table: Arc<Table>,
    /// The coordinator's latest evaluation, recorded in `latest/meta.json`.
    pub last_eval: Mutex<Option<EvalRecord>>,
}

/// One state to write, and where to report the result (the final checkpoint's;
/// periodic ones are logged).
#[derive(Debug)]
struct Job {
    job: SaveJob,
    done: Option<Sender<Result<PathBuf, CheckpointError>>>,
}

/// Statistics of the checkpoints written so far.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WriterStats {
    pub written: u64,
    pub failed: u64,
    /// Checkpoints written without a new replay file (its write failed; the previous
    /// one, if any, was kept).
    pub replay_failed: u64,
    /// Checkpoints that failed since the last one written (`/healthz` says so).
    pub failed_in_a_row: u64,
    /// Checkpoints since the last one with its replay file (`/healthz` says so).
    pub replay_failed_in_a_row: u64,
    /// Periodic checkpoints skipped because the previous one was still being written.
    pub skipped: u64,
    /// Seconds the last checkpoint took to write (model and replay).
    pub last_write_s: f64,
}

/// Handle to the writer thread.
#[derive(Debug)]
pub struct CheckpointWriter {
    jobs: Option<Sender<Job>>,
    stats: Arc<Mutex<WriterStats>>,
    handle: Option<JoinHandle<()>>,
}

impl CheckpointWriter {
    pub fn spawn(ctx: Arc<CheckpointContext>) -> std::io::Result<Self> {
        // One job waiting at most: a periodic checkpoint that finds the writer busy is
        // skipped rather than queued (the next one is newer anyway).
        let (jobs, rx) = crossbeam_channel::bounded::<Job>(1);
        let stats = Arc::new(Mutex::new(WriterStats::default()));
        let shared = Arc::clone(&stats);
        let handle = std::thread::Builder::new()
            .name("checkpoint".into())
            .spawn(move || write_loop(&ctx, &rx, &shared))?;
        Ok(Self {
            jobs: Some(jobs),
            stats,
            handle: Some(handle),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, WriterStats> {
        self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn stats(&self) -> WriterStats {
        *self.lock()
    }

    /// Whether the writer thread has ended (by itself, only a panic does).
    pub fn is_finished(&self) -> bool {
        self.handle.as_ref().is_some_and(JoinHandle::is_finished)
    }

    /// Waits for the checkpoints submitted so far to be written, then stops; `Err` if
    /// the thread panicked.
    pub fn finish(mut self) -> Result<WriterStats, Panicked> {
        drop(self.jobs.take());
        if let Some(h) = self.handle.take() {
            crate::joined(h)?;
        }
        Ok(self.stats())
    }
}

impl CheckpointSink for CheckpointWriter {
    type Error = CheckpointError;

    fn try_submit(&self, job: SaveJob) -> bool {
        let Some(jobs) = &self.jobs else {
            return false;
        };
        match jobs.try_send(Job { job, done: None }) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.lock().skipped += 1;
                false
            }
        }
    }

    fn submit_final(
        &self,
        job: Result<SaveJob, Panicked>,
    ) -> Receiver<Result<PathBuf, CheckpointError>> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        match job {
            Ok(job) => {
                if let Some(jobs) = &self.jobs {
                    let _ = jobs.send(Job {
                        job,
                        done: Some(tx),
                    });
                }
            }
            Err(panic) => {
                let _ = tx.send(Err(CheckpointError::NotCopied(panic)));
            }
        }
        rx
    }
}

impl Drop for CheckpointWriter {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn write_loop(ctx: &CheckpointContext, jobs: &Receiver<Job>, stats: &Mutex<WriterStats>) {
    for Job { job, done } in jobs {
        let start = Instant::now();
        let meta = StateMeta {
            last_eval: ctx
                .last_eval
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            run_finished: job.run_finished,
            ..StateMeta::new(
                ctx.env.clone(),
                ctx.network.clone(),
                ctx.seed,
                job.env_steps,
                job.params_version,
            )
        };
        let result = save_state(&ctx.layout.latest(), &job.state, Some(&ctx.table), meta);
        let took = start.elapsed();
        {
            let mut s = stats.lock().unwrap_or_else(|e| e.into_inner());
            s.last_write_s = took.as_secs_f64();
            match &result {
                Ok(saved) => {
                    s.written += 1;
                    s.failed_in_a_row = 0;
                    let replay_failed = saved.replay_error.is_some();
                    s.replay_failed += u64::from(replay_failed);
                    s.replay_failed_in_a_row = match replay_failed {
                        true => s.replay_failed_in_a_row + 1,
                        false => 0,
                    };
                }
                Err(_) => {
                    s.failed += 1;
                    s.failed_in_a_row += 1;
                }
            }
        }
        let result = result.map(|saved| saved.dir);
        match (&result, &done) {
            (Ok(path), None) => tracing::debug!(
                "checkpoint written to {} in {:.2} s",
                path.display(),
                took.as_secs_f64()
            ),
            (Err(e), None) => tracing::warn!("periodic checkpoint failed: {e}"),
            _ => {}
        }
        if let Some(done) = done {
            let _ = done.send(result);
        }
        if took > Duration::from_secs(60) {
            tracing::warn!(
                "a checkpoint took {:.0} s to write; consider a longer --checkpoint-every-s",
                took.as_secs_f64()
            );
        }
    }
}
