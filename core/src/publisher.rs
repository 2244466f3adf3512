//! Publishing parameters to actors without making the learner thread wait.
//!
//! On the CPU the learner copies its parameters into the [`ParamsCell`] directly (one
//! copy, nothing to wait for). On a GPU the copy to the host waits for the device, so
//! the learner hands a device-side snapshot to a publisher thread instead, through a
//! [`LatestOnly`] hand-off: while the thread is busy, a newer snapshot replaces the one
//! waiting (the next one is newer still), and nothing ever queues.

use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, TrySendError};
use millrace_proto::{Params, ParamsCell};

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

    /// Offers `value`, replacing one that is still waiting; returns whether one was
    /// replaced.
    pub fn offer(&self, value: T) -> bool {
        match self.tx.try_send(value) {
            Ok(()) | Err(TrySendError::Disconnected(_)) => false,
            Err(TrySendError::Full(value)) => {
                let replaced = self.stale.try_recv().is_ok();
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
    online: tch::Tensor,
}

/// Publishes the learner's parameters into a [`ParamsCell`] (see the module docs).
#[derive(Debug)]
pub struct Publisher {
    params: Arc<ParamsCell>,
    snapshots: Option<LatestOnly<Snapshot>>,
    /// Publish even CPU parameters through the thread (tests of the hand-off).
    always_via_thread: bool,
    handle: Option<JoinHandle<()>>,
}

impl Publisher {
    /// Starts the publisher thread. Like the prefetcher, it is started by the wiring,
    /// outside the learner thread (whose core it should not share).
    pub fn spawn(params: Arc<ParamsCell>) -> std::io::Result<Self> {
        Self::spawn_with(params, false)
    }

    fn spawn_with(params: Arc<ParamsCell>, always_via_thread: bool) -> std::io::Result<Self> {
        let (snapshots, pending) = LatestOnly::<Snapshot>::new();
        let cell = Arc::clone(&params);
        let handle = std::thread::Builder::new()
            .name("publish".into())
            .spawn(move || {
                for s in pending {
                    let host = s.online.to_device(tch::Device::Cpu).contiguous().view([-1]);
                    match Vec::<f32>::try_from(&host) {
                        Ok(data) => cell.publish(Params {
                            version: s.version,
                            env_steps: s.env_steps,
                            updates: s.updates,
                            population: s.population,
                            data,
                        }),
                        Err(e) => tracing::error!("cannot publish parameters: {e}"),
                    }
                }
            })?;
        Ok(Self {
            params,
            snapshots: Some(snapshots),
            always_via_thread,
            handle: Some(handle),
        })
    }

    /// The newest version published.
    pub fn version(&self) -> u64 {
        self.params.version()
    }

    /// `Err` with its panic message if the publisher thread has died (it only ends by
    /// itself on a panic: actors would then never see new parameters).
    pub fn check(&mut self) -> Result<(), String> {
        if !self.handle.as_ref().is_some_and(JoinHandle::is_finished) {
            return Ok(());
        }
        match self.handle.take().map(JoinHandle::join) {
            Some(Err(p)) => Err(format!(
                "the publisher thread panicked: {}",
                millrace_proto::panics::panic_message(&*p)
            )),
            _ => Err("the publisher thread ended".into()),
        }
    }

    /// Publishes `dqn`'s online parameters as `version`: on the CPU directly, from a GPU
    /// through the publisher thread.
    pub fn offer(&self, version: u64, env_steps: u64, dqn: &Dqn) {
        if dqn.device() == tch::Device::Cpu && !self.always_via_thread {
            self.params.publish(dqn.params(version, env_steps));
        } else if let Some(tx) = &self.snapshots {
            tx.offer(Snapshot {
                version,
                env_steps,
                updates: dqn.updates(),
                population: dqn.spec().population,
                online: dqn.online_snapshot(),
            });
        }
    }
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
        assert!(!tx.offer(1));
        assert!(tx.offer(2), "1 was still waiting");
        assert!(tx.offer(3));
        assert_eq!(rx.try_recv(), Ok(3));
        assert!(rx.try_recv().is_err(), "nothing queued behind it");
        assert!(!tx.offer(4));
        assert_eq!(rx.try_recv(), Ok(4));
    }

    #[test]
    fn the_publisher_thread_never_loses_the_newest_version() {
        let obs = ObsSpec {
            shape: vec![3],
            dtype: DType::F32,
        };
        let spec = NetworkSpec::mlp(&obs, &[8], 2, 1).unwrap();
        let dqn = Dqn::new(spec, DqnConfig::default(), tch::Device::Cpu, 0);
        let cell = Arc::new(ParamsCell::new(Params::of_one(0, Vec::new())));
        let publisher = Publisher::spawn_with(Arc::clone(&cell), true).unwrap();
        for v in 1..=200 {
            publisher.offer(v, v * 10, &dqn);
        }
        drop(publisher);
        let latest = cell.latest();
        assert_eq!((latest.version, latest.env_steps), (200, 2000));
        assert_eq!(latest.data, dqn.online_params());
    }
}
