//! The replay table: shards, a selector per shard and one rate limiter, safe to share
//! between actor threads (inserting) and sampler threads.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use millrace_proto::batch::Overshoot;
use millrace_proto::{SpecError, TransitionBatch};
use rand::Rng;

use crate::key::ItemKey;
use crate::limiter::{RateLimiter, RateLimiterConfig};
use crate::selector::{Selector, Uniform};
use crate::shard::{Cursor, OutOfMemory, SampleBuffers, Shard, TooLarge};
use crate::sum_tree::Prioritized;

/// Replay settings, checked by whoever builds them.
#[derive(Clone, Debug)]
pub struct ReplayConfig {
    /// Items held in all shards together (each shard holds `capacity / shards`).
    pub capacity: usize,
    /// Independent locks; batch `seq` of actor `a` goes to shard `(a + seq) % shards`, so
    /// every actor's data spreads over all shards (full capacity with any actor count)
    /// while concurrent actors still tend to hit different locks.
    pub shards: usize,
    /// Bytes of one observation.
    pub obs_row_bytes: usize,
    /// Frames per observation: above 1, replay stores each frame of the stacked
    /// observations once (frame mode; batches must come in frame mode) and
    /// `obs_rows_per_item` counts frames.
    pub stack: usize,
    /// Observation rows allocated per item of capacity (≥ 1). A batch of T transitions
    /// from E environments with n-step returns holds about T + E·n rows (see
    /// [`TransitionBatch`]), so `1 + E·n/T` plus a little for truncated episodes; if
    /// the data needs more, the oldest items are evicted early instead.
    pub obs_rows_per_item: f64,
    pub limiter: RateLimiterConfig,
    /// Proportional prioritized sampling; `None` samples uniformly.
    pub priority: Option<PriorityConfig>,
}

/// Proportional prioritized replay (Schaul et al. 2016): item `i` is drawn with
/// probability `p_i^α / Σ p^α`; β (the importance-sampling exponent) is set on the
/// table as it anneals ([`Table::set_beta`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PriorityConfig {
    pub alpha: f64,
    /// β until the first [`Table::set_beta`].
    pub beta: f64,
}

/// A priority exponent α out of `0..=MAX_ALPHA` ([`PriorityConfig::checked_alpha`]).
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
#[error("must be between 0 and {max}, got {alpha}", max = PriorityConfig::MAX_ALPHA, alpha = .0)]
pub struct AlphaError(pub f64);

impl PriorityConfig {
    /// The largest α: past it, sampling all but ignores every item but the worst.
    pub const MAX_ALPHA: f64 = 4.0;

    /// `alpha`, if it is a usable exponent (0: uniform, 1: proportional). The command
    /// line and a sweep's per-agent values are both checked here.
    pub fn checked_alpha(alpha: f64) -> Result<f64, AlphaError> {
        if alpha.is_finite() && (0.0..=Self::MAX_ALPHA).contains(&alpha) {
            Ok(alpha)
        } else {
            Err(AlphaError(alpha))
        }
    }
}

impl ReplayConfig {
    /// Observation rows per item for batches of at least `batch_rows` transitions from
    /// `envs` environments with `n_step` returns: each batch carries at most `n_step`
    /// rows per environment over from the one before ([`Overshoot`]'s transitions),
    /// plus 5% for truncated episodes (which store their final observation as well).
    pub fn obs_rows_for(envs: usize, n_step: usize, batch_rows: usize) -> f64 {
        1.05 + Overshoot::of(envs, n_step).transitions as f64 / batch_rows.max(1) as f64
    }

    /// Frames per item in frame mode: one per step, plus a chain of `stack` at each
    /// episode's start and the frames later batches still link to after their own
    /// batch was evicted. Measured on Pong with 64 environments: 1.009 (BENCHMARKS.md).
    pub const FRAMES_PER_ITEM: f64 = 1.05;

    fn row_bytes(&self) -> usize {
        self.obs_row_bytes / self.stack.max(1)
    }

    fn shape(&self) -> (usize, usize, usize) {
        let shards = self.shards.clamp(1, usize::from(u16::MAX));
        let per_shard = self.capacity.div_ceil(shards).max(1);
        let obs_per_shard =
            (per_shard as f64 * self.obs_rows_per_item.max(1.0)).ceil() as usize + 1;
        (shards, per_shard, obs_per_shard)
    }

    /// Bytes the table allocates up front (all shards), to check against the machine's
    /// memory before allocating.
    pub fn bytes(&self) -> usize {
        let (shards, per_shard, obs_per_shard) = self.shape();
        Shard::bytes_for(
            per_shard,
            obs_per_shard,
            self.row_bytes(),
            self.stack.max(1),
        )
        .saturating_mul(shards)
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
    #[error("{0} (lower the replay capacity)")]
    OutOfMemory(#[from] OutOfMemory),
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
    /// Observation rows (frames, in frame mode) held for the stored items.
    pub obs_rows: usize,
    /// Frame mode: transitions dropped because a frame their stacks need was gone.
    pub dropped: u64,
    /// Total time inserters spent blocked by the rate limiter.
    pub insert_blocked_s: f64,
    /// Total time samplers spent blocked by the rate limiter.
    pub sample_blocked_s: f64,
    /// Prioritized replay: priorities applied by key, and those ignored because their
    /// item was overwritten since it was sampled.
    pub priority_updates: u64,
    pub stale_priority_updates: u64,
    /// Priorities that were negative or not finite (from actors or the learner):
    /// replaced by the running maximum, never stored.
    pub invalid_priorities: u64,
    /// Actors' priorities above [`ACTOR_PRIORITY_HEADROOM`] times the largest the
    /// learner has set: stored at that bound.
    pub clamped_priorities: u64,
    /// The largest priority seen so far: what items arriving without one get.
    pub max_priority: f64,
    /// Items evicted as poison (their TD errors showed them so: see
    /// [`Table::evict`]), since the start.
    pub evicted: u64,
    /// The most transitions admitted between two samples, since the start or the
    /// last [`Table::take_burst`]: how far inserts ran ahead of the learner at once.
    /// Since the start it includes the fill before `min_size_to_sample` (nothing is
    /// sampled then); a window's figure comes from `take_burst` at its start.
    pub burst: u64,
}

struct Gate {
    limiter: RateLimiter,
    closed: bool,
    /// Inserters and samplers blocked in `wait`: nobody to wake means no wake-up
    /// syscall.
    waiting_inserters: usize,
    waiting_samplers: usize,
    /// Transitions admitted since the last sample, and the most of them (see
    /// [`ReplayStats::burst`]).
    since_sample: u64,
    burst: u64,
}

impl Gate {
    /// Admits `n` items to be stored (pending until stored or released).
    fn admit(&mut self, n: u64) {
        self.limiter.admit(n);
        self.since_sample += n;
        self.burst = self.burst.max(self.since_sample);
    }

    fn sampled(&mut self, n: u64) {
        self.limiter.sample(n);
        self.since_sample = 0;
    }
}

/// An admitted insert on its way to storage; dropped only if the store panicked, when
/// it gives the room back.
struct Admission<'a> {
    table: &'a Table,
    charge: u64,
}

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        let mut g = self.table.gate();
        self.table.release(&mut g, self.charge);
    }
}

/// Which side of the gate a waiter is on: each has its own condition variable, and is
/// woken one at a time, each waiter that goes through waking the next if there is still
/// room (a chain), never all at once.
#[derive(Clone, Copy)]
enum Side {
    Insert,
    Sample,
}

impl Side {
    /// This side's count of blocked threads.
    fn count(self, g: &mut Gate) -> &mut usize {
        match self {
            Side::Insert => &mut g.waiting_inserters,
            Side::Sample => &mut g.waiting_samplers,
        }
    }
}

/// What a shard publishes for readers that do not take its lock: item count and
/// sampling weight (an `f64`'s bits), updated under the shard's lock after each change.
#[derive(Debug, Default)]
struct ShardGauge {
    len: AtomicUsize,
    total: AtomicU64,
    min_weight: AtomicU64,
}

impl ShardGauge {
    /// The weights first: a reader that sees the new length sees its weights too.
    fn set(&self, shard: &Shard) {
        self.total.store(shard.total().to_bits(), Ordering::Release);
        self.min_weight
            .store(shard.min_weight().to_bits(), Ordering::Release);
        self.len.store(shard.len(), Ordering::Release);
    }

    fn total(&self) -> f64 {
        f64::from_bits(self.total.load(Ordering::Acquire))
    }

    fn min_weight(&self) -> f64 {
        f64::from_bits(self.min_weight.load(Ordering::Acquire))
    }
}

/// An `f64` shared without a lock.
#[derive(Debug)]
struct AtomicF64(AtomicU64);

impl AtomicF64 {
    fn new(v: f64) -> Self {
        Self(AtomicU64::new(v.to_bits()))
    }

    fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }

    fn set(&self, v: f64) {
        self.0.store(v.to_bits(), Ordering::Relaxed);
    }

    /// Raises the value to `v` if `v` is larger.
    fn raise(&self, v: f64) {
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                (v > f64::from_bits(old)).then_some(v.to_bits())
            });
    }
}

/// A request to set sampled items' priorities (the learner's |TD errors|), by the keys
/// the items were sampled with; `priorities[i]` is `keys[i]`'s (pairs past the shorter
/// of the two are ignored).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PriorityUpdate {
    pub keys: Vec<ItemKey>,
    pub priorities: Vec<f32>,
}

/// What [`Table::update_priorities`] did with a [`PriorityUpdate`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PriorityOutcome {
    /// Set on live items (invalid ones as the running maximum).
    pub applied: usize,
    /// Ignored: their items were overwritten since they were sampled.
    pub stale: usize,
    /// Negative or not finite.
    pub invalid: usize,
}

/// Sharded replay with rate-limited, blocking insert and sample.
///
/// Locking: `gate` (a std `Mutex` with a `Condvar` per side: waits are short and never
/// span an `.await`) guards only the limiter's counters; shard locks guard storage; no
/// path holds two locks at once. An insert is admitted under the gate (its items then
/// pending, which later inserters see), writes its shard outside it, and counts as
/// inserted afterwards, so anything the limiter lets a sampler take is already stored
/// and inserters admitted together overshoot the band by one batch at most (see
/// [`RateLimiter::can_insert`]). A sampler reserves its items under the lock that
/// checked the limiter, so samplers never overdraw the ratio, and then gathers from one
/// shard at a time, so inserts into the other shards go on meanwhile.
pub struct Table {
    shards: Vec<Mutex<Shard>>,
    gauges: Vec<ShardGauge>,
    row_bytes: usize,
    stack: usize,
    /// Items and observation rows per shard.
    per_shard: (usize, usize),
    gate: Mutex<Gate>,
    /// Where inserters wait for room in the band, and samplers for stored items.
    insertable: Condvar,
    sampleable: Condvar,
    insert_blocked_ns: AtomicU64,
    sample_blocked_ns: AtomicU64,
    /// Prioritized replay's settings; `None` for uniform.
    priority: Option<PriorityConfig>,
    beta: AtomicF64,
    max_priority: AtomicF64,
    /// The largest priority the learner has set (or a restored replay held): what
    /// bounds the actors' priorities.
    learner_max_priority: AtomicF64,
    priority_updates: AtomicU64,
    stale_priority_updates: AtomicU64,
    invalid_priorities: AtomicU64,
    clamped_priorities: AtomicU64,
    /// Items evicted as poison, by stream.
    evictions: Mutex<crate::evictions::Evictions>,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("shards", &self.shards.len())
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// The running maximum priority starts here (the priority of the first items inserted
/// without one). Uniform replay ignores priorities.
const INITIAL_MAX_PRIORITY: f64 = 1.0;

/// An actor's initial priority (its own n-step TD error) is stored at most this many
/// times the largest priority the learner has set (or [`INITIAL_MAX_PRIORITY`] before
/// its first update): an honest actor's estimate is of the learner's order, and one
/// peer's 3.4e38 would otherwise become replay's running maximum, the priority of every
/// new item, and shrink every other item's importance weight towards 0. Clamped
/// priorities are counted ([`ReplayStats::clamped_priorities`]).
pub const ACTOR_PRIORITY_HEADROOM: f64 = 10.0;

impl Table {
    /// Allocates every shard's storage up front; a capacity the allocator refuses is
    /// [`ReplayError::OutOfMemory`], not an abort.
    pub fn new(config: &ReplayConfig) -> Result<Self, ReplayError> {
        let (shards, per_shard, obs_per_shard) = config.shape();
        let built = (0..shards)
            .map(|i| {
                let selector: Box<dyn Selector> = match config.priority {
                    Some(p) => Box::new(Prioritized::new(per_shard, p.alpha)),
                    None => Box::new(Uniform::new(per_shard)),
                };
                Shard::new(
                    i as u16,
                    per_shard,
                    obs_per_shard,
                    config.row_bytes(),
                    config.stack.max(1),
                    selector,
                )
                .map(Mutex::new)
            })
            .collect::<Result<Vec<_>, _>>()?;
        // Each gauge starts from its empty shard: weight 0, smallest weight +∞ (a
        // default 0 would read as an item of weight 0 and zero every importance
        // weight until each shard had been written once).
        let gauges: Vec<ShardGauge> = built
            .iter()
            .map(|s| {
                let g = ShardGauge::default();
                g.set(&s.lock().unwrap_or_else(|e| e.into_inner()));
                g
            })
            .collect();
        Ok(Self {
            shards: built,
            gauges,
            row_bytes: config.obs_row_bytes,
            stack: config.stack.max(1),
            per_shard: (per_shard, obs_per_shard),
            gate: Mutex::new(Gate {
                limiter: RateLimiter::new(config.limiter),
                closed: false,
                waiting_inserters: 0,
                waiting_samplers: 0,
                since_sample: 0,
                burst: 0,
            }),
            insertable: Condvar::new(),
            sampleable: Condvar::new(),
            insert_blocked_ns: AtomicU64::new(0),
            sample_blocked_ns: AtomicU64::new(0),
            priority: config.priority,
            beta: AtomicF64::new(config.priority.map_or(0.0, |p| p.beta)),
            max_priority: AtomicF64::new(INITIAL_MAX_PRIORITY),
            learner_max_priority: AtomicF64::new(INITIAL_MAX_PRIORITY),
            priority_updates: AtomicU64::new(0),
            stale_priority_updates: AtomicU64::new(0),
            invalid_priorities: AtomicU64::new(0),
            clamped_priorities: AtomicU64::new(0),
            evictions: Mutex::default(),
        })
    }

    /// Whether sampling is prioritized.
    pub fn prioritized(&self) -> bool {
        self.priority.is_some()
    }

    /// Sets β, the importance-sampling exponent of the batches sampled from now on (0:
    /// no correction, 1: full); ignored by uniform replay. Values outside `[0, 1]` are
    /// clamped.
    pub fn set_beta(&self, beta: f64) {
        self.beta.set(if beta.is_nan() {
            1.0
        } else {
            beta.clamp(0.0, 1.0)
        });
    }

    pub fn beta(&self) -> f64 {
        self.beta.get()
    }

    /// Counts a batch's invalid priorities (the shard stores the running maximum in
    /// their place), bounds an actor's (`from_actor`) at [`ACTOR_PRIORITY_HEADROOM`]
    /// times the learner's largest, counting those it clamps, and raises the running
    /// maximum to the valid ones as stored. Returns the bound the shard applies. A
    /// restored replay's priorities (`!from_actor`) are stored as they were, unbounded,
    /// but they do not move the learner's maximum either: they include actors' clamped
    /// ones, and each resume would raise the bound tenfold; the learner's first
    /// updates set it again.
    fn screen_priorities(&self, batch: &TransitionBatch, from_actor: bool) -> f64 {
        let cap = if from_actor {
            ACTOR_PRIORITY_HEADROOM * self.learner_max_priority.get()
        } else {
            f64::INFINITY
        };
        if self.priority.is_none() || batch.priorities.is_empty() {
            return cap;
        }
        let (mut invalid, mut clamped) = (0, 0);
        let mut max = f64::NEG_INFINITY;
        for p in &batch.priorities {
            if p.is_finite() && *p >= 0.0 {
                let p = f64::from(*p);
                if p > cap {
                    clamped += 1;
                }
                max = max.max(p.min(cap));
            } else {
                invalid += 1;
            }
        }
        if invalid > 0 {
            self.invalid_priorities
                .fetch_add(invalid, Ordering::Relaxed);
        }
        if clamped > 0 {
            self.clamped_priorities
                .fetch_add(clamped, Ordering::Relaxed);
        }
        self.max_priority.raise(max);
        cap
    }

    fn gate(&self) -> MutexGuard<'_, Gate> {
        // A panic while holding the gate cannot leave the counters half-updated (each
        // update is one add), so a poisoned lock is still consistent.
        self.gate.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn shard(&self, i: usize) -> MutexGuard<'_, Shard> {
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Items stored, from the gauges (no shard lock).
    fn live(&self) -> usize {
        self.gauges
            .iter()
            .map(|g| g.len.load(Ordering::Acquire))
            .sum()
    }

    fn check(&self, batch: &TransitionBatch) -> Result<(), ReplayError> {
        batch.validate(self.row_bytes, self.stack)?;
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
        Ok(())
    }

    /// Stores a batch in one shard, its priorities bounded by `cap`; returns how many
    /// transitions it kept.
    fn store(&self, shard: usize, batch: &TransitionBatch, cap: f64) -> Result<usize, ReplayError> {
        let default = self.max_priority.get();
        let mut s = self.shard(shard);
        let kept = s.insert(batch, default, cap)?;
        self.gauges[shard].set(&s);
        Ok(kept)
    }

    /// Stores a batch, blocking while the rate limiter holds inserts back.
    pub fn insert(&self, batch: &TransitionBatch) -> Result<(), ReplayError> {
        self.check(batch)?;
        if Self::holds_nothing(batch) {
            return Ok(());
        }
        // Admitted (pending) under the gate, counted as inserted once stored.
        let charge = self.charge(batch);
        self.wait(
            Side::Insert,
            |g| g.limiter.can_insert(),
            |g| {
                g.admit(charge);
                g.limiter.can_insert()
            },
        )?;
        self.insert_admitted(batch, charge)
    }

    /// What the limiter counts for a batch: transitions sent (stored, or dropped for
    /// frames that were gone); a frame-mode batch is charged at least a transition per
    /// stack of frames, so frames alone cannot cycle replay unthrottled.
    fn charge(&self, batch: &TransitionBatch) -> u64 {
        let charge = if batch.frames.is_some() {
            batch.len().max(batch.obs_rows().div_ceil(self.stack))
        } else {
            batch.len()
        };
        charge as u64
    }

    /// A batch with nothing to store: no transitions, and no frames later batches may
    /// link to.
    fn holds_nothing(batch: &TransitionBatch) -> bool {
        batch.is_empty() && (batch.frames.is_none() || batch.obs_rows() == 0)
    }

    /// Whether the rate limiter lets an insert through now (what [`Table::insert`] waits
    /// for): for a caller that keeps the ratio itself and holds back its own producers.
    pub fn can_insert(&self) -> bool {
        self.gate().limiter.can_insert()
    }

    /// Stores a batch without waiting for the rate limiter (which still counts it): for
    /// a caller that keeps the ratio itself, as the lock-step mode does.
    pub fn insert_unlimited(&self, batch: &TransitionBatch) -> Result<(), ReplayError> {
        self.check(batch)?;
        if Self::holds_nothing(batch) {
            return Ok(());
        }
        let charge = self.charge(batch);
        {
            let mut g = self.gate();
            if g.closed {
                return Err(ReplayError::Closed);
            }
            g.admit(charge);
        }
        self.insert_admitted(batch, charge)
    }

    /// Stores a batch whose `charge` the limiter has admitted, then counts it as
    /// inserted (or gives its room back if the store failed) and wakes a sampler.
    fn insert_admitted(&self, batch: &TransitionBatch, charge: u64) -> Result<(), ReplayError> {
        // Gives the room back if the store panics (a bug), so inserters never wait on
        // items that will not come.
        let admission = Admission {
            table: self,
            charge,
        };
        let stored = self.store_batch(batch);
        std::mem::forget(admission);
        let mut g = self.gate();
        match stored {
            Ok(()) => {
                g.limiter.stored(charge);
                // All samplers: few (one per table in a run), and each waits for its own
                // batch size, so the one woken might not be the one that can go.
                if g.waiting_samplers > 0 {
                    self.sampleable.notify_all();
                }
            }
            Err(_) => self.release(&mut g, charge),
        }
        stored
    }

    /// Gives back the room of `charge` admitted items that were not stored.
    fn release(&self, g: &mut Gate, charge: u64) {
        g.limiter.release(charge);
        self.wake_inserter(g);
    }

    fn store_batch(&self, batch: &TransitionBatch) -> Result<(), ReplayError> {
        let cap = self.screen_priorities(batch, true);
        let shards = self.shards.len();
        if batch.frames.is_none() {
            let shard =
                (u64::from(batch.actor_id).wrapping_add(batch.seq) % shards as u64) as usize;
            self.store(shard, batch, cap)?;
        } else if shards == 1 {
            self.store(0, batch, cap)?;
        } else {
            // Each environment's frames stay in one shard, where its later frames link
            // to them; an actor's environments spread over all shards.
            for (shard, part) in crate::split::by_environment(batch, shards) {
                self.store(shard, &part, cap)?;
            }
        }
        Ok(())
    }

    /// Samples `out.rows()` items in proportion to their shards' weights (uniformly
    /// over everything stored, for uniform selectors), gathering them into `out`;
    /// blocks while the rate limiter holds samples back or nothing is stored. Returns
    /// the oldest parameter version among the sampled items.
    pub fn sample<R: Rng>(&self, rng: &mut R, out: &mut SampleBuffers<'_>) -> Result<u64, Closed> {
        let n = out.rows() as u64;
        // Reserve under the same lock that checked, so samplers never overdraw the ratio.
        // Wake inserters only once one of them can go.
        self.wait(
            Side::Sample,
            |g| g.limiter.can_sample(n) && self.live() > 0,
            |g| {
                g.sampled(n);
                g.limiter.can_sample(n)
            },
        )
        .map_err(|_| Closed)?;
        Ok(self.gather(rng, out))
    }

    /// Like [`Table::sample`], but returns `Ok(None)` at once instead of waiting when
    /// the rate limiter holds samples back or nothing is stored.
    pub fn try_sample<R: Rng>(
        &self,
        rng: &mut R,
        out: &mut SampleBuffers<'_>,
    ) -> Result<Option<u64>, Closed> {
        let n = out.rows() as u64;
        {
            let mut g = self.gate();
            if g.closed {
                return Err(Closed);
            }
            if !(g.limiter.can_sample(n) && self.live() > 0) {
                return Ok(None);
            }
            g.sampled(n);
            self.wake_inserter(&g);
        }
        Ok(Some(self.gather(rng, out)))
    }

    /// Draws every row's item first (from the shards' published weights), then gathers
    /// shard by shard, each under its own lock once. A shard's weight may change between
    /// the draw and its gather (an insert elsewhere in its ring); the draw is then
    /// clamped into its current weight, a bias of at most one batch's worth of items.
    ///
    /// Prioritized: the draws are stratified (row `i` draws from the `i`-th of `n`
    /// equal slices of the total weight, as Schaul et al. do) and each row gets its
    /// importance-sampling weight `(N·P(i))^-β / max_j (N·P(j))^-β = (w_min / w_i)^β`,
    /// `w_min` the smallest weight stored in any shard.
    fn gather<R: Rng>(&self, rng: &mut R, out: &mut SampleBuffers<'_>) -> u64 {
        let n = out.rows();
        let totals: Vec<f64> = self.gauges.iter().map(ShardGauge::total).collect();
        let sum: f64 = totals.iter().sum();
        let stratified = self.priority.is_some();
        let mut draws: Vec<(usize, f64)> = Vec::with_capacity(n);
        for i in 0..n {
            let x = if stratified {
                (i as f64 + rng.random::<f64>()) / n as f64
            } else {
                rng.random::<f64>()
            };
            let mut u = x * sum;
            let mut s = 0;
            while s + 1 < totals.len() && u >= totals[s] {
                u -= totals[s];
                s += 1;
            }
            // Rounding can carry a draw past the last shard with weight: step back.
            while totals[s] == 0.0 && s > 0 {
                s -= 1;
            }
            draws.push((s, u));
        }
        let beta = self.beta.get();
        let w_min = self
            .gauges
            .iter()
            .map(ShardGauge::min_weight)
            .fold(f64::INFINITY, f64::min);
        let mut oldest = u64::MAX;
        for s in 0..self.shards.len() {
            if !draws.iter().any(|(d, _)| *d == s) {
                continue;
            }
            let shard = self.shard(s);
            for (row, (_, u)) in draws.iter().enumerate().filter(|(_, (d, _))| *d == s) {
                // Shards never shrink to empty once they hold items, and the draw only
                // picks shards that held some: a gather always finds one.
                if let Some((version, w)) = shard.gather(*u, out, row) {
                    oldest = oldest.min(version);
                    out.weights[row] = if stratified {
                        // The gauges' minimum may lag an update by a moment: clamp.
                        (w_min / w).powf(beta).min(1.0) as f32
                    } else {
                        1.0
                    };
                }
            }
        }
        oldest
    }

    /// Sets the priorities of sampled items by key (the learner's |TD errors|); keys of
    /// items evicted since they were sampled are ignored. A priority that is negative
    /// or not finite is counted and replaced by the running maximum, so one NaN cannot
    /// poison a tree. Each shard is locked once.
    pub fn update_priorities(&self, update: &PriorityUpdate) -> PriorityOutcome {
        let (keys, priorities) = (&update.keys[..], &update.priorities[..]);
        let mut r = PriorityOutcome::default();
        let valid = |p: f32| p.is_finite() && p >= 0.0;
        let mut max = f64::NEG_INFINITY;
        for p in priorities.iter().take(keys.len()) {
            if valid(*p) {
                max = max.max(f64::from(*p));
            } else {
                r.invalid += 1;
            }
        }
        self.max_priority.raise(max);
        self.learner_max_priority.raise(max);
        let max = self.max_priority.get();
        for s in 0..self.shards.len() {
            let mine = keys
                .iter()
                .zip(priorities)
                .filter(|(k, _)| usize::from(k.shard()) == s);
            let mut it = mine.peekable();
            if it.peek().is_none() {
                continue;
            }
            let mut shard = self.shard(s);
            for (key, p) in it {
                let p = if valid(*p) { f64::from(*p) } else { max };
                if shard.update(*key, p) {
                    r.applied += 1;
                } else {
                    r.stale += 1;
                }
            }
            self.gauges[s].set(&shard);
        }
        self.priority_updates
            .fetch_add(r.applied as u64, Ordering::Relaxed);
        self.stale_priority_updates
            .fetch_add(r.stale as u64, Ordering::Relaxed);
        self.invalid_priorities
            .fetch_add(r.invalid as u64, Ordering::Relaxed);
        r
    }

    /// Wakes one blocked inserter if one could go now (a sample made room).
    fn wake_inserter(&self, g: &Gate) {
        if g.waiting_inserters > 0 && g.limiter.can_insert() {
            self.insertable.notify_one();
        }
    }

    /// Blocks on `side`'s condition until `ready` holds or the table closes, then runs
    /// `then` under the same lock; if `then` says there is room for another of its side,
    /// wakes the next one (the chain). A sampler that went through wakes an inserter if
    /// its sample made room. Adds the time waited to the side's blocked time.
    fn wait(
        &self,
        side: Side,
        ready: impl Fn(&Gate) -> bool,
        then: impl FnOnce(&mut Gate) -> bool,
    ) -> Result<(), ReplayError> {
        let (cond, blocked) = match side {
            Side::Insert => (&self.insertable, &self.insert_blocked_ns),
            Side::Sample => (&self.sampleable, &self.sample_blocked_ns),
        };
        let mut gate = self.gate();
        if gate.closed {
            return Err(ReplayError::Closed);
        }
        if !ready(&gate) {
            let start = Instant::now();
            *side.count(&mut gate) += 1;
            while !gate.closed && !ready(&gate) {
                gate = cond.wait(gate).unwrap_or_else(|e| e.into_inner());
            }
            *side.count(&mut gate) -= 1;
            blocked.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
            if gate.closed {
                return Err(ReplayError::Closed);
            }
        }
        if then(&mut gate) && *side.count(&mut gate) > 0 {
            cond.notify_one();
        }
        if let Side::Sample = side {
            self.wake_inserter(&gate);
        }
        Ok(())
    }

    /// Every batch stored when it starts, with the shard it is in, oldest first per
    /// shard, and the limiter's counters: what [`Table::restore`] needs to rebuild this
    /// table. One batch is copied out per shard lock and handed to `each` after the
    /// lock is released, so inserts and samples go on throughout and slow consumers
    /// (disk) hold up nobody. A batch evicted before the copy reaches it is skipped;
    /// the counters, read last, may include a few batches the copy does not.
    pub fn snapshot(&self, mut each: impl FnMut(usize, TransitionBatch)) -> (u64, u64) {
        let ends: Vec<Cursor> = (0..self.shards.len())
            .map(|i| self.shard(i).end())
            .collect();
        for (i, end) in ends.into_iter().enumerate() {
            let mut from = Cursor::default();
            loop {
                let next = self.shard(i).batch_from(from, end);
                let Some((batch, after)) = next else {
                    break;
                };
                each(i, batch);
                from = after;
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
        self.check(batch)?;
        if Self::holds_nothing(batch) {
            return Ok(());
        }
        let cap = self.screen_priorities(batch, false);
        self.store(shard % self.shards.len(), batch, cap)?;
        // Under the gate, like every other wake-up: a sampler between its check and its
        // wait holds it, so it cannot miss this one.
        let _gate = self.gate();
        self.sampleable.notify_all();
        Ok(())
    }

    /// Sets the rate limiter's counters (a restored checkpoint's), so the replay ratio
    /// carries on where it was.
    pub fn restore_counters(&self, inserts: u64, samples: u64) {
        let mut g = self.gate();
        let (config, pending) = (*g.limiter.config(), g.limiter.pending());
        g.limiter = RateLimiter::with_counts(config, inserts, samples);
        // Inserts admitted before and still being stored stay pending.
        g.limiter.admit(pending);
        self.insertable.notify_all();
        self.sampleable.notify_all();
    }

    /// Wakes every blocked inserter and sampler with [`ReplayError::Closed`]; later calls
    /// fail at once. Stored data stays readable through `stats`.
    pub fn close(&self) {
        self.gate().closed = true;
        self.insertable.notify_all();
        self.sampleable.notify_all();
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

    /// Bytes of one observation.
    pub fn obs_row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// Frames per observation (1: whole observations are stored).
    pub fn stack(&self) -> usize {
        self.stack
    }

    pub fn stats(&self) -> ReplayStats {
        let (inserted, sampled, burst) = {
            let g = self.gate();
            (g.limiter.inserts(), g.limiter.samples(), g.burst)
        };
        ReplayStats {
            inserted,
            sampled,
            size: self.len(),
            obs_rows: (0..self.shards.len())
                .map(|i| self.shard(i).obs_len())
                .sum(),
            dropped: (0..self.shards.len())
                .map(|i| self.shard(i).dropped())
                .sum(),
            insert_blocked_s: self.insert_blocked_ns.load(Ordering::Relaxed) as f64 * 1e-9,
            sample_blocked_s: self.sample_blocked_ns.load(Ordering::Relaxed) as f64 * 1e-9,
            priority_updates: self.priority_updates.load(Ordering::Relaxed),
            stale_priority_updates: self.stale_priority_updates.load(Ordering::Relaxed),
            invalid_priorities: self.invalid_priorities.load(Ordering::Relaxed),
            clamped_priorities: self.clamped_priorities.load(Ordering::Relaxed),
            max_priority: self.max_priority.get(),
            evicted: self.evictions().total(),
            burst,
        }
    }

    /// [`ReplayStats::burst`] so far; counting starts again from nothing, as if a
    /// sample had just been taken (a benchmark's window).
    pub fn take_burst(&self) -> u64 {
        let mut g = self.gate();
        g.since_sample = 0;
        std::mem::take(&mut g.burst)
    }

    fn evictions(&self) -> std::sync::MutexGuard<'_, crate::evictions::Evictions> {
        self.evictions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Evicts the items `keys` name for good, as poison (see [`Shard::evict`]), each
    /// charged to the stream whose batch brought it; each shard locked once. Returns how
    /// many were evicted (the rest were gone already).
    pub fn evict(&self, keys: &[ItemKey]) -> usize {
        let mut evicted = 0;
        for s in 0..self.shards.len() {
            let mine: Vec<ItemKey> = keys
                .iter()
                .copied()
                .filter(|k| usize::from(k.shard()) == s)
                .collect();
            if mine.is_empty() {
                continue;
            }
            let streams: Vec<u32> = {
                let mut shard = self.shard(s);
                let streams = mine.iter().filter_map(|k| shard.evict(*k)).collect();
                self.gauges[s].set(&shard);
                streams
            };
            evicted += streams.len();
            let mut ledger = self.evictions();
            for stream in streams {
                ledger.charge(stream);
            }
        }
        evicted
    }

    /// Items of `stream` (an actor's batches' `actor_id`) evicted as poison so far.
    pub fn evicted_from(&self, stream: u32) -> u64 {
        self.evictions().of(stream)
    }

    /// Forgets `stream`'s evictions (its session ended): the total keeps them.
    pub fn forget_evicted(&self, stream: u32) {
        self.evictions().forget(stream);
    }

    /// Every stream with items evicted as poison, with its count, most first.
    pub fn evicted_by_stream(&self) -> Vec<(u32, u64)> {
        self.evictions().by_stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scratch::SampleScratch;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;
    use std::sync::Arc;
    use std::time::Duration;

    fn config(capacity: usize, shards: usize, spi: f64, min_size: u64) -> ReplayConfig {
        ReplayConfig {
            capacity,
            shards,
            obs_row_bytes: 4,
            stack: 1,
            obs_rows_per_item: 2.0,
            limiter: RateLimiterConfig::sample_to_insert_ratio(spi, min_size, 1e9, 64).unwrap(),
            priority: None,
        }
    }

    fn table(c: ReplayConfig) -> Table {
        Table::new(&c).unwrap()
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

    /// Sample destinations for `n` rows of one 4-byte observation.
    fn scratch(n: usize) -> SampleScratch {
        SampleScratch::new(n, 4)
    }

    /// Polls `cond` until it holds (or fails the test after 10 s).
    fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
        let start = Instant::now();
        while !cond() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "timed out: {what}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn waiting(table: &Table) -> usize {
        let g = table.gate();
        g.waiting_inserters + g.waiting_samplers
    }

    #[test]
    fn routes_batches_round_robin_from_each_actor() {
        let table = table(config(400, 4, 1.0, 1));
        let mut b = batch(5, 0..10);
        table.insert(&b).unwrap(); // (5 + 0) % 4 = 1
        b.seq = 1;
        table.insert(&b).unwrap(); // 2
        let mut c = batch(2, 0..3);
        c.seq = 4;
        table.insert(&c).unwrap(); // (2 + 4) % 4 = 2
        assert_eq!(table.shard_lens(), [0, 10, 13, 0]);
        // One actor alone still fills every shard, i.e. the whole capacity.
        let single = Table::new(&config(40, 4, 1.0, 1)).unwrap();
        for seq in 0..8 {
            let mut b = batch(0, 0..10);
            b.seq = seq;
            single.insert(&b).unwrap();
        }
        assert_eq!(single.shard_lens(), [10, 10, 10, 10]);
    }

    #[test]
    fn rejects_malformed_batches_and_stores_nothing() {
        let table = table(config(100, 2, 1.0, 1));
        let mut bad = batch(0, 0..4);
        bad.discounts.pop();
        assert!(matches!(table.insert(&bad), Err(ReplayError::Malformed(_))));
        assert_eq!(table.len(), 0);
    }

    #[test]
    fn a_replay_too_large_to_allocate_is_an_error() {
        let mut c = config(1 << 40, 1, 1.0, 1);
        c.obs_row_bytes = 1 << 20;
        assert!(c.bytes() >= 1 << 60);
        assert!(matches!(Table::new(&c), Err(ReplayError::OutOfMemory(_))));
    }

    #[test]
    fn samples_uniformly_across_shards_of_different_sizes() {
        let table = table(config(4000, 4, 1e6, 1));
        // Shards hold 100, 200, 300 and 400 items; uniform means per item, not per shard.
        let mut next = 0;
        for (actor, size) in [(0, 100), (1, 200), (2, 300), (3, 400)] {
            table.insert(&batch(actor, next..next + size)).unwrap();
            next += size;
        }
        let mut rng = SmallRng::seed_from_u64(0);
        let mut counts = vec![0u32; 1000];
        let mut out = scratch(500);
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
        // Rows come back whole: reward, observation and key belong to the same item.
        for (i, a) in out.actions.iter().enumerate() {
            assert_eq!(out.rewards[i], *a as f32);
            assert_eq!(
                f32::from_ne_bytes(out.obs[i * 4..i * 4 + 4].try_into().unwrap()),
                *a as f32
            );
        }
        let shard_of = |a: i64| match a {
            0..100 => 0,
            100..300 => 1,
            300..600 => 2,
            _ => 3,
        };
        for (k, a) in out.keys.iter().zip(&out.actions) {
            assert_eq!(usize::from(k.shard()), shard_of(*a), "key of item {a}");
        }
    }

    #[test]
    fn seeded_sampling_is_reproducible() {
        let table = table(config(1000, 3, 1e6, 1));
        for actor in 0..3 {
            table.insert(&batch(actor, 0..50)).unwrap();
        }
        let draw = |seed| {
            let mut out = scratch(64);
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
        let table = Arc::new(table(config(1000, 2, 1e6, 100)));
        let sampler = {
            let table = Arc::clone(&table);
            std::thread::spawn(move || {
                let mut out = scratch(8);
                table.sample(&mut SmallRng::seed_from_u64(0), &mut out.buffers())
            })
        };
        table.insert(&batch(0, 0..50)).unwrap();
        // The sampler is parked in the limiter (50 < min size 100), not finished.
        wait_until("the sampler waits", || waiting(&table) == 1);
        assert!(!sampler.is_finished(), "50 < min size 100");
        table.insert(&batch(1, 0..50)).unwrap();
        assert!(sampler.join().unwrap().is_ok());
        assert!(table.stats().sample_blocked_s > 0.0);
    }

    #[test]
    fn sampling_never_returns_rows_that_are_not_stored() {
        // Counters restored from a checkpoint whose replay did not come back: the
        // limiter would allow samples, but there is nothing live to give.
        let table = Arc::new(table(config(1000, 2, 1.0, 10)));
        table.restore_counters(5000, 100);
        let mut out = scratch(4);
        out.actions.fill(-1);
        let mut rng = SmallRng::seed_from_u64(0);
        assert_eq!(table.try_sample(&mut rng, &mut out.buffers()), Ok(None));
        assert_eq!(out.actions, [-1; 4], "nothing written");
        let sampler = {
            let table = Arc::clone(&table);
            std::thread::spawn(move || {
                let mut out = scratch(4);
                table
                    .sample(&mut SmallRng::seed_from_u64(1), &mut out.buffers())
                    .map(|_| out.actions)
            })
        };
        wait_until("the sampler waits for data", || waiting(&table) == 1);
        // One batch restored into shard 1 only: every row comes from it.
        table.restore(1, &batch(0, 40..43)).unwrap();
        let got = sampler.join().unwrap().unwrap();
        assert!(got.iter().all(|a| (40..43).contains(a)), "{got:?}");
    }

    #[test]
    fn try_sample_follows_the_limiter_without_waiting() {
        // 1 sample per insert, nothing before 8 inserts.
        let table = table(ReplayConfig {
            limiter: RateLimiterConfig::sample_to_insert_ratio(1.0, 8, 100.0, 4).unwrap(),
            ..config(100, 1, 1.0, 8)
        });
        let mut rng = SmallRng::seed_from_u64(0);
        let mut out = scratch(4);
        table.insert_unlimited(&batch(0, 0..4)).unwrap();
        assert_eq!(table.try_sample(&mut rng, &mut out.buffers()), Ok(None));
        table.insert_unlimited(&batch(0, 4..8)).unwrap();
        assert!(table
            .try_sample(&mut rng, &mut out.buffers())
            .unwrap()
            .is_some());
        table.close();
        assert_eq!(table.try_sample(&mut rng, &mut out.buffers()), Err(Closed));
        assert_eq!(
            table.insert_unlimited(&batch(0, 0..1)),
            Err(ReplayError::Closed)
        );
    }

    #[test]
    fn priority_updates_reach_live_items_only() {
        let table = table(config(8, 1, 1e6, 1));
        table.insert(&batch(0, 0..4)).unwrap();
        let mut out = scratch(4);
        table
            .sample(&mut SmallRng::seed_from_u64(0), &mut out.buffers())
            .unwrap();
        let keys = out.keys.clone();
        assert_eq!(
            table
                .update_priorities(&PriorityUpdate {
                    keys: keys.to_vec(),
                    priorities: vec![2.0; 4],
                })
                .applied,
            4
        );
        // Two more batches of 4 evict the first: its keys are stale now.
        let mut b = batch(0, 4..8);
        b.seq = 1;
        table.insert(&b).unwrap();
        b.seq = 2;
        table.insert(&b).unwrap();
        assert_eq!(
            table.update_priorities(&PriorityUpdate {
                keys: keys.to_vec(),
                priorities: vec![2.0; 4],
            }),
            PriorityOutcome {
                applied: 0,
                stale: 4,
                invalid: 0
            }
        );
    }

    #[test]
    fn a_blocked_inserter_proceeds_once_samples_make_room() {
        // spi 1, min size 10, band ±70: inserts block once 80 items are ahead.
        let table = Arc::new(table(ReplayConfig {
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
        wait_until("the inserter blocks", || waiting(&table) == 1);
        assert!(done.try_recv().is_err(), "beyond the band");
        // One sample of 8 brings the difference back into the band: the sampler must
        // wake the inserter (it is only woken when it can go).
        let mut out = scratch(8);
        table
            .sample(&mut SmallRng::seed_from_u64(0), &mut out.buffers())
            .unwrap();
        let woken = done.recv_timeout(Duration::from_secs(5));
        assert_eq!(woken, Ok(Ok(())), "the sample woke the inserter");
        assert_eq!(table.stats().inserted, 85);
        assert!(table.stats().insert_blocked_s > 0.0);
    }

    #[test]
    fn inserters_released_together_overshoot_the_band_by_one_batch_in_all() {
        const INSERTERS: usize = 16;
        const BATCH: i64 = 1024;
        // spi 1, min size 1, band ±4,096: inserts stop once diff would pass 4,097.
        let table = Arc::new(table(ReplayConfig {
            limiter: RateLimiterConfig::sample_to_insert_ratio(1.0, 1, 4096.0, 64).unwrap(),
            ..config(1 << 16, 4, 1.0, 1)
        }));
        table.insert(&batch(99, 0..4096)).unwrap(); // room for one more item
                                                    // The waiters are released (closed) however the test ends.
        struct CloseOnDrop(Arc<Table>);
        impl Drop for CloseOnDrop {
            fn drop(&mut self) {
                self.0.close();
            }
        }
        let close_on_drop = CloseOnDrop(Arc::clone(&table));
        let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let start = Arc::new(std::sync::Barrier::new(INSERTERS));
        let inserters: Vec<_> = (0..INSERTERS)
            .map(|i| {
                let (table, done, start) =
                    (Arc::clone(&table), Arc::clone(&done), Arc::clone(&start));
                std::thread::spawn(move || {
                    start.wait();
                    let r = table.insert(&batch(i as u32, 0..BATCH));
                    if r.is_ok() {
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                    r
                })
            })
            .collect();
        // Settled: every inserter has either stored its batch or waits, nothing pending.
        let settled = || {
            let g = table.gate();
            g.limiter.pending() == 0
                && g.waiting_inserters + done.load(Ordering::SeqCst) == INSERTERS
        };
        wait_until("the released inserters settle", settled);
        let inserted = table.stats().inserted;
        assert_eq!(
            (done.load(Ordering::SeqCst), inserted),
            (1, 4096 + BATCH as u64),
            "one batch went through the room for one item, the others wait"
        );
        // A sample of 1,024 makes room for one item again: one more batch goes (the
        // pending count lets the first inserter through take the room, whichever it
        // is), the rest wait.
        let mut out = scratch(BATCH as usize);
        table
            .sample(&mut SmallRng::seed_from_u64(0), &mut out.buffers())
            .unwrap();
        wait_until("the woken inserter settles", || {
            settled() && done.load(Ordering::SeqCst) >= 2
        });
        assert_eq!(done.load(Ordering::SeqCst), 2, "one inserter woken");
        assert_eq!(table.stats().inserted, 4096 + 2 * BATCH as u64);
        drop(close_on_drop);
        let results: Vec<_> = inserters.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 2);
        assert!(results
            .iter()
            .all(|r| matches!(r, Ok(()) | Err(ReplayError::Closed))));
    }

    #[test]
    fn close_unblocks_waiting_samplers_and_inserters() {
        let table = Arc::new(table(ReplayConfig {
            limiter: RateLimiterConfig::sample_to_insert_ratio(1.0, 10, 70.0, 64).unwrap(),
            ..config(1000, 1, 1.0, 10)
        }));
        // Fill until inserts block (diff may reach 10 + 70).
        table.insert(&batch(0, 0..80)).unwrap();
        let inserter = {
            let table = Arc::clone(&table);
            std::thread::spawn(move || table.insert(&batch(0, 0..1)))
        };
        let empty = Arc::new(Table::new(&config(10, 1, 1.0, 5)).unwrap());
        let sampler = {
            let empty = Arc::clone(&empty);
            std::thread::spawn(move || {
                let mut out = scratch(1);
                empty.sample(&mut SmallRng::seed_from_u64(0), &mut out.buffers())
            })
        };
        wait_until("both wait", || waiting(&table) == 1 && waiting(&empty) == 1);
        table.close();
        empty.close();
        assert_eq!(inserter.join().unwrap(), Err(ReplayError::Closed));
        assert_eq!(sampler.join().unwrap(), Err(Closed));
        assert_eq!(table.insert(&batch(0, 0..1)), Err(ReplayError::Closed));
    }

    #[test]
    fn a_snapshot_goes_batch_by_batch_while_inserts_continue() {
        let table = table(config(100, 2, 1e6, 1));
        for seq in 0..6 {
            let mut b = batch(0, seq * 10..seq * 10 + 5);
            b.seq = seq as u64;
            table.insert(&b).unwrap();
        }
        let mut seen = Vec::new();
        let mut inserted = 0;
        table.snapshot(|shard, b| {
            // Each batch is handed over with no lock held: inserting here must not
            // deadlock, and what it inserts is not part of this snapshot.
            let mut extra = batch(1, 1000..1002);
            extra.seq = inserted;
            inserted += 1;
            table.insert(&extra).unwrap();
            seen.push((shard, b.actions[0]));
        });
        seen.sort_unstable();
        assert_eq!(seen, [(0, 0), (0, 20), (0, 40), (1, 10), (1, 30), (1, 50)]);
        assert_eq!(table.len(), 30 + 12);
    }

    #[test]
    fn frames_without_transitions_are_stored_and_charged() {
        use millrace_proto::{FrameLinks, NO_FRAME};
        let t = table(ReplayConfig {
            obs_row_bytes: 2,
            stack: 2,
            ..config(16, 1, 1.0, 1)
        });
        let mut frames_only = TransitionBatch {
            actor_id: 3,
            obs_row_bytes: 1,
            frames: Some(Box::new(FrameLinks::new(2))),
            ..TransitionBatch::default()
        };
        for (value, number, prev) in [(7u8, 0u64, NO_FRAME), (8, 1, 0), (9, 2, 1), (10, 3, 2)] {
            frames_only.push_obs_bytes(&[value]);
            let l = frames_only.frames.as_mut().unwrap();
            l.number.push(number);
            l.env.push(0);
            l.prev.push(prev);
        }
        t.insert(&frames_only).unwrap();
        assert_eq!(t.stats().inserted, 2, "four frames charged as two stacks");
        // A later batch links to them.
        let mut links = FrameLinks::new(2);
        links.item_env.push(0);
        links.obs.push(1);
        links.next.push(3);
        let b = TransitionBatch {
            actor_id: 3,
            obs_row_bytes: 1,
            actions: vec![1],
            rewards: vec![0.5],
            discounts: vec![0.9],
            frames: Some(Box::new(links)),
            ..TransitionBatch::default()
        };
        t.insert(&b).unwrap();
        let stats = t.stats();
        assert_eq!((stats.size, stats.dropped), (1, 0));
        let mut out = scratch(1);
        out.obs = vec![0; 2];
        out.next_obs = vec![0; 2];
        t.try_sample(&mut SmallRng::seed_from_u64(0), &mut out.buffers())
            .unwrap()
            .unwrap();
        assert_eq!(
            (out.obs.as_slice(), out.next_obs.as_slice()),
            (&[7u8, 8][..], &[9u8, 10][..])
        );
    }
    fn prioritized(capacity: usize, shards: usize, alpha: f64, beta: f64) -> Table {
        table(ReplayConfig {
            priority: Some(PriorityConfig { alpha, beta }),
            // Neither inserts nor samples ever wait.
            ..config(capacity, shards, 1.0, 1)
        })
    }

    /// Items `values` (action = value) with priorities `priority(value)`.
    fn with_priorities(
        actor_id: u32,
        seq: u64,
        values: std::ops::Range<i64>,
        priority: impl Fn(i64) -> f32,
    ) -> TransitionBatch {
        let mut b = batch(actor_id, values.clone());
        b.seq = seq;
        b.priorities = values.map(priority).collect();
        b
    }

    /// Every live item's priority, by action, from a snapshot.
    fn priorities_by_action(t: &Table) -> Vec<(i64, f32)> {
        let mut all = Vec::new();
        t.snapshot(|_, b| all.extend(b.actions.iter().copied().zip(b.priorities.clone())));
        all.sort_by_key(|(a, _)| *a);
        all
    }

    #[test]
    fn prioritized_sampling_across_shards_matches_the_priorities() {
        // 3 shards of different sizes and priority mass; priorities over three orders
        // of magnitude. P(i) = p_i^α / Σ p^α over the whole table, whatever the shard.
        let alpha = 0.6;
        let t = prioritized(3000, 3, alpha, 0.4);
        // (Within the bound on actors' priorities, ten times the learner's initial 1.)
        let priority = |v: i64| 0.01 + (v % 17) as f32 * 0.1 + if v % 50 == 0 { 8.0 } else { 0.0 };
        let mut next = 0;
        for (actor, size) in [(0u32, 60), (1, 120), (2, 220)] {
            // Actor a's first batch goes to shard a.
            t.insert(&with_priorities(actor, 0, next..next + size, priority))
                .unwrap();
            next += size;
        }
        assert_eq!(t.shard_lens(), [60, 120, 220]);
        let weights: Vec<f64> = (0..next)
            .map(|v| f64::from(priority(v)).powf(alpha))
            .collect();
        let sum: f64 = weights.iter().sum();
        let w_min = weights.iter().copied().fold(f64::INFINITY, f64::min);
        let (batches, rows) = (800, 256);
        let draws = (batches * rows) as f64;
        let mut counts = vec![0u64; next as usize];
        let mut rng = SmallRng::seed_from_u64(3);
        let mut out = scratch(rows);
        for _ in 0..batches {
            t.sample(&mut rng, &mut out.buffers()).unwrap();
            for (a, w) in out.actions.iter().zip(&out.weights) {
                counts[*a as usize] += 1;
                // The importance weight against a direct computation.
                let direct = (w_min / weights[*a as usize]).powf(0.4);
                assert!(
                    (f64::from(*w) - direct).abs() < 1e-5,
                    "item {a}: {w} vs {direct}"
                );
            }
        }
        // 204,800 draws. Per item: within 5 binomial standard deviations (stratified
        // draws vary less than independent ones, never more); over all: chi-square with
        // 399 degrees of freedom (mean 399, sd 28) below 399 + 6 sd.
        let mut chi2 = 0.0;
        for (i, c) in counts.iter().enumerate() {
            let p = weights[i] / sum;
            let expected = draws * p;
            let sd = (draws * p * (1.0 - p)).sqrt();
            assert!(
                (*c as f64 - expected).abs() <= 5.0 * sd + 1.0,
                "item {i}: {c} draws, expected {expected:.1} ± {sd:.1}"
            );
            chi2 += (*c as f64 - expected).powi(2) / expected;
        }
        assert!(chi2 < 399.0 + 6.0 * 28.3, "chi2 {chi2}");
    }

    #[test]
    fn shards_never_written_leave_importance_weights_alone() {
        // Four shards, one holding everything (frame mode with few environments, or a
        // restore into more shards): the empty ones must not count as weight 0.
        let t = prioritized(400, 4, 0.6, 0.4);
        t.insert(&with_priorities(1, 0, 0..50, |v| 1.0 + (v % 2) as f32))
            .unwrap();
        assert_eq!(t.shard_lens(), [0, 50, 0, 0]);
        let mut out = scratch(32);
        t.sample(&mut SmallRng::seed_from_u64(2), &mut out.buffers())
            .unwrap();
        let low = (1.0f64 / 2.0f64.powf(0.6)).powf(0.4) as f32;
        for (a, w) in out.actions.iter().zip(&out.weights) {
            let want = if a % 2 == 0 { 1.0 } else { low };
            assert!(
                (w - want).abs() < 1e-6,
                "item {a}: weight {w}, expected {want}"
            );
        }
    }

    #[test]
    fn zero_priorities_sample_uniformly_with_finite_weights() {
        let t = prioritized(100, 2, 0.6, 1.0);
        t.insert(&with_priorities(0, 0, 0..40, |_| 0.0)).unwrap();
        t.insert(&with_priorities(0, 1, 40..80, |_| 1e-30)).unwrap();
        let mut counts = [0u32; 80];
        let mut out = scratch(80);
        let mut rng = SmallRng::seed_from_u64(0);
        for _ in 0..500 {
            t.sample(&mut rng, &mut out.buffers()).unwrap();
            for (a, w) in out.actions.iter().zip(&out.weights) {
                counts[*a as usize] += 1;
                assert_eq!(*w, 1.0, "all at the floor: equal weights");
            }
        }
        // 40,000 draws over 80 items, 500 each: stratified over equal weights, so
        // every item gets within a few of 500.
        assert!(counts.iter().all(|c| (450..=550).contains(c)), "{counts:?}");
    }

    #[test]
    fn an_actors_priority_is_bounded_by_the_learners_largest() {
        let t = prioritized(100, 1, 0.6, 0.4);
        // Before any update the learner's largest is the initial 1: the bound is 10.
        t.insert(&with_priorities(0, 0, 0..3, |v| {
            [3.4e38, 2.0, 50.0][v as usize]
        }))
        .unwrap();
        let stats = t.stats();
        assert_eq!(stats.clamped_priorities, 2);
        assert_eq!(stats.max_priority, ACTOR_PRIORITY_HEADROOM);
        let stored = priorities_by_action(&t);
        assert_eq!(stored, [(0, 10.0), (1, 2.0), (2, 10.0)]);
        // Poisoned batches one after another do not ratchet the bound up.
        for seq in 1..5 {
            t.insert(&with_priorities(
                0,
                seq,
                2 + seq as i64..3 + seq as i64,
                |_| f32::MAX,
            ))
            .unwrap();
        }
        assert_eq!(t.stats().max_priority, ACTOR_PRIORITY_HEADROOM);
        assert_eq!(t.stats().clamped_priorities, 6);
        // The learner's TD errors move the bound: 40 makes it 400.
        let mut out = scratch(4);
        t.sample(&mut SmallRng::seed_from_u64(0), &mut out.buffers())
            .unwrap();
        t.update_priorities(&PriorityUpdate {
            keys: out.keys.to_vec(),
            priorities: vec![40.0; 4],
        });
        t.insert(&with_priorities(0, 5, 7..8, |_| 3.4e38)).unwrap();
        assert_eq!(priorities_by_action(&t)[7], (7, 400.0));
        // An item without a priority gets the running maximum, not 3.4e38: a sampled
        // batch's importance weights stay of the order of the priorities' spread.
        let mut plain = batch(0, 8..9);
        plain.seq = 6;
        t.insert(&plain).unwrap();
        assert_eq!(priorities_by_action(&t)[8], (8, 400.0));
        let mut out = scratch(64);
        t.sample(&mut SmallRng::seed_from_u64(1), &mut out.buffers())
            .unwrap();
        let least = out.weights.iter().copied().fold(f32::INFINITY, f32::min);
        assert!(least > 0.05, "{:?}", out.weights);
        // A restored replay's priorities are kept as they were, and do not move the
        // bound (they hold actors' clamped ones: each resume would raise it tenfold).
        let restored = prioritized(100, 1, 0.6, 0.4);
        t.snapshot(|shard, b| restored.restore(shard, &b).unwrap());
        assert_eq!(priorities_by_action(&restored), priorities_by_action(&t));
        assert_eq!(restored.stats().clamped_priorities, 0);
        restored
            .insert(&with_priorities(0, 9, 9..10, |_| 3.4e38))
            .unwrap();
        assert_eq!(priorities_by_action(&restored)[9], (9, 10.0));
    }

    #[test]
    fn invalid_priorities_are_counted_and_never_stored() {
        let t = prioritized(100, 1, 0.6, 0.4);
        t.insert(&with_priorities(0, 0, 0..4, |v| {
            [2.0, f32::NAN, -1.0, 5.0][v as usize]
        }))
        .unwrap();
        t.insert(&with_priorities(0, 1, 4..6, |v| {
            [f32::INFINITY, 0.5][v as usize - 4]
        }))
        .unwrap();
        // Without priorities: the running maximum.
        let mut plain = batch(0, 6..7);
        plain.seq = 2;
        t.insert(&plain).unwrap();
        let stats = t.stats();
        assert_eq!((stats.invalid_priorities, stats.max_priority), (3, 5.0));
        let stored = priorities_by_action(&t);
        assert!(
            stored.iter().all(|(_, p)| p.is_finite() && *p >= 0.0),
            "{stored:?}"
        );
        assert_eq!(stored[0], (0, 2.0));
        assert_eq!(stored[3], (3, 5.0));
        assert_eq!(stored[5], (5, 0.5));
        assert_eq!(stored[6], (6, 5.0), "no priority: the running maximum");
        // The replaced ones have a valid priority (the maximum at the time).
        for i in [1, 2, 4] {
            assert!(stored[i].1 >= 2.0, "{:?}", stored[i]);
        }
        // From the learner: a NaN among valid TD errors.
        let mut out = scratch(7);
        t.sample(&mut SmallRng::seed_from_u64(0), &mut out.buffers())
            .unwrap();
        let td: Vec<f32> = (0..7)
            .map(|i| if i == 3 { f32::NAN } else { 0.25 })
            .collect();
        let r = t.update_priorities(&PriorityUpdate {
            keys: out.keys.to_vec(),
            priorities: td.to_vec(),
        });
        assert_eq!((r.applied, r.invalid), (7, 1));
        assert_eq!(t.stats().invalid_priorities, 4);
        assert!(priorities_by_action(&t).iter().all(|(_, p)| p.is_finite()));
        let mut rng = SmallRng::seed_from_u64(1);
        t.sample(&mut rng, &mut out.buffers()).unwrap();
        assert!(out
            .weights
            .iter()
            .all(|w| w.is_finite() && *w > 0.0 && *w <= 1.0));
    }

    #[test]
    fn stale_priority_updates_leave_the_distribution_alone() {
        let t = prioritized(8, 1, 1.0, 0.4);
        t.insert(&with_priorities(0, 0, 0..4, |_| 1.0)).unwrap();
        let mut out = scratch(4);
        t.sample(&mut SmallRng::seed_from_u64(0), &mut out.buffers())
            .unwrap();
        let old_keys = out.keys.clone();
        // Two more batches evict the first; the positions are reused.
        t.insert(&with_priorities(0, 1, 4..8, |_| 1.0)).unwrap();
        t.insert(&with_priorities(0, 2, 8..12, |_| 1.0)).unwrap();
        let before = priorities_by_action(&t);
        let r = t.update_priorities(&PriorityUpdate {
            keys: old_keys.to_vec(),
            priorities: vec![1000.0; 4],
        });
        assert_eq!((r.applied, r.stale), (0, 4));
        assert_eq!(priorities_by_action(&t), before, "nothing changed");
        assert_eq!(t.stats().stale_priority_updates, 4);
    }

    #[test]
    fn a_snapshot_restores_the_same_priorities_and_distribution() {
        let alpha = 0.6;
        let t = prioritized(600, 3, alpha, 0.5);
        for seq in 0..6u64 {
            let lo = seq as i64 * 50;
            t.insert(&with_priorities(0, seq, lo..lo + 50, |v| {
                0.1 + (v % 7) as f32
            }))
            .unwrap();
        }
        // Priorities changed by the learner after insertion are what must survive.
        let mut out = scratch(64);
        let mut rng = SmallRng::seed_from_u64(5);
        t.sample(&mut rng, &mut out.buffers()).unwrap();
        let td: Vec<f32> = out.actions.iter().map(|a| 10.0 + *a as f32).collect();
        assert!(
            t.update_priorities(&PriorityUpdate {
                keys: out.keys.to_vec(),
                priorities: td.to_vec(),
            })
            .applied
                > 0
        );
        let before = priorities_by_action(&t);
        // Into a table with another shard count.
        let restored = prioritized(600, 2, alpha, 0.5);
        let (inserts, samples) = t.snapshot(|shard, b| restored.restore(shard, &b).unwrap());
        restored.restore_counters(inserts, samples);
        assert_eq!(priorities_by_action(&restored), before);
        assert_eq!(restored.stats().max_priority, t.stats().max_priority);
        // The same distribution: total weight, and the draw frequencies of an item.
        let total = |t: &Table| t.gauges.iter().map(ShardGauge::total).sum::<f64>();
        assert!((total(&t) - total(&restored)).abs() < 1e-9 * total(&t));
        let frequency = |t: &Table, item: i64| {
            let mut rng = SmallRng::seed_from_u64(9);
            let mut out = scratch(300);
            let mut hits = 0;
            for _ in 0..200 {
                t.sample(&mut rng, &mut out.buffers()).unwrap();
                hits += out.actions.iter().filter(|a| **a == item).count();
            }
            hits as f64 / 60_000.0
        };
        let top = before.iter().max_by(|a, b| a.1.total_cmp(&b.1)).unwrap().0;
        let (f0, f1) = (frequency(&t, top), frequency(&restored, top));
        let sd = (f0 * (1.0 - f0) / 60_000.0).sqrt();
        assert!((f0 - f1).abs() < 6.0 * sd, "{f0} vs {f1}");
    }
}
