//! Replay bytes per stored Atari transition, measured from what actors really send:
//! an actor steps Pong (ale-py through the bridge) with `--envs` environments, n-step
//! returns and batches of `--batch-rows`, and every batch is counted (observation bytes
//! and transitions). Replay stores a batch's rows as they come, so the observation
//! bytes per transition here are what replay holds per item; the table's own
//! allocation for one million transitions, and the capacity that fits in 24 GB, follow.
//!
//! `cargo bench -p millrace-learner --bench replay_footprint -- [--envs 64]
//!  [--batch-rows 1024] [--steps 20000]`

use std::sync::atomic::AtomicBool;

use millrace_actor::runner::{ActorSink, EpisodeStats, SinkClosed};
use millrace_actor::{run_actor, ActorConfig, EpsilonSchedule, NoParams};
use millrace_proto::{EnvConfig, NetworkSpec, StepCounter, TransitionBatch};
use millrace_replay::{RateLimiterConfig, ReplayConfig};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| v.parse().expect("a number"))
}

struct Count {
    obs_bytes: usize,
    transitions: usize,
    limit: usize,
}

impl ActorSink for Count {
    fn transitions(&mut self, batch: TransitionBatch) -> Result<(), SinkClosed> {
        self.obs_bytes += batch.obs.len();
        self.transitions += batch.len();
        if self.transitions >= self.limit {
            Err(SinkClosed)
        } else {
            Ok(())
        }
    }
    fn episode(&mut self, _: EpisodeStats) {}
}

fn main() {
    let envs = arg("--envs", 64);
    let batch_rows = arg("--batch-rows", 1024);
    let steps = arg("--steps", 20_000);
    let n_step = 3;
    let env = EnvConfig::new("PongNoFrameskip-v4");
    let spec = millrace_actor::env::spec_of(&env).unwrap();
    let frame = spec.obs.row_bytes() / spec.obs.shape[0];
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
    };
    let net = NetworkSpec::nature_cnn(&spec.obs, spec.num_actions).unwrap();
    let mut sink = Count {
        obs_bytes: 0,
        transitions: 0,
        limit: steps,
    };
    run_actor(
        &cfg,
        &net,
        &mut NoParams,
        &mut sink,
        &StepCounter::default(),
        &AtomicBool::new(false),
    )
    .unwrap();
    let per_transition = sink.obs_bytes as f64 / sink.transitions as f64;
    let config = ReplayConfig {
        capacity: 1_000_000,
        shards: 8,
        obs_row_bytes: spec.obs.row_bytes(),
        obs_rows_per_item: ReplayConfig::obs_rows_for(envs, n_step, batch_rows),
        limiter: RateLimiterConfig::sample_to_insert_ratio(8.0, 50_000, 1e6, 32).unwrap(),
    };
    let million = config.bytes() as f64;
    let per_item = million / 1e6;
    println!(
        "Pong, {envs} envs per actor, batches of {batch_rows}, {n_step}-step: {} transitions",
        sink.transitions
    );
    println!(
        "  observation bytes per transition sent: {per_transition:.0} = {:.2} bytes per frame-byte ({frame} B frames, {:.2} stacked observations)",
        per_transition / frame as f64,
        per_transition / spec.obs.row_bytes() as f64
    );
    println!(
        "  replay sized for it: {:.1} GB per million transitions ({per_item:.0} B an item), {:.2} bytes per frame-byte; {:.0}k transitions fit in 24 GB",
        million / 1e9,
        per_item / frame as f64,
        24e9 / per_item / 1e3
    );
}
