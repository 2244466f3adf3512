//! The prefetcher: a thread that samples replay into preallocated staging buffers ahead
//! of the learner, so the learner thread only moves ready batches to the device and
//! computes.
//!
//! Staging buffers circulate between two bounded channels: the sampler takes a free one,
//! gathers rows straight into its tensors' memory and sends it as ready; the learner
//! uses it and sends it back as free. The number of buffers bounds memory and how far
//! ahead the sampler runs. Staging tensors are pinned when CUDA is available, ordinary
//! memory otherwise.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use millrace_proto::{DType, ObsSpec};
use millrace_replay::{ItemKey, SampleBuffers, Table};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use tch::{Device, Kind, Tensor};

use crate::cuda::{CopyStream, CopyStreamError};
use crate::device_copy::{DeviceCopy, HostTensors};
use crate::dqn::Batch;

/// One staging buffer: host tensors shaped as a [`Batch`] for one agent, plus the keys
/// of the items sampled into them.
///
/// Invariant behind the `unsafe` writes in [`StagingBuffer::fill`]: its host tensors
/// never leave it. Nothing hands out a tensor sharing their storage (a shallow clone):
/// on the CPU [`StagingBuffer::to_device`] copies, on a GPU it copies to the device.
/// So whoever holds the buffer (`&mut`) is the only reader and writer of that memory.
#[derive(Debug)]
pub struct StagingBuffer {
    /// With a side copy stream: the device buffers and their events. Declared first so
    /// that it is dropped first: its drop waits for a pending copy, which reads the
    /// pinned host tensors below, before those go back to PyTorch's allocator.
    device: Option<DeviceCopy>,
    obs2: Tensor,
    actions: Tensor,
    rewards: Tensor,
    discounts: Tensor,
    /// Importance-sampling weights (prioritized replay).
    weights: Tensor,
    /// Whether the last batch came from prioritized replay (its weights count).
    weighted: bool,
    /// Which replay item each row is (for priority updates).
    keys: Vec<ItemKey>,
    /// Oldest parameter version among the sampled rows (staleness).
    pub oldest_version: u64,
    /// Page-locked memory: copies to the device may run without blocking the host.
    pinned: bool,
}

pub(crate) fn kind(dtype: DType) -> Kind {
    match dtype {
        DType::F32 => Kind::Float,
        DType::U8 => Kind::Uint8,
    }
}

/// A host tensor of zeros, page-locked for copies to `pin_for` if given. Pinned
/// through the internal op: `pin_memory(device)` is the deprecated signature (tch
/// always passes a device), which has libtorch warn for every tensor pinned.
pub(crate) fn host_zeros(shape: &[i64], kind: Kind, pin_for: Option<Device>) -> Tensor {
    let t = Tensor::zeros(shape, (kind, Device::Cpu));
    match pin_for {
        Some(device) => t.internal_pin_memory(device),
        None => t,
    }
}

/// A mutable byte view of a contiguous host tensor.
///
/// # Safety
/// `t` must be a contiguous CPU tensor whose storage nothing else reads or writes while
/// the slice lives. Staging buffers guarantee this (see [`StagingBuffer`]).
pub(crate) unsafe fn bytes_mut(t: &mut Tensor) -> &mut [u8] {
    let len = t.numel() * t.kind().elt_size_in_bytes();
    // SAFETY: per the function contract the tensor's storage is `len` bytes, live as
    // long as `t`, and not aliased.
    unsafe { std::slice::from_raw_parts_mut(t.data_ptr().cast::<u8>(), len) }
}

impl StagingBuffer {
    /// `pin_for`: the CUDA device to pin host memory for, if any.
    ///
    /// # Panics
    /// If `batch_size` is 0 (an empty tensor has no storage to gather into).
    pub fn new(obs: &ObsSpec, batch_size: usize, pin_for: Option<Device>) -> Self {
        assert!(
            batch_size > 0,
            "staging buffers need a batch size of at least 1"
        );
        let b = batch_size as i64;
        let mut obs_shape = vec![1, 2 * b];
        obs_shape.extend(obs.shape.iter().map(|d| *d as i64));
        let make = |shape: &[i64], k: Kind| host_zeros(shape, k, pin_for);
        Self {
            device: None,
            obs2: make(&obs_shape, kind(obs.dtype)),
            actions: make(&[1, b, 1], Kind::Int64),
            rewards: make(&[1, b, 1], Kind::Float),
            discounts: make(&[1, b, 1], Kind::Float),
            weights: make(&[1, b, 1], Kind::Float),
            weighted: false,
            keys: vec![ItemKey::default(); batch_size],
            oldest_version: 0,
            pinned: pin_for.is_some(),
        }
    }

    /// Bytes of the host tensors, and of page-locked memory they take: PyTorch's
    /// pinned-host allocator rounds each allocation up to a power of two, so a ring
    /// pins more than its batches' size (1.1-1.3x for the shipped networks, up to 2x).
    pub fn host_bytes(&self) -> (usize, usize) {
        let sizes = [
            &self.obs2,
            &self.actions,
            &self.rewards,
            &self.discounts,
            &self.weights,
        ]
        .map(|t| t.numel() * t.kind().elt_size_in_bytes());
        let pinned = if self.pinned {
            sizes.iter().map(|b| b.next_power_of_two()).sum()
        } else {
            0
        };
        (sizes.iter().sum(), pinned)
    }

    /// A buffer whose batches go to `device` on the side `stream` (pinned host memory,
    /// preallocated device buffers, two events).
    pub fn with_copy_stream(
        obs: &ObsSpec,
        batch_size: usize,
        device: Device,
        stream: &Arc<CopyStream>,
    ) -> Result<Self, CopyStreamError> {
        let mut buf = Self::new(obs, batch_size, Some(device));
        buf.device = Some(DeviceCopy::new(buf.host(), device, stream)?);
        Ok(buf)
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

    /// The keys of the items in the last batch sampled into this buffer.
    pub fn keys(&self) -> &[ItemKey] {
        &self.keys
    }

    /// With a copy stream: waits until the buffer's previous copy has left its pinned
    /// memory, so that it may be refilled. Called by the sampler thread.
    fn wait_copied(&self) -> Result<(), CopyStreamError> {
        match &self.device {
            Some(d) => d.wait_copied(),
            None => Ok(()),
        }
    }

    /// With a copy stream: queues the copies of the freshly filled buffer on the copy
    /// stream, behind the learner's last use of the device buffers.
    fn upload(&self) -> Result<(), CopyStreamError> {
        match &self.device {
            // SAFETY: the twin was made from these pinned tensors, and the sampler
            // waits for the copy (`wait_copied`) before refilling them.
            Some(d) => unsafe { d.upload(self.host()) },
            None => Ok(()),
        }
    }

    /// Views of the buffer's memory as replay's sample destination.
    fn buffers(&mut self) -> SampleBuffers<'_> {
        // SAFETY: staging tensors are contiguous host tensors created in `new`, never
        // shared outside this buffer (see the type's invariant), and `&mut self` means
        // this thread alone holds the buffer.
        let (obs2, actions, rewards, discounts, weights) = unsafe {
            (
                bytes_mut(&mut self.obs2),
                bytes_mut(&mut self.actions),
                bytes_mut(&mut self.rewards),
                bytes_mut(&mut self.discounts),
                bytes_mut(&mut self.weights),
            )
        };
        let (obs, next_obs) = obs2.split_at_mut(obs2.len() / 2);
        SampleBuffers {
            obs,
            next_obs,
            actions: bytemuck_mut(actions),
            rewards: bytemuck_mut(rewards),
            discounts: bytemuck_mut(discounts),
            keys: &mut self.keys,
            weights: bytemuck_mut(weights),
        }
    }

    /// Samples a batch from `table` into this buffer, waiting on the rate limiter.
    pub fn fill(
        &mut self,
        table: &Table,
        rng: &mut SmallRng,
    ) -> Result<(), millrace_replay::Closed> {
        self.oldest_version = table.sample(rng, &mut self.buffers())?;
        self.weighted = table.prioritized();
        Ok(())
    }

    /// Samples a batch if the rate limiter allows one now; `Ok(false)` if not (the
    /// lock-step mode, which keeps the ratio itself).
    pub fn try_fill(
        &mut self,
        table: &Table,
        rng: &mut SmallRng,
    ) -> Result<bool, millrace_replay::Closed> {
        match table.try_sample(rng, &mut self.buffers())? {
            Some(oldest) => {
                self.oldest_version = oldest;
                self.weighted = table.prioritized();
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// The buffer's batch on `device`. On the CPU, a copy (so the buffer's memory is
    /// never shared, see the type's invariant). On a GPU, a copy issued without
    /// blocking the host (the memory is pinned), queued in order before the update
    /// that reads it: it may still be reading this buffer after the call returns, so
    /// hand buffers back through [`Prefetcher::recycle`], which waits for the device
    /// first. With a copy stream, the batch is already (being) copied on the side.
    pub fn to_device(&self, device: Device) -> Batch {
        if let Some(d) = &self.device {
            return d.batch(self.weighted);
        }
        let mv = |t: &Tensor| {
            if device == Device::Cpu {
                t.copy()
            } else {
                t.to_device_(device, t.kind(), self.pinned, false)
            }
        };
        Batch {
            obs2: mv(&self.obs2),
            actions: mv(&self.actions),
            rewards: mv(&self.rewards),
            discounts: mv(&self.discounts),
            weights: self.weighted.then(|| mv(&self.weights)),
        }
    }
}

/// Reinterprets aligned bytes from a tensor as typed elements.
pub(crate) fn bytemuck_mut<T: bytemuck::Pod>(bytes: &mut [u8]) -> &mut [T] {
    // Tensor storage is at least 64-byte aligned, so this cannot fail for our tensors.
    bytemuck::cast_slice_mut(bytes)
}

/// Waits for every copy queued on `stream`, if any.
fn finish_copies(stream: Option<&CopyStream>) {
    if let Some(Err(e)) = stream.map(CopyStream::synchronize) {
        tracing::error!("copy stream: {e}");
    }
}

/// Staging buffers to keep in flight for batches of `batch_size`: enough to ride out
/// the sampler thread being descheduled for several milliseconds (it shares cores with
/// actors), at most 256 and at least 2, within about 64 MiB of staging memory (512 MiB
/// of pinned memory when `cuda`: the learner waits for the device once per half ring;
/// with a copy stream, as much again of device memory for the buffers' device twins).
pub fn default_depth(obs: &ObsSpec, batch_size: usize, cuda: bool) -> usize {
    let bytes = batch_size * (2 * obs.row_bytes() + 8 + 4 + 4 + 4);
    let budget: usize = if cuda { 512 << 20 } else { 64 << 20 };
    (budget / bytes.max(1)).clamp(2, 256)
}

/// Updates between the learner's waits for the device with a ring of `depth` buffers
/// (without a side stream): used buffers go back to the sampler half a ring at a time,
/// after a wait ([`Prefetcher::recycle`]).
pub fn device_wait_every(depth: usize) -> usize {
    (depth.max(2) / 2).max(1)
}

/// Why the sampler thread stopped before the table closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrefetchError {
    #[error("copy stream: {0}")]
    CopyStream(String),
    #[error("injected fault after {0} batches")]
    Injected(u64),
    #[error("the sampler thread panicked: {0}")]
    Panicked(String),
}

/// Handle to a running prefetcher.
#[derive(Debug)]
pub struct Prefetcher {
    pub ready: Receiver<StagingBuffer>,
    /// Buffers to refill. On a GPU, hand buffers back through [`Prefetcher::recycle`],
    /// which waits for their copies to finish first.
    pub free: Sender<StagingBuffer>,
    /// Used buffers are handed back this many at a time (see [`Prefetcher::recycle`]).
    return_batch: usize,
    /// The CUDA device the buffers' batches go to, if any.
    copies_to: Option<Device>,
    /// The side stream buffers are copied on, if any: their events order everything,
    /// and recycling never waits for the device.
    copy_stream: Option<Arc<CopyStream>>,
    /// Batches sampled so far.
    fills: Arc<AtomicU64>,
    handle: JoinHandle<Result<(), PrefetchError>>,
}

/// How a prefetcher samples.
#[derive(Clone, Copy, Debug)]
pub struct SamplerConfig {
    /// Staging buffers in the ring.
    pub depth: usize,
    pub seed: u64,
    /// Fail after this many batches (tests of the shutdown path).
    pub fail_after: Option<u64>,
}

impl Prefetcher {
    /// Starts the sampler thread with `cfg.depth` staging buffers.
    pub fn spawn(
        table: Arc<Table>,
        obs: &ObsSpec,
        batch_size: usize,
        pin_for: Option<Device>,
        cfg: SamplerConfig,
    ) -> std::io::Result<Self> {
        let buffers: Vec<StagingBuffer> = (0..cfg.depth.max(2))
            .map(|_| StagingBuffer::new(obs, batch_size, pin_for))
            .collect();
        Self::spawn_with(table, buffers, pin_for, None, cfg)
    }

    /// Starts the sampler thread with staging buffers whose batches are copied to
    /// `device` on the side `stream` (see `cuda`).
    pub fn spawn_on_copy_stream(
        table: Arc<Table>,
        obs: &ObsSpec,
        batch_size: usize,
        device: Device,
        stream: &Arc<CopyStream>,
        cfg: SamplerConfig,
    ) -> Result<Self, CopyStreamError> {
        let buffers = (0..cfg.depth.max(2))
            .map(|_| StagingBuffer::with_copy_stream(obs, batch_size, device, stream))
            .collect::<Result<Vec<_>, _>>()?;
        Self::spawn_with(table, buffers, Some(device), Some(Arc::clone(stream)), cfg)
            .map_err(|e| CopyStreamError::Thread(e.to_string()))
    }

    fn spawn_with(
        table: Arc<Table>,
        buffers: Vec<StagingBuffer>,
        pin_for: Option<Device>,
        copy_stream: Option<Arc<CopyStream>>,
        cfg: SamplerConfig,
    ) -> std::io::Result<Self> {
        let depth = buffers.len();
        let (bytes, pinned) = buffers
            .iter()
            .map(StagingBuffer::host_bytes)
            .fold((0, 0), |(b, p), (x, y)| (b + x, p + y));
        let mib = |b: usize| b as f64 / f64::from(1u32 << 20);
        if pinned > 0 {
            tracing::info!(
                "staging: {depth} buffers, {:.1} MiB of batches in {:.1} MiB of pinned host memory (the allocator rounds each tensor up to a power of two)",
                mib(bytes),
                mib(pinned)
            );
        }
        let (free_tx, free_rx) = crossbeam_channel::bounded::<StagingBuffer>(depth);
        let (ready_tx, ready_rx) = crossbeam_channel::bounded::<StagingBuffer>(depth);
        for buf in buffers {
            free_tx
                .send(buf)
                .expect("channel has room for every buffer");
        }
        let stream = copy_stream.clone();
        let fills = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&fills);
        let handle = std::thread::Builder::new()
            .name("prefetch".into())
            .spawn(move || {
                let mut rng = SmallRng::seed_from_u64(cfg.seed);
                let mut result = Ok(());
                // Ends when the table closes, the learner drops its ends, or the device
                // fails.
                while let Ok(mut buf) = free_rx.recv() {
                    if let Err(e) = buf.wait_copied() {
                        result = Err(PrefetchError::CopyStream(e.to_string()));
                        break;
                    }
                    if buf.fill(&table, &mut rng).is_err() {
                        break;
                    }
                    let n = counter.fetch_add(1, Ordering::Relaxed) + 1;
                    if cfg.fail_after.is_some_and(|k| n > k) {
                        result = Err(PrefetchError::Injected(n - 1));
                        break;
                    }
                    if let Err(e) = buf.upload() {
                        result = Err(PrefetchError::CopyStream(e.to_string()));
                        break;
                    }
                    if let Err(unsent) = ready_tx.send(buf) {
                        // Its copy may still be running: finish it before freeing.
                        finish_copies(stream.as_deref());
                        drop(unsent);
                        break;
                    }
                }
                // Only this thread queues copies: once they are done, every buffer
                // (including those still queued as ready) may be freed.
                finish_copies(stream.as_deref());
                result
            })?;
        Ok(Self {
            ready: ready_rx,
            free: free_tx,
            return_batch: device_wait_every(depth),
            copies_to: pin_for,
            copy_stream,
            fills,
            handle,
        })
    }

    /// Whether batches reach the device on a side copy stream (the sampler queues
    /// those copies; the learner thread neither copies nor waits for the device).
    pub fn side_stream(&self) -> bool {
        self.copy_stream.is_some()
    }

    /// Batches the sampler has filled so far.
    pub fn fills(&self) -> u64 {
        self.fills.load(Ordering::Relaxed)
    }

    /// Hands a used buffer back for refilling, half the ring at a time: the sampler then
    /// wakes once per half ring and refills it in one burst, instead of waking (and
    /// competing for the CPU with the learner) once per update. Half the ring stays
    /// ready meanwhile, so the learner does not wait as long as the sampler refills
    /// faster than the learner consumes.
    ///
    /// On a GPU the copies out of these buffers were queued without blocking; waiting
    /// for the device here (once per half ring, not once per update) guarantees they
    /// are done before the sampler overwrites a buffer.
    ///
    /// Returns the time spent waiting for the device (zero on the CPU, where no clock
    /// is read).
    pub fn recycle(&self, used: &mut Vec<StagingBuffer>, buf: StagingBuffer) -> Duration {
        let mut waited = Duration::ZERO;
        if let Some(d) = &buf.device {
            // The update that read this buffer's device twin is queued: mark when it
            // ends, so the next copy into it waits for it (on the device).
            if let Err(e) = d.mark_used() {
                tracing::error!("copy stream: {e}; waiting for the device instead");
                waited += self.wait_for_device();
            }
        }
        used.push(buf);
        if used.len() >= self.return_batch {
            if self.copy_stream.is_none() {
                waited += self.wait_for_device();
            }
            for buf in used.drain(..) {
                let _ = self.free.send(buf);
            }
        }
        waited
    }

    /// Waits for all queued work on the buffers' CUDA device, if any; returns how long.
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

    /// Waits for the sampler thread (after the table is closed, or once `ready` has
    /// disconnected); returns why it stopped if that was an error.
    pub fn join(self) -> Result<(), PrefetchError> {
        drop(self.ready);
        drop(self.free);
        match self.handle.join() {
            Ok(result) => result,
            Err(panic) => Err(PrefetchError::Panicked(
                millrace_proto::panics::panic_message(&*panic),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use millrace_proto::TransitionBatch;
    use millrace_replay::{RateLimiterConfig, ReplayConfig};

    fn table(capacity: usize, row: usize) -> Arc<Table> {
        Arc::new(
            Table::new(&ReplayConfig {
                capacity,
                shards: 1,
                obs_row_bytes: row,
                stack: 1,
                obs_rows_per_item: 2.0,
                limiter: RateLimiterConfig::sample_to_insert_ratio(1e-9, 1, 1e18, 1).unwrap(),
                priority: None,
            })
            .unwrap(),
        )
    }

    /// `n` one-float transitions, all from parameter version `version`.
    fn batch(version: u64, seq: u64, n: usize) -> TransitionBatch {
        let mut b = TransitionBatch::with_capacity(4, n, 2 * n);
        for i in 0..n {
            b.push_f32(&[i as f32], 0, 1.0, 0.5, &[2.0]);
        }
        (b.version, b.seq) = (version, seq);
        b
    }

    fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
        let start = std::time::Instant::now();
        while !cond() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "timed out: {what}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn used_buffers_go_back_half_a_ring_at_a_time() {
        let obs = ObsSpec {
            shape: vec![1],
            dtype: DType::F32,
        };
        // Replay holds 4 items: one batch of version 1 now.
        let table = table(4, 4);
        table.insert(&batch(1, 0, 4)).unwrap();
        let cfg = SamplerConfig {
            depth: 8,
            seed: 0,
            fail_after: None,
        };
        let p = Prefetcher::spawn(Arc::clone(&table), &obs, 2, None, cfg).unwrap();
        let taken: Vec<StagingBuffer> = (0..8).map(|_| p.ready.recv().unwrap()).collect();
        assert!(taken.iter().all(|b| b.oldest_version == 1));
        assert_eq!(p.fills(), 8, "the ring is full and the sampler idle");
        // Newer data replaces the old: refilled buffers must carry version 5.
        table.insert(&batch(5, 1, 4)).unwrap();
        let mut used = Vec::new();
        for (i, buf) in taken.into_iter().enumerate() {
            p.recycle(&mut used, buf);
            if i < 3 {
                assert_eq!(used.len(), i + 1, "held until half the ring is used");
                assert_eq!(p.fills(), 8, "nothing went back to the sampler yet");
            }
            if i == 3 {
                assert!(used.is_empty(), "the first half went back at once");
                wait_until("the first half is refilled", || p.fills() == 12);
            }
        }
        assert!(used.is_empty(), "both halves went back");
        for _ in 0..8 {
            let buf = p.ready.recv().unwrap();
            assert_eq!(buf.oldest_version, 5, "refilled with fresh samples");
        }
        assert_eq!(p.fills(), 16);
        table.close();
        p.join().unwrap();
    }

    #[test]
    fn a_failing_sampler_ends_the_ring_and_says_why() {
        let obs = ObsSpec {
            shape: vec![1],
            dtype: DType::F32,
        };
        let table = table(100, 4);
        table.insert(&batch(0, 0, 4)).unwrap();
        let cfg = SamplerConfig {
            depth: 4,
            seed: 0,
            fail_after: Some(2),
        };
        let p = Prefetcher::spawn(Arc::clone(&table), &obs, 2, None, cfg).unwrap();
        let got: Vec<StagingBuffer> = p.ready.iter().collect();
        assert_eq!(got.len(), 2, "two batches, then the ring ends");
        assert_eq!(p.join(), Err(PrefetchError::Injected(2)));
    }

    #[test]
    fn cpu_batches_are_copies_not_views_of_the_buffer() {
        let obs = ObsSpec {
            shape: vec![1],
            dtype: DType::F32,
        };
        let table = table(10, 4);
        table.insert(&batch(0, 0, 4)).unwrap();
        let mut buf = StagingBuffer::new(&obs, 2, None);
        let mut rng = SmallRng::seed_from_u64(0);
        buf.fill(&table, &mut rng).unwrap();
        let batch = buf.to_device(Device::Cpu);
        assert_ne!(batch.obs2.data_ptr(), buf.obs2.data_ptr());
        assert!(batch.obs2.equal(&buf.obs2));
    }

    /// On a GPU host: batches copied on the side stream equal their pinned host
    /// buffers, round after round (buffers refilled only after their copies). Run by
    /// the GPU script (`bench/gpu_prepare.sh`).
    #[test]
    #[ignore = "needs a CUDA device: run with --ignored on a GPU host"]
    fn copy_stream_batches_match_their_buffers() {
        assert!(tch::Cuda::is_available(), "this test needs a CUDA device");
        let device = Device::Cuda(0);
        let obs = ObsSpec {
            shape: vec![4, 84, 84],
            dtype: DType::U8,
        };
        let row = obs.row_bytes();
        let table = Arc::new(
            Table::new(&ReplayConfig {
                capacity: 2000,
                shards: 2,
                obs_row_bytes: row,
                stack: 1,
                obs_rows_per_item: 2.0,
                limiter: RateLimiterConfig::sample_to_insert_ratio(1e-9, 1, 1e18, 1).unwrap(),
                priority: None,
            })
            .unwrap(),
        );
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
        let cfg = SamplerConfig {
            depth: 4,
            seed: 0,
            fail_after: None,
        };
        let p =
            Prefetcher::spawn_on_copy_stream(Arc::clone(&table), &obs, 64, device, &stream, cfg)
                .unwrap();
        let mut used = Vec::new();
        for _ in 0..40 {
            let buf = p.ready.recv().unwrap();
            {
                let batch = buf.to_device(device);
                assert_eq!(batch.obs2.device(), device);
                for (on_device, host) in [
                    (&batch.obs2, &buf.obs2),
                    (&batch.actions, &buf.actions),
                    (&batch.rewards, &buf.rewards),
                    (&batch.discounts, &buf.discounts),
                ] {
                    assert!(on_device.to_device(Device::Cpu).equal(host));
                }
            }
            p.recycle(&mut used, buf);
        }
        table.close();
        drop(used);
        p.join().unwrap();
    }
}
