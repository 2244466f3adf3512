//! Lock-step mode (`--deterministic`): the same components as the threaded mode, driven
//! from one thread in a fixed order, so that the same seed and flags give bit-identical
//! parameters and results on the same machine.
//!
//! Each round, every actor takes one step of all its environments (in actor order) and
//! hands any full batch to replay; then the learner runs every update the rate limiter
//! allows, exactly at the replay ratio, sampling with the run's seeded generator;
//! publishing, evaluation (with its confirmation) and the end of the run happen at fixed
//! points of that sequence. Nothing depends on thread timing; the CPU runs libtorch with
//! one intra-op thread. Wall-clock things (metrics, periodic checkpoints) only observe.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use millrace_actor::{AnyActor, SharedParams};
use millrace_proto::Params;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use tch::Device;

use super::coordinator::Progress;
use super::setup::Setup;
use super::{Component, Failure, RunError};
use crate::checkpoint::{self, StateMeta};
use crate::config::RunConfig;
use crate::evaluation::{eval_seed, evaluate, EvalDone, EvalRecord, Purpose};
use crate::summary::{RunSummary, StopReason};
use millrace_core::dqn::Dqn;
use millrace_core::handoff::Finished;
use millrace_core::prefetch::StagingBuffer;
use millrace_core::step::LearnerStep;
use millrace_core::update_loop::{LearnerReport, StallTimes};

/// Statistics (and the non-finite check) every this many updates: a fixed point of the
/// sequence, not a time, so the run stops at the same update every time.
const STATS_EVERY: u64 = 256;

/// Evaluates `params` (as published) and hands the result to `progress`; confirms a
/// candidate at once. Returns whether the run is solved.
fn evaluate_now(
    cfg: &RunConfig,
    setup: &mut Setup,
    progress: &mut Progress,
    params: Arc<Params>,
) -> Result<bool, String> {
    let mut next = Some((params, Purpose::Regular));
    while let Some((params, purpose)) = next.take() {
        let key = match purpose {
            Purpose::Regular => params.env_steps,
            Purpose::Confirm => params.version,
        };
        let seed = eval_seed(cfg.seed, purpose, key);
        let result = evaluate(&cfg.env, &setup.network, &params, cfg.eval.episodes, seed)
            .map_err(|e| e.to_string())?;
        let done = EvalDone {
            record: EvalRecord::new(&params, seed, &result),
            params,
            purpose,
        };
        if let Some(confirm) = progress
            .evaluated(&done, setup, cfg)
            .map_err(|e| e.to_string())?
        {
            next = Some((confirm, Purpose::Confirm));
        }
    }
    Ok(progress.tracker.solved.is_some())
}

fn save(
    cfg: &RunConfig,
    setup: &Setup,
    dqn: &Dqn,
    version: u64,
    last_eval: Option<EvalRecord>,
    run_finished: Option<Finished>,
) -> Result<PathBuf, checkpoint::CheckpointError> {
    let state = dqn.state();
    let meta = StateMeta {
        last_eval,
        run_finished,
        ..StateMeta::new(
            setup.env.clone(),
            setup.network.clone(),
            cfg.seed,
            setup.steps.get(),
            version,
        )
    };
    checkpoint::save_state(&setup.layout.latest(), &state, Some(&setup.table), meta)
        .map(|saved| saved.dir)
}

pub fn run(cfg: &RunConfig, setup: Setup, interrupt: &AtomicBool) -> Result<RunSummary, RunError> {
    tch::set_num_threads(1);
    let mut run = LockStep::new(cfg, setup)?;
    let mut failure: Option<Failure> = None;
    let mut diverged = false;
    let reason = loop {
        if interrupt.load(Ordering::Relaxed) {
            break StopReason::Interrupted;
        }
        if let Err(f) = run.act() {
            failure = Some(f);
            break StopReason::Interrupted;
        }
        if let Some(f) = run.learn()? {
            (diverged, failure) = (true, Some(f));
            break StopReason::Interrupted;
        }
        let steps = run.setup.steps.get();
        if steps < cfg.max_steps && run.progress.eval_due(steps, cfg.eval.every) {
            match run.evaluate() {
                Ok(true) => break StopReason::Solved,
                Ok(false) => {}
                Err(e) => {
                    failure = Some(Failure::new(Component::Evaluation { agent: None }, e));
                    break StopReason::Interrupted;
                }
            }
        }
        if steps >= cfg.max_steps {
            break StopReason::MaxSteps;
        }
        run.checkpoint_if_due();
        run.tick(steps);
    };
    run.finish(reason, failure, diverged)
}

/// A lock-step run's components and the state its rounds keep.
struct LockStep<'a> {
    cfg: &'a RunConfig,
    setup: Setup,
    progress: Progress,
    actors: Vec<AnyActor>,
    /// The actors pack each parameter version once between them.
    source: SharedParams,
    staging: StagingBuffer,
    /// The run's seeded generator for sampling.
    rng: SmallRng,
    step: LearnerStep,
    stalls: StallTimes,
    report: LearnerReport,
    started: Instant,
    last_ckpt: Instant,
}

impl<'a> LockStep<'a> {
    fn new(cfg: &'a RunConfig, mut setup: Setup) -> Result<Self, RunError> {
        let dqn = setup.dqn.take().expect("the networks are set up once");
        let progress = Progress::new(cfg, setup.start_steps, setup.best.take());
        let seed_offset = setup.start_steps;
        let mut actors = Vec::new();
        for id in 0..cfg.actors.count {
            let acfg = cfg.actor(id as u32, seed_offset);
            actors.push(AnyActor::new(&acfg, &setup.network)?);
        }
        let staging = StagingBuffer::new(&setup.env.obs, cfg.batch_size, None);
        let rng = SmallRng::seed_from_u64(cfg.seed ^ 0x5eed);
        // Priorities are applied as soon as a round is complete (on the CPU, in order):
        // lock-step runs stay reproducible with prioritized replay too.
        let feedback = Some(crate::replay_flags::feedback(
            cfg.replay.priority.as_ref(),
            &setup.table,
            Device::Cpu,
            setup.steps.get(),
            cfg.poison_td(),
        ));
        let step = LearnerStep::new(
            dqn,
            setup.params.version(),
            cfg.learner.step(),
            vec![feedback],
            None,
        );
        let source = SharedParams::new(Arc::clone(&setup.params));
        // One thread steps, learns and ticks: its ticks are `/livez`'s signs of life.
        setup.metrics.live_on_tick(cfg.live_limit);
        Ok(Self {
            cfg,
            setup,
            progress,
            actors,
            source,
            staging,
            rng,
            step,
            stalls: StallTimes::default(),
            report: LearnerReport::default(),
            started: Instant::now(),
            last_ckpt: Instant::now(),
        })
    }

    /// Every actor takes one step of all its environments, in actor order, and hands
    /// any full batch to replay.
    fn act(&mut self) -> Result<(), Failure> {
        let Self {
            actors,
            source,
            setup,
            progress,
            ..
        } = self;
        for actor in actors.iter_mut() {
            let batch = actor
                .step(source, &setup.steps, &mut |e| {
                    progress.episode(e.actor_id, e.episode_return);
                })
                .map_err(|e| Failure::new(Component::Actor(None), e.to_string()))?;
            if let Some(batch) = batch {
                setup
                    .table
                    .insert_unlimited(batch)
                    .map_err(|e| Failure::new(Component::Replay, e.to_string()))?;
            }
        }
        Ok(())
    }

    /// Every update the replay ratio allows now, in order; statistics and the
    /// non-finite check every [`STATS_EVERY`] updates. The failure, if the learner
    /// diverged.
    fn learn(&mut self) -> Result<Option<Failure>, RunError> {
        let c0 = Instant::now();
        while self
            .staging
            .try_fill(&self.setup.table, &mut self.rng)
            .map_err(|_| RunError::Replay(millrace_replay::ReplayError::Closed))?
        {
            let batch = self.staging.to_device(Device::Cpu);
            let (params, steps) = (&self.setup.params, &self.setup.steps);
            self.step.update(
                &batch,
                self.staging.keys(),
                &[steps.get()],
                &mut |version, dqn| {
                    params.publish(dqn.params(version, steps.get()));
                },
            );
            if self.step.updates().is_multiple_of(STATS_EVERY) {
                let health = self.step.check();
                self.report.stats = health.stats;
                self.report.nonfinite_total = health.nonfinite_total;
                if !health.diverged.is_empty() {
                    return Ok(Some(Failure::new(
                        Component::Learner,
                        millrace_core::update_loop::LearnerError::Diverged {
                            streak: health.stats.nonfinite_streak,
                            skipped: health.nonfinite_total,
                            limit: self.cfg.learner.max_nonfinite,
                        }
                        .to_string(),
                    )));
                }
            }
        }
        let priorities_s = self.step.take_priority_seconds();
        self.stalls.priorities += priorities_s;
        self.stalls.compute += (c0.elapsed().as_secs_f64() - priorities_s).max(0.0);
        Ok(None)
    }

    /// Evaluates the parameters published last (confirming a candidate at once);
    /// whether the run is solved.
    fn evaluate(&mut self) -> Result<bool, String> {
        let snapshot = self.setup.params.latest();
        evaluate_now(self.cfg, &mut self.setup, &mut self.progress, snapshot)
    }

    /// A periodic checkpoint (`--checkpoint-every`), when one is due.
    fn checkpoint_if_due(&mut self) {
        let Some(every) = self.cfg.learner.checkpoint_every else {
            return;
        };
        if self.last_ckpt.elapsed() < every {
            return;
        }
        let k0 = Instant::now();
        let saved = save(
            self.cfg,
            &self.setup,
            self.step.dqn(),
            self.step.version(),
            self.progress.tracker.last.clone(),
            None,
        );
        if let Err(e) = &saved {
            tracing::warn!("periodic checkpoint failed: {e}");
        }
        self.setup.metrics.own_checkpoint(saved.is_ok());
        self.stalls.checkpoint += k0.elapsed().as_secs_f64();
        self.report.checkpoint_stall_max = self
            .report
            .checkpoint_stall_max
            .max(k0.elapsed().as_secs_f64());
        self.last_ckpt = Instant::now();
    }

    /// The learner's report as of now, and the metrics' tick.
    fn tick(&mut self, steps: u64) {
        self.stalls.total = self.started.elapsed().as_secs_f64();
        self.report.updates = self.step.updates();
        self.report.params_version = self.step.version();
        self.report.stalls = self.stalls;
        let eps = self.cfg.actors.epsilon.value(steps);
        self.setup.metrics.tick(
            steps,
            &self.report,
            self.progress.train_return(),
            eps,
            &self.setup.table,
            None,
        );
    }

    /// The end of the run: the last round's priorities in, replay closed, the final
    /// checkpoint (not after divergence: the last good one stays), and the summary or
    /// the failure.
    fn finish(
        mut self,
        reason: StopReason,
        failure: Option<Failure>,
        diverged: bool,
    ) -> Result<RunSummary, RunError> {
        let cfg = self.cfg;
        self.step.finish_priorities();
        self.setup.table.close();
        let run_finished = reason.finished().filter(|_| failure.is_none());
        let k0 = Instant::now();
        let saved = (!diverged).then(|| {
            save(
                cfg,
                &self.setup,
                self.step.dqn(),
                self.step.version(),
                self.progress.tracker.last.clone(),
                run_finished,
            )
        });
        self.stalls.checkpoint += k0.elapsed().as_secs_f64();
        self.stalls.total = self.started.elapsed().as_secs_f64();
        let saved = saved.transpose();
        if let Some(Failure { component, message }) = failure {
            return Err(RunError::Failed {
                component,
                message,
                checkpoint: super::CheckpointFate::of(&saved),
            });
        }
        match saved {
            Ok(Some(path)) => tracing::info!("checkpoint written to {}", path.display()),
            Ok(None) => {}
            Err(e) => return Err(RunError::FinalCheckpoint(e)),
        }
        self.report.updates = self.step.updates();
        self.report.params_version = self.step.version();
        self.report.stalls = self.stalls;
        let summary = self
            .progress
            .summary(cfg, &self.setup, reason, &self.report);
        self.setup.metrics.finish(&summary);
        Ok(summary)
    }
}
