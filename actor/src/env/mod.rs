//! Environments: the [`Env`] trait and Rust ports of Gymnasium's classic-control tasks.
//!
//! The ports reproduce Gymnasium 1.4.0 exactly (same float64 dynamics, float32
//! observations, rewards, termination and time limits); `tests` replays the reference
//! trajectories in `shared/golden/` against them.

mod acrobot;
mod cartpole;
mod catch;
mod mountain_car;
mod registry;
mod vec;

#[cfg(feature = "gym")]
pub mod gym;

pub use acrobot::Acrobot;
pub use cartpole::CartPole;
pub use catch::CatchPixels;
pub use mountain_car::MountainCar;
pub use registry::{capabilities, make_vec, spec_of, AnyVecEnv};
pub use vec::{NativeVec, VecEnv};

use millrace_proto::EnvSpec;
use rand::rngs::SmallRng;
use rand::SeedableRng;

/// The outcome of one step.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Step {
    /// The environment's own reward (true scores; clipping is the actor's business).
    pub reward: f32,
    /// The task ended (pole fell, goal reached): the value of what follows is zero.
    pub terminated: bool,
    /// The time limit cut the episode: what follows still has value (bootstrap from it).
    pub truncated: bool,
    /// A life was lost but the game was not lost with it (Atari, with
    /// terminal-on-life-loss): training ends its bootstrapping chain here; the episode
    /// goes on unless the time limit cut it at this very step.
    pub life_lost: bool,
}

impl Step {
    pub fn done(&self) -> bool {
        self.terminated || self.truncated
    }
}

/// A single environment with a discrete action space and observations of element type
/// `O` (`f32` vectors for classic control, `u8` images for pixel environments).
///
/// Contract: `reset` must be called before the first `step` and after any step that
/// returns `done()`. Observations are written into a caller-provided slice of exactly
/// `spec().obs.numel()` elements, so stepping allocates nothing. The time limit is part
/// of the environment (as Gymnasium's registered ids wrap `TimeLimit`). Implementations
/// are `Send` (each lives on one actor thread) but need not be `Sync`.
pub trait Env<O = f32>: Send {
    fn spec(&self) -> &EnvSpec;

    /// Starts an episode. `Some(seed)` re-seeds the environment's generator (as
    /// Gymnasium's `reset(seed=...)`); `None` continues its stream.
    fn reset(&mut self, seed: Option<u64>, obs: &mut [O]);

    /// Applies `action` (`0..num_actions`), writing the next observation into `obs`.
    fn step(&mut self, action: usize, obs: &mut [O]) -> Step;
}

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum EnvError {
    #[error(
        "unknown environment id {0:?}; the Rust ports are {known}; Atari games are \
         ALE/<Game>-v5 or <Game>NoFrameskip-v4; any Gymnasium id runs as gym:<id>",
        known = KNOWN_IDS.join(", ")
    )]
    UnknownId(String),
    #[error("state must have {expected} values, got {got}")]
    BadState { expected: usize, got: usize },
    #[error(
        "{0} needs the Gymnasium bridge, which this build lacks (built without the `gym` \
         feature); it runs the Rust ports: {known}",
        known = KNOWN_IDS.join(", ")
    )]
    NoBridge(String),
    /// The Python side failed: a missing package, an unknown id, an unsupported space,
    /// a module that does not import, an environment that raised.
    #[error("{0}")]
    Bridge(String),
    #[error("{0}")]
    Options(String),
}

/// Every environment id [`make`] knows.
pub const KNOWN_IDS: [&str; 3] = ["CartPole-v1", "Acrobot-v1", "MountainCar-v0"];

/// Every pixel environment id [`make_pixels`] knows.
pub const PIXEL_IDS: [&str; 1] = [catch::ID];

/// Builds a registered pixel environment (`u8` image observations).
pub fn make_pixels(id: &str, seed: u64) -> Result<Box<dyn Env<u8>>, EnvError> {
    match id {
        catch::ID => Ok(Box::new(CatchPixels::new(seed))),
        other => Err(EnvError::UnknownId(other.to_string())),
    }
}

/// The spec of a registered environment, without building one.
pub fn spec(id: &str) -> Result<EnvSpec, EnvError> {
    make(id, 0).map(|env| env.spec().clone())
}

/// Builds a registered environment, its generator seeded with `seed`.
pub fn make(id: &str, seed: u64) -> Result<Box<dyn Env>, EnvError> {
    match id {
        "CartPole-v1" => Ok(Box::new(CartPole::new(seed))),
        "Acrobot-v1" => Ok(Box::new(Acrobot::new(seed))),
        "MountainCar-v0" => Ok(Box::new(MountainCar::new(seed))),
        other => Err(EnvError::UnknownId(other.to_string())),
    }
}

fn rng(seed: u64) -> SmallRng {
    SmallRng::seed_from_u64(seed)
}

#[cfg(test)]
mod golden_tests;
