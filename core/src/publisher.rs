//! Publishing parameters to actors without making the learner thread wait, or its
//! compute stream.
//!
//! On the CPU the learner copies its parameters into the [`ParamsCell`] directly (one
//! copy, nothing to wait for). On a GPU the copy to the host waits for the device, so
//! the learner hands a device-side snapshot to a publisher thread instead, through a
//! [`LatestOnly`] hand-off: while the thread is busy, a newer snapshot replaces the one
//! waiting (the next one is newer still), and nothing ever queues.
//!
//! The snapshot is taken on the compute stream (it must see the finished update), and
//! the learner records an event after it. The publisher thread makes a stream of its
//! own ([`CopyStream`]) wait for that event, copies the snapshot into pinned host memory
//! there, and waits for the copy on its own thread; the snapshot lives until its copy
//! lands. The compute stream never waits for the publisher: updates queue on behind the
//! snapshot while its copy runs beside them. Where no side stream or event can be made,
//! the thread copies through PyTorch's default stream, as it did before.
//!
//! One pinned buffer, not two: the thread turns the copy into the published vector
//! before it queues the next copy, so a second buffer would only overlap that host copy
//! with the next device copy.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, TrySendError};
use millrace_proto::{Params, ParamsCell};
use tch::{Device, Kind, Tensor};

use crate::cuda::{CopyStream, CudaEvent};
use crate::dqn::Dqn;

/// A one-place hand-off where a new value replaces the one still waiting.
#[derive(Debug)]
pub struct LatestOnly<T> {
    tx: Sender<T>,
    /// The queue's other end, to take back a value still waiting.
    stale: Receiver<T>,
}

impl<T> LatestOnly<T> {
    /// The sending side, and the receiving side for the consumer.
    pub fn new() -> (Self, Receiver<T>) {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let stale = rx.clone();
        (Self { tx, stale }, rx)
    }

    /// Offers `value`, replacing one that is still waiting; returns the one replaced.
    pub fn offer(&self, value: T) -> Option<T> {
        match self.tx.try_send(value) {
            Ok(()) | Err(TrySendError::Disconnected(_)) => None,
            Err(TrySendError::Full(value)) => {
                let replaced = self.stale.try_recv().ok();
                // The consumer may have taken the old one meanwhile: either way there
                // is room now, and only this side sends.
                let _ = self.tx.try_send(value);
                replaced
            }
        }
    }
}

/// A parameter snapshot on its way to actors: still on the device.
#[derive(Debug)]
struct Snapshot {
    version: u64,
    env_steps: u64,
    updates: u64,
    population: usize,
    online: Tensor,
    /// Recorded on the compute stream after the snapshot, where a side stream copies it.
    taken: Option<CudaEvent>,
}

/// The learner's side of the side stream: events to record after each snapshot, made
/// once and handed back after use (by the publisher thread, or by `offer` for a
/// snapshot a newer one replaced).
#[derive(Debug)]
struct SideEvents {
    stream: Arc<CopyStream>,
    spare: Receiver<CudaEvent>,
    give_back: Sender<CudaEvent>,
    /// Cleared by the thread if the side stream fails: it copies without it from then.
    working: Arc<AtomicBool>,
}

impl SideEvents {
    /// An event recorded after the work queued so far on the compute stream (the
    /// snapshot), or `None` if none can be: the thread then copies without one.
    fn after_snapshot(&self) -> Option<CudaEvent> {
        if !self.working.load(Ordering::Relaxed) {
            return None;
        }
        let event = match self.spare.try_recv() {
            Ok(event) => event,
            Err(_) => self.stream.event().ok()?,
        };
        event.record_on_compute_stream().ok()?;
        Some(event)
    }
}

/// The publisher thread's way off the device: its own stream, the event after each
/// copy, one pinned buffer (reused while the parameters keep their size).
struct OffDevice {
    stream: Arc<CopyStream>,
    copied: CudaEvent,
    device: Device,
    pinned: Option<Tensor>,
    spent: Sender<CudaEvent>,
    working: Arc<AtomicBool>,
}

/// The side stream failed for a snapshot (before its copy, or not knowing whether the
/// copy ran).
struct SideFailure {
    error: String,
    /// The copy may still be reading the snapshot: it must never be freed.
    copy_may_run: bool,
}

impl SideFailure {
    fn before_the_copy(error: impl ToString) -> Self {
        Self {
            error: error.to_string(),
            copy_may_run: false,
        }
    }
}

impl OffDevice {
    /// The snapshot's values, copied on the side stream once the compute stream has
    /// passed `taken`.
    fn copy(&mut self, online: &Tensor, taken: &CudaEvent) -> Result<Vec<f32>, SideFailure> {
        let numel = online.numel();
        if online.kind() != Kind::Float || !online.is_contiguous() {
            return through_default_stream(online).map_err(SideFailure::before_the_copy);
        }
        let pinned = match self.pinned.take() {
            Some(p) if p.numel() == numel => p,
            _ => crate::prefetch::host_zeros(&[numel as i64], Kind::Float, Some(self.device)),
        };
        let queued = taken.copy_stream_waits().and_then(|()| {
            // SAFETY: `online` is a contiguous float tensor on this stream's device,
            // written by work the stream now waits for (`taken`); `pinned` is page-locked
            // host memory of the same size; both live, and nothing else touches
            // `pinned`, until the copy is waited for below (or, if that fails, forever).
            unsafe {
                self.stream
                    .copy_to_host(pinned.data_ptr(), online.data_ptr(), numel * 4)
            }
        });
        if let Err(e) = queued {
            self.pinned = Some(pinned);
            return Err(SideFailure::before_the_copy(e));
        }
        let landed = self
            .copied
            .record_on_copy_stream()
            .and_then(|()| self.copied.synchronize());
        if let Err(e) = landed {
            if self.stream.synchronize().is_ok() {
                // Landed after all (the stream is drained): nothing reads either now.
                self.pinned = Some(pinned);
                return Err(SideFailure::before_the_copy(e));
            }
            // Not known to have landed: the buffer is never freed or reused.
            std::mem::forget(pinned);
            return Err(SideFailure {
                error: e.to_string(),
                copy_may_run: true,
            });
        }
        let data = Vec::<f32>::try_from(&pinned);
        self.pinned = Some(pinned);
        data.map_err(SideFailure::before_the_copy)
    }
}

/// The snapshot's values through PyTorch's default stream (the CPU, or no side stream).
fn through_default_stream(online: &Tensor) -> Result<Vec<f32>, String> {
    let host = online.to_device(Device::Cpu).contiguous().view([-1]);
    Vec::<f32>::try_from(&host).map_err(|e| e.to_string())
}

/// Publishes the learner's parameters into a [`ParamsCell`] (see the module docs).
#[derive(Debug)]
pub struct Publisher {
    params: Arc<ParamsCell>,
    snapshots: Option<LatestOnly<Snapshot>>,
    /// Publish even CPU parameters through the thread (tests of the hand-off).
    always_via_thread: bool,
    /// On a GPU with a side stream: events for the learner to record.
    side: Option<SideEvents>,
    handle: Option<JoinHandle<()>>,
}

impl Publisher {
    /// Starts the publisher thread for a learner on `device`. Like the prefetcher, it
    /// is started by the wiring, outside the learner thread (whose core it should not
    /// share).
    pub fn spawn(params: Arc<ParamsCell>, device: Device) -> std::io::Result<Self> {
        Self::spawn_with(params, device, false)
    }

    fn spawn_with(
        params: Arc<ParamsCell>,
        device: Device,
        always_via_thread: bool,
    ) -> std::io::Result<Self> {
        let (snapshots, pending) = LatestOnly::<Snapshot>::new();
        let (spent, spare) = crossbeam_channel::bounded(4);
        let working = Arc::new(AtomicBool::new(true));
        let off_device = match device {
            Device::Cuda(i) => match CopyStream::new(i).and_then(|s| Ok((s.event()?, s))) {
                Ok((copied, stream)) => Some(OffDevice {
                    stream,
                    copied,
                    device,
                    pinned: None,
                    spent: spent.clone(),
                    working: Arc::clone(&working),
                }),
                Err(e) => {
                    tracing::warn!(
                        "parameters are published through PyTorch's default stream: no side stream ({e})"
                    );
                    None
                }
            },
            _ => None,
        };
        let side = off_device.as_ref().map(|o| SideEvents {
            stream: Arc::clone(&o.stream),
            spare,
            give_back: spent,
            working,
        });
        let cell = Arc::clone(&params);
        let handle = std::thread::Builder::new()
            .name("publish".into())
            .spawn(move || publish_loop(&pending, off_device, &cell))?;
        Ok(Self {
            params,
            snapshots: Some(snapshots),
            always_via_thread,
            side,
            handle: Some(handle),
        })
    }

    /// The newest version published.
    pub fn version(&self) -> u64 {
        self.params.version()
    }

    /// `Err` with its panic message if the publisher thread has died (it only ends by
    /// itself on a panic: actors would then never see new parameters).
    pub fn check(&mut self) -> Result<(), PublisherDied> {
        if !self.handle.as_ref().is_some_and(JoinHandle::is_finished) {
            return Ok(());
        }
        match self.handle.take().map(millrace_proto::panics::joined) {
            Some(Err(p)) => Err(PublisherDied::Panicked(p)),
            _ => Err(PublisherDied::Ended),
        }
    }

    /// Publishes `dqn`'s online parameters as `version`: on the CPU directly, from a GPU
    /// through the publisher thread.
    pub fn offer(&self, version: u64, env_steps: u64, dqn: &Dqn) {
        if dqn.device() == tch::Device::Cpu && !self.always_via_thread {
            self.params.publish(dqn.params(version, env_steps));
        } else if let Some(tx) = &self.snapshots {
            let online = dqn.online_snapshot();
            let taken = self.side.as_ref().and_then(SideEvents::after_snapshot);
            let replaced = tx.offer(Snapshot {
                version,
                env_steps,
                updates: dqn.updates(),
                population: dqn.spec().population,
                online,
                taken,
            });
            // A snapshot replaced before the thread took it: its event is used again.
            if let (Some(side), Some(taken)) = (&self.side, replaced.and_then(|r| r.taken)) {
                let _ = side.give_back.try_send(taken);
            }
        }
    }
}

/// The publisher thread: each snapshot off the device and into the cell, until the
/// learner's side hangs up.
fn publish_loop(
    pending: &Receiver<Snapshot>,
    mut off_device: Option<OffDevice>,
    cell: &ParamsCell,
) {
    for s in pending {
        let Snapshot {
            version,
            env_steps,
            updates,
            population,
            online,
            taken,
        } = s;
        let side = match (&mut off_device, &taken) {
            (Some(off), Some(event)) => Some(off.copy(&online, event)),
            _ => None,
        };
        let data = match side {
            None => through_default_stream(&online),
            Some(Ok(data)) => Ok(data),
            Some(Err(failure)) => {
                tracing::warn!(
                    "the publisher's side stream failed ({}): parameters go through PyTorch's default stream from now on",
                    failure.error
                );
                if let Some(off) = off_device.take() {
                    off.working.store(false, Ordering::Relaxed);
                    if failure.copy_may_run {
                        // A copy that may still read the snapshot, on a stream that may
                        // still run it: neither is ever freed.
                        std::mem::forget(off);
                        std::mem::forget(online.shallow_clone());
                    }
                }
                through_default_stream(&online)
            }
        };
        if let (Some(off), Some(event)) = (&off_device, taken) {
            // Back to the learner's side for a later snapshot (dropped if it has four).
            let _ = off.spent.try_send(event);
        }
        match data {
            Ok(data) => cell.publish(Params {
                version,
                env_steps,
                updates,
                population,
                data,
            }),
            Err(e) => tracing::error!("cannot publish parameters: {e}"),
        }
    }
}

/// The publisher thread ended (it only ends by itself on a panic): actors would never
/// see new parameters ([`Publisher::check`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PublisherDied {
    #[error("the publisher thread {0}")]
    Panicked(millrace_proto::panics::Panicked),
    #[error("the publisher thread ended")]
    Ended,
}

impl Drop for Publisher {
    /// Publishes what is pending, then stops the thread.
    fn drop(&mut self) {
        drop(self.snapshots.take());
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dqn::DqnConfig;
    use millrace_proto::{DType, NetworkSpec, ObsSpec};

    #[test]
    fn a_newer_value_replaces_the_one_waiting() {
        let (tx, rx) = LatestOnly::new();
        assert_eq!(tx.offer(1), None);
        assert_eq!(tx.offer(2), Some(1), "1 was still waiting");
        assert_eq!(tx.offer(3), Some(2));
        assert_eq!(rx.try_recv(), Ok(3));
        assert!(rx.try_recv().is_err(), "nothing queued behind it");
        assert_eq!(tx.offer(4), None);
        assert_eq!(rx.try_recv(), Ok(4));
    }

    #[test]
    fn the_publisher_thread_never_loses_the_newest_version() {
        let dqn = mlp(Device::Cpu);
        let cell = Arc::new(ParamsCell::new(Params::of_one(0, Vec::new())));
        let publisher = Publisher::spawn_with(Arc::clone(&cell), Device::Cpu, true).unwrap();
        for v in 1..=200 {
            publisher.offer(v, v * 10, &dqn);
        }
        drop(publisher);
        let latest = cell.latest();
        assert_eq!((latest.version, latest.env_steps), (200, 2000));
        assert_eq!(latest.data, dqn.online_params());
    }

    fn mlp(device: Device) -> Dqn {
        let obs = ObsSpec {
            shape: vec![3],
            dtype: DType::F32,
        };
        let spec = NetworkSpec::mlp(&obs, &[8], 2, 1).unwrap();
        Dqn::new(spec, DqnConfig::default(), device, 0)
    }

    #[test]
    fn without_a_side_stream_the_thread_publishes_through_the_default_stream() {
        // On a host without CUDA, a GPU publisher cannot make its stream: it says so and
        // copies as before (here from CPU parameters, through the thread).
        if tch::Cuda::is_available() {
            eprintln!("skipped: this host has a GPU (the GPU test covers the side stream)");
            return;
        }
        let dqn = mlp(Device::Cpu);
        let cell = Arc::new(ParamsCell::new(Params::of_one(0, Vec::new())));
        let publisher = Publisher::spawn_with(Arc::clone(&cell), Device::Cuda(0), true).unwrap();
        assert!(publisher.side.is_none(), "no side stream without CUDA");
        publisher.offer(7, 70, &dqn);
        drop(publisher);
        assert_eq!(cell.latest().version, 7);
        assert_eq!(cell.latest().data, dqn.online_params());
    }

    #[test]
    #[ignore = "needs a CUDA device: run with --ignored on a GPU host"]
    fn from_a_gpu_each_snapshot_is_copied_on_the_side_stream_after_its_update() {
        let device = Device::Cuda(0);
        let mut dqn = mlp(device);
        let cell = Arc::new(ParamsCell::new(Params::of_one(0, Vec::new())));
        let publisher = Publisher::spawn(Arc::clone(&cell), device).unwrap();
        assert!(publisher.side.is_some(), "a side stream on a GPU");
        let obs = ObsSpec {
            shape: vec![3],
            dtype: DType::F32,
        };
        let batch = crate::ceiling::random_batch(&obs, 2, 64, device);
        for v in 1..=100 {
            // Updates queue on behind each snapshot; its copy must still see the
            // parameters of the moment it was taken (the last one is checked below).
            dqn.update(&batch);
            publisher.offer(v, v * 10, &dqn);
        }
        let want = dqn.online_params();
        drop(publisher);
        let latest = cell.latest();
        assert_eq!((latest.version, latest.env_steps), (100, 1000));
        assert_eq!(latest.data, want);
    }
}
