//! What sealing costs the learner per parameter broadcast: the SHA-256 digest of a
//! snapshot (once per version, for every session) and its per-session tag, beside the
//! encoding the broadcast already does, measured side by side in one run for the
//! networks millrace trains (CartPole's MLP, the MinAtar CNN, the Nature CNN).
//!
//!     cargo bench -p millrace-proto --bench seal

use std::time::Instant;

use millrace_proto::auth::{fresh_nonce, params_digest, Seal};
use millrace_proto::codec::{self, MAX_FRAME_CEILING};
use millrace_proto::wire::{Capabilities, Hello, LearnerMsg, PROTOCOL_VERSION};
use millrace_proto::{DType, NetworkSpec, ObsSpec, Params};

fn per_call_ms(reps: u32, mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    for _ in 0..reps {
        f();
    }
    start.elapsed().as_secs_f64() * 1e3 / f64::from(reps)
}

fn main() {
    let hello = Hello {
        protocol_version: PROTOCOL_VERSION,
        nonce: fresh_nonce(),
        actor_name: "bench".into(),
        capabilities: Capabilities {
            envs: 1,
            env_ids: vec![],
            features: vec![],
        },
        agent: None,
    };
    let mut seal = Seal::for_session(b"token", &hello, &fresh_nonce()).unwrap();
    println!("| network | parameters | encode (ms) | digest (ms) | tag per session (µs) | digest / encode |");
    println!("|---|---|---|---|---|---|");
    let obs = |shape: Vec<usize>, dtype| ObsSpec { shape, dtype };
    let networks = [
        (
            "CartPole MLP 128x128",
            NetworkSpec::mlp(&obs(vec![4], DType::F32), &[128, 128], 2, 1),
        ),
        (
            "MinAtar CNN (10x10x4, 6 actions)",
            NetworkSpec::minatar_cnn(&obs(vec![4, 10, 10], DType::U8), 6),
        ),
        (
            "Nature CNN (4x84x84, 18 actions)",
            NetworkSpec::nature_cnn(&obs(vec![4, 84, 84], DType::U8), 18),
        ),
    ];
    for (name, spec) in networks {
        let n = spec.unwrap().layout().len;
        let p = Params::of_one(1, (0..n).map(|i| i as f32 * 1e-6).collect());
        let reps = (200_000_000 / n.max(1)).clamp(5, 2000) as u32;
        let encode = per_call_ms(reps, || {
            std::hint::black_box(
                codec::encode(&LearnerMsg::Params(p.clone()), MAX_FRAME_CEILING).unwrap(),
            );
        });
        let digest = per_call_ms(reps, || {
            std::hint::black_box(params_digest(&p));
        });
        let d = params_digest(&p);
        let tag = per_call_ms(10_000, || {
            std::hint::black_box(seal.seal_params(&d));
        });
        println!(
            "| {name} | {n} | {encode:.3} | {digest:.3} | {:.1} | {:.2} |",
            tag * 1e3,
            digest / encode
        );
    }
}
