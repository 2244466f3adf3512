//! The population's batch: one `[K, …]` set of host tensors that each agent's replay
//! samples straight into its own slice, so a stacked update costs one fill per agent
//! and no copies or concatenation.

use millrace_proto::ObsSpec;
use millrace_replay::{Closed, ItemKey, SampleBuffers, Table};
use rand::rngs::SmallRng;
use tch::{Device, Kind, Tensor};

use crate::dqn::Batch;
use crate::prefetch::{bytemuck_mut, bytes_mut, kind};

/// `[K, 2B, obs]`, `[K, B, 1]` ×3: agent k's rows are slice k of each.
///
/// Invariant behind the `unsafe` views: the tensors never leave this struct except as
/// [`PopulationStaging::take`]'s shallow clones, which the update reads and drops
/// before the next fill (on the CPU the update is synchronous; elsewhere `batch`
/// copies to the device).
#[derive(Debug)]
pub struct PopulationStaging {
    obs2: Tensor,
    actions: Tensor,
    rewards: Tensor,
    discounts: Tensor,
    keys: Vec<ItemKey>,
    /// Importance weights: always 1 (populations sample uniformly).
    weights: Vec<f32>,
    /// Which agents' slices hold a batch not used yet.
    ready: Vec<bool>,
    batch: usize,
}

impl PopulationStaging {
    pub fn new(obs: &ObsSpec, agents: usize, batch: usize) -> Self {
        let (k, b) = (agents as i64, batch as i64);
        let mut obs_shape = vec![k, 2 * b];
        obs_shape.extend(obs.shape.iter().map(|d| *d as i64));
        let zeros = |shape: &[i64], kind: Kind| Tensor::zeros(shape, (kind, Device::Cpu));
        Self {
            obs2: zeros(&obs_shape, kind(obs.dtype)),
            actions: zeros(&[k, b, 1], Kind::Int64),
            rewards: zeros(&[k, b, 1], Kind::Float),
            discounts: zeros(&[k, b, 1], Kind::Float),
            keys: vec![ItemKey::default(); agents * batch],
            weights: vec![1.0; agents * batch],
            ready: vec![false; agents],
            batch,
        }
    }

    /// Samples agent `row`'s batch from `table` into its slice unless it holds one
    /// already; whether it holds one now (the rate limiter may say not yet).
    pub fn fill(&mut self, row: usize, table: &Table, rng: &mut SmallRng) -> Result<bool, Closed> {
        if self.ready[row] {
            return Ok(true);
        }
        let b = self.batch;
        // SAFETY: contiguous host tensors made in `new`, used only through this struct
        // (see the type's invariant), and `&mut self` holds them.
        let (obs2, actions, rewards, discounts) = unsafe {
            (
                bytes_mut(&mut self.obs2),
                bytes_mut(&mut self.actions),
                bytes_mut(&mut self.rewards),
                bytes_mut(&mut self.discounts),
            )
        };
        let per_agent = obs2.len() / self.ready.len();
        let mine = &mut obs2[row * per_agent..(row + 1) * per_agent];
        let (obs, next_obs) = mine.split_at_mut(per_agent / 2);
        let rows = row * b..(row + 1) * b;
        let mut out = SampleBuffers {
            obs,
            next_obs,
            actions: &mut bytemuck_mut::<i64>(actions)[rows.clone()],
            rewards: &mut bytemuck_mut::<f32>(rewards)[rows.clone()],
            discounts: &mut bytemuck_mut::<f32>(discounts)[rows.clone()],
            keys: &mut self.keys[rows.clone()],
            weights: &mut self.weights[rows],
        };
        self.ready[row] = table.try_sample(rng, &mut out)?.is_some();
        Ok(self.ready[row])
    }

    pub fn all_ready(&self) -> bool {
        self.ready.iter().all(|r| *r)
    }

    /// The stacked batch on `device` (shallow on the CPU: read it before the next fill),
    /// and every slice free again.
    pub fn take(&mut self, device: Device) -> Batch {
        self.ready.iter_mut().for_each(|r| *r = false);
        let mv = |t: &Tensor| {
            if device == Device::Cpu {
                t.shallow_clone()
            } else {
                t.to_device(device)
            }
        };
        Batch {
            obs2: mv(&self.obs2),
            actions: mv(&self.actions),
            rewards: mv(&self.rewards),
            discounts: mv(&self.discounts),
            weights: None,
        }
    }
}
