//! Frame mode end to end: an actor sends each frame of its stacked observations once,
//! replay stores it once, and the stacks sampling rebuilds are exactly the ones the
//! environments produced, across episode starts, lost lives, actor batches, shards and
//! evictions.
//!
//! The reference is the same seeded actor with its environments' spec saying "not
//! stacked": it then sends every observation whole, as the environment produced it.
//! Both runs take the same actions (random, from the same seed), so the k-th transition
//! of one is the k-th of the other.

use std::collections::HashMap;

use millrace_actor::env::{make_vec, AnyVecEnv, EnvError, Step, VecEnv};
use millrace_actor::schedule::EpsilonSchedule;
use millrace_actor::{ActorConfig, ActorLoop, CnnPolicy, NoParams};
use millrace_proto::wire::ActorMsg;
use millrace_proto::{codec, EnvConfig, EnvSpec, NetworkSpec, StepCounter, TransitionBatch};
use millrace_replay::{split, ItemKey, RateLimiterConfig, ReplayConfig, SampleBuffers, Table};
use rand::rngs::SmallRng;
use rand::SeedableRng;

/// The same environments, presented as unstacked: the actor sends whole observations.
struct WholeObservations {
    envs: Box<dyn VecEnv<u8>>,
    spec: EnvSpec,
}

impl VecEnv<u8> for WholeObservations {
    fn spec(&self) -> &EnvSpec {
        &self.spec
    }
    fn num_envs(&self) -> usize {
        self.envs.num_envs()
    }
    fn reset(&mut self, seeds: &[u64], obs: &mut [u8]) -> Result<(), EnvError> {
        self.envs.reset(seeds, obs)
    }
    fn step(
        &mut self,
        actions: &[usize],
        next: &mut [u8],
        first: &mut [u8],
        steps: &mut [Step],
    ) -> Result<(), EnvError> {
        self.envs.step(actions, next, first, steps)
    }
}

fn pixels(cfg: &ActorConfig) -> Box<dyn VecEnv<u8>> {
    match make_vec(&cfg.env, cfg.num_envs, 7).unwrap() {
        AnyVecEnv::Pixels(envs) => envs,
        AnyVecEnv::Vector(_) => panic!("{} has pixel observations", cfg.env.id),
    }
}

/// `count` batches from a fresh actor on `envs`, acting at random.
fn batches(cfg: &ActorConfig, envs: Box<dyn VecEnv<u8>>, count: usize) -> Vec<TransitionBatch> {
    let spec = envs.spec().clone();
    let mut policy =
        CnnPolicy::new(NetworkSpec::nature_cnn(&spec.obs, spec.num_actions).unwrap()).unwrap();
    let mut actor = ActorLoop::new(cfg, envs).unwrap();
    let steps = StepCounter::default();
    let mut out = Vec::new();
    while out.len() < count {
        if let Some(b) = actor
            .step(&mut policy, &mut NoParams, &steps, &mut |_| {})
            .unwrap()
        {
            out.push(std::mem::take(b));
        }
    }
    out
}

/// One transition as the learner must see it.
#[derive(Debug, PartialEq)]
struct Transition {
    obs: Vec<u8>,
    action: i64,
    reward: f32,
    discount: f32,
    next: Vec<u8>,
}

/// What sampling rebuilt, and what else it saw.
struct Outcome {
    compared: usize,
    stored: usize,
    frames: usize,
    dropped: u64,
}

/// Runs the actor both ways, stores the frame-mode batches (through the wire codec)
/// in a table of `shards` shards and `capacity` transitions, and after every batch
/// samples and compares each sampled transition with the reference.
fn compare(cfg: &ActorConfig, count: usize, shards: usize, capacity: usize) -> Outcome {
    let frames = batches(cfg, pixels(cfg), count);
    let envs = pixels(cfg);
    let mut spec = envs.spec().clone();
    let stack = spec.frame_stack;
    assert!(stack > 1, "{} stacks its frames", spec.id);
    spec.frame_stack = 1;
    let whole = batches(cfg, Box::new(WholeObservations { envs, spec }), count);

    let obs_bytes = whole[0].obs_row_bytes;
    let reference: Vec<Transition> = whole
        .iter()
        .flat_map(|b| {
            (0..b.len()).map(move |i| Transition {
                obs: b.obs_row(b.obs_index[i]).to_vec(),
                action: b.actions[i],
                reward: b.rewards[i],
                discount: b.discounts[i],
                next: b.obs_row(b.next_index[i]).to_vec(),
            })
        })
        .collect();

    let table = Table::new(&ReplayConfig {
        capacity,
        shards,
        obs_row_bytes: obs_bytes,
        stack,
        obs_rows_per_item: ReplayConfig::FRAMES_PER_ITEM,
        limiter: RateLimiterConfig::sample_to_insert_ratio(1.0, 1, 1e12, 64).unwrap(),
        priority: None,
    })
    .unwrap();
    // Which stored item is which transition: items are numbered per shard in the order
    // they arrive, and each environment's transitions go to one shard.
    let mut seqs = vec![0u64; shards];
    let mut which: HashMap<ItemKey, usize> = HashMap::new();
    let mut rng = SmallRng::seed_from_u64(3);
    let rows = 64;
    let (mut o, mut n) = (vec![0u8; rows * obs_bytes], vec![0u8; rows * obs_bytes]);
    let (mut a, mut r, mut d) = (vec![0i64; rows], vec![0f32; rows], vec![0f32; rows]);
    let mut keys = vec![ItemKey::default(); rows];
    let mut weights = vec![0f32; rows];
    let mut compared = 0;
    let mut k = 0;
    for (b, w) in frames.iter().zip(&whole) {
        assert_eq!(b.len(), w.len(), "both runs hand on the same transitions");
        assert_eq!((&b.actions, &b.rewards), (&w.actions, &w.rewards));
        // What a remote actor sends is what arrives.
        let sent = codec::encode(&ActorMsg::Transitions(b.clone()), 64 << 20).unwrap();
        let ActorMsg::Transitions(arrived) = codec::decode(&sent[4..]).unwrap() else {
            panic!("a transitions message");
        };
        assert_eq!(&arrived, b);
        table.insert_unlimited(&arrived).unwrap();
        let links = b.frames.as_ref().expect("frame mode");
        for env in &links.item_env {
            let s = split::shard_of(b.actor_id, *env, shards);
            which.insert(ItemKey::new(s as u16, seqs[s]), k);
            seqs[s] += 1;
            k += 1;
        }
        for _ in 0..4 {
            let mut out = SampleBuffers {
                obs: &mut o,
                next_obs: &mut n,
                actions: &mut a,
                rewards: &mut r,
                discounts: &mut d,
                keys: &mut keys,
                weights: &mut weights,
            };
            table.try_sample(&mut rng, &mut out).unwrap().unwrap();
            for row in 0..rows {
                let t = &reference[which[&keys[row]]];
                let got = Transition {
                    obs: o[row * obs_bytes..(row + 1) * obs_bytes].to_vec(),
                    action: a[row],
                    reward: r[row],
                    discount: d[row],
                    next: n[row * obs_bytes..(row + 1) * obs_bytes].to_vec(),
                };
                assert!(
                    got == *t,
                    "item {:?} (transition {}) rebuilt wrong",
                    keys[row],
                    which[&keys[row]]
                );
                compared += 1;
            }
        }
    }
    let stats = table.stats();
    Outcome {
        compared,
        stored: stats.size,
        frames: stats.obs_rows,
        dropped: stats.dropped,
    }
}

fn config(id: &str, envs: usize, batch_rows: usize) -> ActorConfig {
    ActorConfig {
        actor_id: 5,
        env: EnvConfig::new(id),
        num_envs: envs,
        seed: 11,
        n_step: 3,
        gamma: 0.99,
        batch_rows,
        epsilon: EpsilonSchedule::Constant(1.0),
        env_epsilons: None,
        clip_rewards: false,
        initial_priorities: false,
        value_bounds: millrace_proto::ValueBounds::FINITE,
    }
}

#[test]
fn catch_pixels_stacks_rebuild_exactly_across_batches_shards_and_evictions() {
    // Short episodes (many starts), small batches (many cross-batch links), a replay
    // that wraps several times.
    let cfg = config("CatchPixels-v0", 6, 32);
    let out = compare(&cfg, 60, 3, 600);
    assert_eq!(out.dropped, 0, "every transition's frames were stored");
    assert!(out.stored > 400 && out.stored <= 600, "{}", out.stored);
    assert!(out.compared >= 60 * 4 * 64);
    eprintln!(
        "CatchPixels: {} sampled transitions compared; {:.3} frames per stored transition",
        out.compared,
        out.frames as f64 / out.stored as f64
    );
}

#[test]
fn one_shard_holds_all_environments_of_an_actor() {
    let cfg = config("CatchPixels-v0", 3, 16);
    let out = compare(&cfg, 30, 1, 200);
    assert_eq!(out.dropped, 0);
    assert!(out.stored > 100);
}

/// Atari through ale-py: its own stacking at resets, lost lives (Breakout has five)
/// that start a new chain without a new frame, 64 environments as `actor --n 64` runs.
#[cfg(feature = "gym")]
#[test]
fn breakout_stacks_rebuild_exactly_with_lost_lives_and_store_about_one_frame_each() {
    let mut cfg = config("BreakoutNoFrameskip-v4", 64, 256);
    cfg.env.terminal_on_life_loss = true;
    let out = compare(&cfg, 24, 4, 4_000);
    assert_eq!(out.dropped, 0);
    let per_item = out.frames as f64 / out.stored as f64;
    eprintln!(
        "Breakout, 64 envs: {} sampled transitions compared; {per_item:.3} frames per stored \
         transition",
        out.compared
    );
    // A short run still counts each environment's first chain of 4 frames (4% here);
    // stacks stored whole would be 4, or 2.5 with shared rows. The steady state at
    // `actor --n 64` is measured by learner/benches/replay_footprint.rs.
    assert!(per_item <= 1.2, "{per_item} frames per stored transition");
}
