//! Priorities applied on a thread of their own, for the learner thread: it hands over
//! each round's TD errors (on a GPU still on their way to pinned host memory, with the
//! event after their copy) and goes on with the next update. This thread waits for the
//! copy to land and takes replay's shard locks to apply the round; the learner thread
//! does neither. Lock-step drivers (`--deterministic`, populations) apply inline, so
//! that their results stay bit-identical.
//!
//! Rounds are applied in the order they were handed over. At most [`QUEUE`] wait: the
//! learner thread waits only when this thread is that far behind (the memory bound).
//! [`PriorityThread::finish`] waits until every round handed over has been applied,
//! before a final checkpoint copies replay.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use millrace_replay::{ItemKey, PriorityOutcome};
use tch::Tensor;

use crate::cuda::Marker;
use crate::priority_apply::Applier;

/// Rounds handed over and not yet applied, at most, before the learner thread waits.
pub(crate) const QUEUE: usize = 4;

/// When a round's read-back can be read on the host.
pub(crate) enum Landing {
    /// Now: it was computed on the host (a CPU run).
    Now,
    /// After this event on device `.1`'s compute stream; the marker comes back for
    /// reuse ([`PriorityThread::spare`]).
    After(Marker, usize),
    /// No event could be recorded: once device `.0` has drained (waited for here, not
    /// on the learner thread).
    Drained(usize),
}

/// One round: the |TD error| of each of `keys`' items, in `host` (float, on the host).
pub(crate) struct Round {
    pub(crate) host: Tensor,
    pub(crate) keys: Vec<ItemKey>,
    pub(crate) landing: Landing,
}

#[derive(Default)]
struct Progress {
    applied: u64,
    totals: PriorityOutcome,
    /// Why the thread ended early (a panic: a bug).
    ended: Option<String>,
}

#[derive(Default)]
struct Shared {
    progress: Mutex<Progress>,
    changed: Condvar,
}

impl Shared {
    fn progress(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The thread, from the learner thread's side.
pub(crate) struct PriorityThread {
    rounds: Option<Sender<Round>>,
    spare: Receiver<Marker>,
    shared: Arc<Shared>,
    sent: u64,
    handle: Option<JoinHandle<()>>,
}

impl PriorityThread {
    /// Starts the thread, which applies with `applier`. It runs where the calling
    /// thread may run (the service CPUs of the run's CPU plan).
    pub(crate) fn spawn(applier: Applier) -> std::io::Result<Self> {
        let (rounds, queue) = crossbeam_channel::bounded(QUEUE);
        let (spare_tx, spare) = crossbeam_channel::bounded(QUEUE + 2);
        let shared = Arc::new(Shared::default());
        let theirs = Arc::clone(&shared);
        let handle = std::thread::Builder::new()
            .name("priorities".into())
            .spawn(move || serve(applier, &queue, &spare_tx, &theirs))?;
        Ok(Self {
            rounds: Some(rounds),
            spare,
            shared,
            sent: 0,
            handle: Some(handle),
        })
    }

    /// A marker whose round has been applied, for the next round.
    pub(crate) fn spare(&self) -> Option<Marker> {
        self.spare.try_recv().ok()
    }

    /// Hands `round` over; waits only while [`QUEUE`] rounds are already waiting.
    ///
    /// # Panics
    /// If the thread has ended (a panic there, which this reports): a run must not go
    /// on without its poison checks.
    pub(crate) fn send(&mut self, round: Round) {
        let sent = self
            .rounds
            .as_ref()
            .is_some_and(|tx| tx.send(round).is_ok());
        if !sent {
            panic!("priorities: {}", self.ended());
        }
        self.sent += 1;
    }

    /// Waits until every round handed over has been applied.
    ///
    /// # Panics
    /// If the thread ended before (see [`Self::send`]).
    pub(crate) fn finish(&self) {
        let mut p = self.shared.progress();
        while p.applied < self.sent && p.ended.is_none() {
            p = self
                .shared
                .changed
                .wait(p)
                .unwrap_or_else(|e| e.into_inner());
        }
        if p.applied < self.sent {
            drop(p);
            panic!("priorities: {}", self.ended());
        }
    }

    /// What replay did with the rounds applied so far.
    pub(crate) fn totals(&self) -> PriorityOutcome {
        self.shared.progress().totals
    }

    fn ended(&self) -> String {
        let why = self.shared.progress().ended.clone();
        format!(
            "the priority thread ended ({}); {} round(s) were not applied",
            why.as_deref().unwrap_or("for no reason given"),
            self.sent - self.shared.progress().applied
        )
    }
}

impl Drop for PriorityThread {
    /// Lets the thread apply what is queued, then joins it.
    fn drop(&mut self) {
        self.rounds = None;
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn serve(mut applier: Applier, queue: &Receiver<Round>, spare: &Sender<Marker>, shared: &Shared) {
    for round in queue {
        let applied = catch_unwind(AssertUnwindSafe(|| {
            let marker = match round.landing {
                Landing::Now => None,
                Landing::After(marker, device) => {
                    if marker.wait().is_err() {
                        tch::Cuda::synchronize(device as i64);
                    }
                    Some(marker)
                }
                Landing::Drained(device) => {
                    tch::Cuda::synchronize(device as i64);
                    None
                }
            };
            applier.apply(&round.host, round.keys);
            marker
        }));
        let mut p = shared.progress();
        match applied {
            Ok(marker) => {
                if let Some(m) = marker {
                    let _ = spare.try_send(m);
                }
                p.applied += 1;
                p.totals = applier.totals();
                shared.changed.notify_all();
            }
            Err(panic) => {
                let why = millrace_proto::panics::panic_message(&*panic);
                tracing::error!("priorities: the priority thread panicked: {why}");
                p.ended = Some(why);
                shared.changed.notify_all();
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use millrace_proto::TransitionBatch;
    use millrace_replay::{PriorityConfig, RateLimiterConfig, ReplayConfig, SampleScratch, Table};
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    #[test]
    fn rounds_are_handed_over_without_waiting_and_all_applied_by_finish() {
        let table = Arc::new(
            Table::new(&ReplayConfig {
                capacity: 64,
                shards: 2,
                obs_row_bytes: 4,
                stack: 1,
                obs_rows_per_item: 2.0,
                limiter: RateLimiterConfig::sample_to_insert_ratio(1.0, 1, 1e9, 1).unwrap(),
                priority: Some(PriorityConfig {
                    alpha: 1.0,
                    beta: 0.0,
                }),
            })
            .unwrap(),
        );
        let mut b = TransitionBatch::with_capacity(4, 32, 64);
        for v in 0..32i64 {
            b.push_f32(&[v as f32], v, 0.0, 0.9, &[v as f32]);
        }
        table.insert(&b).unwrap();
        let mut out = SampleScratch::new(8, 4);
        table
            .sample(&mut SmallRng::seed_from_u64(1), &mut out.buffers())
            .unwrap();
        let mut t =
            PriorityThread::spawn(Applier::new(Arc::clone(&table), true, f32::INFINITY)).unwrap();
        // While the thread cannot count a round (this test holds its progress), the
        // caller hands over a round being applied and a full queue behind it without
        // waiting for any of them.
        let shared = Arc::clone(&t.shared);
        let held = shared.progress();
        let (handed_tx, handed) = crossbeam_channel::bounded(1);
        std::thread::scope(|s| {
            s.spawn(|| {
                for round in 0..=QUEUE {
                    let td: Vec<f32> = out
                        .actions
                        .iter()
                        .map(|a| (*a + 1) as f32 * (round + 1) as f32)
                        .collect();
                    t.send(Round {
                        host: Tensor::from_slice(&td),
                        keys: out.keys.clone(),
                        landing: Landing::Now,
                    });
                }
                handed_tx.send(()).unwrap();
            });
            // A safety net far above the time it takes; the progress is let go either
            // way, so a caller that waits is a failure, not a hang.
            let handed = handed.recv_timeout(std::time::Duration::from_secs(60));
            assert_eq!(held.applied, 0, "none counted while the progress is held");
            drop(held);
            assert!(handed.is_ok(), "the caller waited for rounds to be applied");
        });
        t.finish();
        assert_eq!(t.totals().applied, (QUEUE + 1) * out.keys.len());
        // Applied in order: the last round's priorities are the ones kept.
        let last = (QUEUE + 1) as f32;
        table.snapshot(|_, b| {
            for (a, p) in b.actions.iter().zip(&b.priorities) {
                if out.actions.contains(a) {
                    assert_eq!(*p, (*a + 1) as f32 * last, "item {a}");
                }
            }
        });
    }
}
