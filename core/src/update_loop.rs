//! The learner thread: takes ready batches, updates, publishes parameters, reports, and
//! hands checkpoints to the writer. It owns the device and every tensor on it.
//!
//! It never synchronises with the device per update: statistics (the non-finite counts
//! among them) are read once per report. Whatever ends it (a stop command, the sampler
//! failing, a diverged loss, the device running out of memory, a panic) comes back as a
//! [`LoopOutcome`] whose `error` says which, with a final checkpoint attempted wherever
//! the state is still good.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, Sender};
use millrace_proto::StepCounter;

use crate::cuda::Stopwatch;
use crate::dqn::{Dqn, UpdateStats};
use crate::faults::{inject_oom, OomFault, OomSite};
use crate::handoff::{CheckpointSink, Finished, SaveJob};
use crate::memory::Footprint;
use crate::prefetch::{PrefetchError, Prefetcher, StagingBuffer};
use crate::priority_feedback::PriorityFeedback;
use crate::publisher::Publisher;
use crate::step::{LearnerStep, StepConfig};
use millrace_proto::durations::{opt_secs, secs};

/// The learner thread's own settings.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LoopConfig {
    /// Publish parameters to actors every this many updates.
    pub publish_every: u64,
    /// Read device statistics and report this often (each read is one host sync).
    #[serde(serialize_with = "secs")]
    pub report_every: Duration,
    /// Also checkpoint this often (a final checkpoint is always written on stop).
    #[serde(serialize_with = "opt_secs")]
    pub checkpoint_every: Option<Duration>,
    /// Stop the run after this many consecutive updates with a non-finite loss.
    pub max_nonfinite: u64,
    /// Copy batches to the GPU on a side stream (`--copy-stream`).
    pub copy_stream: bool,
}

impl LoopConfig {
    /// What the learner step needs of these settings (every driver's).
    pub fn step(&self) -> StepConfig {
        StepConfig {
            publish_every: self.publish_every,
            max_nonfinite: self.max_nonfinite,
        }
    }
}

/// How often the learner thread reads its statistics and reports (each read is one
/// host sync on a GPU).
pub const REPORT_EVERY: Duration = Duration::from_millis(500);

/// Requests to the learner thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Stop; write a final checkpoint if asked, marked finished with the given reason
    /// when the run is over for good.
    Stop {
        checkpoint: bool,
        run_finished: Option<Finished>,
    },
}

/// Where the learner thread's wall time went, in seconds since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StallTimes {
    pub compute: f64,
    pub wait_data: f64,
    pub host_to_device: f64,
    pub publish: f64,
    /// Handing TD errors to replay (priorities, poison checks): on its own thread in
    /// a threaded run, only the hand-over.
    pub priorities: f64,
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

    /// `x` as a fraction of the total.
    pub fn frac(&self, x: f64) -> f64 {
        if self.total > 0.0 {
            x / self.total
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
    /// The longest the learner thread spent handing over one checkpoint (seconds).
    pub checkpoint_stall_max: f64,
    pub checkpoints_submitted: u64,
    /// Updates skipped for a non-finite loss since the thread started.
    pub nonfinite_total: u64,
}

/// Why the learner thread failed.
#[derive(Debug, thiserror::Error)]
pub enum LearnerError {
    #[error("the sampler failed: {0}")]
    Sampler(#[from] PrefetchError),
    #[error(
        "{streak} consecutive updates had a non-finite loss ({skipped} skipped in all; \
         the limit is --max-nonfinite {limit}): the run diverged. The last good checkpoint \
         was kept; try a lower --lr or --max-grad-norm"
    )]
    Diverged {
        streak: u64,
        skipped: u64,
        limit: u64,
    },
    #[error("{0}")]
    OutOfMemory(String),
    #[error("panicked: {0}")]
    Panicked(String),
    #[error(transparent)]
    Publisher(#[from] crate::publisher::PublisherDied),
}

/// What the learner thread hands back (`E`: why a checkpoint was not written).
#[derive(Debug)]
pub struct LoopOutcome<E> {
    pub last: LearnerReport,
    /// Where the final checkpoint's result arrives, if one was submitted.
    pub final_checkpoint: Option<Receiver<Result<PathBuf, E>>>,
    pub error: Option<LearnerError>,
    /// The prefetcher, when its sampler may still be waiting in replay: join it once
    /// replay is closed (the learner thread does not wait for that, so that a failure
    /// here is seen at once).
    pub prefetcher: Option<Prefetcher>,
}

/// How the loop ended without an error.
enum LoopEnd {
    /// A command stopped it.
    Stopped(Command),
    /// The sampler's ring ended (replay closed, or the sampler failed).
    RingEnded,
}

/// The learner thread's parts, moved into it.
#[derive(Debug)]
pub struct LearnerParts {
    pub dqn: Dqn,
    pub prefetcher: Prefetcher,
    pub publisher: Publisher,
    pub steps: std::sync::Arc<StepCounter>,
    pub footprint: Footprint,
    /// Prioritized replay: the TD errors' way back into replay.
    pub feedback: Option<PriorityFeedback>,
    /// Panic after this many updates (tests of the shutdown path).
    pub panic_after: Option<u64>,
    /// Run out of memory at a site once this many updates are done (tests of that
    /// path).
    pub oom: Option<(OomFault, u64)>,
    /// The learner thread's signs of life, counted: one per update, and one per
    /// [`ALIVE_EVERY`] it waits for data (so `/livez` tells a wedged thread from one
    /// that waits for actors).
    pub alive: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

/// How often the learner thread shows it is alive while it waits for data.
pub const ALIVE_EVERY: Duration = Duration::from_secs(1);

/// Whether a panic message from libtorch is an allocation failure: the CPU allocator's,
/// CUDA's caching allocator's ("CUDA out of memory"), the runtime's ("CUDA error: out of
/// memory"), and cuBLAS's and cuDNN's failures to allocate their workspaces or handles.
pub fn is_out_of_memory(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("out of memory")
        || m.contains("can't allocate memory")
        || m.contains("not enough memory")
        || m.contains("cublas_status_alloc_failed")
        || m.contains("cudnn_status_alloc_failed")
        || m.contains("cudnn_status_not_enough_workspace")
        || m.contains("cusolver_status_alloc_failed")
}

/// What the copy timer needs of a stopwatch: a pair of CUDA events in the learner, a
/// fake in tests.
trait Watch {
    /// Marks the start on the compute stream; `false` if that failed.
    fn start(&self) -> bool;
    /// Marks the end.
    fn stop(&self) -> bool;
    /// Seconds between the marks once both are done on the device; `None` if not yet
    /// (never waits).
    fn elapsed_s(&self) -> Option<f64>;
}

impl Watch for Stopwatch {
    fn start(&self) -> bool {
        Stopwatch::start(self).is_ok()
    }

    fn stop(&self) -> bool {
        Stopwatch::stop(self).is_ok()
    }

    fn elapsed_s(&self) -> Option<f64> {
        Stopwatch::elapsed_s(self)
    }
}

/// Most copies timed and not yet collected. The learner collects after each wait for
/// the device (once per half ring: at most 128 updates), so this bound is only reached
/// if nothing ever waits; copies past it are not timed (their time stays in compute)
/// rather than held.
const MAX_PENDING_COPY_TIMES: usize = 256;

/// Timing of host-to-device copies on a GPU: events around each copy, read once the
/// device has caught up (when the learner waits for it anyway, once per half ring).
/// Never used with a side copy stream: the learner thread then queues no copies, and
/// never waits for the device.
struct CopyTimer<W: Watch = Stopwatch> {
    make: fn(usize) -> Option<W>,
    device: usize,
    free: Vec<W>,
    pending: std::collections::VecDeque<W>,
    /// Copies not timed because `pending` was full.
    untimed: u64,
}

impl CopyTimer {
    /// A timer for copies the learner thread queues to `device`: none on the CPU, with
    /// a side stream (`side_stream`), or without CUDA events.
    fn new(device: tch::Device, side_stream: bool) -> Option<Self> {
        let tch::Device::Cuda(i) = device else {
            return None;
        };
        if side_stream {
            return None;
        }
        match Stopwatch::new(i) {
            Ok(w) => Some(Self::with(i, w, |d| Stopwatch::new(d).ok())),
            Err(e) => {
                tracing::warn!("copy times are counted as compute: {e}");
                None
            }
        }
    }
}

impl<W: Watch> CopyTimer<W> {
    fn with(device: usize, first: W, make: fn(usize) -> Option<W>) -> Self {
        Self {
            make,
            device,
            free: vec![first],
            pending: std::collections::VecDeque::new(),
            untimed: 0,
        }
    }

    fn start(&mut self) -> Option<W> {
        if self.pending.len() >= MAX_PENDING_COPY_TIMES {
            self.untimed += 1;
            return None;
        }
        let w = match self.free.pop() {
            Some(w) => w,
            None => (self.make)(self.device)?,
        };
        if w.start() {
            Some(w)
        } else {
            self.free.push(w);
            None
        }
    }

    fn stop(&mut self, w: Option<W>) {
        if let Some(w) = w {
            if w.stop() {
                self.pending.push_back(w);
            } else {
                self.free.push(w);
            }
        }
    }

    /// Seconds of the copies completed (all of them, right after a device wait); those
    /// still running stay pending.
    fn collect(&mut self) -> f64 {
        let mut total = 0.0;
        for _ in 0..self.pending.len() {
            let Some(w) = self.pending.pop_front() else {
                break;
            };
            match w.elapsed_s() {
                Some(s) => {
                    total += s;
                    self.free.push(w);
                }
                None => self.pending.push_back(w),
            }
        }
        total
    }

    /// Stopwatches held (each two CUDA events).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.free.len() + self.pending.len()
    }
}

/// Runs the learner thread: updates back to back until [`Command::Stop`], the sampler
/// ending, or a failure.
pub fn run<W: CheckpointSink>(
    parts: LearnerParts,
    cfg: &LoopConfig,
    commands: &Receiver<Command>,
    reports: &Sender<LearnerReport>,
    writer: &W,
) -> LoopOutcome<W::Error> {
    let LearnerParts {
        dqn,
        prefetcher,
        mut publisher,
        steps,
        footprint,
        feedback,
        panic_after,
        oom,
        alive,
    } = parts;
    let mut step = LearnerStep::new(dqn, publisher.version(), cfg.step(), vec![feedback], oom);
    let mut state = LoopState::new(alive);
    let ended = catch_unwind(AssertUnwindSafe(|| {
        state.run(
            &mut step,
            cfg,
            &prefetcher,
            &mut publisher,
            commands,
            reports,
            writer,
            &steps,
            (panic_after, oom),
        )
    }));
    // The last rounds' priorities, before the final checkpoint copies replay. After a
    // device failure this may fail too: the run's own error is the one to keep.
    if let Err(panic) = catch_unwind(AssertUnwindSafe(|| step.finish_priorities())) {
        tracing::warn!(
            "the last priorities were not applied: {}",
            millrace_proto::panics::panic_message(&*panic)
        );
    }
    // Running out of device memory anywhere on the thread's path (the copy, the update,
    // the priorities' read-back, publishing, statistics) ends the same way: explained,
    // with a final checkpoint attempted.
    let (stop, mut error) = match ended {
        Ok(Ok(end)) => (Some(end), None),
        Ok(Err(e)) => (None, Some(e)),
        Err(panic) => {
            let msg = millrace_proto::panics::panic_message(&*panic);
            let e = if is_out_of_memory(&msg) {
                LearnerError::OutOfMemory(footprint.explain(&msg))
            } else {
                LearnerError::Panicked(msg)
            };
            (None, Some(e))
        }
    };
    // When the ring ended, the sampler has stopped: its own error explains why. Else it
    // may be waiting in replay, which only the coordinator closes: hand it back.
    let prefetcher = match stop {
        Some(LoopEnd::RingEnded) => {
            if let Err(e) = prefetcher.join() {
                error = Some(LearnerError::Sampler(e));
            }
            None
        }
        _ => Some(prefetcher),
    };
    drop(publisher);
    // A final checkpoint wherever the state is good: asked for, after the sampler failed,
    // or after running out of memory (the state is the one before the failed update, or
    // at worst one half-applied optimizer step: far better than nothing). Not after
    // divergence (the last good one stays) or a panic (the state may be half-updated).
    let (checkpoint, run_finished) = match (stop, &error) {
        (
            Some(LoopEnd::Stopped(Command::Stop {
                checkpoint,
                run_finished,
            })),
            None,
        ) => (checkpoint, run_finished),
        (Some(LoopEnd::RingEnded), None) => (true, None),
        (
            _,
            Some(
                LearnerError::Sampler(_)
                | LearnerError::OutOfMemory(_)
                | LearnerError::Publisher(_),
            ),
        ) => (true, None),
        _ => (false, None),
    };
    let final_checkpoint = checkpoint.then(|| {
        let c0 = Instant::now();
        // Copying the state to the host can itself fail (the device being gone): that
        // is the checkpoint's result, as a failed write would be.
        let job = catch_unwind(AssertUnwindSafe(|| state.job(&step, &steps, run_finished)));
        let rx = writer.submit_final(job.map_err(|panic| {
            millrace_proto::panics::Panicked(millrace_proto::panics::panic_message(&*panic))
        }));
        state.t.checkpoint += c0.elapsed().as_secs_f64();
        rx
    });
    state.t.total = state.start.elapsed().as_secs_f64();
    state.last.updates = step.updates();
    state.last.params_version = step.version();
    state.last.stalls = state.t;
    // Checkpoints and skipped updates since the last report count too.
    state.last.checkpoint_stall_max = state.checkpoint_stall_max;
    state.last.checkpoints_submitted = state.checkpoints_submitted;
    state.last.nonfinite_total = state.nonfinite_total;
    LoopOutcome {
        last: state.last,
        final_checkpoint,
        error,
        prefetcher,
    }
}

/// The learner thread's bookkeeping.
struct LoopState {
    start: Instant,
    t: StallTimes,
    last: LearnerReport,
    staleness_sum: f64,
    batches: u64,
    checkpoint_stall_max: f64,
    checkpoints_submitted: u64,
    nonfinite_total: u64,
    alive: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl LoopState {
    fn new(alive: std::sync::Arc<std::sync::atomic::AtomicU64>) -> Self {
        Self {
            alive,
            start: Instant::now(),
            t: StallTimes::default(),
            last: LearnerReport::default(),
            staleness_sum: 0.0,
            batches: 0,
            checkpoint_stall_max: 0.0,
            checkpoints_submitted: 0,
            nonfinite_total: 0,
        }
    }

    /// A checkpoint of the networks as they are now: one copy of their tensors to the
    /// host.
    fn job(
        &self,
        step: &LearnerStep,
        steps: &StepCounter,
        run_finished: Option<Finished>,
    ) -> SaveJob {
        SaveJob {
            state: step.dqn().state(),
            params_version: step.version(),
            env_steps: steps.get(),
            run_finished,
        }
    }

    /// The loop proper; returns what ended it.
    #[allow(clippy::too_many_arguments)]
    fn run<W: CheckpointSink>(
        &mut self,
        step: &mut LearnerStep,
        cfg: &LoopConfig,
        prefetcher: &Prefetcher,
        publisher: &mut Publisher,
        commands: &Receiver<Command>,
        reports: &Sender<LearnerReport>,
        writer: &W,
        steps: &StepCounter,
        (panic_after, oom): (Option<u64>, Option<(OomFault, u64)>),
    ) -> Result<LoopEnd, LearnerError> {
        let device = step.dqn().device();
        let mut last_report = Instant::now();
        let mut last_ckpt = Instant::now();
        let mut used: Vec<StagingBuffer> = Vec::new();
        let mut timer = CopyTimer::new(device, prefetcher.side_stream());
        loop {
            let t0 = Instant::now();
            let buf = loop {
                select! {
                    recv(prefetcher.ready) -> buf => match buf {
                        Ok(buf) => break buf,
                        Err(_) => {
                            return Ok(match commands.try_recv() {
                                Ok(cmd) => LoopEnd::Stopped(cmd),
                                Err(_) => LoopEnd::RingEnded,
                            })
                        }
                    },
                    recv(commands) -> cmd => {
                        return Ok(match cmd {
                            Ok(cmd) => LoopEnd::Stopped(cmd),
                            Err(_) => LoopEnd::RingEnded,
                        })
                    }
                    // Waiting for data (no actors, the rate limiter): alive all the same.
                    default(ALIVE_EVERY) => {
                        self.alive.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            };
            let t1 = Instant::now();
            let watch = timer.as_mut().and_then(CopyTimer::start);
            inject_oom(oom, step.updates(), OomSite::Copy);
            let batch = buf.to_device(device);
            if let Some(timer) = &mut timer {
                timer.stop(watch);
            }
            let t2 = Instant::now();
            if panic_after.is_some_and(|n| step.updates() >= n) {
                panic!("injected fault after {} updates", step.updates());
            }
            // An allocation failure here panics in libtorch: `run` turns it into
            // `LearnerError::OutOfMemory` (the state is the one before this update, or
            // at worst one half-applied optimizer step). Handing TD errors to replay
            // and publishing are timed apart.
            let mut publish_s = 0.0;
            let version = step.version();
            step.update(&batch, buf.keys(), &[steps.get()], &mut |version, dqn| {
                let p0 = Instant::now();
                publisher.offer(version, steps.get(), dqn);
                publish_s += p0.elapsed().as_secs_f64();
            });
            let t3 = Instant::now();
            let priorities_s = step.take_priority_seconds();
            self.alive
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            drop(batch);
            self.staleness_sum += version.saturating_sub(buf.oldest_version) as f64;
            self.batches += 1;
            // On a GPU, recycling waits for the device once per half ring: that wait is
            // queued work, the copies and updates; the copies' share is timed on the
            // device and moved from compute to host-to-device.
            let waited = prefetcher.recycle(&mut used, buf).as_secs_f64();
            let copies = match (&mut timer, waited > 0.0) {
                (Some(timer), true) => timer.collect(),
                _ => 0.0,
            };
            self.t.wait_data += (t1 - t0).as_secs_f64();
            self.t.host_to_device += (t2 - t1).as_secs_f64() + copies;
            self.t.compute += ((t3 - t2).as_secs_f64() - publish_s - priorities_s).max(0.0)
                + (waited - copies).max(0.0);
            self.t.publish += publish_s;
            self.t.priorities += priorities_s;

            if last_report.elapsed() >= cfg.report_every {
                let m0 = Instant::now();
                // A report's split must add up: total as of now, like its parts.
                self.t.total = self.start.elapsed().as_secs_f64();
                let health = step.check();
                let stats = health.stats;
                self.nonfinite_total = health.nonfinite_total;
                self.last = LearnerReport {
                    updates: step.updates(),
                    params_version: step.version(),
                    stats,
                    stalls: self.t,
                    staleness: self.staleness_sum / self.batches.max(1) as f64,
                    checkpoint_stall_max: self.checkpoint_stall_max,
                    checkpoints_submitted: self.checkpoints_submitted,
                    nonfinite_total: self.nonfinite_total,
                };
                (self.staleness_sum, self.batches) = (0.0, 0);
                let _ = reports.try_send(self.last);
                last_report = Instant::now();
                self.t.metrics += m0.elapsed().as_secs_f64();
                publisher.check().map_err(LearnerError::Publisher)?;
                if !health.diverged.is_empty() {
                    return Err(LearnerError::Diverged {
                        streak: stats.nonfinite_streak,
                        skipped: health.nonfinite_total,
                        limit: cfg.max_nonfinite,
                    });
                }
            }
            if let Some(every) = cfg.checkpoint_every {
                if last_ckpt.elapsed() >= every {
                    let c0 = Instant::now();
                    if writer.try_submit(self.job(step, steps, None)) {
                        self.checkpoints_submitted += 1;
                    }
                    last_ckpt = Instant::now();
                    let stall = c0.elapsed().as_secs_f64();
                    self.t.checkpoint += stall;
                    self.checkpoint_stall_max = self.checkpoint_stall_max.max(stall);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    thread_local! {
        /// The fake device: copies up to this number are done.
        static DONE: Cell<u64> = const { Cell::new(0) };
        static MADE: Cell<u64> = const { Cell::new(0) };
    }

    /// A stopwatch whose copy is done once [`DONE`] reaches its number.
    struct FakeWatch {
        copy: Cell<u64>,
    }

    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

    impl Watch for FakeWatch {
        fn start(&self) -> bool {
            self.copy
                .set(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
            true
        }

        fn stop(&self) -> bool {
            true
        }

        fn elapsed_s(&self) -> Option<f64> {
            (self.copy.get() <= DONE.get()).then_some(0.001)
        }
    }

    fn fake(_device: usize) -> Option<FakeWatch> {
        MADE.set(MADE.get() + 1);
        Some(FakeWatch {
            copy: Cell::new(u64::MAX),
        })
    }

    #[test]
    fn the_copy_timer_holds_a_bounded_number_of_events() {
        let mut t = CopyTimer::with(0, fake(0).unwrap(), fake);
        // The learner's cadence: a device wait (everything done) every 128 copies.
        for round in 0..10 {
            for _ in 0..128 {
                let w = t.start();
                t.stop(w);
            }
            DONE.set(NEXT.load(std::sync::atomic::Ordering::Relaxed) - 1);
            let s = t.collect();
            assert!((s - 0.128).abs() < 1e-9, "round {round}: {s}");
            assert_eq!(t.pending.len(), 0);
        }
        assert!(t.held() <= 129, "reused: {}", t.held());
        // Nothing ever waits (as with a side stream, had the timer been made): 10,000
        // copies hold at most MAX_PENDING_COPY_TIMES stopwatches, the rest untimed.
        for _ in 0..10_000 {
            let w = t.start();
            t.stop(w);
            let _ = t.collect();
        }
        assert!(t.held() <= MAX_PENDING_COPY_TIMES + 1, "{}", t.held());
        assert!(MADE.get() as usize <= MAX_PENDING_COPY_TIMES + 1);
        assert_eq!(t.untimed, 10_000 - MAX_PENDING_COPY_TIMES as u64);
        // Once the device catches up they are collected and reused.
        DONE.set(u64::MAX);
        assert!(t.collect() > 0.0);
        assert_eq!(t.pending.len(), 0);
    }

    #[test]
    #[ignore = "needs a CUDA device: run with --ignored on a GPU host"]
    fn a_real_cuda_over_allocation_is_recognised_as_out_of_memory() {
        use tch::{Device, Kind, Tensor};
        // 4 TiB through PyTorch's caching allocator: its own message, recognised.
        let e = Tensor::f_zeros([1i64 << 40], (Kind::Float, Device::Cuda(0)))
            .expect_err("4 TiB does not fit")
            .to_string();
        eprintln!("a real allocation failure: {e}");
        assert!(is_out_of_memory(&e), "{e}");
        // The device goes on working, and no error is left for a later call.
        let t = Tensor::ones([4], (Kind::Float, Device::Cuda(0)));
        assert_eq!(t.sum(Kind::Float).double_value(&[]), 4.0);
        assert_eq!(crate::cuda::take_last_error().unwrap(), 0);
    }

    #[test]
    fn no_copy_timer_with_a_side_stream_or_on_the_cpu() {
        assert!(CopyTimer::new(tch::Device::Cuda(0), true).is_none());
        assert!(CopyTimer::new(tch::Device::Cpu, false).is_none());
    }

    #[test]
    fn allocation_failures_are_recognised() {
        assert!(is_out_of_memory(
            "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 79.19 GiB total capacity)"
        ));
        assert!(is_out_of_memory(
            "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: you tried to allocate 1099511627776 bytes."
        ));
        for cuda in [
            "called `Result::unwrap()` on an `Err` value: Torch(\"CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB\")",
            "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported",
            "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
            "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
            "cuDNN error: CUDNN_STATUS_NOT_ENOUGH_WORKSPACE",
        ] {
            assert!(is_out_of_memory(cuda), "{cuda}");
        }
        assert!(!is_out_of_memory(
            "shape '[1, 64]' is invalid for input of size 3"
        ));
        assert!(!is_out_of_memory(
            "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm`"
        ));
    }
}
