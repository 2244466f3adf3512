//! One replay shard: preallocated rings of observation rows and of transitions (stored
//! as columns) that index them.

use std::collections::VecDeque;

use millrace_proto::TransitionBatch;

use crate::key::ItemKey;
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
    /// Which item each row is, for priority updates.
    pub keys: &'a mut [ItemKey],
}

impl SampleBuffers<'_> {
    pub fn rows(&self) -> usize {
        self.actions.len()
    }
}

/// One inserted batch, still live: its observation rows, its items, and the sequence
/// number of its first item.
#[derive(Clone, Copy, Debug)]
struct Extent {
    rows: usize,
    items: usize,
    first_seq: u64,
    /// Where its first observation row is in the ring (valid while it is live:
    /// batches are evicted whole, oldest first).
    obs_start: usize,
}

/// Two preallocated FIFO rings: observation rows, and transitions (struct-of-arrays)
/// that point at them.
///
/// Each inserted batch is one extent: its rows go to the observation ring, its
/// transitions to the item ring with indices translated to observation positions.
/// Batches are self-contained and evicted whole and oldest first, so a live transition
/// never points at an overwritten row, and storage per transition is about one
/// observation (see [`TransitionBatch`]) rather than two.
///
/// Items are numbered in insertion order (their sequence number); item `seq` lives at
/// position `seq % capacity` while it is live, so a sampled item's [`ItemKey`] finds it
/// again in O(1), and a key whose item was evicted is recognised as stale.
pub struct Shard {
    index: u16,
    capacity: usize,
    obs_capacity: usize,
    row_bytes: usize,
    obs: Vec<u8>,
    obs_pos: Vec<u32>,
    next_pos: Vec<u32>,
    actions: Vec<i64>,
    rewards: Vec<f32>,
    discounts: Vec<f32>,
    /// Parameter version that produced each item (staleness metrics).
    versions: Vec<u64>,
    /// Live batches, oldest first.
    extents: VecDeque<Extent>,
    /// Sequence number of the next item; live items are the `len` before it.
    next_seq: u64,
    len: usize,
    obs_cursor: usize,
    obs_len: usize,
    selector: Box<dyn Selector>,
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard")
            .field("index", &self.index)
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

/// A shard's storage could not be allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cannot allocate {bytes} bytes for a replay shard")]
pub struct OutOfMemory {
    pub bytes: usize,
}

/// A zeroed vector of `len` elements, or `OutOfMemory` instead of aborting.
///
/// A fallible reservation first (an allocation the allocator refuses is an error, not
/// an abort), released at once; then `vec!` of zeros, which takes zeroed pages from the
/// allocator (calloc) instead of writing every byte: a replay of gigabytes starts in
/// no time and its memory is committed as it fills.
fn zeroed<T: Clone + Default>(len: usize) -> Result<Vec<T>, OutOfMemory> {
    let bytes = len.saturating_mul(std::mem::size_of::<T>());
    let mut probe = Vec::<T>::new();
    probe
        .try_reserve_exact(len)
        .map_err(|_| OutOfMemory { bytes })?;
    drop(probe);
    Ok(vec![T::default(); len])
}

impl Shard {
    /// Bytes a shard of this size allocates (observation rows and item columns).
    pub fn bytes_for(capacity: usize, obs_capacity: usize, row_bytes: usize) -> usize {
        obs_capacity
            .saturating_mul(row_bytes)
            .saturating_add(capacity.saturating_mul(Self::ITEM_BYTES))
    }

    /// Bytes of the per-item columns.
    const ITEM_BYTES: usize = 4 + 4 + 8 + 4 + 4 + 8;

    /// Allocates all storage up front: `capacity` items and `obs_capacity` observation
    /// rows of `row_bytes` each, or `OutOfMemory` if the allocator refuses. `selector`
    /// must select among positions `0..capacity` that it was told about through
    /// `insert` and `delete`. `index` is the shard's place in its table (item keys).
    ///
    /// More than `u32::MAX` observation rows is refused as `OutOfMemory` too.
    ///
    /// # Panics
    /// If either capacity is 0.
    pub fn new(
        index: u16,
        capacity: usize,
        obs_capacity: usize,
        row_bytes: usize,
        selector: Box<dyn Selector>,
    ) -> Result<Self, OutOfMemory> {
        assert!(capacity > 0 && obs_capacity > 0, "a shard needs room");
        let obs_bytes = obs_capacity
            .checked_mul(row_bytes)
            .ok_or(OutOfMemory { bytes: usize::MAX })?;
        if u32::try_from(obs_capacity).is_err() {
            // Observation positions are stored as u32.
            return Err(OutOfMemory {
                bytes: Self::bytes_for(capacity, obs_capacity, row_bytes),
            });
        }
        Ok(Self {
            index,
            capacity,
            obs_capacity,
            row_bytes,
            obs: zeroed(obs_bytes)?,
            obs_pos: zeroed(capacity)?,
            next_pos: zeroed(capacity)?,
            actions: zeroed(capacity)?,
            rewards: zeroed(capacity)?,
            discounts: zeroed(capacity)?,
            versions: zeroed(capacity)?,
            extents: VecDeque::new(),
            next_seq: 0,
            len: 0,
            obs_cursor: 0,
            obs_len: 0,
            selector,
        })
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
        (self.obs.len() as f64 / self.capacity as f64) + Self::ITEM_BYTES as f64
    }

    /// Sequence number of the oldest live item.
    fn first_seq(&self) -> u64 {
        self.next_seq - self.len as u64
    }

    fn pos(&self, seq: u64) -> usize {
        (seq % self.capacity as u64) as usize
    }

    /// The position of a live item's key, or `None` if it was evicted since (or
    /// belongs to another shard).
    pub fn position(&self, key: ItemKey) -> Option<usize> {
        (key.shard() == self.index && (self.first_seq()..self.next_seq).contains(&key.seq()))
            .then(|| self.pos(key.seq()))
    }

    /// Copies a (validated) batch in, evicting the oldest batches to make room. Items
    /// get the batch's priorities, or `default_priority` where it has none.
    pub fn insert(
        &mut self,
        batch: &TransitionBatch,
        default_priority: f64,
    ) -> Result<(), TooLarge> {
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
            let old = self.extents.pop_front().expect("room is held by extents");
            for seq in old.first_seq..old.first_seq + old.items as u64 {
                self.selector.delete(self.pos(seq));
            }
            self.len -= old.items;
            self.obs_len -= old.rows;
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

        let first_seq = self.next_seq;
        let pos_of = |i: u32| ((base + i as usize) % self.obs_capacity) as u32;
        for i in 0..items {
            let dst = self.pos(self.next_seq);
            self.obs_pos[dst] = pos_of(batch.obs_index[i]);
            self.next_pos[dst] = pos_of(batch.next_index[i]);
            self.actions[dst] = batch.actions[i];
            self.rewards[dst] = batch.rewards[i];
            self.discounts[dst] = batch.discounts[i];
            self.versions[dst] = batch.version;
            let priority = batch
                .priorities
                .get(i)
                .map_or(default_priority, |p| f64::from(*p));
            self.selector.insert(dst, priority);
            self.next_seq += 1;
        }
        self.len += items;
        self.extents.push_back(Extent {
            rows,
            items,
            first_seq,
            obs_start: base,
        });
        Ok(())
    }

    /// Sets the priority of the item `key` names; `false` (and nothing changes) when
    /// that item was evicted since it was sampled.
    pub fn update(&mut self, key: ItemKey, priority: f64) -> bool {
        match self.position(key) {
            Some(pos) => {
                self.selector.update(pos, priority);
                true
            }
            None => false,
        }
    }

    /// Sequence number one past the newest item: a snapshot taken now covers the
    /// batches before it.
    pub fn end_seq(&self) -> u64 {
        self.next_seq
    }

    /// The oldest live batch whose first item is at or after `from` and before `end`,
    /// rebuilt as it was inserted (with priorities where the selector keeps them), and
    /// the sequence number after it. For checkpoints, one batch per lock.
    pub fn batch_from(&self, from: u64, end: u64) -> Option<(TransitionBatch, u64)> {
        let rb = self.row_bytes;
        // Extents are in sequence order: a binary search, not a walk from the oldest.
        let i = self.extents.partition_point(|e| e.first_seq < from);
        let e = self.extents.get(i).filter(|e| e.first_seq < end)?;
        let mut b = TransitionBatch::with_capacity(rb, e.items, e.rows);
        let base = e.obs_start;
        for r in 0..e.rows {
            let p = (base + r) % self.obs_capacity;
            b.push_obs_bytes(&self.obs[p * rb..(p + 1) * rb]);
        }
        let local = |p: u32| ((p as usize + self.obs_capacity - base) % self.obs_capacity) as u32;
        for seq in e.first_seq..e.first_seq + e.items as u64 {
            let p = self.pos(seq);
            b.push_transition(
                local(self.obs_pos[p]),
                self.actions[p],
                self.rewards[p],
                self.discounts[p],
                local(self.next_pos[p]),
            );
            b.version = self.versions[p];
            if let Some(priority) = self.selector.priority(p) {
                b.priorities.push(priority as f32);
            }
        }
        Some((b, e.first_seq + e.items as u64))
    }

    /// The live batches, oldest first (see [`Shard::batch_from`]).
    #[cfg(test)]
    fn batches(&self) -> impl Iterator<Item = TransitionBatch> + '_ {
        let end = self.next_seq;
        let mut from = 0;
        std::iter::from_fn(move || {
            let (b, next) = self.batch_from(from, end)?;
            from = next;
            Some(b)
        })
    }

    /// Gathers the item chosen by weight `u` into row `row` of `out`; returns its
    /// version, or `None` (and writes nothing) when the shard is empty.
    pub fn gather(&self, u: f64, out: &mut SampleBuffers<'_>, row: usize) -> Option<u64> {
        let pos = self.selector.sample(u)?;
        let rb = self.row_bytes;
        let (o, n) = (self.obs_pos[pos] as usize, self.next_pos[pos] as usize);
        out.obs[row * rb..(row + 1) * rb].copy_from_slice(&self.obs[o * rb..(o + 1) * rb]);
        out.next_obs[row * rb..(row + 1) * rb].copy_from_slice(&self.obs[n * rb..(n + 1) * rb]);
        out.actions[row] = self.actions[pos];
        out.rewards[row] = self.rewards[pos];
        out.discounts[row] = self.discounts[pos];
        // The live item at `pos` is the one whose sequence number is congruent to it.
        let first = self.first_seq();
        let offset = (pos + self.capacity - self.pos(first)) % self.capacity;
        out.keys[row] = ItemKey::new(self.index, first + offset as u64);
        Some(self.versions[pos])
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

    struct Out(Vec<u8>, Vec<u8>, Vec<i64>, Vec<f32>, Vec<f32>, Vec<ItemKey>);

    impl Out {
        fn new(n: usize) -> Self {
            Self(
                vec![0; n * 4],
                vec![0; n * 4],
                vec![0; n],
                vec![0.0; n],
                vec![0.0; n],
                vec![ItemKey::default(); n],
            )
        }
        fn buffers(&mut self) -> SampleBuffers<'_> {
            SampleBuffers {
                obs: &mut self.0,
                next_obs: &mut self.1,
                actions: &mut self.2,
                rewards: &mut self.3,
                discounts: &mut self.4,
                keys: &mut self.5,
            }
        }
        fn obs(&self, i: usize) -> f32 {
            f32::from_ne_bytes(self.0[i * 4..i * 4 + 4].try_into().unwrap())
        }
        fn next(&self, i: usize) -> f32 {
            f32::from_ne_bytes(self.1[i * 4..i * 4 + 4].try_into().unwrap())
        }
    }

    fn shard(capacity: usize, obs_capacity: usize) -> Shard {
        Shard::new(
            3,
            capacity,
            obs_capacity,
            4,
            Box::new(Uniform::new(capacity)),
        )
        .unwrap()
    }

    /// Every live item, gathered in position order.
    fn gather_all(shard: &Shard) -> Out {
        let mut out = Out::new(shard.len());
        for i in 0..shard.len() {
            shard.gather(i as f64 + 0.5, &mut out.buffers(), i).unwrap();
        }
        out
    }

    #[test]
    fn wraparound_evicts_whole_oldest_batches() {
        let mut shard = shard(5, 10);
        shard.insert(&batch(0..3), 1.0).unwrap();
        assert_eq!((shard.len(), shard.obs_len()), (3, 6));
        // 3 + 2 items fit, and 6 + 4 rows do: no eviction yet.
        shard.insert(&batch(3..5), 1.0).unwrap();
        assert_eq!((shard.len(), shard.obs_len()), (5, 10));
        // The next batch needs room: the oldest batch (0..3) goes as a whole.
        shard.insert(&batch(5..7), 1.0).unwrap();
        assert_eq!((shard.len(), shard.obs_len()), (4, 8));
        let out = gather_all(&shard);
        assert_eq!(
            out.2,
            [3, 4, 5, 6],
            "oldest first, positions 0 and 1 reused"
        );
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
    fn keys_name_items_until_they_are_evicted() {
        let mut shard = shard(5, 10);
        shard.insert(&batch(0..3), 1.0).unwrap();
        let out = gather_all(&shard);
        assert_eq!(out.5[1], ItemKey::new(3, 1), "item 1 of shard 3");
        for (key, action) in out.5.iter().zip(&out.2) {
            assert_eq!(key.seq() as i64, *action, "the key names the item gathered");
            assert!(shard.position(*key).is_some());
        }
        // Evict the first batch: its keys go stale, and updates through them do nothing.
        shard.insert(&batch(3..5), 1.0).unwrap();
        shard.insert(&batch(5..7), 1.0).unwrap();
        assert_eq!(shard.position(ItemKey::new(3, 0)), None);
        assert!(!shard.update(ItemKey::new(3, 2), 5.0), "stale key");
        assert!(shard.update(ItemKey::new(3, 5), 5.0), "live key");
        assert_eq!(shard.position(ItemKey::new(3, 5)), Some(0));
        assert_eq!(
            shard.position(ItemKey::new(2, 5)),
            None,
            "another shard's key"
        );
        let keys = gather_all(&shard).5;
        assert_eq!(
            keys.iter().map(|k| k.seq()).collect::<Vec<_>>(),
            [3, 4, 5, 6]
        );
    }

    #[test]
    fn an_empty_shard_gathers_nothing() {
        let shard = shard(4, 8);
        let mut out = Out::new(1);
        assert_eq!(shard.gather(0.0, &mut out.buffers(), 0), None);
    }

    #[test]
    fn shared_rows_cost_one_observation_per_transition() {
        let mut shard = shard(1000, 1100);
        for k in 0..40 {
            shard.insert(&chain(k * 100, 99), 1.0).unwrap();
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
        let mut shard = shard(10, 16);
        for k in 0..7 {
            let mut b = chain(k * 10, 3);
            b.version = k as u64;
            shard.insert(&b, 1.0).unwrap();
        }
        let mut copy = Shard::new(3, 10, 16, 4, Box::new(Uniform::new(10))).unwrap();
        let batches: Vec<_> = shard.batches().collect();
        assert_eq!(batches.len(), 3, "three batches of 3 items fit");
        assert_eq!(batches[0].version, 4);
        for b in &batches {
            b.validate(4).unwrap();
            copy.insert(b, 1.0).unwrap();
        }
        let (a, b) = (gather_all(&shard), gather_all(&copy));
        assert_eq!((&a.0, &a.1, &a.2), (&b.0, &b.1, &b.2));
        let mut actions = a.2.clone();
        actions.sort_unstable();
        assert_eq!(actions, [40, 41, 42, 50, 51, 52, 60, 61, 62]);
        // One batch at a time, up to a bound: a batch inserted after the bound was
        // taken is not part of the snapshot.
        let end = shard.end_seq();
        let (first, next) = shard.batch_from(0, end).unwrap();
        assert_eq!(first.actions, [40, 41, 42]);
        shard.insert(&chain(70, 3), 1.0).unwrap();
        let (second, next) = shard.batch_from(next, end).unwrap();
        assert_eq!(
            second.actions,
            [50, 51, 52],
            "the oldest was evicted meanwhile"
        );
        let (third, next) = shard.batch_from(next, end).unwrap();
        assert_eq!(third.actions, [60, 61, 62]);
        assert!(
            shard.batch_from(next, end).is_none(),
            "70.. came after the bound"
        );
    }

    #[test]
    fn a_batch_larger_than_the_shard_is_refused_and_nothing_changes() {
        let mut shard = shard(4, 8);
        shard.insert(&batch(0..2), 1.0).unwrap();
        assert!(shard.insert(&batch(0..10), 1.0).is_err());
        assert!(
            shard.insert(&chain(0, 4), 1.0).is_ok(),
            "4 items, 5 rows fit alone"
        );
        assert_eq!((shard.len(), shard.obs_len()), (4, 5));
        assert_eq!(gather_all(&shard).2, [0, 1, 2, 3]);
    }

    #[test]
    fn storage_that_cannot_be_allocated_is_an_error_not_an_abort() {
        let err = Shard::new(0, 1, 1 << 31, 1 << 40, Box::new(Uniform::new(1))).unwrap_err();
        assert_eq!(err.bytes, usize::MAX);
        let err = Shard::new(0, 1, 1 << 33, 1, Box::new(Uniform::new(1))).unwrap_err();
        assert!(err.bytes >= 1 << 33, "more rows than u32 positions");
        let err = Shard::new(0, 1, 1 << 20, 1 << 40, Box::new(Uniform::new(1))).unwrap_err();
        assert!(err.bytes >= 1 << 60, "{err}");
    }
}
