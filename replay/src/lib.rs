//! Replay: a sharded, preallocated, columnar buffer of transitions, the selectors that
//! choose what to sample, and the rate limiter that keeps the replay ratio.
//!
//! Data stays in the tensor layout actors produced it in: inserting is a `memcpy` per
//! column and sampling gathers rows straight into the caller's (staging) buffers. Shards
//! have their own locks so that actors inserting into different shards never contend,
//! a sampler locks each shard once per batch, one shard at a time, and sampled items come
//! with stable [`ItemKey`]s for priority updates.

pub mod evictions;
pub mod key;
pub mod limiter;
pub mod scratch;
pub mod selector;
pub mod shard;
pub mod split;
pub mod sum_tree;
pub mod table;

pub use key::ItemKey;
pub use limiter::{RateLimiter, RateLimiterConfig, RateLimiterError};
pub use scratch::SampleScratch;
pub use selector::{Selector, Uniform};
pub use shard::{Cursor, OutOfMemory, SampleBuffers, Shard, TooLarge};
pub use sum_tree::Prioritized;
pub use table::{
    Closed, PriorityConfig, PriorityOutcome, PriorityUpdate, ReplayConfig, ReplayError,
    ReplayStats, Table, ACTOR_PRIORITY_HEADROOM,
};
