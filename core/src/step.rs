//! The learner step, the one piece of code every driver runs per batch: the update,
//! its TD errors back into each agent's replay as priorities (prioritized replay), the
//! parameters published when due and, when the driver asks, the statistics read and
//! each agent's divergence checked.
//!
//! The drivers differ only in what surrounds it: the learner thread
//! ([`crate::update_loop`]) waits on the sampler's ring and on commands, times copies
//! and hands checkpoints to the writer; lock-step mode (`learner/src/run/lockstep.rs`)
//! and population mode (`learner/src/run/population/group.rs`) act inline on one
//! thread. A one-agent run is a population of one: row `k` of the stacked update is
//! agent `k`, with its own replay, feedback and env step count.

use millrace_replay::ItemKey;

use crate::dqn::{Batch, Dqn, UpdateStats};
use crate::faults::inject_oom;
use crate::faults::{OomFault, OomSite};
use crate::priority_feedback::PriorityFeedback;

/// What the step needs of the run's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepConfig {
    /// Publish parameters every this many updates.
    pub publish_every: u64,
    /// An agent whose last this many updates all had a non-finite loss has diverged.
    pub max_nonfinite: u64,
}

/// What [`LearnerStep::check`] read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Health {
    /// Means since the previous check, over every agent.
    pub stats: UpdateStats,
    /// Each agent's current run of non-finite updates, by row.
    pub streaks: Vec<u64>,
    /// The rows whose run reached the limit: their agents diverged.
    pub diverged: Vec<usize>,
    /// Updates skipped for a non-finite loss since the step was made (all agents).
    pub nonfinite_total: u64,
}

/// The networks and what goes with each row: see the module's documentation.
#[derive(Debug)]
pub struct LearnerStep {
    dqn: Dqn,
    cfg: StepConfig,
    /// The version the last publish had (the next is one more).
    version: u64,
    /// Row by row, prioritized replay's way back into that agent's replay.
    feedback: Vec<Option<PriorityFeedback>>,
    /// Run out of memory at a site once this many updates are done (tests of that
    /// path).
    oom: Option<(OomFault, u64)>,
    nonfinite_total: u64,
    /// The caller's time handing TD errors to replay since the last
    /// [`LearnerStep::take_priority_seconds`].
    priorities_s: f64,
}

impl LearnerStep {
    /// A step over `dqn`, whose parameters were last published as `version`;
    /// `feedback` has one entry per row of `dqn` (none for uniform replay).
    ///
    /// # Panics
    /// If `feedback` does not have one entry per agent.
    pub fn new(
        dqn: Dqn,
        version: u64,
        cfg: StepConfig,
        feedback: Vec<Option<PriorityFeedback>>,
        oom: Option<(OomFault, u64)>,
    ) -> Self {
        assert_eq!(feedback.len(), dqn.spec().population, "feedback per agent");
        Self {
            dqn,
            cfg,
            version,
            feedback,
            oom,
            nonfinite_total: 0,
            priorities_s: 0.0,
        }
    }

    pub fn dqn(&self) -> &Dqn {
        &self.dqn
    }

    /// The version of the last parameters published.
    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn updates(&self) -> u64 {
        self.dqn.updates()
    }

    /// The networks, for the driver to hand back (a final checkpoint, an error).
    pub fn into_dqn(self) -> Dqn {
        self.dqn
    }

    /// One update on `batch` (already on the device). `keys` are the batch's items,
    /// row after row (`B` per agent; their priorities are set after the update), and
    /// `env_steps` each agent's env steps now (its learning rate and β follow them).
    /// Calls `publish` with the new version when one is due. An allocation failure
    /// anywhere here panics in libtorch: the drivers turn that into their
    /// out-of-memory ending.
    pub fn update(
        &mut self,
        batch: &Batch,
        keys: &[ItemKey],
        env_steps: &[u64],
        publish: &mut dyn FnMut(u64, &Dqn),
    ) {
        self.dqn.anneal_lr(env_steps);
        inject_oom(self.oom, self.dqn.updates(), OomSite::Update);
        let out = self.dqn.update(batch);
        if self.feedback.iter().any(Option::is_some) {
            let p0 = std::time::Instant::now();
            let b = keys.len() / self.feedback.len().max(1);
            // Each agent's TD errors as `[1, B]`, whatever the population (it shrinks
            // mid-round when agents end): one agent's are the whole output, no view
            // to make.
            let one = self.feedback.len() == 1;
            for (row, fb) in self.feedback.iter_mut().enumerate() {
                let Some(fb) = fb else { continue };
                inject_oom(self.oom, self.dqn.updates(), OomSite::Priorities);
                let steps = env_steps.get(row).or(env_steps.last()).copied();
                let agent;
                let td = if one {
                    &out.td_errors
                } else {
                    agent = out.agent(row);
                    &agent
                };
                fb.push(td, &keys[row * b..(row + 1) * b], steps.unwrap_or(0));
            }
            self.priorities_s += p0.elapsed().as_secs_f64();
        }
        if self
            .dqn
            .updates()
            .is_multiple_of(self.cfg.publish_every.max(1))
        {
            self.version += 1;
            inject_oom(self.oom, self.dqn.updates(), OomSite::Publish);
            publish(self.version, &self.dqn);
        }
    }

    /// The caller's time in [`LearnerStep::update`] handing TD errors to replay
    /// (priorities and poison checks) since the last call, in seconds.
    pub fn take_priority_seconds(&mut self) -> f64 {
        std::mem::take(&mut self.priorities_s)
    }

    /// Reads the statistics since the last check (one host sync) and which agents
    /// diverged.
    pub fn check(&mut self) -> Health {
        inject_oom(self.oom, self.dqn.updates(), OomSite::Stats);
        let stats = self.dqn.take_stats();
        self.nonfinite_total += stats.nonfinite;
        // One agent's streak is the longest; a population reads each (a second read).
        let streaks = if self.feedback.len() == 1 {
            vec![stats.nonfinite_streak]
        } else {
            self.dqn.nonfinite_streaks()
        };
        let diverged = streaks
            .iter()
            .enumerate()
            .filter(|(_, s)| **s >= self.cfg.max_nonfinite)
            .map(|(row, _)| row)
            .collect();
        Health {
            stats,
            streaks,
            diverged,
            nonfinite_total: self.nonfinite_total,
        }
    }

    /// Hands every priority collected so far to replay, waiting for read-backs in
    /// flight: before a checkpoint copies replay, and at the end.
    pub fn finish_priorities(&mut self) {
        for fb in self.feedback.iter_mut().flatten() {
            fb.finish();
        }
    }

    /// The same step for only the agents in `rows` (in that order): a population
    /// drops the agents that ended.
    pub fn keep_agents(&mut self, rows: &[usize]) {
        self.dqn = self.dqn.keep_agents(rows);
        let mut old: Vec<Option<Option<PriorityFeedback>>> = std::mem::take(&mut self.feedback)
            .into_iter()
            .map(Some)
            .collect();
        self.feedback = rows
            .iter()
            .map(|&r| old[r].take().expect("each row kept once"))
            .collect();
    }

    /// Agents joining after the present ones: `admit` makes the networks with them
    /// (see [`Dqn::admit_states`]), `feedback` has one entry per newcomer.
    pub fn admit(
        &mut self,
        admit: impl FnOnce(&Dqn) -> Dqn,
        feedback: Vec<Option<PriorityFeedback>>,
    ) {
        self.dqn = admit(&self.dqn);
        self.feedback.extend(feedback);
        assert_eq!(
            self.feedback.len(),
            self.dqn.spec().population,
            "feedback per agent"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dqn::DqnConfig;
    use millrace_proto::{DType, NetworkSpec, ObsSpec, TransitionBatch};
    use millrace_replay::{RateLimiterConfig, ReplayConfig, SampleScratch, Table};
    use rand::rngs::SmallRng;
    use rand::SeedableRng;
    use std::sync::Arc;
    use tch::{Device, Kind, Tensor};

    fn batch(k: i64, b: i64) -> Batch {
        Batch {
            obs2: Tensor::ones([k, 2 * b, 3], (Kind::Float, Device::Cpu)),
            actions: Tensor::zeros([k, b, 1], (Kind::Int64, Device::Cpu)),
            rewards: Tensor::ones([k, b, 1], (Kind::Float, Device::Cpu)),
            discounts: Tensor::zeros([k, b, 1], (Kind::Float, Device::Cpu)),
            weights: None,
        }
    }

    #[test]
    fn a_population_that_shrinks_mid_round_hands_its_td_errors_over() {
        // Regression: when an agent ended mid-round, the survivor's round held TD
        // errors of two shapes (`[B]` as one of two agents, `[1, B]` alone) and joining
        // them panicked.
        let table = Arc::new(
            Table::new(&ReplayConfig {
                capacity: 64,
                shards: 1,
                obs_row_bytes: 12,
                stack: 1,
                obs_rows_per_item: 2.0,
                limiter: RateLimiterConfig::sample_to_insert_ratio(1.0, 1, 1e9, 1).unwrap(),
                priority: None,
            })
            .unwrap(),
        );
        let mut b = TransitionBatch::with_capacity(12, 16, 32);
        for v in 0..16i64 {
            b.push_f32(&[v as f32; 3], v % 2, 1.0, 0.0, &[v as f32; 3]);
        }
        table.insert(&b).unwrap();
        let mut out = SampleScratch::new(8, 12);
        table
            .sample(&mut SmallRng::seed_from_u64(0), &mut out.buffers())
            .unwrap();
        let obs = ObsSpec {
            shape: vec![3],
            dtype: DType::F32,
        };
        let dqn = Dqn::new(
            NetworkSpec::mlp(&obs, &[8, 8], 2, 2).unwrap(),
            DqnConfig::default(),
            Device::Cpu,
            0,
        );
        let feedback = || {
            let t = Arc::clone(&table);
            Some(PriorityFeedback::new(
                t,
                None,
                4,
                Device::Cpu,
                0,
                f32::INFINITY,
            ))
        };
        let cfg = StepConfig {
            publish_every: 1000,
            max_nonfinite: 1000,
        };
        let mut step = LearnerStep::new(dqn, 0, cfg, vec![feedback(), feedback()], None);
        for _ in 0..2 {
            step.update(&batch(2, 4), &out.keys, &[0, 0], &mut |_, _| {});
        }
        step.keep_agents(&[1]);
        // The survivor's round completes alone: two updates as one of two, two alone.
        for _ in 0..2 {
            step.update(&batch(1, 4), &out.keys[4..], &[0], &mut |_, _| {});
        }
        step.finish_priorities();
        assert_eq!(step.updates(), 4);
    }
}
