//! The learner's ceiling: updates/s of the real `Dqn::update` on batches already resident
//! on the device (random data, no replay, no actors): the "100% busy" loop that
//! end-to-end training is compared against.
//!
//! `cargo bench -p millrace-learner --bench ceiling -- [--hidden 64,64] [--batch 32]
//!  [--obs 4] [--actions 2] [--seconds 3] [--threads 1] [--cpu]`
//! Prints one line per configuration: updates/s and microseconds per update.

mod common;

use millrace_learner::dqn::{Dqn, DqnConfig};
use millrace_proto::{DType, NetworkSpec, ObsSpec};
use tch::Device;

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
            let mut dqn = Dqn::new(spec, DqnConfig::default(), o.device, 0);
            let batch = common::random_batch(&obs, o.actions, b, o.device);
            let rate = common::updates_per_s(&mut dqn, &batch, o.device, o.seconds, 50);
            let label = hidden
                .iter()
                .map(|h| h.to_string())
                .collect::<Vec<_>>()
                .join("x");
            println!("{:<12} {:>6} {:>12.0} {:>10.1}", label, b, rate, 1e6 / rate);
        }
    }
}
