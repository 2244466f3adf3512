//! One replay shard: preallocated rings of observation rows and of transitions (stored
//! as columns) that index them.

use std::collections::VecDeque;

use millrace_proto::TransitionBatch;

use crate::selector::Selector;

/// Destination of a sampled batch: one slice per column, `[batch, ...]` row-major.
/// The learner's prefetcher points these at its staging tensors so rows are gathered
/// straight into the memory that is copied to the device.
#[derive(Debug)]
pub struct SampleBuffers<'a> {
    pub obs: &'a mut [u8],
    pub next_obs: &'a mut [u8],
    pub actions: &'a mut [i64],
    pub rewards: &'a mut [f32],
    pub discounts: &'a mut [f32],
}

impl SampleBuffers<'_> {
    pub fn rows(&self) -> usize {
        self.actions.len()
    }
}

/// Two preallocated FIFO rings: observation rows, and transitions (struct-of-arrays)
/// that point at them.
///
/// Each inserted batch is one extent: its rows go to the observation ring, its
/// transitions to the item ring with indices translated to observation slots. Batches
/// are self-contained and evicted whole and oldest first, so a live transition never
/// points at an overwritten row, and storage per transition is about one observation
/// (see [`TransitionBatch`]) rather than two.
pub struct Shard {
    capacity: usize,
    obs_capacity: usize,
    row_bytes: usize,
    obs: Vec<u8>,
    obs_slot: Vec<u32>,
    next_slot: Vec<u32>,
    actions: Vec<i64>,
    rewards: Vec<f32>,
    discounts: Vec<f32>,
    /// Parameter version that produced each item (staleness metrics).
    versions: Vec<u64>,
    /// Live batches, oldest first: (observation rows, items).
    extents: VecDeque<(usize, usize)>,
    /// Next item slot to write; live items are the `len` slots before it.
    cursor: usize,
    len: usize,
    obs_cursor: usize,
    obs_len: usize,
    selector: Box<dyn Selector>,
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard")
            .field("capacity", &self.capacity)
            .field("obs_capacity", &self.obs_capacity)
            .field("len", &self.len)
            .field("obs_len", &self.obs_len)
            .finish_non_exhaustive()
    }
}

/// A batch bigger than a whole shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("batch of {items} items and {rows} observation rows exceeds a shard ({capacity} items, {obs_capacity} rows)")]
pub struct TooLarge {
    pub items: usize,
    pub rows: usize,
    pub capacity: usize,
    pub obs_capacity: usize,
}

impl Shard {
    /// Allocates all storage up front: `capacity` items and `obs_capacity` observation
    /// rows of `row_bytes` each. `selector` must select among slots `0..capacity` that
    /// it was told about through `insert` and `remove`.
    ///
    /// # Panics
    /// If either capacity is 0 or `obs_capacity` does not fit a `u32` index.
    pub fn new(
        capacity: usize,
        obs_capacity: usize,
        row_bytes: usize,
        selector: Box<dyn Selector>,
    ) -> Self {
        assert!(capacity > 0 && obs_capacity > 0, "a shard needs room");
        assert!(
            u32::try_from(obs_capacity).is_ok(),
            "observation slots are u32"
        );
        Self {
            capacity,
            obs_capacity,
            row_bytes,
            obs: vec![0; obs_capacity * row_bytes],
            obs_slot: vec![0; capacity],
            next_slot: vec![0; capacity],
            actions: vec![0; capacity],
            rewards: vec![0.0; capacity],
            discounts: vec![0.0; capacity],
            versions: vec![0; capacity],
            extents: VecDeque::new(),
            cursor: 0,
            len: 0,
            obs_cursor: 0,
            obs_len: 0,
            selector,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Observation rows held by live items.
    pub fn obs_len(&self) -> usize {
        self.obs_len
    }

    /// Sampling weight of this shard (see [`Selector`]).
    pub fn total(&self) -> f64 {
        self.selector.total()
    }

    /// Bytes of storage allocated per item of capacity, observation rows included.
    pub fn bytes_per_item(&self) -> f64 {
        let per_item = 4 + 4 + 8 + 4 + 4 + 8;
        (self.obs.len() as f64 / self.capacity as f64) + per_item as f64
    }

    /// Copies a (validated) batch in, evicting the oldest batches to make room.
    pub fn insert(&mut self, batch: &TransitionBatch) -> Result<(), TooLarge> {
        let (items, rows) = (batch.len(), batch.obs_rows());
        if items > self.capacity || rows > self.obs_capacity {
            return Err(TooLarge {
                items,
                rows,
                capacity: self.capacity,
                obs_capacity: self.obs_capacity,
            });
        }
        while self.len + items > self.capacity || self.obs_len + rows > self.obs_capacity {
            let (old_rows, old_items) = self.extents.pop_front().expect("room is held by extents");
            let first = (self.cursor + self.capacity - self.len) % self.capacity;
            for i in 0..old_items {
                self.selector.remove((first + i) % self.capacity);
            }
            self.len -= old_items;
            self.obs_len -= old_rows;
        }

        // Observation rows: the longest runs that fit before the ring wraps.
        let rb = self.row_bytes;
        let base = self.obs_cursor;
        let mut row = 0;
        while row < rows {
            let run = (rows - row).min(self.obs_capacity - self.obs_cursor);
            let dst = self.obs_cursor;
            self.obs[dst * rb..(dst + run) * rb]
                .copy_from_slice(&batch.obs[row * rb..(row + run) * rb]);
            self.obs_cursor = (self.obs_cursor + run) % self.obs_capacity;
            row += run;
        }
        self.obs_len += rows;

        let slot_of = |i: u32| ((base + i as usize) % self.obs_capacity) as u32;
        for i in 0..items {
            let dst = self.cursor;
            self.obs_slot[dst] = slot_of(batch.obs_index[i]);
            self.next_slot[dst] = slot_of(batch.next_index[i]);
            self.actions[dst] = batch.actions[i];
            self.rewards[dst] = batch.rewards[i];
            self.discounts[dst] = batch.discounts[i];
            self.versions[dst] = batch.version;
            self.selector.insert(dst);
            self.cursor = (self.cursor + 1) % self.capacity;
        }
        self.len += items;
        self.extents.push_back((rows, items));
        Ok(())
    }

    /// The live batches, oldest first, rebuilt as they were inserted (for checkpoints;
    /// inserting them into an empty shard of the same size restores this one).
    pub fn batches(&self) -> impl Iterator<Item = TransitionBatch> + '_ {
        let rb = self.row_bytes;
        let mut item = (self.cursor + self.capacity - self.len) % self.capacity;
        let mut row = (self.obs_cursor + self.obs_capacity - self.obs_len) % self.obs_capacity;
        self.extents.iter().map(move |&(rows, items)| {
            let mut b = TransitionBatch::with_capacity(rb, items, rows);
            let base = row;
            for r in 0..rows {
                let slot = (base + r) % self.obs_capacity;
                b.push_obs_bytes(&self.obs[slot * rb..(slot + 1) * rb]);
            }
            let local =
                |slot: u32| ((slot as usize + self.obs_capacity - base) % self.obs_capacity) as u32;
            for i in 0..items {
                let slot = (item + i) % self.capacity;
                b.push_transition(
                    local(self.obs_slot[slot]),
                    self.actions[slot],
                    self.rewards[slot],
                    self.discounts[slot],
                    local(self.next_slot[slot]),
                );
                b.version = self.versions[slot];
            }
            item = (item + items) % self.capacity;
            row = (row + rows) % self.obs_capacity;
            b
        })
    }

    /// Gathers the item chosen by weight `u` into row `row` of `out`; returns its version.
    pub fn gather(&self, u: f64, out: &mut SampleBuffers<'_>, row: usize) -> u64 {
        let slot = self.selector.select(u);
        let rb = self.row_bytes;
        let (o, n) = (self.obs_slot[slot] as usize, self.next_slot[slot] as usize);
        out.obs[row * rb..(row + 1) * rb].copy_from_slice(&self.obs[o * rb..(o + 1) * rb]);
        out.next_obs[row * rb..(row + 1) * rb].copy_from_slice(&self.obs[n * rb..(n + 1) * rb]);
        out.actions[row] = self.actions[slot];
        out.rewards[row] = self.rewards[slot];
        out.discounts[row] = self.discounts[slot];
        self.versions[slot]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selector::Uniform;

    /// Transitions `v → v + 0.5` for each value, each with its own two rows.
    fn batch(values: std::ops::Range<i64>) -> TransitionBatch {
        let n = (values.end - values.start) as usize;
        let mut b = TransitionBatch::with_capacity(4, n, 2 * n);
        for v in values {
            b.push_f32(&[v as f32], v, v as f32, 0.5, &[v as f32 + 0.5]);
        }
        b
    }

    /// A chain like an actor's: rows 0..=n, transition i from row i to row i + 1.
    fn chain(start: i64, n: usize) -> TransitionBatch {
        let mut b = TransitionBatch::with_capacity(4, n, n + 1);
        for i in 0..=n {
            b.push_obs_f32(&[(start + i as i64) as f32]);
        }
        for i in 0..n as u32 {
            b.push_transition(i, start + i64::from(i), 0.0, 0.9, i + 1);
        }
        b
    }

    struct Out(Vec<u8>, Vec<u8>, Vec<i64>, Vec<f32>, Vec<f32>);

    impl Out {
        fn new(n: usize) -> Self {
            Self(
                vec![0; n * 4],
                vec![0; n * 4],
                vec![0; n],
                vec![0.0; n],
                vec![0.0; n],
            )
        }
        fn buffers(&mut self) -> SampleBuffers<'_> {
            SampleBuffers {
                obs: &mut self.0,
                next_obs: &mut self.1,
                actions: &mut self.2,
                rewards: &mut self.3,
                discounts: &mut self.4,
            }
        }
        fn obs(&self, i: usize) -> f32 {
            f32::from_ne_bytes(self.0[i * 4..i * 4 + 4].try_into().unwrap())
        }
        fn next(&self, i: usize) -> f32 {
            f32::from_ne_bytes(self.1[i * 4..i * 4 + 4].try_into().unwrap())
        }
    }

    fn uniform(capacity: usize) -> Box<dyn Selector> {
        Box::new(Uniform::new(capacity))
    }

    /// Every live item, gathered in slot order.
    fn gather_all(shard: &Shard) -> Out {
        let mut out = Out::new(shard.len());
        for i in 0..shard.len() {
            shard.gather(i as f64 + 0.5, &mut out.buffers(), i);
        }
        out
    }

    #[test]
    fn wraparound_evicts_whole_oldest_batches() {
        let mut shard = Shard::new(5, 10, 4, uniform(5));
        shard.insert(&batch(0..3)).unwrap();
        assert_eq!((shard.len(), shard.obs_len()), (3, 6));
        // 3 + 2 items fit, but 6 + 4 rows do: no eviction yet.
        shard.insert(&batch(3..5)).unwrap();
        assert_eq!((shard.len(), shard.obs_len()), (5, 10));
        // The next batch needs room: the oldest batch (0..3) goes as a whole.
        shard.insert(&batch(5..7)).unwrap();
        assert_eq!((shard.len(), shard.obs_len()), (4, 8));
        let out = gather_all(&shard);
        assert_eq!(out.2, [3, 4, 5, 6]);
        for i in 0..4 {
            assert_eq!(out.obs(i), out.2[i] as f32);
            assert_eq!(
                out.next(i),
                out.2[i] as f32 + 0.5,
                "row pairs survive the wrap"
            );
        }
        assert!(out.4.iter().all(|x| *x == 0.5));
    }

    #[test]
    fn shared_rows_cost_one_observation_per_transition() {
        let mut shard = Shard::new(1000, 1100, 4, uniform(1000));
        for k in 0..40 {
            shard.insert(&chain(k * 100, 99)).unwrap();
        }
        // Ten batches of 99 items with 100 rows each fit; older ones were evicted.
        assert_eq!((shard.len(), shard.obs_len()), (990, 1000));
        let out = gather_all(&shard);
        for i in 0..shard.len() {
            assert_eq!(out.obs(i), out.2[i] as f32);
            assert_eq!(out.next(i), out.2[i] as f32 + 1.0);
        }
        assert!(shard.bytes_per_item() < 1.1 * 4.0 + 32.0 + 1e-9);
    }

    #[test]
    fn batches_rebuild_the_live_contents_across_the_wrap() {
        let mut shard = Shard::new(10, 16, 4, uniform(10));
        for k in 0..7 {
            let mut b = chain(k * 10, 3);
            b.version = k as u64;
            shard.insert(&b).unwrap();
        }
        let mut copy = Shard::new(10, 16, 4, uniform(10));
        let batches: Vec<_> = shard.batches().collect();
        assert_eq!(batches.len(), 3, "three batches of 3 items fit");
        assert_eq!(batches[0].version, 4);
        for b in &batches {
            b.validate(4).unwrap();
            copy.insert(b).unwrap();
        }
        let (a, b) = (gather_all(&shard), gather_all(&copy));
        assert_eq!((&a.0, &a.1, &a.2), (&b.0, &b.1, &b.2));
        assert_eq!(a.2, [40, 41, 42, 50, 51, 52, 60, 61, 62]);
    }

    #[test]
    fn a_batch_larger_than_the_shard_is_refused_and_nothing_changes() {
        let mut shard = Shard::new(4, 8, 4, uniform(4));
        shard.insert(&batch(0..2)).unwrap();
        assert!(shard.insert(&batch(0..10)).is_err());
        assert!(
            shard.insert(&chain(0, 4)).is_ok(),
            "4 items, 5 rows fit alone"
        );
        assert_eq!((shard.len(), shard.obs_len()), (4, 5));
        assert_eq!(gather_all(&shard).2, [0, 1, 2, 3]);
    }
}
