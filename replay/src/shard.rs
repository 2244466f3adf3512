//! One replay shard: a preallocated ring of transitions stored as columns.

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

/// A fixed-capacity FIFO ring of transitions in struct-of-arrays layout.
///
/// Invariant: slots `0..len` hold items; `cursor` is where the next item goes, and once
/// the ring is full it overwrites the oldest item.
pub struct Shard {
    capacity: usize,
    row_bytes: usize,
    obs: Vec<u8>,
    next_obs: Vec<u8>,
    actions: Vec<i64>,
    rewards: Vec<f32>,
    discounts: Vec<f32>,
    /// Parameter version that produced each item (staleness metrics).
    versions: Vec<u64>,
    cursor: usize,
    len: usize,
    selector: Box<dyn Selector>,
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard")
            .field("capacity", &self.capacity)
            .field("len", &self.len)
            .field("cursor", &self.cursor)
            .finish_non_exhaustive()
    }
}

impl Shard {
    /// Allocates all storage up front.
    pub fn new(capacity: usize, row_bytes: usize, selector: Box<dyn Selector>) -> Self {
        Self {
            capacity,
            row_bytes,
            obs: vec![0; capacity * row_bytes],
            next_obs: vec![0; capacity * row_bytes],
            actions: vec![0; capacity],
            rewards: vec![0.0; capacity],
            discounts: vec![0.0; capacity],
            versions: vec![0; capacity],
            cursor: 0,
            len: 0,
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

    /// Sampling weight of this shard (see [`Selector`]).
    pub fn total(&self) -> f64 {
        self.selector.total()
    }

    /// Bytes of storage held per transition.
    pub fn bytes_per_item(&self) -> usize {
        2 * self.row_bytes + 8 + 4 + 4 + 8
    }

    /// Copies a (validated) batch in, overwriting the oldest items when full.
    pub fn insert(&mut self, batch: &TransitionBatch) {
        let rb = self.row_bytes;
        let mut row = 0;
        let rows = batch.len();
        while row < rows {
            // Copy the longest run that fits before the ring wraps.
            let run = (rows - row).min(self.capacity - self.cursor);
            let (dst, src) = (self.cursor, row);
            self.obs[dst * rb..(dst + run) * rb]
                .copy_from_slice(&batch.obs[src * rb..(src + run) * rb]);
            self.next_obs[dst * rb..(dst + run) * rb]
                .copy_from_slice(&batch.next_obs[src * rb..(src + run) * rb]);
            self.actions[dst..dst + run].copy_from_slice(&batch.actions[src..src + run]);
            self.rewards[dst..dst + run].copy_from_slice(&batch.rewards[src..src + run]);
            self.discounts[dst..dst + run].copy_from_slice(&batch.discounts[src..src + run]);
            self.versions[dst..dst + run].fill(batch.version);
            for slot in dst..dst + run {
                self.selector.insert(slot);
            }
            self.cursor = (self.cursor + run) % self.capacity;
            self.len = (self.len + run).min(self.capacity);
            row += run;
        }
    }

    /// Gathers the item chosen by weight `u` into row `row` of `out`; returns its version.
    pub fn gather(&self, u: f64, out: &mut SampleBuffers<'_>, row: usize) -> u64 {
        let slot = self.selector.select(u);
        let rb = self.row_bytes;
        out.obs[row * rb..(row + 1) * rb].copy_from_slice(&self.obs[slot * rb..(slot + 1) * rb]);
        out.next_obs[row * rb..(row + 1) * rb]
            .copy_from_slice(&self.next_obs[slot * rb..(slot + 1) * rb]);
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

    fn batch(values: std::ops::Range<i64>) -> TransitionBatch {
        let mut b = TransitionBatch::with_capacity(4, (values.end - values.start) as usize);
        for v in values {
            b.push_f32(&[v as f32], v, v as f32, 0.5, &[v as f32 + 0.5]);
        }
        b
    }

    type Columns = (Vec<u8>, Vec<u8>, Vec<i64>, Vec<f32>, Vec<f32>);

    fn buffers(n: usize) -> Columns {
        (
            vec![0; n * 4],
            vec![0; n * 4],
            vec![0; n],
            vec![0.0; n],
            vec![0.0; n],
        )
    }

    #[test]
    fn wraparound_overwrites_oldest_first() {
        let mut shard = Shard::new(5, 4, Box::new(Uniform::default()));
        shard.insert(&batch(0..3));
        assert_eq!(shard.len(), 3);
        shard.insert(&batch(3..8)); // wraps: slots hold 5, 6, 7, 3, 4
        assert_eq!(shard.len(), 5);
        assert_eq!(shard.actions, [5, 6, 7, 3, 4]);
        assert_eq!(shard.rewards, [5.0, 6.0, 7.0, 3.0, 4.0]);
        let (mut o, mut n, mut a, mut r, mut d) = buffers(5);
        let mut out = SampleBuffers {
            obs: &mut o,
            next_obs: &mut n,
            actions: &mut a,
            rewards: &mut r,
            discounts: &mut d,
        };
        for slot in 0..5 {
            shard.gather(slot as f64 + 0.5, &mut out, slot);
        }
        assert_eq!(out.actions, [5, 6, 7, 3, 4]);
        let next: Vec<f32> = n
            .chunks(4)
            .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(next, [5.5, 6.5, 7.5, 3.5, 4.5]);
        assert!(d.iter().all(|x| *x == 0.5));
        assert_eq!(shard.bytes_per_item(), 32);
    }

    #[test]
    fn a_batch_larger_than_the_ring_keeps_its_newest_rows() {
        let mut shard = Shard::new(4, 4, Box::new(Uniform::default()));
        shard.insert(&batch(0..10));
        assert_eq!(shard.len(), 4);
        let mut stored = shard.actions.clone();
        stored.sort();
        assert_eq!(stored, [6, 7, 8, 9]);
    }
}
