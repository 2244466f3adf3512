//! The learner thread: takes ready batches, updates, publishes parameters, reports, and
//! checkpoints. It owns the device and every tensor on it.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, Sender, TrySendError};
use millrace_actor::ActorControl;
use millrace_proto::{EnvSpec, Params};
use millrace_replay::Table;

use crate::checkpoint::{self, CheckpointError, CheckpointMeta};
use crate::dqn::{Dqn, UpdateStats};
use crate::prefetch::Prefetcher;
use millrace_actor::ParamsSlot;

/// The learner thread's own settings.
#[derive(Clone, Debug)]
pub struct LoopConfig {
    /// Publish parameters to actors every this many updates.
    pub publish_every: u64,
    /// Read device statistics and report this often (each read is one host sync).
    pub report_every: Duration,
    /// Also checkpoint this often (a final checkpoint is always written on stop).
    pub checkpoint_every: Option<Duration>,
}

/// Requests to the learner thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Write a final checkpoint and stop.
    Stop,
}

/// Where the learner thread's wall time went, in seconds since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StallTimes {
    pub compute: f64,
    pub wait_data: f64,
    pub host_to_device: f64,
    pub publish: f64,
    pub metrics: f64,
    pub checkpoint: f64,
    pub total: f64,
}

impl StallTimes {
    /// Fraction of wall time spent computing updates.
    pub fn duty_cycle(&self) -> f64 {
        if self.total > 0.0 {
            self.compute / self.total
        } else {
            0.0
        }
    }
}

/// A periodic report from the learner thread.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LearnerReport {
    pub updates: u64,
    pub params_version: u64,
    pub stats: UpdateStats,
    pub stalls: StallTimes,
    /// Mean over reported batches of (current version − oldest version in the batch).
    pub staleness: f64,
}

/// What the checkpoint needs from outside the learner thread.
#[derive(Clone, Debug)]
pub struct CheckpointContext {
    pub dir: PathBuf,
    pub env: EnvSpec,
    pub seed: u64,
    pub control: Arc<ActorControl>,
    pub table: Arc<Table>,
}

impl CheckpointContext {
    fn save(&self, dqn: &Dqn, params_version: u64) -> Result<PathBuf, CheckpointError> {
        let state = dqn.state();
        let stats = self.table.stats();
        let meta = CheckpointMeta {
            format: checkpoint::FORMAT_VERSION,
            model_file: String::new(),
            env: self.env.clone(),
            network: dqn.spec().clone(),
            updates: state.updates,
            adam_step: state.adam_step,
            env_steps: self.control.env_steps.load(Ordering::Relaxed),
            params_version,
            replay_inserts: stats.inserted,
            replay_samples: stats.sampled,
            replay_file: None,
            seed: self.seed,
        };
        checkpoint::save(&self.dir, &state, Some(&self.table), meta)
    }
}

/// The learner thread's result.
#[derive(Debug)]
pub struct LoopOutcome {
    pub dqn: Dqn,
    pub last: LearnerReport,
    pub checkpoint: Result<PathBuf, CheckpointError>,
}

/// A parameter snapshot on its way to actors: still on the device.
#[derive(Debug)]
struct Snapshot {
    version: u64,
    env_steps: u64,
    population: usize,
    online: tch::Tensor,
}

/// Publishes parameter snapshots to actors from its own thread: the copy to the host
/// (which waits for the device) happens there, so the learner thread never synchronises
/// with the device to publish. Latest-only: while it is busy, newer snapshots are
/// skipped (the next one is newer still). Like the prefetcher, it is started by the
/// wiring, outside the learner thread (whose core it should not share).
#[derive(Debug)]
pub struct Publisher {
    params: Arc<ParamsSlot>,
    snapshots: Option<Sender<Snapshot>>,
    /// The queue's other end, to replace a snapshot still waiting with a newer one.
    stale: Receiver<Snapshot>,
    handle: Option<JoinHandle<()>>,
}

impl Publisher {
    pub fn spawn(params: Arc<ParamsSlot>) -> std::io::Result<Self> {
        let (snapshots, pending) = crossbeam_channel::bounded::<Snapshot>(1);
        let stale = pending.clone();
        let slot = Arc::clone(&params);
        let handle = std::thread::Builder::new()
            .name("publish".into())
            .spawn(move || {
                for s in pending {
                    let host = s.online.to_device(tch::Device::Cpu).contiguous().view([-1]);
                    match Vec::<f32>::try_from(&host) {
                        Ok(data) => slot.publish(Params {
                            version: s.version,
                            env_steps: s.env_steps,
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
            stale,
            handle: Some(handle),
        })
    }

    /// The newest version published.
    fn version(&self) -> u64 {
        self.params.version()
    }

    /// Publishes `dqn`'s online parameters as `version`: on the CPU directly (one copy,
    /// no device to wait for), from a GPU through the publisher thread.
    fn offer(&self, version: u64, env_steps: u64, dqn: &Dqn) {
        let population = dqn.spec().population;
        if dqn.device() == tch::Device::Cpu {
            self.params.publish(Params {
                version,
                env_steps,
                population,
                data: dqn.online_params(),
            });
        } else if let Some(tx) = &self.snapshots {
            let snapshot = Snapshot {
                version,
                env_steps,
                population,
                online: dqn.online_snapshot(),
            };
            // Latest-only: a snapshot still waiting is replaced by this newer one.
            if let Err(TrySendError::Full(snapshot)) = tx.try_send(snapshot) {
                let _ = self.stale.try_recv();
                let _ = tx.try_send(snapshot);
            }
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

/// Runs updates back to back until [`Command::Stop`] or until the prefetcher ends.
#[allow(clippy::too_many_arguments)]
pub fn run(
    mut dqn: Dqn,
    config: &LoopConfig,
    prefetcher: &Prefetcher,
    publisher: &Publisher,
    commands: &Receiver<Command>,
    reports: &Sender<LearnerReport>,
    ckpt: &CheckpointContext,
) -> LoopOutcome {
    let device = dqn.device();
    let start = Instant::now();
    let mut t = StallTimes::default();
    let mut version = publisher.version();
    let mut last_report = Instant::now();
    let mut last_ckpt = Instant::now();
    let mut staleness_sum = 0.0;
    let mut batches = 0u64;
    let mut last = LearnerReport::default();
    let mut used = Vec::new();

    loop {
        let t0 = Instant::now();
        let slot = select! {
            recv(prefetcher.ready) -> slot => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
            recv(commands) -> _ => break,
        };
        let t1 = Instant::now();
        let batch = slot.to_device(device);
        let t2 = Instant::now();
        dqn.update(&batch);
        let t3 = Instant::now();
        drop(batch);
        staleness_sum += version.saturating_sub(slot.oldest_version) as f64;
        batches += 1;
        // On a GPU, recycling waits for the device once per half ring: that wait is
        // queued update work, so it counts as compute.
        t.compute += prefetcher.recycle(&mut used, slot).as_secs_f64();
        t.wait_data += (t1 - t0).as_secs_f64();
        t.host_to_device += (t2 - t1).as_secs_f64();
        t.compute += (t3 - t2).as_secs_f64();

        if dqn.updates().is_multiple_of(config.publish_every.max(1)) {
            let p0 = Instant::now();
            version += 1;
            publisher.offer(
                version,
                ckpt.control.env_steps.load(Ordering::Relaxed),
                &dqn,
            );
            t.publish += p0.elapsed().as_secs_f64();
        }
        if last_report.elapsed() >= config.report_every {
            let m0 = Instant::now();
            // A report's split must add up: total as of now, like its parts.
            t.total = start.elapsed().as_secs_f64();
            last = LearnerReport {
                updates: dqn.updates(),
                params_version: version,
                stats: dqn.take_stats(),
                stalls: t,
                staleness: staleness_sum / batches.max(1) as f64,
            };
            (staleness_sum, batches) = (0.0, 0);
            let _ = reports.try_send(last);
            last_report = Instant::now();
            t.metrics += m0.elapsed().as_secs_f64();
        }
        if let Some(every) = config.checkpoint_every {
            if last_ckpt.elapsed() >= every {
                let c0 = Instant::now();
                if let Err(e) = ckpt.save(&dqn, version) {
                    tracing::warn!("periodic checkpoint failed: {e}");
                }
                last_ckpt = Instant::now();
                t.checkpoint += c0.elapsed().as_secs_f64();
            }
        }
        t.total = start.elapsed().as_secs_f64();
    }
    let c0 = Instant::now();
    let checkpoint = ckpt.save(&dqn, version);
    t.checkpoint += c0.elapsed().as_secs_f64();
    t.total = start.elapsed().as_secs_f64();
    last.updates = dqn.updates();
    last.params_version = version;
    last.stalls = t;
    LoopOutcome {
        dqn,
        last,
        checkpoint,
    }
}
