//! The learner's ceiling: updates/s of the real `Dqn::update` on batches already resident
//! on the device (random data, no replay, no actors): the "100% busy" loop that
//! end-to-end training is compared against.
//!
//! `cargo bench -p millrace-learner --bench ceiling -- [--hidden 64,64] [--batch 32]
//!  [--obs 4] [--actions 2] [--seconds 3] [--min-updates 50] [--threads 1] [--cpu | --gpu N] [--tf32 off|conv|all] [--precision fp32,bf16]
//!  [--net mlp,nature,minatar,impala,impala-minatar] [--impala-width 1] [--impala-pool 6]
//!  [--layer-norm off,on] [--target double,munchausen] [--head q,iqn]`
//! Prints one line per configuration: updates/s and microseconds per update (waiting
//! for the device as the learner thread does, `millrace_core::ceiling`; the cadence
//! is printed beside each figure), and each one's updates/s against the first
//! configuration's at the same batch size, measured one after the other in the same
//! run (every network, then every precision with every LayerNorm setting and every
//! target, in the order given). `nature` is the Nature DQN on Atari's `[4, 84, 84]`
//! frames (6 actions), `minatar` MinAtar's network on `[4, 10, 10]` (3 actions),
//! `impala` and `impala-minatar` the IMPALA network on each (`--impala-width`,
//! `--impala-pool`); `--hidden`, `--obs` and `--actions` are the MLP's. `--head iqn`
//! gives each network the IQN head (64 cosines, 8 + 8 sampled fractions), labelled
//! `+iqn`, in fp32 only (as the learner).

mod common;

use millrace_core::dqn::precision::Precision;
use millrace_core::dqn::{Bootstrap, Dqn, DqnConfig, Munchausen};
use millrace_proto::{DType, ImpalaTorso, NetworkSpec, ObsSpec};
use tch::Device;

struct Opts {
    hidden: Vec<Vec<usize>>,
    batch: Vec<usize>,
    obs: usize,
    actions: usize,
    seconds: f64,
    /// At least this many timed updates, however slow one is.
    min_updates: u64,
    threads: i32,
    device: Device,
    precision: Vec<Precision>,
    layer_norm: Vec<bool>,
    targets: Vec<Bootstrap>,
    nets: Vec<Net>,
    impala: ImpalaTorso,
    /// Whether each configuration has the IQN head, in order.
    heads: Vec<bool>,
    tf32: millrace_core::torch_settings::Tf32,
}

#[derive(Clone, Copy, PartialEq)]
enum Net {
    Mlp,
    Nature,
    Minatar,
    Impala,
    ImpalaMinatar,
}

fn parse() -> Opts {
    let mut o = Opts {
        hidden: vec![vec![64, 64], vec![128, 128]],
        batch: vec![32, 64, 512],
        obs: 4,
        actions: 2,
        seconds: 3.0,
        min_updates: 50,
        threads: 1,
        device: Device::cuda_if_available(),
        precision: vec![Precision::Fp32],
        layer_norm: vec![false],
        targets: vec![Bootstrap::Double],
        nets: vec![Net::Mlp],
        impala: ImpalaTorso::new(1, 6),
        heads: vec![false],
        tf32: millrace_core::torch_settings::Tf32::Conv,
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
            "--min-updates" => o.min_updates = next.parse().expect("--min-updates N"),
            "--threads" => o.threads = next.parse().expect("--threads N"),
            "--precision" => {
                o.precision = next
                    .split(',')
                    .map(|x| match x {
                        "fp32" => Precision::Fp32,
                        "bf16" => Precision::Bf16,
                        other => panic!("--precision fp32,bf16, got {other}"),
                    })
                    .collect()
            }
            "--layer-norm" => {
                o.layer_norm = next
                    .split(',')
                    .map(|x| match x {
                        "off" => false,
                        "on" => true,
                        other => panic!("--layer-norm off,on, got {other}"),
                    })
                    .collect()
            }
            "--target" => {
                o.targets = next
                    .split(',')
                    .map(|x| match x {
                        "double" => Bootstrap::Double,
                        "munchausen" => Bootstrap::Munchausen(Munchausen::default()),
                        other => panic!("--target double,munchausen, got {other}"),
                    })
                    .collect()
            }
            "--net" => {
                o.nets = next
                    .split(',')
                    .map(|x| match x {
                        "mlp" => Net::Mlp,
                        "nature" => Net::Nature,
                        "minatar" => Net::Minatar,
                        "impala" => Net::Impala,
                        "impala-minatar" => Net::ImpalaMinatar,
                        other => {
                            panic!("--net mlp,nature,minatar,impala,impala-minatar, got {other}")
                        }
                    })
                    .collect()
            }
            "--impala-width" => {
                let width = next.parse().expect("--impala-width N");
                o.impala = ImpalaTorso::new(width, o.impala.pool);
            }
            "--impala-pool" => o.impala.pool = next.parse().expect("--impala-pool N"),
            "--head" => {
                o.heads = next
                    .split(',')
                    .map(|x| match x {
                        "q" => false,
                        "iqn" => true,
                        other => panic!("--head q,iqn, got {other}"),
                    })
                    .collect()
            }
            "--cpu" => {
                o.device = Device::Cpu;
                i -= 1;
            }
            "--gpu" => o.device = common::gpu(&next),
            "--tf32" => o.tf32 = common::tf32(&next),
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
    common::gpu_math(o.device, o.tf32);
    println!("device {:?}, {} intra-op thread(s)", o.device, o.threads);
    println!(
        "{:<18} {:>6} {:>9} {:>5} {:>10} {:>12} {:>10} {:>8}  waits (the learner's cadence)",
        "network", "batch", "precision", "norm", "target", "updates/s", "us/update", "vs first"
    );
    // The first configuration's rate at each batch size.
    let mut first = std::collections::HashMap::new();
    for &net in &o.nets {
        let (obs, actions) = match net {
            Net::Mlp => (vec![o.obs], o.actions),
            Net::Nature | Net::Impala => (vec![4, 84, 84], 6),
            Net::Minatar | Net::ImpalaMinatar => (vec![4, 10, 10], 3),
        };
        let obs = ObsSpec {
            shape: obs,
            dtype: if net == Net::Mlp {
                DType::F32
            } else {
                DType::U8
            },
        };
        let hidden: Vec<Vec<usize>> = match net {
            Net::Mlp => o.hidden.clone(),
            _ => vec![Vec::new()],
        };
        for (hidden, &iqn) in hidden
            .iter()
            .flat_map(|h| o.heads.iter().map(move |i| (h, i)))
        {
            let spec = match net {
                Net::Mlp => NetworkSpec::mlp(&obs, hidden, actions, 1),
                Net::Nature => NetworkSpec::nature_cnn(&obs, actions),
                Net::Minatar => NetworkSpec::minatar_cnn(&obs, actions),
                Net::Impala | Net::ImpalaMinatar => {
                    NetworkSpec::impala_cnn(&obs, &o.impala, actions)
                }
            }
            .expect("valid network");
            let spec = NetworkSpec {
                iqn: iqn.then(millrace_proto::IqnHead::default),
                ..spec
            };
            let width = o.impala.channels[0] / millrace_proto::torso::IMPALA_CHANNELS[0];
            let label: String = match net {
                Net::Mlp => hidden
                    .iter()
                    .map(|h| h.to_string())
                    .collect::<Vec<_>>()
                    .join("x"),
                Net::Nature => "nature".into(),
                Net::Minatar => "minatar".into(),
                Net::Impala => format!("impala-x{width}"),
                Net::ImpalaMinatar => format!("minatar-impala-x{width}"),
            };
            let label = if iqn { label + "+iqn" } else { label };
            for &b in &o.batch {
                let batch = millrace_core::ceiling::random_batch(&obs, actions, b, o.device);
                let cadence = common::learner_cadence(&obs, b, o.device, false);
                for &precision in &o.precision {
                    if iqn && precision != Precision::Fp32 {
                        // The learner refuses the pair (`--head iqn` is fp32 only).
                        continue;
                    }
                    for (&layer_norm, &bootstrap) in o
                        .layer_norm
                        .iter()
                        .flat_map(|n| o.targets.iter().map(move |t| (n, t)))
                    {
                        let cfg = DqnConfig {
                            precision,
                            bootstrap,
                            ..DqnConfig::default()
                        };
                        let spec = NetworkSpec {
                            layer_norm,
                            ..spec.clone()
                        };
                        let mut dqn = Dqn::new(spec, cfg, o.device, 0);
                        let rate = millrace_core::ceiling::updates_per_s(
                            &mut dqn,
                            &batch,
                            o.device,
                            o.seconds,
                            o.min_updates,
                            cadence,
                        );
                        let base = *first.entry(b).or_insert(rate);
                        println!(
                            "{:<18} {:>6} {:>9} {:>5} {:>10} {:>12.0} {:>10.1} {:>7.2}x  {}",
                            label,
                            b,
                            precision.to_string(),
                            if layer_norm { "on" } else { "off" },
                            match bootstrap {
                                Bootstrap::Double => "double",
                                Bootstrap::Munchausen(_) => "munchausen",
                            },
                            rate,
                            1e6 / rate,
                            rate / base,
                            cadence.describe()
                        );
                    }
                }
            }
        }
    }
}
