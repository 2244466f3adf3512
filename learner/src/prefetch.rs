//! The prefetcher: a thread that samples replay into preallocated staging tensors ahead of
//! the learner, so the learner thread only moves ready batches to the device and computes.
//!
//! Slots circulate between two bounded channels: the sampler takes a free slot, gathers
//! rows straight into its tensors' memory and sends it as ready; the learner uses it and
//! sends it back as free. The number of slots bounds memory and how far ahead the sampler
//! runs. Staging tensors are pinned when CUDA is available, ordinary memory otherwise.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use millrace_proto::{DType, ObsSpec};
use millrace_replay::{SampleBuffers, Table};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use tch::{Device, Kind, Tensor};

use crate::cuda_copy::{CopyStream, CopyStreamError, CudaEvent};
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
    /// With a side copy stream: the slot's device buffers and their events.
    device: Option<DeviceCopy>,
}

/// A slot's device-side twin, filled on a [`CopyStream`] (see `cuda_copy`).
///
/// Dropping it waits for its copy: neither PyTorch's pinned-host allocator nor its
/// device allocator knows about copies on the side stream, so the memory must not go
/// back to them while one is in flight.
#[derive(Debug)]
struct DeviceCopy {
    stream: Arc<CopyStream>,
    obs2: Tensor,
    actions: Tensor,
    rewards: Tensor,
    discounts: Tensor,
    /// Recorded on the copy stream after the copies: the batch is on the device.
    copied: CudaEvent,
    /// Recorded on the compute stream after the update: the device buffers are free.
    used: CudaEvent,
}

impl Drop for DeviceCopy {
    fn drop(&mut self) {
        if let Err(e) = self.copied.synchronize() {
            tracing::error!("copy stream: {e}");
        }
    }
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
            device: None,
        }
    }

    /// A slot whose batches go to `device` on the side `stream` (pinned host memory,
    /// preallocated device buffers, two events).
    pub fn with_copy_stream(
        obs: &ObsSpec,
        batch_size: usize,
        device: Device,
        stream: &Arc<CopyStream>,
    ) -> Result<Self, CopyStreamError> {
        let mut slot = Self::new(obs, batch_size, Some(device));
        let on_device = |t: &Tensor| Tensor::empty(t.size(), (t.kind(), device));
        let twin = DeviceCopy {
            stream: Arc::clone(stream),
            obs2: on_device(&slot.obs2),
            actions: on_device(&slot.actions),
            rewards: on_device(&slot.rewards),
            discounts: on_device(&slot.discounts),
            copied: stream.event()?,
            used: stream.event()?,
        };
        // The buffers may be cached blocks that work already queued on the compute
        // stream still uses: the first copy into them waits for that work too.
        twin.used.record_on_compute_stream()?;
        slot.device = Some(twin);
        Ok(slot)
    }

    /// With a copy stream: waits until the slot's previous copy has left its pinned
    /// memory, so that it may be refilled. Called by the sampler thread.
    fn wait_copied(&self) -> Result<(), CopyStreamError> {
        match &self.device {
            Some(d) => d.copied.synchronize(),
            None => Ok(()),
        }
    }

    /// With a copy stream: queues the copies of the freshly filled slot on the copy
    /// stream, behind the learner's last use of the device buffers.
    fn upload(&self) -> Result<(), CopyStreamError> {
        let Some(d) = &self.device else {
            return Ok(());
        };
        d.used.copy_stream_waits()?;
        for (dst, src) in [
            (&d.obs2, &self.obs2),
            (&d.actions, &self.actions),
            (&d.rewards, &self.rewards),
            (&d.discounts, &self.discounts),
        ] {
            let bytes = src.numel() * src.kind().elt_size_in_bytes();
            // SAFETY: `src` is pinned host memory of `bytes` bytes and `dst` a device
            // tensor of the same shape and kind on the stream's device. Neither is
            // touched until the copy completes: the sampler waits for `copied` before
            // refilling, and the learner's compute stream waits for it before reading.
            unsafe { d.stream.copy(dst.data_ptr(), src.data_ptr(), bytes)? };
        }
        d.copied.record_on_copy_stream()
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
        // With a copy stream the batch already goes to the stream's device.
        if let Some(d) = &self.device {
            // The batch is (being) copied on the side stream: compute waits for it on
            // the device. Should that fail, waiting on the host is slower but correct.
            if let Err(e) = d.copied.compute_stream_waits() {
                tracing::error!("copy stream: {e}; waiting on the host instead");
                let _ = d.copied.synchronize();
            }
            return SlotBatch {
                batch: Batch {
                    obs2: d.obs2.shallow_clone(),
                    actions: d.actions.shallow_clone(),
                    rewards: d.rewards.shallow_clone(),
                    discounts: d.discounts.shallow_clone(),
                },
                _slot: std::marker::PhantomData,
            };
        }
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

/// Waits for every copy queued on `stream`, if any.
fn finish_copies(stream: Option<&CopyStream>) {
    if let Some(Err(e)) = stream.map(CopyStream::synchronize) {
        tracing::error!("copy stream: {e}");
    }
}

/// Staging slots to keep in flight for batches of `batch_size`: enough to ride out the
/// sampler thread being descheduled for several milliseconds (it shares cores with
/// actors), at most 256 and at least 2, within about 64 MiB of staging memory (512 MiB
/// of pinned memory when `cuda`: the learner waits for the device once per half ring;
/// with a copy stream, as much again of device memory for the slots' device twins).
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
    /// The CUDA device the slots' batches go to, if any.
    copies_to: Option<Device>,
    /// The side stream slots are copied on, if any: their events order everything, and
    /// recycling never waits for the device.
    copy_stream: Option<Arc<CopyStream>>,
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
        let slots: Vec<Slot> = (0..slots.max(2))
            .map(|_| Slot::new(obs, batch_size, pin_for))
            .collect();
        Self::spawn_with(table, slots, pin_for, None, seed)
    }

    /// Starts the sampler thread with `slots` staging slots whose batches are copied to
    /// `device` on the side `stream` (see `cuda_copy`).
    pub fn spawn_on_copy_stream(
        table: Arc<Table>,
        obs: &ObsSpec,
        batch_size: usize,
        slots: usize,
        device: Device,
        stream: &Arc<CopyStream>,
        seed: u64,
    ) -> Result<Self, CopyStreamError> {
        let slots = (0..slots.max(2))
            .map(|_| Slot::with_copy_stream(obs, batch_size, device, stream))
            .collect::<Result<Vec<_>, _>>()?;
        Self::spawn_with(table, slots, Some(device), Some(Arc::clone(stream)), seed)
            .map_err(|e| CopyStreamError::Thread(e.to_string()))
    }

    fn spawn_with(
        table: Arc<Table>,
        slots: Vec<Slot>,
        pin_for: Option<Device>,
        copy_stream: Option<Arc<CopyStream>>,
        seed: u64,
    ) -> std::io::Result<Self> {
        let depth = slots.len();
        let (free_tx, free_rx) = crossbeam_channel::bounded::<Slot>(depth);
        let (ready_tx, ready_rx) = crossbeam_channel::bounded::<Slot>(depth);
        for slot in slots {
            free_tx.send(slot).expect("channel has room for every slot");
        }
        let stream = copy_stream.clone();
        let handle = std::thread::Builder::new()
            .name("prefetch".into())
            .spawn(move || {
                let mut rng = SmallRng::seed_from_u64(seed);
                // Ends when the table closes, the learner drops its ends, or the device
                // fails.
                while let Ok(mut slot) = free_rx.recv() {
                    if let Err(e) = slot.wait_copied() {
                        tracing::error!("prefetch: {e}");
                        break;
                    }
                    if slot.fill(&table, &mut rng).is_err() {
                        break;
                    }
                    if let Err(e) = slot.upload() {
                        tracing::error!("prefetch: {e}");
                        break;
                    }
                    if let Err(unsent) = ready_tx.send(slot) {
                        // Its copy may still be running: finish it before freeing.
                        finish_copies(stream.as_deref());
                        drop(unsent);
                        break;
                    }
                }
                // Only this thread queues copies: once they are done, every slot
                // (including those still queued as ready) may be freed.
                finish_copies(stream.as_deref());
            })?;
        Ok(Self {
            ready: ready_rx,
            free: free_tx,
            return_batch: (depth / 2).max(1),
            copies_to: pin_for,
            copy_stream,
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
    ///
    /// Returns the time spent waiting for the device (zero on the CPU, where no clock
    /// is read).
    pub fn recycle(&self, used: &mut Vec<Slot>, slot: Slot) -> Duration {
        let mut waited = Duration::ZERO;
        if let Some(d) = &slot.device {
            // The update that read this slot's device buffers is queued: mark when it
            // ends, so the next copy into them waits for it (on the device).
            if let Err(e) = d.used.record_on_compute_stream() {
                tracing::error!("copy stream: {e}; waiting for the device instead");
                waited += self.wait_for_device();
            }
        }
        used.push(slot);
        if used.len() >= self.return_batch {
            if self.copy_stream.is_none() {
                waited += self.wait_for_device();
            }
            for slot in used.drain(..) {
                let _ = self.free.send(slot);
            }
        }
        waited
    }

    /// Waits for all queued work on the slots' CUDA device, if any; returns how long.
    fn wait_for_device(&self) -> Duration {
        match self.copies_to {
            Some(Device::Cuda(i)) => {
                let start = std::time::Instant::now();
                tch::Cuda::synchronize(i as i64);
                start.elapsed()
            }
            _ => Duration::ZERO,
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

    /// On a GPU host: batches copied on the side stream equal their pinned host slots,
    /// round after round (slots refilled only after their copies). Skipped without CUDA.
    #[test]
    fn copy_stream_batches_match_their_slots() {
        if !tch::Cuda::is_available() {
            eprintln!("skipped: no CUDA device");
            return;
        }
        let device = Device::Cuda(0);
        let obs = ObsSpec {
            shape: vec![4, 84, 84],
            dtype: DType::U8,
        };
        let row = obs.row_bytes();
        let table = Arc::new(Table::new(&ReplayConfig {
            capacity: 2000,
            shards: 2,
            obs_row_bytes: row,
            obs_rows_per_item: 2.0,
            limiter: RateLimiterConfig::sample_to_insert_ratio(1e-9, 1, 1e18, 1).unwrap(),
        }));
        for seq in 0..20u64 {
            let mut b = TransitionBatch::with_capacity(row, 50, 51);
            for r in 0..51u64 {
                b.push_obs_bytes(&vec![((seq * 51 + r) % 251) as u8; row]);
            }
            for i in 0..50u32 {
                b.push_transition(i, i64::from(i % 3), i as f32, 0.99, i + 1);
            }
            b.seq = seq;
            table.insert(&b).unwrap();
        }
        let stream = CopyStream::new(0).unwrap();
        let p =
            Prefetcher::spawn_on_copy_stream(Arc::clone(&table), &obs, 64, 4, device, &stream, 0)
                .unwrap();
        let mut used = Vec::new();
        for _ in 0..40 {
            let slot = p.ready.recv().unwrap();
            {
                let batch = slot.to_device(device);
                assert_eq!(batch.obs2.device(), device);
                for (on_device, host) in [
                    (&batch.obs2, &slot.obs2),
                    (&batch.actions, &slot.actions),
                    (&batch.rewards, &slot.rewards),
                    (&batch.discounts, &slot.discounts),
                ] {
                    assert!(on_device.to_device(Device::Cpu).equal(host));
                }
            }
            p.recycle(&mut used, slot);
        }
        table.close();
        drop(used);
        p.join();
    }
}
