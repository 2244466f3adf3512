//! The memory budget that frames being received share, with a fair share per connection
//! (feature `tokio`).
//!
//! Every connection reads through a [`Lease`] on one [`MemoryBudget`]. A frame's payload
//! is charged once its header is checked and before it is allocated, and given back when
//! the handler drops the [`BudgetPermit`]. When the budget is spent, a reader waits (and
//! TCP pushes back on its peer) — but not behind peers that sit on more than their
//! share: a waiting lease *squeezes* every lease that holds more than
//! `budget / contenders` (contenders: the leases holding bytes or waiting for them). A
//! squeezed reader must finish the frame it is reading at the [`Contended`] rate, or
//! its read fails with [`ReadError::OverShare`](crate::codec::ReadError::OverShare) and
//! the connection goes. An honest actor's frame arrives at link speed and is never cut;
//! sixteen peers trickling 16 MiB frames into a 256 MiB budget at the minimum rate are
//! cut within about three seconds of the first reader left waiting, instead of holding
//! everything for a minute.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, TryAcquireError};

use crate::codec::CodecError;

/// How often a reader that still waits for the budget looks again for leases over their
/// share (new ones may have taken bytes meanwhile).
const SQUEEZE_AGAIN: Duration = Duration::from_millis(250);

/// Bytes that frames being received may occupy at once, across every connection that
/// holds a [`Lease`] on it.
#[derive(Debug)]
pub struct MemoryBudget {
    bytes: usize,
    permits: Arc<Semaphore>,
    leases: Mutex<Leases>,
    contended: Contended,
}

/// How fast a frame must finish once its lease is found over its share while another
/// reader waits: within `grace + remaining / bytes_per_s` of that moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Contended {
    pub grace: Duration,
    pub bytes_per_s: u64,
}

impl Contended {
    /// Time allowed for the `remaining` bytes of a squeezed frame.
    pub fn limit(&self, remaining: usize) -> Duration {
        self.grace + Duration::from_secs_f64(remaining as f64 / self.bytes_per_s.max(1) as f64)
    }
}

impl Default for Contended {
    /// One second plus 8 MiB/s: a 16 MiB frame has three seconds, which a link of
    /// 100 Mbit/s or more meets.
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(1),
            bytes_per_s: 8 << 20,
        }
    }
}

#[derive(Debug, Default)]
struct Leases {
    next: u64,
    live: HashMap<u64, Arc<LeaseState>>,
}

#[derive(Debug, Default)]
struct LeaseState {
    /// Bytes its permits hold (the frame being read, and one being handled).
    held: AtomicUsize,
    /// Waiting for the budget.
    waiting: AtomicBool,
    /// The share it was found over (0: not squeezed) since its current frame began.
    squeezed: AtomicUsize,
    wake: Notify,
}

/// One connection's claim on a [`MemoryBudget`]; gone from the budget's count when
/// dropped.
#[derive(Debug)]
pub struct Lease {
    budget: Arc<MemoryBudget>,
    id: u64,
    state: Arc<LeaseState>,
}

/// Bytes taken from a [`MemoryBudget`], returned on drop.
#[derive(Debug)]
pub struct BudgetPermit {
    held: Option<(OwnedSemaphorePermit, Arc<LeaseState>, usize)>,
}

impl BudgetPermit {
    pub(crate) fn none() -> Self {
        Self { held: None }
    }
}

impl Drop for BudgetPermit {
    fn drop(&mut self) {
        if let Some((_permit, lease, bytes)) = self.held.take() {
            lease.held.fetch_sub(bytes, Ordering::AcqRel);
        }
    }
}

impl MemoryBudget {
    /// Semaphores count permits in `u32`: budgets are capped at 4 GiB − 1.
    pub fn new(bytes: usize) -> Self {
        let bytes = bytes.min(u32::MAX as usize);
        Self {
            bytes,
            permits: Arc::new(Semaphore::new(bytes)),
            leases: Mutex::default(),
            contended: Contended::default(),
        }
    }

    /// How fast a squeezed frame must finish (see [`Contended`]).
    pub fn with_contended(mut self, contended: Contended) -> Self {
        self.contended = contended;
        self
    }

    /// A claim for one connection.
    pub fn lease(self: &Arc<Self>) -> Lease {
        let state = Arc::new(LeaseState::default());
        let mut leases = self.lock();
        let id = leases.next;
        leases.next += 1;
        leases.live.insert(id, Arc::clone(&state));
        Lease {
            budget: Arc::clone(self),
            id,
            state,
        }
    }

    pub(crate) fn contended(&self) -> Contended {
        self.contended
    }

    /// Bytes not taken right now.
    #[cfg(test)]
    pub(crate) fn available(&self) -> usize {
        self.permits.available_permits()
    }

    fn lock(&self) -> MutexGuard<'_, Leases> {
        // The map holds no invariant a panicking holder could break halfway.
        self.leases.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks every lease over its fair share, and wakes its reader.
    fn squeeze(&self) {
        let leases = self.lock();
        let contenders = leases
            .live
            .values()
            .filter(|l| l.held.load(Ordering::Acquire) > 0 || l.waiting.load(Ordering::Acquire))
            .count()
            .max(1);
        let share = (self.bytes / contenders).max(1);
        for lease in leases.live.values() {
            if lease.held.load(Ordering::Acquire) > share
                && lease
                    .squeezed
                    .compare_exchange(0, share, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                lease.wake.notify_one();
            }
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.budget.lock().live.remove(&self.id);
    }
}

/// Clears a lease's waiting mark however its wait ends (a cancelled read included).
struct Waiting<'a>(&'a LeaseState);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.store(false, Ordering::Release);
    }
}

impl Lease {
    /// Takes `bytes` for a new frame, waiting (and squeezing leases over their share)
    /// while the budget is spent. A frame larger than the whole budget is an error.
    pub(crate) async fn take(&self, bytes: usize) -> Result<BudgetPermit, CodecError> {
        let budget = &self.budget;
        if bytes > budget.bytes {
            return Err(CodecError::FrameTooLarge {
                len: bytes,
                max: budget.bytes,
            });
        }
        // A new frame starts with a clean slate.
        self.state.squeezed.store(0, Ordering::Release);
        if bytes == 0 {
            return Ok(BudgetPermit::none());
        }
        let closed = || CodecError::Malformed("memory budget closed".into());
        let permit = match Arc::clone(&budget.permits).try_acquire_many_owned(bytes as u32) {
            Ok(permit) => permit,
            Err(TryAcquireError::Closed) => return Err(closed()),
            Err(TryAcquireError::NoPermits) => {
                self.state.waiting.store(true, Ordering::Release);
                let _waiting = Waiting(&self.state);
                let acquire = Arc::clone(&budget.permits).acquire_many_owned(bytes as u32);
                tokio::pin!(acquire);
                loop {
                    budget.squeeze();
                    tokio::select! {
                        permit = &mut acquire => break permit.map_err(|_| closed())?,
                        _ = tokio::time::sleep(SQUEEZE_AGAIN) => {}
                    }
                }
            }
        };
        self.state.held.fetch_add(bytes, Ordering::AcqRel);
        Ok(BudgetPermit {
            held: Some((permit, Arc::clone(&self.state), bytes)),
        })
    }

    /// The fair share this lease was found over since its current frame began.
    pub(crate) fn squeezed(&self) -> Option<usize> {
        match self.state.squeezed.load(Ordering::Acquire) {
            0 => None,
            share => Some(share),
        }
    }

    /// Resolves when this lease may have been squeezed (check [`Lease::squeezed`]).
    pub(crate) async fn squeeze_notified(&self) {
        self.state.wake.notified().await
    }

    pub(crate) fn contended(&self) -> Contended {
        self.budget.contended()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_waiting_lease_squeezes_only_those_over_their_share() {
        let budget = Arc::new(MemoryBudget::new(100));
        let (big, small, waiter) = (budget.lease(), budget.lease(), budget.lease());
        let _big = big.take(80).await.unwrap();
        let _small = small.take(20).await.unwrap();
        assert!(big.squeezed().is_none(), "no one waits yet");
        let wait = waiter.take(30);
        tokio::pin!(wait);
        assert!(
            tokio::time::timeout(Duration::from_millis(20), &mut wait)
                .await
                .is_err(),
            "the budget is spent"
        );
        // Three contenders: a share of 33 bytes; 80 is over it, 20 is not.
        assert_eq!(big.squeezed(), Some(33));
        assert_eq!(small.squeezed(), None);
        drop(_big);
        let got = wait.await.unwrap();
        assert_eq!(budget.available(), 50);
        drop(got);
        // Its next frame starts unsqueezed.
        let _again = big.take(10).await.unwrap();
        assert_eq!(big.squeezed(), None);
    }

    #[tokio::test]
    async fn a_dropped_lease_no_longer_counts() {
        let budget = Arc::new(MemoryBudget::new(100));
        let gone = budget.lease();
        let _ = gone.take(10).await.unwrap();
        drop(gone);
        assert!(budget.lock().live.is_empty());
        assert_eq!(budget.available(), 100, "its permit went back too");
    }

    #[tokio::test]
    async fn a_frame_larger_than_the_budget_is_an_error() {
        let budget = Arc::new(MemoryBudget::new(10));
        assert!(matches!(
            budget.lease().take(11).await,
            Err(CodecError::FrameTooLarge { len: 11, max: 10 })
        ));
    }
}
