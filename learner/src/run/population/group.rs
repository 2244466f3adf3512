//! One group of a population: agents that share the update's shapes and pace, trained
//! on one thread as one stacked population. Agents are admitted into free places, each
//! round every running agent's actors step, the learner step runs as long as every
//! running agent has a batch, and agents are evaluated ([`super::round`]); agents that
//! end are retired from the stacked update and queued ones take their places.
//!
//! [`Group::train`] is the loop; each of its steps is a method of its own, over the
//! state the group keeps between them.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use millrace_core::cuda::CopyStream;
use millrace_core::dqn::{Dqn, DqnConfig};
use millrace_core::faults::OomFault;
use millrace_core::step::{LearnerStep, StepConfig};
use millrace_proto::{EnvSpec, NetworkSpec, Params};
use millrace_server::{AgentPorts, ServerHandle};

use super::agent::{Agent, Member};
use super::metrics::{AgentSeries, GroupName, PopulationMetrics};
use super::resume;
use crate::config::RunConfig;
use crate::population_results::{AgentEnd, AgentResult};
use crate::run::RunError;

/// Stacked updates before an injected out-of-memory strikes (tests of that path).
const OOM_AFTER: u64 = 50;

/// What one group of agents did.
pub(super) struct GroupOutcome {
    pub(super) results: Vec<AgentResult>,
    pub(super) updates: u64,
    /// Seconds acting, updating and evaluating.
    pub(super) split: [f64; 3],
}

impl GroupOutcome {
    /// A group the run stopped before it started: its agents wait for `--resume`.
    pub(super) fn not_started(members: &[Member]) -> Self {
        Self {
            results: members.iter().map(Member::not_started).collect(),
            updates: 0,
            split: [0.0; 3],
        }
    }
}

/// What every group of a run shares.
#[derive(Clone, Copy)]
pub(super) struct RunShared<'a> {
    pub(super) cfg: &'a RunConfig,
    /// Each agent's env step budget.
    pub(super) budget: u64,
    pub(super) started: Instant,
    /// An interrupt, and another thread's failure.
    pub(super) stop: [&'a AtomicBool; 2],
    /// Remote actors' agents, and the server (`--listen`).
    pub(super) ports: Option<&'a AgentPorts>,
    pub(super) server: Option<&'a ServerHandle>,
    /// The `--metrics-addr` page's per-agent series.
    pub(super) metrics: Option<&'a PopulationMetrics>,
}

impl RunShared<'_> {
    /// An interrupt, or another thread failed.
    pub(super) fn stopping(&self) -> bool {
        self.stop.iter().any(|s| s.load(Ordering::Relaxed))
    }
}

/// One group on its thread and device: its agents (every one admitted so far, by
/// index), which of them train now (`running`, row by row of the stacked update), the
/// queue, and the stacked learner step.
pub(super) struct Group<'a> {
    pub(super) run: RunShared<'a>,
    pub(super) env: EnvSpec,
    pub(super) network: NetworkSpec,
    pub(super) batch_size: usize,
    pub(super) device: tch::Device,
    /// `--copy-stream`: this group's batches go to its GPU on a side stream of its own.
    pub(super) copy_stream: Option<std::sync::Arc<CopyStream>>,
    /// The most agents that train at once.
    slots: usize,
    /// What the group's update takes from its agents' settings (the sweep puts agents
    /// that differ in these in separate groups).
    dqn_config: DqnConfig,
    step_cfg: StepConfig,
    pub(super) oom: Option<(OomFault, u64)>,
    pub(super) name: GroupName,
    /// The fault `stall-group`: this group wedges after its first round.
    pub(super) stalls: bool,
    queue: VecDeque<Member>,
    pub(super) agents: Vec<Agent>,
    pub(super) running: Vec<usize>,
    pub(super) step: Option<LearnerStep>,
    /// Agents that ended, whose ports close once their places are taken (so their
    /// remote actors find the newcomers open when they come back).
    closing: Vec<usize>,
    /// Stacked updates of the steps retired so far.
    updates: u64,
    /// Seconds acting, updating and evaluating.
    pub(super) split: [f64; 3],
    pub(super) last_save: Instant,
    pub(super) last_update: Instant,
}

/// Why [`Group::rounds`] returned.
pub(super) enum RoundsEnd {
    /// An agent ended: retire it.
    AgentEnded,
    /// The run is stopping (its agents saved).
    Stopped,
}

impl<'a> Group<'a> {
    /// A group of `members` (same update shapes and pace) on `device`, at most `slots`
    /// training at once.
    pub(super) fn new(
        run: RunShared<'a>,
        members: Vec<Member>,
        device: tch::Device,
        slots: usize,
    ) -> Result<Self, RunError> {
        let cfg = run.cfg;
        let first = &members[0].cfg;
        let copy_stream = match device {
            tch::Device::Cuda(i) if cfg.learner.copy_stream => Some(CopyStream::new(i)?),
            _ => None,
        };
        Ok(Self {
            run,
            env: cfg.env_spec.clone(),
            network: first.network_spec()?,
            batch_size: first.batch_size,
            device,
            copy_stream,
            slots,
            dqn_config: DqnConfig {
                iqn: first.dqn.iqn,
                ..cfg.dqn.clone()
            },
            step_cfg: cfg.learner.step(),
            oom: cfg.faults.oom.map(|f| (f, OOM_AFTER)),
            name: GroupName::of(&members.iter().map(|m| m.index).collect::<Vec<_>>()),
            stalls: cfg.faults.stall_group && members.iter().any(|m| m.index == 0),
            agents: Vec::with_capacity(members.len()),
            queue: members.into(),
            running: Vec::new(),
            step: None,
            closing: Vec::new(),
            updates: 0,
            split: [0.0; 3],
            last_save: Instant::now(),
            last_update: Instant::now(),
        })
    }

    /// Trains every agent of the group until each has ended or the run stops: agents
    /// are admitted, rounds run until one ends, it is retired, and so on.
    pub(super) fn train(mut self) -> Result<GroupOutcome, RunError> {
        // `/livez` watches this group from its first round until it returns, however.
        let _watched = self.run.metrics.map(|m| Watched(m, self.name.clone()));
        let interrupted = loop {
            if !self.run.stopping() {
                self.admit()?;
            }
            self.close_ended();
            let Some(step) = &self.step else {
                break !self.queue.is_empty();
            };
            if self.running.is_empty() {
                // Every agent ended, or the run stopped before queued ones started.
                self.updates += step.updates();
                break !self.queue.is_empty();
            }
            match self.rounds()? {
                RoundsEnd::Stopped => break true,
                RoundsEnd::AgentEnded => self.retire()?,
            }
        };
        Ok(self.outcome(interrupted))
    }

    /// Queued agents take the free places (all of them at the start): each one's
    /// state joins the stacked update, its actors get its parameters, and its port
    /// opens to remote actors.
    fn admit(&mut self) -> Result<(), RunError> {
        let free = self
            .slots
            .saturating_sub(self.running.len())
            .min(self.queue.len());
        if free == 0 {
            return Ok(());
        }
        let newcomers: Vec<usize> = (0..free).map(|i| self.agents.len() + i).collect();
        let mut states = Vec::with_capacity(free);
        let mut feedback = Vec::with_capacity(free);
        for m in self.queue.drain(..free) {
            let (agent, state) = Agent::new(&m, &self.network, &self.run.cfg.logdir)?;
            states.push((agent.hp, state));
            // The agent's TD errors back into its own replay: priorities (prioritized
            // replay) and poison evicted.
            let table = &agent.live.as_ref().expect("a new agent trains").table;
            feedback.push(Some(crate::replay_flags::feedback(
                m.cfg.replay.priority.as_ref(),
                table,
                self.device,
                agent.steps.get(),
                m.cfg.poison_td(),
            )));
            self.agents.push(agent);
        }
        match &mut self.step {
            Some(s) => s.admit(|d| d.admit_states(states), feedback),
            None => {
                let mut spec = self.network.clone();
                spec.population = states.len();
                let d = Dqn::population_states(spec, self.dqn_config.clone(), states, self.device);
                self.step = Some(LearnerStep::new(d, 1, self.step_cfg, feedback, self.oom));
            }
        }
        let first = self.running.is_empty() && self.closing.is_empty() && self.agents.len() == free;
        self.running.extend(&newcomers);
        if !first {
            tracing::info!(
                "agents {:?} take finished agents' places: {} training",
                newcomers
                    .iter()
                    .map(|&a| self.agents[a].index)
                    .collect::<Vec<_>>(),
                self.running.len()
            );
        }
        let s = self.step.as_ref().expect("made above");
        publish(
            s.dqn(),
            &self.running,
            &mut self.agents,
            s.version(),
            (!first).then_some(&newcomers[..]),
        );
        // Open to remote actors once they have parameters to act with.
        if let Some(ports) = self.run.ports {
            for &a in &newcomers {
                let agent = &mut self.agents[a];
                ports.open(agent.index as u32, agent.port(&self.network));
            }
        }
        Ok(())
    }

    /// Ended agents' places are taken: their ports close (their actors may come back
    /// for others) and their actors and replay are freed.
    fn close_ended(&mut self) {
        for a in self.closing.drain(..) {
            let agent = &mut self.agents[a];
            if let (Some(ports), Some(server)) = (self.run.ports, self.run.server) {
                // After the last agent, the run's goodbye is its actors'; then an
                // insert one is blocked in returns.
                if ports.close(agent.index as u32) {
                    server.announce(millrace_server::goodbye_for(
                        true,
                        "the population finished",
                    ));
                }
                agent.live().table.close();
            }
            agent.live = None;
        }
    }

    /// Finished agents leave the population (their actors and replay freed once
    /// their places are taken): their results are written, the rest go on without
    /// their cost, and queued agents take their places.
    fn retire(&mut self) -> Result<(), RunError> {
        let mut s = self.step.take().expect("a population trains");
        let keep: Vec<usize> = (0..self.running.len())
            .filter(|&row| self.agents[self.running[row]].end.is_none())
            .collect();
        let wall = self.run.started.elapsed().as_secs_f64();
        for (row, &a) in self.running.iter().enumerate() {
            let agent = &mut self.agents[a];
            if agent.end.is_none() {
                continue;
            }
            if let Some(m) = self.run.metrics {
                let (index, mut last) = series(agent, s.dqn(), row);
                last.training = false;
                m.record([(index, last)], true);
            }
            self.closing.push(a);
            let result = agent.result(wall);
            agent.board(|b| b.end(&result));
            resume::write_result(&agent.dir, &result).map_err(RunError::Config)?;
        }
        self.running = keep.iter().map(|&r| self.running[r]).collect();
        if self.running.is_empty() && self.queue.is_empty() {
            // The last agents ended: their ports close at the loop's top, then it stops.
            self.updates += s.updates();
            return Ok(());
        }
        s.keep_agents(&keep);
        self.step = Some(s);
        if self.queue.is_empty() {
            tracing::info!("{} agent(s) still training", self.running.len());
        }
        Ok(())
    }

    /// Every agent's result, and queued ones the run stopped before.
    fn outcome(self, interrupted: bool) -> GroupOutcome {
        let wall = self.run.started.elapsed().as_secs_f64();
        let mut results: Vec<AgentResult> = self.agents.iter().map(|a| a.result(wall)).collect();
        results.extend(self.queue.iter().map(Member::not_started));
        debug_assert!(interrupted || results.iter().all(|a| a.end != AgentEnd::Interrupted));
        GroupOutcome {
            results,
            updates: self.updates,
            split: self.split,
        }
    }

    /// Adds the current step's updates to the group's count (it is retired next).
    pub(super) fn count_updates(&mut self) {
        if let Some(s) = &self.step {
            self.updates += s.updates();
        }
    }

    /// Remote actors are told the learner is stopping, then inserts they are blocked
    /// in end (nothing samples these agents' tables any more).
    pub(super) fn say_goodbye(&mut self) {
        if let Some(server) = self.run.server {
            server.announce(millrace_server::goodbye_for(
                false,
                "the learner is stopping",
            ));
            for &a in &self.running {
                self.agents[a].live().table.close();
            }
        }
    }
}

/// Publishes each running agent's row of the population's parameters to its actors;
/// only to the agents `only` says, if it says.
pub(super) fn publish(
    dqn: &Dqn,
    running: &[usize],
    agents: &mut [Agent],
    version: u64,
    only: Option<&[usize]>,
) {
    let data = dqn.online_params();
    let p = data.len() / running.len().max(1);
    for (row, &a) in running.iter().enumerate() {
        if only.is_some_and(|o| !o.contains(&a)) {
            continue;
        }
        let agent = &mut agents[a];
        let env_steps = agent.steps.get();
        agent.live().params.publish(Params {
            version,
            env_steps,
            updates: dqn.updates(),
            population: 1,
            data: data[row * p..(row + 1) * p].to_vec(),
        });
    }
}

/// A group `/livez` watches; no longer once dropped.
struct Watched<'a>(&'a PopulationMetrics, GroupName);

impl Drop for Watched<'_> {
    fn drop(&mut self) {
        self.0.finished(&self.1);
    }
}

/// Agent `agent`'s numbers for the metrics page, as row `row` of `dqn`.
pub(super) fn series(agent: &Agent, dqn: &Dqn, row: usize) -> (usize, AgentSeries) {
    let replay = agent.live.as_ref().map(|l| l.table.stats());
    (
        agent.index,
        AgentSeries {
            env_steps: agent.steps.get(),
            updates: dqn.agent_updates(row),
            episode_return: agent.returns.figure().map_or(f64::NAN, f64::from),
            eval_return: agent
                .tracker
                .last
                .as_ref()
                .map_or(f64::NAN, |r| f64::from(r.mean)),
            learning_rate: dqn.agent_learning_rate(row),
            replay_size: replay.as_ref().map_or(0, |r| r.size as u64),
            clamped_priorities: replay.as_ref().map_or(0, |r| r.clamped_priorities),
            training: agent.end.is_none(),
        },
    )
}
