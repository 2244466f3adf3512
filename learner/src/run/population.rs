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
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use millrace_actor::AnyActor;
use millrace_proto::{NetworkSpec, Params, ParamsCell, StepCounter};
use millrace_replay::Table;
use rand::rngs::SmallRng;
use rand::SeedableRng;

use super::population_staging::PopulationStaging;
use super::RunError;
use crate::checkpoint::{self, Layout, PolicyOwner, Which};
use crate::config::RunConfig;
use crate::dqn::Dqn;
use crate::evaluation::{eval_seed, evaluate, EvalDone, EvalRecord, EvalTracker, Purpose};
use crate::population::AgentHparams;
use crate::population_results::{AgentEnd, AgentResult, PopulationSummary};
use crate::sweep::{Sweep, SweepAgent};

/// One agent and everything that is its own.
struct Agent {
    index: usize,
    /// Its configuration in a sweep (0 for `--population K`).
    config: usize,
    hp: AgentHparams,
    actors: Vec<AnyActor>,
    /// Its parameters as its actors read them (a population of one).
    params: Arc<ParamsCell>,
    table: Table,
    rng: SmallRng,
    steps: Arc<StepCounter>,
    tracker: EvalTracker,
    next_eval: u64,
    returns: VecDeque<f32>,
    layout: Layout,
    end: Option<(AgentEnd, u64, f64)>,
}

/// The agents of the run, and each one's env step budget: a sweep file's
/// (`--sweep`), or for `--population K` K seeds of the flags' configuration (agent 0
/// has the run's own seed).
pub fn agents(cfg: &RunConfig) -> Result<(Vec<SweepAgent>, u64), RunError> {
    if let Some(path) = &cfg.sweep {
        let sweep = Sweep::read(path, &cfg.dqn, cfg.seed)?;
        return Ok((sweep.agents, sweep.max_steps.unwrap_or(cfg.max_steps)));
    }
    let agents = AgentHparams::seeds(cfg.seed, cfg.population.unwrap_or(1))
        .map(|s| SweepAgent {
            config: 0,
            hparams: AgentHparams::from_config(&cfg.dqn, s),
        })
        .collect();
    Ok((agents, cfg.max_steps))
}

/// Evaluates the agent's latest parameters, and confirms a candidate at once; returns
/// whether it is solved.
fn evaluate_agent(
    agent: &mut Agent,
    cfg: &RunConfig,
    network: &NetworkSpec,
) -> Result<bool, RunError> {
    let mut next = Some((agent.params.latest(), Purpose::Regular));
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

/// Publishes each running agent's row of the population's parameters to its actors.
fn publish(dqn: &Dqn, running: &[usize], agents: &[Agent], version: u64) {
    let data = dqn.online_params();
    let p = data.len() / running.len().max(1);
    for (row, &a) in running.iter().enumerate() {
        let agent = &agents[a];
        agent.params.publish(Params {
            version,
            env_steps: agent.steps.get(),
            updates: dqn.updates(),
            population: 1,
            data: data[row * p..(row + 1) * p].to_vec(),
        });
    }
}

pub fn run(cfg: &RunConfig, interrupt: &AtomicBool) -> Result<PopulationSummary, RunError> {
    let started = Instant::now();
    let env = cfg.env_spec.clone();
    let network = crate::network::build(cfg.network, &env, &cfg.hidden)?;
    let (sweep, budget) = agents(cfg)?;
    let k = sweep.len();
    // Every agent's replay and networks are allocated up front: say what one agent
    // costs, and refuse a population this machine cannot hold.
    let one = super::setup::replay_config(cfg, &env)?;
    // Online, target, gradient and Adam's two moments, f32.
    let networks = network.layout().len * 5 * 4;
    let per_agent = one.bytes() + networks;
    tracing::info!(
        "memory per agent: {:.1} MiB ({:.1} MiB replay, {:.2} MiB networks and optimizer); {k} agents: {:.2} GiB",
        per_agent as f64 / f64::from(1 << 20),
        one.bytes() as f64 / f64::from(1 << 20),
        networks as f64 / f64::from(1 << 20),
        (per_agent * k) as f64 / f64::from(1 << 30)
    );
    super::setup::check_memory(cfg, per_agent.saturating_mul(k) as u64)?;
    // Groups of agents, each a stacked update on a thread of its own: one per core on
    // the CPU unless `--population-threads` says (more intra-op threads on one update
    // cost more in synchronisation than they save at these sizes), one on a GPU.
    let threads = if cfg.device.device() == tch::Device::Cpu {
        cfg.population_threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    } else {
        1
    };
    tch::set_num_threads(1);
    let per = k.div_ceil(threads.clamp(1, k));
    let members: Vec<Vec<(usize, SweepAgent)>> = sweep
        .iter()
        .copied()
        .enumerate()
        .collect::<Vec<_>>()
        .chunks(per)
        .map(<[_]>::to_vec)
        .collect();
    let groups = members.len();
    tracing::info!(
        "population of {k} on {}: network {}, {} actor(s) x {} envs each; {groups} group(s) of up to {per}, one thread each",
        env.id,
        crate::network::describe(&network),
        cfg.actors.count,
        cfg.actors.envs_per_actor
    );
    // A group that fails stops the others (as an interrupt would).
    let failed = AtomicBool::new(false);
    let outcomes: Vec<Result<Group, RunError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = members
            .into_iter()
            .map(|m| {
                let (network, one, failed) = (&network, &one, &failed);
                scope.spawn(move || {
                    let stop = [interrupt, failed];
                    let outcome = train_group(cfg, network, one, m, budget, started, &stop);
                    if outcome.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    outcome
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|p| {
                    Err(RunError::Failed {
                        component: "population group".into(),
                        message: crate::panic_message(&*p),
                        checkpoint: "no checkpoint (population mode keeps policies only)".into(),
                    })
                })
            })
            .collect()
    });
    let mut results = Vec::with_capacity(k);
    let (mut updates, mut split) = (0, [0.0; 3]);
    for outcome in outcomes {
        let g = outcome?;
        results.extend(g.results);
        updates += g.updates;
        for (total, part) in split.iter_mut().zip(g.split) {
            *total += part;
        }
    }
    let summary = PopulationSummary {
        env: env.id.clone(),
        agents: results,
        wall_s: started.elapsed().as_secs_f64(),
        updates,
        target: cfg.eval.target_return,
        split,
        groups,
    };
    write_results(&summary, &cfg.logdir)?;
    Ok(summary)
}

/// What one group of agents did.
struct Group {
    results: Vec<AgentResult>,
    updates: u64,
    split: [f64; 3],
}

/// Trains the agents `members` (index in the population, hyperparameters) as one
/// stacked population, on this thread, until each has ended.
fn train_group(
    cfg: &RunConfig,
    network: &NetworkSpec,
    one: &millrace_replay::ReplayConfig,
    members: Vec<(usize, SweepAgent)>,
    budget: u64,
    started: Instant,
    stop: &[&AtomicBool],
) -> Result<Group, RunError> {
    let env = cfg.env_spec.clone();
    let k = members.len();
    let hps: Vec<AgentHparams> = members.iter().map(|(_, a)| a.hparams).collect();
    let mut population_spec = network.clone();
    population_spec.population = k;
    let device = cfg.device.device();
    let mut dqn = Dqn::population(population_spec, cfg.dqn.clone(), &hps, device);

    let mut agents = Vec::with_capacity(k);
    for &(
        index,
        SweepAgent {
            config,
            hparams: hp,
        },
    ) in &members
    {
        let mut acfg_seed = cfg.clone();
        acfg_seed.seed = hp.seed;
        let actors = (0..cfg.actors.count)
            .map(|id| AnyActor::new(&acfg_seed.actor(id as u32, 0), network))
            .collect::<Result<Vec<_>, _>>()?;
        let layout = Layout::new(
            cfg.logdir
                .join("agents")
                .join(format!("agent-{index:03}"))
                .join("checkpoint"),
        );
        std::fs::create_dir_all(&layout.root)?;
        checkpoint::files::write_json(&layout.config(), &acfg_seed).map_err(RunError::Config)?;
        agents.push(Agent {
            index,
            config,
            hp,
            actors,
            params: Arc::new(ParamsCell::new(Params {
                version: 0,
                env_steps: 0,
                updates: 0,
                population: 1,
                data: Vec::new(),
            })),
            table: Table::new(one)?,
            rng: SmallRng::seed_from_u64(hp.seed ^ 0x5eed),
            steps: Arc::new(StepCounter::new(0)),
            tracker: EvalTracker::new(cfg.eval.target_return, None),
            next_eval: cfg.eval.every,
            returns: VecDeque::new(),
            layout,
            end: None,
        });
    }
    let mut running: Vec<usize> = (0..k).collect();
    let mut staging = PopulationStaging::new(&env.obs, k, cfg.batch_size);
    let mut version = 1;
    publish(&dqn, &running, &agents, version);

    let (mut acting, mut updating, mut evaluating) = (0.0, 0.0, 0.0);
    let interrupted = 'run: loop {
        if stop.iter().any(|s| s.load(Ordering::Relaxed)) {
            break true;
        }
        let t0 = Instant::now();
        for &a in &running {
            let agent = &mut agents[a];
            for actor in &mut agent.actors {
                let returns = &mut agent.returns;
                let batch = actor.step(&mut agent.params, &agent.steps, &mut |e| {
                    if returns.len() == 100 {
                        returns.pop_front();
                    }
                    returns.push_back(e.episode_return);
                })?;
                if let Some(batch) = batch {
                    agent.table.insert_unlimited(&batch)?;
                }
            }
        }
        let t1 = Instant::now();
        acting += (t1 - t0).as_secs_f64();
        // Stacked updates, as long as every running agent has a batch (one an agent
        // drew while another could not waits in its slice for the next update).
        loop {
            for (row, &a) in running.iter().enumerate() {
                let agent = &mut agents[a];
                staging
                    .fill(row, &agent.table, &mut agent.rng)
                    .map_err(|_| RunError::Replay(millrace_replay::ReplayError::Closed))?;
            }
            if !staging.all_ready() {
                break;
            }
            let batch = staging.take(device);
            let _td = dqn.update(&batch);
            drop(batch);
            if dqn
                .updates()
                .is_multiple_of(cfg.learner.publish_every.max(1))
            {
                version += 1;
                publish(&dqn, &running, &agents, version);
            }
            if dqn.updates().is_multiple_of(256) {
                for (row, streak) in dqn.nonfinite_streaks().into_iter().enumerate() {
                    let a = running[row];
                    if streak >= cfg.learner.max_nonfinite && agents[a].end.is_none() {
                        tracing::warn!(
                            "agent {a}: {streak} non-finite updates in a row: stopped, the others go on"
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
                if evaluate_agent(agent, cfg, network)? {
                    let at = agent
                        .tracker
                        .solved
                        .as_ref()
                        .map_or(steps, |s| s.params.env_steps);
                    tracing::info!("agent {a}: solved at {at} env steps");
                    agent.end = Some((AgentEnd::Solved, at, started.elapsed().as_secs_f64()));
                    continue;
                }
            }
            if steps >= budget {
                agent.end = Some((AgentEnd::Budget, steps, started.elapsed().as_secs_f64()));
            }
        }
        evaluating += t2.elapsed().as_secs_f64();
        // Finished agents leave the population: the rest go on without their cost.
        let keep: Vec<usize> = (0..running.len())
            .filter(|&row| agents[running[row]].end.is_none())
            .collect();
        if keep.len() < running.len() {
            if keep.is_empty() {
                break 'run false;
            }
            let kept_hps: Vec<AgentHparams> = keep.iter().map(|&r| agents[running[r]].hp).collect();
            dqn = dqn.keep_agents(&keep, &kept_hps);
            running = keep.iter().map(|&r| running[r]).collect();
            // Batches drawn for the next update are dropped with the old shape (the
            // replay ratio absorbs one batch per agent).
            staging = PopulationStaging::new(&env.obs, running.len(), cfg.batch_size);
            tracing::info!("{} agent(s) still training", running.len());
        }
    };
    let wall = started.elapsed().as_secs_f64();
    let results = agents
        .iter()
        .map(|a| {
            let (end, env_steps, wall_s) =
                a.end
                    .unwrap_or((AgentEnd::Interrupted, a.steps.get(), wall));
            AgentResult {
                agent: a.index,
                config: a.config,
                hparams: a.hp,
                end,
                env_steps,
                wall_s,
                final_eval: a.tracker.last.as_ref().map(|r| r.mean),
                best_eval: a.tracker.best.as_ref().map(|r| r.mean),
            }
        })
        .collect::<Vec<_>>();
    debug_assert!(interrupted || results.iter().all(|a| a.end != AgentEnd::Interrupted));
    Ok(Group {
        results,
        updates: dqn.updates(),
        split: [acting, updating, evaluating],
    })
}

fn write_results(summary: &PopulationSummary, logdir: &Path) -> Result<(), RunError> {
    let path = logdir.join("population.csv");
    summary.write_csv(&path)?;
    tracing::info!("results written to {}", path.display());
    Ok(())
}
