//! The learner's ceiling: updates/s of the real `Dqn::update` on batches already resident
//! on the device (random data, no replay, no actors): the "100% busy" loop that
//! end-to-end training is compared against.
//!
//! `cargo bench -p millrace-learner --bench ceiling -- [--hidden 64,64] [--batch 32]
//!  [--obs 4] [--actions 2] [--seconds 3] [--threads 1] [--cpu]`
//! Prints one line per configuration: updates/s and microseconds per update.

use std::time::Instant;

use millrace_learner::dqn::{Batch, Dqn, DqnConfig, TargetUpdate};
use millrace_proto::{DType, NetworkSpec, ObsSpec};
use tch::{Device, Kind, Tensor};

struct Opts {
    hidden: Vec<Vec<usize>>,
    batch: Vec<usize>,
    obs: usize,
    actions: usize,
    seconds: f64,
    threads: i32,
    device: Device,
}

fn parse() -> Opts {
    let mut o = Opts {
        hidden: vec![vec![64, 64], vec![128, 128]],
        batch: vec![32, 64, 512],
        obs: 4,
        actions: 2,
        seconds: 3.0,
        threads: 1,
        device: Device::cuda_if_available(),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let next = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--hidden" => {
                o.hidden = next
                    .split(';')
                    .map(|h| {
                        h.split(',')
                            .map(|x| x.parse().expect("--hidden 64,64[;128,128]"))
                            .collect()
                    })
                    .collect();
            }
            "--batch" => {
                o.batch = next
                    .split(',')
                    .map(|x| x.parse().expect("--batch 32,512"))
                    .collect()
            }
            "--obs" => o.obs = next.parse().expect("--obs N"),
            "--actions" => o.actions = next.parse().expect("--actions N"),
            "--seconds" => o.seconds = next.parse().expect("--seconds S"),
            "--threads" => o.threads = next.parse().expect("--threads N"),
            "--cpu" => {
                o.device = Device::Cpu;
                i -= 1;
            }
            "--bench" => i -= 1,
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    o
}

fn sync(device: Device) {
    if let Device::Cuda(i) = device {
        tch::Cuda::synchronize(i as i64);
    }
}

fn main() {
    let o = parse();
    tch::set_num_threads(o.threads);
    println!(
        "device {:?}, {} intra-op thread(s), obs {}, actions {}",
        o.device, o.threads, o.obs, o.actions
    );
    println!(
        "{:<12} {:>6} {:>12} {:>10}",
        "hidden", "batch", "updates/s", "us/update"
    );
    let obs = ObsSpec {
        shape: vec![o.obs],
        dtype: DType::F32,
    };
    for hidden in &o.hidden {
        for &b in &o.batch {
            let spec = NetworkSpec::mlp(&obs, hidden, o.actions, 1).expect("valid network");
            let cfg = DqnConfig {
                lr: 1e-4,
                adam_betas: (0.9, 0.999),
                adam_eps: 1e-8,
                max_grad_norm: 10.0,
                huber_delta: 1.0,
                target: TargetUpdate::Hard { period: 200 },
            };
            let mut dqn = Dqn::new(spec, cfg, o.device, 0);
            let b = b as i64;
            let d = o.device;
            let batch = Batch {
                obs2: Tensor::randn([1, 2 * b, o.obs as i64], (Kind::Float, d)),
                actions: Tensor::randint(o.actions as i64, [1, b, 1], (Kind::Int64, d)),
                rewards: Tensor::randn([1, b, 1], (Kind::Float, d)),
                discounts: Tensor::full([1, b, 1], 0.99, (Kind::Float, d)),
            };
            for _ in 0..50 {
                dqn.update(&batch);
            }
            sync(d);
            let start = Instant::now();
            let mut n = 0u64;
            while start.elapsed().as_secs_f64() < o.seconds {
                for _ in 0..50 {
                    dqn.update(&batch);
                }
                n += 50;
                sync(d);
            }
            let _ = dqn.take_stats();
            let dt = start.elapsed().as_secs_f64();
            let label = hidden
                .iter()
                .map(|h| h.to_string())
                .collect::<Vec<_>>()
                .join("x");
            println!(
                "{:<12} {:>6} {:>12.0} {:>10.1}",
                label,
                b,
                n as f64 / dt,
                dt * 1e6 / n as f64
            );
        }
    }
}
