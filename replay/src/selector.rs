//! Item selectors: how a shard picks which stored item to sample.

/// Chooses items to sample within one shard, by position (`0..capacity`).
///
/// Contract (as Reverb's item selectors, with its five verbs): implementations need not
/// be thread-safe; the shard that owns one holds its lock around every call. Sampling is
/// by weight: the table draws `u` uniformly in `[0, total)` over all shards and asks the
/// shard it lands in for `sample(u - offset)`, so proportional prioritized replay (a sum
/// tree) drops in beside [`Uniform`].
pub trait Selector: Send {
    /// Position `pos` now holds a new item with `priority` (ignored by [`Uniform`]).
    fn insert(&mut self, pos: usize, priority: f64);
    /// The item at `pos` now has `priority`.
    fn update(&mut self, pos: usize, priority: f64);
    /// The item at `pos` was evicted.
    fn delete(&mut self, pos: usize);
    /// Total sampling weight of all stored items.
    fn total(&self) -> f64;
    /// The live position whose weight interval contains `u` (values outside
    /// `[0, total)` are clamped into it), or `None` when nothing is stored.
    fn sample(&self, u: f64) -> Option<usize>;
    /// The sampling weight of the live item at `pos` (1 for [`Uniform`]).
    fn weight(&self, pos: usize) -> f64;
    /// The smallest weight of a live item (`+∞` when nothing is stored): the largest
    /// importance-sampling weight belongs to it.
    fn min_weight(&self) -> f64;
    /// The priority of the item at `pos`, for selectors that keep one (checkpoints).
    fn priority(&self, pos: usize) -> Option<f64>;
    /// Forgets every item.
    fn clear(&mut self);
}

/// Every stored item equally likely, for a shard that fills and evicts its positions in
/// FIFO ring order (live positions are one contiguous run, modulo the capacity).
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
    fn insert(&mut self, pos: usize, _priority: f64) {
        debug_assert_eq!(pos, (self.first + self.len) % self.capacity, "FIFO order");
        debug_assert!(self.len < self.capacity);
        self.len += 1;
    }

    fn update(&mut self, _pos: usize, _priority: f64) {}

    fn delete(&mut self, pos: usize) {
        debug_assert_eq!(pos, self.first, "FIFO order");
        self.first = (self.first + 1) % self.capacity;
        self.len -= 1;
    }

    fn total(&self) -> f64 {
        self.len as f64
    }

    fn sample(&self, u: f64) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        // `u < len` up to rounding (and callers may pass a stale u): clamp so it can
        // never index past the live run. Negative and NaN `u` cast to 0.
        let i = (u as usize).min(self.len - 1);
        Some((self.first + i) % self.capacity)
    }

    fn weight(&self, _pos: usize) -> f64 {
        1.0
    }

    fn min_weight(&self) -> f64 {
        if self.len == 0 {
            f64::INFINITY
        } else {
            1.0
        }
    }

    fn priority(&self, _pos: usize) -> Option<f64> {
        None
    }

    fn clear(&mut self) {
        self.first = 0;
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_weights_every_live_position_equally() {
        let mut s = Uniform::new(4);
        assert_eq!(s.total(), 0.0);
        assert_eq!(s.sample(0.0), None, "nothing to sample when empty");
        for pos in 0..4 {
            s.insert(pos, 1.0);
        }
        assert_eq!(s.total(), 4.0);
        assert_eq!(s.sample(0.0), Some(0));
        assert_eq!(s.sample(2.999), Some(2));
        assert_eq!(s.sample(9.0), Some(3), "clamped");
        assert_eq!(s.sample(-1.0), Some(0), "clamped");
        // Evict two, wrap around with one more: live positions are 2, 3, 0.
        s.delete(0);
        s.delete(1);
        s.insert(0, 1.0);
        assert_eq!(s.total(), 3.0);
        let picked: Vec<usize> = (0..3).filter_map(|i| s.sample(i as f64 + 0.5)).collect();
        assert_eq!(picked, [2, 3, 0]);
        s.clear();
        assert_eq!((s.total(), s.sample(0.5)), (0.0, None));
    }
}
