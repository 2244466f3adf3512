//! Parameters on their way from the learner to whoever acts with them, and the run-wide
//! env step counter that actors advance and the learner reads.
//!
//! Both live here, beside the wire types, because every component shares them: the
//! learner publishes into a [`ParamsCell`], in-process actors and the evaluator read it,
//! the server broadcasts it, and a remote actor's connection publishes into its own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

/// A published parameter snapshot: all agents' flat parameters, `[K, P]` row-major.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// Incremented by the learner each time it publishes.
    pub version: u64,
    /// The run's env step count when it published: remote actors follow the run's
    /// exploration schedule by it.
    pub env_steps: u64,
    /// Gradient updates behind these parameters.
    pub updates: u64,
    pub population: usize,
    pub data: Vec<f32>,
}

impl Params {
    /// One agent's parameters as `version`, before any env step or update (a run's
    /// first parameters; tests' fixtures).
    pub fn of_one(version: u64, data: Vec<f32>) -> Self {
        Self {
            version,
            env_steps: 0,
            updates: 0,
            population: 1,
            data,
        }
    }

    /// The flat parameters of agent `k`.
    ///
    /// # Panics
    /// If `k` is not an agent of the population.
    pub fn agent(&self, k: usize) -> &[f32] {
        let p = self.data.len() / self.population.max(1);
        &self.data[k * p..(k + 1) * p]
    }
}

/// Holds the newest [`Params`], latest-only: a writer replaces the snapshot and readers
/// take the newest one, so a slow reader never builds a queue; it skips versions.
#[derive(Debug)]
pub struct ParamsCell {
    latest: Mutex<Arc<Params>>,
    version: AtomicU64,
}

impl ParamsCell {
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

    /// The newest version, without taking the lock.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    pub fn latest(&self) -> Arc<Params> {
        Arc::clone(&self.latest.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The newest snapshot if it is newer than `have`.
    pub fn newer_than(&self, have: Option<u64>) -> Option<Arc<Params>> {
        match have {
            Some(v) if self.version() <= v => None,
            _ => Some(self.latest()),
        }
    }
}

/// Environment steps taken by the whole run, all actors together: it drives decaying
/// exploration, evaluation points and the step budget. Monotonic.
#[derive(Debug, Default)]
pub struct StepCounter(AtomicU64);

impl StepCounter {
    pub fn new(start: u64) -> Self {
        Self(AtomicU64::new(start))
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// Counts `n` more steps; returns the new total.
    pub fn add(&self, n: u64) -> u64 {
        self.0.fetch_add(n, Ordering::Relaxed) + n
    }

    /// Moves the count up to `at_least` (a remote actor catching up with the learner's
    /// count); never down.
    pub fn raise_to(&self, at_least: u64) {
        self.0.fetch_max(at_least, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(version: u64) -> Params {
        Params {
            version,
            env_steps: 0,
            updates: 0,
            population: 1,
            data: vec![version as f32],
        }
    }

    #[test]
    fn readers_see_only_the_newest_version() {
        let cell = ParamsCell::new(params(0));
        assert_eq!(cell.newer_than(None).unwrap().version, 0);
        assert!(cell.newer_than(Some(0)).is_none());
        for v in 1..=5 {
            cell.publish(params(v));
        }
        let got = cell.newer_than(Some(0)).unwrap();
        assert_eq!((got.version, got.data[0]), (5, 5.0));
        assert!(cell.newer_than(Some(5)).is_none());
    }

    #[test]
    fn the_step_counter_only_moves_up() {
        let c = StepCounter::new(10);
        assert_eq!(c.add(5), 15);
        c.raise_to(12);
        assert_eq!(c.get(), 15);
        c.raise_to(40);
        assert_eq!(c.get(), 40);
    }

    #[test]
    fn agent_rows_split_the_population() {
        let p = Params {
            version: 0,
            env_steps: 0,
            updates: 0,
            population: 2,
            data: vec![1.0, 2.0, 3.0, 4.0],
        };
        assert_eq!(p.agent(1), [3.0, 4.0]);
    }
}
