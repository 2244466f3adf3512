//! MountainCar-v0, ported from Gymnasium 1.4.0 `classic_control/mountain_car.py`
//! (200-step time limit, reward threshold -110).

use millrace_proto::{DType, EnvSpec, ObsSpec};
use rand::rngs::SmallRng;
use rand::Rng;

use super::{rng, Env, EnvError, Step};

const MIN_POSITION: f64 = -1.2;
const MAX_POSITION: f64 = 0.6;
const MAX_SPEED: f64 = 0.07;
const GOAL_POSITION: f64 = 0.5;
const GOAL_VELOCITY: f64 = 0.0;
const FORCE: f64 = 0.001;
const GRAVITY: f64 = 0.0025;
const MAX_EPISODE_STEPS: u32 = 200;

pub struct MountainCar {
    spec: EnvSpec,
    rng: SmallRng,
    /// `[position, velocity]`.
    state: [f64; 2],
    elapsed: u32,
}

impl MountainCar {
    pub fn new(seed: u64) -> Self {
        Self {
            spec: EnvSpec {
                id: "MountainCar-v0".into(),
                obs: ObsSpec {
                    shape: vec![2],
                    dtype: DType::F32,
                },
                num_actions: 3,
                max_episode_steps: MAX_EPISODE_STEPS,
                reward_threshold: Some(-110.0),
                reward_range: Some((-1.0, 0.0)),
                frame_stack: 1,
            },
            rng: rng(seed),
            state: [0.0; 2],
            elapsed: 0,
        }
    }

    /// Starts an episode from a given internal state (golden tests).
    pub fn set_state(&mut self, state: &[f64], obs: &mut [f32]) -> Result<(), EnvError> {
        self.state = state.try_into().map_err(|_| EnvError::BadState {
            expected: 2,
            got: state.len(),
        })?;
        self.elapsed = 0;
        self.observe(obs);
        Ok(())
    }

    fn observe(&self, obs: &mut [f32]) {
        obs[0] = self.state[0] as f32;
        obs[1] = self.state[1] as f32;
    }
}

impl Env for MountainCar {
    fn spec(&self) -> &EnvSpec {
        &self.spec
    }

    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) {
        if let Some(seed) = seed {
            self.rng = rng(seed);
        }
        self.state = [self.rng.random_range(-0.6..-0.4), 0.0];
        self.elapsed = 0;
        self.observe(obs);
    }

    fn step(&mut self, action: usize, obs: &mut [f32]) -> Step {
        let [mut position, mut velocity] = self.state;
        velocity += (action as f64 - 1.0) * FORCE + (3.0 * position).cos() * (-GRAVITY);
        velocity = velocity.clamp(-MAX_SPEED, MAX_SPEED);
        position += velocity;
        position = position.clamp(MIN_POSITION, MAX_POSITION);
        if position == MIN_POSITION && velocity < 0.0 {
            velocity = 0.0;
        }
        self.state = [position, velocity];
        self.elapsed += 1;
        self.observe(obs);
        Step {
            reward: -1.0,
            terminated: position >= GOAL_POSITION && velocity >= GOAL_VELOCITY,
            truncated: self.elapsed >= MAX_EPISODE_STEPS,
            life_lost: false,
        }
    }
}
