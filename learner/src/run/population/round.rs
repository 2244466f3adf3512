//! A group's rounds ([`Group::rounds`]): each round every running agent's actors step
//! while its replay takes inserts at its ratio ([`Group::act`]), then stacked updates
//! run as long as every running agent has a batch ([`Group::update_round`]), then
//! evaluations and budgets, agent by agent ([`Group::evaluate`]). Rounds go on until
//! an agent ends or the run stops; checkpoints are written between them.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use millrace_core::faults::inject_oom;
use millrace_core::population_staging::PopulationStaging;
use millrace_core::update_loop::is_out_of_memory;

use super::agent::{evaluate_agent, Live};
use super::group::{publish, series, Group, RoundsEnd};
use super::oom;
use crate::config::OomSite;
use crate::population_results::AgentEnd;
use crate::run::RunError;

/// Statistics (and each agent's non-finite check) every this many stacked updates: a
/// fixed point of the sequence, as in lock-step mode.
const STATS_EVERY: u64 = 256;

/// The longest a round of updates runs while remote actors fill replay (embedded
/// actors only act between rounds, so their rounds end when replay's ratio says).
const REMOTE_ROUND: Duration = Duration::from_millis(20);

/// How long a group with remote actors waits without an update before it says why.
const IDLE_WARNING: Duration = Duration::from_secs(10);

impl Group<'_> {
    /// Rounds until an agent ends or the run stops (then every training agent's state
    /// is saved and remote actors are told).
    pub(super) fn rounds(&mut self) -> Result<RoundsEnd, RunError> {
        // Batches drawn for an update that did not happen are dropped with the old
        // shape (the replay ratio absorbs one batch per agent).
        let mut staging = match &self.copy_stream {
            Some(stream) => PopulationStaging::with_copy_stream(
                &self.env.obs,
                self.running.len(),
                self.batch_size,
                self.device,
                stream,
            )?,
            None => PopulationStaging::new(
                &self.env.obs,
                self.running.len(),
                self.batch_size,
                self.device,
            ),
        };
        loop {
            let stopping = self.run.stopping();
            let due = self
                .run
                .cfg
                .learner
                .checkpoint_every
                .is_some_and(|every| self.last_save.elapsed() >= every);
            if stopping || due {
                self.save(stopping)?;
            }
            if stopping {
                self.count_updates();
                self.say_goodbye();
                return Ok(RoundsEnd::Stopped);
            }
            let updates_before = self.step().updates();
            let t0 = Instant::now();
            self.act()?;
            let t1 = Instant::now();
            self.split[0] += (t1 - t0).as_secs_f64();
            self.update_round(&mut staging, t1)?;
            let t2 = Instant::now();
            self.split[1] += (t2 - t1).as_secs_f64();
            self.evaluate()?;
            self.split[2] += t2.elapsed().as_secs_f64();
            self.report();
            if self.running.iter().any(|&a| self.agents[a].end.is_some()) {
                return Ok(RoundsEnd::AgentEnded);
            }
            self.wait_for_remote_actors(updates_before);
        }
    }

    fn step(&self) -> &millrace_core::step::LearnerStep {
        self.step.as_ref().expect("a training group has a step")
    }

    /// Each training agent's state and replay (its priorities in), for `--resume`.
    /// A periodic save that fails is retried at the next; the last one's failure is
    /// the run's.
    fn save(&mut self, stopping: bool) -> Result<(), RunError> {
        let s = self.step.as_mut().expect("a training group has a step");
        s.finish_priorities();
        for (row, &a) in self.running.iter().enumerate() {
            let agent = &self.agents[a];
            let saved = agent.save(
                &s.dqn().agent_state(row),
                &self.network,
                &self.env,
                s.version(),
            );
            if let Some(m) = self.run.metrics {
                m.checkpoint(agent.index, saved.is_ok());
            }
            match saved {
                Ok(()) => {}
                Err(e) if stopping => return Err(RunError::FinalCheckpoint(e)),
                Err(e) => tracing::warn!("agent {}: state not saved: {e}", agent.index),
            }
        }
        self.last_save = Instant::now();
        Ok(())
    }

    /// Each agent's actors step while its replay takes inserts at its ratio (an agent
    /// that waits for the others to catch up, as the group waits for a newcomer to
    /// fill its replay, acts no further meanwhile).
    pub(super) fn act(&mut self) -> Result<(), RunError> {
        for &a in &self.running {
            let agent = &mut self.agents[a];
            let Live {
                actors,
                params,
                table,
                ..
            } = agent
                .live
                .as_mut()
                .expect("a training agent keeps its actors and replay");
            if !table.can_insert() {
                continue;
            }
            for actor in actors.iter_mut() {
                let returns = &mut agent.returns;
                let batch = actor.step(params, &agent.steps, &mut |e| {
                    returns.push(e.actor_id, e.episode_return);
                })?;
                if let Some(batch) = batch {
                    table.insert_unlimited(batch)?;
                }
            }
        }
        Ok(())
    }

    /// Stacked updates, as long as every running agent has a batch (one an agent drew
    /// while another could not waits in its slice for the next update); with remote
    /// actors, for at most [`REMOTE_ROUND`] after `acted`. An allocation failure
    /// anywhere in the device's part (the copy, the update, publishing, statistics)
    /// ends the group with its agents saved.
    pub(super) fn update_round(
        &mut self,
        staging: &mut PopulationStaging,
        acted: Instant,
    ) -> Result<(), RunError> {
        loop {
            for (row, &a) in self.running.iter().enumerate() {
                let live = self.agents[a].live();
                staging
                    .fill(row, &live.table, &mut live.rng)
                    .map_err(|_| RunError::Replay(millrace_replay::ReplayError::Closed))?;
            }
            // Remote actors keep replay filling while the updates run: a round ends
            // after a slice of time, so evaluations and budgets keep up.
            let sliced = self.run.ports.is_some() && acted.elapsed() >= REMOTE_ROUND;
            if !staging.all_ready() || sliced {
                return Ok(());
            }
            let round = catch_unwind(AssertUnwindSafe(|| self.update_once(staging)));
            match round {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e.into()),
                Err(panic) => {
                    let msg = crate::panic_message(&*panic);
                    if !is_out_of_memory(&msg) {
                        std::panic::resume_unwind(panic);
                    }
                    return Err(self.out_of_memory(&msg));
                }
            }
        }
    }

    /// One stacked update of the staged batches; statistics and each agent's
    /// non-finite check every [`STATS_EVERY`] updates.
    fn update_once(
        &mut self,
        staging: &mut PopulationStaging,
    ) -> Result<(), millrace_core::cuda::CopyStreamError> {
        let Self {
            step,
            agents,
            running,
            device,
            oom,
            run,
            ..
        } = self;
        let s = step.as_mut().expect("a training group has a step");
        inject_oom(*oom, s.updates(), OomSite::Copy);
        let batch = staging.take(*device)?;
        let env_steps: Vec<u64> = running.iter().map(|&a| agents[a].steps.get()).collect();
        s.update(&batch, staging.keys(), &env_steps, &mut |version, d| {
            publish(d, running, agents, version, None);
        });
        drop(batch);
        if s.updates().is_multiple_of(STATS_EVERY) {
            let health = s.check();
            for row in health.diverged {
                let agent = &mut agents[running[row]];
                if agent.end.is_none() {
                    tracing::warn!(
                        "agent {}: {} non-finite updates in a row: stopped, the others go on",
                        agent.index,
                        health.streaks[row]
                    );
                    agent.end = Some((
                        AgentEnd::Diverged,
                        agent.steps.get(),
                        run.started.elapsed().as_secs_f64(),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The group ran out of device memory: every training agent's state saved where
    /// the device still allows it, remote actors told, and the error that says what
    /// to change.
    fn out_of_memory(&mut self, msg: &str) -> RunError {
        let cfg = self.run.cfg;
        let per_agent = self.agents[self.running[0]].live().table.bytes_per_item() as usize
            * cfg.replay.capacity;
        let footprint = oom::footprint(
            cfg,
            &self.env,
            &self.network,
            self.running.len(),
            per_agent,
            self.device,
        );
        let s = self.step();
        let error = oom::ended(
            msg,
            &footprint,
            s.dqn(),
            &self.running,
            &self.agents,
            (&self.network, &self.env, s.version()),
        );
        self.say_goodbye();
        error
    }

    /// Evaluations and budgets, agent by agent: an agent that solves or spends its
    /// env steps ends.
    pub(super) fn evaluate(&mut self) -> Result<(), RunError> {
        let (cfg, budget, started) = (self.run.cfg, self.run.budget, self.run.started);
        for &a in &self.running {
            let agent = &mut self.agents[a];
            if agent.end.is_some() {
                continue;
            }
            let steps = agent.steps.get();
            if steps >= agent.next_eval {
                let every = cfg.eval.every.max(1);
                agent.next_eval = (steps / every + 1) * every;
                // Evaluate what the actors act with now.
                if evaluate_agent(agent, cfg, &self.network)? {
                    let at = agent
                        .tracker
                        .solved
                        .as_ref()
                        .map_or(steps, |s| s.params.env_steps);
                    tracing::info!("agent {}: solved at {at} env steps", agent.index);
                    agent.end = Some((AgentEnd::Solved, at, started.elapsed().as_secs_f64()));
                    continue;
                }
            }
            if steps >= budget {
                agent.end = Some((AgentEnd::Budget, steps, started.elapsed().as_secs_f64()));
            }
        }
        Ok(())
    }

    /// A sign of life for `/livez`, the metrics page's series when due, and the fault
    /// `stall-group`.
    fn report(&self) {
        if let Some(m) = self.run.metrics {
            m.alive(&self.name);
        }
        if self.stalls {
            // Wedged (the fault `stall-group`, a test of `/livez`): no further round
            // until the run stops.
            while !self.run.stopping() {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        if let Some(m) = self.run.metrics.filter(|m| m.due()) {
            let dqn = self.step().dqn();
            m.record(
                self.running
                    .iter()
                    .enumerate()
                    .map(|(row, &a)| series(&self.agents[a], dqn, row)),
                false,
            );
        }
    }

    /// Remote actors fill replay meanwhile: waits for them rather than spin, and says
    /// so when the group waits on agents that no actor serves.
    fn wait_for_remote_actors(&mut self, updates_before: u64) {
        let Some(ports) = self.run.ports else {
            return;
        };
        if self.step().updates() != updates_before {
            self.last_update = Instant::now();
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
        if self.last_update.elapsed() >= IDLE_WARNING {
            self.last_update = Instant::now();
            tracing::warn!(
                "no update for {} s: agents {:?} have no actors, and every training agent needs one (start more `actor` processes, or fewer agents at once with --max-concurrent-agents)",
                IDLE_WARNING.as_secs(),
                ports.without_actors()
            );
        }
    }
}
