//! Actor throughput: agent steps per second of one process, for an environment alone
//! (random actions through [`VecEnv`]) or a whole actor (the actor loop with batched
//! CPU inference of the network the learner would pick, n-step transitions and
//! batches handed to a sink that drops them), with `--threads` actors in the process.
//!
//! `cargo bench -p millrace-actor --bench throughput -- --env PongNoFrameskip-v4
//!  [--envs 8] [--threads 1] [--seconds 10] [--mode env|actor|infer]`
//!
//! `infer` times the network alone: batched forward passes over `--envs` random
//! observations (observations per second).
//!
//! Prints one JSON line (bench/atari_actor.sh runs it beside ale-py's and Gymnasium's
//! own loops and tabulates).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use millrace_actor::env::{make_vec, AnyVecEnv, Step, VecEnv};
use millrace_actor::runner::{ActorSink, EpisodeStats, SinkClosed};
use millrace_actor::{run_actor, ActorConfig, EpsilonSchedule};
use millrace_proto::{
    DType, EnvConfig, NetworkSpec, Params, ParamsCell, StepCounter, TransitionBatch,
};
use rand::{Rng, SeedableRng};

fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_else(|| default.to_string())
}

/// The learner's automatic choice (learner::network::build, without the learner).
fn network(env: &millrace_proto::EnvSpec) -> NetworkSpec {
    match (env.obs.dtype, &env.obs.shape[..]) {
        (DType::F32, _) => NetworkSpec::mlp(&env.obs, &[128, 128], env.num_actions, 1).unwrap(),
        (DType::U8, [_, h, w]) if *h >= 36 && *w >= 36 => {
            NetworkSpec::nature_cnn(&env.obs, env.num_actions).unwrap()
        }
        _ => NetworkSpec::minatar_cnn(&env.obs, env.num_actions).unwrap(),
    }
}

/// Random actions through the environments alone.
fn env_only<O: Copy + Default>(envs: &mut dyn VecEnv<O>, stop: &AtomicBool, steps: &AtomicU64) {
    let (n, d) = (envs.num_envs(), envs.spec().obs.numel());
    let k = envs.spec().num_actions;
    let (mut obs, mut next) = (vec![O::default(); n * d], vec![O::default(); n * d]);
    let mut out = vec![Step::default(); n];
    let mut actions = vec![0usize; n];
    let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
    let seeds: Vec<u64> = (0..n as u64).collect();
    envs.reset(&seeds, &mut obs).unwrap();
    while !stop.load(Ordering::Relaxed) {
        actions.iter_mut().for_each(|a| *a = rng.random_range(0..k));
        envs.step(&actions, &mut next, &mut obs, &mut out).unwrap();
        steps.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// Forward passes of the network over `n` random observations at a time.
fn infer_only(net: &NetworkSpec, params: &Params, n: usize, stop: &AtomicBool, done: &AtomicU64) {
    use millrace_actor::{CnnPolicy, MlpPolicy, Policy};
    let d: usize = if net.image.is_empty() {
        net.obs_dim
    } else {
        net.image.iter().product()
    };
    let mut rng = rand::rngs::SmallRng::seed_from_u64(2);
    let mut q = vec![0.0f32; n * net.num_actions];
    if !net.has_torso() {
        let mut policy = MlpPolicy::new(net.clone(), 0).unwrap();
        policy.load(params).unwrap();
        let obs: Vec<f32> = (0..n * d).map(|_| rng.random_range(-1.0..1.0)).collect();
        while !stop.load(Ordering::Relaxed) {
            policy.q_values(&obs, &mut q);
            done.fetch_add(n as u64, Ordering::Relaxed);
        }
    } else {
        let mut policy = CnnPolicy::new(net.clone()).unwrap();
        policy.load(params).unwrap();
        let obs: Vec<u8> = (0..n * d).map(|_| rng.random()).collect();
        while !stop.load(Ordering::Relaxed) {
            policy.q_values(&obs, &mut q);
            done.fetch_add(n as u64, Ordering::Relaxed);
        }
    }
}

struct Drop_;

impl ActorSink for Drop_ {
    fn transitions(&mut self, _: &mut TransitionBatch) -> Result<(), SinkClosed> {
        Ok(())
    }
    fn episode(&mut self, _: EpisodeStats) {}
}

fn main() {
    let id = arg("--env", "PongNoFrameskip-v4");
    let envs: usize = arg("--envs", "8").parse().unwrap();
    let threads: usize = arg("--threads", "1").parse().unwrap();
    let seconds: f64 = arg("--seconds", "10").parse().unwrap();
    let mode = arg("--mode", "actor");
    let cfg = EnvConfig::new(id.clone());
    let spec = millrace_actor::env::spec_of(&cfg).unwrap();
    let net = network(&spec);
    let mut rng = rand::rngs::SmallRng::seed_from_u64(0);
    let params = Arc::new(ParamsCell::new(Params {
        version: 1,
        env_steps: 0,
        updates: 0,
        population: 1,
        data: (0..net.layout().len)
            .map(|_| rng.random_range(-0.05..0.05))
            .collect(),
    }));
    let stop = Arc::new(AtomicBool::new(false));
    let counted = Arc::new(AtomicU64::new(0));
    let steps = Arc::new(StepCounter::default());
    let started = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (cfg, net, mode) = (cfg.clone(), net.clone(), mode.clone());
            let (stop, counted, steps) =
                (Arc::clone(&stop), Arc::clone(&counted), Arc::clone(&steps));
            let mut params = Arc::clone(&params);
            std::thread::spawn(move || match mode.as_str() {
                "infer" => infer_only(&net, &params.latest(), envs, &stop, &counted),
                "env" => match make_vec(&cfg, envs, t as u64).unwrap() {
                    AnyVecEnv::Vector(mut e) => env_only(&mut *e, &stop, &counted),
                    AnyVecEnv::Pixels(mut e) => env_only(&mut *e, &stop, &counted),
                },
                _ => {
                    let acfg = ActorConfig {
                        actor_id: t as u32,
                        env: cfg,
                        num_envs: envs,
                        seed: 7,
                        n_step: 3,
                        gamma: 0.99,
                        batch_rows: 256.max(envs),
                        // Inference runs for every environment every step; ε only
                        // picks which actions are taken.
                        epsilon: EpsilonSchedule::Constant(0.01),
                        env_epsilons: None,
                        clip_rewards: true,
                        initial_priorities: false,
                        value_bounds: millrace_proto::ValueBounds::FINITE,
                    };
                    run_actor(&acfg, &net, &mut params, &mut Drop_, &steps, &stop).unwrap();
                }
            })
        })
        .collect();
    // Building the environments takes seconds (ale-py makes each game's palettes): the
    // window opens once every thread has stepped, after a further warm-up.
    let stepped = || steps.get() + counted.load(Ordering::Relaxed);
    while stepped() < (2 * threads * envs) as u64 {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "the environments did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_secs_f64(seconds.min(1.0)));
    let (s0, c0, t0) = (steps.get(), counted.load(Ordering::Relaxed), Instant::now());
    std::thread::sleep(Duration::from_secs_f64(seconds));
    let elapsed = t0.elapsed().as_secs_f64();
    let done = (steps.get() - s0) + (counted.load(Ordering::Relaxed) - c0);
    stop.store(true, Ordering::Relaxed);
    handles.into_iter().for_each(|h| h.join().unwrap());
    println!(
        "{{\"impl\": \"millrace\", \"env\": \"{id}\", \"mode\": \"{mode}\", \"envs\": {envs}, \"threads\": {threads}, \"steps_per_s\": {:.1}, \"seconds\": {elapsed:.1}, \"setup_s\": {:.1}}}",
        done as f64 / elapsed,
        started.elapsed().as_secs_f64() - elapsed
    );
}
