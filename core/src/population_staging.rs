//! The population's batch: `[K, …]` sets of host tensors that each agent's replay
//! samples straight into its own slice, so a stacked update costs one fill per agent
//! and no copies or concatenation.
//!
//! On a GPU there are two sets, in pinned memory, used alternately: a set's batch is
//! copied to the device without blocking (queued behind the update before it), and
//! the set is refilled only once that copy is done (an event recorded after it), so the
//! host fills one set while the device still reads the other instead of waiting for
//! every stacked update. On the CPU one set is enough: the update reads it in place.

use millrace_proto::ObsSpec;
use millrace_replay::{Closed, ItemKey, SampleBuffers, Table};
use rand::rngs::SmallRng;
use tch::{Device, Kind, Tensor};

use crate::cuda::Marker;
use crate::dqn::Batch;
use crate::prefetch::{bytemuck_mut, bytes_mut, host_zeros, kind};

/// `[K, 2B, obs]`, `[K, B, 1]` ×4: agent k's rows are slice k of each.
#[derive(Debug)]
struct Set {
    obs2: Tensor,
    actions: Tensor,
    rewards: Tensor,
    discounts: Tensor,
    /// Prioritized replay's importance-sampling weights.
    weights: Tensor,
    /// On a GPU: recorded after this set's last copy was queued; `None` before the
    /// first (or where CUDA events are not available: then copies block).
    copied: Option<Marker>,
    /// Whether `copied` marks a copy that may still be running.
    in_flight: bool,
    /// The device its batches go to, where that is a GPU.
    gpu: Option<usize>,
}

impl Set {
    fn new(obs: &ObsSpec, agents: usize, batch: usize, pin_for: Option<Device>) -> Self {
        let (k, b) = (agents as i64, batch as i64);
        let mut obs_shape = vec![k, 2 * b];
        obs_shape.extend(obs.shape.iter().map(|d| *d as i64));
        let make = |shape: &[i64], kind: Kind| host_zeros(shape, kind, pin_for);
        let copied = match pin_for {
            Some(Device::Cuda(i)) => Marker::new(i)
                .map_err(|e| tracing::warn!("population staging: {e}; copies wait for the device"))
                .ok(),
            _ => None,
        };
        Self {
            obs2: make(&obs_shape, kind(obs.dtype)),
            actions: make(&[k, b, 1], Kind::Int64),
            rewards: make(&[k, b, 1], Kind::Float),
            discounts: make(&[k, b, 1], Kind::Float),
            weights: make(&[k, b, 1], Kind::Float),
            copied,
            in_flight: false,
            gpu: match pin_for {
                Some(Device::Cuda(i)) => Some(i),
                _ => None,
            },
        }
    }

    /// Waits until the device has read this set's last batch (at once if it has).
    fn wait_for_copy(&mut self) {
        if !self.in_flight {
            return;
        }
        if let Some(m) = &self.copied {
            if let Err(e) = m.wait() {
                tracing::error!("population staging: {e}; waiting for the device instead");
                if let Some(i) = self.gpu {
                    tch::Cuda::synchronize(i as i64);
                }
            }
        }
        self.in_flight = false;
    }
}

/// The stacked batch's host side, one slice per agent.
///
/// Invariant behind the `unsafe` views: the tensors never leave this struct except as
/// [`PopulationStaging::take`]'s shallow clones on the CPU, which the update reads and
/// drops before the next fill (on the CPU the update is synchronous), or as device
/// copies elsewhere, which read a set only until its `copied` event, and the set is
/// not written before that event has passed.
#[derive(Debug)]
pub struct PopulationStaging {
    sets: Vec<Set>,
    /// The set being filled.
    current: usize,
    /// The items of each agent's slice, row after row (their priorities' keys).
    keys: Vec<ItemKey>,
    /// Whether the agents sample prioritized replay (the batch then carries weights).
    weighted: bool,
    /// Which agents' slices hold a batch not used yet.
    ready: Vec<bool>,
    batch: usize,
}

impl PopulationStaging {
    /// Host sets for `agents` agents' batches of `batch`, for updates on `device`: two
    /// pinned ones for a CUDA device, one otherwise.
    pub fn new(obs: &ObsSpec, agents: usize, batch: usize, device: Device) -> Self {
        let pin_for = matches!(device, Device::Cuda(_)).then_some(device);
        let sets = if pin_for.is_some() { 2 } else { 1 };
        Self {
            sets: (0..sets)
                .map(|_| Set::new(obs, agents, batch, pin_for))
                .collect(),
            current: 0,
            keys: vec![ItemKey::default(); agents * batch],
            weighted: false,
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
        let agents = self.ready.len();
        let set = &mut self.sets[self.current];
        // Not before the device has read this set's previous batch.
        set.wait_for_copy();
        // SAFETY: contiguous host tensors made in `new`, used only through this struct
        // (see the type's invariant: no copy reads this set any more), and `&mut self`
        // holds them.
        let (obs2, actions, rewards, discounts, weights) = unsafe {
            (
                bytes_mut(&mut set.obs2),
                bytes_mut(&mut set.actions),
                bytes_mut(&mut set.rewards),
                bytes_mut(&mut set.discounts),
                bytes_mut(&mut set.weights),
            )
        };
        let per_agent = obs2.len() / agents;
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
            weights: &mut bytemuck_mut::<f32>(weights)[rows],
        };
        self.ready[row] = table.try_sample(rng, &mut out)?.is_some();
        self.weighted = table.prioritized();
        Ok(self.ready[row])
    }

    pub fn all_ready(&self) -> bool {
        self.ready.iter().all(|r| *r)
    }

    /// The stacked batch on `device` (shallow on the CPU: read it before the next fill;
    /// queued without blocking from pinned memory on a GPU), and every slice free again,
    /// in the other set where there are two.
    pub fn take(&mut self, device: Device) -> Batch {
        self.ready.iter_mut().for_each(|r| *r = false);
        let set = &mut self.sets[self.current];
        let pinned = set.copied.is_some();
        let mv = |t: &Tensor| {
            if device == Device::Cpu {
                t.shallow_clone()
            } else {
                t.to_device_(device, t.kind(), pinned, false)
            }
        };
        let batch = Batch {
            obs2: mv(&set.obs2),
            actions: mv(&set.actions),
            rewards: mv(&set.rewards),
            discounts: mv(&set.discounts),
            weights: self.weighted.then(|| mv(&set.weights)),
        };
        if let Some(m) = &set.copied {
            match m.record() {
                Ok(()) => set.in_flight = true,
                Err(e) => {
                    tracing::error!("population staging: {e}; waiting for the device instead");
                    if let Device::Cuda(i) = device {
                        tch::Cuda::synchronize(i as i64);
                    }
                }
            }
        }
        self.current = (self.current + 1) % self.sets.len();
        batch
    }

    /// The items of the batch [`PopulationStaging::take`] returned last, row after row
    /// (`B` per agent).
    pub fn keys(&self) -> &[ItemKey] {
        &self.keys
    }

    /// Host sets in use (two on a GPU).
    #[cfg(test)]
    fn sets(&self) -> usize {
        self.sets.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use millrace_proto::DType;

    #[test]
    fn one_set_on_the_cpu_read_in_place() {
        let obs = ObsSpec {
            shape: vec![4],
            dtype: DType::F32,
        };
        let mut s = PopulationStaging::new(&obs, 3, 8, Device::Cpu);
        assert_eq!(s.sets(), 1);
        let b = s.take(Device::Cpu);
        assert_eq!(b.obs2.size(), [3, 16, 4]);
        // Shallow: the update reads the host tensors themselves.
        assert_eq!(b.obs2.data_ptr(), s.sets[0].obs2.data_ptr());
    }

    #[test]
    #[ignore = "needs a CUDA device: run with --ignored on a GPU host"]
    fn two_pinned_sets_alternate_on_a_gpu() {
        let obs = ObsSpec {
            shape: vec![4],
            dtype: DType::F32,
        };
        let gpu = Device::Cuda(0);
        let mut s = PopulationStaging::new(&obs, 3, 8, gpu);
        assert_eq!(s.sets(), 2);
        for set in &s.sets {
            assert!(set.obs2.is_pinned(gpu) && set.copied.is_some());
        }
        let first = s.take(gpu);
        assert_eq!((s.current, s.sets[0].in_flight), (1, true));
        let second = s.take(gpu);
        assert_eq!(s.current, 0);
        // Filling set 0 again waits for its copy first.
        s.sets[0].wait_for_copy();
        assert!(!s.sets[0].in_flight);
        assert_eq!(first.obs2.device(), gpu);
        assert_eq!(second.actions.size(), [3, 8, 1]);
    }
}
