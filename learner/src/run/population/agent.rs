//! One agent of a population: who it is (its sweep entry and configuration), what it
//! owns while it trains (actors, replay, parameters as its actors read them), its
//! evaluations and saved policies, its TensorBoard run, and its state saved for and
//! read back by `--resume`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use millrace_actor::AnyActor;
use millrace_proto::wire::EpsilonDecay;
use millrace_proto::{EnvSpec, NetworkSpec, Params, ParamsCell, StepCounter};
use millrace_replay::Table;
use rand::rngs::SmallRng;
use rand::SeedableRng;

use super::resume::{self, Identity};
use crate::checkpoint::{self, CheckpointError, Layout, PolicyOwner, StateMeta, Which};
use crate::config::{Agents, RunConfig};
use crate::evaluation::{eval_seed, evaluate, EvalDone, EvalRecord, EvalTracker, Purpose};
use crate::population_board::{self, AgentBoard};
use crate::population_results::{AgentEnd, AgentResult, AgentSetup};
use crate::run::train_returns::TrainReturns;
use crate::run::RunError;
use crate::sweep::{check_applied, Settings, Sweep, SweepAgent, SweepError};
use millrace_core::dqn::agents::AgentHparams;
use millrace_core::dqn::DqnState;
use millrace_server::{AgentSpec, Route};

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
    pub(super) fn dir(&self, root: &Path) -> PathBuf {
        root.join("agents").join(format!("agent-{:03}", self.index))
    }

    /// Its result when the run stopped before it started.
    pub(super) fn not_started(&self) -> AgentResult {
        AgentResult {
            agent: self.index,
            config: self.sweep.config,
            label: self.sweep.label.clone(),
            hparams: self.sweep.hparams,
            setup: AgentSetup::of(&self.cfg),
            end: AgentEnd::Interrupted,
            env_steps: 0,
            wall_s: 0.0,
            final_eval: None,
            best_eval: None,
        }
    }

    /// Who it is, as `agent.json` records it. Prioritized replay's α names an agent
    /// only where its sweep gives it one: the run's `--priority-alpha` did not before
    /// α was a per-agent setting, and populations saved then still resume (and their
    /// shards still merge).
    pub(super) fn identity(&self) -> Identity {
        let mut setup = AgentSetup::of(&self.cfg);
        if self.sweep.settings.priority_alpha.is_none() {
            setup.priority_alpha = None;
        }
        Identity {
            agent: self.index,
            config: self.sweep.config,
            label: self.sweep.label.clone(),
            hparams: self.sweep.hparams,
            setup,
        }
    }
}

/// One agent and everything that is its own.
pub(super) struct Agent {
    pub(super) index: usize,
    /// Its configuration in a sweep (0 for `--population K`).
    pub(super) config: usize,
    pub(super) label: String,
    pub(super) hp: AgentHparams,
    pub(super) setup: AgentSetup,
    /// What it trains with while it trains (dropped when it ends, so a finished
    /// agent's replay is freed for the agents queued behind it).
    pub(super) live: Option<Live>,
    pub(super) steps: Arc<StepCounter>,
    pub(super) tracker: EvalTracker,
    pub(super) next_eval: u64,
    /// Its train return (see [`TrainReturns`]).
    pub(super) returns: TrainReturns,
    /// Its directory, and its checkpoint's layout (under it).
    pub(super) dir: PathBuf,
    pub(super) layout: Layout,
    pub(super) end: Option<(AgentEnd, u64, f64)>,
    /// Its TensorBoard run (`None` if it could not be written: training goes on).
    pub(super) board: Option<AgentBoard>,
}

/// What an agent needs only while it trains.
pub(super) struct Live {
    pub(super) actors: Vec<AnyActor>,
    /// Its parameters as its actors read them (a population of one).
    pub(super) params: Arc<ParamsCell>,
    /// Shared with the server's connections when remote actors serve the agent.
    pub(super) table: Arc<Table>,
    pub(super) rng: SmallRng,
}

impl Agent {
    /// The agent `m`, with its actors, replay and checkpoint directory; a resumed
    /// agent with its replay, counters and best evaluation read back, and its networks'
    /// and optimizer's state for the population to take in.
    pub(super) fn new(
        m: &Member,
        network: &NetworkSpec,
        root: &Path,
    ) -> Result<(Self, Option<DqnState>), RunError> {
        let cfg = &m.cfg;
        let dir = m.dir(root);
        let layout = Layout::new(dir.join("checkpoint"));
        std::fs::create_dir_all(&layout.root)?;
        layout.remove_leftovers();
        let saved = if m.resumed {
            let (meta, state, latest) = resume::load_state(&dir)?;
            checkpoint::check_fits(&meta, &cfg.env_spec, network).map_err(RunError::Resume)?;
            Some((meta, state, latest))
        } else {
            resume::write_identity(&dir, &m.identity()).map_err(RunError::Config)?;
            None
        };
        checkpoint::files::write_json(&layout.config(), cfg).map_err(RunError::Config)?;
        let start_steps = saved.as_ref().map_or(0, |(meta, _, _)| meta.env_steps);
        // A resumed agent's actors seed on from its env steps (new episodes).
        let actors = (0..cfg.actors.count)
            .map(|id| AnyActor::new(&cfg.actor(id as u32, start_steps), network))
            .collect::<Result<Vec<_>, _>>()?;
        let replay = crate::run::setup::replay_config(cfg, &cfg.env_spec)?;
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
                params: Arc::new(ParamsCell::new(Params::of_one(0, Vec::new()))),
                table,
                rng: SmallRng::seed_from_u64(hp.seed.wrapping_add(start_steps) ^ 0x5eed),
            }),
            steps: Arc::new(StepCounter::new(start_steps)),
            tracker: EvalTracker::new(cfg.eval.target_return, best),
            next_eval: (start_steps / every + 1) * every,
            returns: TrainReturns::default(),
            dir,
            layout,
            end: None,
            board,
        };
        Ok((agent, state))
    }

    /// Saves the agent's state (`state`: its row of the population, its own update
    /// count) with its replay into `checkpoint/latest/`, for `--resume`.
    pub(super) fn save(
        &self,
        state: &DqnState,
        network: &NetworkSpec,
        env: &EnvSpec,
        version: u64,
    ) -> Result<(), CheckpointError> {
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
        checkpoint::save_state(&self.layout.latest(), state, Some(&live.table), meta).map(|_| ())
    }

    /// Writes to the agent's TensorBoard run; a failure is said once, and the run
    /// dropped (training goes on).
    pub(super) fn board(&mut self, write: impl FnOnce(&AgentBoard) -> std::io::Result<()>) {
        if let Some(Err(e)) = self.board.as_ref().map(write) {
            tracing::warn!(
                "agent {}: TensorBoard write failed, no more: {e}",
                self.index
            );
            self.board = None;
        }
    }

    pub(super) fn live(&mut self) -> &mut Live {
        self.live
            .as_mut()
            .expect("a training agent keeps its actors and replay")
    }

    /// What remote actors need to serve this agent (`--listen`).
    pub(super) fn port(&mut self, network: &NetworkSpec) -> AgentSpec {
        let (n_step, gamma) = (self.setup.n_step as u32, self.setup.gamma);
        let (start, end, steps) = self.setup.epsilon.as_linear();
        let steps_counter = Arc::clone(&self.steps);
        let live = self.live();
        AgentSpec {
            route: Route {
                table: Arc::clone(&live.table),
                params: Arc::clone(&live.params),
                steps: steps_counter,
            },
            network: network.clone(),
            n_step,
            gamma,
            epsilon_decay: Some(EpsilonDecay { start, end, steps }),
        }
    }

    pub(super) fn result(&self, wall: f64) -> AgentResult {
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
    let (sweep, budget) = match cfg.population().map(|p| &p.agents) {
        Some(Agents::Sweep(path)) => {
            let sweep = Sweep::read(path, &cfg.dqn, cfg.seed)?;
            (sweep.agents, sweep.max_steps.unwrap_or(cfg.max_steps))
        }
        count => (
            AgentHparams::seeds(
                cfg.seed,
                match count {
                    Some(&Agents::Count(k)) => k,
                    _ => 1,
                },
            )
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
                let v = check_applied(&member_cfg).and_then(|()| agent.settings.check(cfg));
                checked.push((agent.settings.clone(), v.clone()));
                v
            }
        };
        if let Err(why) = verdict {
            return Err(SweepError::Settings {
                file: match cfg.population().map(|p| &p.agents) {
                    Some(Agents::Sweep(p)) => p.display().to_string(),
                    _ => String::new(),
                },
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
pub(super) fn evaluate_agent(
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
            evaluate(&cfg.env, network, &params, cfg.eval.episodes, seed).map_err(|e| {
                RunError::Failed {
                    component: crate::run::Component::Evaluation {
                        agent: Some(agent.index),
                    },
                    message: e.to_string(),
                    checkpoint: crate::run::CheckpointFate::AllButThisGroup,
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
            let train = agent.returns.figure().map_or(f64::NAN, f64::from);
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
            // A full disk must not end the agent: its previous best/ stands.
            if let Err(e) = save(Which::Best, &done.params, &done.record, None) {
                tracing::warn!(
                    "agent {}: {e}; its previous best/ stands, training goes on",
                    agent.index
                );
            }
        }
        if let Some(s) = &d.solved {
            save(Which::Solved, &s.params, &s.first, Some(&s.confirm))?;
        }
        next = d.confirm.map(|p| (p, Purpose::Confirm));
    }
    Ok(agent.tracker.solved.is_some())
}
