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
use millrace_proto::{
    batch::Overshoot, DType, EnvConfig, NetworkSpec, Params, ParamsCell, StepCounter,
    TransitionBatch,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::cnn::CnnPolicy;
use crate::env::{self, EnvError, Step, VecEnv};
use crate::frames::FrameWriter;
use crate::nstep::{NStep, Rows};
use crate::policy::{argmax_rows, MlpPolicy, Policy, PolicyError};
use crate::schedule::EpsilonSchedule;

/// Everything one actor needs, checked by whoever builds it.
#[derive(Clone, Debug)]
pub struct ActorConfig {
    /// Identifies the actor; also selects its seed stream.
    pub actor_id: u32,
    /// The environment, and how to build it.
    pub env: EnvConfig,
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
    /// Rewards in transitions clipped to [-1, 1] (DQN on Atari); episode returns stay
    /// the environment's own.
    pub clip_rewards: bool,
    /// Send each transition's initial priority, its n-step TD error under this actor's
    /// copy of the parameters (Ape-X), for prioritized replay. Whole-observation
    /// batches only: frame-mode batches (stacked pixels) go without, and replay gives
    /// their items the running maximum.
    pub initial_priorities: bool,
    /// What a transition's values may be ([`millrace_proto::bounds`]): batches with a
    /// value out of bounds are dropped and counted here, before anything downstream
    /// sees them. A remote actor checks finiteness only; its learner screens the rest.
    pub value_bounds: millrace_proto::ValueBounds,
}

pub use millrace_proto::EpisodeStats;

/// Where an actor's output goes: replay (in-process) or a connection to the learner.
///
/// `transitions` may block: that is how replay's rate limiter throttles actors. An `Err`
/// means the receiver is gone and the actor should stop.
///
/// The batch stays the actor's, so that its allocations are used again: a sink that
/// copies it out (replay) leaves it as it is; one that must keep it (a connection's
/// writer) swaps in a spare, a batch it was handed earlier and is done with (or an
/// empty one). Whatever `batch` holds afterwards, the actor empties and refills.
pub trait ActorSink {
    fn transitions(&mut self, batch: &mut TransitionBatch) -> Result<(), SinkClosed>;
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

    /// Where the actors reading this source share each version's packing, if they do
    /// ([`crate::SharedParams`]); otherwise each actor packs its own.
    fn shelf(&self) -> Option<&crate::PackShelf> {
        None
    }
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
    #[error("the network does not fit the environment: {0}")]
    Network(String),
    #[error(
        "the environment {env} keeps producing bad values: {what} in {in_a_row} batches in a \
         row ({rejected} batches rejected in all; none was stored)"
    )]
    BadValues {
        env: String,
        what: String,
        in_a_row: u32,
        rejected: u64,
    },
}

/// Batches in a row with a non-finite reward or observation after which an actor stops
/// (each one is dropped and counted before that: an environment that slips once does
/// not end a run, one that keeps doing it does).
pub const MAX_BAD_BATCHES_IN_A_ROW: u32 = 10;

/// Builds the actor's `cfg.num_envs` environments, seeded from the actor's stream.
pub fn make_envs(cfg: &ActorConfig) -> Result<env::AnyVecEnv, EnvError> {
    let seed = crate::derive_seed(cfg.seed, u64::from(cfg.actor_id));
    env::make_vec(&cfg.env, cfg.num_envs, seed)
}

/// One actor's state between steps: its environments, their n-step windows, the batch
/// being built and its random stream.
pub struct ActorLoop<O> {
    cfg: ActorConfig,
    envs: Box<dyn VecEnv<O>>,
    rng: SmallRng,
    obs_dim: usize,
    num_actions: usize,
    /// The observation each environment acts in, row by row.
    obs: Vec<O>,
    /// What followed each environment's action.
    next: Vec<O>,
    outcomes: Vec<Step>,
    actions: Vec<usize>,
    q: Vec<f32>,
    greedy: Vec<usize>,
    windows: Vec<NStep>,
    returns: Vec<f32>,
    lengths: Vec<u32>,
    row_bytes: usize,
    obs_dtype: DType,
    out: Output,
    /// The batch handed on last (and the next one's spare).
    ready: TransitionBatch,
    /// Scratch for Ape-X's initial priorities: the batch's rows as `O`, their Q-values.
    priority_obs: Vec<O>,
    priority_q: Vec<f32>,
    batch_version: Option<u64>,
    seq: u64,
    steps: u64,
    /// Batches dropped for bad values, in all and in a row.
    rejected: u64,
    bad_in_a_row: u32,
}

impl<O> std::fmt::Debug for ActorLoop<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActorLoop")
            .field("actor_id", &self.cfg.actor_id)
            .field("envs", &self.envs.num_envs())
            .field("steps", &self.steps)
            .finish_non_exhaustive()
    }
}

impl<O: Pod + Default> ActorLoop<O> {
    /// Takes the environments (at least one) and starts an episode in each.
    pub fn new(cfg: &ActorConfig, mut envs: Box<dyn VecEnv<O>>) -> Result<Self, EnvError> {
        let seed = crate::derive_seed(cfg.seed, u64::from(cfg.actor_id));
        let spec = envs.spec().clone();
        let (obs_dim, num_actions, n) = (spec.obs.numel(), spec.num_actions, envs.num_envs());
        let row_bytes = spec.obs.row_bytes();
        let mut obs = vec![O::default(); n * obs_dim];
        let mut windows: Vec<NStep> = (0..n)
            .map(|i| NStep::new(cfg.n_step, cfg.gamma).for_env(i))
            .collect();
        let mut out = if spec.frame_stack > 1 {
            Output::Frames(FrameWriter::new(
                spec.frame_stack,
                row_bytes,
                n,
                cfg.batch_rows + n * cfg.n_step,
                cfg.batch_rows + n * (spec.frame_stack + 1),
            ))
        } else {
            Output::Rows(Self::new_batch(cfg, row_bytes, n))
        };
        let seeds: Vec<u64> = (0..n)
            .map(|i| crate::derive_seed(seed, 1 << 32 | i as u64))
            .collect();
        envs.reset(&seeds, &mut obs)?;
        for (i, window) in windows.iter_mut().enumerate() {
            window.start(&obs[i * obs_dim..(i + 1) * obs_dim], &mut out);
        }
        Ok(Self {
            cfg: cfg.clone(),
            envs,
            rng: SmallRng::seed_from_u64(seed),
            obs_dim,
            num_actions,
            obs,
            next: vec![O::default(); n * obs_dim],
            outcomes: vec![Step::default(); n],
            actions: vec![0; n],
            q: vec![0.0; n * num_actions],
            greedy: vec![0; n],
            windows,
            returns: vec![0.0; n],
            lengths: vec![0; n],
            row_bytes,
            obs_dtype: spec.obs.dtype,
            out,
            ready: TransitionBatch::default(),
            priority_obs: Vec::new(),
            priority_q: Vec::new(),
            batch_version: None,
            seq: 0,
            steps: 0,
            rejected: 0,
            bad_in_a_row: 0,
        })
    }

    /// Each step adds one row per environment; a handed-on batch carries up to n_step
    /// rows per environment into the next.
    fn new_batch(cfg: &ActorConfig, row_bytes: usize, n: usize) -> TransitionBatch {
        let mut batch = TransitionBatch::default();
        Self::reuse_batch(&mut batch, cfg, row_bytes, n);
        batch
    }

    fn reuse_batch(batch: &mut TransitionBatch, cfg: &ActorConfig, row_bytes: usize, n: usize) {
        batch.frames = None;
        let past = Overshoot::of(n, cfg.n_step);
        batch.reuse(
            row_bytes,
            cfg.batch_rows + past.transitions,
            cfg.batch_rows + past.obs_rows,
        );
    }

    /// Environment steps this actor has taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// One step of every environment with one batched forward pass: loads newer
    /// parameters first, counts the steps in `steps` (whose total drives ε), reports
    /// finished episodes to `on_episode`, and returns a batch once `batch_rows`
    /// transitions are complete. The batch stays the actor's (see [`ActorSink`]): it
    /// is emptied and refilled a batch later, so a steady actor step allocates nothing.
    pub fn step(
        &mut self,
        policy: &mut dyn Policy<O>,
        params: &mut dyn ParamsSource,
        steps: &StepCounter,
        on_episode: &mut dyn FnMut(EpisodeStats),
    ) -> Result<Option<&mut TransitionBatch>, ActorError> {
        let (n, obs_dim, num_actions) = (self.envs.num_envs(), self.obs_dim, self.num_actions);
        if let Some(p) = params.newer_than(policy.version()) {
            match params.shelf() {
                Some(shelf) => policy.load_shared(&p, shelf)?,
                None => policy.load(&p)?,
            }
            // A remote actor's schedule follows the learner's global step count.
            steps.raise_to(p.env_steps);
        }
        let eps = self.cfg.epsilon.value(steps.get());
        if policy.version().is_some() {
            policy.q_values(&self.obs, &mut self.q);
            argmax_rows(&self.q, num_actions, &mut self.greedy);
        }
        if self.out.len() == 0 {
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
            self.actions[i] = if explore {
                self.rng.random_range(0..num_actions)
            } else {
                self.greedy[i]
            };
        }
        // Ended episodes' next first observations land in `obs` directly.
        self.envs.step(
            &self.actions,
            &mut self.next,
            &mut self.obs,
            &mut self.outcomes,
        )?;
        for i in 0..n {
            let step = self.outcomes[i];
            let rows = i * obs_dim..(i + 1) * obs_dim;
            // What training sees: clipped rewards, a lost life as the end of a chain.
            let mut train = step;
            if self.cfg.clip_rewards {
                train.reward = step.reward.clamp(-1.0, 1.0);
            }
            // A lost life ends the chain (also on a step the time limit cut).
            train.terminated |= step.life_lost;
            self.windows[i].push(
                self.actions[i] as i64,
                train,
                &self.next[rows.clone()],
                &mut self.out,
            );
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
                self.windows[i].start(&self.obs[rows], &mut self.out);
            } else {
                self.obs[rows.clone()].copy_from_slice(&self.next[rows.clone()]);
                if train.terminated {
                    // The game goes on after a lost life: a new chain starts here.
                    self.windows[i].start(&self.obs[rows], &mut self.out);
                }
            }
        }
        self.steps += n as u64;
        steps.add(n as u64);

        if self.out.len() < self.cfg.batch_rows {
            return Ok(None);
        }
        let full = &mut self.ready;
        match &mut self.out {
            Output::Rows(batch) => {
                Self::reuse_batch(full, &self.cfg, self.row_bytes, n);
                std::mem::swap(full, batch);
                for w in &mut self.windows {
                    w.carry(full, batch);
                }
            }
            Output::Frames(writer) => writer.swap_out(full),
        }
        // What the environment gave, checked before anything downstream sees it (replay,
        // the wire): a NaN observation or reward would poison every update sampling it.
        if let Err(e) = full.check_values(self.num_actions, self.obs_dtype, &self.cfg.value_bounds)
        {
            self.rejected += 1;
            self.bad_in_a_row += 1;
            if self.bad_in_a_row >= MAX_BAD_BATCHES_IN_A_ROW {
                return Err(ActorError::BadValues {
                    env: self.cfg.env.id.clone(),
                    what: e.to_string(),
                    in_a_row: self.bad_in_a_row,
                    rejected: self.rejected,
                });
            }
            if self.rejected.is_power_of_two() {
                tracing::warn!(
                    "actor {}: the environment {} gave a {e}: a batch of {} transitions dropped ({} so far)",
                    self.cfg.actor_id,
                    self.cfg.env.id,
                    full.len(),
                    self.rejected
                );
            }
            return Ok(None);
        }
        self.bad_in_a_row = 0;
        if self.cfg.initial_priorities && policy.version().is_some() && full.frames.is_none() {
            let scratch = (&mut self.priority_obs, &mut self.priority_q);
            initial_priorities(policy, full, self.num_actions, scratch);
        }
        full.actor_id = self.cfg.actor_id;
        full.seq = self.seq;
        full.version = self.batch_version.unwrap_or(0);
        self.seq += 1;
        Ok(Some(full))
    }
}

/// Sets a whole-observation batch's priorities to its n-step TD errors under `policy`
/// (Ape-X's actors: one batched forward pass over the batch's rows):
/// `|R + γ^n·max_a Q(s', a) − Q(s, a)|`, the discount 0 where the episode ended. The
/// actor has no target network, so its own parameters stand in for it. A batch whose
/// rows cannot be read as observations keeps no priorities.
fn initial_priorities<O: Pod + Default>(
    policy: &mut dyn Policy<O>,
    batch: &mut TransitionBatch,
    num_actions: usize,
    (obs, q): (&mut Vec<O>, &mut Vec<f32>),
) {
    // A copy: a byte vector is not aligned for `O` (once per batch, not per step).
    let size = std::mem::size_of::<O>();
    if size == 0 || !batch.obs.len().is_multiple_of(size) {
        return;
    }
    obs.clear();
    obs.resize(batch.obs.len() / size, O::default());
    bytemuck::cast_slice_mut::<O, u8>(obs).copy_from_slice(&batch.obs);
    let rows = batch.obs_rows();
    q.clear();
    q.resize(rows * num_actions, 0.0);
    policy.q_values(obs, q);
    let row = |i: u32| &q[i as usize * num_actions..(i as usize + 1) * num_actions];
    batch.priorities.clear();
    batch.priorities.extend((0..batch.len()).map(|i| {
        let taken = row(batch.obs_index[i])[batch.actions[i] as usize];
        let next = row(batch.next_index[i])
            .iter()
            .copied()
            .fold(f32::NEG_INFINITY, f32::max);
        let target = batch.rewards[i] + batch.discounts[i] * next;
        (target - taken).abs()
    }));
}

/// What the n-step windows write into: whole observation rows (carried from batch to
/// batch), or frames of the actor's stream for stacked observations (each frame once).
#[derive(Debug)]
enum Output {
    Rows(TransitionBatch),
    Frames(FrameWriter),
}

impl Output {
    /// Transitions in the batch being built.
    fn len(&self) -> usize {
        match self {
            Self::Rows(batch) => batch.len(),
            Self::Frames(writer) => writer.batch().len(),
        }
    }
}

impl Rows for Output {
    fn store(&mut self, env: usize, obs: &[u8]) -> u64 {
        match self {
            Self::Rows(batch) => batch.store(env, obs),
            Self::Frames(writer) => writer.store(env, obs),
        }
    }

    fn transition(
        &mut self,
        env: usize,
        obs: u64,
        action: i64,
        reward: f32,
        discount: f32,
        next: u64,
    ) {
        match self {
            Self::Rows(batch) => batch.transition(env, obs, action, reward, discount, next),
            Self::Frames(writer) => writer.transition(env, obs, action, reward, discount, next),
        }
    }
}

/// Runs one actor on `cfg.env` with the policy `network` calls for, until `stop` is set
/// or the sink closes. Returns the number of environment steps it took.
pub fn run_actor(
    cfg: &ActorConfig,
    network: &NetworkSpec,
    params: &mut dyn ParamsSource,
    sink: &mut dyn ActorSink,
    steps: &StepCounter,
    stop: &AtomicBool,
) -> Result<u64, ActorError> {
    let mut actor = AnyActor::new(cfg, network)?;
    while !stop.load(Ordering::Relaxed) {
        if let Some(batch) = actor.step(params, steps, &mut |e| sink.episode(e))? {
            if sink.transitions(batch).is_err() {
                break;
            }
        }
    }
    Ok(actor.steps())
}

/// Runs one actor on the given environments with observations of element type `O`
/// (`f32` vectors, `u8` images) and the given policy (benchmarks pick both).
pub fn run_actor_with<O: Pod + Default>(
    cfg: &ActorConfig,
    envs: Box<dyn VecEnv<O>>,
    policy: &mut dyn Policy<O>,
    params: &mut dyn ParamsSource,
    sink: &mut dyn ActorSink,
    steps: &StepCounter,
    stop: &AtomicBool,
) -> Result<u64, ActorError> {
    let mut actor = ActorLoop::new(cfg, envs)?;
    while !stop.load(Ordering::Relaxed) {
        if let Some(batch) = actor.step(policy, params, steps, &mut |e| sink.episode(e))? {
            if sink.transitions(batch).is_err() {
                break;
            }
        }
    }
    Ok(actor.steps())
}

/// An actor with its environments and the policy that fits them: an MLP on `f32`
/// vectors, a CNN on `u8` images (policies boxed: they differ in size). What embedded,
/// lock-step and remote actors drive.
#[derive(Debug)]
pub enum AnyActor {
    Vector(ActorLoop<f32>, Box<MlpPolicy>),
    Pixels(ActorLoop<u8>, Box<CnnPolicy>),
}

impl AnyActor {
    /// Builds `cfg`'s environments and a policy for `network`, which must fit them.
    pub fn new(cfg: &ActorConfig, network: &NetworkSpec) -> Result<Self, ActorError> {
        Ok(match make_envs(cfg)? {
            env::AnyVecEnv::Vector(envs) => {
                if network.has_torso() {
                    return Err(ActorError::Network(format!(
                        "{} has vector observations, the network is convolutional",
                        cfg.env.id
                    )));
                }
                Self::Vector(
                    ActorLoop::new(cfg, envs)?,
                    Box::new(MlpPolicy::new(network.clone(), 0)?),
                )
            }
            env::AnyVecEnv::Pixels(envs) => Self::Pixels(
                ActorLoop::new(cfg, envs)?,
                Box::new(CnnPolicy::new(network.clone())?),
            ),
        })
    }

    /// [`ActorLoop::step`] with this actor's policy.
    pub fn step(
        &mut self,
        params: &mut dyn ParamsSource,
        steps: &StepCounter,
        on_episode: &mut dyn FnMut(EpisodeStats),
    ) -> Result<Option<&mut TransitionBatch>, ActorError> {
        match self {
            Self::Vector(actor, policy) => actor.step(&mut **policy, params, steps, on_episode),
            Self::Pixels(actor, policy) => actor.step(&mut **policy, params, steps, on_episode),
        }
    }

    pub fn steps(&self) -> u64 {
        match self {
            Self::Vector(actor, _) => actor.steps(),
            Self::Pixels(actor, _) => actor.steps(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env;

    #[derive(Default)]
    struct Collect {
        batches: Vec<TransitionBatch>,
        episodes: Vec<EpisodeStats>,
        limit: usize,
    }

    impl ActorSink for Collect {
        fn transitions(&mut self, batch: &mut TransitionBatch) -> Result<(), SinkClosed> {
            self.batches.push(std::mem::take(batch));
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
        let cfg = ActorConfig {
            actor_id: 0,
            env: EnvConfig::new("CartPole-v1"),
            num_envs: 4,
            seed,
            n_step: 3,
            gamma: 0.99,
            batch_rows: 64,
            epsilon: EpsilonSchedule::Constant(1.0),
            env_epsilons: None,
            clip_rewards: false,
            initial_priorities: false,
            value_bounds: millrace_proto::ValueBounds::FINITE,
        };
        let mut sink = Collect {
            limit: 10,
            ..Collect::default()
        };
        let steps = StepCounter::default();
        let taken = run_actor(
            &cfg,
            &net,
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
            b.validate(16, 1).unwrap();
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
    fn initial_priorities_are_the_actors_n_step_td_errors() {
        let spec = env::spec("CartPole-v1").unwrap();
        let net = NetworkSpec::mlp(&spec.obs, &[8], 2, 1).unwrap();
        let mut policy = MlpPolicy::new(net.clone(), 0).unwrap();
        let data: Vec<f32> = (0..net.layout().len)
            .map(|i| ((i * 37 % 19) as f32 - 9.0) / 10.0)
            .collect();
        policy.load(&Params::of_one(1, data)).unwrap();
        // Rows 0..4; transitions 0 → 3 (bootstrapped), 1 → 2 (terminal: itself), 2 → 3.
        let mut b = TransitionBatch::with_capacity(16, 3, 4);
        let rows = [
            [0.1f32, -0.2, 0.3, 0.0],
            [1.0, 0.5, -0.5, 2.0],
            [0.0; 4],
            [-1.0, 0.2, 0.1, 0.4],
        ];
        for r in &rows {
            b.push_obs_f32(r);
        }
        b.push_transition(0, 1, 2.5, 0.97, 3);
        b.push_transition(1, 0, 1.0, 0.0, 1);
        b.push_transition(2, 1, -0.5, 0.9, 3);
        initial_priorities::<f32>(&mut policy, &mut b, 2, (&mut Vec::new(), &mut Vec::new()));
        let q: Vec<[f32; 2]> = rows
            .iter()
            .map(|r| {
                let mut out = [0f32; 2];
                policy.q_values(r, &mut out);
                out
            })
            .collect();
        let direct = [
            (2.5 + 0.97 * q[3][0].max(q[3][1]) - q[0][1]).abs(),
            (1.0 - q[1][0]).abs(),
            (-0.5 + 0.9 * q[3][0].max(q[3][1]) - q[2][1]).abs(),
        ];
        assert_eq!(b.priorities.len(), 3);
        for (got, want) in b.priorities.iter().zip(direct) {
            assert!(
                (got - want).abs() < 1e-5,
                "{:?} vs {direct:?}",
                b.priorities
            );
        }
        b.validate(16, 1).unwrap();
    }

    #[test]
    fn same_seed_same_stream() {
        let (a, b) = (run(5), run(5));
        assert_eq!(a.batches, b.batches);
        assert_ne!(a.batches, run(6).batches);
    }
}

#[cfg(test)]
mod life_loss_tests {
    use super::*;
    use crate::policy::MlpPolicy;
    use millrace_proto::{DType, EnvSpec, ObsSpec};

    /// One environment whose observation is its step count; a life is lost at step 3,
    /// the game ends at step 6 with a reward of 5 (true score), every other step pays 2.
    struct Lives {
        spec: EnvSpec,
        t: u32,
    }

    impl VecEnv<f32> for Lives {
        fn spec(&self) -> &EnvSpec {
            &self.spec
        }
        fn num_envs(&self) -> usize {
            1
        }
        fn reset(&mut self, _: &[u64], obs: &mut [f32]) -> Result<(), EnvError> {
            self.t = 0;
            obs[0] = 0.0;
            Ok(())
        }
        fn step(
            &mut self,
            _: &[usize],
            next: &mut [f32],
            first: &mut [f32],
            steps: &mut [Step],
        ) -> Result<(), EnvError> {
            self.t += 1;
            next[0] = self.t as f32;
            steps[0] = Step {
                reward: if self.t == 6 { 5.0 } else { 2.0 },
                terminated: self.t == 6,
                truncated: false,
                life_lost: self.t == 3,
            };
            if self.t == 6 {
                self.t = 0;
                first[0] = 0.0;
            }
            Ok(())
        }
    }

    #[test]
    fn a_lost_life_ends_the_chain_not_the_episode_and_rewards_clip_for_training_only() {
        let spec = EnvSpec {
            id: "lives".into(),
            obs: ObsSpec {
                shape: vec![1],
                dtype: DType::F32,
            },
            num_actions: 2,
            max_episode_steps: 100,
            reward_threshold: None,
            reward_range: None,
            frame_stack: 1,
        };
        let cfg = ActorConfig {
            actor_id: 0,
            env: EnvConfig::new("lives"),
            num_envs: 1,
            seed: 0,
            n_step: 3,
            gamma: 0.5,
            batch_rows: 6,
            epsilon: EpsilonSchedule::Constant(1.0),
            env_epsilons: None,
            clip_rewards: true,
            initial_priorities: false,
            value_bounds: millrace_proto::ValueBounds::FINITE,
        };
        let net = millrace_proto::NetworkSpec::mlp(&spec.obs, &[2], 2, 1).unwrap();
        let mut policy = MlpPolicy::new(net, 0).unwrap();
        let mut actor = ActorLoop::new(&cfg, Box::new(Lives { spec, t: 0 })).unwrap();
        let (mut episodes, mut batch) = (Vec::new(), None);
        let steps = StepCounter::default();
        while batch.is_none() {
            batch = actor
                .step(&mut policy, &mut NoParams, &steps, &mut |e| {
                    episodes.push(e)
                })
                .unwrap();
        }
        let b = batch.unwrap();
        let obs = |row: u32| f32::from_le_bytes(b.obs_row(row).try_into().unwrap());
        let rows: Vec<(f32, f32, f32, f32)> = (0..b.len())
            .map(|i| {
                (
                    obs(b.obs_index[i]),
                    b.rewards[i],
                    b.discounts[i],
                    obs(b.next_index[i]),
                )
            })
            .collect();
        // From steps 0..3 (the life lost at 3): 3-step returns stop there, terminal.
        // Rewards are clipped to 1; the last step of the game (true reward 5) too.
        assert_eq!(
            rows,
            vec![
                (0.0, 1.0 + 0.5 + 0.25, 0.0, 0.0),
                (1.0, 1.0 + 0.5, 0.0, 1.0),
                (2.0, 1.0, 0.0, 2.0),
                (3.0, 1.0 + 0.5 + 0.25, 0.0, 3.0),
                (4.0, 1.0 + 0.5, 0.0, 4.0),
                (5.0, 1.0, 0.0, 5.0),
            ]
        );
        // One episode, the whole game, with its true score.
        assert_eq!(episodes.len(), 1);
        assert_eq!(
            (episodes[0].length, episodes[0].episode_return),
            (6, 2.0 * 5.0 + 5.0)
        );
    }
}

#[cfg(test)]
mod bad_value_tests {
    use super::*;
    use crate::policy::MlpPolicy;
    use millrace_proto::{EnvSpec, ObsSpec};

    /// One environment that pays a NaN reward on the steps `bad` says, and a NaN
    /// observation from step `nan_obs_from` on.
    struct Flaky {
        spec: EnvSpec,
        t: u32,
        bad: fn(u32) -> bool,
    }

    impl VecEnv<f32> for Flaky {
        fn spec(&self) -> &EnvSpec {
            &self.spec
        }
        fn num_envs(&self) -> usize {
            1
        }
        fn reset(&mut self, _: &[u64], obs: &mut [f32]) -> Result<(), EnvError> {
            obs[0] = 0.0;
            Ok(())
        }
        fn step(
            &mut self,
            _: &[usize],
            next: &mut [f32],
            _: &mut [f32],
            steps: &mut [Step],
        ) -> Result<(), EnvError> {
            self.t += 1;
            next[0] = self.t as f32;
            steps[0] = Step {
                reward: if (self.bad)(self.t) { f32::NAN } else { 1.0 },
                ..Step::default()
            };
            Ok(())
        }
    }

    fn actor(bad: fn(u32) -> bool) -> ActorLoop<f32> {
        let spec = EnvSpec {
            id: "flaky-v0".into(),
            obs: ObsSpec {
                shape: vec![1],
                dtype: DType::F32,
            },
            num_actions: 2,
            max_episode_steps: 1_000_000,
            reward_threshold: None,
            reward_range: None,
            frame_stack: 1,
        };
        let cfg = ActorConfig {
            actor_id: 0,
            env: EnvConfig::new("flaky-v0"),
            num_envs: 1,
            seed: 0,
            n_step: 1,
            gamma: 0.9,
            batch_rows: 4,
            epsilon: EpsilonSchedule::Constant(1.0),
            env_epsilons: None,
            clip_rewards: false,
            initial_priorities: false,
            value_bounds: millrace_proto::ValueBounds::FINITE,
        };
        ActorLoop::new(&cfg, Box::new(Flaky { spec, t: 0, bad })).unwrap()
    }

    fn policy() -> MlpPolicy {
        let obs = ObsSpec {
            shape: vec![1],
            dtype: DType::F32,
        };
        MlpPolicy::new(NetworkSpec::mlp(&obs, &[2], 2, 1).unwrap(), 0).unwrap()
    }

    #[test]
    fn a_batch_with_a_nan_reward_is_dropped_and_clean_ones_go_on() {
        // Steps 5..=8 pay NaN: the batch holding them is dropped, none is stored.
        let mut a = actor(|t| (5..=8).contains(&t));
        let (mut p, steps) = (policy(), StepCounter::default());
        let mut batches = Vec::new();
        for _ in 0..40 {
            if let Some(b) = a.step(&mut p, &mut NoParams, &steps, &mut |_| {}).unwrap() {
                batches.push(std::mem::take(b));
            }
        }
        assert_eq!(a.rejected, 1, "one batch dropped");
        assert!(batches.len() >= 8, "{} batches", batches.len());
        assert!(batches
            .iter()
            .all(|b| b.rewards.iter().all(|r| r.is_finite())));
        // Sequence numbers stay consecutive: a dropped batch takes none.
        let seqs: Vec<u64> = batches.iter().map(|b| b.seq).collect();
        assert_eq!(seqs, (0..batches.len() as u64).collect::<Vec<_>>());
    }

    #[test]
    fn an_environment_that_keeps_giving_nan_stops_the_actor_naming_it() {
        let mut a = actor(|t| t > 2);
        let (mut p, steps) = (policy(), StepCounter::default());
        let err = loop {
            match a.step(&mut p, &mut NoParams, &steps, &mut |_| {}) {
                Ok(Some(b)) => assert!(b.rewards.iter().all(|r| r.is_finite())),
                Ok(None) => {}
                Err(e) => break e.to_string(),
            }
        };
        assert!(
            err.contains("the environment flaky-v0 keeps producing bad values"),
            "{err}"
        );
        assert!(err.contains("non-finite reward"), "{err}");
        assert!(
            err.contains(&format!("{MAX_BAD_BATCHES_IN_A_ROW} batches in a row")),
            "{err}"
        );
    }
}
