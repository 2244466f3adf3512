//! Item selectors: how a shard picks which stored slot to sample.

/// Chooses slots to sample within one shard.
///
/// Contract (as Reverb's item selectors): implementations need not be thread-safe; the
/// shard that owns one holds its lock around every call. Sampling is by weight: the
/// sampler draws `u` uniformly in `[0, total())` across all shards and asks the shard it
/// lands in for `select(u - offset)`, which makes proportional prioritized replay (a
/// sum-tree) a drop-in addition.
pub trait Selector: Send {
    /// Slot `slot` now holds a new item.
    fn insert(&mut self, slot: usize);
    /// The item in slot `slot` was evicted.
    fn remove(&mut self, slot: usize);
    /// Total sampling weight of all stored items.
    fn total(&self) -> f64;
    /// The slot whose weight interval contains `u`, for `u` in `[0, total())`.
    fn select(&self, u: f64) -> usize;
}

/// Every stored item equally likely, for a shard that fills and evicts its slots in
/// FIFO ring order (live slots are one contiguous run, modulo the capacity).
#[derive(Debug)]
pub struct Uniform {
    capacity: usize,
    first: usize,
    len: usize,
}

impl Uniform {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            first: 0,
            len: 0,
        }
    }
}

impl Selector for Uniform {
    fn insert(&mut self, slot: usize) {
        debug_assert_eq!(slot, (self.first + self.len) % self.capacity, "FIFO order");
        debug_assert!(self.len < self.capacity);
        self.len += 1;
    }

    fn remove(&mut self, slot: usize) {
        debug_assert_eq!(slot, self.first, "FIFO order");
        self.first = (self.first + 1) % self.capacity;
        self.len -= 1;
    }

    fn total(&self) -> f64 {
        self.len as f64
    }

    fn select(&self, u: f64) -> usize {
        // `u < len` up to rounding; clamp so rounding can never index past the end.
        let i = (u as usize).min(self.len.saturating_sub(1));
        (self.first + i) % self.capacity
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_weights_every_live_slot_equally() {
        let mut s = Uniform::new(4);
        assert_eq!(s.total(), 0.0);
        for slot in 0..4 {
            s.insert(slot);
        }
        assert_eq!(s.total(), 4.0);
        assert_eq!(s.select(0.0), 0);
        assert_eq!(s.select(2.999), 2);
        assert_eq!(s.select(9.0), 3, "clamped");
        // Evict two, wrap around with one more: live slots are 2, 3, 0.
        s.remove(0);
        s.remove(1);
        s.insert(0);
        assert_eq!(s.total(), 3.0);
        let picked: Vec<usize> = (0..3).map(|i| s.select(i as f64 + 0.5)).collect();
        assert_eq!(picked, [2, 3, 0]);
    }
}
