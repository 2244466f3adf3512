//! Latest-only parameter publication: a writer (the learner, or a remote actor's
//! connection) replaces the snapshot, readers take the newest one. A slow reader never
//! builds a queue; it just skips versions.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::runner::ParamsSource;
use millrace_proto::Params;

/// Holds the newest [`Params`].
#[derive(Debug)]
pub struct ParamsSlot {
    latest: Mutex<Arc<Params>>,
    version: AtomicU64,
}

impl ParamsSlot {
    pub fn new(initial: Params) -> Self {
        Self {
            version: AtomicU64::new(initial.version),
            latest: Mutex::new(Arc::new(initial)),
        }
    }

    /// Replaces the snapshot (the lock is held only to swap an `Arc`).
    pub fn publish(&self, params: Params) {
        let version = params.version;
        *self.latest.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(params);
        self.version.store(version, Ordering::Release);
    }

    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    pub fn latest(&self) -> Arc<Params> {
        Arc::clone(&self.latest.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// An actor's view of a [`ParamsSlot`].
#[derive(Debug, Clone)]
pub struct SlotReader(pub Arc<ParamsSlot>);

impl ParamsSource for SlotReader {
    fn newer_than(&mut self, have: Option<u64>) -> Option<Arc<Params>> {
        match have {
            Some(v) if self.0.version() <= v => None,
            _ => Some(self.0.latest()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(version: u64) -> Params {
        Params {
            version,
            env_steps: 0,
            population: 1,
            data: vec![version as f32],
        }
    }

    #[test]
    fn readers_see_only_the_newest_version() {
        let slot = Arc::new(ParamsSlot::new(params(0)));
        let mut reader = SlotReader(Arc::clone(&slot));
        assert_eq!(reader.newer_than(None).unwrap().version, 0);
        assert!(reader.newer_than(Some(0)).is_none());
        for v in 1..=5 {
            slot.publish(params(v));
        }
        let got = reader.newer_than(Some(0)).unwrap();
        assert_eq!((got.version, got.data[0]), (5, 5.0));
        assert!(reader.newer_than(Some(5)).is_none());
    }
}
