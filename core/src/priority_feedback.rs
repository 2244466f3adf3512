//! The learner's feedback into replay: per-item TD errors back as priorities
//! (prioritized replay), by the items' stable keys, and β's schedule; and, for every
//! replay, the items whose TD errors show them poison evicted ([`crate::poison`]).
//!
//! Each update leaves its TD errors on the device; every `every` updates they are
//! joined and read back at once (a round). On a GPU the read-back is an asynchronous
//! copy into pinned memory, followed by an event. The learner thread hands each round
//! to a thread of its own (`priority_thread`), which waits for the copy to
//! land and applies it (`priority_apply`); lock-step drivers apply inline, on
//! a GPU one round later, once the event says the copy has landed. Neither waits for
//! the device to drain its queue, and there is no host sync per update. An item
//! overwritten since it was sampled is left alone (its key is
//! stale); a TD error that is not finite is counted by replay and never stored.

use std::sync::Arc;

use millrace_replay::{ItemKey, PriorityOutcome, Table};
use serde::Serialize;
use tch::{Device, Kind, Tensor};

use crate::cuda::Marker;
use crate::priority_apply::Applier;
use crate::priority_thread::{Landing, PriorityThread, Round};

/// β, the importance-sampling exponent: linear from `start` to `end` over `steps` env
/// steps, then `end` (Schaul et al. anneal it to 1; Ape-X keeps 0.4).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct BetaSchedule {
    pub start: f64,
    pub end: f64,
    pub steps: u64,
}

impl BetaSchedule {
    pub fn at(&self, env_steps: u64) -> f64 {
        if self.steps == 0 {
            return self.end;
        }
        let f = (env_steps as f64 / self.steps as f64).min(1.0);
        self.start + f * (self.end - self.start)
    }
}

/// A read-back on its way to the host (GPU, applied inline): pinned memory, its keys,
/// and the event after the copy.
struct InFlight {
    host: Tensor,
    keys: Vec<ItemKey>,
    marker: Marker,
}

/// Where rounds are applied.
enum Apply {
    /// On the caller's thread (lock-step drivers); on a GPU each round's read-back is
    /// applied one round later, once its event says it has landed.
    Inline {
        applier: Applier,
        in_flight: Option<InFlight>,
        /// The marker of a read-back already applied, for reuse.
        spare: Option<Marker>,
    },
    /// On a thread of their own (the learner thread's): see [`crate::priority_thread`].
    OwnThread(PriorityThread),
}

/// Collects TD errors and keys per update; hands them to replay in rounds.
pub struct PriorityFeedback {
    table: Arc<Table>,
    /// Prioritized replay's β; `None` for uniform replay (poison evicted, no priorities).
    beta: Option<BetaSchedule>,
    every: usize,
    device: Device,
    tds: Vec<Tensor>,
    keys: Vec<ItemKey>,
    apply: Apply,
}

impl std::fmt::Debug for PriorityFeedback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PriorityFeedback")
            .field("every", &self.every)
            .field("pending", &self.tds.len())
            .field("own_thread", &matches!(self.apply, Apply::OwnThread(_)))
            .field("totals", &self.totals())
            .finish_non_exhaustive()
    }
}

impl PriorityFeedback {
    /// Feedback into `table` every `every` updates (at least 1), for updates on
    /// `device`, applied on the caller's thread: priorities with β from `beta`
    /// (prioritized replay; set for the first batches at `env_steps`, a resumed run's),
    /// or none (`None`: uniform replay); and items whose |TD error| is not finite or
    /// beyond `poison_td` evicted as poison.
    pub fn new(
        table: Arc<Table>,
        beta: Option<BetaSchedule>,
        every: usize,
        device: Device,
        env_steps: u64,
        poison_td: f32,
    ) -> Self {
        if let Some(beta) = beta {
            table.set_beta(beta.at(env_steps));
        }
        let applier = Applier::new(Arc::clone(&table), beta.is_some(), poison_td);
        Self {
            table,
            beta,
            every: every.max(1),
            device,
            tds: Vec::new(),
            keys: Vec::new(),
            apply: Apply::Inline {
                applier,
                in_flight: None,
                spare: None,
            },
        }
    }

    /// The same feedback, applied from now on by a thread of its own
    /// (`priority_thread`, started here: it runs where the calling thread
    /// may): the caller then never takes replay's shard locks and never waits for the
    /// device for priorities. Rounds land later than inline, so a run that must be
    /// bit-identical stays inline.
    pub fn on_own_thread(mut self) -> std::io::Result<Self> {
        self.finish();
        let apply = match self.apply {
            Apply::Inline { applier, .. } => Apply::OwnThread(PriorityThread::spawn(applier)?),
            own @ Apply::OwnThread(_) => own,
        };
        Ok(Self { apply, ..self })
    }

    /// Takes one update's TD errors (`[1, B]`, on the device: every update of a round
    /// the same shape) and the keys of the items it was computed on; every `every` calls, hands the priorities to
    /// replay. `env_steps` moves β along its schedule.
    pub fn push(&mut self, td: &Tensor, keys: &[ItemKey], env_steps: u64) {
        // One call into libtorch per update (detached: no update's autograd graph is
        // kept); the round joins and flattens them.
        self.tds.push(td.detach());
        self.keys.extend_from_slice(keys);
        if self.tds.len() >= self.every {
            self.flush(env_steps);
        }
    }

    /// Hands every priority collected so far to replay and waits until it has been
    /// applied (the end of a run, or before a checkpoint).
    pub fn finish(&mut self) {
        if !self.tds.is_empty() {
            self.round();
        }
        if let Apply::OwnThread(t) = &self.apply {
            t.finish();
        } else {
            self.land();
        }
    }

    /// What replay did with the priorities applied so far.
    pub fn totals(&self) -> PriorityOutcome {
        match &self.apply {
            Apply::Inline { applier, .. } => applier.totals(),
            Apply::OwnThread(t) => t.totals(),
        }
    }

    fn flush(&mut self, env_steps: u64) {
        if let Some(beta) = self.beta {
            self.table.set_beta(beta.at(env_steps));
        }
        self.round();
    }

    /// One round: |TD| of the collected updates, read back (on a GPU, asynchronously)
    /// and handed on: to the thread, or applied here (on a GPU, the previous round's
    /// read-back is applied instead).
    fn round(&mut self) {
        // Taken first: should the device fail here, nothing is tried twice.
        let tds = std::mem::take(&mut self.tds);
        let keys = std::mem::take(&mut self.keys);
        let td = Tensor::cat(&tds, 0)
            .reshape([-1])
            .abs()
            .to_kind(Kind::Float);
        let Device::Cuda(i) = self.device else {
            match &mut self.apply {
                Apply::Inline { applier, .. } => applier.apply(&td, keys),
                Apply::OwnThread(t) => t.send(Round {
                    host: td,
                    keys,
                    landing: Landing::Now,
                }),
            }
            return;
        };
        // Pinned, so that the copy does not block: PyTorch pins the destination of a
        // non-blocking copy to the host.
        let host = td.to_device_(Device::Cpu, Kind::Float, true, false);
        let spare = match &mut self.apply {
            Apply::Inline { spare, .. } => spare.take(),
            Apply::OwnThread(t) => t.spare(),
        };
        let marker = match spare.map_or_else(|| Marker::new(i), Ok) {
            Ok(m) if m.record().is_ok() => Some(m),
            _ => None,
        };
        if let Apply::OwnThread(t) = &mut self.apply {
            let landing = marker.map_or(Landing::Drained(i), |m| Landing::After(m, i));
            t.send(Round {
                host,
                keys,
                landing,
            });
            return;
        }
        let Some(marker) = marker else {
            // No event: wait for the copy here (correct, slower).
            tch::Cuda::synchronize(i as i64);
            self.land();
            if let Apply::Inline { applier, .. } = &mut self.apply {
                applier.apply(&host, keys);
            }
            return;
        };
        self.land();
        if let Apply::Inline { in_flight, .. } = &mut self.apply {
            *in_flight = Some(InFlight { host, keys, marker });
        }
    }

    /// Applies the inline read-back in flight, if any, once it has landed.
    fn land(&mut self) {
        let Apply::Inline {
            applier,
            in_flight,
            spare,
        } = &mut self.apply
        else {
            return;
        };
        let Some(f) = in_flight.take() else {
            return;
        };
        if f.marker.wait().is_err() {
            if let Device::Cuda(i) = self.device {
                tch::Cuda::synchronize(i as i64);
            }
        }
        applier.apply(&f.host, f.keys);
        *spare = Some(f.marker);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use millrace_proto::TransitionBatch;
    use millrace_replay::{PriorityConfig, RateLimiterConfig, ReplayConfig, SampleScratch};
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    #[test]
    fn beta_anneals_linearly_then_holds() {
        let b = BetaSchedule {
            start: 0.4,
            end: 1.0,
            steps: 1000,
        };
        assert_eq!(b.at(0), 0.4);
        assert!((b.at(500) - 0.7).abs() < 1e-12);
        assert_eq!((b.at(1000), b.at(10_000)), (1.0, 1.0));
        let fixed = BetaSchedule {
            start: 0.4,
            end: 0.4,
            steps: 0,
        };
        assert_eq!(fixed.at(123), 0.4);
    }

    #[test]
    fn td_errors_become_priorities_of_the_sampled_items_in_rounds() {
        td_errors_become_priorities(false);
    }

    #[test]
    fn on_their_own_thread_td_errors_become_the_same_priorities() {
        td_errors_become_priorities(true);
    }

    fn td_errors_become_priorities(own_thread: bool) {
        let table = Arc::new(
            Table::new(&ReplayConfig {
                capacity: 64,
                shards: 2,
                obs_row_bytes: 4,
                stack: 1,
                obs_rows_per_item: 2.0,
                limiter: RateLimiterConfig::sample_to_insert_ratio(1.0, 1, 1e9, 1).unwrap(),
                priority: Some(PriorityConfig {
                    alpha: 1.0,
                    beta: 0.0,
                }),
            })
            .unwrap(),
        );
        for seq in 0..4 {
            let mut b = TransitionBatch::with_capacity(4, 8, 16);
            for v in 0..8i64 {
                let v = v + 8 * seq as i64;
                b.push_f32(&[v as f32], v, 0.0, 0.9, &[v as f32]);
            }
            b.seq = seq;
            table.insert(&b).unwrap();
        }
        let beta = BetaSchedule {
            start: 0.2,
            end: 0.6,
            steps: 100,
        };
        let fb = PriorityFeedback::new(
            Arc::clone(&table),
            Some(beta),
            2,
            Device::Cpu,
            0,
            f32::INFINITY,
        );
        let mut fb = if own_thread {
            fb.on_own_thread().unwrap()
        } else {
            fb
        };
        assert_eq!(table.beta(), 0.2);
        let sample = |n: usize| {
            let mut out = SampleScratch::new(n, 4);
            table
                .sample(&mut SmallRng::seed_from_u64(n as u64), &mut out.buffers())
                .unwrap();
            (out.actions, out.keys)
        };
        let (a1, k1) = sample(4);
        let (a2, k2) = sample(4);
        // TD errors of either sign: priorities are their magnitudes.
        let td = |a: &[i64]| {
            Tensor::from_slice(&a.iter().map(|v| -(*v as f32) - 1.0).collect::<Vec<_>>())
                .view([1, -1])
        };
        fb.push(&td(&a1), &k1, 10);
        assert_eq!(fb.totals().applied, 0, "not before a round is complete");
        fb.push(&td(&a2), &k2, 50);
        if own_thread {
            // Handed over; applied once the thread has, which `finish` waits for.
            fb.finish();
        }
        assert_eq!(fb.totals().applied, 8);
        assert!((table.beta() - 0.4).abs() < 1e-12, "β at 50 of 100 steps");
        let mut stored = Vec::new();
        table.snapshot(|_, b| stored.extend(b.actions.iter().copied().zip(b.priorities.clone())));
        for (a, p) in stored {
            if a1.contains(&a) || a2.contains(&a) {
                assert_eq!(p, a as f32 + 1.0, "item {a}");
            } else {
                assert_eq!(p, 1.0, "item {a}: untouched, the initial maximum");
            }
        }
        // A partial round goes in on finish.
        let (a3, k3) = sample(2);
        fb.push(&td(&a3), &k3, 60);
        fb.finish();
        assert_eq!(fb.totals().applied, 10);
    }

    #[test]
    fn items_whose_td_errors_explode_are_evicted_with_uniform_replay_too() {
        // Regression (issue "One bad transition…", part 1): one item's reward of 3e38
        // overflowed every update that sampled it, and its priority (3e38) became the
        // maximum every new item got. Now the feedback evicts it, for either replay.
        for (priority, own_thread) in [None, Some(1.0)]
            .into_iter()
            .flat_map(|alpha| [(alpha, false), (alpha, true)])
        {
            let priority = priority.map(|alpha| PriorityConfig { alpha, beta: 0.0 });
            let table = Arc::new(
                Table::new(&ReplayConfig {
                    capacity: 128,
                    shards: 1,
                    obs_row_bytes: 4,
                    stack: 1,
                    obs_rows_per_item: 2.0,
                    limiter: RateLimiterConfig::sample_to_insert_ratio(1.0, 1, 1e9, 1).unwrap(),
                    priority,
                })
                .unwrap(),
            );
            let mut b = TransitionBatch::with_capacity(4, 64, 128);
            for v in 0..64i64 {
                b.push_f32(&[v as f32], v, 0.0, 0.9, &[v as f32]);
            }
            b.actor_id = 7;
            table.insert(&b).unwrap();
            let beta = priority.map(|_| BetaSchedule {
                start: 0.4,
                end: 0.4,
                steps: 0,
            });
            let mut fb = PriorityFeedback::new(Arc::clone(&table), beta, 1, Device::Cpu, 0, 1e6);
            if own_thread {
                fb = fb.on_own_thread().unwrap();
            }
            // A round of 64: a culprit or two is poison (more would be divergence).
            let mut out = SampleScratch::new(64, 4);
            table
                .sample(&mut SmallRng::seed_from_u64(3), &mut out.buffers())
                .unwrap();
            // Item with action 5 explodes (finite, 3e38); item 2 is not a number.
            let td: Vec<f32> = out
                .actions
                .iter()
                .map(|a| match a {
                    5 => -3e38,
                    2 => f32::NAN,
                    _ => 0.5,
                })
                .collect();
            let culprits = out.actions.iter().filter(|a| [2, 5].contains(*a)).count();
            fb.push(&Tensor::from_slice(&td).view([1, -1]), &out.keys, 0);
            fb.finish();
            assert!(culprits > 0, "the draw holds a culprit: {:?}", out.actions);
            let evicted: std::collections::BTreeSet<i64> = out
                .actions
                .iter()
                .copied()
                .filter(|a| [2, 5].contains(a))
                .collect();
            assert_eq!(
                table.stats().evicted,
                evicted.len() as u64,
                "{priority:?}, own thread {own_thread}"
            );
            assert_eq!(table.evicted_from(7), evicted.len() as u64);
            let mut kept = Vec::new();
            table.snapshot(|_, b| kept.extend(b.actions.iter().copied().zip(b.priorities.clone())));
            assert!(kept.iter().all(|(a, _)| !evicted.contains(a)), "{kept:?}");
            if priority.is_some() {
                assert!(
                    table.stats().max_priority < 1e3,
                    "no poison in the priorities: {}",
                    table.stats().max_priority
                );
            }
        }
    }
}
