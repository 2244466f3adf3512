//! The learner's feedback into replay: per-item TD errors back as priorities
//! (prioritized replay), by the items' stable keys, and β's schedule; and, for every
//! replay, the items whose TD errors show them poison evicted ([`crate::poison`]).
//!
//! Each update leaves its TD errors on the device; every `every` updates they are
//! joined and read back at once. On a GPU the read-back is an asynchronous copy into
//! pinned memory, applied one round later, after an event says it has landed: the
//! learner never waits for the device to drain its queue, and there is no host sync
//! per update. An item overwritten since it was sampled is left alone (its key is
//! stale); a TD error that is not finite is counted by replay and never stored.

use std::sync::Arc;

use millrace_replay::{ItemKey, PriorityOutcome, PriorityUpdate, Table};
use serde::Serialize;
use tch::{Device, Kind, Tensor};

use crate::cuda::Marker;

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

/// A read-back on its way to the host (GPU): pinned memory, its keys, and the event
/// after the copy.
struct InFlight {
    host: Tensor,
    keys: Vec<ItemKey>,
    marker: Marker,
}

/// Collects TD errors and keys per update; hands them to replay in rounds.
pub struct PriorityFeedback {
    table: Arc<Table>,
    /// Prioritized replay's β; `None` for uniform replay (poison evicted, no priorities).
    beta: Option<BetaSchedule>,
    /// |TD error| beyond which an item is poison ([`crate::poison::td_bound`]).
    poison_td: f32,
    every: usize,
    device: Device,
    tds: Vec<Tensor>,
    keys: Vec<ItemKey>,
    in_flight: Option<InFlight>,
    /// Markers of read-backs already applied, for reuse.
    spare: Option<Marker>,
    totals: PriorityOutcome,
}

impl std::fmt::Debug for PriorityFeedback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PriorityFeedback")
            .field("every", &self.every)
            .field("pending", &self.tds.len())
            .field("totals", &self.totals)
            .finish_non_exhaustive()
    }
}

impl PriorityFeedback {
    /// Feedback into `table` every `every` updates (at least 1), for updates on
    /// `device`: priorities with β from `beta` (prioritized replay; set for the first
    /// batches at `env_steps`, a resumed run's), or none (`None`: uniform replay); and
    /// items whose |TD error| is not finite or beyond `poison_td` evicted as poison.
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
        Self {
            table,
            beta,
            poison_td,
            every: every.max(1),
            device,
            tds: Vec::new(),
            keys: Vec::new(),
            in_flight: None,
            spare: None,
            totals: PriorityOutcome::default(),
        }
    }

    /// Takes one update's TD errors (`[1, B]`, on the device) and the keys of the
    /// items it was computed on; every `every` calls, hands the priorities to replay.
    /// `env_steps` moves β along its schedule.
    pub fn push(&mut self, td: &Tensor, keys: &[ItemKey], env_steps: u64) {
        self.tds.push(td.detach().reshape([-1]));
        self.keys.extend_from_slice(keys);
        if self.tds.len() >= self.every {
            self.flush(env_steps);
        }
    }

    /// Hands every priority collected so far to replay, waiting for any read-back in
    /// flight (the end of a run, or before a checkpoint).
    pub fn finish(&mut self) {
        if !self.tds.is_empty() {
            self.round();
        }
        self.land();
    }

    /// What replay did with the priorities handed over so far.
    pub fn totals(&self) -> PriorityOutcome {
        self.totals
    }

    fn flush(&mut self, env_steps: u64) {
        if let Some(beta) = self.beta {
            self.table.set_beta(beta.at(env_steps));
        }
        self.round();
    }

    /// One round: |TD| of the collected updates, read back (on a GPU, asynchronously:
    /// the previous round's read-back is applied instead).
    fn round(&mut self) {
        // Taken first: should the device fail here, nothing is tried twice.
        let tds = std::mem::take(&mut self.tds);
        let keys = std::mem::take(&mut self.keys);
        let td = Tensor::cat(&tds, 0).abs().to_kind(Kind::Float);
        let Device::Cuda(i) = self.device else {
            self.apply(&td, keys);
            return;
        };
        // Pinned, so that the copy does not block: PyTorch pins the destination of a
        // non-blocking copy to the host.
        let host = td.to_device_(Device::Cpu, Kind::Float, true, false);
        let marker = match self.spare.take().map_or_else(|| Marker::new(i), Ok) {
            Ok(m) if m.record().is_ok() => m,
            _ => {
                // No event: wait for the copy here (correct, slower).
                tch::Cuda::synchronize(i as i64);
                self.land();
                self.apply(&host, keys);
                return;
            }
        };
        self.land();
        self.in_flight = Some(InFlight { host, keys, marker });
    }

    /// Applies the read-back in flight, if any, once it has landed.
    fn land(&mut self) {
        let Some(f) = self.in_flight.take() else {
            return;
        };
        if f.marker.wait().is_err() {
            if let Device::Cuda(i) = self.device {
                tch::Cuda::synchronize(i as i64);
            }
        }
        self.apply(&f.host, f.keys);
        self.spare = Some(f.marker);
    }

    fn apply(&mut self, host: &Tensor, mut keys: Vec<ItemKey>) {
        let mut priorities = match Vec::<f32>::try_from(host) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!("priorities: cannot read TD errors back: {e}");
                return;
            }
        };
        let culprits = crate::poison::culprits(&priorities, self.poison_td);
        if !culprits.is_empty() {
            let poisoned: Vec<ItemKey> = culprits
                .iter()
                .filter_map(|i| keys.get(*i))
                .copied()
                .collect();
            let worst = culprits
                .iter()
                .map(|i| priorities[*i])
                .fold(0.0f32, |m, td| {
                    if td.is_finite() {
                        m.max(td)
                    } else {
                        f32::INFINITY
                    }
                });
            let evicted = self.table.evict(&poisoned);
            let before = self.table.stats().evicted.saturating_sub(evicted as u64);
            // Logged once per power of two (a flood says so without flooding the log).
            if (before + 1..=before + evicted as u64).any(u64::is_power_of_two) {
                tracing::warn!(
                    "replay: {evicted} item(s) evicted as poison (|TD error| up to {worst:e}, beyond {:e}); {} so far",
                    self.poison_td,
                    before + evicted as u64
                );
            }
            // Their TD errors are no priorities (one 3e38 would raise the maximum every
            // new item gets).
            let mut poison = vec![false; priorities.len()];
            for i in &culprits {
                poison[*i] = true;
            }
            (keys, priorities) = keys
                .iter()
                .zip(&priorities)
                .zip(&poison)
                .filter(|(_, bad)| !**bad)
                .map(|((k, td), _)| (*k, *td))
                .unzip();
        }
        if self.beta.is_none() {
            return;
        }
        let r = self
            .table
            .update_priorities(&PriorityUpdate { keys, priorities });
        self.totals.applied += r.applied;
        self.totals.stale += r.stale;
        self.totals.invalid += r.invalid;
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
        let mut fb = PriorityFeedback::new(
            Arc::clone(&table),
            Some(beta),
            2,
            Device::Cpu,
            0,
            f32::INFINITY,
        );
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
        for priority in [
            None,
            Some(PriorityConfig {
                alpha: 1.0,
                beta: 0.0,
            }),
        ] {
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
            assert!(culprits > 0, "the draw holds a culprit: {:?}", out.actions);
            let evicted: std::collections::BTreeSet<i64> = out
                .actions
                .iter()
                .copied()
                .filter(|a| [2, 5].contains(a))
                .collect();
            assert_eq!(table.stats().evicted, evicted.len() as u64, "{priority:?}");
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
