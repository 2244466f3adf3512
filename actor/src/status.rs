//! What a remote actor process reports about itself (`actor --metrics-addr`): counters
//! the session and the actor loop update as they go (atomics, nothing blocks), rendered
//! as a Prometheus page by whoever serves it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use millrace_telemetry::{Exposition, Kind};

/// Shared by the session loop, the actor thread and the metrics endpoint.
#[derive(Debug, Default)]
pub struct ActorStatus {
    connected: AtomicBool,
    sessions: AtomicU64,
    env_steps: AtomicU64,
    episodes: AtomicU64,
    /// The last finished episode's return (f32 bits).
    last_return: AtomicU64,
    params_version: AtomicU64,
}

impl ActorStatus {
    /// A session with the learner started (handshake done).
    pub fn connected(&self) {
        self.sessions.fetch_add(1, Ordering::Relaxed);
        self.connected.store(true, Ordering::Relaxed);
    }

    pub fn disconnected(&self) {
        self.connected.store(false, Ordering::Relaxed);
    }

    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// Transitions handed to the connection, acted with `version`.
    pub fn stepped(&self, transitions: u64, version: u64) {
        self.env_steps.fetch_add(transitions, Ordering::Relaxed);
        self.params_version.store(version, Ordering::Relaxed);
    }

    pub fn episode(&self, episode_return: f32) {
        self.episodes.fetch_add(1, Ordering::Relaxed);
        self.last_return
            .store(u64::from(episode_return.to_bits()), Ordering::Relaxed);
    }

    /// The Prometheus page for actor `name` running `envs` environments.
    pub fn page(&self, name: &str, envs: usize) -> String {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        let episodes = self.episodes.load(Ordering::Relaxed);
        let last = f32::from_bits(self.last_return.load(Ordering::Relaxed) as u32);
        let mut e = Exposition::new();
        e.labelled(
            "millrace_actor_info",
            Kind::Gauge,
            "This actor's name (the label) and environments (the value).",
            "actor",
            [(name, envs as f64)],
        )
        .metric(
            "millrace_actor_connected",
            Kind::Gauge,
            "1 while a session with the learner is open.",
            f64::from(u8::from(self.is_connected())),
        )
        .metric(
            "millrace_actor_sessions_total",
            Kind::Counter,
            "Sessions with a learner so far (reconnections included).",
            get(&self.sessions),
        )
        .metric(
            "millrace_actor_env_steps_total",
            Kind::Counter,
            "Transitions sent to the learner.",
            get(&self.env_steps),
        )
        .metric(
            "millrace_actor_episodes_total",
            Kind::Counter,
            "Episodes finished.",
            episodes as f64,
        )
        .metric(
            "millrace_actor_last_episode_return",
            Kind::Gauge,
            "Return of the last finished episode (NaN before the first).",
            if episodes == 0 {
                f64::NAN
            } else {
                f64::from(last)
            },
        )
        .metric(
            "millrace_actor_params_version",
            Kind::Gauge,
            "Parameter version the actor last acted with.",
            get(&self.params_version),
        );
        e.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_follows_the_session() {
        let s = ActorStatus::default();
        assert!(s
            .page("a", 8)
            .contains("millrace_actor_last_episode_return NaN"));
        s.connected();
        s.stepped(16, 3);
        s.episode(21.5);
        let p = s.page("a", 8);
        for line in [
            "millrace_actor_info{actor=\"a\"} 8",
            "millrace_actor_connected 1",
            "millrace_actor_sessions_total 1",
            "millrace_actor_env_steps_total 16",
            "millrace_actor_last_episode_return 21.5",
            "millrace_actor_params_version 3",
        ] {
            assert!(p.lines().any(|l| l == line), "{line:?} missing:\n{p}");
        }
        s.disconnected();
        assert!(!s.is_connected());
    }
}
