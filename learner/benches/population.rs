//! Agent-updates/s of one stacked update for K agents, as K grows: the real
//! `Dqn::update` (double DQN, Adam, per-agent hyperparameters) on `[K, B, ...]` batches
//! already resident on the device, one intra-op thread by default. Prints, per K, the
//! update rate, agent-updates/s, the GFLOP/s achieved (the online forward over
//! observations and next observations, the target's forward over next observations and
//! the backward pass over observations: five passes of B observations through the
//! network, 10·B·(multiply-adds per observation) FLOP per agent-update), and the share
//! of each update spent outside the gradient (clipping, Adam, target sync: element-wise
//! passes over all K agents' parameters, timed apart by running the gradient alone).
//!
//! `cargo bench -p millrace-learner --bench population -- [--net mlp|cnn]
//!  [--k 1,8,32,64,256,1024] [--batch 32] [--seconds 2] [--threads 1] [--cpu | --gpu N]`
//!
//! `bench/population.sh` runs it beside PyTorch's own answer (`torch.func` vmap over
//! stacked modules, bench/population_vmap.py) in one sitting.

mod common;

use std::time::Instant;

use millrace_core::dqn::agents::AgentHparams;
use millrace_core::dqn::{Batch, Dqn, DqnConfig, TargetUpdate};
use millrace_proto::{DType, NetworkSpec, ObsSpec};
use tch::{Device, Kind, Tensor};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// Multiply-adds of one forward pass of one observation.
fn macs(spec: &NetworkSpec) -> f64 {
    let widths = spec.widths();
    let head: usize = widths.windows(2).map(|w| w[0] * w[1]).sum();
    let channels = spec.image.first().copied().unwrap_or(0);
    let torso: usize = spec
        .conv_shapes()
        .iter()
        .zip(&spec.conv)
        .scan(channels, |cin, ((c, h, w), layer)| {
            let m = *cin * layer.kernel * layer.kernel * c * h * w;
            *cin = *c;
            Some(m)
        })
        .sum();
    (head + torso) as f64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let net = arg(&args, "--net").unwrap_or_else(|| "mlp".into());
    let default_k = if net == "cnn" {
        "1,2,4,8"
    } else {
        "1,8,32,64,256,1024"
    };
    let ks: Vec<usize> = arg(&args, "--k")
        .unwrap_or_else(|| default_k.into())
        .split(',')
        .map(|k| k.parse().expect("--k 1,8,64"))
        .collect();
    let b: i64 = arg(&args, "--batch").map_or(32, |v| v.parse().expect("--batch N"));
    let seconds: f64 = arg(&args, "--seconds").map_or(2.0, |v| v.parse().expect("--seconds S"));
    let threads: i32 = arg(&args, "--threads").map_or(1, |v| v.parse().expect("--threads N"));
    // `--gpu N` is that device or an error: never the CPU in its place.
    let device = if args.iter().any(|a| a == "--cpu") {
        Device::Cpu
    } else if let Some(i) = arg(&args, "--gpu") {
        common::gpu(&i)
    } else {
        Device::cuda_if_available()
    };
    tch::set_num_threads(threads);
    // The learner's math on a GPU (TF32 convolutions, cuDNN benchmark on), said.
    common::gpu_math(device, millrace_core::torch_settings::Tf32::Conv);
    let spec = |k: usize| -> NetworkSpec {
        if net == "cnn" {
            let obs = ObsSpec {
                shape: vec![4, 84, 84],
                dtype: DType::U8,
            };
            let mut s = NetworkSpec::nature_cnn(&obs, 6).unwrap();
            s.population = k;
            s
        } else {
            let obs = ObsSpec {
                shape: vec![4],
                dtype: DType::F32,
            };
            NetworkSpec::mlp(&obs, &[64, 64], 2, k).unwrap()
        }
    };
    let flop = 10.0 * b as f64 * macs(&spec(1));
    println!(
        "{}, batch {b}, {threads} intra-op thread(s), {device:?}; {:.2} MFLOP per agent-update",
        if net == "cnn" {
            "Nature CNN 4x84x84, 6 actions"
        } else {
            "MLP 4-64-64-2"
        },
        flop / 1e6
    );
    println!(
        "{:>6} {:>12} {:>18} {:>10} {:>16}",
        "K", "updates/s", "agent-updates/s", "GFLOP/s", "optimizer share"
    );
    for k in ks {
        let agents: Vec<AgentHparams> = (0..k)
            .map(|i| AgentHparams {
                seed: i as u64,
                lr: 1e-4 * (1.0 + (i % 7) as f64),
                max_grad_norm: 10.0,
                target: TargetUpdate::Hard { period: 500 },
                munchausen: None,
            })
            .collect();
        let mut dqn = Dqn::population(spec(k), DqnConfig::default(), &agents, device);
        let k64 = k as i64;
        let batch = if net == "cnn" {
            Batch {
                obs2: Tensor::randint(256, [k64, 2 * b, 4, 84, 84], (Kind::Uint8, device)),
                actions: Tensor::randint(6, [k64, b, 1], (Kind::Int64, device)),
                rewards: Tensor::randn([k64, b, 1], (Kind::Float, device)),
                discounts: Tensor::full([k64, b, 1], 0.99, (Kind::Float, device)),
                weights: None,
            }
        } else {
            Batch {
                obs2: Tensor::randn([k64, 2 * b, 4], (Kind::Float, device)),
                actions: Tensor::randint(2, [k64, b, 1], (Kind::Int64, device)),
                rewards: Tensor::randn([k64, b, 1], (Kind::Float, device)),
                discounts: Tensor::full([k64, b, 1], 0.99, (Kind::Float, device)),
                weights: None,
            }
        };
        // Warm up, then time whole seconds of updates (a host sync at the end), and as
        // long of gradients alone.
        let mut rate = |full: bool| {
            for _ in 0..3 {
                let _ = dqn.update(&batch);
            }
            let _ = dqn.take_stats();
            let start = Instant::now();
            let mut n = 0u64;
            while start.elapsed().as_secs_f64() < seconds {
                if full {
                    let _ = dqn.update(&batch);
                } else {
                    let _ = dqn.gradient(&batch);
                }
                n += 1;
            }
            let _ = dqn.take_stats();
            n as f64 / start.elapsed().as_secs_f64()
        };
        let per_s = rate(true);
        let gradients_per_s = rate(false);
        println!(
            "{k:>6} {per_s:>12.1} {:>18.0} {:>10.2} {:>15.0}%",
            per_s * k as f64,
            per_s * k as f64 * flop / 1e9,
            100.0 * (1.0 - per_s / gradients_per_s)
        );
    }
}
