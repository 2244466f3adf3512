//! A batch's device-side twin, filled from pinned host memory on a side
//! [`CopyStream`], so that the copy of the next batch overlaps the update reading this
//! one instead of queueing behind it on the compute stream (`--copy-stream`).
//!
//! Two events order the two streams, and no host thread waits on the device except to
//! refill host memory a copy may still be reading:
//! - `copied`, recorded on the copy stream after the copies: the compute stream waits
//!   for it before the update reads the twin ([`DeviceCopy::batch`]), and the host
//!   waits for it before refilling the pinned memory ([`DeviceCopy::wait_copied`]);
//! - `used`, recorded on the compute stream once the update that read the twin is
//!   queued ([`DeviceCopy::mark_used`]): the next copy into the twin waits for it.
//!
//! Both the single agent's prefetch ring ([`crate::prefetch`]) and a population's
//! stacked batches ([`crate::population_staging`]) use it.

use std::sync::Arc;

use tch::{Device, Tensor};

use crate::cuda::{CopyStream, CopyStreamError, CudaEvent};
use crate::dqn::Batch;

/// A batch's host tensors, in [`Batch`]'s order: obs2, actions, rewards, discounts,
/// weights.
pub(crate) type HostTensors<'a> = [&'a Tensor; 5];

/// Device buffers shaped as one set of host tensors, and their two events.
///
/// Dropping it waits for its copy: neither PyTorch's pinned-host allocator nor its
/// device allocator knows about copies on the side stream, so the memory must not go
/// back to them while one is in flight. Declare it before the host tensors it copies
/// from, so that it is dropped first.
#[derive(Debug)]
pub(crate) struct DeviceCopy {
    /// Recorded on the copy stream after the copies: the batch is on the device.
    copied: CudaEvent,
    /// Recorded on the compute stream after the update: the device buffers are free.
    used: CudaEvent,
    stream: Arc<CopyStream>,
    /// In [`HostTensors`]' order.
    tensors: [Tensor; 5],
}

impl DeviceCopy {
    /// Device buffers on `device` (the stream's) shaped as `host`.
    pub(crate) fn new(
        host: HostTensors<'_>,
        device: Device,
        stream: &Arc<CopyStream>,
    ) -> Result<Self, CopyStreamError> {
        let twin = Self {
            copied: stream.event()?,
            used: stream.event()?,
            stream: Arc::clone(stream),
            tensors: host.map(|t| Tensor::empty(t.size(), (t.kind(), device))),
        };
        // The buffers may be cached blocks that work already queued on the compute
        // stream still uses: the first copy into them waits for that work too.
        twin.used.record_on_compute_stream()?;
        Ok(twin)
    }

    /// Waits on the host until the last copy has left the pinned memory, so that it may
    /// be refilled (at once if no copy is pending).
    pub(crate) fn wait_copied(&self) -> Result<(), CopyStreamError> {
        self.copied.synchronize()
    }

    /// Queues the copies of `host` into the twin on the copy stream, behind the
    /// compute stream's last use of the twin ([`DeviceCopy::mark_used`]).
    ///
    /// # Safety
    /// `host` must be the pinned host tensors this twin was made from (same shapes and
    /// kinds), and nothing may write them until [`DeviceCopy::wait_copied`] has
    /// returned.
    pub(crate) unsafe fn upload(&self, host: HostTensors<'_>) -> Result<(), CopyStreamError> {
        self.used.copy_stream_waits()?;
        for (dst, src) in self.tensors.iter().zip(host) {
            debug_assert_eq!((dst.size(), dst.kind()), (src.size(), src.kind()));
            let bytes = src.numel() * src.kind().elt_size_in_bytes();
            // SAFETY: `src` is pinned host memory of `bytes` bytes (per the function
            // contract) and `dst` a device tensor of the same shape and kind on the
            // stream's device, which nothing reads before `copied` (the compute stream
            // waits for it in `batch`).
            unsafe { self.stream.copy(dst.data_ptr(), src.data_ptr(), bytes)? };
        }
        self.copied.record_on_copy_stream()
    }

    /// The twin as a batch for the compute stream, which waits (on the device) for the
    /// copies first. Should that wait fail, waiting on the host is slower but correct.
    pub(crate) fn batch(&self, weighted: bool) -> Batch {
        if let Err(e) = self.copied.compute_stream_waits() {
            tracing::error!("copy stream: {e}; waiting on the host instead");
            let _ = self.copied.synchronize();
        }
        let [obs2, actions, rewards, discounts, weights] = &self.tensors;
        Batch {
            obs2: obs2.shallow_clone(),
            actions: actions.shallow_clone(),
            rewards: rewards.shallow_clone(),
            discounts: discounts.shallow_clone(),
            weights: weighted.then(|| weights.shallow_clone()),
        }
    }

    /// Marks the twin free once the compute stream's work queued so far (the update
    /// that read it) is done: the next [`DeviceCopy::upload`] waits for that point.
    pub(crate) fn mark_used(&self) -> Result<(), CopyStreamError> {
        self.used.record_on_compute_stream()
    }
}

impl Drop for DeviceCopy {
    fn drop(&mut self) {
        if let Err(e) = self.copied.synchronize() {
            tracing::error!("copy stream: {e}");
        }
    }
}
