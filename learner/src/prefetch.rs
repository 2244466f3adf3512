//! The prefetcher: a thread that samples replay into preallocated staging tensors ahead of
//! the learner, so the learner thread only moves ready batches to the device and computes.
//!
//! Slots circulate between two bounded channels: the sampler takes a free slot, gathers
//! rows straight into its tensors' memory and sends it as ready; the learner uses it and
//! sends it back as free. The number of slots bounds memory and how far ahead the sampler
//! runs. Staging tensors are pinned when CUDA is available, ordinary memory otherwise.

use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use millrace_proto::{DType, ObsSpec};
use millrace_replay::{SampleBuffers, Table};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use tch::{Device, Kind, Tensor};

use crate::dqn::Batch;

/// One staging slot: host tensors shaped as a [`Batch`] for one agent.
#[derive(Debug)]
pub struct Slot {
    obs2: Tensor,
    actions: Tensor,
    rewards: Tensor,
    discounts: Tensor,
    /// Oldest parameter version among the sampled rows (staleness).
    pub oldest_version: u64,
    /// Page-locked memory: copies to the device may run without blocking the host.
    pinned: bool,
}

fn kind(dtype: DType) -> Kind {
    match dtype {
        DType::F32 => Kind::Float,
        DType::U8 => Kind::Uint8,
    }
}

/// A mutable byte view of a contiguous host tensor.
///
/// # Safety
/// `t` must be a contiguous CPU tensor that nothing else reads or writes while the slice
/// lives. Slots guarantee this: a slot belongs to exactly one thread at a time.
unsafe fn bytes_mut(t: &mut Tensor) -> &mut [u8] {
    let len = t.numel() * t.kind().elt_size_in_bytes();
    // SAFETY: per the function contract the tensor's storage is `len` bytes, live as
    // long as `t`, and not aliased.
    unsafe { std::slice::from_raw_parts_mut(t.data_ptr().cast::<u8>(), len) }
}

impl Slot {
    /// `pin_for`: the CUDA device to pin host memory for, if any.
    ///
    /// # Panics
    /// If `batch_size` is 0 (an empty tensor has no storage to gather into).
    pub fn new(obs: &ObsSpec, batch_size: usize, pin_for: Option<Device>) -> Self {
        assert!(
            batch_size > 0,
            "staging slots need a batch size of at least 1"
        );
        let b = batch_size as i64;
        let mut obs_shape = vec![1, 2 * b];
        obs_shape.extend(obs.shape.iter().map(|d| *d as i64));
        let make = |shape: &[i64], k: Kind| {
            let t = Tensor::zeros(shape, (k, Device::Cpu));
            match pin_for {
                Some(device) => t.pin_memory(device),
                None => t,
            }
        };
        Self {
            obs2: make(&obs_shape, kind(obs.dtype)),
            actions: make(&[1, b, 1], Kind::Int64),
            rewards: make(&[1, b, 1], Kind::Float),
            discounts: make(&[1, b, 1], Kind::Float),
            oldest_version: 0,
            pinned: pin_for.is_some(),
        }
    }

    /// Samples a batch from `table` into this slot.
    pub fn fill(
        &mut self,
        table: &Table,
        rng: &mut SmallRng,
    ) -> Result<(), millrace_replay::Closed> {
        // SAFETY: slot tensors are contiguous host tensors created in `Slot::new`, and
        // `&mut self` means this thread alone holds the slot.
        let (obs2, actions, rewards, discounts) = unsafe {
            (
                bytes_mut(&mut self.obs2),
                bytes_mut(&mut self.actions),
                bytes_mut(&mut self.rewards),
                bytes_mut(&mut self.discounts),
            )
        };
        let (obs, next_obs) = obs2.split_at_mut(obs2.len() / 2);
        let mut out = SampleBuffers {
            obs,
            next_obs,
            actions: bytemuck_mut(actions),
            rewards: bytemuck_mut(rewards),
            discounts: bytemuck_mut(discounts),
        };
        self.oldest_version = table.sample(rng, &mut out)?;
        Ok(())
    }

    /// The slot's batch on `device`: the same tensors on the CPU; on a GPU, a copy
    /// issued without blocking the host (the slot's memory is pinned), queued in order
    /// before the update that reads it.
    ///
    /// The result borrows the slot: on the CPU it shares the slot's memory, so the slot
    /// cannot be handed back for refilling while the batch is alive. On a GPU the copy
    /// may still be reading the slot after the batch is gone: hand slots back through
    /// [`Prefetcher::recycle`], which waits for the device first.
    pub fn to_device(&self, device: Device) -> SlotBatch<'_> {
        let mv = |t: &Tensor| {
            if device == Device::Cpu {
                t.shallow_clone()
            } else {
                t.to_device_(device, t.kind(), self.pinned, false)
            }
        };
        SlotBatch {
            batch: Batch {
                obs2: mv(&self.obs2),
                actions: mv(&self.actions),
                rewards: mv(&self.rewards),
                discounts: mv(&self.discounts),
            },
            _slot: std::marker::PhantomData,
        }
    }
}

/// A [`Batch`] that may share memory with the [`Slot`] it came from, borrowing it.
#[derive(Debug)]
pub struct SlotBatch<'a> {
    batch: Batch,
    _slot: std::marker::PhantomData<&'a Slot>,
}

impl std::ops::Deref for SlotBatch<'_> {
    type Target = Batch;

    fn deref(&self) -> &Batch {
        &self.batch
    }
}

/// Reinterprets aligned bytes from a tensor as typed elements.
fn bytemuck_mut<T: bytemuck::Pod>(bytes: &mut [u8]) -> &mut [T] {
    // Tensor storage is at least 64-byte aligned, so this cannot fail for our tensors.
    bytemuck::cast_slice_mut(bytes)
}

/// Staging slots to keep in flight for batches of `batch_size`: enough to ride out the
/// sampler thread being descheduled for several milliseconds (it shares cores with
/// actors), at most 256 and at least 2, within about 64 MiB of staging memory (512 MiB
/// of pinned memory when `cuda`: the learner waits for the device once per half ring).
pub fn default_depth(obs: &ObsSpec, batch_size: usize, cuda: bool) -> usize {
    let slot_bytes = batch_size * (2 * obs.row_bytes() + 8 + 4 + 4);
    let budget: usize = if cuda { 512 << 20 } else { 64 << 20 };
    (budget / slot_bytes.max(1)).clamp(2, 256)
}

/// Handle to a running prefetcher.
#[derive(Debug)]
pub struct Prefetcher {
    pub ready: Receiver<Slot>,
    /// Slots to refill. On a GPU, hand slots back through [`Prefetcher::recycle`],
    /// which waits for their copies to finish first.
    pub free: Sender<Slot>,
    /// Used slots are handed back this many at a time (see [`Prefetcher::recycle`]).
    return_batch: usize,
    /// The CUDA device the slots' copies go to, if any.
    copies_to: Option<Device>,
    handle: JoinHandle<()>,
}

impl Prefetcher {
    /// Starts the sampler thread with `slots` staging slots.
    pub fn spawn(
        table: Arc<Table>,
        obs: &ObsSpec,
        batch_size: usize,
        slots: usize,
        pin_for: Option<Device>,
        seed: u64,
    ) -> std::io::Result<Self> {
        let slots = slots.max(2);
        let (free_tx, free_rx) = crossbeam_channel::bounded::<Slot>(slots);
        let (ready_tx, ready_rx) = crossbeam_channel::bounded::<Slot>(slots);
        for _ in 0..slots {
            free_tx
                .send(Slot::new(obs, batch_size, pin_for))
                .expect("channel has room for every slot");
        }
        let handle = std::thread::Builder::new()
            .name("prefetch".into())
            .spawn(move || {
                let mut rng = SmallRng::seed_from_u64(seed);
                // Ends when the table closes or the learner drops its ends.
                while let Ok(mut slot) = free_rx.recv() {
                    if slot.fill(&table, &mut rng).is_err() || ready_tx.send(slot).is_err() {
                        break;
                    }
                }
            })?;
        Ok(Self {
            ready: ready_rx,
            free: free_tx,
            return_batch: (slots / 2).max(1),
            copies_to: pin_for,
            handle,
        })
    }

    /// Hands a used slot back for refilling, half the ring at a time: the sampler then
    /// wakes once per half ring and refills it in one burst, instead of waking (and
    /// competing for the CPU with the learner) once per update. Half the ring stays
    /// ready meanwhile, so the learner does not wait as long as the sampler refills
    /// faster than the learner consumes.
    ///
    /// On a GPU the copies out of these slots were queued without blocking; waiting for
    /// the device here (once per half ring, not once per update) guarantees they are
    /// done before the sampler overwrites a slot.
    pub fn recycle(&self, used: &mut Vec<Slot>, slot: Slot) {
        used.push(slot);
        if used.len() >= self.return_batch {
            if let Some(Device::Cuda(i)) = self.copies_to {
                tch::Cuda::synchronize(i as i64);
            }
            for slot in used.drain(..) {
                let _ = self.free.send(slot);
            }
        }
    }

    /// Waits for the sampler thread (after the table is closed).
    pub fn join(self) {
        drop(self.ready);
        drop(self.free);
        let _ = self.handle.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use millrace_proto::TransitionBatch;
    use millrace_replay::{RateLimiterConfig, ReplayConfig};

    #[test]
    fn used_slots_go_back_half_a_ring_at_a_time() {
        let obs = ObsSpec {
            shape: vec![1],
            dtype: DType::F32,
        };
        let table = Arc::new(Table::new(&ReplayConfig {
            capacity: 100,
            shards: 1,
            obs_row_bytes: 4,
            obs_rows_per_item: 2.0,
            limiter: RateLimiterConfig::sample_to_insert_ratio(1e-9, 1, 1e18, 1).unwrap(),
        }));
        let mut b = TransitionBatch::with_capacity(4, 1, 2);
        b.push_f32(&[1.0], 0, 1.0, 0.5, &[2.0]);
        table.insert(&b).unwrap();
        let p = Prefetcher::spawn(Arc::clone(&table), &obs, 2, 8, None, 0).unwrap();
        let mut used = Vec::new();
        let mut taken = Vec::new();
        for _ in 0..8 {
            taken.push(p.ready.recv().unwrap());
        }
        assert!(p.ready.is_empty(), "all eight slots are out");
        for (i, slot) in taken.into_iter().enumerate() {
            p.recycle(&mut used, slot);
            if i < 3 {
                assert_eq!(used.len(), i + 1, "held until half the ring is used");
            }
        }
        assert!(used.is_empty(), "both halves went back");
        // The sampler refills every slot it got back.
        for _ in 0..8 {
            let slot = p.ready.recv().unwrap();
            assert_eq!(slot.oldest_version, 0);
        }
        table.close();
        p.join();
    }
}
