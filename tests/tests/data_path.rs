//! The data path end to end, in process: an actor steps CartPole, replay stores its
//! transitions, the prefetcher gathers them into staging tensors. Every sampled row must
//! still be a true CartPole transition: re-simulating `obs` with `action` gives
//! `next_obs` (terminal rows, which nothing bootstraps from, point back at their own
//! observation), rewards are 1, and only terminal rows have discount 0.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use millrace_actor::env::{CartPole, Env};
use millrace_actor::{run_actor, ActorConfig, EpsilonSchedule, NoParams};
use millrace_core::prefetch::{Prefetcher, SamplerConfig};
use millrace_proto::{EnvConfig, NetworkSpec, StepCounter};
use millrace_replay::{RateLimiterConfig, ReplayConfig, Table};
use millrace_tests::TableSink;
use tch::Device;

#[test]
fn sampled_batches_are_true_cartpole_transitions() {
    let spec = millrace_actor::env::spec("CartPole-v1").unwrap();
    let table = Arc::new(
        Table::new(&ReplayConfig {
            capacity: 10_000,
            shards: 2,
            obs_row_bytes: spec.obs.row_bytes(),
            stack: 1,
            obs_rows_per_item: ReplayConfig::obs_rows_for(4, 1, 32),
            limiter: RateLimiterConfig::sample_to_insert_ratio(1e6, 100, 1e12, 32).unwrap(),
            priority: None,
        })
        .unwrap(),
    );
    let cfg = ActorConfig {
        actor_id: 1,
        env: EnvConfig::new(spec.id.clone()),
        num_envs: 4,
        seed: 3,
        n_step: 1,
        gamma: 0.99,
        batch_rows: 32,
        epsilon: EpsilonSchedule::Constant(1.0),
        env_epsilons: None,
        clip_rewards: false,
        initial_priorities: false,
        value_bounds: millrace_proto::ValueBounds::FINITE,
    };
    let net = NetworkSpec::mlp(&spec.obs, &[8], 2, 1).unwrap();
    let mut sink = TableSink::new(Arc::clone(&table), 50);
    run_actor(
        &cfg,
        &net,
        &mut NoParams,
        &mut sink,
        &StepCounter::default(),
        &AtomicBool::new(false),
    )
    .unwrap();
    assert!(table.len() >= 1600);
    assert!(
        table.shard_lens().iter().all(|n| *n > 0),
        "batches spread over shards"
    );
    // One observation row per transition, plus what each batch carries over (at most
    // n_step = 1 row per env: 4 per 32 transitions) and a row per truncation (none here).
    let stats = table.stats();
    let rows_per_item = stats.obs_rows as f64 / stats.size as f64;
    assert!(
        (1.0..=1.0 + 4.0 / 32.0 + 1e-9).contains(&rows_per_item),
        "{rows_per_item} observation rows per transition"
    );

    let sampler = SamplerConfig {
        depth: 2,
        seed: 0,
        fail_after: None,
    };
    let prefetcher = Prefetcher::spawn(Arc::clone(&table), &spec.obs, 32, None, sampler).unwrap();
    let mut env = CartPole::new(0);
    let mut predicted = [0.0f32; 4];
    let mut terminal = 0;
    for _ in 0..20 {
        let buf = prefetcher.ready.recv().unwrap();
        let batch = buf.to_device(Device::Cpu);
        let obs2 = Vec::<f32>::try_from(batch.obs2.view([-1])).unwrap();
        let actions = Vec::<i64>::try_from(batch.actions.view([-1])).unwrap();
        let rewards = Vec::<f32>::try_from(batch.rewards.view([-1])).unwrap();
        let discounts = Vec::<f32>::try_from(batch.discounts.view([-1])).unwrap();
        for row in 0..32 {
            let obs = &obs2[row * 4..row * 4 + 4];
            let next = &obs2[(32 + row) * 4..(32 + row) * 4 + 4];
            let state: Vec<f64> = obs.iter().map(|x| f64::from(*x)).collect();
            env.set_state(&state, &mut predicted).unwrap();
            let step = env.step(actions[row] as usize, &mut predicted);
            assert_eq!(rewards[row], 1.0);
            if step.terminated {
                // Nothing bootstraps from a terminal observation, so replay does not
                // store it: the row points back at its own observation.
                assert_eq!(discounts[row], 0.0, "terminal rows do not bootstrap");
                assert_eq!(next, obs);
                terminal += 1;
            } else {
                for (p, n) in predicted.iter().zip(next) {
                    assert!(
                        (p - n).abs() < 1e-4,
                        "row {row}: predicted {predicted:?}, stored {next:?}"
                    );
                }
                assert!((discounts[row] - 0.99).abs() < 1e-6);
            }
        }
        prefetcher.free.send(buf).unwrap();
    }
    assert!(terminal > 0, "random play ends episodes");
    table.close();
    prefetcher.join().unwrap();
}
