//! The learner's Prometheus page (`--metrics-addr`): the same numbers as its TensorBoard
//! scalars, under the same names (`perf/updates_per_s` is `millrace_perf_updates_per_s`),
//! plus the run's counters and one series per connected actor. Rendered by
//! [`crate::metrics::Metrics`] once per tick and served by `millrace_telemetry`.

use millrace_replay::ReplayStats;
use millrace_telemetry::{Exposition, Kind};

use crate::checkpoint::writer::WriterStats;
use millrace_server::ActorEntry;

/// What each TensorBoard scalar means, for the `# HELP` lines.
fn help(tag: &str) -> &'static str {
    match tag {
        "charts/episode_return" => {
            "Median over actors of each one's mean return in the last 100 training episodes."
        }
        "charts/epsilon" => "Exploration rate of the run's schedule now.",
        "charts/learning_rate" => "Learning rate now (--lr, decayed to --lr-final if set).",
        "losses/loss" => "Mean TD loss over the last report.",
        "losses/td_abs" => "Mean absolute TD error over the last report.",
        "losses/q_values" => "Mean Q value of the taken actions over the last report.",
        "losses/nonfinite_skipped" => "Updates skipped for a non-finite loss in the last report.",
        "perf/env_steps_per_s" => "Env steps per second over the last tick.",
        "perf/updates_per_s" => "Learner updates per second over the last tick.",
        "perf/inserts_per_s" => "Transitions inserted into replay per second.",
        "perf/samples_per_s" => "Transitions sampled from replay per second.",
        "perf/duty_cycle" => "Fraction of the learner thread's time spent computing updates.",
        "stall/wait_data" => "Fraction of the learner's time waiting for batches.",
        "stall/host_to_device" => "Fraction of the learner's time copying batches to the device.",
        "stall/publish" => "Fraction of the learner's time publishing parameters.",
        "stall/priorities" => "Fraction of the learner's time handing TD errors to replay.",
        "stall/metrics" => "Fraction of the learner's time reading statistics.",
        "stall/checkpoint" => "Fraction of the learner's time handing over checkpoints.",
        "stall/checkpoint_max_s" => "Longest checkpoint hand-over so far, seconds.",
        "replay/size" => "Transitions held in replay.",
        "replay/obs_rows_per_item" => "Observation rows (or frames) held per stored transition.",
        "replay/dropped" => "Transitions dropped because their frames were gone.",
        "replay/insert_blocked_s" => "Seconds actors spent blocked by the rate limiter, in all.",
        "replay/sample_blocked_s" => {
            "Seconds the sampler spent blocked by the rate limiter, in all."
        }
        "replay/ratio" => "Samples per insert so far.",
        "params/version" => "Parameter version last published.",
        "replay/sampled_age_versions" => "Mean age of sampled data, in parameter versions.",
        "actors/connected" => "Remote actors connected.",
        "actors/transitions_per_s" => "Transitions per second from all remote actors.",
        "actors/mean_version_lag" => "Mean parameter-version lag of the remote actors.",
        "actors/max_version_lag" => "Largest parameter-version lag of a remote actor.",
        "eval/mean_return" => "Mean return of the last greedy evaluation.",
        "eval/params_version" => "Parameter version the last evaluation played.",
        _ => "A TensorBoard scalar of the same name.",
    }
}

/// `perf/updates_per_s` → `millrace_perf_updates_per_s`.
pub fn name(tag: &str) -> String {
    let mut out = String::with_capacity(tag.len() + 9);
    out.push_str("millrace_");
    out.extend(
        tag.chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }),
    );
    out
}

/// The page: counters first (the checkpoint writer's where there is one), then every
/// scalar as a gauge, then the actors.
pub fn page(
    steps: u64,
    updates: u64,
    replay: &ReplayStats,
    checkpoints: Option<&WriterStats>,
    scalars: &[(&str, f64)],
    actors: &[(u32, ActorEntry)],
) -> String {
    let mut e = Exposition::new();
    e.metric(
        "millrace_env_steps_total",
        Kind::Counter,
        "Env steps taken by the run (a resumed run counts on from its checkpoint).",
        steps as f64,
    )
    .metric(
        "millrace_updates_total",
        Kind::Counter,
        "Learner updates since this process started.",
        updates as f64,
    )
    .metric(
        "millrace_replay_inserted_total",
        Kind::Counter,
        "Transitions inserted into replay.",
        replay.inserted as f64,
    )
    .metric(
        "millrace_replay_sampled_total",
        Kind::Counter,
        "Transitions sampled from replay.",
        replay.sampled as f64,
    )
    .labelled(
        "millrace_replay_priority_updates_total",
        Kind::Counter,
        "Priorities handed to replay by the learner (prioritized replay), by what became of them.",
        "outcome",
        [
            ("applied", replay.priority_updates as f64),
            ("stale", replay.stale_priority_updates as f64),
        ],
    )
    .metric(
        "millrace_replay_invalid_priorities_total",
        Kind::Counter,
        "Priorities that were negative or not finite (replaced by the running maximum, never stored).",
        replay.invalid_priorities as f64,
    )
    .metric(
        "millrace_replay_evicted_poison_total",
        Kind::Counter,
        "Items evicted from replay as poison: their TD errors were not finite or beyond anything the run's value bounds allow.",
        replay.evicted as f64,
    )
    .metric(
        "millrace_replay_clamped_priorities_total",
        Kind::Counter,
        "Actors' priorities above ten times the learner's largest (stored at that bound).",
        replay.clamped_priorities as f64,
    )
    .labelled(
        "millrace_rate_limiter_blocked_seconds_total",
        Kind::Counter,
        "Seconds each side spent blocked by replay's rate limiter.",
        "side",
        [
            ("insert", replay.insert_blocked_s),
            ("sample", replay.sample_blocked_s),
        ],
    );
    if let Some(c) = checkpoints {
        e.labelled(
            "millrace_checkpoints_total",
            Kind::Counter,
            "Checkpoints of latest/ by outcome (skipped: the writer was still busy with the previous one).",
            "outcome",
            [
                ("written", c.written as f64),
                ("failed", c.failed as f64),
                ("skipped", c.skipped as f64),
            ],
        )
        .metric(
            "millrace_checkpoint_replay_failures_total",
            Kind::Counter,
            "Checkpoints written without a new replay file (its write failed; the previous one was kept).",
            c.replay_failed as f64,
        );
    }
    for (tag, v) in scalars {
        e.metric(&name(tag), Kind::Gauge, help(tag), *v);
    }
    let ids: Vec<String> = actors.iter().map(|(id, _)| id.to_string()).collect();
    let labels = |i: usize| {
        vec![
            ("id", ids[i].as_str()),
            ("actor", actors[i].1.name.as_str()),
        ]
    };
    e.family(
        "millrace_actor_version_lag",
        Kind::Gauge,
        "Learner parameter version minus the version the actor last acted with.",
        (0..actors.len()).map(|i| (labels(i), actors[i].1.version_lag as f64)),
    )
    .family(
        "millrace_actor_transitions_per_s",
        Kind::Gauge,
        "Transitions per second received from the actor.",
        (0..actors.len()).map(|i| (labels(i), actors[i].1.transitions_per_s)),
    )
    .family(
        "millrace_actor_evicted_total",
        Kind::Counter,
        "The actor's transitions evicted from replay as poison this session (at 64 it is refused).",
        (0..actors.len()).map(|i| (labels(i), actors[i].1.evicted as f64)),
    )
    .family(
        "millrace_actor_episode_return",
        Kind::Gauge,
        "Mean of the actor's last 100 counted episode returns (NaN before the first).",
        (0..actors.len()).map(|i| (labels(i), actors[i].1.mean_return())),
    );
    e.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_become_prometheus_names() {
        assert_eq!(name("perf/updates_per_s"), "millrace_perf_updates_per_s");
        assert_eq!(name("actors/connected"), "millrace_actors_connected");
    }

    #[test]
    fn the_page_has_counters_scalars_and_one_series_per_actor() {
        let replay = ReplayStats {
            inserted: 10,
            sampled: 20,
            insert_blocked_s: 1.5,
            ..Default::default()
        };
        let actor = |name: &str, lag| ActorEntry {
            name: name.into(),
            version_lag: lag,
            ..Default::default()
        };
        let checkpoints = WriterStats {
            written: 4,
            failed: 2,
            replay_failed: 1,
            ..Default::default()
        };
        let p = page(
            7,
            3,
            &replay,
            Some(&checkpoints),
            &[("perf/updates_per_s", 2.5)],
            &[(1, actor("a", 4)), (2, actor("a", 5))],
        );
        for line in [
            "millrace_env_steps_total 7",
            "# TYPE millrace_updates_total counter",
            "millrace_rate_limiter_blocked_seconds_total{side=\"insert\"} 1.5",
            "millrace_perf_updates_per_s 2.5",
            "millrace_checkpoints_total{outcome=\"failed\"} 2",
            "millrace_checkpoint_replay_failures_total 1",
            "millrace_actor_version_lag{id=\"1\",actor=\"a\"} 4",
            "millrace_actor_version_lag{id=\"2\",actor=\"a\"} 5",
        ] {
            assert!(p.lines().any(|l| l == line), "{line:?} missing from:\n{p}");
        }
    }
}
