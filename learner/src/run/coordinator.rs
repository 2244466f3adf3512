//! The run coordinator (the calling thread in the threaded mode): watches progress,
//! starts evaluations, keeps what they find (`best/`, `solved/`), writes metrics, and
//! decides when the run ends. Then [`Running::shutdown`], the one shutdown path that
//! every end goes through: solved, out of steps, a signal, or any component failing.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::Sender;
use millrace_proto::Params;
use millrace_replay::Table;

use super::setup::Setup;
use super::train_returns::TrainReturns;
use super::{Component, Failure, RunError};
use crate::checkpoint::writer::{CheckpointContext, CheckpointWriter, WriterStats};
use crate::checkpoint::{self, CheckpointError, Which};
use crate::config::RunConfig;
use crate::evaluation::{eval_seed, EvalRecord, EvalRequest, EvalTracker, Evaluator, Purpose};
use crate::summary::{RunSummary, SolvedBy, StopReason};
use millrace_core::update_loop::{Command, LearnerReport, LoopOutcome};
use millrace_server::ServerHandle;

/// How often the coordinator looks at everything.
const TICK: Duration = Duration::from_millis(20);

/// What the coordinator reads from the running components.
#[derive(Debug)]
pub struct Links {
    pub episodes: crossbeam_channel::Receiver<millrace_actor::EpisodeStats>,
    pub reports: crossbeam_channel::Receiver<LearnerReport>,
}

/// Handles to everything the threaded mode started.
#[derive(Debug)]
pub struct Running {
    pub stop_actors: Arc<AtomicBool>,
    pub table: Arc<Table>,
    pub commands: Sender<Command>,
    pub learner: Option<JoinHandle<LoopOutcome<CheckpointError>>>,
    pub writer: Arc<CheckpointWriter>,
    pub ckpt: Arc<CheckpointContext>,
    pub evaluator: Option<Evaluator>,
    pub actors: Vec<(u32, JoinHandle<Result<u64, String>>)>,
    pub server: Option<ServerHandle>,
}

/// What shutdown found.
#[derive(Debug)]
pub struct Ended {
    pub last: LearnerReport,
    /// The final checkpoint: written (where), failed, or not attempted (`Ok(None)`).
    pub checkpoint: Result<Option<PathBuf>, CheckpointError>,
    /// Components that failed, with why, in the order found.
    pub failures: Vec<Failure>,
    /// The checkpoint writer's statistics, once it finished.
    pub writer: Option<WriterStats>,
}

impl Ended {
    /// The run's error: the first component failure, or `otherwise` when none was
    /// found (a failure outside the components, e.g. during set-up).
    pub fn into_error(self, otherwise: Failure) -> RunError {
        let note = super::CheckpointFate::of(&self.checkpoint);
        let Failure { component, message } = self.failures.into_iter().next().unwrap_or(otherwise);
        RunError::Failed {
            component,
            message,
            checkpoint: note,
        }
    }
}

impl Running {
    /// The first component that ended by itself, which only a failure does.
    fn ended_by_itself(&self) -> bool {
        self.learner.as_ref().is_some_and(JoinHandle::is_finished)
            || self.evaluator.as_ref().is_some_and(Evaluator::is_finished)
            || self.actors.iter().any(|(_, h)| h.is_finished())
            || self.server.as_ref().is_some_and(ServerHandle::is_finished)
            || self.writer.is_finished()
    }

    /// The one shutdown path: stop actors, stop the learner (final checkpoint), close
    /// replay (wakes anything blocked in it), say goodbye to remote actors, join every
    /// thread and collect every failure.
    pub fn shutdown(mut self, end: StopReason) -> Ended {
        self.stop_actors.store(true, Ordering::Relaxed);
        let run_finished = end.finished();
        let _ = self.commands.try_send(Command::Stop {
            checkpoint: true,
            run_finished,
        });
        let message = match end {
            StopReason::Solved => "the run is solved",
            StopReason::MaxSteps => "the run reached its step budget",
            StopReason::Interrupted => "the learner was stopped by a signal",
            StopReason::Failed => "the learner failed",
        };
        let goodbye = millrace_server::goodbye_for(run_finished.is_some(), message);
        if let Some(server) = &self.server {
            server.announce(goodbye.clone());
        }
        self.table.close();
        let mut failures = Vec::new();
        if let Some(server) = self.server.take() {
            if let Err(e) = server.shutdown(goodbye) {
                failures.push(Failure::new(Component::Server, e));
            }
        }
        let mut last = LearnerReport::default();
        let mut checkpoint = Ok(None);
        if let Some(learner) = self.learner.take() {
            match crate::joined(learner) {
                Ok(outcome) => {
                    last = outcome.last;
                    if let Some(e) = outcome.error {
                        failures.push(Failure::new(Component::Learner, e.to_string()));
                    }
                    // Replay is closed: a sampler still waiting in it has ended.
                    if let Some(Err(e)) = outcome
                        .prefetcher
                        .map(millrace_core::prefetch::Prefetcher::join)
                    {
                        failures.push(Failure::new(Component::Sampler, e.to_string()));
                    }
                    if let Some(rx) = outcome.final_checkpoint {
                        checkpoint = match rx.recv() {
                            Ok(Ok(path)) => Ok(Some(path)),
                            Ok(Err(e)) => Err(e),
                            Err(_) => Err(CheckpointError::Missing(
                                "the checkpoint writer stopped without an answer".into(),
                            )),
                        };
                    }
                }
                Err(e) => failures.push(Failure::new(Component::Learner, e)),
            }
        }
        for (id, actor) in self.actors.drain(..) {
            if let Err(e) = crate::joined(actor).map_err(String::from).and_then(|r| r) {
                failures.push(Failure::new(Component::Actor(Some(id)), e));
            }
        }
        if let Some(evaluator) = self.evaluator.take() {
            if let Err(e) = evaluator.join() {
                failures.push(Failure::new(Component::Evaluator, e.to_string()));
            }
        }
        // The learner thread held the other handle: the writer is ours alone now.
        let writer = match Arc::try_unwrap(self.writer).map(CheckpointWriter::finish) {
            Ok(Ok(stats)) => Some(stats),
            Ok(Err(e)) => {
                failures.push(Failure::new(Component::CheckpointWriter, e));
                None
            }
            Err(_) => None,
        };
        Ended {
            last,
            checkpoint,
            failures,
            writer,
        }
    }
}

/// Saves a snapshot an evaluation played as the run's `best/` or `solved/`.
fn save_policy(
    which: Which,
    setup: &Setup,
    seed: u64,
    params: &Params,
    eval: &EvalRecord,
    confirm: Option<&EvalRecord>,
) -> Result<(), RunError> {
    let owner = checkpoint::PolicyOwner {
        layout: &setup.layout,
        env: &setup.env,
        network: &setup.network,
        seed,
    };
    checkpoint::save_evaluated(&owner, which, params, eval, confirm)
        .map_err(|e| RunError::SavePolicy(which, e))
}

/// Everything the coordinator and the lock-step mode track between evaluations.
#[derive(Debug)]
pub struct Progress {
    pub tracker: EvalTracker,
    pub returns: TrainReturns,
    pub episodes: u64,
    pub next_eval: u64,
}

impl Progress {
    /// `best`: the best evaluation so far, if this run continues one.
    pub fn new(cfg: &RunConfig, start_steps: u64, best: Option<EvalRecord>) -> Self {
        let every = cfg.eval.every.max(1);
        Self {
            tracker: EvalTracker::new(cfg.eval.target_return, best),
            returns: TrainReturns::default(),
            episodes: 0,
            next_eval: (start_steps / every + 1) * every,
        }
    }

    pub fn episode(&mut self, actor: u32, episode_return: f32) {
        self.episodes += 1;
        self.returns.push(actor, episode_return);
    }

    /// See [`TrainReturns::figure`].
    pub fn train_return(&self) -> Option<f32> {
        self.returns.figure()
    }

    /// Whether an evaluation is due at `steps`; if so, moves the next one on.
    pub fn eval_due(&mut self, steps: u64, every: u64) -> bool {
        if steps < self.next_eval {
            return false;
        }
        let every = every.max(1);
        self.next_eval = (steps / every + 1) * every;
        true
    }

    /// Applies an evaluation's result: logs it, records it, saves `best/` and
    /// `solved/`; returns a snapshot to confirm, if any.
    pub fn evaluated(
        &mut self,
        done: &crate::evaluation::EvalDone,
        setup: &mut Setup,
        cfg: &RunConfig,
    ) -> Result<Option<Arc<Params>>, RunError> {
        let rec = &done.record;
        match done.purpose {
            Purpose::Regular => tracing::info!("eval: mean return {rec}"),
            Purpose::Confirm => tracing::info!("confirmation on fresh episodes: {rec}"),
        }
        setup.metrics.eval(rec, done.purpose);
        let d = self.tracker.record(done);
        if d.new_best {
            // A full disk must not end the run: the previous best/ stands (solved/, the
            // run's result, is worth failing loudly for).
            if let Err(e) = save_policy(Which::Best, setup, cfg.seed, &done.params, rec, None) {
                tracing::warn!("{e}; the previous best/ stands, training goes on");
            }
        }
        if let Some(s) = &d.solved {
            save_policy(
                Which::Solved,
                setup,
                cfg.seed,
                &s.params,
                &s.first,
                Some(&s.confirm),
            )?;
            tracing::info!(
                "solved by parameters v{}: {:.1} then {:.1} on fresh episodes (target {:.1})",
                s.params.version,
                s.first.mean,
                s.confirm.mean,
                cfg.eval.target_return.unwrap_or(f32::NAN)
            );
        }
        if let Some(r) = &d.not_confirmed {
            tracing::info!(
                "not confirmed: parameters v{} returned {:.1} on fresh episodes; training on",
                r.params_version,
                r.mean
            );
        }
        Ok(d.confirm)
    }

    /// The summary of a run that ended with `reason`.
    pub fn summary(
        &self,
        cfg: &RunConfig,
        setup: &Setup,
        reason: StopReason,
        last: &LearnerReport,
    ) -> RunSummary {
        RunSummary {
            env_id: cfg.env.id.clone(),
            reason,
            target: cfg.eval.target_return,
            max_steps: cfg.max_steps,
            env_steps: setup.steps.get(),
            updates: last.updates,
            wall_s: setup.started.elapsed().as_secs_f64(),
            solved: self.tracker.solved.as_ref().map(SolvedBy::from),
            best: self.tracker.best.clone(),
            last_eval: self.tracker.last.clone(),
            train_return_100: self.train_return(),
            episodes: self.episodes,
            stalls: last.stalls,
            checkpoint_stall_max: last.checkpoint_stall_max,
            checkpoint: setup.layout.root.clone(),
            replay_bytes_per_item: setup.table.bytes_per_item(),
            replay: setup.table.stats(),
            obs_row_bytes: setup.table.obs_row_bytes() / setup.table.stack(),
            frame_stack: setup.table.stack(),
            nonfinite: last.nonfinite_total,
        }
    }
}

/// Runs the threaded mode's coordinator until the run ends, then shuts down.
pub fn run(
    cfg: &RunConfig,
    mut setup: Setup,
    running: Running,
    links: Links,
    interrupt: &AtomicBool,
) -> Result<RunSummary, RunError> {
    let mut progress = Progress::new(cfg, setup.start_steps, setup.best.take());
    let mut report = LearnerReport::default();
    let mut eval_in_flight = false;
    let mut failure: Option<RunError> = None;
    let end = loop {
        std::thread::sleep(TICK);
        let steps = setup.steps.get();
        for ep in links.episodes.try_iter() {
            progress.episode(ep.actor_id, ep.episode_return);
        }
        for r in links.reports.try_iter() {
            report = r;
        }
        let evaluator = running.evaluator.as_ref().expect("started by the wiring");
        let mut confirm = None;
        for done in evaluator.done.try_iter() {
            eval_in_flight = false;
            match progress.evaluated(&done, &mut setup, cfg) {
                Ok(c) => confirm = confirm.or(c),
                Err(e) => failure = Some(e),
            }
            *running
                .ckpt
                .last_eval
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = progress.tracker.last.clone();
        }
        if failure.is_some() {
            break StopReason::Failed;
        }
        if progress.tracker.solved.is_some() {
            break StopReason::Solved;
        }
        if let Some(params) = confirm {
            let seed = eval_seed(cfg.seed, Purpose::Confirm, params.version);
            eval_in_flight = evaluator.try_request(EvalRequest {
                params,
                purpose: Purpose::Confirm,
                seed,
            });
        }
        // Past the step budget no new evaluation starts; the one in flight may finish.
        if !eval_in_flight
            && !progress.tracker.confirming()
            && steps < cfg.max_steps
            && progress.eval_due(steps, cfg.eval.every)
        {
            eval_in_flight = evaluator.try_request(EvalRequest {
                params: setup.params.latest(),
                purpose: Purpose::Regular,
                seed: eval_seed(cfg.seed, Purpose::Regular, steps),
            });
        }
        let eps = cfg.actors.epsilon.value(steps);
        let remote = cfg.server.as_ref().map(|_| &*setup.board);
        setup.metrics.checkpoints(running.writer.stats());
        setup.metrics.tick(
            steps,
            &report,
            progress.train_return(),
            eps,
            &setup.table,
            remote,
        );
        if interrupt.load(Ordering::Relaxed) {
            break StopReason::Interrupted;
        }
        if steps >= cfg.max_steps && !eval_in_flight && !progress.tracker.confirming() {
            break StopReason::MaxSteps;
        }
        if running.ended_by_itself() {
            break StopReason::Failed;
        }
    };
    setup.metrics.not_ready("the run is ending");
    let ended = running.shutdown(end);
    finish(cfg, setup, progress, end, ended, failure)
}

/// Turns what shutdown found into the run's result.
fn finish(
    cfg: &RunConfig,
    mut setup: Setup,
    progress: Progress,
    end: StopReason,
    mut ended: Ended,
    failure: Option<RunError>,
) -> Result<RunSummary, RunError> {
    // Saving an evaluated policy failed: that ended the run, whatever followed.
    if let Some(e) = failure {
        ended.failures.insert(
            0,
            Failure::new(Component::Evaluation { agent: None }, e.to_string()),
        );
    }
    if end == StopReason::Failed || !ended.failures.is_empty() {
        return Err(ended.into_error(Failure::new(
            Component::Run,
            "a component ended unexpectedly",
        )));
    }
    let reason = end;
    match ended.checkpoint {
        Ok(Some(path)) => tracing::info!("checkpoint written to {}", path.display()),
        Ok(None) => {}
        Err(e) => return Err(RunError::FinalCheckpoint(e)),
    }
    if let Some(w) = &ended.writer {
        tracing::debug!(
            "checkpoints: {} written, {} failed, {} skipped (writer busy); the last took {:.2} s",
            w.written,
            w.failed,
            w.skipped,
            w.last_write_s
        );
    }
    let summary = progress.summary(cfg, &setup, reason, &ended.last);
    setup.metrics.finish(&summary);
    Ok(summary)
}
