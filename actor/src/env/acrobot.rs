//! Acrobot-v1, ported from Gymnasium 1.4.0 `classic_control/acrobot.py` ("book"
//! dynamics, RK4 over one 0.2 s step, 500-step time limit, reward threshold -100).

use std::f64::consts::PI;

use millrace_proto::{DType, EnvSpec, ObsSpec};
use rand::rngs::SmallRng;
use rand::Rng;

use super::{rng, Env, EnvError, Step};

const DT: f64 = 0.2;
const LINK_LENGTH_1: f64 = 1.0;
const LINK_MASS_1: f64 = 1.0;
const LINK_MASS_2: f64 = 1.0;
/// Position of each link's centre of mass.
const LINK_COM_POS_1: f64 = 0.5;
const LINK_COM_POS_2: f64 = 0.5;
/// Moment of inertia of both links.
const LINK_MOI: f64 = 1.0;
const GRAVITY: f64 = 9.8;
const MAX_VEL_1: f64 = 4.0 * PI;
const MAX_VEL_2: f64 = 9.0 * PI;
const AVAIL_TORQUE: [f64; 3] = [-1.0, 0.0, 1.0];
const RESET_BOUND: f64 = 0.1;
const MAX_EPISODE_STEPS: u32 = 500;

pub struct Acrobot {
    spec: EnvSpec,
    rng: SmallRng,
    /// `[theta1, theta2, dtheta1, dtheta2]`.
    state: [f64; 4],
    elapsed: u32,
}

impl Acrobot {
    pub fn new(seed: u64) -> Self {
        Self {
            spec: EnvSpec {
                id: "Acrobot-v1".into(),
                obs: ObsSpec {
                    shape: vec![6],
                    dtype: DType::F32,
                },
                num_actions: 3,
                max_episode_steps: MAX_EPISODE_STEPS,
                reward_threshold: Some(-100.0),
                reward_range: Some((-1.0, 0.0)),
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
        let [t1, t2, dt1, dt2] = self.state;
        let values = [t1.cos(), t1.sin(), t2.cos(), t2.sin(), dt1, dt2];
        for (o, v) in obs.iter_mut().zip(values) {
            *o = v as f32;
        }
    }

    fn terminal(&self) -> bool {
        let [t1, t2, _, _] = self.state;
        -t1.cos() - (t2 + t1).cos() > 1.0
    }
}

/// Time derivative of `[theta1, theta2, dtheta1, dtheta2, torque]` (Gymnasium's `_dsdt`).
fn dsdt(s: [f64; 5]) -> [f64; 5] {
    let (m1, m2, l1) = (LINK_MASS_1, LINK_MASS_2, LINK_LENGTH_1);
    let (lc1, lc2) = (LINK_COM_POS_1, LINK_COM_POS_2);
    let (i1, i2) = (LINK_MOI, LINK_MOI);
    let g = GRAVITY;
    let [theta1, theta2, dtheta1, dtheta2, a] = s;
    let d1 = m1 * lc1.powi(2)
        + m2 * (l1.powi(2) + lc2.powi(2) + 2.0 * l1 * lc2 * theta2.cos())
        + i1
        + i2;
    let d2 = m2 * (lc2.powi(2) + l1 * lc2 * theta2.cos()) + i2;
    let phi2 = m2 * lc2 * g * (theta1 + theta2 - PI / 2.0).cos();
    let phi1 = -m2 * l1 * lc2 * dtheta2.powi(2) * theta2.sin()
        - 2.0 * m2 * l1 * lc2 * dtheta2 * dtheta1 * theta2.sin()
        + (m1 * lc1 + m2 * l1) * g * (theta1 - PI / 2.0).cos()
        + phi2;
    let ddtheta2 = (a + d2 / d1 * phi1 - m2 * l1 * lc2 * dtheta1.powi(2) * theta2.sin() - phi2)
        / (m2 * lc2.powi(2) + i2 - d2.powi(2) / d1);
    let ddtheta1 = -(d2 * ddtheta2 + phi1) / d1;
    [dtheta1, dtheta2, ddtheta1, ddtheta2, 0.0]
}

/// One fourth-order Runge-Kutta step of length `dt` (Gymnasium's `rk4` over `[0, dt]`).
fn rk4(y0: [f64; 5], dt: f64) -> [f64; 5] {
    let add = |y: [f64; 5], h: f64, k: [f64; 5]| std::array::from_fn(|i| y[i] + h * k[i]);
    let dt2 = dt / 2.0;
    let k1 = dsdt(y0);
    let k2 = dsdt(add(y0, dt2, k1));
    let k3 = dsdt(add(y0, dt2, k2));
    let k4 = dsdt(add(y0, dt, k3));
    std::array::from_fn(|i| y0[i] + dt / 6.0 * (k1[i] + 2.0 * k2[i] + 2.0 * k3[i] + k4[i]))
}

/// Wraps `x` into `[lo, hi]` by whole periods (Gymnasium's `wrap`).
fn wrap(mut x: f64, lo: f64, hi: f64) -> f64 {
    let diff = hi - lo;
    while x > hi {
        x -= diff;
    }
    while x < lo {
        x += diff;
    }
    x
}

impl Env for Acrobot {
    fn spec(&self) -> &EnvSpec {
        &self.spec
    }

    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) {
        if let Some(seed) = seed {
            self.rng = rng(seed);
        }
        for s in &mut self.state {
            // Gymnasium draws the start state in float32.
            *s = f64::from(
                self.rng
                    .random_range(-RESET_BOUND as f32..RESET_BOUND as f32),
            );
        }
        self.elapsed = 0;
        self.observe(obs);
    }

    fn step(&mut self, action: usize, obs: &mut [f32]) -> Step {
        let [t1, t2, dt1, dt2] = self.state;
        let ns = rk4([t1, t2, dt1, dt2, AVAIL_TORQUE[action]], DT);
        self.state = [
            wrap(ns[0], -PI, PI),
            wrap(ns[1], -PI, PI),
            ns[2].clamp(-MAX_VEL_1, MAX_VEL_1),
            ns[3].clamp(-MAX_VEL_2, MAX_VEL_2),
        ];
        self.elapsed += 1;
        self.observe(obs);
        let terminated = self.terminal();
        Step {
            reward: if terminated { 0.0 } else { -1.0 },
            terminated,
            truncated: self.elapsed >= MAX_EPISODE_STEPS,
            life_lost: false,
        }
    }
}
