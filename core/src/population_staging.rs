//! The population's batch: `[K, …]` sets of host tensors that each agent's replay
//! samples straight into its own slice, so a stacked update costs one fill per agent
//! and no copies or concatenation.
//!
//! On a GPU there are two sets, in pinned memory, used alternately: a set's batch is
//! copied to the device without blocking (queued behind the update before it), and
//! the set is refilled only once that copy is done (an event recorded after it), so the
//! host fills one set while the device still reads the other instead of waiting for
//! every stacked update. On the CPU one set is enough: the update reads it in place.
//!
//! With a side copy stream (`--copy-stream`) each set also has a device twin
//! ([`DeviceCopy`]) that its batch is copied into on that stream, so the copy of the
//! next batch overlaps the update reading this one instead of queueing behind it.

use millrace_proto::ObsSpec;
use millrace_replay::{Closed, ItemKey, SampleBuffers, Table};
use rand::rngs::SmallRng;
use tch::{Device, Kind, Tensor};

use std::sync::Arc;

use crate::cuda::{CopyStream, CopyStreamError, Marker};
use crate::device_copy::{DeviceCopy, HostTensors};
use crate::dqn::Batch;
use crate::prefetch::{bytemuck_mut, bytes_mut, host_zeros, kind};

/// `[K, 2B, obs]`, `[K, B, 1]` ×4: agent k's rows are slice k of each.
#[derive(Debug)]
struct Set {
    /// With a side copy stream: the device buffers this set's batches are copied into.
    /// First, so that it is dropped first: its drop waits for a pending copy, which
    /// reads the pinned tensors below.
    twin: Option<DeviceCopy>,
    obs2: Tensor,
    actions: Tensor,
    rewards: Tensor,
    discounts: Tensor,
    /// Prioritized replay's importance-sampling weights.
    weights: Tensor,
    /// On a GPU without a copy stream: recorded after this set's last copy was queued
    /// (where CUDA events are not available, `None`: then copies block).
    copied: Option<Marker>,
    /// Whether this set's last copy (marked by `copied`, or the twin's) may still be
    /// running.
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
            twin: None,
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

    /// The host tensors, in [`Batch`]'s order.
    fn host(&self) -> HostTensors<'_> {
        [
            &self.obs2,
            &self.actions,
            &self.rewards,
            &self.discounts,
            &self.weights,
        ]
    }

    /// Waits until the device has read this set's last batch (at once if it has).
    fn wait_for_copy(&mut self) {
        if !self.in_flight {
            return;
        }
        let waited = match (&self.twin, &self.copied) {
            (Some(twin), _) => twin.wait_copied(),
            (None, Some(m)) => m.wait(),
            (None, None) => Ok(()),
        };
        if let Err(e) = waited {
            tracing::error!("population staging: {e}; waiting for the device instead");
            if let Some(i) = self.gpu {
                tch::Cuda::synchronize(i as i64);
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
/// copies elsewhere (on the compute stream, or on the side copy stream into the set's
/// twin), which read a set only until its copy's event, and the set is not written
/// before that event has passed.
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

    /// As [`PopulationStaging::new`] on `device` (a GPU, the stream's), with each set's
    /// batches copied into a device twin on the side copy `stream`.
    pub fn with_copy_stream(
        obs: &ObsSpec,
        agents: usize,
        batch: usize,
        device: Device,
        stream: &Arc<CopyStream>,
    ) -> Result<Self, CopyStreamError> {
        let mut staging = Self::new(obs, agents, batch, device);
        for set in &mut staging.sets {
            set.twin = Some(DeviceCopy::new(set.host(), device, stream)?);
            // The twin's events mark its copies.
            set.copied = None;
        }
        Ok(staging)
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
    /// queued without blocking from pinned memory on a GPU, on the side stream where
    /// there is one), and every slice free again, in the other set where there are two.
    /// Fails only where a copy on the side stream cannot be queued.
    pub fn take(&mut self, device: Device) -> Result<Batch, CopyStreamError> {
        self.ready.iter_mut().for_each(|r| *r = false);
        let current = self.current;
        self.current = (current + 1) % self.sets.len();
        if self.sets[current].twin.is_some() {
            return self.take_on_copy_stream(current);
        }
        let set = &mut self.sets[current];
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
        Ok(batch)
    }

    /// Set `current`'s batch through its twin: copied on the side stream while the
    /// update before it (which reads the other set's twin) may still run.
    fn take_on_copy_stream(&mut self, current: usize) -> Result<Batch, CopyStreamError> {
        // The update that read the other set's twin is queued by now: that set's next
        // copy waits for it on the device, and for nothing queued after it.
        for (i, set) in self.sets.iter().enumerate() {
            if let (true, Some(twin)) = (i != current, &set.twin) {
                if let Err(e) = twin.mark_used() {
                    tracing::error!("population staging: {e}; waiting for the device instead");
                    if let Some(d) = set.gpu {
                        tch::Cuda::synchronize(d as i64);
                    }
                }
            }
        }
        let set = &mut self.sets[current];
        let twin = set
            .twin
            .as_ref()
            .expect("a set taken on the copy stream has a twin");
        // SAFETY: the twin was made from this set's pinned tensors, and `fill` waits for
        // this copy (`wait_for_copy`) before it writes them again.
        unsafe { twin.upload(set.host())? };
        set.in_flight = true;
        Ok(twin.batch(self.weighted))
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
        let b = s.take(Device::Cpu).unwrap();
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
        let first = s.take(gpu).unwrap();
        assert_eq!((s.current, s.sets[0].in_flight), (1, true));
        let second = s.take(gpu).unwrap();
        assert_eq!(s.current, 0);
        // Filling set 0 again waits for its copy first.
        s.sets[0].wait_for_copy();
        assert!(!s.sets[0].in_flight);
        assert_eq!(first.obs2.device(), gpu);
        assert_eq!(second.actions.size(), [3, 8, 1]);
    }

    /// Each agent's slice reaches the device as replay sampled it, through the twins
    /// on the side stream, set after set (each set's copy waits for the update that
    /// read its twin before; here the "update" reads the batch back).
    #[test]
    #[ignore = "needs a CUDA device: run with --ignored on a GPU host"]
    fn copy_stream_batches_match_what_replay_sampled() {
        use millrace_proto::TransitionBatch;
        use millrace_replay::{RateLimiterConfig, ReplayConfig};
        use rand::SeedableRng;
        assert!(tch::Cuda::is_available(), "this test needs a CUDA device");
        let gpu = Device::Cuda(0);
        let obs = ObsSpec {
            shape: vec![4, 10, 10],
            dtype: DType::U8,
        };
        let row = obs.row_bytes();
        let (agents, b) = (3, 16);
        let tables: Vec<Table> = (0..agents)
            .map(|a| {
                let t = Table::new(&ReplayConfig {
                    capacity: 500,
                    shards: 1,
                    obs_row_bytes: row,
                    stack: 1,
                    obs_rows_per_item: 2.0,
                    limiter: RateLimiterConfig::sample_to_insert_ratio(1e-9, 1, 1e18, 1).unwrap(),
                    priority: None,
                })
                .unwrap();
                let mut batch = TransitionBatch::with_capacity(row, 50, 51);
                for r in 0..51u64 {
                    batch.push_obs_bytes(&vec![((a as u64 * 51 + r) % 251) as u8; row]);
                }
                for i in 0..50u32 {
                    batch.push_transition(i, i64::from(i % 3), a as f32 + i as f32, 0.99, i + 1);
                }
                t.insert(&batch).unwrap();
                t
            })
            .collect();
        let stream = CopyStream::new(0).unwrap();
        let mut side = PopulationStaging::with_copy_stream(&obs, agents, b, gpu, &stream).unwrap();
        // The same draws staged on the host only, as the reference.
        let mut host = PopulationStaging::new(&obs, agents, b, Device::Cpu);
        let mut rngs: Vec<SmallRng> = (0..agents)
            .map(|a| SmallRng::seed_from_u64(a as u64))
            .collect();
        let mut again: Vec<SmallRng> = rngs.clone();
        for round in 0..20 {
            for a in 0..agents {
                assert!(side.fill(a, &tables[a], &mut rngs[a]).unwrap());
                assert!(host.fill(a, &tables[a], &mut again[a]).unwrap());
            }
            let on_device = side.take(gpu).unwrap();
            let expected = host.take(Device::Cpu).unwrap();
            assert_eq!(on_device.obs2.device(), gpu);
            for (name, got, want) in [
                ("obs2", &on_device.obs2, &expected.obs2),
                ("actions", &on_device.actions, &expected.actions),
                ("rewards", &on_device.rewards, &expected.rewards),
                ("discounts", &on_device.discounts, &expected.discounts),
            ] {
                assert!(
                    got.to_device(Device::Cpu).equal(want),
                    "round {round}: {name}"
                );
            }
            assert_eq!(side.keys(), host.keys(), "round {round}: keys");
        }
    }
}
