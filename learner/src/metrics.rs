//! Run metrics: TensorBoard scalars, the progress bar and periodic log lines, all fed by
//! the coordinator from counters and learner reports (never from the hot loops).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use millrace_replay::{ReplayStats, Table};
use millrace_telemetry::Endpoint;

use crate::checkpoint::writer::WriterStats;
use crate::evaluation::{EvalRecord, Purpose};
use crate::summary::RunSummary;
use crate::tensorboard::EventWriter;
use millrace_core::update_loop::LearnerReport;
use millrace_server::{ActorBoard, ActorEntry, BoardSummary};

/// Seconds between TensorBoard points and progress updates.
const TICK_S: f64 = 1.0;
/// Seconds between log lines.
const LOG_S: f64 = 10.0;

pub struct Metrics {
    tb: EventWriter,
    bar: Option<ProgressBar>,
    last_tick: Instant,
    last_log: Instant,
    last_steps: u64,
    last_updates: u64,
    last_inserted: u64,
    last_sampled: u64,
    /// `--metrics-addr`: the Prometheus page and readiness, re-rendered every tick.
    monitor: Option<Arc<Endpoint>>,
    /// The last regular evaluation (mean return, parameters version), for the page.
    last_eval: Option<(f64, f64)>,
    /// The checkpoint writer's counts, for the page (threaded runs).
    checkpoints: Option<WriterStats>,
    /// Lock-step: this thread's ticks are the signs of life (`/livez`), and how long it
    /// may go without one.
    live_on_tick: Option<Duration>,
    /// Lock-step: checkpoints this thread failed to write since its last one.
    own_failed_in_a_row: u64,
    /// The learner thread's signs of life, the count last seen and how long it may go
    /// without one (`/livez`).
    learner_alive: Option<(Arc<AtomicU64>, u64, Duration)>,
}

/// How long the learner thread may show no sign of life, once it has shown one, before
/// `/livez` fails (a wedged learner is restarted by its container's policy), unless
/// `--live-limit-s` says otherwise. It shows one per update and one per second while
/// it waits for data.
pub const LIVE_LIMIT: Duration = Duration::from_secs(120);

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("tb", &self.tb)
            .finish_non_exhaustive()
    }
}

impl Metrics {
    pub fn new(
        logdir: &Path,
        bar: Option<ProgressBar>,
        monitor: Option<Arc<Endpoint>>,
        start_steps: u64,
    ) -> std::io::Result<Self> {
        let tb = EventWriter::create(logdir)?;
        tracing::info!("TensorBoard events: {}", tb.path().display());
        Ok(Self {
            tb,
            bar,
            last_tick: Instant::now(),
            last_log: Instant::now(),
            last_steps: start_steps,
            last_updates: 0,
            last_inserted: 0,
            last_sampled: 0,
            monitor,
            last_eval: None,
            checkpoints: None,
            learner_alive: None,
            live_on_tick: None,
            own_failed_in_a_row: 0,
        })
    }

    /// `/healthz` answers ready from now on (the learner accepts actors).
    pub fn ready(&self) {
        if let Some(m) = &self.monitor {
            m.set_ready();
        }
    }

    /// `/healthz` answers 503 with `reason` from now on.
    pub fn not_ready(&self, reason: &str) {
        if let Some(m) = &self.monitor {
            m.set_not_ready(reason);
        }
    }

    /// `/livez` follows the learner thread's signs of life in `alive` from its first
    /// on, failing after `limit` without one (see [`LIVE_LIMIT`]).
    pub fn watch_learner(&mut self, alive: Arc<AtomicU64>, limit: Duration) {
        self.learner_alive = Some((alive, 0, limit));
    }

    /// The checkpoint writer's counts as of now, shown from the next tick on; failing
    /// checkpoints become `/healthz`'s warning (the run stays ready: actors are not
    /// turned away because the disk is full).
    pub fn checkpoints(&mut self, stats: WriterStats) {
        if let Some(m) = &self.monitor {
            m.set_warning(checkpoint_warning(&stats));
        }
        self.checkpoints = Some(stats);
    }

    /// A checkpoint this thread wrote itself (lock-step mode): failures in a row are
    /// `/healthz`'s warning, as the writer thread's are.
    pub fn own_checkpoint(&mut self, written: bool) {
        self.own_failed_in_a_row = if written {
            0
        } else {
            self.own_failed_in_a_row + 1
        };
        if let Some(m) = &self.monitor {
            m.set_warning(checkpoint_warning(&WriterStats {
                failed_in_a_row: self.own_failed_in_a_row,
                ..WriterStats::default()
            }));
        }
    }

    /// `/livez` follows this thread's calls of [`Metrics::tick`]: in lock-step mode
    /// the one thread that ticks is the one that learns.
    pub fn live_on_tick(&mut self, limit: Duration) {
        self.live_on_tick = Some(limit);
    }

    /// Called often; records at most once per [`TICK_S`]: TensorBoard's scalars, the
    /// metrics page, the progress bar's line and, every [`LOG_S`], the log's.
    pub fn tick(
        &mut self,
        steps: u64,
        report: &LearnerReport,
        train_return: Option<f32>,
        epsilon: f32,
        replay: &Table,
        remote: Option<&ActorBoard>,
    ) {
        self.signs_of_life();
        let dt = self.last_tick.elapsed().as_secs_f64();
        if dt < TICK_S {
            return;
        }
        // Reading replay's counters takes its locks: only when a point is recorded.
        let replay = replay.stats();
        let rates = self.rates(dt, steps, report.updates, &replay);
        self.last_tick = Instant::now();
        let point = Point {
            steps,
            report,
            replay: &replay,
            rates,
            train_return: train_return.map_or(f64::NAN, f64::from),
            epsilon,
        };
        // Remote actors: the board is read here, once per tick, not on every poll.
        let actors = remote.map(ActorBoard::entries).unwrap_or_default();
        let summary = remote.map(ActorBoard::summary);
        let values = point.scalars(&actors, summary.as_ref());
        let values: Vec<(&str, f64)> = values.iter().map(|(t, v)| (t.as_str(), *v)).collect();
        if let Err(e) = self.tb.scalars(steps, &values) {
            tracing::warn!("TensorBoard write failed: {e}");
        }
        let _ = self.tb.flush();
        self.publish_page(&point, &values, &actors);
        self.progress(&point, summary.as_ref());
    }

    /// `/livez`'s sign of life: the learner thread's, or this thread's own.
    fn signs_of_life(&mut self) {
        if let (Some(monitor), Some((alive, seen, limit))) =
            (&self.monitor, &mut self.learner_alive)
        {
            let now = alive.load(Ordering::Relaxed);
            if now != *seen {
                *seen = now;
                monitor.progress(*limit);
            }
        } else if let (Some(monitor), Some(limit)) = (&self.monitor, self.live_on_tick) {
            monitor.progress(limit);
        }
    }

    /// Env steps, updates, inserts and samples per second over the last `dt` seconds.
    fn rates(&mut self, dt: f64, steps: u64, updates: u64, replay: &ReplayStats) -> Rates {
        let rates = Rates {
            steps: (steps - self.last_steps.min(steps)) as f64 / dt,
            updates: (updates - self.last_updates.min(updates)) as f64 / dt,
            inserts: (replay.inserted - self.last_inserted.min(replay.inserted)) as f64 / dt,
            samples: (replay.sampled - self.last_sampled.min(replay.sampled)) as f64 / dt,
        };
        (
            self.last_steps,
            self.last_updates,
            self.last_inserted,
            self.last_sampled,
        ) = (steps, updates, replay.inserted, replay.sampled);
        rates
    }

    /// The metrics page (`--metrics-addr`): the scalars but the per-actor ones, which
    /// are labelled series there, and the last evaluation.
    fn publish_page(
        &self,
        point: &Point<'_>,
        values: &[(&str, f64)],
        actors: &[(u32, ActorEntry)],
    ) {
        let Some(monitor) = &self.monitor else {
            return;
        };
        let mut scalars: Vec<(&str, f64)> = values
            .iter()
            .copied()
            .filter(|(t, _)| !t.starts_with("actor/"))
            .collect();
        if let Some((mean, version)) = self.last_eval {
            scalars.extend([("eval/mean_return", mean), ("eval/params_version", version)]);
        }
        monitor.publish(crate::prometheus::page(
            point.steps,
            point.report.updates,
            point.replay,
            self.checkpoints.as_ref(),
            &scalars,
            actors,
        ));
    }

    /// The progress bar's line and, every [`LOG_S`], the log's two.
    fn progress(&mut self, point: &Point<'_>, summary: Option<&BoardSummary>) {
        let Point {
            steps,
            report,
            replay,
            rates,
            train_return: ret,
            epsilon,
        } = *point;
        let s = &report.stalls;
        let frac = |x: f64| s.frac(x);
        let mut line = format!(
            "{:>6.0} steps/s {:>5.0} upd/s  return {ret:>6.1}  eps {epsilon:.3}  loss {:.4}  duty {:.0}% wait {:.0}%  ratio {:.1}",
            rates.steps,
            rates.updates,
            report.stats.loss,
            100.0 * s.duty_cycle(),
            100.0 * frac(s.wait_data),
            rates.samples / rates.inserts.max(1e-9),
        );
        if let Some(r) = summary {
            line += &format!(
                "  actors {} (lag {:.0}, max {})",
                r.connected, r.mean_version_lag, r.max_version_lag
            );
        }
        if let Some(bar) = &self.bar {
            bar.set_position(steps);
            bar.set_message(line.clone());
        }
        if self.last_log.elapsed().as_secs_f64() < LOG_S {
            return;
        }
        self.last_log = Instant::now();
        tracing::info!("{steps} env steps, {} updates: {line}", report.updates);
        tracing::info!(
            "learner time: {:.1}% compute, {:.1}% waiting for data, {:.1}% host-to-device, \
             {:.1}% publishing, {:.1}% priorities, {:.1}% metrics, {:.1}% checkpointing; \
             {:.0} samples/s, \
             {:.0} inserts/s; blocked by the rate limiter since the start: actors \
             {:.1} s, sampler {:.1} s",
            100.0 * s.duty_cycle(),
            100.0 * frac(s.wait_data),
            100.0 * frac(s.host_to_device),
            100.0 * frac(s.publish),
            100.0 * frac(s.priorities),
            100.0 * frac(s.metrics),
            100.0 * frac(s.checkpoint),
            rates.samples,
            rates.inserts,
            replay.insert_blocked_s,
            replay.sample_blocked_s,
        );
    }

    /// Records an evaluation at the env steps of the parameters it played.
    pub fn eval(&mut self, record: &EvalRecord, purpose: Purpose) {
        if purpose == Purpose::Regular {
            self.last_eval = Some((f64::from(record.mean), record.params_version as f64));
        }
        let values: &[(&str, f64)] = match purpose {
            Purpose::Regular => &[
                ("eval/mean_return", f64::from(record.mean)),
                ("eval/std_return", f64::from(record.std)),
                ("eval/params_version", record.params_version as f64),
            ],
            Purpose::Confirm => &[("eval/confirm_mean_return", f64::from(record.mean))],
        };
        if let Err(e) = self.tb.scalars(record.env_steps, values) {
            tracing::warn!("TensorBoard write failed: {e}");
        }
    }

    pub fn finish(&mut self, summary: &RunSummary) {
        let _ = self.tb.scalars(
            summary.env_steps,
            &[
                ("summary/wall_s", summary.wall_s),
                ("summary/updates", summary.updates as f64),
                ("summary/duty_cycle", summary.stalls.duty_cycle()),
            ],
        );
        let _ = self.tb.flush();
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// What `/healthz` says of failing checkpoints, if they are.
pub fn checkpoint_warning(stats: &WriterStats) -> Option<String> {
    match (stats.failed_in_a_row, stats.replay_failed_in_a_row) {
        (0, 0) => None,
        (0, n) => Some(format!(
            "the last {n} checkpoint(s) were written without replay (see the log: a full disk?)"
        )),
        (n, _) => Some(format!(
            "the last {n} checkpoint(s) failed (see the log: a full disk?); the state saved before stands"
        )),
    }
}

/// Env steps, updates, inserts and samples per second since the last point.
#[derive(Clone, Copy)]
struct Rates {
    steps: f64,
    updates: f64,
    inserts: f64,
    samples: f64,
}

/// What one recorded point shows.
#[derive(Clone, Copy)]
struct Point<'a> {
    steps: u64,
    report: &'a LearnerReport,
    replay: &'a ReplayStats,
    rates: Rates,
    /// The mean training return (NaN before the first episode).
    train_return: f64,
    epsilon: f32,
}

impl Point<'_> {
    /// The point's scalars by TensorBoard tag: the learner's, replay's and, with remote
    /// actors, each actor's and their summary.
    fn scalars(
        &self,
        actors: &[(u32, ActorEntry)],
        summary: Option<&BoardSummary>,
    ) -> Vec<(String, f64)> {
        let (report, replay, rates) = (self.report, self.replay, &self.rates);
        let s = &report.stalls;
        let frac = |x: f64| s.frac(x);
        let values = [
            ("charts/episode_return", self.train_return),
            ("charts/epsilon", f64::from(self.epsilon)),
            // 0 only before the learner's first report: not known yet.
            (
                "charts/learning_rate",
                Some(report.stats.learning_rate)
                    .filter(|lr| *lr > 0.0)
                    .unwrap_or(f64::NAN),
            ),
            ("losses/loss", report.stats.loss),
            ("losses/td_abs", report.stats.td_abs),
            ("losses/q_values", report.stats.q),
            ("losses/nonfinite_skipped", report.stats.nonfinite as f64),
            ("perf/env_steps_per_s", rates.steps),
            ("perf/updates_per_s", rates.updates),
            ("perf/inserts_per_s", rates.inserts),
            ("perf/samples_per_s", rates.samples),
            ("perf/duty_cycle", s.duty_cycle()),
            ("stall/wait_data", frac(s.wait_data)),
            ("stall/host_to_device", frac(s.host_to_device)),
            ("stall/publish", frac(s.publish)),
            ("stall/priorities", frac(s.priorities)),
            ("stall/metrics", frac(s.metrics)),
            ("stall/checkpoint", frac(s.checkpoint)),
            ("stall/checkpoint_max_s", report.checkpoint_stall_max),
            ("replay/size", replay.size as f64),
            (
                "replay/obs_rows_per_item",
                replay.obs_rows as f64 / replay.size.max(1) as f64,
            ),
            ("replay/dropped", replay.dropped as f64),
            ("replay/insert_blocked_s", replay.insert_blocked_s),
            ("replay/sample_blocked_s", replay.sample_blocked_s),
            (
                "replay/ratio",
                replay.sampled as f64 / replay.inserted.max(1) as f64,
            ),
            ("params/version", report.params_version as f64),
            ("replay/sampled_age_versions", report.staleness),
        ];
        let mut values: Vec<(String, f64)> =
            values.iter().map(|(t, v)| (t.to_string(), *v)).collect();
        for (id, a) in actors {
            values.push((format!("actor/{id}/transitions_per_s"), a.transitions_per_s));
            values.push((format!("actor/{id}/version_lag"), a.version_lag as f64));
        }
        if let Some(r) = summary {
            values.extend([
                ("actors/connected".to_string(), r.connected as f64),
                ("actors/transitions_per_s".to_string(), r.transitions_per_s),
                ("actors/mean_version_lag".to_string(), r.mean_version_lag),
                (
                    "actors/max_version_lag".to_string(),
                    r.max_version_lag as f64,
                ),
            ]);
        }
        values
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use millrace_replay::{RateLimiterConfig, ReplayConfig};

    fn table() -> Table {
        Table::new(&ReplayConfig {
            capacity: 100,
            shards: 1,
            obs_row_bytes: 16,
            stack: 1,
            obs_rows_per_item: 1.5,
            limiter: RateLimiterConfig::sample_to_insert_ratio(4.0, 10, 1e9, 8).unwrap(),
            priority: None,
        })
        .unwrap()
    }

    #[test]
    fn livez_follows_the_learner_thread_or_in_lock_step_the_ticking_one() {
        let dir = tempfile::tempdir().unwrap();
        let (t, report) = (table(), LearnerReport::default());
        // Threaded: the coordinator's ticks alone are no sign of the learner's life.
        let ep = Endpoint::new("starting");
        let mut m = Metrics::new(dir.path(), None, Some(Arc::clone(&ep)), 0).unwrap();
        let alive = Arc::new(AtomicU64::new(0));
        m.watch_learner(Arc::clone(&alive), LIVE_LIMIT);
        m.tick(0, &report, None, 1.0, &t, None);
        assert!(!ep.progressed());
        alive.fetch_add(1, Ordering::Relaxed);
        m.tick(0, &report, None, 1.0, &t, None);
        assert!(ep.progressed());
        // Lock-step: the thread that ticks is the one that learns.
        let ep = Endpoint::new("starting");
        let mut m = Metrics::new(dir.path(), None, Some(Arc::clone(&ep)), 0).unwrap();
        m.tick(0, &report, None, 1.0, &t, None);
        assert!(!ep.progressed(), "not watched unless asked");
        m.live_on_tick(LIVE_LIMIT);
        m.tick(0, &report, None, 1.0, &t, None);
        assert!(ep.progressed());
    }

    #[test]
    fn failing_checkpoints_are_healthz_warnings_until_one_succeeds() {
        let dir = tempfile::tempdir().unwrap();
        let ep = Endpoint::new("starting");
        let mut m = Metrics::new(dir.path(), None, Some(Arc::clone(&ep)), 0).unwrap();
        let mut stats = WriterStats {
            failed: 2,
            failed_in_a_row: 2,
            ..WriterStats::default()
        };
        m.checkpoints(stats);
        let w = ep.warning().expect("a warning");
        assert!(w.contains("the last 2 checkpoint(s) failed"), "{w}");
        (stats.failed_in_a_row, stats.replay_failed_in_a_row) = (0, 1);
        m.checkpoints(stats);
        assert!(ep.warning().unwrap().contains("without replay"));
        stats.replay_failed_in_a_row = 0;
        m.checkpoints(stats);
        assert_eq!(ep.warning(), None);
        // Lock-step writes its own.
        m.own_checkpoint(false);
        assert!(ep
            .warning()
            .unwrap()
            .contains("the last 1 checkpoint(s) failed"));
        m.own_checkpoint(true);
        assert_eq!(ep.warning(), None);
    }
}
