//! A population of K agents in one stacked update learns agent by agent as K one-agent
//! learners would, given the same batches (to float tolerance: batched kernels may sum
//! in another order): each agent with its own seed,
//! learning rate, gradient clip, target rule and Munchausen settings, for MLPs (batched matmuls) and CNN
//! torsos (grouped convolutions), K = 1, 3 and 8; and agents that join a running
//! population learn as they would alone.

use millrace_core::dqn::agents::AgentHparams;
use millrace_core::dqn::{Batch, Bootstrap, Dqn, DqnConfig, Munchausen, TargetUpdate};
use millrace_proto::{DType, NetworkSpec, ObsSpec};
use tch::{Device, Kind, Tensor};

/// Agents that differ in everything that may differ (Munchausen's settings too, which
/// only a Munchausen run reads).
fn agents(k: usize) -> Vec<AgentHparams> {
    (0..k)
        .map(|i| AgentHparams {
            munchausen: Some(Munchausen {
                tau: 0.03 * (1.0 + i as f64),
                alpha: [0.9, 0.5, 0.0][i % 3],
                clip: [-1.0, -0.5][i % 2],
            }),
            seed: 100 + i as u64,
            lr: 1e-3 * (1.0 + i as f64 / 2.0),
            max_grad_norm: [10.0, 0.5, 2.0][i % 3],
            target: if i % 4 == 3 {
                TargetUpdate::Polyak { tau: 0.05 }
            } else {
                TargetUpdate::Hard {
                    period: 2 + i as u64 % 3,
                }
            },
        })
        .collect()
}

fn mlp(k: usize) -> NetworkSpec {
    let obs = ObsSpec {
        shape: vec![4],
        dtype: DType::F32,
    };
    NetworkSpec::mlp(&obs, &[16, 16], 3, k).unwrap()
}

fn cnn(k: usize) -> NetworkSpec {
    let obs = ObsSpec {
        shape: vec![4, 36, 36],
        dtype: DType::U8,
    };
    let mut spec = NetworkSpec::nature_cnn(&obs, 3).unwrap();
    spec.population = k;
    spec
}

/// Agent `agent`'s batch for update `step`: its own data, `[1, ...]`.
fn batch(spec: &NetworkSpec, agent: usize, step: usize, b: i64) -> Batch {
    tch::manual_seed((agent * 1000 + step) as i64);
    let obs2 = if spec.conv.is_empty() {
        Tensor::randn([1, 2 * b, 4], (Kind::Float, Device::Cpu))
    } else {
        Tensor::randint(256, [1, 2 * b, 4, 36, 36], (Kind::Uint8, Device::Cpu))
    };
    Batch {
        obs2,
        actions: Tensor::randint(3, [1, b, 1], (Kind::Int64, Device::Cpu)),
        rewards: Tensor::randn([1, b, 1], (Kind::Float, Device::Cpu)) * 2.0,
        discounts: Tensor::rand([1, b, 1], (Kind::Float, Device::Cpu)).round() * 0.99,
        weights: None,
    }
}

/// The K agents' batches side by side, `[K, ...]`.
fn stacked(batches: &[Batch]) -> Batch {
    let cat =
        |f: &dyn Fn(&Batch) -> &Tensor| Tensor::cat(&batches.iter().map(f).collect::<Vec<_>>(), 0);
    Batch {
        obs2: cat(&|b| &b.obs2),
        actions: cat(&|b| &b.actions),
        rewards: cat(&|b| &b.rewards),
        discounts: cat(&|b| &b.discounts),
        weights: None,
    }
}

/// Agent by agent, the population's parameters, target and Adam state against the
/// agent trained alone, to `tolerance` (absolute, times the values' scale above 1).
/// Batched and grouped kernels sum in another order than single ones; Adam turns such
/// rounding in near-zero gradients into steps of up to its learning rate, so the CNN
/// (grouped convolutions, larger sums) gets a wider bound than the MLP, and a few of
/// its values (at most one in a thousand) may go past it by such a step: how many
/// depends on the CPU's kernels (one AMD EPYC VM put a parameter 1.2e-4 off after four
/// updates at the learning rate 1e-4). Mixing two agents' data would move nearly every
/// value off.
fn compare(
    spec: fn(usize) -> NetworkSpec,
    k: usize,
    updates: usize,
    tolerance: f64,
    outliers: f64,
) {
    compare_with(DqnConfig::default(), spec, k, updates, tolerance, outliers);
}

fn compare_with(
    config: DqnConfig,
    spec: fn(usize) -> NetworkSpec,
    k: usize,
    updates: usize,
    tolerance: f64,
    outliers: f64,
) {
    let hp = agents(k);
    let mut population = Dqn::population(spec(k), config.clone(), &hp, Device::Cpu);
    let mut alone: Vec<Dqn> = hp
        .iter()
        .map(|a| {
            Dqn::population(
                spec(1),
                config.clone(),
                std::slice::from_ref(a),
                Device::Cpu,
            )
        })
        .collect();
    for step in 0..updates {
        let batches: Vec<Batch> = (0..k).map(|i| batch(&spec(1), i, step, 8)).collect();
        let td = population.update(&stacked(&batches)).td_errors;
        assert_eq!(td.size(), [k as i64, 8]);
        for (dqn, b) in alone.iter_mut().zip(&batches) {
            let _ = dqn.update(b);
        }
    }
    let (together, p) = (population.state(), spec(1).layout().len as i64);
    for (i, dqn) in alone.iter().enumerate() {
        let one = dqn.state();
        for (what, a, b) in [
            ("online", &together.online, &one.online),
            ("target", &together.target, &one.target),
            ("adam_m", &together.adam_m, &one.adam_m),
            ("adam_v", &together.adam_v, &one.adam_v),
        ] {
            let row = a.narrow(0, i as i64, 1);
            assert_eq!(row.size(), [1, p]);
            let diff = (&row - b).abs();
            let err = diff.max().double_value(&[]);
            let scale = b.abs().max().double_value(&[]).max(1e-3);
            let bound = tolerance * scale.max(1.0);
            let past = diff.gt(bound).sum(Kind::Int64).int64_value(&[]);
            eprintln!(
                "K = {k}, agent {i}: {what} differs by {err:.2e} (scale {scale:.2e}); {past} of {p} past {bound:.1e}"
            );
            assert!(
                past as f64 <= outliers * p as f64,
                "K = {k}, agent {i}: {what}: {past} of {p} values differ by more than {bound:.1e} (at most {err}, scale {scale})"
            );
        }
        // The agent did learn (its parameters moved from where they started), and far
        // more of them moved past the bound than the outliers it lets through.
        let start = Dqn::population(spec(1), config.clone(), &hp[i..=i], Device::Cpu).state();
        assert!(!start.online.allclose(&one.online, 0.0, 1e-7, false));
        let scale = one.online.abs().max().double_value(&[]).max(1.0);
        let moved = (&start.online - &one.online)
            .abs()
            .gt(tolerance * scale)
            .sum(Kind::Int64)
            .int64_value(&[]) as f64
            / p as f64;
        eprintln!(
            "K = {k}, agent {i}: {:.1}% of the parameters moved past the bound",
            100.0 * moved
        );
        assert!(
            moved >= 100.0 * outliers,
            "only {moved} of the parameters moved"
        );
    }
}

#[test]
fn mlp_agents_learn_as_they_would_alone() {
    for k in [1, 3, 8] {
        compare(mlp, k, 12, 1e-5, 0.0);
    }
}

#[test]
fn munchausen_agents_with_their_own_settings_learn_as_they_would_alone() {
    let config = DqnConfig {
        bootstrap: Bootstrap::Munchausen(Munchausen::default()),
        ..DqnConfig::default()
    };
    for k in [1, 3] {
        compare_with(config.clone(), mlp, k, 12, 1e-5, 0.0);
    }
    // The settings are read: an agent with its own learns otherwise than one with the
    // run's, from the same start and batches.
    let own = agents(2)[1];
    let runs = AgentHparams {
        munchausen: None,
        ..own
    };
    let train = |a: AgentHparams| {
        let mut dqn = Dqn::population(mlp(1), config.clone(), &[a], Device::Cpu);
        for step in 0..5 {
            let _ = dqn.update(&batch(&mlp(1), 1, step, 8));
        }
        dqn.state().online
    };
    let (a, b) = (train(own), train(runs));
    assert!(
        !a.allclose(&b, 1e-6, 1e-6, false),
        "per-agent Munchausen settings ignored"
    );
}

#[test]
fn cnn_agents_learn_as_they_would_alone() {
    for k in [1, 3, 8] {
        compare(cnn, k, 4, 1e-4, 1e-3);
    }
}

#[test]
fn a_population_without_its_finished_agents_keeps_the_others_state() {
    let config = DqnConfig::default();
    let hp = agents(4);
    let mut population = Dqn::population(mlp(4), config, &hp, Device::Cpu);
    for step in 0..5 {
        let batches: Vec<Batch> = (0..4).map(|i| batch(&mlp(1), i, step, 8)).collect();
        let _ = population.update(&stacked(&batches));
    }
    let before = population.state();
    let kept = population.keep_agents(&[3, 1]);
    let after = kept.state();
    assert_eq!(after.online.size()[0], 2);
    for (row, from) in [(0, 3), (1, 1)] {
        for (x, y) in [
            (&after.online, &before.online),
            (&after.target, &before.target),
            (&after.adam_m, &before.adam_m),
            (&after.adam_v, &before.adam_v),
        ] {
            assert!(x.narrow(0, row, 1).equal(&y.narrow(0, from, 1)));
        }
    }
    assert_eq!(
        (after.adam_step, after.updates),
        (before.adam_step, before.updates)
    );
}

#[test]
fn the_cpus_one_pass_optimizer_steps_as_the_device_path() {
    let config = DqnConfig::default();
    let hp = agents(5);
    let mut host = Dqn::population(mlp(5), config.clone(), &hp, Device::Cpu);
    let mut device_path = Dqn::population(mlp(5), config, &hp, Device::Cpu);
    device_path.use_tensor_optimizer();
    for step in 0..20 {
        let mut batches: Vec<Batch> = (0..5).map(|i| batch(&mlp(1), i, step, 8)).collect();
        if step == 7 {
            // A non-finite loss for agent 2: it skips this step on both paths.
            batches[2].rewards = Tensor::full([1, 8, 1], f64::NAN, (Kind::Float, Device::Cpu));
        }
        let b = stacked(&batches);
        let _ = host.update(&b);
        let _ = device_path.update(&b);
    }
    let (a, b) = (host.state(), device_path.state());
    for (what, x, y) in [
        ("online", &a.online, &b.online),
        ("adam_m", &a.adam_m, &b.adam_m),
        ("adam_v", &a.adam_v, &b.adam_v),
    ] {
        let err = (x - y).abs().max().double_value(&[]);
        assert!(err < 1e-5, "{what} differs by {err}");
    }
    assert_eq!(
        host.take_stats().nonfinite,
        device_path.take_stats().nonfinite
    );
}

/// A sweep streams queued agents into finished ones' places: agents admitted after the
/// population's 5th update (one with a hard target period, one with Polyak averaging)
/// learn as they would alone, counting their own updates for the target period and
/// Adam's bias corrections; the founders carry on unchanged. On both optimizer paths.
#[test]
fn agents_admitted_later_learn_as_they_would_alone() {
    for tensor_optimizer in [false, true] {
        let config = DqnConfig::default();
        let hp = agents(5);
        let fresh = |a: &AgentHparams| {
            let mut d =
                Dqn::population(mlp(1), config.clone(), std::slice::from_ref(a), Device::Cpu);
            if tensor_optimizer {
                d.use_tensor_optimizer();
            }
            d
        };
        let mut population = Dqn::population(mlp(3), config.clone(), &hp[..3], Device::Cpu);
        if tensor_optimizer {
            population.use_tensor_optimizer();
        }
        let mut alone: Vec<Dqn> = hp.iter().map(fresh).collect();
        for step in 0..5 {
            let batches: Vec<Batch> = (0..3).map(|i| batch(&mlp(1), i, step, 8)).collect();
            let _ = population.update(&stacked(&batches));
            for (i, b) in batches.iter().enumerate() {
                let _ = alone[i].update(b);
            }
        }
        // Agent 1 finishes; agents 3 and 4 take its place and one more.
        let mut population = population.keep_agents(&[0, 2]).admit(&hp[3..5]);
        let rows = [0, 2, 3, 4];
        for step in 5..12 {
            let batches: Vec<Batch> = rows.iter().map(|&i| batch(&mlp(1), i, step, 8)).collect();
            let _ = population.update(&stacked(&batches));
            for (&i, b) in rows.iter().zip(&batches) {
                let _ = alone[i].update(b);
            }
        }
        let together = population.state();
        for (row, &i) in rows.iter().enumerate() {
            let one = alone[i].state();
            for (what, a, b) in [
                ("online", &together.online, &one.online),
                ("target", &together.target, &one.target),
                ("adam_m", &together.adam_m, &one.adam_m),
                ("adam_v", &together.adam_v, &one.adam_v),
            ] {
                let err = (&a.narrow(0, row as i64, 1) - b)
                    .abs()
                    .max()
                    .double_value(&[]);
                let scale = b.abs().max().double_value(&[]).max(1.0);
                assert!(
                    err <= 1e-5 * scale,
                    "tensor optimizer {tensor_optimizer}, agent {i}: {what} differs by {err}"
                );
            }
        }
    }
}

/// A resumed sweep: an agent's state taken from one population (as its checkpoint
/// saves it) and admitted into another, which had made other updates meanwhile, goes
/// on as the agent alone would (its own update count carries its target period and
/// Adam's bias corrections).
#[test]
fn an_agent_state_carried_into_another_population_goes_on_as_alone() {
    let config = DqnConfig::default();
    let hp = agents(3);
    let mut first = Dqn::population(mlp(2), config.clone(), &hp[..2], Device::Cpu);
    let mut alone = Dqn::population(mlp(1), config.clone(), &hp[1..2], Device::Cpu);
    for step in 0..5 {
        let batches: Vec<Batch> = (0..2).map(|i| batch(&mlp(1), i, step, 8)).collect();
        let _ = first.update(&stacked(&batches));
        let _ = alone.update(&batches[1]);
    }
    let saved = first.agent_state(1);
    assert_eq!((saved.updates, saved.adam_step), (5, 5));
    let mut second = Dqn::population(mlp(1), config, &hp[2..3], Device::Cpu);
    for step in 0..2 {
        let _ = second.update(&batch(&mlp(1), 2, step, 8));
    }
    let mut second = second.admit_states(vec![(hp[1], Some(saved))]);
    for step in 5..11 {
        let b = [batch(&mlp(1), 2, step, 8), batch(&mlp(1), 1, step, 8)];
        let _ = second.update(&stacked(&b));
        let _ = alone.update(&b[1]);
    }
    let (together, one) = (second.agent_state(1), alone.state());
    assert_eq!(together.updates, 11);
    for (what, a, b) in [
        ("online", &together.online, &one.online),
        ("target", &together.target, &one.target),
        ("adam_m", &together.adam_m, &one.adam_m),
    ] {
        let err = (a - b).abs().max().double_value(&[]);
        assert!(err <= 1e-5, "{what} differs by {err}");
    }
}
