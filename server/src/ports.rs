//! Where a remote actor's transitions go and its parameters come from: the run's one
//! replay and parameters ([`Routes::One`]), or, for a population, the agent it is
//! assigned at the handshake ([`AgentPorts`]). A population opens an agent's port when
//! the agent starts training and closes it when the agent ends; the actors serving it
//! are then told the learner is stopping (for them), reconnect, and are assigned an
//! agent that still trains.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use millrace_proto::wire::EpsilonDecay;
use millrace_proto::{NetworkSpec, ParamsCell, StepCounter};
use millrace_replay::Table;
use tokio::sync::watch;

/// One replay, its parameters and its env step count.
#[derive(Clone, Debug)]
pub struct Route {
    pub table: Arc<Table>,
    pub params: Arc<ParamsCell>,
    /// Remote transitions count as env steps here (one per transition).
    pub steps: Arc<StepCounter>,
}

/// Where the server's actors are routed.
#[derive(Clone, Debug)]
pub enum Routes {
    /// A single run: every actor serves it.
    One(Route),
    /// A population: each actor serves one agent.
    Agents(Arc<AgentPorts>),
}

/// What an agent's actors need to know of it.
#[derive(Clone, Debug)]
pub struct AgentSpec {
    pub route: Route,
    pub network: NetworkSpec,
    pub n_step: u32,
    pub gamma: f32,
    /// Its ε schedule, on its own env steps (`None`: the server's Ape-X ε).
    pub epsilon_decay: Option<EpsilonDecay>,
}

/// An open agent.
#[derive(Debug)]
pub struct AgentPort {
    pub spec: AgentSpec,
    /// Its parameters, encoded once per version for its connections (by the server's
    /// broadcaster).
    pub frames: watch::Sender<Option<Arc<super::ParamsFrame>>>,
    /// The version in `frames`.
    pub sent: Mutex<Option<u64>>,
    /// Turns true when the agent ends.
    pub ended: watch::Sender<bool>,
    /// Connections serving it now.
    pub actors: AtomicUsize,
}

/// A population's agents that actors may serve, by agent number.
#[derive(Debug)]
pub struct AgentPorts {
    open: Mutex<BTreeMap<u32, Arc<AgentPort>>>,
    /// Agents that have not ended yet, open or to come.
    remaining: AtomicUsize,
    /// The population's agents are numbered below this.
    numbered: u32,
    /// Agents that ended in this run.
    ended: Mutex<BTreeSet<u32>>,
}

/// Why an actor gets no agent.
#[derive(Debug, PartialEq)]
pub enum Unavailable {
    /// None is open now (or not the one it asks for): worth retrying.
    NotNow(String),
    /// The one it asks for will never train here.
    Never(String),
}

impl AgentPorts {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u32, Arc<AgentPort>>> {
        // Each change is one insert or removal: a poisoned map is still consistent.
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ports for a population whose agents are numbered below `numbered`, `agents` of
    /// them still to train.
    pub fn new(agents: usize, numbered: usize) -> Self {
        Self {
            open: Mutex::default(),
            remaining: AtomicUsize::new(agents),
            numbered: u32::try_from(numbered).unwrap_or(u32::MAX),
            ended: Mutex::default(),
        }
    }

    /// Opens agent `agent` to actors.
    pub fn open(&self, agent: u32, spec: AgentSpec) {
        let port = AgentPort {
            spec,
            frames: watch::channel(None).0,
            sent: Mutex::new(None),
            ended: watch::channel(false).0,
            actors: AtomicUsize::new(0),
        };
        self.lock().insert(agent, Arc::new(port));
    }

    /// Closes agent `agent`, which ended: its actors are told to come back for another,
    /// unless it was the last (true): then the run's own goodbye is theirs.
    pub fn close(&self, agent: u32) -> bool {
        let Some(port) = self.lock().remove(&agent) else {
            return false;
        };
        self.ended
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(agent);
        let last = self.remaining.fetch_sub(1, Ordering::AcqRel) == 1;
        if !last {
            port.ended.send_replace(true);
        }
        last
    }

    /// The open agents.
    pub fn all(&self) -> Vec<Arc<AgentPort>> {
        self.lock().values().cloned().collect()
    }

    /// The agent a new actor serves: the one it asks for if that one is open, else the
    /// open agent with the fewest actors (the lowest number among equals); counted as
    /// served until [`AgentPorts::leave`].
    pub fn assign(&self, wanted: Option<u32>) -> Result<(u32, Arc<AgentPort>), Unavailable> {
        if let Some(a) = wanted {
            let ended = self.ended.lock().unwrap_or_else(|e| e.into_inner());
            if a >= self.numbered || ended.contains(&a) {
                return Err(Unavailable::Never(format!(
                    "agent {a} will not train in this run ({} agents, numbered from 0; ended: {})",
                    self.numbered,
                    ended.contains(&a)
                )));
            }
        }
        let open = self.lock();
        let (agent, port) = match wanted {
            Some(a) => open
                .get_key_value(&a)
                .ok_or_else(|| Unavailable::NotNow(format!("agent {a} is not training yet")))?,
            None => open
                .iter()
                .min_by_key(|(a, p)| (p.actors.load(Ordering::Relaxed), **a))
                .ok_or_else(|| Unavailable::NotNow("no agent is training now".into()))?,
        };
        port.actors.fetch_add(1, Ordering::Relaxed);
        Ok((*agent, Arc::clone(port)))
    }

    /// The open agents that no actor serves.
    pub fn without_actors(&self) -> Vec<u32> {
        self.lock()
            .iter()
            .filter(|(_, p)| p.actors.load(Ordering::Relaxed) == 0)
            .map(|(a, _)| *a)
            .collect()
    }

    /// An actor of `port` left.
    pub fn leave(port: &AgentPort) {
        port.actors.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use millrace_proto::{DType, ObsSpec, Params};
    use millrace_replay::{RateLimiterConfig, ReplayConfig};

    fn spec() -> AgentSpec {
        let obs = ObsSpec {
            shape: vec![4],
            dtype: DType::F32,
        };
        let table = Table::new(&ReplayConfig {
            capacity: 1000,
            shards: 1,
            obs_row_bytes: obs.row_bytes(),
            stack: 1,
            obs_rows_per_item: 2.0,
            limiter: RateLimiterConfig::sample_to_insert_ratio(1.0, 1, 1e9, 1).unwrap(),
            priority: None,
        })
        .unwrap();
        AgentSpec {
            route: Route {
                table: Arc::new(table),
                params: Arc::new(ParamsCell::new(Params::of_one(0, Vec::new()))),
                steps: Arc::new(StepCounter::new(0)),
            },
            network: NetworkSpec::mlp(&obs, &[8], 2, 1).unwrap(),
            n_step: 1,
            gamma: 0.99,
            epsilon_decay: None,
        }
    }

    #[test]
    fn actors_spread_over_open_agents_and_leave_closed_ones() {
        let ports = AgentPorts::new(3, 7);
        assert!(ports.assign(None).is_err(), "nothing open yet");
        for a in [3, 5] {
            ports.open(a, spec());
        }
        let (first, _) = ports.assign(None).unwrap();
        let (second, p5) = ports.assign(None).unwrap();
        assert_eq!((first, second), (3, 5));
        assert_eq!(ports.assign(Some(5)).unwrap().0, 5);
        assert!(matches!(ports.assign(Some(4)), Err(Unavailable::NotNow(_))));
        assert!(matches!(ports.assign(Some(7)), Err(Unavailable::Never(_))));
        // Agent 5 has two actors now: the next goes to agent 3.
        assert_eq!(ports.assign(None).unwrap().0, 3);
        AgentPorts::leave(&p5);
        let ended = p5.ended.subscribe();
        assert!(!ports.close(5), "two agents remain");
        assert!(*ended.borrow());
        assert_eq!(ports.all().len(), 1);
        assert!(
            matches!(ports.assign(Some(5)), Err(Unavailable::Never(_))),
            "it ended"
        );
        ports.open(6, spec());
        let (six, p6) = ports.assign(None).unwrap();
        assert_eq!(six, 6, "no actor yet");
        assert!(!ports.close(3));
        let ended = p6.ended.subscribe();
        assert!(ports.close(6), "the last agent");
        assert!(!*ended.borrow(), "the run's goodbye is its actors'");
    }
}
