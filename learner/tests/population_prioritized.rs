//! With prioritized replay, agent k of a population learns as a one-agent run with the
//! same seed and the same replay contents would: the learner step hands each agent's
//! TD errors back to its own replay as priorities, so every later draw (its items and
//! importance weights) follows its own updates, as it would alone. A mix-up of agents'
//! priorities or keys would change the draws, and with them every value after.

use std::sync::Arc;

use millrace_core::dqn::agents::AgentHparams;
use millrace_core::dqn::{Batch, Dqn, DqnConfig, TargetUpdate};
use millrace_core::priority_feedback::{BetaSchedule, PriorityFeedback};
use millrace_core::step::{LearnerStep, StepConfig};
use millrace_proto::{DType, NetworkSpec, ObsSpec, TransitionBatch};
use millrace_replay::{
    ItemKey, PriorityConfig, RateLimiterConfig, ReplayConfig, SampleScratch, Table,
};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use tch::{Device, Kind, Tensor};

const OBS: usize = 4;
const B: usize = 8;

fn spec(k: usize) -> NetworkSpec {
    let obs = ObsSpec {
        shape: vec![OBS],
        dtype: DType::F32,
    };
    NetworkSpec::mlp(&obs, &[16, 16], 3, k).unwrap()
}

/// Agent `agent`'s replay: prioritized, 64 distinct transitions of its own.
fn replay(agent: usize) -> Arc<Table> {
    let table = Table::new(&ReplayConfig {
        capacity: 64,
        shards: 2,
        obs_row_bytes: OBS * 4,
        stack: 1,
        obs_rows_per_item: 2.0,
        limiter: RateLimiterConfig::sample_to_insert_ratio(1e9, 1, 1e9, 1).unwrap(),
        priority: Some(PriorityConfig {
            alpha: 0.6,
            beta: 0.4,
        }),
    })
    .unwrap();
    for seq in 0..4u64 {
        let mut b = TransitionBatch::with_capacity(OBS * 4, 16, 16);
        for i in 0..16 {
            let v = (agent * 100 + seq as usize * 16 + i) as f32 / 50.0;
            let obs = [v.sin(), v.cos(), v, -v];
            let next = [v.cos(), v.sin(), -v, v];
            b.push_f32(
                &obs,
                (i % 3) as i64,
                v.sin(),
                0.99 * (i % 5 != 0) as u8 as f32,
                &next,
            );
        }
        b.seq = seq;
        table.insert_unlimited(&b).unwrap();
    }
    Arc::new(table)
}

/// One agent's batch from its replay: the tensors `[1, ...]` and the items' keys.
fn draw(table: &Table, rng: &mut SmallRng) -> (Batch, Vec<ItemKey>) {
    let mut out = SampleScratch::new(B, OBS * 4);
    table.sample(rng, &mut out.buffers()).unwrap();
    let floats = |bytes: &[u8]| -> Vec<f32> {
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    let mut obs2 = floats(&out.obs);
    obs2.extend(floats(&out.next_obs));
    let col = |v: &[f32]| Tensor::from_slice(v).view([1, B as i64, 1]);
    let batch = Batch {
        obs2: Tensor::from_slice(&obs2).view([1, 2 * B as i64, OBS as i64]),
        actions: Tensor::from_slice(&out.actions).view([1, B as i64, 1]),
        rewards: col(&out.rewards),
        discounts: col(&out.discounts),
        weights: Some(col(&out.weights)),
    };
    (batch, out.keys)
}

fn stacked(batches: &[Batch]) -> Batch {
    let cat =
        |f: &dyn Fn(&Batch) -> &Tensor| Tensor::cat(&batches.iter().map(f).collect::<Vec<_>>(), 0);
    Batch {
        obs2: cat(&|b| &b.obs2),
        actions: cat(&|b| &b.actions),
        rewards: cat(&|b| &b.rewards),
        discounts: cat(&|b| &b.discounts),
        weights: Some(cat(&|b| b.weights.as_ref().unwrap())),
    }
}

fn feedback(table: &Arc<Table>) -> Option<PriorityFeedback> {
    let beta = BetaSchedule {
        start: 0.4,
        end: 1.0,
        steps: 1000,
    };
    Some(PriorityFeedback::new(
        Arc::clone(table),
        Some(beta),
        2,
        Device::Cpu,
        0,
        f32::INFINITY,
    ))
}

#[test]
fn each_agent_of_a_prioritized_population_learns_as_it_would_alone() {
    let k = 3;
    let config = DqnConfig::default();
    let hp: Vec<AgentHparams> = (0..k)
        .map(|i| AgentHparams {
            seed: 7 + i as u64,
            lr: 1e-3 * (1.0 + i as f64),
            max_grad_norm: 10.0,
            target: TargetUpdate::Hard { period: 3 },
            munchausen: None,
        })
        .collect();
    let cfg = StepConfig {
        publish_every: 4,
        max_nonfinite: 100,
    };
    let together_tables: Vec<Arc<Table>> = (0..k).map(replay).collect();
    let alone_tables: Vec<Arc<Table>> = (0..k).map(replay).collect();
    let mut together = LearnerStep::new(
        Dqn::population(spec(k), config.clone(), &hp, Device::Cpu),
        0,
        cfg,
        together_tables.iter().map(feedback).collect(),
        None,
    );
    let mut alone: Vec<LearnerStep> = (0..k)
        .map(|i| {
            LearnerStep::new(
                Dqn::population(spec(1), config.clone(), &hp[i..=i], Device::Cpu),
                0,
                cfg,
                vec![feedback(&alone_tables[i])],
                None,
            )
        })
        .collect();
    let mut together_rngs: Vec<SmallRng> =
        (0..k).map(|i| SmallRng::seed_from_u64(i as u64)).collect();
    let mut alone_rngs = together_rngs.clone();
    let mut published = (0, vec![0; k]);
    for update in 0..40u64 {
        let env_steps = vec![update * 10; k];
        let (mut batches, mut keys) = (Vec::new(), Vec::new());
        for i in 0..k {
            let (b, mut kk) = draw(&together_tables[i], &mut together_rngs[i]);
            batches.push(b);
            keys.append(&mut kk);
        }
        together.update(&stacked(&batches), &keys, &env_steps, &mut |_, _| {
            published.0 += 1
        });
        for i in 0..k {
            let (b, kk) = draw(&alone_tables[i], &mut alone_rngs[i]);
            assert_eq!(
                kk,
                keys[i * B..(i + 1) * B],
                "update {update}, agent {i}: the same items drawn"
            );
            let w = b.weights.as_ref().unwrap();
            let diff = (w - batches[i].weights.as_ref().unwrap()).abs().max();
            assert!(diff.double_value(&[]) < 1e-5, "weights differ by {diff}");
            alone[i].update(&b, &kk, &env_steps[..1], &mut |_, _| published.1[i] += 1);
        }
    }
    together.finish_priorities();
    for (i, one) in alone.iter_mut().enumerate() {
        one.finish_priorities();
        assert_eq!(published.1[i], published.0, "published at the same updates");
        let (a, b) = (together.dqn().agent_state(i), one.dqn().state());
        for (what, x, y) in [
            ("online", &a.online, &b.online),
            ("target", &a.target, &b.target),
            ("adam_m", &a.adam_m, &b.adam_m),
        ] {
            let diff = (x - y).abs().max().double_value(&[]);
            assert!(diff < 1e-5, "agent {i}: {what} differs by {diff}");
        }
        // The priorities each agent's replay holds are its own updates'.
        let priorities = |t: &Table| {
            let mut p = Vec::new();
            t.snapshot(|_, b| p.extend(b.priorities.clone()));
            Tensor::from_slice(&p)
        };
        let (pt, pa) = (
            priorities(&together_tables[i]),
            priorities(&alone_tables[i]),
        );
        assert!(
            pt.ne(1.0).sum(Kind::Int64).int64_value(&[]) > 16,
            "the learner's priorities replaced the initial ones"
        );
        let diff = (&pt - &pa).abs().max().double_value(&[]);
        assert!(diff < 1e-4, "agent {i}: priorities differ by {diff}");
    }
    // And the agents did not learn alike: agent 0's and agent 1's priorities differ.
    let first = together.dqn().agent_state(0).online;
    let second = together.dqn().agent_state(1).online;
    assert!((first - second).abs().max().double_value(&[]) > 1e-3);
}
