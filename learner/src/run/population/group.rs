//! One group of a population: agents that share the update's shapes and pace, trained
//! on one thread as one stacked population. Each round every running agent's actors
//! step (while its replay takes inserts at its ratio), then the learner step runs as
//! long as every running agent has a batch; evaluations, confirmations and budgets are
//! per agent; agents that end leave the stacked update and queued ones take their
//! places.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use millrace_proto::Params;

use super::agent::{evaluate_agent, Agent, Live, Member};
use super::metrics::{AgentSeries, GroupName, PopulationMetrics};

use super::{oom, resume};
use crate::config::{OomSite, RunConfig};
use crate::population_results::{AgentEnd, AgentResult};
use crate::run::RunError;
use millrace_core::dqn::Dqn;
use millrace_core::faults::inject_oom;
use millrace_core::population_staging::PopulationStaging;
use millrace_core::step::LearnerStep;
use millrace_core::update_loop::is_out_of_memory;
use millrace_server::{AgentPorts, ServerHandle};

/// Statistics (and each agent's non-finite check) every this many stacked updates: a
/// fixed point of the sequence, as in lock-step mode.
const STATS_EVERY: u64 = 256;

/// Publishes each running agent's row of the population's parameters to its actors;
/// only to the agents `only` says, if it says.
fn publish(
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

/// The longest a round of updates runs while remote actors fill replay (embedded
/// actors only act between rounds, so their rounds end when replay's ratio says).
const REMOTE_ROUND: std::time::Duration = std::time::Duration::from_millis(20);

/// How long a group with remote actors waits without an update before it says why.
const IDLE_WARNING: std::time::Duration = std::time::Duration::from_secs(10);

/// What one group of agents did.
pub(super) struct Group {
    pub(super) results: Vec<AgentResult>,
    pub(super) updates: u64,
    pub(super) split: [f64; 3],
}

/// Stacked updates before an injected out-of-memory strikes (tests of that path).
const OOM_AFTER: u64 = 50;

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

/// Trains the agents `members` of one group (same update shapes and pace) as one
/// stacked population on this thread and `device`, at most `slots` at once: queued
/// agents take the places of agents that end, until every one has ended.
pub(super) fn train_group(
    run: RunShared<'_>,
    members: Vec<Member>,
    device: tch::Device,
    slots: usize,
) -> Result<Group, RunError> {
    let RunShared {
        cfg,
        budget,
        started,
        stop,
        ports,
        server,
        metrics,
    } = run;
    let env = cfg.env_spec.clone();
    let first = &members[0].cfg;
    let network = first.network_spec()?;
    let batch_size = first.batch_size;
    // What the group's update takes from its agents' settings (the sweep puts agents
    // that differ in these in separate groups).
    let dqn_config = millrace_core::dqn::DqnConfig {
        iqn: first.dqn.iqn,
        ..cfg.dqn.clone()
    };
    // `--copy-stream`: this group's batches go to its GPU on a side stream of its own.
    let copy_stream = match device {
        tch::Device::Cuda(i) if cfg.learner.copy_stream => {
            Some(millrace_core::cuda::CopyStream::new(i)?)
        }
        _ => None,
    };
    // `/livez` watches this group from its first round until it returns, however.
    let name = GroupName::of(&members.iter().map(|m| m.index).collect::<Vec<_>>());
    let stalls = cfg.faults.stall_group && members.iter().any(|m| m.index == 0);
    let _watched = metrics.map(|m| Watched(m, name.clone()));
    let mut queue: VecDeque<Member> = members.into();

    let mut agents: Vec<Agent> = Vec::with_capacity(queue.len());
    let mut running: Vec<usize> = Vec::new();
    let mut step: Option<LearnerStep> = None;
    let step_cfg = cfg.learner.step();
    let oom = cfg.faults.oom.map(|f| (f, OOM_AFTER));
    let (mut acting, mut updating, mut evaluating) = (0.0, 0.0, 0.0);
    let mut population_updates = 0;
    let mut last_save = Instant::now();
    let mut last_update = Instant::now();
    // Agents that ended, whose ports close once their places are taken (so their
    // remote actors find the newcomers open when they come back).
    let mut closing: Vec<usize> = Vec::new();
    let interrupted = 'run: loop {
        let stopping = stop.iter().any(|s| s.load(Ordering::Relaxed));
        // Queued agents take free places (all of them at the start), unless the run is
        // stopping.
        let free = if stopping {
            0
        } else {
            slots.saturating_sub(running.len()).min(queue.len())
        };
        if free > 0 {
            let newcomers: Vec<usize> = (0..free).map(|i| agents.len() + i).collect();
            let mut states = Vec::with_capacity(free);
            let mut feedback = Vec::with_capacity(free);
            for m in queue.drain(..free) {
                let (agent, state) = Agent::new(&m, &network, &cfg.logdir)?;
                states.push((agent.hp, state));
                // The agent's TD errors back into its own replay: priorities
                // (prioritized replay) and poison evicted.
                let table = &agent.live.as_ref().expect("a new agent trains").table;
                feedback.push(Some(crate::replay_flags::feedback(
                    m.cfg.replay.priority.as_ref(),
                    table,
                    device,
                    agent.steps.get(),
                    m.cfg.poison_td(),
                )));
                agents.push(agent);
            }
            match &mut step {
                Some(s) => s.admit(|d| d.admit_states(states), feedback),
                None => {
                    let mut spec = network.clone();
                    spec.population = states.len();
                    let d = Dqn::population_states(spec, dqn_config.clone(), states, device);
                    step = Some(LearnerStep::new(d, 1, step_cfg, feedback, oom));
                }
            }
            let first = running.is_empty() && closing.is_empty() && agents.len() == free;
            running.extend(&newcomers);
            if !first {
                tracing::info!(
                    "agents {:?} take finished agents' places: {} training",
                    newcomers
                        .iter()
                        .map(|&a| agents[a].index)
                        .collect::<Vec<_>>(),
                    running.len()
                );
            }
            let s = step.as_ref().expect("made above");
            publish(
                s.dqn(),
                &running,
                &mut agents,
                s.version(),
                (!first).then_some(&newcomers[..]),
            );
            // Open to remote actors once they have parameters to act with.
            if let Some(ports) = ports {
                for &a in &newcomers {
                    let agent = &mut agents[a];
                    ports.open(agent.index as u32, agent.port(&network));
                }
            }
        }
        // Ended agents' places are taken: their actors may come back for others.
        for a in closing.drain(..) {
            let agent = &mut agents[a];
            if let (Some(ports), Some(server)) = (ports, server) {
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

        let Some(s) = step.as_mut() else {
            break !queue.is_empty();
        };
        if running.is_empty() {
            // Every agent ended, or the run stopped before queued ones started.
            population_updates += s.updates();
            break !queue.is_empty();
        }
        // Batches drawn for an update that did not happen are dropped with the old
        // shape (the replay ratio absorbs one batch per agent).
        let mut staging = match &copy_stream {
            Some(stream) => PopulationStaging::with_copy_stream(
                &env.obs,
                running.len(),
                batch_size,
                device,
                stream,
            )?,
            None => PopulationStaging::new(&env.obs, running.len(), batch_size, device),
        };
        // Rounds until an agent ends.
        loop {
            let stopping = stop.iter().any(|s| s.load(Ordering::Relaxed));
            let due = cfg
                .learner
                .checkpoint_every
                .is_some_and(|every| last_save.elapsed() >= every);
            if stopping || due {
                // Each training agent's state and replay (its priorities in), for
                // `--resume`.
                s.finish_priorities();
                for (row, &a) in running.iter().enumerate() {
                    let saved =
                        agents[a].save(&s.dqn().agent_state(row), &network, &env, s.version());
                    if let Some(m) = metrics {
                        m.checkpoint(agents[a].index, saved.is_ok());
                    }
                    match saved {
                        Ok(()) => {}
                        Err(e) if stopping => return Err(RunError::FinalCheckpoint(e)),
                        // A periodic save that failed is retried at the next.
                        Err(e) => tracing::warn!("agent {}: state not saved: {e}", agents[a].index),
                    }
                }
                last_save = Instant::now();
            }
            if stopping {
                population_updates += s.updates();
                // Remote actors are told first, then inserts they are blocked in end.
                if let Some(server) = server {
                    server.announce(millrace_server::goodbye_for(
                        false,
                        "the learner is stopping",
                    ));
                    for &a in &running {
                        agents[a].live().table.close();
                    }
                }
                break 'run true;
            }
            let updates_before = s.updates();
            let t0 = Instant::now();
            // Each agent's actors step while its replay takes inserts at its ratio
            // (an agent that waits for the others to catch up, as the group waits for
            // a newcomer to fill its replay, acts no further meanwhile).
            for &a in &running {
                let agent = &mut agents[a];
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
            let t1 = Instant::now();
            acting += (t1 - t0).as_secs_f64();
            // Stacked updates, as long as every running agent has a batch (one an agent
            // drew while another could not waits in its slice for the next update).
            loop {
                for (row, &a) in running.iter().enumerate() {
                    let live = agents[a].live();
                    staging
                        .fill(row, &live.table, &mut live.rng)
                        .map_err(|_| RunError::Replay(millrace_replay::ReplayError::Closed))?;
                }
                // Remote actors keep replay filling while the updates run: a round
                // ends after a slice of time, so evaluations and budgets keep up.
                if !staging.all_ready() || (ports.is_some() && t1.elapsed() >= REMOTE_ROUND) {
                    break;
                }
                // The device's part: an allocation failure anywhere in it (the copy, the
                // update, publishing, statistics) ends the group with its agents saved.
                let round = catch_unwind(AssertUnwindSafe(|| {
                    inject_oom(oom, s.updates(), OomSite::Copy);
                    let batch = staging.take(device)?;
                    let env_steps: Vec<u64> =
                        running.iter().map(|&a| agents[a].steps.get()).collect();
                    s.update(&batch, staging.keys(), &env_steps, &mut |version, d| {
                        publish(d, &running, &mut agents, version, None);
                    });
                    drop(batch);
                    if s.updates().is_multiple_of(STATS_EVERY) {
                        let health = s.check();
                        for row in health.diverged {
                            let a = running[row];
                            if agents[a].end.is_none() {
                                tracing::warn!(
                                    "agent {}: {} non-finite updates in a row: stopped, the others go on",
                                    agents[a].index,
                                    health.streaks[row]
                                );
                                agents[a].end = Some((
                                    AgentEnd::Diverged,
                                    agents[a].steps.get(),
                                    started.elapsed().as_secs_f64(),
                                ));
                            }
                        }
                    }
                    Ok::<_, millrace_core::cuda::CopyStreamError>(())
                }));
                if let Ok(Err(e)) = round {
                    return Err(e.into());
                }
                if let Err(panic) = round {
                    let msg = crate::panic_message(&*panic);
                    if !is_out_of_memory(&msg) {
                        std::panic::resume_unwind(panic);
                    }
                    let per_agent = agents[running[0]].live().table.bytes_per_item() as usize
                        * cfg.replay.capacity;
                    let footprint =
                        oom::footprint(cfg, &env, &network, running.len(), per_agent, device);
                    let error = oom::ended(
                        &msg,
                        &footprint,
                        s.dqn(),
                        &running,
                        &agents,
                        (&network, &env, s.version()),
                    );
                    // As when stopping: remote actors are told, then inserts they are
                    // blocked in end (nothing samples these tables any more).
                    if let Some(server) = server {
                        server.announce(millrace_server::goodbye_for(
                            false,
                            "the learner is stopping",
                        ));
                        for &a in &running {
                            agents[a].live().table.close();
                        }
                    }
                    return Err(error);
                }
            }
            let t2 = Instant::now();
            updating += (t2 - t1).as_secs_f64();
            // Evaluations and budgets, agent by agent.
            for &a in &running {
                let agent = &mut agents[a];
                if agent.end.is_some() {
                    continue;
                }
                let steps = agent.steps.get();
                if steps >= agent.next_eval {
                    let every = cfg.eval.every.max(1);
                    agent.next_eval = (steps / every + 1) * every;
                    // Evaluate what the actors act with now.
                    if evaluate_agent(agent, cfg, &network)? {
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
            evaluating += t2.elapsed().as_secs_f64();
            if let Some(m) = metrics {
                m.alive(&name);
            }
            if stalls {
                // Wedged (the fault `stall-group`, a test of `/livez`): no further
                // round until the run stops.
                while !stop.iter().any(|s| s.load(Ordering::Relaxed)) {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            }
            if let Some(m) = metrics.filter(|m| m.due()) {
                m.record(
                    running
                        .iter()
                        .enumerate()
                        .map(|(row, &a)| series(&agents[a], s.dqn(), row)),
                    false,
                );
            }
            if running.iter().any(|&a| agents[a].end.is_some()) {
                break;
            }
            // Remote actors fill replay meanwhile: wait for them rather than spin, and
            // say so when the group waits on agents that no actor serves.
            if let Some(ports) = ports {
                if s.updates() != updates_before {
                    last_update = Instant::now();
                } else {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                    if last_update.elapsed() >= IDLE_WARNING {
                        last_update = Instant::now();
                        tracing::warn!(
                            "no update for {} s: agents {:?} have no actors, and every training agent needs one (start more `actor` processes, or fewer agents at once with --max-concurrent-agents)",
                            IDLE_WARNING.as_secs(),
                            ports.without_actors()
                        );
                    }
                }
            }
        }
        // Finished agents leave the population (their actors and replay freed): the
        // rest go on without their cost, and queued agents take their places.
        let keep: Vec<usize> = (0..running.len())
            .filter(|&row| agents[running[row]].end.is_none())
            .collect();
        let wall = started.elapsed().as_secs_f64();
        for &a in &running {
            let agent = &mut agents[a];
            if agent.end.is_some() {
                if let Some(m) = metrics {
                    let row = running.iter().position(|r| *r == a).expect("running");
                    let (index, mut last) = series(agent, s.dqn(), row);
                    last.training = false;
                    m.record([(index, last)], true);
                }
                closing.push(a);
                let result = agent.result(wall);
                agent.board(|b| b.end(&result));
                resume::write_result(&agent.dir, &result).map_err(RunError::Config)?;
            }
        }
        running = keep.iter().map(|&r| running[r]).collect();
        let mut s = step.take().expect("a population trains");
        if running.is_empty() && queue.is_empty() {
            // The last agents ended: close their ports (at the loop's top), then stop.
            population_updates += s.updates();
            continue;
        }
        s.keep_agents(&keep);
        step = Some(s);
        if queue.is_empty() {
            tracing::info!("{} agent(s) still training", running.len());
        }
    };
    let wall = started.elapsed().as_secs_f64();
    let mut results: Vec<AgentResult> = agents.iter().map(|a| a.result(wall)).collect();
    // Queued agents the run stopped before.
    results.extend(queue.iter().map(Member::not_started));
    debug_assert!(interrupted || results.iter().all(|a| a.end != AgentEnd::Interrupted));
    Ok(Group {
        results,
        updates: population_updates,
        split: [acting, updating, evaluating],
    })
}

/// A group `/livez` watches; no longer once dropped.
struct Watched<'a>(&'a PopulationMetrics, GroupName);

impl Drop for Watched<'_> {
    fn drop(&mut self) {
        self.0.finished(&self.1);
    }
}

/// Agent `agent`'s numbers for the metrics page, as row `row` of `dqn`.
fn series(agent: &Agent, dqn: &Dqn, row: usize) -> (usize, AgentSeries) {
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
