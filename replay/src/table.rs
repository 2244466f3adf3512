//! The replay table: shards, a selector per shard and one rate limiter, safe to share
//! between actor threads (inserting) and sampler threads.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use millrace_proto::{SpecError, TransitionBatch};
use rand::Rng;

use crate::limiter::{RateLimiter, RateLimiterConfig};
use crate::selector::Uniform;
use crate::shard::{SampleBuffers, Shard, TooLarge};

/// Replay settings, checked by whoever builds them.
#[derive(Clone, Debug)]
pub struct ReplayConfig {
    /// Items held in all shards together (each shard holds `capacity / shards`).
    pub capacity: usize,
    /// Independent locks; batch `seq` of actor `a` goes to shard `(a + seq) % shards`, so
    /// every actor's data spreads over all shards (full capacity with any actor count)
    /// while concurrent actors still tend to hit different locks.
    pub shards: usize,
    /// Bytes of one observation row.
    pub obs_row_bytes: usize,
    /// Observation rows allocated per item of capacity (≥ 1). A batch of T transitions
    /// from E environments with n-step returns holds about T + E·n rows (see
    /// [`TransitionBatch`]), so `1 + E·n/T` plus a little for truncated episodes; if
    /// the data needs more, the oldest items are evicted early instead.
    pub obs_rows_per_item: f64,
    pub limiter: RateLimiterConfig,
}

impl ReplayConfig {
    /// Observation rows per item for batches of at least `batch_rows` transitions from
    /// `envs` environments with `n_step` returns: each batch carries at most `n_step`
    /// rows per environment over from the one before, plus 5% for truncated episodes
    /// (which store their final observation as well).
    pub fn obs_rows_for(envs: usize, n_step: usize, batch_rows: usize) -> f64 {
        1.05 + (envs * n_step) as f64 / batch_rows.max(1) as f64
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ReplayError {
    #[error("replay is closed")]
    Closed,
    #[error("malformed batch: {0}")]
    Malformed(#[from] SpecError),
    #[error(transparent)]
    TooLarge(#[from] TooLarge),
}

/// The table was closed while waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("replay is closed")]
pub struct Closed;

/// Counters for metrics; all monotonic.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReplayStats {
    pub inserted: u64,
    pub sampled: u64,
    pub size: usize,
    /// Observation rows held by the stored items.
    pub obs_rows: usize,
    /// Total time inserters spent blocked by the rate limiter.
    pub insert_blocked_s: f64,
    /// Total time samplers spent blocked by the rate limiter.
    pub sample_blocked_s: f64,
}

struct Gate {
    limiter: RateLimiter,
    closed: bool,
    /// Threads blocked in `wait`: nobody to wake means no wake-up syscall, and a
    /// sampler never wakes an actor that still could not insert.
    waiting: usize,
}

/// Sharded replay with rate-limited, blocking insert and sample.
///
/// Locking: `gate` (a std `Mutex` + `Condvar`: waits are short and never span an
/// `.await`) guards only the limiter's counters; shard locks guard storage, and the two
/// are never held together. An insert writes its shard first and counts afterwards, so
/// anything the limiter lets a sampler take is already stored. A sampler reserves its
/// items under the lock that checked the limiter, so samplers never overdraw the ratio.
pub struct Table {
    shards: Vec<Mutex<Shard>>,
    row_bytes: usize,
    /// Items and observation rows per shard.
    per_shard: (usize, usize),
    gate: Mutex<Gate>,
    changed: Condvar,
    insert_blocked_ns: AtomicU64,
    sample_blocked_ns: AtomicU64,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("shards", &self.shards.len())
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Table {
    /// Allocates every shard's storage up front.
    pub fn new(config: &ReplayConfig) -> Self {
        let shards = config.shards.max(1);
        let per_shard = config.capacity.div_ceil(shards).max(1);
        let obs_per_shard =
            (per_shard as f64 * config.obs_rows_per_item.max(1.0)).ceil() as usize + 1;
        Self {
            shards: (0..shards)
                .map(|_| {
                    Mutex::new(Shard::new(
                        per_shard,
                        obs_per_shard,
                        config.obs_row_bytes,
                        Box::new(Uniform::new(per_shard)),
                    ))
                })
                .collect(),
            row_bytes: config.obs_row_bytes,
            per_shard: (per_shard, obs_per_shard),
            gate: Mutex::new(Gate {
                limiter: RateLimiter::new(config.limiter),
                closed: false,
                waiting: 0,
            }),
            changed: Condvar::new(),
            insert_blocked_ns: AtomicU64::new(0),
            sample_blocked_ns: AtomicU64::new(0),
        }
    }

    fn gate(&self) -> MutexGuard<'_, Gate> {
        // A panic while holding the gate cannot leave the counters half-updated (each
        // update is one add), so a poisoned lock is still consistent.
        self.gate.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn shard(&self, i: usize) -> MutexGuard<'_, Shard> {
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stores a batch, blocking while the rate limiter holds inserts back.
    pub fn insert(&self, batch: &TransitionBatch) -> Result<(), ReplayError> {
        batch.validate(self.row_bytes)?;
        if batch.is_empty() {
            return Ok(());
        }
        let (capacity, obs_capacity) = self.per_shard;
        if batch.len() > capacity || batch.obs_rows() > obs_capacity {
            return Err(TooLarge {
                items: batch.len(),
                rows: batch.obs_rows(),
                capacity,
                obs_capacity,
            }
            .into());
        }
        // Counted only once stored (below), so a sampler never sees counted but absent
        // items; concurrent inserters may overshoot the band by a batch each.
        self.wait(
            &self.insert_blocked_ns,
            |g| g.limiter.can_insert(),
            |_| false,
        )?;
        let shard =
            (u64::from(batch.actor_id).wrapping_add(batch.seq) % self.shards.len() as u64) as usize;
        self.shard(shard).insert(batch)?;
        let mut gate = self.gate();
        gate.limiter.insert(batch.len() as u64);
        if gate.waiting > 0 {
            self.changed.notify_all();
        }
        Ok(())
    }

    /// Samples `out.rows()` items uniformly over everything stored, gathering them into
    /// `out`; blocks while the rate limiter holds samples back. Returns the oldest
    /// parameter version among the sampled items.
    pub fn sample<R: Rng>(&self, rng: &mut R, out: &mut SampleBuffers<'_>) -> Result<u64, Closed> {
        let n = out.rows();
        // Reserve under the same lock that checked, so samplers never overdraw the ratio.
        // Wake inserters only once one of them can go.
        self.wait(
            &self.sample_blocked_ns,
            |g| g.limiter.can_sample(n as u64),
            |g| {
                g.limiter.sample(n as u64);
                g.limiter.can_insert()
            },
        )
        .map_err(|_| Closed)?;

        // Lock every shard (in index order, as no other path holds two) for the few
        // microseconds of one gather: rows are copied in draw order with no sorting,
        // and inserts wait at most that long.
        let shards: Vec<MutexGuard<'_, Shard>> =
            (0..self.shards.len()).map(|i| self.shard(i)).collect();
        let sum: f64 = shards.iter().map(|s| s.total()).sum();
        let mut oldest = u64::MAX;
        for row in 0..n {
            let mut u = rng.random::<f64>() * sum;
            let mut s = 0;
            while s + 1 < shards.len() && u >= shards[s].total() {
                u -= shards[s].total();
                s += 1;
            }
            oldest = oldest.min(shards[s].gather(u, out, row));
        }
        Ok(oldest)
    }

    /// Blocks until `ready` holds or the table closes, then runs `then` under the same
    /// lock, waking the other waiters if it returns true; adds the time waited to
    /// `blocked`.
    fn wait(
        &self,
        blocked: &AtomicU64,
        ready: impl Fn(&Gate) -> bool,
        then: impl FnOnce(&mut Gate) -> bool,
    ) -> Result<(), ReplayError> {
        let mut gate = self.gate();
        if gate.closed {
            return Err(ReplayError::Closed);
        }
        if !ready(&gate) {
            let start = Instant::now();
            gate.waiting += 1;
            while !gate.closed && !ready(&gate) {
                gate = self.changed.wait(gate).unwrap_or_else(|e| e.into_inner());
            }
            gate.waiting -= 1;
            blocked.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
            if gate.closed {
                return Err(ReplayError::Closed);
            }
        }
        if then(&mut gate) && gate.waiting > 0 {
            self.changed.notify_all();
        }
        Ok(())
    }

    /// Every stored batch with the shard it is in, oldest first per shard, and the
    /// limiter's counters: what [`Table::restore`] needs to rebuild this table. Each
    /// shard is copied out under its lock and handed to `each` after releasing it, so
    /// slow consumers (disk) hold up nobody. Actors and samplers keep running, so the
    /// counters, read last, may include a few batches the copy does not.
    pub fn snapshot(&self, mut each: impl FnMut(usize, TransitionBatch)) -> (u64, u64) {
        for i in 0..self.shards.len() {
            let batches: Vec<TransitionBatch> = self.shard(i).batches().collect();
            for batch in batches {
                each(i, batch);
            }
        }
        let g = self.gate();
        (g.limiter.inserts(), g.limiter.samples())
    }

    /// Puts a batch from a [`Table::snapshot`] back, outside the rate limiter (restore
    /// its counters with [`Table::restore_counters`]), into shard `shard` modulo this
    /// table's shard count, so that a table with other `shards` can be refilled too.
    /// A batch larger than a shard of this table is refused with `TooLarge`.
    pub fn restore(&self, shard: usize, batch: &TransitionBatch) -> Result<(), ReplayError> {
        batch.validate(self.row_bytes)?;
        if batch.is_empty() {
            return Ok(());
        }
        self.shard(shard % self.shards.len()).insert(batch)?;
        Ok(())
    }

    /// Sets the rate limiter's counters (a restored checkpoint's), so the replay ratio
    /// carries on where it was.
    pub fn restore_counters(&self, inserts: u64, samples: u64) {
        let mut g = self.gate();
        let config = *g.limiter.config();
        g.limiter = RateLimiter::with_counts(config, inserts, samples);
        self.changed.notify_all();
    }

    /// Wakes every blocked inserter and sampler with [`ReplayError::Closed`]; later calls
    /// fail at once. Stored data stays readable through `stats`.
    pub fn close(&self) {
        self.gate().closed = true;
        self.changed.notify_all();
    }

    pub fn len(&self) -> usize {
        (0..self.shards.len()).map(|i| self.shard(i).len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Items held by each shard.
    pub fn shard_lens(&self) -> Vec<usize> {
        (0..self.shards.len())
            .map(|i| self.shard(i).len())
            .collect()
    }

    /// Bytes allocated per transition of capacity (observation rows included).
    pub fn bytes_per_item(&self) -> f64 {
        self.shard(0).bytes_per_item()
    }

    /// Transitions one shard holds (the largest batch it takes).
    pub fn shard_capacity(&self) -> usize {
        self.per_shard.0
    }

    /// Bytes of one observation row.
    pub fn obs_row_bytes(&self) -> usize {
        self.row_bytes
    }

    pub fn stats(&self) -> ReplayStats {
        let (inserted, sampled) = {
            let g = self.gate();
            (g.limiter.inserts(), g.limiter.samples())
        };
        ReplayStats {
            inserted,
            sampled,
            size: self.len(),
            obs_rows: (0..self.shards.len())
                .map(|i| self.shard(i).obs_len())
                .sum(),
            insert_blocked_s: self.insert_blocked_ns.load(Ordering::Relaxed) as f64 * 1e-9,
            sample_blocked_s: self.sample_blocked_ns.load(Ordering::Relaxed) as f64 * 1e-9,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;
    use std::sync::Arc;
    use std::time::Duration;

    fn config(capacity: usize, shards: usize, spi: f64, min_size: u64) -> ReplayConfig {
        ReplayConfig {
            capacity,
            shards,
            obs_row_bytes: 4,
            obs_rows_per_item: 2.0,
            limiter: RateLimiterConfig::sample_to_insert_ratio(spi, min_size, 1e9, 64).unwrap(),
        }
    }

    fn batch(actor_id: u32, values: std::ops::Range<i64>) -> TransitionBatch {
        let n = (values.end - values.start) as usize;
        let mut b = TransitionBatch::with_capacity(4, n, 2 * n);
        b.actor_id = actor_id;
        for v in values {
            b.push_f32(&[v as f32], v, v as f32, 1.0, &[v as f32]);
        }
        b
    }

    struct Out {
        obs: Vec<u8>,
        next: Vec<u8>,
        actions: Vec<i64>,
        rewards: Vec<f32>,
        discounts: Vec<f32>,
    }

    impl Out {
        fn new(n: usize) -> Self {
            Self {
                obs: vec![0; n * 4],
                next: vec![0; n * 4],
                actions: vec![0; n],
                rewards: vec![0.0; n],
                discounts: vec![0.0; n],
            }
        }
        fn buffers(&mut self) -> SampleBuffers<'_> {
            SampleBuffers {
                obs: &mut self.obs,
                next_obs: &mut self.next,
                actions: &mut self.actions,
                rewards: &mut self.rewards,
                discounts: &mut self.discounts,
            }
        }
    }

    #[test]
    fn routes_batches_round_robin_from_each_actor() {
        let table = Table::new(&config(400, 4, 1.0, 1));
        let mut b = batch(5, 0..10);
        table.insert(&b).unwrap(); // (5 + 0) % 4 = 1
        b.seq = 1;
        table.insert(&b).unwrap(); // 2
        let mut c = batch(2, 0..3);
        c.seq = 4;
        table.insert(&c).unwrap(); // (2 + 4) % 4 = 2
        assert_eq!(table.shard_lens(), [0, 10, 13, 0]);
        // One actor alone still fills every shard, i.e. the whole capacity.
        let single = Table::new(&config(40, 4, 1.0, 1));
        for seq in 0..8 {
            let mut b = batch(0, 0..10);
            b.seq = seq;
            single.insert(&b).unwrap();
        }
        assert_eq!(single.shard_lens(), [10, 10, 10, 10]);
    }

    #[test]
    fn rejects_malformed_batches_and_stores_nothing() {
        let table = Table::new(&config(100, 2, 1.0, 1));
        let mut bad = batch(0, 0..4);
        bad.discounts.pop();
        assert!(matches!(table.insert(&bad), Err(ReplayError::Malformed(_))));
        assert_eq!(table.len(), 0);
    }

    #[test]
    fn samples_uniformly_across_shards_of_different_sizes() {
        let table = Table::new(&config(4000, 4, 1e6, 1));
        // Shards hold 100, 200, 300 and 400 items; uniform means per item, not per shard.
        let mut next = 0;
        for (actor, size) in [(0, 100), (1, 200), (2, 300), (3, 400)] {
            table.insert(&batch(actor, next..next + size)).unwrap();
            next += size;
        }
        let mut rng = SmallRng::seed_from_u64(0);
        let mut counts = vec![0u32; 1000];
        let mut out = Out::new(500);
        for _ in 0..200 {
            table.sample(&mut rng, &mut out.buffers()).unwrap();
            for a in &out.actions {
                counts[*a as usize] += 1;
            }
        }
        // 100k draws over 1000 items: expect 100 each. Chi-square with 999 degrees of
        // freedom has mean 999 and sd ~45; 1200 is > 4 sd out.
        let chi2: f64 = counts
            .iter()
            .map(|c| (f64::from(*c) - 100.0).powi(2) / 100.0)
            .sum();
        assert!(chi2 < 1200.0, "chi2 {chi2}");
        // Rows come back whole: reward and observation belong to the same item.
        for (i, a) in out.actions.iter().enumerate() {
            assert_eq!(out.rewards[i], *a as f32);
            assert_eq!(
                f32::from_ne_bytes(out.obs[i * 4..i * 4 + 4].try_into().unwrap()),
                *a as f32
            );
        }
    }

    #[test]
    fn seeded_sampling_is_reproducible() {
        let table = Table::new(&config(1000, 3, 1e6, 1));
        for actor in 0..3 {
            table.insert(&batch(actor, 0..50)).unwrap();
        }
        let draw = |seed| {
            let mut out = Out::new(64);
            table
                .sample(&mut SmallRng::seed_from_u64(seed), &mut out.buffers())
                .unwrap();
            out.actions
        };
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
    }

    #[test]
    fn sample_blocks_until_min_size_then_proceeds() {
        let table = Arc::new(Table::new(&config(1000, 2, 1e6, 100)));
        let sampler = {
            let table = Arc::clone(&table);
            std::thread::spawn(move || {
                let mut out = Out::new(8);
                table.sample(&mut SmallRng::seed_from_u64(0), &mut out.buffers())
            })
        };
        table.insert(&batch(0, 0..50)).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(!sampler.is_finished(), "50 < min size 100");
        table.insert(&batch(1, 0..50)).unwrap();
        assert!(sampler.join().unwrap().is_ok());
        assert!(table.stats().sample_blocked_s > 0.03);
    }

    #[test]
    fn a_blocked_inserter_proceeds_once_samples_make_room() {
        // spi 1, min size 10, band ±70: inserts block once 80 items are ahead.
        let table = Arc::new(Table::new(&ReplayConfig {
            limiter: RateLimiterConfig::sample_to_insert_ratio(1.0, 10, 70.0, 8).unwrap(),
            ..config(1000, 2, 1.0, 10)
        }));
        table.insert(&batch(0, 0..81)).unwrap();
        let (done_tx, done) = std::sync::mpsc::channel();
        {
            let table = Arc::clone(&table);
            std::thread::spawn(move || done_tx.send(table.insert(&batch(1, 0..4))));
        }
        // Wait until it is blocked beyond the band, however slowly its thread starts.
        let start = std::time::Instant::now();
        while table.gate().waiting == 0 {
            assert!(start.elapsed() < Duration::from_secs(5), "never blocked");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(done.try_recv().is_err(), "beyond the band");
        // One sample of 8 brings the difference back into the band: the sampler must
        // wake the inserter (it is only woken when it can go).
        let mut out = Out::new(8);
        table
            .sample(&mut SmallRng::seed_from_u64(0), &mut out.buffers())
            .unwrap();
        let woken = done.recv_timeout(Duration::from_secs(5));
        assert_eq!(woken, Ok(Ok(())), "the sample woke the inserter");
        assert_eq!(table.stats().inserted, 85);
        assert!(table.stats().insert_blocked_s > 0.0);
    }

    #[test]
    fn close_unblocks_waiting_samplers_and_inserters() {
        let table = Arc::new(Table::new(&ReplayConfig {
            limiter: RateLimiterConfig::sample_to_insert_ratio(1.0, 10, 70.0, 64).unwrap(),
            ..config(1000, 1, 1.0, 10)
        }));
        // Fill until inserts block (diff may reach 10 + 70).
        table.insert(&batch(0, 0..80)).unwrap();
        let inserter = {
            let table = Arc::clone(&table);
            std::thread::spawn(move || table.insert(&batch(0, 0..1)))
        };
        let empty = Arc::new(Table::new(&config(10, 1, 1.0, 5)));
        let sampler = {
            let empty = Arc::clone(&empty);
            std::thread::spawn(move || {
                let mut out = Out::new(1);
                empty.sample(&mut SmallRng::seed_from_u64(0), &mut out.buffers())
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(!inserter.is_finished() && !sampler.is_finished());
        table.close();
        empty.close();
        assert_eq!(inserter.join().unwrap(), Err(ReplayError::Closed));
        assert_eq!(sampler.join().unwrap(), Err(Closed));
        assert_eq!(table.insert(&batch(0, 0..1)), Err(ReplayError::Closed));
    }
}
