//! `--actors auto` at start: the learner's ceiling and one actor thread's env steps/s,
//! each measured for about a second where the CPU plan puts it, then the count
//! [`AutoChoice`] picks. The learner's probe runs on a scratch copy of the networks (the
//! run's own are made afterwards, untouched), in a thread pinned as the learner thread
//! will be, so libtorch's autograd worker, started by the first backward pass, inherits
//! the learner's CPU.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use millrace_actor::runner::{ActorSink, EpisodeStats, SinkClosed};
use millrace_actor::{run_actor, EpsilonSchedule};
use millrace_core::ceiling::{self, Cadence};
use millrace_core::dqn::Dqn;
use millrace_proto::{ParamsCell, StepCounter, TransitionBatch};

use super::RunError;
use crate::config::RunConfig;
use crate::cpu_plan::auto::{AutoActors, AutoChoice};
use crate::cpu_plan::host::{self, Role};

/// How long each probe measures (after its warm-up).
const PROBE: Duration = Duration::from_secs(1);

/// `cfg` with `--actors auto` decided (unchanged without it), and the decision logged.
pub fn resolve(cfg: &RunConfig) -> Result<RunConfig, RunError> {
    let mut cfg = cfg.clone();
    let budget = cfg.cpu_plan.actor_budget();
    if cfg.actors.auto.is_none() {
        if cfg.actors.count > budget {
            tracing::warn!(
                "--actors {}: the CPU plan leaves {budget} CPU(s) for actors; {} threads time-share them, each preempting the others (and, with the plan off or one core short, the sampler and the learner) every few milliseconds",
                cfg.actors.count,
                cfg.actors.count
            );
        }
        return Ok(cfg);
    }
    let (updates_per_s, params) = learner_probe(&cfg)?;
    let steps_per_s = actor_probe(&cfg, params)?;
    let choice = AutoChoice::new(
        updates_per_s,
        cfg.batch_size,
        cfg.replay.samples_per_insert,
        steps_per_s,
        budget,
    );
    tracing::info!("{}", choice.explain());
    cfg.actors.count = choice.threads;
    cfg.actors.auto = Some(AutoActors::Chosen(choice));
    Ok(cfg)
}

/// The learner's ceiling on this run's network, batch and device, measured on the
/// learner's CPU; with the scratch networks' parameters, for the actor's probe.
fn learner_probe(cfg: &RunConfig) -> Result<(f64, Arc<ParamsCell>), RunError> {
    let network = cfg.network_spec()?;
    let (dqn_cfg, device, plan) = (cfg.dqn.clone(), cfg.device.device(), cfg.cpu_plan.clone());
    let (obs, actions, batch) = (
        cfg.env_spec.obs.clone(),
        cfg.env_spec.num_actions,
        cfg.batch_size,
    );
    let copy_stream = cfg.learner.copy_stream;
    let seed = cfg.seed;
    let probe = std::thread::Builder::new()
        .name("probe-learner".into())
        .spawn(move || {
            host::enter(&plan, Role::Learner(0));
            tch::set_num_threads(1);
            let mut dqn = Dqn::new(network, dqn_cfg, device, seed);
            let resident = ceiling::random_batch(&obs, actions, batch, device);
            let cuda = matches!(device, tch::Device::Cuda(_));
            let cadence = Cadence::learner(&obs, batch, cuda, copy_stream);
            let rate = ceiling::updates_per_s(
                &mut dqn,
                &resident,
                device,
                PROBE.as_secs_f64(),
                3,
                cadence,
            );
            (rate, dqn.params(1, 0))
        })
        .map_err(|e| {
            RunError::Device(format!(
                "--actors auto: cannot start the learner's probe: {e}"
            ))
        })?;
    let (rate, params) = probe.join().map_err(|p| {
        RunError::Device(format!(
            "--actors auto: the learner's probe failed: {}",
            crate::panic_message(&*p)
        ))
    })?;
    Ok((rate, Arc::new(ParamsCell::new(params))))
}

/// Counts and drops.
struct Discard;

impl ActorSink for Discard {
    fn transitions(&mut self, _: &mut TransitionBatch) -> Result<(), SinkClosed> {
        Ok(())
    }
    fn episode(&mut self, _: EpisodeStats) {}
}

/// One actor thread's env steps/s with this run's environment, network and batching,
/// acting greedily but for ε = 0.05 (inference on every step, as late in a run), on
/// the actors' CPUs.
fn actor_probe(cfg: &RunConfig, params: Arc<ParamsCell>) -> Result<f64, RunError> {
    let mut acfg = cfg.actor(0, 0);
    acfg.epsilon = EpsilonSchedule::Constant(0.05);
    acfg.env_epsilons = None;
    let network = cfg.network_spec()?;
    let plan = cfg.cpu_plan.clone();
    let steps = Arc::new(StepCounter::default());
    let stop = Arc::new(AtomicBool::new(false));
    let actor = {
        let (steps, stop) = (Arc::clone(&steps), Arc::clone(&stop));
        std::thread::Builder::new()
            .name("probe-actor".into())
            .spawn(move || {
                host::enter(&plan, Role::Actor);
                let mut params = params;
                run_actor(&acfg, &network, &mut params, &mut Discard, &steps, &stop)
                    .map_err(|e| e.to_string())
            })
            .map_err(|e| {
                RunError::Device(format!(
                    "--actors auto: cannot start the actor's probe: {e}"
                ))
            })?
    };
    // Measured once the environments are up and stepping (the first batch handed on),
    // for PROBE; a probe that ends early (a bad environment) is reported.
    let begun = Instant::now();
    while steps.get() == 0 && !actor.is_finished() && begun.elapsed() < 30 * PROBE {
        std::thread::sleep(Duration::from_millis(5));
    }
    let (s0, t0) = (steps.get(), Instant::now());
    while t0.elapsed() < PROBE && !actor.is_finished() {
        std::thread::sleep(Duration::from_millis(5));
    }
    let (s1, dt) = (steps.get(), t0.elapsed().as_secs_f64());
    stop.store(true, Ordering::Relaxed);
    match actor.join() {
        Ok(Ok(_)) => Ok((s1 - s0) as f64 / dt),
        Ok(Err(e)) => Err(RunError::Device(format!(
            "--actors auto: the actor's probe failed: {e}"
        ))),
        Err(p) => Err(RunError::Device(format!(
            "--actors auto: the actor's probe failed: {}",
            crate::panic_message(&*p)
        ))),
    }
}
