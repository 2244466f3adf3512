//! The actor board: per-connection statistics that connections write and the metrics
//! read (progress line, TensorBoard, the summary).

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

/// Every connected actor, by the connection's first exploration index.
#[derive(Debug, Default)]
pub struct ActorBoard {
    actors: Mutex<HashMap<u32, ActorEntry>>,
}

/// One connected actor, as last reported.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ActorEntry {
    pub name: String,
    pub peer: String,
    pub envs: usize,
    /// Transitions per second received from it, over its last report interval.
    pub transitions_per_s: f64,
    /// Learner parameter version minus the version the actor last acted with.
    pub version_lag: u64,
    /// Its last [`RETURNS_KEPT`] counted episode returns, oldest first: the operator's
    /// view of what each actor claims (the run's figure takes the median over actors).
    pub returns: VecDeque<f32>,
    /// Its transitions evicted from replay as poison this session (their TD errors
    /// exploded; see the learner's feedback).
    pub evicted: u64,
}

/// Episode returns kept per actor.
pub const RETURNS_KEPT: usize = 100;

impl ActorEntry {
    /// The mean of its kept returns (NaN before the first).
    pub fn mean_return(&self) -> f64 {
        if self.returns.is_empty() {
            return f64::NAN;
        }
        self.returns.iter().map(|r| f64::from(*r)).sum::<f64>() / self.returns.len() as f64
    }
}

/// All connected actors together.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BoardSummary {
    pub connected: usize,
    pub transitions_per_s: f64,
    pub mean_version_lag: f64,
    pub max_version_lag: u64,
}

impl ActorBoard {
    fn lock(&self) -> MutexGuard<'_, HashMap<u32, ActorEntry>> {
        self.actors.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An actor joined (counted from now on, before its first report).
    pub fn join(&self, id: u32, entry: ActorEntry) {
        self.lock().insert(id, entry);
    }

    /// Updates what an actor last reported (ignored once it has left).
    pub fn report(&self, id: u32, transitions_per_s: f64, version_lag: u64) {
        if let Some(e) = self.lock().get_mut(&id) {
            e.transitions_per_s = transitions_per_s;
            e.version_lag = version_lag;
        }
    }

    /// Transitions of an actor evicted as poison this session, so far.
    pub fn evicted(&self, id: u32, evicted: u64) {
        if let Some(e) = self.lock().get_mut(&id) {
            e.evicted = evicted;
        }
    }

    /// Episode returns an actor reported and the server counted.
    pub fn returns(&self, id: u32, returns: &[f32]) {
        if let Some(e) = self.lock().get_mut(&id) {
            for r in returns {
                if e.returns.len() == RETURNS_KEPT {
                    e.returns.pop_front();
                }
                e.returns.push_back(*r);
            }
        }
    }

    pub fn leave(&self, id: u32) {
        self.lock().remove(&id);
    }

    /// Every connected actor, in id order.
    pub fn entries(&self) -> Vec<(u32, ActorEntry)> {
        let mut all: Vec<_> = self.lock().iter().map(|(s, a)| (*s, a.clone())).collect();
        all.sort_by_key(|(s, _)| *s);
        all
    }

    pub fn summary(&self) -> BoardSummary {
        let actors = self.lock();
        let n = actors.len();
        if n == 0 {
            return BoardSummary::default();
        }
        BoardSummary {
            connected: n,
            transitions_per_s: actors.values().map(|a| a.transitions_per_s).sum(),
            mean_version_lag: actors.values().map(|a| a.version_lag as f64).sum::<f64>() / n as f64,
            max_version_lag: actors.values().map(|a| a.version_lag).max().unwrap_or(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actors_count_from_joining_and_summaries_add_up() {
        let board = ActorBoard::default();
        assert_eq!(board.summary(), BoardSummary::default());
        assert!(board.summary().mean_version_lag.is_sign_positive(), "no -0");
        board.join(4, ActorEntry::default());
        board.join(0, ActorEntry::default());
        assert_eq!(board.summary().connected, 2, "counted before any report");
        board.report(0, 100.0, 3);
        board.report(4, 50.0, 1);
        board.report(9, 1.0, 1);
        let s = board.summary();
        assert_eq!(
            (s.transitions_per_s, s.mean_version_lag, s.max_version_lag),
            (150.0, 2.0, 3)
        );
        board.leave(0);
        assert_eq!(board.entries().len(), 1);
    }

    #[test]
    fn each_actor_keeps_its_last_returns() {
        let board = ActorBoard::default();
        board.join(1, ActorEntry::default());
        assert!(board.entries()[0].1.mean_return().is_nan());
        let many: Vec<f32> = (0..150).map(|r| r as f32).collect();
        board.returns(1, &many);
        board.returns(2, &[1e9]);
        let (_, e) = &board.entries()[0];
        assert_eq!(e.returns.len(), RETURNS_KEPT);
        assert_eq!(e.mean_return(), 99.5, "returns 50..150");
    }
}
