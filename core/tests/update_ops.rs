//! An update that a CUDA graph can capture dispatches the same operators, with the same
//! non-tensor arguments, every step, on memory that stays put: a graph replays exactly
//! what it recorded, at the addresses it recorded. Over 50 consecutive steady-state
//! updates (`Dqn::update_in_place`; the hard target copies between them are a step of
//! their own), for the MLP, the MinAtar CNN and the Nature CNN, single and population
//! (K = 4), double and Munchausen, Q, dueling and IQN heads, with the tensor optimizer,
//! each update's recording (`millrace_core::op_record`) must equal the first's; and over
//! 100 updates every persistent tensor, input buffer and output buffer keeps its data's
//! address. Each case's operator
//! count per update is printed (`--nocapture`).

use millrace_core::dqn::agents::AgentHparams;
use millrace_core::dqn::{Batch, Bootstrap, Dqn, DqnConfig, Munchausen, TargetUpdate};
use millrace_core::op_record::{top_level, Op, OpRecorder};
use millrace_proto::{DType, IqnHead, NetworkSpec, ObsSpec};
use tch::{Device, Kind, Tensor};

/// Updates recorded after the warm-up.
const RECORDED: usize = 50;
/// Updates before: the optimizer's first steps and the first statistics are behind.
const WARM_UP: usize = 20;
/// A short target period, so that syncs fall inside the recorded updates.
const TARGET_PERIOD: u64 = 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Net {
    Mlp,
    Minatar,
    Nature,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Head {
    Q,
    Dueling,
    Iqn,
}

struct Case {
    label: String,
    spec: NetworkSpec,
    config: DqnConfig,
    obs: ObsSpec,
    batch: usize,
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for net in [Net::Mlp, Net::Minatar, Net::Nature] {
        let (obs, actions, batch) = match net {
            Net::Mlp => (
                ObsSpec {
                    shape: vec![4],
                    dtype: DType::F32,
                },
                2,
                32,
            ),
            Net::Minatar => (
                ObsSpec {
                    shape: vec![4, 10, 10],
                    dtype: DType::U8,
                },
                3,
                32,
            ),
            Net::Nature => (
                ObsSpec {
                    shape: vec![4, 84, 84],
                    dtype: DType::U8,
                },
                6,
                4,
            ),
        };
        for k in [1, 4] {
            for head in [Head::Q, Head::Dueling, Head::Iqn] {
                for munchausen in [false, true] {
                    let spec = match net {
                        Net::Mlp => NetworkSpec::mlp(&obs, &[64, 64], actions, k),
                        Net::Minatar => NetworkSpec::minatar_cnn(&obs, actions),
                        Net::Nature => NetworkSpec::nature_cnn(&obs, actions),
                    }
                    .expect("a valid network");
                    let spec = NetworkSpec {
                        population: k,
                        iqn: (head == Head::Iqn).then(IqnHead::default),
                        ..spec
                    };
                    let config = DqnConfig {
                        dueling: head == Head::Dueling,
                        bootstrap: if munchausen {
                            Bootstrap::Munchausen(Munchausen::default())
                        } else {
                            Bootstrap::Double
                        },
                        target: TargetUpdate::Hard {
                            period: TARGET_PERIOD,
                        },
                        ..DqnConfig::default()
                    };
                    out.push(Case {
                        label: format!(
                            "{net:?} K={k} {head:?} {}",
                            if munchausen { "munchausen" } else { "double" }
                        ),
                        spec,
                        config,
                        obs: obs.clone(),
                        batch,
                    });
                }
            }
        }
    }
    out
}

/// A random batch of `b` transitions for each of `k` agents.
fn batch(obs: &ObsSpec, actions: usize, k: usize, b: usize) -> Batch {
    let (k, b) = (k as i64, b as i64);
    let mut shape = vec![k, 2 * b];
    shape.extend(obs.shape.iter().map(|d| *d as i64));
    let cpu = Device::Cpu;
    Batch {
        obs2: match obs.dtype {
            DType::F32 => Tensor::randn(shape.as_slice(), (Kind::Float, cpu)),
            DType::U8 => Tensor::randint(256, shape.as_slice(), (Kind::Uint8, cpu)),
        },
        actions: Tensor::randint(actions as i64, [k, b, 1], (Kind::Int64, cpu)),
        rewards: Tensor::randn([k, b, 1], (Kind::Float, cpu)),
        discounts: Tensor::full([k, b, 1], 0.99, (Kind::Float, cpu)),
        weights: Some(Tensor::rand([k, b, 1], (Kind::Float, cpu))),
    }
}

/// The case's learner on the tensor optimizer (the GPU's path), and a batch for it.
fn learner(case: &Case) -> (Dqn, Batch) {
    tch::manual_seed(0);
    let k = case.spec.population;
    let agents: Vec<AgentHparams> = (0..k as u64)
        .map(|seed| AgentHparams::from_config(&case.config, seed))
        .collect();
    let mut dqn = Dqn::population(case.spec.clone(), case.config.clone(), &agents, Device::Cpu);
    dqn.use_tensor_optimizer();
    (dqn, batch(&case.obs, case.spec.num_actions, k, case.batch))
}

/// Each recorded update's operators.
fn record(case: &Case) -> Vec<Vec<Op>> {
    let (mut dqn, batch) = learner(case);
    for _ in 0..WARM_UP {
        let _ = dqn.update(&batch);
    }
    (0..RECORDED)
        .map(|_| {
            let rec = OpRecorder::start().expect("recording starts");
            let _ = dqn.update_in_place(&batch);
            let ops = rec.finish().expect("recording stops");
            dqn.sync_due_targets();
            ops
        })
        .collect()
}

/// Where update `i` first differs from update 0, for the failure message.
fn first_difference(first: &[Op], other: &[Op], i: usize) -> String {
    let at = first
        .iter()
        .zip(other)
        .position(|(a, b)| a != b)
        .unwrap_or(first.len().min(other.len()));
    let line = |ops: &[Op]| {
        ops.get(at).map_or("(none)".to_string(), |op| {
            format!("{} {}", op.depth, op.call)
        })
    };
    format!(
        "update {i} differs from update 0 at operator {at} ({} vs {} operators): `{}` vs `{}`",
        first.len(),
        other.len(),
        line(first),
        line(other)
    )
}

#[test]
fn every_update_dispatches_the_same_operators() {
    let mut failures = Vec::new();
    println!(
        "{:<30} {:>10} {:>10} {:>9}",
        "case", "top-level", "all", "distinct"
    );
    for case in cases() {
        let updates = record(&case);
        let first = &updates[0];
        let mut distinct: Vec<&Vec<Op>> = Vec::new();
        for u in &updates {
            if !distinct.contains(&u) {
                distinct.push(u);
            }
        }
        println!(
            "{:<30} {:>10} {:>10} {:>9}",
            case.label,
            top_level(first),
            first.len(),
            distinct.len()
        );
        if let Some((i, other)) = updates.iter().enumerate().find(|(_, u)| *u != first) {
            failures.push(format!(
                "{}: {}",
                case.label,
                first_difference(first, other, i)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn persistent_tensors_keep_their_storage() {
    let mut failures = Vec::new();
    for case in cases().iter().filter(|c| c.spec.population == 4) {
        let (mut dqn, batch) = learner(case);
        // The first update makes the fixed input and output buffers.
        let _ = dqn.update(&batch);
        let before = dqn.storage();
        assert!(
            before.iter().any(|(name, _)| name.starts_with("fixed_io")),
            "{}: no fixed buffers",
            case.label
        );
        for _ in 0..100 {
            let _ = dqn.update(&batch);
        }
        for ((name, was), (_, now)) in before.iter().zip(dqn.storage()) {
            if *was != now {
                failures.push(format!("{}: {name} moved", case.label));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
