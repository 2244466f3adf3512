//! The actor loop: step a set of environments with one batched forward pass per step,
//! build n-step transitions, and hand them on in batches.
//!
//! [`ActorLoop`] is the loop's state, advanced one step of every environment at a time
//! by whoever drives it: [`run_actor_with`] in a thread of its own (embedded actors,
//! remote actors), or the learner's lock-step mode, which interleaves actor steps and
//! updates in one thread for bit-reproducible runs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytemuck::Pod;
use millrace_proto::{Params, ParamsCell, StepCounter, TransitionBatch};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::env::{self, Env, EnvError};
use crate::nstep::NStep;
use crate::policy::{argmax_rows, Policy, PolicyError};
use crate::schedule::EpsilonSchedule;

/// Everything one actor needs, checked by whoever builds it.
#[derive(Clone, Debug)]
pub struct ActorConfig {
    /// Identifies the actor; also selects its seed stream.
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
    /// ...or a fixed ε per environment (Ape-X: one per environment), when given.
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

/// No parameters ever: the actor explores uniformly at random (warm-up data, tests and
/// benchmarks that need transitions but no learner).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoParams;

impl ParamsSource for NoParams {
    fn newer_than(&mut self, _have: Option<u64>) -> Option<Arc<Params>> {
        None
    }
}

impl ParamsSource for Arc<ParamsCell> {
    fn newer_than(&mut self, have: Option<u64>) -> Option<Arc<Params>> {
        ParamsCell::newer_than(self, have)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ActorError {
    #[error(transparent)]
    Env(#[from] EnvError),
    #[error("bad parameters from the learner: {0}")]
    Policy(#[from] PolicyError),
}

/// Builds `cfg.num_envs` classic-control environments `cfg.env_id`, seeded from the
/// actor's stream.
pub fn make_envs(cfg: &ActorConfig) -> Result<Vec<Box<dyn Env>>, EnvError> {
    let seed = crate::derive_seed(cfg.seed, u64::from(cfg.actor_id));
    (0..cfg.num_envs)
        .map(|i| env::make(&cfg.env_id, crate::derive_seed(seed, i as u64)))
        .collect()
}

/// One actor's state between steps: its environments, their n-step windows, the batch
/// being built and its random stream.
pub struct ActorLoop<O> {
    cfg: ActorConfig,
    envs: Vec<Box<dyn Env<O>>>,
    rng: SmallRng,
    obs_dim: usize,
    num_actions: usize,
    obs: Vec<O>,
    next: Vec<O>,
    q: Vec<f32>,
    greedy: Vec<usize>,
    windows: Vec<NStep>,
    returns: Vec<f32>,
    lengths: Vec<u32>,
    row_bytes: usize,
    batch: TransitionBatch,
    batch_version: Option<u64>,
    seq: u64,
    steps: u64,
}

impl<O> std::fmt::Debug for ActorLoop<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActorLoop")
            .field("actor_id", &self.cfg.actor_id)
            .field("envs", &self.envs.len())
            .field("steps", &self.steps)
            .finish_non_exhaustive()
    }
}

impl<O: Pod + Default> ActorLoop<O> {
    /// Takes the environments (all of one kind, at least one) and resets them.
    ///
    /// # Panics
    /// If `envs` is empty.
    pub fn new(cfg: &ActorConfig, mut envs: Vec<Box<dyn Env<O>>>) -> Self {
        assert!(!envs.is_empty(), "an actor needs environments");
        let seed = crate::derive_seed(cfg.seed, u64::from(cfg.actor_id));
        let spec = envs[0].spec().clone();
        let (obs_dim, num_actions, n) = (spec.obs.numel(), spec.num_actions, envs.len());
        let row_bytes = spec.obs.row_bytes();
        let mut obs = vec![O::default(); n * obs_dim];
        let mut windows: Vec<NStep> = (0..n).map(|_| NStep::new(cfg.n_step, cfg.gamma)).collect();
        let mut batch = Self::new_batch(cfg, row_bytes, n);
        for (i, env) in envs.iter_mut().enumerate() {
            let cur = &mut obs[i * obs_dim..(i + 1) * obs_dim];
            env.reset(Some(crate::derive_seed(seed, 1 << 32 | i as u64)), cur);
            windows[i].start(cur, &mut batch);
        }
        Self {
            cfg: cfg.clone(),
            envs,
            rng: SmallRng::seed_from_u64(seed),
            obs_dim,
            num_actions,
            obs,
            next: vec![O::default(); obs_dim],
            q: vec![0.0; n * num_actions],
            greedy: vec![0; n],
            windows,
            returns: vec![0.0; n],
            lengths: vec![0; n],
            row_bytes,
            batch,
            batch_version: None,
            seq: 0,
            steps: 0,
        }
    }

    /// Each step adds one row per environment; a handed-on batch carries up to n_step
    /// rows per environment into the next.
    fn new_batch(cfg: &ActorConfig, row_bytes: usize, n: usize) -> TransitionBatch {
        TransitionBatch::with_capacity(
            row_bytes,
            cfg.batch_rows + n * cfg.n_step,
            cfg.batch_rows + 2 * n * (cfg.n_step + 1),
        )
    }

    /// Environment steps this actor has taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// One step of every environment with one batched forward pass: loads newer
    /// parameters first, counts the steps in `steps` (whose total drives ε), reports
    /// finished episodes to `on_episode`, and returns a batch once `batch_rows`
    /// transitions are complete.
    pub fn step(
        &mut self,
        policy: &mut dyn Policy<O>,
        params: &mut dyn ParamsSource,
        steps: &StepCounter,
        on_episode: &mut dyn FnMut(EpisodeStats),
    ) -> Result<Option<TransitionBatch>, ActorError> {
        let (n, obs_dim, num_actions) = (self.envs.len(), self.obs_dim, self.num_actions);
        if let Some(p) = params.newer_than(policy.version()) {
            policy.load(&p)?;
            // A remote actor's schedule follows the learner's global step count.
            steps.raise_to(p.env_steps);
        }
        let eps = self.cfg.epsilon.value(steps.get());
        if policy.version().is_some() {
            policy.q_values(&self.obs, &mut self.q);
            argmax_rows(&self.q, num_actions, &mut self.greedy);
        }
        if self.batch.is_empty() {
            self.batch_version = policy.version();
        }
        for i in 0..n {
            let eps = self
                .cfg
                .env_epsilons
                .as_ref()
                .and_then(|e| e.get(i).copied())
                .unwrap_or(eps);
            let explore = policy.version().is_none() || self.rng.random::<f32>() < eps;
            let action = if explore {
                self.rng.random_range(0..num_actions)
            } else {
                self.greedy[i]
            };
            let cur = &mut self.obs[i * obs_dim..(i + 1) * obs_dim];
            let step = self.envs[i].step(action, &mut self.next);
            self.windows[i].push(action as i64, step, &self.next, &mut self.batch);
            self.returns[i] += step.reward;
            self.lengths[i] += 1;
            if step.done() {
                on_episode(EpisodeStats {
                    actor_id: self.cfg.actor_id,
                    episode_return: self.returns[i],
                    length: self.lengths[i],
                    env_steps: steps.get(),
                });
                self.returns[i] = 0.0;
                self.lengths[i] = 0;
                self.envs[i].reset(None, cur);
                self.windows[i].start(cur, &mut self.batch);
            } else {
                cur.copy_from_slice(&self.next);
            }
        }
        self.steps += n as u64;
        steps.add(n as u64);

        if self.batch.len() < self.cfg.batch_rows {
            return Ok(None);
        }
        let mut full = Self::new_batch(&self.cfg, self.row_bytes, n);
        std::mem::swap(&mut full, &mut self.batch);
        for w in &mut self.windows {
            w.carry(&full, &mut self.batch);
        }
        full.actor_id = self.cfg.actor_id;
        full.seq = self.seq;
        full.version = self.batch_version.unwrap_or(0);
        self.seq += 1;
        Ok(Some(full))
    }
}

/// Runs one actor on the classic-control environment `cfg.env_id` until `stop` is set
/// or the sink closes. Returns the number of environment steps it took.
pub fn run_actor(
    cfg: &ActorConfig,
    policy: &mut dyn Policy,
    params: &mut dyn ParamsSource,
    sink: &mut dyn ActorSink,
    steps: &StepCounter,
    stop: &AtomicBool,
) -> Result<u64, ActorError> {
    let envs = make_envs(cfg)?;
    run_actor_with(cfg, envs, policy, params, sink, steps, stop)
}

/// Runs one actor on the given environments (all of one kind, `cfg.num_envs` of them),
/// with observations of element type `O` (`f32` vectors, `u8` images).
pub fn run_actor_with<O: Pod + Default>(
    cfg: &ActorConfig,
    envs: Vec<Box<dyn Env<O>>>,
    policy: &mut dyn Policy<O>,
    params: &mut dyn ParamsSource,
    sink: &mut dyn ActorSink,
    steps: &StepCounter,
    stop: &AtomicBool,
) -> Result<u64, ActorError> {
    if envs.is_empty() {
        return Ok(0);
    }
    let mut actor = ActorLoop::new(cfg, envs);
    while !stop.load(Ordering::Relaxed) {
        let batch = actor.step(policy, params, steps, &mut |e| sink.episode(e))?;
        if let Some(batch) = batch {
            if sink.transitions(batch).is_err() {
                break;
            }
        }
    }
    Ok(actor.steps())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env;
    use crate::MlpPolicy;
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
        let steps = StepCounter::default();
        let taken = run_actor(
            &cfg,
            &mut policy,
            &mut NoParams,
            &mut sink,
            &steps,
            &AtomicBool::new(false),
        )
        .unwrap();
        assert!(steps.get() >= 640);
        assert_eq!(taken, steps.get());
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
