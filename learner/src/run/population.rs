//! Population mode (`--population K`): K agents of one configuration, each with its own
//! seed, parameters, target network, optimizer state, replay, actors, exploration and
//! evaluation, trained by one stacked update ([`crate::dqn`]).
//!
//! Like the lock-step mode, one thread drives everything in a fixed order, so the same
//! seed and flags give bit-identical results on the same machine. Each round, every
//! running agent's actors step their environments and hand full batches to the agent's
//! own replay; then the stacked update runs as long as every running agent's replay
//! ratio allows a batch (a batch an agent drew while another could not waits for the
//! next update); evaluations, confirmations and budgets are per agent. An agent that
//! reaches its target (confirmed on fresh episodes), spends its step budget, or whose
//! loss diverges is finished: its actors stop, and the population is rebuilt without it,
//! so finished agents stop costing compute. Each agent keeps its `best/` and `solved/`
//! policies under `agents/agent-NNN/checkpoint` in the log directory (`learner eval`
//! and `export` read them), and the results table is printed and written as
//! `population.csv`.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use millrace_actor::{AnyActor, EpsilonSchedule};
use millrace_proto::wire::EpsilonDecay;
use millrace_proto::{EnvSpec, NetworkSpec, Params, ParamsCell, StepCounter};
use millrace_replay::Table;
use rand::rngs::SmallRng;
use rand::SeedableRng;

use super::population_resume::{self, Identity, Saved};
use super::population_staging::PopulationStaging;
use super::RunError;
use crate::checkpoint::{self, Layout, PolicyOwner, StateMeta, Which};
use crate::config::RunConfig;
use crate::dqn::{Dqn, DqnState};
use crate::evaluation::{eval_seed, evaluate, EvalDone, EvalRecord, EvalTracker, Purpose};
use crate::population::AgentHparams;
use crate::population_board::{self, AgentBoard};
use crate::population_results::{AgentEnd, AgentResult, AgentSetup, PopulationSummary};
use crate::server::{AgentPorts, AgentSpec, Route, Routes, ServerContext, ServerHandle};
use crate::sweep::{check_applied, GroupKey, Settings, Sweep, SweepAgent, SweepError};

/// An agent of the run: its place in the population, its sweep entry, and its
/// configuration as it trains (the flags with its sweep settings applied).
#[derive(Clone, Debug)]
pub struct Member {
    pub index: usize,
    pub sweep: SweepAgent,
    pub cfg: RunConfig,
    /// It was stopped while training, and goes on from its saved state (`--resume`).
    pub resumed: bool,
}

impl Member {
    /// Its directory in the log directory `root`.
    fn dir(&self, root: &Path) -> PathBuf {
        root.join("agents").join(format!("agent-{:03}", self.index))
    }

    fn identity(&self) -> Identity {
        Identity {
            agent: self.index,
            config: self.sweep.config,
            label: self.sweep.label.clone(),
            hparams: self.sweep.hparams,
            setup: AgentSetup::of(&self.cfg),
        }
    }
}

/// One agent and everything that is its own.
struct Agent {
    index: usize,
    /// Its configuration in a sweep (0 for `--population K`).
    config: usize,
    label: String,
    hp: AgentHparams,
    setup: AgentSetup,
    /// What it trains with while it trains (dropped when it ends, so a finished
    /// agent's replay is freed for the agents queued behind it).
    live: Option<Live>,
    steps: Arc<StepCounter>,
    tracker: EvalTracker,
    next_eval: u64,
    returns: VecDeque<f32>,
    /// Its directory, and its checkpoint's layout (under it).
    dir: PathBuf,
    layout: Layout,
    end: Option<(AgentEnd, u64, f64)>,
    /// Its TensorBoard run (`None` if it could not be written: training goes on).
    board: Option<AgentBoard>,
}

/// What an agent needs only while it trains.
struct Live {
    actors: Vec<AnyActor>,
    /// Its parameters as its actors read them (a population of one).
    params: Arc<ParamsCell>,
    /// Shared with the server's connections when remote actors serve the agent.
    table: Arc<Table>,
    rng: SmallRng,
}

impl Agent {
    /// The agent `m`, with its actors, replay and checkpoint directory; a resumed
    /// agent with its replay, counters and best evaluation read back, and its networks'
    /// and optimizer's state for the population to take in.
    fn new(
        m: &Member,
        network: &NetworkSpec,
        root: &Path,
    ) -> Result<(Self, Option<DqnState>), RunError> {
        let cfg = &m.cfg;
        let dir = m.dir(root);
        let layout = Layout::new(dir.join("checkpoint"));
        std::fs::create_dir_all(&layout.root)?;
        let saved = if m.resumed {
            let (meta, state, latest) = population_resume::load_state(&dir)?;
            checkpoint::check_fits(&meta, &cfg.env_spec, network).map_err(RunError::Resume)?;
            Some((meta, state, latest))
        } else {
            population_resume::write_identity(&dir, &m.identity()).map_err(RunError::Config)?;
            None
        };
        checkpoint::files::write_json(&layout.config(), cfg).map_err(RunError::Config)?;
        let start_steps = saved.as_ref().map_or(0, |(meta, _, _)| meta.env_steps);
        // A resumed agent's actors seed on from its env steps (new episodes).
        let actors = (0..cfg.actors.count)
            .map(|id| AnyActor::new(&cfg.actor(id as u32, start_steps), network))
            .collect::<Result<Vec<_>, _>>()?;
        let replay = super::setup::replay_config(cfg, &cfg.env_spec)?;
        let table = Arc::new(Table::new(&replay)?);
        let hp = m.sweep.hparams;
        let setup = AgentSetup::of(cfg);
        let settings = population_board::settings(m.sweep.config, &hp, &setup);
        let board = if m.resumed {
            AgentBoard::resume(&dir)
        } else {
            AgentBoard::create(&dir, m.sweep.config, &settings)
        }
        .inspect_err(|e| tracing::warn!("agent {}: no TensorBoard run: {e}", m.index))
        .ok();
        let mut best = None;
        let mut state = None;
        if let Some((meta, s, latest)) = saved {
            let restored =
                checkpoint::restore_replay(&latest, &meta, &table, cfg.replay.learning_starts)
                    .map_err(RunError::Resume)?;
            best = checkpoint::saved_eval(&layout, Which::Best).map_err(RunError::Resume)?;
            tracing::info!(
                "agent {}: resumed at {} env steps, {} updates; replay holds {} transitions",
                m.index,
                meta.env_steps,
                s.updates,
                restored.held
            );
            state = Some(s);
        }
        let every = cfg.eval.every.max(1);
        let agent = Self {
            index: m.index,
            config: m.sweep.config,
            label: m.sweep.label.clone(),
            hp,
            setup,
            live: Some(Live {
                actors,
                params: Arc::new(ParamsCell::new(Params {
                    version: 0,
                    env_steps: 0,
                    updates: 0,
                    population: 1,
                    data: Vec::new(),
                })),
                table,
                rng: SmallRng::seed_from_u64(hp.seed.wrapping_add(start_steps) ^ 0x5eed),
            }),
            steps: Arc::new(StepCounter::new(start_steps)),
            tracker: EvalTracker::new(cfg.eval.target_return, best),
            next_eval: (start_steps / every + 1) * every,
            returns: VecDeque::new(),
            dir,
            layout,
            end: None,
            board,
        };
        Ok((agent, state))
    }

    /// Saves the agent's state (`state`: its row of the population, its own update
    /// count) with its replay into `checkpoint/latest/`, for `--resume`.
    fn save(
        &self,
        state: &DqnState,
        network: &NetworkSpec,
        env: &EnvSpec,
        version: u64,
    ) -> Result<(), RunError> {
        let live = self
            .live
            .as_ref()
            .expect("a training agent keeps its actors and replay");
        let mut meta = StateMeta::new(
            env.clone(),
            network.clone(),
            self.hp.seed,
            self.steps.get(),
            version,
        );
        meta.last_eval = self.tracker.last.clone();
        checkpoint::save_state(&self.layout.latest(), state, Some(&live.table), meta)
            .map(|_| ())
            .map_err(RunError::FinalCheckpoint)
    }

    /// Writes to the agent's TensorBoard run; a failure is said once, and the run
    /// dropped (training goes on).
    fn board(&mut self, write: impl FnOnce(&AgentBoard) -> std::io::Result<()>) {
        if let Some(Err(e)) = self.board.as_ref().map(write) {
            tracing::warn!(
                "agent {}: TensorBoard write failed, no more: {e}",
                self.index
            );
            self.board = None;
        }
    }

    fn live(&mut self) -> &mut Live {
        self.live
            .as_mut()
            .expect("a training agent keeps its actors and replay")
    }

    fn result(&self, wall: f64) -> AgentResult {
        let (end, env_steps, wall_s) =
            self.end
                .unwrap_or((AgentEnd::Interrupted, self.steps.get(), wall));
        AgentResult {
            agent: self.index,
            config: self.config,
            label: self.label.clone(),
            hparams: self.hp,
            setup: self.setup.clone(),
            end,
            env_steps,
            wall_s,
            final_eval: self.tracker.last.as_ref().map(|r| r.mean),
            best_eval: self.tracker.best.as_ref().map(|r| r.mean),
        }
    }
}

/// The agents of the run, each with its configuration, and each agent's env step
/// budget: a sweep file's (`--sweep`), or for `--population K` K seeds of the flags'
/// configuration (agent 0 has the run's own seed). An agent whose settings do not hold
/// together with the flags' is refused, named.
pub fn agents(cfg: &RunConfig) -> Result<(Vec<Member>, u64), RunError> {
    let (sweep, budget) = match &cfg.sweep {
        Some(path) => {
            let sweep = Sweep::read(path, &cfg.dqn, cfg.seed)?;
            (sweep.agents, sweep.max_steps.unwrap_or(cfg.max_steps))
        }
        None => (
            AgentHparams::seeds(cfg.seed, cfg.population.unwrap_or(1))
                .map(|s| SweepAgent {
                    config: 0,
                    hparams: AgentHparams::from_config(&cfg.dqn, s),
                    settings: Settings::default(),
                    label: String::new(),
                })
                .collect(),
            cfg.max_steps,
        ),
    };
    let mut checked: Vec<(Settings, Result<(), String>)> = Vec::new();
    let mut members = Vec::with_capacity(sweep.len());
    for (index, agent) in sweep.into_iter().enumerate() {
        let member_cfg = agent.apply(cfg);
        // Settings repeat over seeds and draws: check each combination once.
        let verdict = match checked.iter().find(|(s, _)| *s == agent.settings) {
            Some((_, v)) => v.clone(),
            None => {
                let v = check_applied(&member_cfg);
                checked.push((agent.settings.clone(), v.clone()));
                v
            }
        };
        if let Err(why) = verdict {
            return Err(SweepError::Settings {
                file: cfg
                    .sweep
                    .as_ref()
                    .map_or_else(String::new, |p| p.display().to_string()),
                agent: index,
                config: agent.config,
                seed: agent.hparams.seed,
                why,
            }
            .into());
        }
        members.push(Member {
            index,
            sweep: agent,
            cfg: member_cfg,
            resumed: false,
        });
    }
    Ok((members, budget))
}

/// Evaluates the agent's latest parameters, and confirms a candidate at once; returns
/// whether it is solved.
fn evaluate_agent(
    agent: &mut Agent,
    cfg: &RunConfig,
    network: &NetworkSpec,
) -> Result<bool, RunError> {
    let mut next = Some((agent.live().params.latest(), Purpose::Regular));
    while let Some((params, purpose)) = next.take() {
        let key = match purpose {
            Purpose::Regular => params.env_steps,
            Purpose::Confirm => params.version,
        };
        let seed = eval_seed(agent.hp.seed, purpose, key);
        let result =
            evaluate(&cfg.env, network, &params, cfg.eval.episodes, seed).map_err(|message| {
                RunError::Failed {
                    component: format!("evaluation of agent {}", agent.index),
                    message,
                    checkpoint: "no checkpoint (population mode keeps policies only)".into(),
                }
            })?;
        let done = EvalDone {
            record: EvalRecord::new(&params, seed, &result),
            params,
            purpose,
        };
        tracing::info!(
            "agent {}: {} {}",
            agent.index,
            match purpose {
                Purpose::Regular => "eval",
                Purpose::Confirm => "confirmation",
            },
            done.record
        );
        if purpose == Purpose::Regular {
            let returns = &agent.returns;
            let train = returns.iter().map(|r| f64::from(*r)).sum::<f64>() / returns.len() as f64;
            let (env_steps, mean, std) = (done.record.env_steps, done.record.mean, done.record.std);
            agent.board(|b| {
                b.scalars(
                    env_steps,
                    &[
                        ("eval/mean_return", f64::from(mean)),
                        ("eval/std_return", f64::from(std)),
                        ("train/episode_return", train),
                    ],
                )
            });
        }
        let d = agent.tracker.record(&done);
        let owner = PolicyOwner {
            layout: &agent.layout,
            env: &cfg.env_spec,
            network,
            seed: agent.hp.seed,
        };
        let save = |which, params, eval, confirm| {
            checkpoint::save_evaluated(&owner, which, params, eval, confirm)
                .map_err(|e| RunError::SavePolicy(which, e))
        };
        if d.new_best {
            save(Which::Best, &done.params, &done.record, None)?;
        }
        if let Some(s) = &d.solved {
            save(Which::Solved, &s.params, &s.first, Some(&s.confirm))?;
        }
        next = d.confirm.map(|p| (p, Purpose::Confirm));
    }
    Ok(agent.tracker.solved.is_some())
}

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

pub fn run(cfg: &RunConfig, interrupt: &AtomicBool) -> Result<PopulationSummary, RunError> {
    let started = Instant::now();
    let env = cfg.env_spec.clone();
    let (members, budget) = agents(cfg)?;
    let total = members.len();
    // A resumed sweep: agents that ended keep their results, stopped ones go on from
    // their state, the rest start.
    let mut ended = Vec::new();
    let members: Vec<Member> = if cfg.resume.is_some() {
        let mut left = Vec::with_capacity(members.len());
        for mut m in members {
            match population_resume::saved(&m.dir(&cfg.logdir), &m.identity())? {
                Saved::Ended(result) => ended.push(result),
                Saved::Stopped => {
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
        left
    } else {
        members
    };
    let k = members.len();
    if k == 0 {
        tracing::info!("every agent of this population has ended: nothing to train");
        let summary = PopulationSummary {
            env: env.id.clone(),
            agents: ended,
            wall_s: started.elapsed().as_secs_f64(),
            updates: 0,
            target: cfg.eval.target_return,
            split: [0.0; 3],
            groups: 0,
            threads: 0,
            concurrent: 0,
        };
        write_results(&summary, &cfg.logdir)?;
        return Ok(summary);
    }
    // What one agent costs (its replay; online, target, gradient and Adam's two
    // moments in f32), said up front; as many agents train at once as memory holds
    // (or --max-concurrent-agents says), the rest queue.
    let mut per_agent = 0;
    let mut seen: Vec<&Settings> = Vec::new();
    for m in &members {
        if seen.contains(&&m.sweep.settings) {
            continue;
        }
        let replay = super::setup::replay_config(&m.cfg, &env)?.bytes();
        let network = crate::network::build(m.cfg.network, &env, &m.cfg.hidden)?;
        let networks = network.layout().len * 5 * 4;
        per_agent = per_agent.max(replay + networks);
        seen.push(&m.sweep.settings);
    }
    let fits = super::setup::available_memory()
        .map_or(k, |bytes| (bytes / per_agent.max(1) as u64) as usize);
    if fits == 0 {
        super::setup::check_memory(cfg, per_agent as u64)?;
    }
    let concurrent = k
        .min(fits.max(1))
        .min(cfg.max_concurrent_agents.unwrap_or(k));
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
    // Threads, each a stacked update of its own: one per core on the CPU unless
    // `--population-threads` says (more intra-op threads on one update cost more in
    // synchronisation than they save at these sizes), one per GPU (`--gpu 0,1`).
    let devices: Vec<tch::Device> = cfg.population_devices.iter().map(|d| d.device()).collect();
    let threads = if cfg.device.device() == tch::Device::Cpu {
        cfg.population_threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    } else {
        devices.len()
    }
    .clamp(1, concurrent);
    tch::set_num_threads(1);
    // Groups: agents that share the update's shapes and pace, in the order the sweep
    // first names them. Each thread takes its share of every group, group after group,
    // so the plan (and with it every result) depends only on the sweep and the thread
    // count.
    let mut groups: Vec<(GroupKey, Vec<Member>)> = Vec::new();
    for m in members {
        let key = GroupKey::of(&m.cfg);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, g)) => g.push(m),
            None => groups.push((key, vec![m])),
        }
    }
    let n_groups = groups.len();
    if let Some((_, group)) = groups.first() {
        let m = &group[0];
        let example =
            population_board::settings(m.sweep.config, &m.sweep.hparams, &AgentSetup::of(&m.cfg));
        if let Err(e) = population_board::experiment(&cfg.logdir, &env.id, &example) {
            tracing::warn!("no TensorBoard HParams experiment: {e}");
        }
    }
    let mut plans: Vec<Vec<Vec<Member>>> = vec![Vec::new(); threads];
    for (key, group) in groups {
        let per = group.len().div_ceil(threads);
        tracing::info!("group: {} agents, {key}", group.len());
        let mut chunks = group.chunks(per).map(<[_]>::to_vec);
        for plan in &mut plans {
            plan.push(chunks.next().unwrap_or_default());
        }
    }
    tracing::info!(
        "population of {k} on {}: {} actor(s) x {} envs each; {n_groups} group(s) on {threads} thread(s), up to {concurrent} agents at once",
        env.id,
        cfg.actors.count,
        cfg.actors.envs_per_actor
    );
    // Remote actors (`--listen`): each serves an agent that trains, assigned at its
    // handshake.
    let ports = Arc::new(AgentPorts::new(k));
    let server = match &cfg.server {
        Some(scfg) => {
            let largest = plans
                .iter()
                .flatten()
                .flatten()
                .map(|m| crate::network::build(m.cfg.network, &env, &m.cfg.hidden))
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
                routes: Routes::Agents(Arc::clone(&ports)),
                // Remote episode returns are not kept per agent (evaluations are).
                episodes: crossbeam_channel::bounded(1).0,
                board: Arc::default(),
            };
            Some(crate::server::spawn(scfg.clone(), ctx)?)
        }
        None => None,
    };
    // A thread that fails stops the others (as an interrupt would).
    let failed = AtomicBool::new(false);
    let outcomes: Vec<Result<Vec<Group>, RunError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = plans
            .into_iter()
            .enumerate()
            .map(|(t, plan)| {
                // This thread's share of the agents that train at once.
                let slots = concurrent / threads + usize::from(t < concurrent % threads);
                let device = devices.get(t).copied().unwrap_or(tch::Device::Cpu);
                let failed = &failed;
                let run = RunShared {
                    cfg,
                    budget,
                    started,
                    stop: [interrupt, failed],
                    ports: server.as_ref().map(|_| &*ports),
                    server: server.as_ref(),
                };
                scope.spawn(move || {
                    let mut done = Vec::new();
                    for members in plan.into_iter().filter(|m| !m.is_empty()) {
                        let outcome = train_group(run, members, device, slots);
                        match outcome {
                            Ok(g) => done.push(g),
                            Err(e) => {
                                failed.store(true, Ordering::Relaxed);
                                return Err(e);
                            }
                        }
                    }
                    Ok(done)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|p| {
                    Err(RunError::Failed {
                        component: "population thread".into(),
                        message: crate::panic_message(&*p),
                        checkpoint: "no checkpoint (population mode keeps policies only)".into(),
                    })
                })
            })
            .collect()
    });
    if let Some(server) = server {
        let finished = outcomes.iter().all(|o| {
            o.as_ref().is_ok_and(|groups| {
                groups
                    .iter()
                    .all(|g| g.results.iter().all(|r| r.end != AgentEnd::Interrupted))
            })
        });
        let goodbye = crate::server::goodbye_for(
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
    let mut results = Vec::with_capacity(k);
    let (mut updates, mut split) = (0, [0.0; 3]);
    for outcome in outcomes {
        for g in outcome? {
            results.extend(g.results);
            updates += g.updates;
            for (total, part) in split.iter_mut().zip(g.split) {
                *total += part;
            }
        }
    }
    results.extend(ended);
    results.sort_by_key(|r| r.agent);
    debug_assert_eq!(results.len(), total);
    if results.iter().any(|r| r.end == AgentEnd::Interrupted) {
        tracing::warn!(
            "stopped: each training agent's state is saved; continue the sweep with --resume {} and the same flags",
            cfg.logdir.display()
        );
    }
    let summary = PopulationSummary {
        env: env.id.clone(),
        agents: results,
        wall_s: started.elapsed().as_secs_f64(),
        updates,
        target: cfg.eval.target_return,
        split,
        groups: n_groups,
        threads,
        concurrent,
    };
    write_results(&summary, &cfg.logdir)?;
    Ok(summary)
}

/// The longest a round of updates runs while remote actors fill replay (embedded
/// actors only act between rounds, so their rounds end when replay's ratio says).
const REMOTE_ROUND: std::time::Duration = std::time::Duration::from_millis(20);

/// What one group of agents did.
struct Group {
    results: Vec<AgentResult>,
    updates: u64,
    split: [f64; 3],
}

/// What every group of a run shares.
#[derive(Clone, Copy)]
struct RunShared<'a> {
    cfg: &'a RunConfig,
    /// Each agent's env step budget.
    budget: u64,
    started: Instant,
    /// An interrupt, and another thread's failure.
    stop: [&'a AtomicBool; 2],
    /// Remote actors' agents, and the server (`--listen`).
    ports: Option<&'a AgentPorts>,
    server: Option<&'a ServerHandle>,
}

/// Trains the agents `members` of one group (same update shapes and pace) as one
/// stacked population on this thread and `device`, at most `slots` at once: queued
/// agents take the places of agents that end, until every one has ended.
fn train_group(
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
    } = run;
    let env = cfg.env_spec.clone();
    let first = &members[0].cfg;
    let network = crate::network::build(first.network, &env, &first.hidden)?;
    let batch_size = first.batch_size;
    let mut queue: VecDeque<Member> = members.into();

    let mut agents: Vec<Agent> = Vec::with_capacity(queue.len());
    let mut running: Vec<usize> = Vec::new();
    let mut dqn: Option<Dqn> = None;
    let mut version = 1;
    let (mut acting, mut updating, mut evaluating) = (0.0, 0.0, 0.0);
    let mut population_updates = 0;
    let mut last_save = Instant::now();
    let interrupted = 'run: loop {
        // Queued agents take free places (all of them at the start).
        let free = slots.saturating_sub(running.len()).min(queue.len());
        if free > 0 {
            let newcomers: Vec<usize> = (0..free).map(|i| agents.len() + i).collect();
            let mut states = Vec::with_capacity(free);
            for m in queue.drain(..free) {
                let (agent, state) = Agent::new(&m, &network, &cfg.logdir)?;
                states.push((agent.hp, state));
                agents.push(agent);
            }
            dqn = Some(match dqn.take() {
                Some(d) => d.admit_states(states),
                None => {
                    let mut spec = network.clone();
                    spec.population = states.len();
                    Dqn::population_states(spec, cfg.dqn.clone(), states, device)
                }
            });
            let first = running.is_empty();
            running.extend(&newcomers);
            if let Some(ports) = ports {
                for &a in &newcomers {
                    let agent = &mut agents[a];
                    let setup = &agent.setup;
                    let (n_step, gamma, epsilon) = (setup.n_step, setup.gamma, setup.epsilon);
                    let index = agent.index as u32;
                    let (steps, live) = (Arc::clone(&agent.steps), agent.live());
                    ports.open(
                        index,
                        AgentSpec {
                            route: Route {
                                table: Arc::clone(&live.table),
                                params: Arc::clone(&live.params),
                                steps,
                            },
                            network: network.clone(),
                            n_step: n_step as u32,
                            gamma,
                            epsilon_decay: match epsilon {
                                EpsilonSchedule::Linear { start, end, steps } => {
                                    Some(EpsilonDecay { start, end, steps })
                                }
                                EpsilonSchedule::Constant(e) => Some(EpsilonDecay {
                                    start: e,
                                    end: e,
                                    steps: 0,
                                }),
                            },
                        },
                    );
                }
            }
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
            let d = dqn.as_ref().expect("made above");
            publish(
                d,
                &running,
                &mut agents,
                version,
                (!first).then_some(&newcomers[..]),
            );
        }
        let Some(d) = dqn.as_mut() else {
            break false;
        };
        if running.is_empty() {
            population_updates += d.updates();
            break false;
        }
        // Batches drawn for an update that did not happen are dropped with the old
        // shape (the replay ratio absorbs one batch per agent).
        let mut staging = PopulationStaging::new(&env.obs, running.len(), batch_size);
        // Rounds until an agent ends.
        loop {
            let stopping = stop.iter().any(|s| s.load(Ordering::Relaxed));
            let due = cfg
                .learner
                .checkpoint_every
                .is_some_and(|every| last_save.elapsed() >= every);
            if stopping || due {
                // Each training agent's state and replay, for `--resume`.
                for (row, &a) in running.iter().enumerate() {
                    agents[a].save(&d.agent_state(row), &network, &env, version)?;
                }
                last_save = Instant::now();
            }
            if stopping {
                population_updates += d.updates();
                // Remote actors are told first, then inserts they are blocked in end.
                if let Some(server) = server {
                    server.announce(crate::server::goodbye_for(false, "the learner is stopping"));
                    for &a in &running {
                        agents[a].live().table.close();
                    }
                }
                break 'run true;
            }
            let updates_before = d.updates();
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
                        if returns.len() == 100 {
                            returns.pop_front();
                        }
                        returns.push_back(e.episode_return);
                    })?;
                    if let Some(batch) = batch {
                        table.insert_unlimited(&batch)?;
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
                let batch = staging.take(device);
                let _td = d.update(&batch);
                drop(batch);
                if d.updates().is_multiple_of(cfg.learner.publish_every.max(1)) {
                    version += 1;
                    publish(d, &running, &mut agents, version, None);
                }
                if d.updates().is_multiple_of(256) {
                    for (row, streak) in d.nonfinite_streaks().into_iter().enumerate() {
                        let a = running[row];
                        if streak >= cfg.learner.max_nonfinite && agents[a].end.is_none() {
                            tracing::warn!(
                                "agent {}: {streak} non-finite updates in a row: stopped, the others go on",
                                agents[a].index
                            );
                            agents[a].end = Some((
                                AgentEnd::Diverged,
                                agents[a].steps.get(),
                                started.elapsed().as_secs_f64(),
                            ));
                        }
                    }
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
            if running.iter().any(|&a| agents[a].end.is_some()) {
                break;
            }
            // Remote actors fill replay meanwhile: wait for them rather than spin.
            if ports.is_some() && d.updates() == updates_before {
                std::thread::sleep(std::time::Duration::from_millis(1));
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
                if let (Some(ports), Some(server)) = (ports, server) {
                    // Its actors go and serve another agent (or, after the last, are told
                    // the run finished); then an insert one is blocked in returns.
                    if ports.close(agent.index as u32) {
                        server
                            .announce(crate::server::goodbye_for(true, "the population finished"));
                    }
                    agent.live().table.close();
                }
                agent.live = None;
                let result = agent.result(wall);
                agent.board(|b| b.end(&result));
                population_resume::write_result(&agent.dir, &result).map_err(RunError::Config)?;
            }
        }
        running = keep.iter().map(|&r| running[r]).collect();
        let d = dqn.take().expect("a population trains");
        if running.is_empty() && queue.is_empty() {
            population_updates += d.updates();
            break false;
        }
        dqn = Some(d.keep_agents(&keep));
        if queue.is_empty() {
            tracing::info!("{} agent(s) still training", running.len());
        }
    };
    let wall = started.elapsed().as_secs_f64();
    let results: Vec<AgentResult> = agents.iter().map(|a| a.result(wall)).collect();
    debug_assert!(interrupted || results.iter().all(|a| a.end != AgentEnd::Interrupted));
    Ok(Group {
        results,
        updates: population_updates,
        split: [acting, updating, evaluating],
    })
}

fn write_results(summary: &PopulationSummary, logdir: &Path) -> Result<(), RunError> {
    let path = logdir.join("population.csv");
    summary.write_csv(&path)?;
    tracing::info!("results written to {}", path.display());
    Ok(())
}
