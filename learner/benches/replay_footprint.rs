//! Replay bytes per stored Atari transition, measured from what actors really send and
//! what replay really keeps: an actor steps Pong (ale-py through the bridge) with
//! `--envs` environments, 3-step returns and batches of `--batch-rows`, at random, and
//! every batch goes into a frame-mode table of `--capacity` transitions (8 shards) that
//! wraps several times. Replay's own count of frames per stored transition, once full,
//! gives the bytes per frame-byte; the table's allocation for one million transitions,
//! and the capacity that fits in 24 GB, follow. Beside it, from the same seeded actor
//! in the same run: what whole stacked observations (row mode, the layout before frame
//! mode) cost per transition.
//!
//! `cargo bench -p millrace-learner --bench replay_footprint -- [--envs 64]
//!  [--batch-rows 256] [--steps 200000] [--capacity 50000]`

use std::sync::atomic::AtomicBool;

use millrace_actor::env::{make_vec, AnyVecEnv, EnvError, Step, VecEnv};
use millrace_actor::runner::{ActorSink, EpisodeStats, SinkClosed};
use millrace_actor::{run_actor_with, ActorConfig, CnnPolicy, EpsilonSchedule, NoParams};
use millrace_proto::{EnvConfig, EnvSpec, NetworkSpec, StepCounter, TransitionBatch};
use millrace_replay::{RateLimiterConfig, ReplayConfig, Table};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| v.parse().expect("a number"))
}

/// Stores every batch in `table` (frame mode), or only counts what it carries.
struct Sink<'a> {
    table: Option<&'a Table>,
    obs_bytes: usize,
    transitions: usize,
    limit: usize,
}

impl ActorSink for Sink<'_> {
    fn transitions(&mut self, batch: &mut TransitionBatch) -> Result<(), SinkClosed> {
        self.obs_bytes += batch.obs.len();
        self.transitions += batch.len();
        if let Some(table) = self.table {
            table.insert_unlimited(batch).expect("a valid batch");
        }
        if self.transitions >= self.limit {
            Err(SinkClosed)
        } else {
            Ok(())
        }
    }
    fn episode(&mut self, _: EpisodeStats) {}
}

/// The same environments presented as unstacked: the actor sends whole observations.
struct Whole(Box<dyn VecEnv<u8>>, EnvSpec);

impl VecEnv<u8> for Whole {
    fn spec(&self) -> &EnvSpec {
        &self.1
    }
    fn num_envs(&self) -> usize {
        self.0.num_envs()
    }
    fn reset(&mut self, seeds: &[u64], obs: &mut [u8]) -> Result<(), EnvError> {
        self.0.reset(seeds, obs)
    }
    fn step(
        &mut self,
        actions: &[usize],
        next: &mut [u8],
        first: &mut [u8],
        steps: &mut [Step],
    ) -> Result<(), EnvError> {
        self.0.step(actions, next, first, steps)
    }
}

fn run(cfg: &ActorConfig, whole: bool, sink: &mut Sink<'_>) {
    let AnyVecEnv::Pixels(envs) = make_vec(&cfg.env, cfg.num_envs, 1).unwrap() else {
        unreachable!("Pong has pixels")
    };
    let spec = envs.spec().clone();
    let envs: Box<dyn VecEnv<u8>> = if whole {
        let mut flat = spec.clone();
        flat.frame_stack = 1;
        Box::new(Whole(envs, flat))
    } else {
        envs
    };
    let net = NetworkSpec::nature_cnn(&spec.obs, spec.num_actions).unwrap();
    let mut policy = CnnPolicy::new(net).unwrap();
    run_actor_with(
        cfg,
        envs,
        &mut policy,
        &mut NoParams,
        sink,
        &StepCounter::default(),
        &AtomicBool::new(false),
    )
    .unwrap();
}

fn main() {
    let envs = arg("--envs", 64);
    let batch_rows = arg("--batch-rows", 256);
    let steps = arg("--steps", 200_000);
    let capacity = arg("--capacity", 50_000);
    let n_step = 3;
    let env = EnvConfig::new("PongNoFrameskip-v4");
    let spec = millrace_actor::env::spec_of(&env).unwrap();
    let stack = spec.frame_stack;
    let frame = spec.obs.row_bytes() / stack;
    let cfg = ActorConfig {
        actor_id: 0,
        env,
        num_envs: envs,
        seed: 1,
        n_step,
        gamma: 0.99,
        batch_rows,
        epsilon: EpsilonSchedule::Constant(1.0),
        env_epsilons: None,
        clip_rewards: true,
        initial_priorities: false,
        value_bounds: millrace_proto::ValueBounds::FINITE,
    };
    let config = |capacity: usize| ReplayConfig {
        capacity,
        shards: 8,
        obs_row_bytes: spec.obs.row_bytes(),
        stack,
        obs_rows_per_item: ReplayConfig::FRAMES_PER_ITEM,
        limiter: RateLimiterConfig::sample_to_insert_ratio(8.0, 1, 1e12, 32).unwrap(),
        priority: None,
    };
    let table = Table::new(&config(capacity)).unwrap();
    let mut frames = Sink {
        table: Some(&table),
        obs_bytes: 0,
        transitions: 0,
        limit: steps,
    };
    run(&cfg, false, &mut frames);
    let mut whole = Sink {
        table: None,
        obs_bytes: 0,
        transitions: 0,
        limit: steps,
    };
    run(&cfg, true, &mut whole);

    let stats = table.stats();
    let frames_per_item = stats.obs_rows as f64 / stats.size as f64;
    let item_bytes = config(capacity).bytes() as f64 / capacity as f64
        - frame as f64 * ReplayConfig::FRAMES_PER_ITEM;
    let stored = frames_per_item + item_bytes / frame as f64;
    let million = config(1_000_000).bytes() as f64;
    println!(
        "Pong, {envs} envs per actor, batches of {batch_rows}, {n_step}-step, {} transitions; \
         replay of {capacity} in 8 shards, refilled {:.1} times",
        frames.transitions,
        frames.transitions as f64 / capacity as f64
    );
    println!(
        "  frame mode: {:.4} frames per stored transition ({} stored, {} frames, {} dropped) \
         = {stored:.3} bytes per frame-byte with the item columns; sent {:.3} frames per transition",
        frames_per_item,
        stats.size,
        stats.obs_rows,
        stats.dropped,
        frames.obs_bytes as f64 / frame as f64 / frames.transitions as f64
    );
    println!(
        "  allocated ({} frames per item): {:.2} GB per million transitions ({:.2} bytes per \
         frame-byte); {:.2}M transitions fit in 24 GB",
        ReplayConfig::FRAMES_PER_ITEM,
        million / 1e9,
        million / 1e6 / frame as f64,
        24e9 / (million / 1e6) / 1e6
    );
    println!(
        "  whole stacks (row mode), same actor: {:.2} bytes per frame-byte sent ({:.2} stacked \
         observations per transition)",
        whole.obs_bytes as f64 / frame as f64 / whole.transitions as f64,
        whole.obs_bytes as f64 / spec.obs.row_bytes() as f64 / whole.transitions as f64
    );
}
