//! Greedy evaluation: Gymnasium's definition of "solved" is a mean return over 100
//! episodes at ε = 0, so it runs all episodes side by side with batched inference.

use bytemuck::Pod;
use millrace_proto::env::Family;
use millrace_proto::{EnvConfig, EnvSpec, NetworkSpec, Params};

use crate::cnn::CnnPolicy;
use crate::env::{self, AnyVecEnv, Env, EnvError, Step, VecEnv};
use crate::policy::{argmax_rows, MlpPolicy, Policy, PolicyError};

/// Bridged environments played side by side in one evaluation, at most.
pub const MAX_BRIDGED_EVAL_ENVS: usize = 16;

/// Returns of a greedy evaluation.
#[derive(Clone, Debug, PartialEq)]
pub struct EvalResult {
    pub returns: Vec<f32>,
}

impl EvalResult {
    pub fn mean(&self) -> f32 {
        (self.returns.iter().map(|r| f64::from(*r)).sum::<f64>() / self.returns.len().max(1) as f64)
            as f32
    }

    pub fn min(&self) -> f32 {
        self.returns.iter().copied().fold(f32::INFINITY, f32::min)
    }

    pub fn max(&self) -> f32 {
        self.returns
            .iter()
            .copied()
            .fold(f32::NEG_INFINITY, f32::max)
    }

    /// Sample standard deviation of the returns (0 for fewer than two episodes).
    pub fn std(&self) -> f32 {
        let n = self.returns.len();
        if n < 2 {
            return 0.0;
        }
        let mean = f64::from(self.mean());
        let ss: f64 = self
            .returns
            .iter()
            .map(|r| (f64::from(*r) - mean).powi(2))
            .sum();
        (ss / (n - 1) as f64).sqrt() as f32
    }

    /// Standard error of the mean.
    pub fn stderr(&self) -> f32 {
        self.std() / (self.returns.len().max(1) as f32).sqrt()
    }
}

/// Plays `episodes` episodes of a classic-control environment greedily (ε = 0), all at
/// once, each environment seeded from `seed`. The policy must have parameters loaded.
pub fn evaluate(
    spec: &EnvSpec,
    policy: &mut dyn Policy,
    episodes: usize,
    seed: u64,
) -> Result<EvalResult, EnvError> {
    evaluate_with(|s| env::make(&spec.id, s), policy, episodes, seed)
}

/// Plays `episodes` episodes greedily in environments from `make` (given each one's
/// seed), all side by side with one forward pass per step.
pub fn evaluate_with<O: Pod + Default>(
    make: impl Fn(u64) -> Result<Box<dyn Env<O>>, EnvError>,
    policy: &mut dyn Policy<O>,
    episodes: usize,
    seed: u64,
) -> Result<EvalResult, EnvError> {
    let mut envs: Vec<Box<dyn Env<O>>> = (0..episodes)
        .map(|i| make(crate::derive_seed(seed, i as u64)))
        .collect::<Result<_, _>>()?;
    let Some(first) = envs.first() else {
        return Ok(EvalResult {
            returns: Vec::new(),
        });
    };
    let obs_dim = first.spec().obs.numel();
    let num_actions = policy.num_actions();
    let mut obs = vec![O::default(); episodes * obs_dim];
    for (i, env) in envs.iter_mut().enumerate() {
        env.reset(None, &mut obs[i * obs_dim..(i + 1) * obs_dim]);
    }
    let mut returns = vec![0.0f32; episodes];
    // Indices of episodes still running; `obs` is kept compacted in the same order.
    let mut active: Vec<usize> = (0..episodes).collect();
    let mut q = vec![0.0f32; episodes * num_actions];
    let mut actions = vec![0usize; episodes];
    let mut next = vec![O::default(); obs_dim];
    while !active.is_empty() {
        let m = active.len();
        policy.q_values(&obs[..m * obs_dim], &mut q[..m * num_actions]);
        argmax_rows(&q[..m * num_actions], num_actions, &mut actions[..m]);
        let mut kept = 0;
        for row in 0..m {
            let e = active[row];
            let step = envs[e].step(actions[row], &mut next);
            returns[e] += step.reward;
            if !step.done() {
                obs[kept * obs_dim..(kept + 1) * obs_dim].copy_from_slice(&next);
                active[kept] = e;
                kept += 1;
            }
        }
        active.truncate(kept);
    }
    Ok(EvalResult { returns })
}

/// Plays `episodes` episodes in `envs` greedily, with one forward pass per step for all
/// of them; environment `i` starts from `derive_seed(seed, i)` and plays its share of
/// the episodes (an equal split: the first to finish do not crowd out long ones).
pub fn evaluate_vec<O: Pod + Default>(
    envs: &mut dyn VecEnv<O>,
    policy: &mut dyn Policy<O>,
    episodes: usize,
    seed: u64,
) -> Result<EvalResult, EnvError> {
    let n = envs.num_envs();
    let d = envs.spec().obs.numel();
    let num_actions = policy.num_actions();
    let mut quota: Vec<usize> = (0..n)
        .map(|i| episodes / n + usize::from(i < episodes % n))
        .collect();
    let seeds: Vec<u64> = (0..n as u64).map(|i| crate::derive_seed(seed, i)).collect();
    let (mut obs, mut next) = (vec![O::default(); n * d], vec![O::default(); n * d]);
    envs.reset(&seeds, &mut obs)?;
    let (mut q, mut actions) = (vec![0.0f32; n * num_actions], vec![0usize; n]);
    let mut steps = vec![Step::default(); n];
    let mut running = vec![0.0f32; n];
    let mut returns = Vec::with_capacity(episodes);
    while quota.iter().any(|q| *q > 0) {
        policy.q_values(&obs, &mut q);
        argmax_rows(&q, num_actions, &mut actions);
        envs.step(&actions, &mut next, &mut obs, &mut steps)?;
        for i in 0..n {
            running[i] += steps[i].reward;
            if steps[i].done() {
                if quota[i] > 0 {
                    returns.push(running[i]);
                    quota[i] -= 1;
                }
                running[i] = 0.0;
            } else {
                obs[i * d..(i + 1) * d].copy_from_slice(&next[i * d..(i + 1) * d]);
            }
        }
    }
    Ok(EvalResult { returns })
}

/// Plays `params` of `network` greedily for `episodes` episodes of `cfg`: the Rust ports
/// one environment per episode, bridged environments up to [`MAX_BRIDGED_EVAL_ENVS`]
/// side by side. Returns are the environment's own (unclipped, whole games).
pub fn evaluate_params(
    cfg: &EnvConfig,
    network: &NetworkSpec,
    params: &Params,
    episodes: usize,
    seed: u64,
) -> Result<EvalResult, EvalError> {
    if !network.has_torso() {
        let mut policy = MlpPolicy::new(network.clone(), 0)?;
        policy.load(params)?;
        let vector = |e| match e {
            AnyVecEnv::Vector(v) => Some(v),
            AnyVecEnv::Pixels(_) => None,
        };
        play(
            cfg,
            &mut policy,
            vector,
            |s| env::make(&cfg.id, s),
            episodes,
            seed,
        )
    } else {
        let mut policy = CnnPolicy::new(network.clone())?;
        policy.load(params)?;
        let pixels = |e| match e {
            AnyVecEnv::Pixels(v) => Some(v),
            AnyVecEnv::Vector(_) => None,
        };
        play(
            cfg,
            &mut policy,
            pixels,
            |s| env::make_pixels(&cfg.id, s),
            episodes,
            seed,
        )
    }
}

/// [`evaluate_params`] once the policy is loaded: `pick` takes the environments of the
/// policy's observation type, `port` builds one Rust port.
fn play<O: Pod + Default>(
    cfg: &EnvConfig,
    policy: &mut dyn Policy<O>,
    pick: impl FnOnce(AnyVecEnv) -> Option<Box<dyn VecEnv<O>>>,
    port: impl Fn(u64) -> Result<Box<dyn Env<O>>, EnvError>,
    episodes: usize,
    seed: u64,
) -> Result<EvalResult, EvalError> {
    if cfg.family() == Family::Native {
        return Ok(evaluate_with(port, policy, episodes, seed)?);
    }
    let envs = env::make_vec(cfg, episodes.clamp(1, MAX_BRIDGED_EVAL_ENVS), seed)?;
    let mut envs = pick(envs).ok_or_else(|| EvalError::Observations(cfg.id.clone()))?;
    Ok(evaluate_vec(&mut *envs, policy, episodes, seed)?)
}

/// Why a saved policy could not be played ([`evaluate_params`]).
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(transparent)]
    Env(#[from] EnvError),
    #[error("the network does not fit {0}'s observations")]
    Observations(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MlpPolicy;
    use millrace_proto::{NetworkSpec, Params};

    /// A hand-set linear policy that balances CartPole: push towards where the pole falls.
    fn balancing_policy() -> MlpPolicy {
        let spec = env::spec("CartPole-v1").unwrap();
        let net = NetworkSpec::mlp(&spec.obs, &[2], 2, 1).unwrap();
        // Hidden unit 0 = relu(s), unit 1 = relu(-s) with s = theta + 0.5·theta_dot;
        // Q(right) = h0, Q(left) = h1.
        #[rustfmt::skip]
        let data = vec![
            0.0, 0.0,  0.1, -0.1,  1.0, -1.0,  0.5, -0.5, // w0 [4, 2]
            0.0, 0.0,                                     // b0
            0.0, 1.0,  1.0, 0.0,                          // w1 [2, 2]
            0.0, 0.0,                                     // b1
        ];
        let mut policy = MlpPolicy::new(net, 0).unwrap();
        policy.load(&Params::of_one(1, data)).unwrap();
        policy
    }

    #[test]
    fn a_balancing_policy_reaches_the_time_limit() {
        let spec = env::spec("CartPole-v1").unwrap();
        let result = evaluate(&spec, &mut balancing_policy(), 20, 3).unwrap();
        assert_eq!(result.returns.len(), 20);
        assert!(result.mean() > 400.0, "mean {}", result.mean());
        assert!(result.returns.iter().all(|r| *r <= 500.0));
    }

    #[test]
    fn a_constant_policy_fails_fast() {
        let spec = env::spec("CartPole-v1").unwrap();
        let net = NetworkSpec::mlp(&spec.obs, &[2], 2, 1).unwrap();
        let mut policy = MlpPolicy::new(net.clone(), 0).unwrap();
        let mut data = vec![0.0; net.layout().len];
        *data.last_mut().unwrap() = 1.0; // Q(right) = 1 always
        policy.load(&Params::of_one(1, data)).unwrap();
        let result = evaluate(&spec, &mut policy, 10, 0).unwrap();
        assert!(result.mean() < 20.0, "mean {}", result.mean());
        assert!(result.min() >= 8.0);
    }

    #[test]
    fn the_vectorised_evaluation_splits_episodes_and_agrees_on_a_good_policy() {
        let envs = (0..3)
            .map(|i| env::make("CartPole-v1", i).unwrap())
            .collect();
        let mut envs = env::NativeVec::new(envs);
        let result = evaluate_vec(&mut envs, &mut balancing_policy(), 10, 3).unwrap();
        assert_eq!(result.returns.len(), 10);
        assert!(result.mean() > 400.0, "mean {}", result.mean());
    }

    #[test]
    fn spread_statistics() {
        let r = EvalResult {
            returns: vec![1.0, 2.0, 3.0, 4.0],
        };
        assert_eq!((r.mean(), r.min(), r.max()), (2.5, 1.0, 4.0));
        assert!((r.std() - 1.290_994).abs() < 1e-5);
        assert!((r.stderr() - 0.645_497).abs() < 1e-5);
        let one = EvalResult { returns: vec![7.0] };
        assert_eq!((one.std(), one.stderr()), (0.0, 0.0));
    }
}
