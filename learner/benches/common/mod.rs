//! What the benchmarks share: the device flags (`--gpu N`, `--tf32`), random
//! device-resident batches and the timed update loop (`millrace_core::ceiling`, on
//! the learner's cadence). Each benchmark uses part of it.
#![allow(dead_code)]

use millrace_core::ceiling::{self, Cadence};
use millrace_core::dqn::{Batch, Dqn};
use millrace_core::torch_settings::Tf32;
use millrace_proto::{DType, ObsSpec};
use tch::{Device, Kind, Tensor};

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

/// Waits for queued device work (a no-op on the CPU).
pub fn sync(device: Device) {
    if let Device::Cuda(i) = device {
        tch::Cuda::synchronize(i as i64);
    }
}

/// A random batch of `b` transitions already on `device`: `f32` observations from a
/// normal distribution, `u8` ones uniform over 0..256.
pub fn random_batch(obs: &ObsSpec, actions: usize, b: usize, device: Device) -> Batch {
    let b = b as i64;
    let mut shape = vec![1, 2 * b];
    shape.extend(obs.shape.iter().map(|d| *d as i64));
    let obs2 = match obs.dtype {
        DType::F32 => Tensor::randn(shape.as_slice(), (Kind::Float, device)),
        DType::U8 => Tensor::randint(256, shape.as_slice(), (Kind::Uint8, device)),
    };
    Batch {
        obs2,
        actions: Tensor::randint(actions as i64, [1, b, 1], (Kind::Int64, device)),
        rewards: Tensor::randn([1, b, 1], (Kind::Float, device)),
        discounts: Tensor::full([1, b, 1], 0.99, (Kind::Float, device)),
        weights: None,
    }
}

/// `Dqn::update` on one resident batch, for [`ceiling::run`].
struct Resident<'a> {
    dqn: &'a mut Dqn,
    batch: &'a Batch,
    device: Device,
}

impl ceiling::Updates for Resident<'_> {
    fn update(&mut self) {
        let _ = self.dqn.update(self.batch);
    }

    fn wait(&mut self) {
        sync(self.device);
    }

    fn stats(&mut self) {
        let _ = self.dqn.take_stats();
    }
}

/// Updates/s of `dqn` on `batch`: after a warm-up of a tenth of the time (at least two
/// updates), for `seconds` and at least `min_updates`, waiting for the device and
/// reading statistics as the learner thread does (`cadence`), and for all of it at the
/// end.
pub fn updates_per_s(
    dqn: &mut Dqn,
    batch: &Batch,
    device: Device,
    seconds: f64,
    min_updates: u64,
    cadence: Cadence,
) -> f64 {
    let mut r = Resident { dqn, batch, device };
    ceiling::run(&mut r, cadence, seconds * 0.1, 2);
    let (n, took) = ceiling::run(&mut r, cadence, seconds, min_updates);
    n as f64 / took.as_secs_f64()
}

/// The learner's cadence for `b` observations `obs` on `device`, with or without a
/// side copy stream.
pub fn learner_cadence(obs: &ObsSpec, b: usize, device: Device, copy_stream: bool) -> Cadence {
    Cadence::learner(obs, b, matches!(device, Device::Cuda(_)), copy_stream)
}
