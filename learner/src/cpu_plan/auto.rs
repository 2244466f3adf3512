//! `--actors auto`: as many actor threads as the learner's consumption needs and the
//! plan's actor CPUs allow. The learner consumes `updates/s × batch ÷ samples per
//! insert` env transitions per second; one actor thread produces its measured env
//! steps/s; the count covers the consumption with [`HEADROOM`] to spare (actors
//! slow each other through shared caches and the replay's locks), at least one, at
//! most the actor CPUs' budget ([`super::CpuPlan::actor_budget`]).

use serde::Serialize;

/// How much more than the learner's consumption the actors are sized for.
pub const HEADROOM: f64 = 1.25;

/// What `--actors auto` decided, and from what (kept in `config.json`).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AutoActors {
    /// Asked for; decided at start (run::actors_auto).
    Pending,
    Chosen(AutoChoice),
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AutoChoice {
    /// The learner's measured ceiling, updates/s (a scratch copy of the networks on
    /// the run's device, on the learner's CPU).
    pub learner_updates_per_s: f64,
    /// Env transitions per second that consumes: updates/s × batch ÷ samples per insert.
    pub consumption: f64,
    /// One actor thread's measured env steps/s (on an actor CPU, with its policy).
    pub actor_steps_per_s: f64,
    /// Actor threads the consumption needs, with the headroom.
    pub needed: usize,
    /// Actor CPUs the plan leaves.
    pub budget: usize,
    pub threads: usize,
}

impl AutoChoice {
    pub fn new(
        learner_updates_per_s: f64,
        batch: usize,
        samples_per_insert: f64,
        actor_steps_per_s: f64,
        budget: usize,
    ) -> Self {
        let consumption = learner_updates_per_s * batch as f64 / samples_per_insert;
        let needed = if actor_steps_per_s > 0.0 && consumption.is_finite() {
            (HEADROOM * consumption / actor_steps_per_s).ceil().max(1.0) as usize
        } else {
            budget
        };
        Self {
            learner_updates_per_s,
            consumption,
            actor_steps_per_s,
            needed,
            budget,
            threads: needed.clamp(1, budget.max(1)),
        }
    }

    /// One line for the log: what it chose and why.
    pub fn explain(&self) -> String {
        let limit = if self.needed > self.budget {
            format!(
                "; the CPU plan leaves {} CPU(s) for actors, so {} (the learner will wait for data)",
                self.budget, self.threads
            )
        } else {
            String::new()
        };
        format!(
            "--actors auto: {} actor thread(s). The learner's ceiling, {:.0} updates/s, consumes {:.0} env steps/s; one actor thread steps {:.0}/s here, so {} cover it with {:.0}% to spare{limit}",
            self.threads,
            self.learner_updates_per_s,
            self.consumption,
            self.actor_steps_per_s,
            self.needed,
            100.0 * (HEADROOM - 1.0),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covers_the_consumption_with_headroom_within_the_budget() {
        // 400 updates/s × 32 ÷ 8 = 1,600 steps/s; 500 per actor → 1.25 × 3.2 = 4.
        let c = AutoChoice::new(400.0, 32, 8.0, 500.0, 12);
        assert_eq!((c.consumption, c.needed, c.threads), (1600.0, 4, 4));
        // The same on a machine with 2 actor CPUs.
        let c = AutoChoice::new(400.0, 32, 8.0, 500.0, 2);
        assert_eq!((c.needed, c.threads), (4, 2));
        assert!(c.explain().contains("leaves 2 CPU(s)"), "{}", c.explain());
        // A learner that needs little still gets one actor.
        assert_eq!(AutoChoice::new(1.0, 32, 256.0, 5000.0, 8).threads, 1);
        // No measurement of the actor: the whole budget.
        assert_eq!(AutoChoice::new(400.0, 32, 8.0, 0.0, 6).threads, 6);
    }
}
