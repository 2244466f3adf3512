//! A population's Prometheus page (`--metrics-addr`): one series per agent, labelled
//! `agent="NNN"` (its number in population.csv), and the population's totals. Group
//! threads record their agents after each round; the page is rendered at most once a
//! second and served by `millrace_telemetry`, so a scrape never touches the hot loop.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use millrace_telemetry::{Endpoint, Exposition, Kind};

/// The page is rendered at most this often.
const RENDER_EVERY: Duration = Duration::from_secs(1);

/// One agent's numbers as of its group's last round.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AgentSeries {
    pub env_steps: u64,
    /// Its own stacked updates.
    pub updates: u64,
    /// Its train return (see `TrainReturns`; NaN before the first episode).
    pub episode_return: f64,
    /// Its last greedy evaluation's mean return (NaN before the first).
    pub eval_return: f64,
    pub learning_rate: f64,
    pub replay_size: u64,
    /// Priorities an actor sent above the bound (prioritized replay), in all.
    pub clamped_priorities: u64,
    /// Whether it still trains (0 once it ended).
    pub training: bool,
}

#[derive(Debug)]
struct Page {
    agents: BTreeMap<usize, AgentSeries>,
    rendered: Option<Instant>,
    /// Agents whose last checkpoints failed, and how many in a row.
    failing: BTreeMap<usize, u64>,
}

/// How `/livez` names a group of agents: by the agents it was given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupName(String);

impl GroupName {
    pub fn of(agents: &[usize]) -> Self {
        let listed: Vec<String> = agents.iter().take(4).map(|a| format!("{a:03}")).collect();
        let more = match agents.len().saturating_sub(4) {
            0 => String::new(),
            n => format!(" and {n} more"),
        };
        Self(format!("the group of agents {}{more}", listed.join(", ")))
    }
}

/// Shared by the population's group threads.
#[derive(Debug)]
pub struct PopulationMetrics {
    endpoint: Arc<Endpoint>,
    /// How long a group may go without a round (`--live-limit-s`).
    live_limit: Duration,
    page: Mutex<Page>,
}

impl PopulationMetrics {
    pub fn new(endpoint: Arc<Endpoint>, live_limit: Duration) -> Self {
        Self {
            endpoint,
            live_limit,
            page: Mutex::new(Page {
                agents: BTreeMap::new(),
                rendered: None,
                failing: BTreeMap::new(),
            }),
        }
    }

    /// `/healthz` answers ready from now on.
    pub fn ready(&self) {
        self.endpoint.set_ready();
    }

    /// An agent's checkpoint, written or not: while any agent's fail, `/healthz` says
    /// which (the population stays ready).
    pub fn checkpoint(&self, agent: usize, written: bool) {
        let mut page = self.page.lock().unwrap_or_else(|p| p.into_inner());
        if written {
            page.failing.remove(&agent);
        } else {
            *page.failing.entry(agent).or_default() += 1;
        }
        let warning = (!page.failing.is_empty()).then(|| {
            let agents: Vec<String> = page
                .failing
                .iter()
                .map(|(a, n)| format!("{a:03} ({n} in a row)"))
                .collect();
            format!(
                "checkpoints failing for agent(s) {} (see the log: a full disk?); their states saved before stand",
                agents.join(", ")
            )
        });
        self.endpoint.set_warning(warning);
    }

    /// Whether the page is due for a render: the group threads compute their agents'
    /// numbers (which read each replay's counters) only then.
    pub fn due(&self) -> bool {
        let page = self.page.lock().unwrap_or_else(|p| p.into_inner());
        page.rendered.is_none_or(|t| t.elapsed() >= RENDER_EVERY)
    }

    /// Group `group`'s sign of life, once per round: `/livez` fails when any group
    /// shows none for the live limit, even while the others train, and names it.
    pub fn alive(&self, group: &GroupName) {
        self.endpoint.progress_of(&group.0, self.live_limit);
    }

    /// Group `group` ended (its agents finished, or the run stops): no longer watched.
    pub fn finished(&self, group: &GroupName) {
        self.endpoint.finished(&group.0);
    }

    /// Records `agents`' numbers; renders the page if it is due (or `now`).
    pub fn record(&self, agents: impl IntoIterator<Item = (usize, AgentSeries)>, now: bool) {
        let mut page = self.page.lock().unwrap_or_else(|p| p.into_inner());
        page.agents.extend(agents);
        if now || page.rendered.is_none_or(|t| t.elapsed() >= RENDER_EVERY) {
            self.endpoint.publish(render(&page.agents));
            page.rendered = Some(Instant::now());
        }
    }
}

/// A per-agent family: its name, type, help, and each agent's value.
type Family = (&'static str, Kind, &'static str, fn(&AgentSeries) -> f64);

/// The page: the totals, then one family per series with a sample per agent.
pub fn render(agents: &BTreeMap<usize, AgentSeries>) -> String {
    let mut e = Exposition::new();
    let steps: u64 = agents.values().map(|a| a.env_steps).sum();
    e.metric(
        "millrace_env_steps_total",
        Kind::Counter,
        "Env steps taken by every agent of the population.",
        steps as f64,
    );
    let training = agents.values().filter(|a| a.training).count();
    e.metric(
        "millrace_population_agents_training",
        Kind::Gauge,
        "Agents of the population training now (the others ended or queue).",
        training as f64,
    );
    let names: Vec<String> = agents.keys().map(|k| format!("{k:03}")).collect();
    let each = |f: fn(&AgentSeries) -> f64| {
        names
            .iter()
            .zip(agents.values())
            .map(move |(n, a)| (n.as_str(), f(a)))
    };
    let families: [Family; 8] = [
        (
            "millrace_agent_env_steps_total",
            Kind::Counter,
            "Env steps the agent took (a resumed agent counts on from its checkpoint).",
            |a| a.env_steps as f64,
        ),
        (
            "millrace_agent_updates_total",
            Kind::Counter,
            "Updates the agent had in its stacked population.",
            |a| a.updates as f64,
        ),
        (
            "millrace_agent_episode_return",
            Kind::Gauge,
            "Median over the agent's actors of each one's mean return in its last 100 training episodes.",
            |a| a.episode_return,
        ),
        (
            "millrace_agent_eval_mean_return",
            Kind::Gauge,
            "Mean return of the agent's last greedy evaluation.",
            |a| a.eval_return,
        ),
        (
            "millrace_agent_learning_rate",
            Kind::Gauge,
            "The agent's learning rate now (its own, decayed by --lr-final if set).",
            |a| a.learning_rate,
        ),
        (
            "millrace_agent_replay_size",
            Kind::Gauge,
            "Transitions held in the agent's replay.",
            |a| a.replay_size as f64,
        ),
        (
            "millrace_agent_replay_clamped_priorities_total",
            Kind::Counter,
            "Actor priorities above the bound that the agent's replay clamped.",
            |a| a.clamped_priorities as f64,
        ),
        (
            "millrace_agent_training",
            Kind::Gauge,
            "1 while the agent trains, 0 once it ended.",
            |a| f64::from(u8::from(a.training)),
        ),
    ];
    for (name, kind, help, f) in families {
        e.labelled(name, kind, help, "agent", each(f));
    }
    e.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_groups_round_is_its_own_sign_of_life() {
        let ep = Endpoint::new("starting");
        let m = PopulationMetrics::new(Arc::clone(&ep), crate::metrics::LIVE_LIMIT);
        assert!(!ep.progressed(), "/livez waits for the first round");
        m.record([(0, AgentSeries::default())], false);
        assert!(!ep.progressed(), "a page is no round");
        let (a, b) = (GroupName::of(&[0, 2]), GroupName::of(&[1, 3, 5, 7, 9, 11]));
        assert_eq!(b.0, "the group of agents 001, 003, 005, 007 and 2 more");
        m.alive(&a);
        m.alive(&b);
        assert!(ep.progressed());
        assert_eq!(ep.live(), Ok(()));
        m.finished(&a);
        m.finished(&b);
        m.checkpoint(3, false);
        m.checkpoint(3, false);
        m.checkpoint(5, true);
        let w = ep.warning().expect("a warning");
        assert!(w.contains("agent(s) 003 (2 in a row)"), "{w}");
        m.checkpoint(3, true);
        assert_eq!(ep.warning(), None);
    }

    #[test]
    fn one_sample_per_agent_and_the_totals() {
        let mut agents = BTreeMap::new();
        for (k, steps) in [(0, 100), (7, 250)] {
            agents.insert(
                k,
                AgentSeries {
                    env_steps: steps,
                    updates: steps / 4,
                    episode_return: f64::NAN,
                    training: k == 7,
                    ..AgentSeries::default()
                },
            );
        }
        let page = render(&agents);
        assert!(page.contains("millrace_env_steps_total 350\n"), "{page}");
        assert!(page.contains("millrace_population_agents_training 1\n"));
        assert!(page.contains("millrace_agent_env_steps_total{agent=\"007\"} 250\n"));
        assert!(page.contains("millrace_agent_updates_total{agent=\"000\"} 25\n"));
        assert!(page.contains("millrace_agent_episode_return{agent=\"000\"} NaN\n"));
        assert!(page.contains("millrace_agent_training{agent=\"000\"} 0\n"));
    }
}
