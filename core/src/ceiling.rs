//! The learner's ceiling: `Dqn::update` back to back on a device-resident batch, the
//! "100% busy" figure that end-to-end throughput is compared against. To mean the same
//! on a GPU as on a CPU, the loop waits for the device exactly as the learner thread
//! does ([`Cadence::learner`]): once per half ring of staging buffers (the learner
//! waits there before buffers go back to the sampler), and statistics once per report
//! interval; every other update is only queued.

use std::time::{Duration, Instant};

use millrace_proto::{DType, ObsSpec};
use tch::{Device, Kind, Tensor};

use crate::dqn::{Batch, Dqn};
use crate::prefetch;

/// When the loop waits for the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cadence {
    /// Wait for all queued work every this many updates (`None`: never, as with
    /// `--copy-stream`, where the sampler's side stream does the waiting).
    pub wait_every: Option<u64>,
    /// Read the statistics (one host sync) this often.
    pub stats_every: Duration,
}

impl Cadence {
    /// The learner thread's waits for batches of `batch_size` observations `obs` on a
    /// CUDA device (`cuda`) or the CPU, with the default prefetch depth, with or
    /// without a side copy stream.
    pub fn learner(obs: &ObsSpec, batch_size: usize, cuda: bool, copy_stream: bool) -> Self {
        Self {
            wait_every: (!copy_stream).then(|| {
                prefetch::device_wait_every(prefetch::default_depth(obs, batch_size, cuda)) as u64
            }),
            stats_every: crate::update_loop::REPORT_EVERY,
        }
    }

    /// "every 128 updates", for the benchmark's table.
    pub fn describe(&self) -> String {
        match self.wait_every {
            Some(n) => format!("device wait every {n} updates"),
            None => "no device wait (side stream)".into(),
        }
    }
}

/// What one timed loop does on its device.
pub trait Updates {
    /// Queues one update.
    fn update(&mut self);
    /// Waits for every queued update.
    fn wait(&mut self);
    /// Reads the statistics (a host sync on a GPU).
    fn stats(&mut self);
}

/// Runs updates for at least `seconds` and `min_updates`, waiting as `cadence` says,
/// and then for all of them; returns the count and the time they took.
pub fn run(
    updates: &mut impl Updates,
    cadence: Cadence,
    seconds: f64,
    min_updates: u64,
) -> (u64, Duration) {
    let start = Instant::now();
    let mut last_stats = start;
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < seconds || n < min_updates {
        updates.update();
        n += 1;
        if cadence
            .wait_every
            .is_some_and(|k| n.is_multiple_of(k.max(1)))
        {
            updates.wait();
        }
        if last_stats.elapsed() >= cadence.stats_every {
            updates.stats();
            last_stats = Instant::now();
        }
    }
    updates.wait();
    (n, start.elapsed())
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

/// Waits for queued device work (a no-op on the CPU).
pub fn sync(device: Device) {
    if let Device::Cuda(i) = device {
        tch::Cuda::synchronize(i as i64);
    }
}

/// `Dqn::update` on one resident batch, for [`run`].
struct Resident<'a> {
    dqn: &'a mut Dqn,
    batch: &'a Batch,
    device: Device,
}

impl Updates for Resident<'_> {
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
    run(&mut r, cadence, seconds * 0.1, 2);
    let (n, took) = run(&mut r, cadence, seconds, min_updates);
    n as f64 / took.as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;
    use millrace_proto::DType;

    #[derive(Default)]
    struct Counting {
        updates: u64,
        waits: Vec<u64>,
        stats: u64,
    }

    impl Updates for Counting {
        fn update(&mut self) {
            self.updates += 1;
        }
        fn wait(&mut self) {
            self.waits.push(self.updates);
        }
        fn stats(&mut self) {
            self.stats += 1;
        }
    }

    #[test]
    fn the_ceiling_waits_on_the_learners_cadence() {
        let cartpole = ObsSpec {
            shape: vec![4],
            dtype: DType::F32,
        };
        let atari = ObsSpec {
            shape: vec![4, 84, 84],
            dtype: DType::U8,
        };
        // The learner's half rings: 256 buffers for CartPole and the Nature CNN at
        // batch 32, 18 at batch 512; none with a side stream.
        for (obs, batch, every) in [(&cartpole, 32, 128), (&atari, 32, 128), (&atari, 512, 9)] {
            let c = Cadence::learner(obs, batch, true, false);
            assert_eq!(c.wait_every, Some(every), "{:?} x {batch}", obs.shape);
            let depth = prefetch::default_depth(obs, batch, true);
            assert_eq!(
                c.wait_every,
                Some(prefetch::device_wait_every(depth) as u64),
                "what the prefetcher returns buffers at"
            );
        }
        assert_eq!(Cadence::learner(&atari, 32, true, true).wait_every, None);
        // The loop waits at exactly those updates, and once at the end.
        let mut u = Counting::default();
        let cadence = Cadence {
            wait_every: Some(9),
            stats_every: Duration::from_secs(3600),
        };
        let (n, _) = run(&mut u, cadence, 0.0, 100);
        assert_eq!(n, 100);
        let expected: Vec<u64> = (1..=11).map(|k| 9 * k).chain([100]).collect();
        assert_eq!(u.waits, expected);
        assert_eq!(u.stats, 0, "statistics by time, not by count");
        let mut u = Counting::default();
        let side = Cadence {
            wait_every: None,
            stats_every: Duration::ZERO,
        };
        run(&mut u, side, 0.0, 50);
        assert_eq!(u.waits, [50], "only the final wait");
        assert_eq!(u.stats, 50);
    }
}
