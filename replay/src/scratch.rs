//! Owned sample destinations, for callers outside the learner's staging tensors (tools,
//! benchmarks, tests).

use crate::key::ItemKey;
use crate::shard::SampleBuffers;

/// Buffers for `rows` sampled items of `obs_bytes` bytes per observation.
#[derive(Clone, Debug)]
pub struct SampleScratch {
    pub obs: Vec<u8>,
    pub next_obs: Vec<u8>,
    pub actions: Vec<i64>,
    pub rewards: Vec<f32>,
    pub discounts: Vec<f32>,
    pub keys: Vec<ItemKey>,
    pub weights: Vec<f32>,
}

impl SampleScratch {
    pub fn new(rows: usize, obs_bytes: usize) -> Self {
        Self {
            obs: vec![0; rows * obs_bytes],
            next_obs: vec![0; rows * obs_bytes],
            actions: vec![0; rows],
            rewards: vec![0.0; rows],
            discounts: vec![0.0; rows],
            keys: vec![ItemKey::default(); rows],
            weights: vec![0.0; rows],
        }
    }

    /// The buffers as [`crate::Table::sample`] takes them.
    pub fn buffers(&mut self) -> SampleBuffers<'_> {
        SampleBuffers {
            obs: &mut self.obs,
            next_obs: &mut self.next_obs,
            actions: &mut self.actions,
            rewards: &mut self.rewards,
            discounts: &mut self.discounts,
            keys: &mut self.keys,
            weights: &mut self.weights,
        }
    }
}
