//! An actor step in steady state allocates nothing: not in the forward pass (weights
//! packed once per parameter version, activations in reused buffers), not when a
//! parameter version is loaded, not when a batch is handed on (it comes back to be
//! refilled). A counting global allocator counts the allocations the actor's thread
//! makes over a window of steps that includes a parameter load and batch hand-offs,
//! for the MLP (CartPole), the MinAtar CNN (a Rust environment of MinAtar's shape:
//! the real MinAtar steps in Python) and the Nature CNN (CatchPixels, frame mode); the
//! CNNs read their parameters as embedded actors do, through a shared packing.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::Arc;

use millrace_actor::env::{make_vec, AnyVecEnv, Env, NativeVec, Step, VecEnv};
use millrace_actor::{
    ActorConfig, ActorLoop, ActorSink, CnnPolicy, EpisodeStats, EpsilonSchedule, MlpPolicy,
    ParamsSource, Policy, SharedParams,
};
use millrace_proto::{
    DType, EnvConfig, EnvSpec, NetworkSpec, ObsSpec, Params, ParamsCell, StepCounter,
    TransitionBatch,
};

/// Counts allocations (and reallocations) made by a thread while it has counting on.
struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn note() {
    // `try_with`: never panics, also while a thread's locals are being torn down.
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        }
    });
}

// SAFETY: every call goes to `System` unchanged; counting touches only `Cell`s.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Allocations this thread makes while running `f`.
fn allocations_in<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let before = ALLOCATIONS.with(Cell::get);
    COUNTING.with(|on| on.set(true));
    let out = f();
    COUNTING.with(|on| on.set(false));
    (out, ALLOCATIONS.with(Cell::get) - before)
}

/// Keeps the last two batches it was handed, as a connection's writer does, swapping in
/// the oldest one it is done with (replay copies a batch out and keeps nothing: the
/// simpler case).
#[derive(Default)]
struct KeepTwo {
    kept: VecDeque<TransitionBatch>,
    handed: u64,
    transitions: u64,
}

impl ActorSink for KeepTwo {
    fn transitions(
        &mut self,
        batch: &mut TransitionBatch,
    ) -> Result<(), millrace_actor::runner::SinkClosed> {
        self.handed += 1;
        self.transitions += batch.len() as u64;
        let spare = if self.kept.len() == 2 {
            self.kept.pop_front().expect("two kept")
        } else {
            TransitionBatch::default()
        };
        self.kept.push_back(std::mem::replace(batch, spare));
        Ok(())
    }
    fn episode(&mut self, _: EpisodeStats) {}
}

fn config(env: &str, num_envs: usize) -> ActorConfig {
    ActorConfig {
        actor_id: 0,
        env: EnvConfig::new(env),
        num_envs,
        seed: 11,
        n_step: 3,
        gamma: 0.99,
        batch_rows: 64,
        // Mostly greedy: the forward pass's actions are taken.
        epsilon: EpsilonSchedule::Constant(0.1),
        env_epsilons: None,
        clip_rewards: true,
        initial_priorities: false,
        value_bounds: millrace_proto::ValueBounds::FINITE,
    }
}

fn snapshot(net: &NetworkSpec, version: u64) -> Params {
    let len = net.layout().len;
    Params {
        version,
        env_steps: 0,
        updates: version,
        population: 1,
        data: (0..len)
            .map(|i| (((i as u64 * 7919 + version * 104_729) % 1000) as f32 / 1000.0 - 0.5) * 0.1)
            .collect(),
    }
}

/// Runs an actor to steady state (two parameter versions, several batches), then counts
/// the allocations of a window of steps that loads a third version and hands on at
/// least two batches.
/// With `shared`, the actor reads its parameters as embedded actors do, sharing each
/// version's packing through a shelf ([`SharedParams`]); otherwise it packs its own.
fn steady_allocations<O: bytemuck::Pod + Default>(
    cfg: &ActorConfig,
    envs: Box<dyn VecEnv<O>>,
    policy: &mut dyn Policy<O>,
    net: &NetworkSpec,
    shared: bool,
) -> u64 {
    let cell = Arc::new(ParamsCell::new(snapshot(net, 1)));
    let mut source: Box<dyn ParamsSource> = if shared {
        Box::new(SharedParams::new(Arc::clone(&cell)))
    } else {
        Box::new(Arc::clone(&cell))
    };
    let mut actor = ActorLoop::new(cfg, envs).unwrap();
    let mut sink = KeepTwo::default();
    let steps = StepCounter::default();
    let mut episodes = 0u64;
    let mut step = |actor: &mut ActorLoop<O>, policy: &mut dyn Policy<O>, sink: &mut KeepTwo| {
        let batch = actor
            .step(policy, &mut *source, &steps, &mut |_| episodes += 1)
            .unwrap();
        if let Some(batch) = batch {
            sink.transitions(batch).unwrap();
        }
    };
    // Warm-up: every buffer reaches its size, the sink's spares go round.
    for version in 2..=3 {
        let handed = sink.handed;
        while sink.handed < handed + 4 {
            step(&mut actor, policy, &mut sink);
        }
        cell.publish(snapshot(net, version));
    }
    // Published before the window (publishing is the learner's allocation, not the
    // actor's); loaded inside it.
    cell.publish(snapshot(net, 4));
    let handed = sink.handed;
    let ((), allocations) = allocations_in(|| {
        while sink.handed < handed + 2 || policy.version() != Some(4) {
            step(&mut actor, policy, &mut sink);
        }
    });
    assert_eq!(policy.version(), Some(4), "the window loaded a new version");
    assert!(sink.handed >= handed + 2 && sink.transitions > 0);
    assert!(episodes > 0, "episodes ended, environments were reset");
    allocations
}

#[test]
fn the_counter_counts_this_threads_allocations() {
    let (v, n) = allocations_in(|| vec![1u8; 10]);
    assert_eq!((v.len(), n), (10, 1));
    let (_, n) = allocations_in(|| std::thread::spawn(|| vec![0u8; 10]).join());
    assert!(
        n >= 1,
        "spawning allocates here; the thread's own vector is not counted"
    );
}

#[test]
fn the_mlp_actor_step_allocates_nothing() {
    let mut cfg = config("CartPole-v1", 8);
    // Ape-X's initial priorities too: one more forward pass over each batch.
    cfg.initial_priorities = true;
    let AnyVecEnv::Vector(envs) = make_vec(&cfg.env, cfg.num_envs, 3).unwrap() else {
        panic!("CartPole has vector observations");
    };
    let net = NetworkSpec::mlp(&envs.spec().obs, &[64, 64], 2, 1).unwrap();
    let mut policy = MlpPolicy::new(net.clone(), 0).unwrap();
    assert_eq!(steady_allocations(&cfg, envs, &mut policy, &net, false), 0);
}

#[test]
fn the_nature_cnn_actor_step_allocates_nothing() {
    let cfg = config("CatchPixels-v0", 4);
    let AnyVecEnv::Pixels(envs) = make_vec(&cfg.env, cfg.num_envs, 3).unwrap() else {
        panic!("CatchPixels has pixel observations");
    };
    assert!(envs.spec().frame_stack > 1, "frame mode is exercised");
    let net = NetworkSpec::nature_cnn(&envs.spec().obs, envs.spec().num_actions).unwrap();
    let mut policy = CnnPolicy::new(net.clone()).unwrap();
    assert_eq!(steady_allocations(&cfg, envs, &mut policy, &net, true), 0);
}

#[test]
fn the_minatar_cnn_actor_step_allocates_nothing() {
    let cfg = config("MinAtarShaped", 8);
    let envs: Vec<Box<dyn Env<u8>>> = (0..cfg.num_envs)
        .map(|i| Box::new(MinAtarShaped::new(i as u64)) as Box<dyn Env<u8>>)
        .collect();
    let envs = Box::new(NativeVec::new(envs));
    let net = NetworkSpec::minatar_cnn(&envs.spec().obs, envs.spec().num_actions).unwrap();
    let mut policy = CnnPolicy::new(net.clone()).unwrap();
    assert_eq!(steady_allocations(&cfg, envs, &mut policy, &net, true), 0);
}

/// MinAtar Breakout's observation shape, `[4, 10, 10]` `u8` planes (paddle, ball, trail,
/// bricks), unstacked, and its three actions: a paddle on the bottom row and a ball
/// bouncing off the walls; missing the ball ends the episode.
struct MinAtarShaped {
    spec: EnvSpec,
    state: u64,
    paddle: usize,
    ball: (usize, usize),
    velocity: (isize, isize),
}

impl MinAtarShaped {
    const SIDE: usize = 10;

    fn new(seed: u64) -> Self {
        Self {
            spec: EnvSpec {
                id: "MinAtarShaped".into(),
                obs: ObsSpec {
                    shape: vec![4, Self::SIDE, Self::SIDE],
                    dtype: DType::U8,
                },
                num_actions: 3,
                max_episode_steps: 1000,
                reward_threshold: None,
                reward_range: Some((0.0, 1.0)),
                frame_stack: 1,
            },
            state: seed | 1,
            paddle: 4,
            ball: (0, 0),
            velocity: (1, 1),
        }
    }

    fn random(&mut self, n: usize) -> usize {
        // xorshift64: no allocation, reproducible.
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        (self.state % n as u64) as usize
    }

    fn draw(&self, obs: &mut [u8]) {
        let side = Self::SIDE;
        obs.fill(0);
        obs[(side - 1) * side + self.paddle] = 1;
        obs[side * side + self.ball.0 * side + self.ball.1] = 1;
        for brick in &mut obs[3 * side * side..][..2 * side] {
            *brick = 1;
        }
    }
}

impl Env<u8> for MinAtarShaped {
    fn spec(&self) -> &EnvSpec {
        &self.spec
    }

    fn reset(&mut self, seed: Option<u64>, obs: &mut [u8]) {
        if let Some(seed) = seed {
            self.state = seed | 1;
        }
        self.ball = (3, self.random(Self::SIDE));
        self.velocity = (1, if self.random(2) == 0 { -1 } else { 1 });
        self.paddle = self.random(Self::SIDE);
        self.draw(obs);
    }

    fn step(&mut self, action: usize, obs: &mut [u8]) -> Step {
        let side = Self::SIDE as isize;
        match action {
            1 => self.paddle = self.paddle.saturating_sub(1),
            2 => self.paddle = (self.paddle + 1).min(Self::SIDE - 1),
            _ => {}
        }
        let (mut y, mut x) = (self.ball.0 as isize, self.ball.1 as isize);
        if !(0..side).contains(&(x + self.velocity.1)) {
            self.velocity.1 = -self.velocity.1;
        }
        if y + self.velocity.0 < 2 {
            self.velocity.0 = 1;
        }
        y += self.velocity.0;
        x += self.velocity.1;
        let mut step = Step::default();
        if y == side - 1 {
            if x as usize == self.paddle {
                step.reward = 1.0;
                self.velocity.0 = -1;
                y = side - 2;
            } else {
                step.terminated = true;
            }
        }
        self.ball = (y as usize, x as usize);
        self.draw(obs);
        step
    }
}
