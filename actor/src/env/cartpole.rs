//! CartPole-v1, ported from Gymnasium 1.4.0 `classic_control/cartpole.py` (Euler
//! integrator, 500-step time limit, reward threshold 475).

use millrace_proto::{DType, EnvSpec, ObsSpec};
use rand::rngs::SmallRng;
use rand::Rng;

use super::{rng, Env, EnvError, Step};

const GRAVITY: f64 = 9.8;
const MASS_CART: f64 = 1.0;
const MASS_POLE: f64 = 0.1;
const TOTAL_MASS: f64 = MASS_POLE + MASS_CART;
/// Half the pole's length.
const LENGTH: f64 = 0.5;
const POLE_MASS_LENGTH: f64 = MASS_POLE * LENGTH;
const FORCE_MAG: f64 = 10.0;
/// Seconds between state updates.
const TAU: f64 = 0.02;
const THETA_THRESHOLD: f64 = 12.0 * 2.0 * std::f64::consts::PI / 360.0;
const X_THRESHOLD: f64 = 2.4;
const RESET_BOUND: f64 = 0.05;
const MAX_EPISODE_STEPS: u32 = 500;

pub struct CartPole {
    spec: EnvSpec,
    rng: SmallRng,
    /// `[x, x_dot, theta, theta_dot]`, float64 as in Gymnasium.
    state: [f64; 4],
    elapsed: u32,
}

impl CartPole {
    pub fn new(seed: u64) -> Self {
        Self {
            spec: EnvSpec {
                id: "CartPole-v1".into(),
                obs: ObsSpec {
                    shape: vec![4],
                    dtype: DType::F32,
                },
                num_actions: 2,
                max_episode_steps: MAX_EPISODE_STEPS,
                reward_threshold: Some(475.0),
                reward_range: Some((1.0, 1.0)),
                frame_stack: 1,
            },
            rng: rng(seed),
            state: [0.0; 4],
            elapsed: 0,
        }
    }

    /// Starts an episode from a given internal state (golden tests).
    pub fn set_state(&mut self, state: &[f64], obs: &mut [f32]) -> Result<(), EnvError> {
        self.state = state.try_into().map_err(|_| EnvError::BadState {
            expected: 4,
            got: state.len(),
        })?;
        self.elapsed = 0;
        self.observe(obs);
        Ok(())
    }

    fn observe(&self, obs: &mut [f32]) {
        for (o, s) in obs.iter_mut().zip(self.state) {
            *o = s as f32;
        }
    }
}

impl Env for CartPole {
    fn spec(&self) -> &EnvSpec {
        &self.spec
    }

    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) {
        if let Some(seed) = seed {
            self.rng = rng(seed);
        }
        for s in &mut self.state {
            *s = self.rng.random_range(-RESET_BOUND..RESET_BOUND);
        }
        self.elapsed = 0;
        self.observe(obs);
    }

    fn step(&mut self, action: usize, obs: &mut [f32]) -> Step {
        let [x, x_dot, theta, theta_dot] = self.state;
        let force = if action == 1 { FORCE_MAG } else { -FORCE_MAG };
        let (sin_theta, cos_theta) = theta.sin_cos();
        let temp = (force + POLE_MASS_LENGTH * (theta_dot * theta_dot) * sin_theta) / TOTAL_MASS;
        let theta_acc = (GRAVITY * sin_theta - cos_theta * temp)
            / (LENGTH * (4.0 / 3.0 - MASS_POLE * (cos_theta * cos_theta) / TOTAL_MASS));
        let x_acc = temp - POLE_MASS_LENGTH * theta_acc * cos_theta / TOTAL_MASS;
        self.state = [
            x + TAU * x_dot,
            x_dot + TAU * x_acc,
            theta + TAU * theta_dot,
            theta_dot + TAU * theta_acc,
        ];
        self.elapsed += 1;
        self.observe(obs);

        let [x, _, theta, _] = self.state;
        let terminated = !(-X_THRESHOLD..=X_THRESHOLD).contains(&x)
            || !(-THETA_THRESHOLD..=THETA_THRESHOLD).contains(&theta);
        Step {
            // Gymnasium pays 1.0 on every step, the terminating one included.
            reward: 1.0,
            terminated,
            truncated: self.elapsed >= MAX_EPISODE_STEPS,
            life_lost: false,
        }
    }
}
