//! Population mode (`--population K`, `--sweep FILE`): agents each with their own
//! seed, settings, parameters, target network, optimizer state, replay, actors,
//! exploration and evaluation ([`agent`]), trained by stacked updates
//! ([`millrace_core::dqn`]).
//!
//! Agents that share the update's shapes and pace form a group; each thread (one per
//! core, or per `--gpu` device) takes its share of every group, group after group, and
//! trains it as one population, at most its share of `--max-concurrent-agents` at once:
//! queued agents take the places of agents that end. Within a group one thread drives
//! everything in a fixed order, like the lock-step mode. Each round, every running
//! agent's actors step their environments (while its replay takes inserts at its
//! ratio) and hand full batches to the agent's own replay; then the stacked update runs
//! as long as every running agent's replay ratio allows a batch (a batch an agent drew
//! while another could not waits for the next update); evaluations, confirmations and
//! budgets are per agent. So the same seed, flags, sweep, thread count and number of
//! agents at once give bit-identical results on the same machine (remote actors,
//! `--listen`, feed replay as they come, and do not). An agent that reaches its target
//! (confirmed on fresh episodes), spends its step budget, or whose loss diverges ends:
//! its actors stop, and the population is rebuilt without it, so ended agents stop
//! costing compute. Each agent keeps its `best/` and `solved/` policies under
//! `agents/agent-NNN/checkpoint` in the log directory (`learner eval --agent` and
//! `export --agent` read them), its state in `checkpoint/latest/` when the run stops
//! ([`resume`]), and the results table is printed and written as
//! `population.csv`.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

mod agent;
mod group;
mod metrics;
mod oom;
mod resume;
mod round;

pub(super) use agent::{agents, Member};
use group::{Group, GroupOutcome, RunShared};
pub(super) use metrics::PopulationMetrics;

use super::RunError;
use crate::config::{PopulationMode, RunConfig};
use crate::cpu_plan::host::{self, Role};
use crate::population_board;
use crate::population_results::{AgentEnd, AgentResult, AgentSetup, PopulationSummary};
use crate::shard::Shard;
use crate::sweep::{GroupKey, Settings};
use millrace_proto::EnvSpec;
use millrace_server::{AgentPorts, Routes, ServerContext, ServerHandle};
use resume::Saved;

/// Trains the population `cfg` describes (this shard's share of it, with `--shard`),
/// resuming it with `--resume`, until every agent has ended or `interrupt` is raised.
pub fn run(
    cfg: &RunConfig,
    interrupt: &AtomicBool,
    metrics: Option<&PopulationMetrics>,
) -> Result<PopulationSummary, RunError> {
    let started = Instant::now();
    super::setup::check_copy_stream(cfg)?;
    let mode = cfg
        .population()
        .expect("population mode runs a population's configuration");
    let env = cfg.env_spec.clone();
    let (members, budget) = agents(cfg)?;
    let total = members.len();
    let (members, places, plan) = this_shard(mode, members);
    let mine = members.len();
    let (members, ended) = resumed(cfg, &env, members)?;
    let k = members.len();
    let mut summary = PopulationSummary {
        env: env.id.clone(),
        agents: ended,
        wall_s: 0.0,
        updates: 0,
        target: cfg.eval.target_return,
        split: [0.0; 3],
        groups: 0,
        threads: 0,
        concurrent: 0,
        total_agents: total,
        shard: mode.shard,
        plan,
    };
    if k == 0 {
        return nothing_left(cfg, summary, started);
    }
    let concurrent = at_once(cfg, &env, &members, places)?;
    // Threads, each a stacked update of its own: one per core on the CPU unless
    // `--population-threads` says (more intra-op threads on one update cost more in
    // synchronisation than they save at these sizes), one per GPU (`--gpu 0,1`).
    let devices: Vec<tch::Device> = mode.devices.iter().map(|d| d.device()).collect();
    let threads = mode.group_threads(cfg.device).clamp(1, concurrent);
    // The CPU plan was made for `group_threads`; memory may allow fewer at once.
    let cpu_plan = if cfg.cpu_plan.pins() && cfg.cpu_plan.learner.len() != threads {
        crate::cpu_plan::plan(&host::machine(), threads)
    } else {
        cfg.cpu_plan.clone()
    };
    tracing::info!("{cpu_plan}");
    // This thread and what it starts (the server) run on the service CPUs.
    let _on_service_cpus = host::enter_for_now(&cpu_plan, Role::Service);
    tch::set_num_threads(1);
    // Groups: agents that share the update's shapes and pace, in the order the sweep
    // first names them. Each thread takes its share of every group, group after group,
    // so the plan (and with it every result) depends only on the sweep and the thread
    // count.
    let groups = groups(members);
    hparams_experiment(cfg, &env, &groups);
    for (key, group) in &groups {
        tracing::info!("group: {} agents, {key}", group.len());
    }
    summary.groups = groups.len();
    let plans = plans(groups, threads);
    tracing::info!(
        "population of {k} on {}: {} actor(s) x {} envs each; {} group(s) on {threads} thread(s), up to {concurrent} agents at once",
        env.id,
        cfg.actors.count,
        cfg.actors.envs_per_actor,
        summary.groups
    );
    // Remote actors (`--listen`): each serves an agent that trains, assigned at its
    // handshake.
    let ports = Arc::new(AgentPorts::new(k, total));
    let server = start_server(cfg, &env, &plans, &ports)?;
    if let Some(m) = metrics {
        m.record([], true);
        m.ready();
    }
    let threads_of = Threads {
        cfg,
        budget,
        started,
        interrupt,
        ports: server.as_ref().map(|_| &*ports),
        server: server.as_ref(),
        metrics,
        slots: concurrent,
        devices: &devices,
        cpu_plan: &cpu_plan,
    };
    let outcomes = threads_of.train(plans);
    if let Some(server) = server {
        say_goodbye(server, &outcomes);
    }
    for outcome in outcomes {
        summary.add(outcome?);
    }
    summary.agents.sort_by_key(|r| r.agent);
    debug_assert_eq!(summary.agents.len(), mine);
    if summary
        .agents
        .iter()
        .any(|r| r.end == AgentEnd::Interrupted)
    {
        tracing::warn!(
            "stopped: each training agent's state is saved; continue the sweep with --resume {} and the same flags",
            cfg.logdir.display()
        );
    }
    summary.wall_s = started.elapsed().as_secs_f64();
    summary.threads = threads;
    summary.concurrent = concurrent;
    write_results(&summary, &cfg.logdir)?;
    Ok(summary)
}

/// Every agent of this population (or shard) had ended: the summary of a resubmitted
/// task whose shard had ended keeps the run's own figures.
fn nothing_left(
    cfg: &RunConfig,
    mut summary: PopulationSummary,
    started: Instant,
) -> Result<PopulationSummary, RunError> {
    tracing::info!("every agent of this population has ended: nothing to train");
    if let Some(before) = PopulationSummary::read(&cfg.logdir.join("population.json"))
        .ok()
        .filter(|s| s.shard == summary.shard && s.plan == summary.plan)
    {
        summary.wall_s = before.wall_s;
        summary.updates = before.updates;
        summary.split = before.split;
        summary.groups = before.groups;
        summary.threads = before.threads;
        summary.concurrent = before.concurrent;
    }
    summary.wall_s += started.elapsed().as_secs_f64();
    write_results(&summary, &cfg.logdir)?;
    Ok(summary)
}

impl PopulationSummary {
    /// A thread's groups' results, updates and time.
    fn add(&mut self, groups: Vec<GroupOutcome>) {
        for g in groups {
            self.agents.extend(g.results);
            self.updates += g.updates;
            for (total, part) in self.split.iter_mut().zip(g.split) {
                *total += part;
            }
        }
    }
}

/// This process's agents, places and plan fingerprint: every agent and every place of
/// the run, or with `--shard I/N` thread I's plan of the whole population on N threads
/// and that thread's places (nothing else of the one-process run's plan changes).
fn this_shard(mode: &PopulationMode, members: Vec<Member>) -> (Vec<Member>, usize, Option<String>) {
    let total = members.len();
    let places = mode.max_concurrent.unwrap_or(total).min(total);
    let Some(shard) = mode.shard else {
        return (members, places, None);
    };
    let identities: Vec<String> = members
        .iter()
        .map(|m| serde_json::to_string(&m.identity()).unwrap_or_default())
        .collect();
    let plan = shard.fingerprint(identities.iter().map(String::as_str), places);
    let mut plans = plans(groups(members), shard.count);
    let mine: Vec<Member> = plans
        .swap_remove(shard.index)
        .into_iter()
        .flatten()
        .collect();
    tracing::info!(
        "shard {shard}: {} of the {total} agents, {} of the {places} places (thread {} of the same run with --population-threads {})",
        mine.len(),
        shard.slots(places),
        shard.index,
        shard.count
    );
    (mine, shard.slots(places), Some(plan))
}

/// A resumed sweep (`--resume`): agents that ended keep their results (returned
/// second), stopped ones go on from their state, the rest start.
fn resumed(
    cfg: &RunConfig,
    env: &EnvSpec,
    members: Vec<Member>,
) -> Result<(Vec<Member>, Vec<AgentResult>), RunError> {
    let mut ended = Vec::new();
    if cfg.resume.is_none() {
        return Ok((members, ended));
    }
    let mut left = Vec::with_capacity(members.len());
    for mut m in members {
        match resume::saved(&m.dir(&cfg.logdir), &m.identity())? {
            Saved::Ended(result) => ended.push(*result),
            Saved::Stopped => {
                let network = m.cfg.network_spec()?;
                resume::check_stopped(&m.dir(&cfg.logdir), env, &network)?;
                m.resumed = true;
                left.push(m);
            }
            Saved::Fresh => left.push(m),
        }
    }
    tracing::info!(
        "resuming the population in {}: {} agent(s) ended before, {} go on from their state, {} start",
        cfg.logdir.display(),
        ended.len(),
        left.iter().filter(|m| m.resumed).count(),
        left.iter().filter(|m| !m.resumed).count()
    );
    Ok((left, ended))
}

/// How many agents train at once: as many as memory holds (or `places` says), the
/// rest queue. What one agent costs (its replay; online, target, gradient and Adam's
/// two moments in f32) is said up front.
fn at_once(
    cfg: &RunConfig,
    env: &EnvSpec,
    members: &[Member],
    places: usize,
) -> Result<usize, RunError> {
    let k = members.len();
    let mut per_agent = 0;
    let mut seen: Vec<&Settings> = Vec::new();
    for m in members {
        if seen.contains(&&m.sweep.settings) {
            continue;
        }
        let replay = super::setup::replay_config(&m.cfg, env)?.bytes();
        let network = m.cfg.network_spec()?;
        let networks = network.layout().len * 5 * 4;
        per_agent = per_agent.max(replay + networks);
        seen.push(&m.sweep.settings);
    }
    let fits = super::setup::available_memory()
        .map_or(k, |bytes| (bytes / per_agent.max(1) as u64) as usize);
    if fits == 0 {
        super::setup::check_memory(cfg, per_agent as u64)?;
    }
    let concurrent = k.min(fits.max(1)).min(places);
    tracing::info!(
        "memory per agent: up to {:.1} MiB; {k} agents, {concurrent} at once: {:.2} GiB{}",
        per_agent as f64 / f64::from(1 << 20),
        (per_agent * concurrent) as f64 / f64::from(1 << 30),
        if concurrent < k {
            " (the rest queue and take finished agents' places)"
        } else {
            ""
        }
    );
    if fits < k.min(places) {
        // Which agents train together decides each one's batches: the free memory
        // should not.
        match cfg.population().and_then(|m| m.shard) {
            Some(shard) => tracing::warn!(
                "memory limits shard {shard} to {concurrent} agents at once, fewer than its {places} places: its results will differ from the one-process run's; give its task more memory, or every task a lower --max-concurrent-agents"
            ),
            None => tracing::warn!(
                "memory limits this run to {concurrent} agents at once; to reproduce its results, pass --max-concurrent-agents {concurrent}"
            ),
        }
    }
    Ok(concurrent)
}

/// The TensorBoard HParams experiment, from the first group's first agent.
fn hparams_experiment(cfg: &RunConfig, env: &EnvSpec, groups: &[(GroupKey, Vec<Member>)]) {
    if let Some((_, group)) = groups.first() {
        let m = &group[0];
        let example =
            population_board::settings(m.sweep.config, &m.sweep.hparams, &AgentSetup::of(&m.cfg));
        if let Err(e) = population_board::experiment(&cfg.logdir, &env.id, &example) {
            tracing::warn!("no TensorBoard HParams experiment: {e}");
        }
    }
}

/// The server for remote actors (`--listen`), sized for the largest network any agent
/// of `plans` trains; each actor serves an agent that trains, assigned at its
/// handshake through `ports`.
fn start_server(
    cfg: &RunConfig,
    env: &EnvSpec,
    plans: &[Vec<Vec<Member>>],
    ports: &Arc<AgentPorts>,
) -> Result<Option<ServerHandle>, RunError> {
    let Some(scfg) = &cfg.server else {
        return Ok(None);
    };
    let largest = plans
        .iter()
        .flatten()
        .flatten()
        .map(|m| m.cfg.network_spec())
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .max_by_key(|n| n.layout().len)
        .expect("a population has agents");
    let ctx = ServerContext {
        env: env.clone(),
        env_config: cfg.env.clone(),
        clip_rewards: cfg.clip_rewards,
        network: largest,
        run_id: format!("{}-{}-{}", env.id, cfg.seed, std::process::id()),
        routes: Routes::Agents(Arc::clone(ports)),
        // Remote episode returns are not kept per agent (evaluations are).
        episodes: crossbeam_channel::bounded(1).0,
        board: Arc::default(),
    };
    Ok(Some(millrace_server::spawn(scfg.clone(), ctx)?))
}

/// The server's last word to remote actors: the population finished, or the learner
/// is stopping.
fn say_goodbye(server: ServerHandle, outcomes: &[Result<Vec<GroupOutcome>, RunError>]) {
    let finished = outcomes.iter().all(|o| {
        o.as_ref().is_ok_and(|groups| {
            groups
                .iter()
                .all(|g| g.results.iter().all(|r| r.end != AgentEnd::Interrupted))
        })
    });
    let goodbye = millrace_server::goodbye_for(
        finished,
        if finished {
            "the population finished"
        } else {
            "the learner is stopping"
        },
    );
    if let Err(e) = server.shutdown(goodbye) {
        tracing::warn!("server: {e}");
    }
}

/// What the group threads share: the run, its places and where each thread runs.
struct Threads<'a> {
    cfg: &'a RunConfig,
    budget: u64,
    started: Instant,
    interrupt: &'a AtomicBool,
    ports: Option<&'a AgentPorts>,
    server: Option<&'a ServerHandle>,
    metrics: Option<&'a PopulationMetrics>,
    /// Agents at once, all threads together.
    slots: usize,
    devices: &'a [tch::Device],
    cpu_plan: &'a crate::cpu_plan::CpuPlan,
}

impl Threads<'_> {
    /// One thread per plan, each training its groups one after another; a thread that
    /// fails stops the others (as an interrupt would).
    fn train(&self, plans: Vec<Vec<Vec<Member>>>) -> Vec<Result<Vec<GroupOutcome>, RunError>> {
        let failed = AtomicBool::new(false);
        let threads = plans.len();
        std::thread::scope(|scope| {
            let handles: Vec<_> = plans
                .into_iter()
                .enumerate()
                .map(|(t, plan)| {
                    // This thread's share of the agents that train at once.
                    let slots = Shard {
                        index: t,
                        count: threads,
                    }
                    .slots(self.slots);
                    let device = self.devices.get(t).copied().unwrap_or(tch::Device::Cpu);
                    let run = RunShared {
                        cfg: self.cfg,
                        budget: self.budget,
                        started: self.started,
                        stop: [self.interrupt, &failed],
                        ports: self.ports,
                        server: self.server,
                        metrics: self.metrics,
                    };
                    let (cpu_plan, failed) = (self.cpu_plan, &failed);
                    scope.spawn(move || {
                        // Before this thread's first libtorch call (see host::enter).
                        host::enter(cpu_plan, Role::Learner(t));
                        train_plan(run, plan, device, slots, failed)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|p| {
                        Err(RunError::Failed {
                            component: super::Component::PopulationThread,
                            message: crate::panic_message(&*p),
                            checkpoint: crate::run::CheckpointFate::AllButThisGroup,
                        })
                    })
                })
                .collect()
        })
    }
}

/// One thread's groups, one after another; a failure raises `failed` for the others.
fn train_plan(
    run: RunShared<'_>,
    plan: Vec<Vec<Member>>,
    device: tch::Device,
    slots: usize,
    failed: &AtomicBool,
) -> Result<Vec<GroupOutcome>, RunError> {
    let mut done = Vec::new();
    for members in plan.into_iter().filter(|m| !m.is_empty()) {
        if run.stopping() {
            // Stopped before this group started: its agents wait for `--resume`.
            done.push(GroupOutcome::not_started(&members));
            continue;
        }
        match Group::new(run, members, device, slots).and_then(Group::train) {
            Ok(g) => done.push(g),
            Err(e) => {
                failed.store(true, Ordering::Relaxed);
                return Err(e);
            }
        }
    }
    Ok(done)
}

/// Agents that share the update's shapes and pace, each group in the order the sweep
/// first names it.
fn groups(members: Vec<Member>) -> Vec<(GroupKey, Vec<Member>)> {
    let mut groups: Vec<(GroupKey, Vec<Member>)> = Vec::new();
    for m in members {
        let key = GroupKey::of(&m.cfg);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, g)) => g.push(m),
            None => groups.push((key, vec![m])),
        }
    }
    groups
}

/// Each thread's share of every group (`plans[thread][group]`, consecutive agents,
/// possibly none), so the plan (and with it every result) depends only on the sweep
/// and the thread count. A shard (`--shard I/N`) is `plans(…, N)[I]`.
fn plans(groups: Vec<(GroupKey, Vec<Member>)>, threads: usize) -> Vec<Vec<Vec<Member>>> {
    let mut plans: Vec<Vec<Vec<Member>>> = vec![Vec::new(); threads];
    for (_, group) in groups {
        let per = group.len().div_ceil(threads);
        let mut chunks = group.chunks(per).map(<[_]>::to_vec);
        for plan in &mut plans {
            plan.push(chunks.next().unwrap_or_default());
        }
    }
    plans
}

fn write_results(summary: &PopulationSummary, logdir: &Path) -> Result<(), RunError> {
    let path = summary.write(logdir)?;
    tracing::info!("results written to {}", path.display());
    Ok(())
}
