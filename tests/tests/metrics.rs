//! `--metrics-addr` as Prometheus and the container health checks see it: a learner
//! serving remote actors and an actor, both with their metrics endpoint; their pages read
//! by Prometheus' own text parser (`prometheus_client`, through
//! `scripts/parse_metrics.py`), their `/healthz` through the binaries' `health`
//! subcommands (what docker-compose and Kubernetes run).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use millrace_tests::{binary, wait_until, KillOnDrop};

mod common;
use common::prometheus::{kind, metrics_addr, page, parsed, value};
use common::reference::{assert_documented, sample_names, tensorboard_tags};
use common::{finish, learner_on};

fn health(bin: &str, addr: &str, live: bool) -> (bool, String) {
    let mut cmd = Command::new(binary(bin));
    cmd.args(["health", "--metrics-addr", addr, "--timeout-s", "2"]);
    if live {
        cmd.arg("--live");
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn learner_and_actor_pages_parse_as_prometheus_and_health_follows_the_run() {
    let dir = tempfile::tempdir().unwrap();
    // No evaluation before 20k steps: the run cannot end before the checks below.
    let l = learner_on(
        "127.0.0.1:0",
        dir.path(),
        // A step budget a little past that evaluation, so the run ends soon whatever
        // its luck (solved, or out of steps).
        &[
            "--metrics-addr",
            "127.0.0.1:0",
            "--eval-every",
            "20000",
            "--max-steps",
            "24000",
        ],
    );
    let mut learner_metrics = None;
    wait_until(
        "the learner logs its metrics address",
        Duration::from_secs(30),
        || {
            learner_metrics = l.log.lock().unwrap().iter().find_map(|s| metrics_addr(s));
            learner_metrics.is_some()
        },
    );
    let lm = learner_metrics.unwrap();
    // Ready: the server accepts actors (none has connected yet).
    let (ok, said) = health("learner", &lm, false);
    assert!(ok && said.contains("ready"), "{said}");

    let mut actor = KillOnDrop::spawn(
        Command::new(binary("actor"))
            .args(["--n", "8", "--learner", &l.addr, "--name", "probe"])
            .args(["--metrics-addr", "127.0.0.1:0"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    let (tx, rx) = mpsc::channel();
    let stderr = actor.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(a) = metrics_addr(&line) {
                let _ = tx.send(a);
            }
        }
    });
    let am = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the actor's metrics address");

    // Training under way with the actor connected, as the learner's page says.
    wait_until(
        "the learner's page shows the actor and training",
        Duration::from_secs(60),
        || {
            let f = parsed(&page(&lm));
            // The page is empty until the first metrics tick.
            // Parameters are published every 20 updates: a tick can see updates
            // before the first version (a CI failure on a loaded machine).
            f.contains_key("millrace_actors_connected")
                && value(&f, "millrace_actors_connected", &[]) == 1.0
                && value(&f, "millrace_updates_total", &[]) > 0.0
                && value(&f, "millrace_params_version", &[]) > 0.0
        },
    );
    let f = parsed(&page(&lm));
    assert_eq!(kind(&f, "millrace_env_steps_total"), "counter");
    assert_eq!(kind(&f, "millrace_perf_updates_per_s"), "gauge");
    assert!(value(&f, "millrace_env_steps_total", &[]) > 0.0);
    assert!(value(&f, "millrace_replay_size", &[]) > 0.0);
    assert!(value(&f, "millrace_params_version", &[]) > 0.0);
    for side in ["insert", "sample"] {
        assert!(
            value(
                &f,
                "millrace_rate_limiter_blocked_seconds_total",
                &[("side", side)]
            ) >= 0.0
        );
    }
    // The checkpoint writer's outcomes and replay's clamped priorities, as counters.
    for outcome in ["written", "failed", "skipped"] {
        let n = value(&f, "millrace_checkpoints_total", &[("outcome", outcome)]);
        assert!(n >= 0.0, "{outcome}: {n}");
    }
    assert_eq!(kind(&f, "millrace_checkpoints_total"), "counter");
    assert_eq!(
        value(&f, "millrace_checkpoint_replay_failures_total", &[]),
        0.0
    );
    assert_eq!(
        value(&f, "millrace_replay_clamped_priorities_total", &[]),
        0.0
    );
    for part in [
        "wait_data",
        "host_to_device",
        "publish",
        "priorities",
        "metrics",
        "checkpoint",
    ] {
        let x = value(&f, &format!("millrace_stall_{part}"), &[]);
        assert!((0.0..=1.0).contains(&x), "{part}: {x}");
    }
    assert!(value(&f, "millrace_actor_version_lag", &[("actor", "probe")]) >= 0.0);
    // The reference lists what the page serves (a listening learner, uniform replay,
    // before its first evaluation).
    assert_documented(
        "Prometheus: the learner",
        &sample_names(&f),
        &["always", "`--listen`"],
    );

    // Alive while it trains: the learner thread shows signs of life.
    let (ok, said) = health("learner", &lm, true);
    assert!(ok && said.contains("alive"), "{said}");
    let (ok, said) = health("actor", &am, false);
    assert!(
        ok && said.contains("ready"),
        "the actor is connected: {said}"
    );
    let a = parsed(&page(&am));
    assert_eq!(value(&a, "millrace_actor_connected", &[]), 1.0);
    assert_eq!(value(&a, "millrace_actor_info", &[("actor", "probe")]), 8.0);
    assert!(value(&a, "millrace_actor_env_steps_total", &[]) > 0.0);
    assert_documented("Prometheus: an actor", &sample_names(&a), &["always"]);

    // The run ends (solved, or out of steps); the actor is told and exits 0.
    // A safety net, several times the measured time (~40–70 s idle, 2026-12-07).
    let (code, out, _) = finish(l, Duration::from_secs(600));
    assert!(matches!(code, Some(0) | Some(2)), "{out}");
    let status = actor.wait().unwrap();
    assert!(
        status.success(),
        "the actor exits 0 when the run is finished: {status}"
    );
    reader.join().unwrap();
    // What the run wrote for TensorBoard, as its own reader reads it, is what the
    // reference lists (an evaluation has run by the end: 20k steps came first).
    assert_documented(
        "TensorBoard: a run",
        &tensorboard_tags(dir.path()),
        &[
            "always",
            "`--listen`",
            "`--listen`, per connected actor",
            "at the end of the run",
        ],
    );
    // Nothing answers any more: health says so (exit 1), for learner and actor alike.
    let (ok, said) = health("learner", &lm, true);
    assert!(!ok && said.contains("cannot reach"), "{said}");
    let (ok, _) = health("actor", &am, true);
    assert!(!ok);
}

#[test]
fn a_taken_metrics_port_is_one_error_line_before_anything_starts() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(binary("learner"))
        .args(["--metrics-addr", &addr, "--no-progress", "--logdir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("error: --metrics-addr {addr}: cannot listen")),
        "{err}"
    );
    // Setup writes the configuration at once: it was never reached.
    assert!(
        !dir.path().join("checkpoint/config.json").exists(),
        "nothing ran"
    );
}
