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
        let result = evaluate(&cfg.env, &setup.network, &params, cfg.eval.episodes, seed)?;
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

pub fn run(
    cfg: &RunConfig,
    mut setup: Setup,
    interrupt: &AtomicBool,
) -> Result<RunSummary, RunError> {
    tch::set_num_threads(1);
    let dqn = setup.dqn.take().expect("the networks are set up once");
    let mut progress = Progress::new(cfg, setup.start_steps, setup.best.take());
    let seed_offset = setup.start_steps;
    let mut actors = Vec::new();
    for id in 0..cfg.actors.count {
        let acfg = cfg.actor(id as u32, seed_offset);
        actors.push(AnyActor::new(&acfg, &setup.network)?);
    }
    let mut staging = StagingBuffer::new(&setup.env.obs, cfg.batch_size, None);
    let mut rng = SmallRng::seed_from_u64(cfg.seed ^ 0x5eed);
    // Priorities are applied as soon as a round is complete (on the CPU, in order):
    // lock-step runs stay reproducible with prioritized replay too.
    let feedback = Some(crate::replay_flags::feedback(
        cfg.replay.priority.as_ref(),
        &setup.table,
        Device::Cpu,
        setup.steps.get(),
        cfg.poison_td(),
    ));
    let mut step = LearnerStep::new(
        dqn,
        setup.params.version(),
        cfg.learner.step(),
        vec![feedback],
        None,
    );
    // The actors pack each parameter version once between them.
    let mut source = SharedParams::new(Arc::clone(&setup.params));
    let mut stalls = StallTimes::default();
    let mut report = LearnerReport::default();
    // One thread steps, learns and ticks: its ticks are `/livez`'s signs of life.
    setup.metrics.live_on_tick(cfg.live_limit);
    let started = Instant::now();
    let mut last_ckpt = Instant::now();
    let mut failure: Option<Failure> = None;
    let mut diverged = false;
    let reason = 'run: loop {
        if interrupt.load(Ordering::Relaxed) {
            break StopReason::Interrupted;
        }
        for actor in &mut actors {
            let batch = match actor.step(&mut source, &setup.steps, &mut |e| {
                progress.episode(e.actor_id, e.episode_return);
            }) {
                Ok(b) => b,
                Err(e) => {
                    failure = Some(Failure::new(Component::Actor(None), e.to_string()));
                    break 'run StopReason::Interrupted;
                }
            };
            if let Some(batch) = batch {
                if let Err(e) = setup.table.insert_unlimited(batch) {
                    failure = Some(Failure::new(Component::Replay, e.to_string()));
                    break 'run StopReason::Interrupted;
                }
            }
        }
        // Every update the replay ratio allows now, in order.
        let c0 = Instant::now();
        while staging
            .try_fill(&setup.table, &mut rng)
            .map_err(|_| RunError::Replay(millrace_replay::ReplayError::Closed))?
        {
            let batch = staging.to_device(Device::Cpu);
            let (params, steps) = (&setup.params, &setup.steps);
            step.update(
                &batch,
                staging.keys(),
                &[steps.get()],
                &mut |version, dqn| {
                    params.publish(dqn.params(version, steps.get()));
                },
            );
            if step.updates().is_multiple_of(STATS_EVERY) {
                let health = step.check();
                report.stats = health.stats;
                report.nonfinite_total = health.nonfinite_total;
                if !health.diverged.is_empty() {
                    diverged = true;
                    failure = Some(Failure::new(
                        Component::Learner,
                        millrace_core::update_loop::LearnerError::Diverged {
                            streak: health.stats.nonfinite_streak,
                            skipped: health.nonfinite_total,
                            limit: cfg.learner.max_nonfinite,
                        }
                        .to_string(),
                    ));
                    break 'run StopReason::Interrupted;
                }
            }
        }
        let priorities_s = step.take_priority_seconds();
        stalls.priorities += priorities_s;
        stalls.compute += (c0.elapsed().as_secs_f64() - priorities_s).max(0.0);
        let steps = setup.steps.get();
        if steps < cfg.max_steps && progress.eval_due(steps, cfg.eval.every) {
            let snapshot = setup.params.latest();
            match evaluate_now(cfg, &mut setup, &mut progress, snapshot) {
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
        if let Some(every) = cfg.learner.checkpoint_every {
            if last_ckpt.elapsed() >= every {
                let k0 = Instant::now();
                let saved = save(
                    cfg,
                    &setup,
                    step.dqn(),
                    step.version(),
                    progress.tracker.last.clone(),
                    None,
                );
                if let Err(e) = &saved {
                    tracing::warn!("periodic checkpoint failed: {e}");
                }
                setup.metrics.own_checkpoint(saved.is_ok());
                stalls.checkpoint += k0.elapsed().as_secs_f64();
                report.checkpoint_stall_max =
                    report.checkpoint_stall_max.max(k0.elapsed().as_secs_f64());
                last_ckpt = Instant::now();
            }
        }
        stalls.total = started.elapsed().as_secs_f64();
        report.updates = step.updates();
        report.params_version = step.version();
        report.stalls = stalls;
        let eps = cfg.actors.epsilon.value(steps);
        setup.metrics.tick(
            steps,
            &report,
            progress.train_return(),
            eps,
            &setup.table,
            None,
        );
    };
    // The last round's priorities, before the final checkpoint copies replay.
    step.finish_priorities();
    setup.table.close();
    // The final checkpoint: not after divergence (the last good one stays).
    let run_finished = reason.finished().filter(|_| failure.is_none());
    let k0 = Instant::now();
    let saved = (!diverged).then(|| {
        save(
            cfg,
            &setup,
            step.dqn(),
            step.version(),
            progress.tracker.last.clone(),
            run_finished,
        )
    });
    stalls.checkpoint += k0.elapsed().as_secs_f64();
    stalls.total = started.elapsed().as_secs_f64();
    let saved = saved.transpose();
    if let Some(Failure { component, message }) = failure {
        return Err(RunError::Failed {
            component,
            message,
            checkpoint: super::coordinator::checkpoint_note(&saved),
        });
    }
    match saved {
        Ok(Some(path)) => tracing::info!("checkpoint written to {}", path.display()),
        Ok(None) => {}
        Err(e) => return Err(RunError::FinalCheckpoint(e)),
    }
    report.updates = step.updates();
    report.params_version = step.version();
    report.stalls = stalls;
    let summary = progress.summary(cfg, &setup, reason, &report);
    setup.metrics.finish(&summary);
    Ok(summary)
}
