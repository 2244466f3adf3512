//! The rate limiter: a plain synchronous type that says whether an insert or a sample may
//! proceed now. Waiting lives in the caller ([`crate::Table`]).
//!
//! Semantics follow Reverb's `RateLimiter(samples_per_insert, min_size_to_sample,
//! min_diff, max_diff)`: with `diff = inserts · samples_per_insert − samples`, sampling
//! needs `inserts ≥ min_size_to_sample` and keeps `diff ≥ min_diff`; inserting keeps
//! `diff ≤ max_diff`. Counting items, not calls, makes the replay ratio (and so learning)
//! independent of how many actors are connected and how fast the learner is.

/// Validated rate-limiter settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateLimiterConfig {
    /// Items sampled per item inserted (batch size × updates ÷ env transitions).
    pub samples_per_insert: f64,
    /// No sampling before this many items have been inserted.
    pub min_size_to_sample: u64,
    pub min_diff: f64,
    pub max_diff: f64,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RateLimiterError {
    #[error("samples_per_insert must be positive and finite, got {0}")]
    BadRatio(f64),
    #[error("tolerance band [{min_diff}, {max_diff}] is narrower than one insert plus one sampled batch ({needed}); inserts and samples could block each other forever")]
    NarrowBand {
        min_diff: f64,
        max_diff: f64,
        needed: f64,
    },
}

impl RateLimiterConfig {
    /// Reverb's `SampleToInsertRatio`: a band of ±`error_buffer` around the ratio, offset
    /// so that it is centred once `min_size_to_sample` items exist.
    /// `sample_batch` is the number of items one sample call takes (see [`Self::validated`]).
    pub fn sample_to_insert_ratio(
        samples_per_insert: f64,
        min_size_to_sample: u64,
        error_buffer: f64,
        sample_batch: u64,
    ) -> Result<Self, RateLimiterError> {
        let offset = samples_per_insert * min_size_to_sample as f64;
        Self {
            samples_per_insert,
            min_size_to_sample,
            min_diff: offset - error_buffer,
            max_diff: offset + error_buffer,
        }
        .validated(sample_batch)
    }

    /// Rejects settings under which inserts and samples could block each other forever.
    ///
    /// Inserts block once `diff > max_diff − spi`; a sample of `sample_batch` items blocks
    /// once `diff < min_diff + sample_batch`. Both hold at once, a deadlock, exactly when
    /// the band is narrower than `spi + sample_batch`.
    pub fn validated(self, sample_batch: u64) -> Result<Self, RateLimiterError> {
        let spi = self.samples_per_insert;
        if !(spi.is_finite() && spi > 0.0) {
            return Err(RateLimiterError::BadRatio(spi));
        }
        let needed = spi + sample_batch as f64;
        if self.max_diff - self.min_diff < needed {
            return Err(RateLimiterError::NarrowBand {
                min_diff: self.min_diff,
                max_diff: self.max_diff,
                needed,
            });
        }
        Ok(self)
    }
}

/// Counts inserts and samples and decides what may proceed.
///
/// An insert goes through three steps: [`RateLimiter::admit`] (under the caller's lock,
/// once [`RateLimiter::can_insert`] says so), the store (outside it), then
/// [`RateLimiter::stored`] (or [`RateLimiter::release`] if the store failed). Items
/// admitted but not yet stored are *pending*: `can_insert` counts them, so inserters
/// admitted together cannot each see the same room, and `can_sample` does not, so a
/// sampler never takes items that are not stored yet.
#[derive(Clone, Debug, PartialEq)]
pub struct RateLimiter {
    config: RateLimiterConfig,
    inserts: u64,
    samples: u64,
    /// Admitted, not yet stored (nor released).
    pending: u64,
}

impl RateLimiter {
    pub fn new(config: RateLimiterConfig) -> Self {
        Self::with_counts(config, 0, 0)
    }

    /// Restores counters (from a checkpoint).
    pub fn with_counts(config: RateLimiterConfig, inserts: u64, samples: u64) -> Self {
        Self {
            config,
            inserts,
            samples,
            pending: 0,
        }
    }

    pub fn config(&self) -> &RateLimiterConfig {
        &self.config
    }

    pub fn inserts(&self) -> u64 {
        self.inserts
    }

    pub fn samples(&self) -> u64 {
        self.samples
    }

    fn diff(&self, inserts: u64, samples: u64) -> f64 {
        inserts as f64 * self.config.samples_per_insert - samples as f64
    }

    /// Items admitted and not yet stored.
    pub fn pending(&self) -> u64 {
        self.pending
    }

    /// Whether an insert may be admitted now: while fewer than `min_size_to_sample`
    /// items are admitted (stored or pending), always (as in Reverb); after that, when
    /// the band, counting the pending items, has room for one more item. A batch of `n`
    /// admitted on that room may carry the counters up to `(n − 1) · samples_per_insert`
    /// past `max_diff`; nothing else is admitted until samples bring them back, so any
    /// number of inserters admitted in turn overshoot the band by at most one batch in
    /// all. (Waiting for room for the whole batch could wait forever for a batch larger
    /// than the band.)
    pub fn can_insert(&self) -> bool {
        let admitted = self.inserts + self.pending;
        admitted < self.config.min_size_to_sample
            || self.diff(admitted + 1, self.samples) <= self.config.max_diff
    }

    /// Whether `n` items may be sampled now (pending items are not counted: they are
    /// not stored yet).
    pub fn can_sample(&self, n: u64) -> bool {
        self.inserts >= self.config.min_size_to_sample
            && self.diff(self.inserts, self.samples + n) >= self.config.min_diff
    }

    /// Reserves room for `n` items about to be stored.
    pub fn admit(&mut self, n: u64) {
        self.pending += n;
    }

    /// `n` admitted items were stored: they count as inserted.
    pub fn stored(&mut self, n: u64) {
        self.pending -= n.min(self.pending);
        self.inserts += n;
    }

    /// `n` admitted items were not stored after all (the store failed).
    pub fn release(&mut self, n: u64) {
        self.pending -= n.min(self.pending);
    }

    /// Counts `n` items inserted without admission (a caller that keeps the ratio
    /// itself, or a restore).
    pub fn insert(&mut self, n: u64) {
        self.inserts += n;
    }

    pub fn sample(&mut self, n: u64) {
        self.samples += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(spi: f64, min_size: u64, buffer: f64) -> RateLimiter {
        RateLimiter::new(
            RateLimiterConfig::sample_to_insert_ratio(spi, min_size, buffer, 1).unwrap(),
        )
    }

    #[test]
    fn blocks_samples_until_min_size_reached() {
        let mut rl = limiter(1.0, 10, 100.0);
        for _ in 0..9 {
            assert!(!rl.can_sample(1));
            rl.insert(1);
        }
        assert!(!rl.can_sample(1));
        rl.insert(1);
        assert!(rl.can_sample(1));
    }

    #[test]
    fn operations_within_the_band_are_not_blocked() {
        let mut rl = limiter(2.0, 1, 10.0);
        for _ in 0..100 {
            assert!(rl.can_insert());
            rl.insert(1);
            for _ in 0..2 {
                assert!(rl.can_sample(1));
                rl.sample(1);
            }
        }
        assert_eq!((rl.inserts(), rl.samples()), (100, 200));
    }

    #[test]
    fn blocks_inserts_beyond_the_band_until_samples_catch_up() {
        // spi 4, band ±8 around 4·1: diff may reach 12.
        let mut rl = limiter(4.0, 1, 8.0);
        rl.insert(1); // diff 4
        rl.insert(1); // diff 8
        rl.insert(1); // diff 12
        assert!(!rl.can_insert(), "diff would be 16 > 12");
        rl.sample(4);
        assert!(rl.can_insert());
    }

    #[test]
    fn blocks_samples_beyond_the_band_until_inserts_catch_up() {
        let mut rl = limiter(1.0, 5, 3.0); // min_diff 2
        rl.insert(5); // diff 5
        assert!(rl.can_sample(3));
        rl.sample(3); // diff 2
        assert!(!rl.can_sample(1), "diff would be 1 < 2");
        rl.insert(1);
        assert!(rl.can_sample(1));
    }

    #[test]
    fn rejects_configurations_that_would_deadlock() {
        // Band ±20 is 40 wide; one insert (8) plus a batch of 64 needs 72.
        assert_eq!(
            RateLimiterConfig::sample_to_insert_ratio(8.0, 100, 20.0, 64),
            Err(RateLimiterError::NarrowBand {
                min_diff: 780.0,
                max_diff: 820.0,
                needed: 72.0
            })
        );
        assert!(RateLimiterConfig::sample_to_insert_ratio(8.0, 100, 36.0, 64).is_ok());
        assert!(matches!(
            RateLimiterConfig::sample_to_insert_ratio(0.0, 100, 2.0, 1),
            Err(RateLimiterError::BadRatio(_))
        ));
    }

    #[test]
    fn a_band_that_passes_validation_never_deadlocks() {
        // Drive the limiter adversarially: always insert while allowed, then sample while
        // allowed; at every point one side must be able to proceed.
        for (spi, buffer, batch) in [(8.0, 36.0, 64), (0.25, 40.0, 32), (1.0, 33.0, 32)] {
            let cfg = RateLimiterConfig::sample_to_insert_ratio(spi, 50, buffer, batch).unwrap();
            let mut rl = RateLimiter::new(cfg);
            for _ in 0..10_000 {
                let (ins, smp) = (rl.can_insert(), rl.can_sample(batch));
                assert!(ins || smp, "deadlock at {rl:?}");
                if ins {
                    rl.admit(4);
                    rl.stored(4);
                } else {
                    rl.sample(batch);
                }
            }
        }
    }

    #[test]
    fn inserters_admitted_together_overshoot_the_band_by_one_batch_at_most() {
        // spi 4, band ±2,048 around 4·1: inserts stop once diff would pass 2,052.
        let cfg = RateLimiterConfig::sample_to_insert_ratio(4.0, 1, 2048.0, 32).unwrap();
        let mut rl = RateLimiter::new(cfg);
        rl.admit(500);
        rl.stored(500); // diff 2,000: room for 13 more items
                        // Eight actors with 512-transition batches reach the gate before any of them
                        // has stored its batch (what a sample that frees room wakes).
        let admitted = (0..8)
            .filter(|_| {
                let go = rl.can_insert();
                if go {
                    rl.admit(512);
                }
                go
            })
            .count();
        assert_eq!(admitted, 1, "one batch fits the room; the rest wait");
        rl.stored(512);
        let diff = rl.inserts() as f64 * 4.0 - rl.samples() as f64;
        assert!(
            diff <= cfg.max_diff + 511.0 * 4.0,
            "overshoot of one batch at most"
        );
        assert!(!rl.can_insert());
        // Samples bring the counters back under the band before the next batch.
        rl.sample(1_900);
        assert!(!rl.can_insert());
        rl.sample(148);
        assert!(rl.can_insert());
    }

    #[test]
    fn pending_items_are_not_sampled_and_a_failed_store_gives_its_room_back() {
        let cfg = RateLimiterConfig::sample_to_insert_ratio(1.0, 10, 40.0, 8).unwrap();
        let mut rl = RateLimiter::new(cfg);
        // Band [−30, 50]: 50 admitted fill it.
        rl.admit(50);
        assert!(!rl.can_sample(1), "admitted, not stored: nothing to sample");
        assert!(!rl.can_insert(), "the pending 50 fill the band");
        rl.release(50);
        assert_eq!((rl.inserts(), rl.pending()), (0, 0));
        assert!(rl.can_insert());
        rl.admit(40);
        rl.stored(40);
        assert!(rl.can_sample(8));
    }

    #[test]
    fn counters_survive_a_restore() {
        let cfg = RateLimiterConfig::sample_to_insert_ratio(1.0, 1, 4.0, 1).unwrap();
        let mut rl = RateLimiter::new(cfg);
        rl.insert(10);
        rl.sample(7);
        let restored = RateLimiter::with_counts(cfg, rl.inserts(), rl.samples());
        assert_eq!(restored, rl);
    }
}
