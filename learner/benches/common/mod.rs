//! What the benchmarks share: the device flags (`--gpu N`, `--tf32`), the learner's
//! cadence for the timed update loop (`millrace_core::ceiling`, which also makes the
//! random device-resident batches), and per-thread CPU time (`threads`). Each
//! benchmark uses part of it.
#![allow(dead_code)]

pub mod threads;

use millrace_core::ceiling::Cadence;
use millrace_core::torch_settings::Tf32;
use millrace_proto::ObsSpec;
use tch::Device;

/// `--gpu N`: that CUDA device, or the benchmark stops (it never falls back to the CPU,
/// so a missing GPU fails instead of measuring the CPU).
pub fn gpu(arg: &str) -> Device {
    let i = arg
        .parse()
        .unwrap_or_else(|_| panic!("--gpu N, got {arg:?}"));
    match millrace_learner::cli::resolve_device(false, Some(i)) {
        Ok(d) => d.device(),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    }
}

/// `--tf32 off|conv|all`.
pub fn tf32(arg: &str) -> Tf32 {
    match arg {
        "off" => Tf32::Off,
        "conv" => Tf32::Conv,
        "all" => Tf32::All,
        other => panic!("--tf32 off|conv|all, got {other}"),
    }
}

/// Sets the learner's math on a CUDA `device` (TF32 as `tf32` says, cuDNN benchmark on)
/// and says what fp32 means there, as libtorch reads it back.
pub fn gpu_math(device: Device, tf32: Tf32) {
    match millrace_core::torch_settings::for_device(device, tf32) {
        Ok(Some(math)) => println!("GPU math: {math} (--tf32 {tf32})"),
        Ok(None) => {}
        Err(e) => {
            eprintln!("error: --tf32 {tf32}: {e}");
            std::process::exit(2);
        }
    }
}

/// The learner's cadence for `b` observations `obs` on `device`, with or without a
/// side copy stream.
pub fn learner_cadence(obs: &ObsSpec, b: usize, device: Device, copy_stream: bool) -> Cadence {
    Cadence::learner(obs, b, matches!(device, Device::Cuda(_)), copy_stream)
}
