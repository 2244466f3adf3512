//! What the `ceiling` and `overlap` benchmarks share: random device-resident batches and
//! the timed update loop.

use std::time::Instant;

use millrace_learner::dqn::{Batch, Dqn};
use millrace_proto::{DType, ObsSpec};
use tch::{Device, Kind, Tensor};

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

/// Updates/s of `dqn` on `batch`: after a warm-up of a tenth of the time (at least two
/// updates), for `seconds` and at least `min_updates`, reading statistics every 16
/// updates as the learner does and waiting for the device at the end.
pub fn updates_per_s(
    dqn: &mut Dqn,
    batch: &Batch,
    device: Device,
    seconds: f64,
    min_updates: u64,
) -> f64 {
    let warm = Instant::now();
    let mut w = 0;
    while w < 2 || warm.elapsed().as_secs_f64() < seconds * 0.1 {
        let _ = dqn.update(batch);
        w += 1;
    }
    sync(device);
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < seconds || n < min_updates {
        let _ = dqn.update(batch);
        n += 1;
        if n.is_multiple_of(16) {
            let _ = dqn.take_stats();
        }
    }
    sync(device);
    n as f64 / start.elapsed().as_secs_f64()
}
