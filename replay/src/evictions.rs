//! Items evicted as poison, charged to the stream (actor) whose batch brought them.
//!
//! The learner's feedback evicts an item whose TD error shows it poison (not finite, or
//! beyond anything a transition within the run's value bounds can give); replay keeps
//! the count per stream so that the server can disconnect an actor whose transitions
//! keep being evicted, and `/metrics` and the run's summary can name it. Bounded: at
//! most [`MAX_STREAMS`] streams are remembered (evictions are rare; beyond that only
//! the total counts).

use std::collections::HashMap;

/// Streams remembered at once.
pub const MAX_STREAMS: usize = 4096;

/// Evictions as poison: in all, and by stream.
#[derive(Debug, Default)]
pub struct Evictions {
    total: u64,
    by_stream: HashMap<u32, u64>,
}

impl Evictions {
    /// One item of `stream` evicted.
    pub fn charge(&mut self, stream: u32) {
        self.total += 1;
        if self.by_stream.len() < MAX_STREAMS || self.by_stream.contains_key(&stream) {
            *self.by_stream.entry(stream).or_default() += 1;
        }
    }

    /// Items of `stream` evicted so far.
    pub fn of(&self, stream: u32) -> u64 {
        self.by_stream.get(&stream).copied().unwrap_or(0)
    }

    /// Items evicted so far, in all.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Forgets `stream` (its session ended; a new session is a new stream).
    pub fn forget(&mut self, stream: u32) {
        self.by_stream.remove(&stream);
    }

    /// Every stream charged, with its count, most first.
    pub fn by_stream(&self) -> Vec<(u32, u64)> {
        let mut all: Vec<(u32, u64)> = self.by_stream.iter().map(|(s, n)| (*s, *n)).collect();
        all.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evictions_are_counted_per_stream_and_in_all() {
        let mut e = Evictions::default();
        e.charge(7);
        e.charge(7);
        e.charge(3);
        assert_eq!((e.of(7), e.of(3), e.of(1), e.total()), (2, 1, 0, 3));
        assert_eq!(e.by_stream(), [(7, 2), (3, 1)]);
    }

    #[test]
    fn the_streams_remembered_are_bounded_and_the_total_still_counts() {
        let mut e = Evictions::default();
        for s in 0..(MAX_STREAMS as u32 + 10) {
            e.charge(s);
        }
        assert_eq!(e.by_stream().len(), MAX_STREAMS);
        assert_eq!(e.total(), MAX_STREAMS as u64 + 10);
        e.charge(0);
        assert_eq!(e.of(0), 2, "a remembered stream still counts");
    }
}
