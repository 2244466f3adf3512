//! Item selectors: how a shard picks which stored slot to sample.

/// Chooses slots to sample within one shard.
///
/// Contract (as Reverb's item selectors): implementations need not be thread-safe; the
/// shard that owns one holds its lock around every call. Sampling is by weight: the
/// sampler draws `u` uniformly in `[0, total())` across all shards and asks the shard it
/// lands in for `select(u - offset)`, which makes proportional prioritized replay (a
/// sum-tree) a drop-in addition.
pub trait Selector: Send {
    /// Slot `slot` now holds a new item (it may overwrite an old one).
    fn insert(&mut self, slot: usize);
    /// Total sampling weight of all stored items.
    fn total(&self) -> f64;
    /// The slot whose weight interval contains `u`, for `u` in `[0, total())`.
    fn select(&self, u: f64) -> usize;
    /// Forgets every item.
    fn clear(&mut self);
}

/// Every stored item equally likely.
#[derive(Debug, Default)]
pub struct Uniform {
    len: usize,
}

impl Selector for Uniform {
    fn insert(&mut self, slot: usize) {
        self.len = self.len.max(slot + 1);
    }

    fn total(&self) -> f64 {
        self.len as f64
    }

    fn select(&self, u: f64) -> usize {
        // `u < len` up to rounding; clamp so rounding can never index past the end.
        (u as usize).min(self.len.saturating_sub(1))
    }

    fn clear(&mut self) {
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_weights_every_stored_slot_equally() {
        let mut s = Uniform::default();
        assert_eq!(s.total(), 0.0);
        for slot in 0..5 {
            s.insert(slot);
        }
        s.insert(2); // overwriting does not add weight
        assert_eq!(s.total(), 5.0);
        assert_eq!(s.select(0.0), 0);
        assert_eq!(s.select(3.999), 3);
        assert_eq!(s.select(5.0), 4);
        s.clear();
        assert_eq!(s.total(), 0.0);
    }
}
