//! The actor loop: step a set of environments with one batched forward pass per step,
//! build n-step transitions, and hand them on in batches.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytemuck::Pod;
use millrace_proto::{Params, TransitionBatch};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::env::{self, Env, EnvError};
use crate::nstep::NStep;
use crate::policy::{argmax_rows, MlpPolicy, Policy, PolicyError};
use crate::schedule::EpsilonSchedule;

/// Everything one actor needs, checked by whoever builds it.
#[derive(Clone, Debug)]
pub struct ActorConfig {
    /// Actor slot; also selects the seed stream.
    pub actor_id: u32,
    pub env_id: String,
    /// Environments stepped together, one batched forward pass for all of them.
    pub num_envs: usize,
    pub seed: u64,
    /// Steps summed into each transition's return.
    pub n_step: usize,
    pub gamma: f32,
    /// Transitions per batch handed to the sink.
    pub batch_rows: usize,
    /// Exploration shared by all environments (embedded mode: a decaying schedule)...
    pub epsilon: EpsilonSchedule,
    /// ...or a fixed ε per environment (Ape-X: one per actor slot), when given.
    pub env_epsilons: Option<Vec<f32>>,
}

/// A finished episode, as seen by an actor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EpisodeStats {
    pub actor_id: u32,
    pub episode_return: f32,
    pub length: u32,
    /// Global env steps when it ended.
    pub env_steps: u64,
}

/// Where an actor's output goes: replay (in-process) or a connection to the learner.
///
/// `transitions` may block: that is how replay's rate limiter throttles actors. An `Err`
/// means the receiver is gone and the actor should stop.
pub trait ActorSink {
    fn transitions(&mut self, batch: TransitionBatch) -> Result<(), SinkClosed>;
    fn episode(&mut self, stats: EpisodeStats);
}

/// The receiving side of an [`ActorSink`] has gone away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the transition sink is closed")]
pub struct SinkClosed;

/// Where an actor gets parameters from (latest-only: it never sees a backlog).
pub trait ParamsSource {
    /// The newest snapshot if it is newer than `have`.
    fn newer_than(&mut self, have: Option<u64>) -> Option<Arc<Params>>;
}

/// State shared between the actors of one process and whoever runs them.
#[derive(Debug, Default)]
pub struct ActorControl {
    pub stop: AtomicBool,
    /// Environment steps taken by all actors together (drives the ε schedule).
    pub env_steps: AtomicU64,
}

impl ActorControl {
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ActorError {
    #[error(transparent)]
    Env(#[from] EnvError),
    #[error("bad parameters from the learner: {0}")]
    Policy(#[from] PolicyError),
}

/// Runs one actor on the classic-control environment `cfg.env_id` until
/// `control.stop` is set or the sink closes. Returns the number of environment steps it
/// took.
pub fn run_actor(
    cfg: &ActorConfig,
    policy: &mut MlpPolicy,
    params: &mut dyn ParamsSource,
    sink: &mut dyn ActorSink,
    control: &ActorControl,
) -> Result<u64, ActorError> {
    let seed = crate::derive_seed(cfg.seed, u64::from(cfg.actor_id));
    let envs = (0..cfg.num_envs)
        .map(|i| env::make(&cfg.env_id, crate::derive_seed(seed, i as u64)))
        .collect::<Result<_, _>>()?;
    run_actor_with(cfg, envs, policy, params, sink, control)
}

/// Runs one actor on the given environments (all of one kind, `cfg.num_envs` of them),
/// with observations of element type `O` (`f32` vectors, `u8` images).
pub fn run_actor_with<O: Pod + Default>(
    cfg: &ActorConfig,
    mut envs: Vec<Box<dyn Env<O>>>,
    policy: &mut dyn Policy<O>,
    params: &mut dyn ParamsSource,
    sink: &mut dyn ActorSink,
    control: &ActorControl,
) -> Result<u64, ActorError> {
    let seed = crate::derive_seed(cfg.seed, u64::from(cfg.actor_id));
    let mut rng = SmallRng::seed_from_u64(seed);
    let Some(first) = envs.first() else {
        return Ok(0);
    };
    let spec = first.spec().clone();
    let obs_dim = spec.obs.numel();
    let num_actions = spec.num_actions;
    let n = envs.len();

    let mut obs = vec![O::default(); n * obs_dim];
    let mut next = vec![O::default(); obs_dim];
    let mut q = vec![0.0f32; n * num_actions];
    let mut greedy = vec![0usize; n];
    let mut windows: Vec<NStep> = (0..n).map(|_| NStep::new(cfg.n_step, cfg.gamma)).collect();
    let mut returns = vec![0.0f32; n];
    let mut lengths = vec![0u32; n];
    let row_bytes = spec.obs.row_bytes();
    // Each step adds one row per environment; a handed-on batch carries up to n_step
    // rows per environment into the next.
    let new_batch = || {
        TransitionBatch::with_capacity(
            row_bytes,
            cfg.batch_rows + n * cfg.n_step,
            cfg.batch_rows + 2 * n * (cfg.n_step + 1),
        )
    };
    let mut batch = new_batch();
    for (i, env) in envs.iter_mut().enumerate() {
        let cur = &mut obs[i * obs_dim..(i + 1) * obs_dim];
        env.reset(Some(crate::derive_seed(seed, 1 << 32 | i as u64)), cur);
        windows[i].start(cur, &mut batch);
    }

    let mut batch_version = None;
    let mut seq = 0u64;
    let mut steps = 0u64;

    while !control.stopped() {
        if let Some(p) = params.newer_than(policy.version()) {
            policy.load(&p)?;
            // A remote actor's schedule follows the learner's global step count.
            control.env_steps.fetch_max(p.env_steps, Ordering::Relaxed);
        }
        let global = control.env_steps.load(Ordering::Relaxed);
        let eps = cfg.epsilon.value(global);
        if policy.version().is_some() {
            policy.q_values(&obs, &mut q);
            argmax_rows(&q, num_actions, &mut greedy);
        }
        if batch.is_empty() {
            batch_version = policy.version();
        }
        for i in 0..n {
            let eps = cfg
                .env_epsilons
                .as_ref()
                .and_then(|e| e.get(i).copied())
                .unwrap_or(eps);
            let explore = policy.version().is_none() || rng.random::<f32>() < eps;
            let action = if explore {
                rng.random_range(0..num_actions)
            } else {
                greedy[i]
            };
            let cur = &mut obs[i * obs_dim..(i + 1) * obs_dim];
            let step = envs[i].step(action, &mut next);
            windows[i].push(action as i64, step, &next, &mut batch);
            returns[i] += step.reward;
            lengths[i] += 1;
            if step.done() {
                sink.episode(EpisodeStats {
                    actor_id: cfg.actor_id,
                    episode_return: returns[i],
                    length: lengths[i],
                    env_steps: control.env_steps.load(Ordering::Relaxed),
                });
                returns[i] = 0.0;
                lengths[i] = 0;
                envs[i].reset(None, cur);
                windows[i].start(cur, &mut batch);
            } else {
                cur.copy_from_slice(&next);
            }
        }
        steps += n as u64;
        control.env_steps.fetch_add(n as u64, Ordering::Relaxed);

        if batch.len() >= cfg.batch_rows {
            let mut full = new_batch();
            std::mem::swap(&mut full, &mut batch);
            for w in &mut windows {
                w.carry(&full, &mut batch);
            }
            full.actor_id = cfg.actor_id;
            full.seq = seq;
            full.version = batch_version.unwrap_or(0);
            seq += 1;
            if sink.transitions(full).is_err() {
                break;
            }
        }
    }
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env;
    use millrace_proto::NetworkSpec;

    #[derive(Default)]
    struct Collect {
        batches: Vec<TransitionBatch>,
        episodes: Vec<EpisodeStats>,
        limit: usize,
    }

    impl ActorSink for Collect {
        fn transitions(&mut self, batch: TransitionBatch) -> Result<(), SinkClosed> {
            self.batches.push(batch);
            if self.batches.len() >= self.limit {
                Err(SinkClosed)
            } else {
                Ok(())
            }
        }
        fn episode(&mut self, stats: EpisodeStats) {
            self.episodes.push(stats);
        }
    }

    struct NoParams;
    impl ParamsSource for NoParams {
        fn newer_than(&mut self, _: Option<u64>) -> Option<Arc<Params>> {
            None
        }
    }

    fn run(seed: u64) -> Collect {
        let spec = env::spec("CartPole-v1").unwrap();
        let net = NetworkSpec::mlp(&spec.obs, &[8], 2, 1).unwrap();
        let mut policy = MlpPolicy::new(net, 0).unwrap();
        let cfg = ActorConfig {
            actor_id: 0,
            env_id: "CartPole-v1".into(),
            num_envs: 4,
            seed,
            n_step: 3,
            gamma: 0.99,
            batch_rows: 64,
            epsilon: EpsilonSchedule::Constant(1.0),
            env_epsilons: None,
        };
        let mut sink = Collect {
            limit: 10,
            ..Collect::default()
        };
        let control = ActorControl::default();
        run_actor(&cfg, &mut policy, &mut NoParams, &mut sink, &control).unwrap();
        assert!(control.env_steps.load(Ordering::Relaxed) >= 640);
        sink
    }

    #[test]
    fn streams_valid_batches_in_sequence_and_reports_episodes() {
        let out = run(1);
        assert_eq!(out.batches.len(), 10);
        for (i, b) in out.batches.iter().enumerate() {
            assert_eq!(b.seq, i as u64);
            assert!(b.len() >= 64);
            b.validate(16).unwrap();
            assert!(b
                .discounts
                .iter()
                .all(|d| [0.0, 0.99, 0.99f32 * 0.99, 0.99f32.powi(3)]
                    .iter()
                    .any(|x| (x - d).abs() < 1e-6)));
        }
        // A random CartPole policy falls within ~22 steps: many episodes, all short.
        assert!(out.episodes.len() > 10);
        assert!(out
            .episodes
            .iter()
            .all(|e| e.length <= 500 && e.episode_return == e.length as f32));
        let terminal = out
            .batches
            .iter()
            .flat_map(|b| &b.discounts)
            .filter(|d| **d == 0.0)
            .count();
        assert!(
            terminal >= out.episodes.len(),
            "every episode ends in terminal rows"
        );
    }

    #[test]
    fn same_seed_same_stream() {
        let (a, b) = (run(5), run(5));
        assert_eq!(a.batches, b.batches);
        assert_ne!(a.batches, run(6).batches);
    }
}
