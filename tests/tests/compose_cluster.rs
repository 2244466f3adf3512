//! The local cluster as users run it: `deploy/docker-compose.yml` brought up by
//! docker-compose from a clean state with the images `deploy/build.sh` made (offline,
//! no registry), training CartPole-v1 with 2 actor replicas; scaled to 4 and back to 1;
//! an actor container crashed (its process killed from the host, which restart
//! policies treat as a failure, unlike `docker kill`) and restarted by its policy while
//! training goes on; the learner container stopped (SIGTERM: final checkpoint) and
//! started again, resuming from its checkpoint while the same actor reconnects by
//! itself; the learner crashed and restarted by its policy, resuming too. Until then
//! the run's target is out of reach, so that it cannot end before all that is done,
//! however fast the machine; then the learner is stopped and started with CartPole's
//! own target (475) and a step budget 20,000 steps past where the run stands
//! (docker-compose recreates its container on the same volume), resumes once more and
//! ends, solved or on its budget, whichever comes first (a threaded run sees its data in
//! a different order each time: it must not have to solve by a deadline, issue "One bad
//! transition…", part 6); the finished learner and actor stay stopped (exit 0); out of
//! the volume, the run's TensorBoard events are read by TensorBoard and the saved
//! policy is replayed in Gymnasium: near the target if the run solved, far above a random
//! policy's ~22 otherwise; everything is torn down with its volumes.
//!
//! Needs Docker, docker-compose and the images: `deploy/build.sh`, then
//! `cargo test -p millrace-tests --test compose_cluster -- --ignored`.
//! `scripts/test.sh` does both when `docker info` succeeds, and says plainly that the
//! test was skipped otherwise.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use millrace_tests::{binary, ok, output_text, read_json, run, venv_python};

const LEARNER_IMAGE: &str = "millrace/learner:cpu";
const ACTOR_IMAGE: &str = "millrace/actor:native";
/// The learner's flags while the cluster is scaled, crashed and restarted: a target no
/// CartPole episode reaches (they end at 500), and steps enough for any machine.
const OUT_OF_REACH: &str = "--target-return 1000 --max-steps 100000000 --seed 1";
/// Then: CartPole's own target (its reward threshold, 475), within a step budget this
/// far past where the run stands.
const BUDGET: u64 = 20_000;
/// A random CartPole policy returns ~22; a run that learned anything doubles it.
const LEARNED: f64 = 50.0;
/// A solved run's policy on 100 fresh Gymnasium episodes: the learner confirmed 475 on
/// its own evaluation episodes, and other episodes of the same policy land near it but
/// may fall a little short (473.2 once, 2026-12-07); 425 still tells a solving policy
/// from one that is not, without depending on the episodes' luck.
const SOLVED_IN_GYMNASIUM: f64 = 425.0;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn docker(args: &[&str]) -> String {
    ok(Command::new("docker").args(args))
}

/// One compose project of its own (its name keeps containers, network and volume apart
/// from anything else on the machine); `down -v` when dropped, pass or fail.
struct Cluster {
    project: String,
    metrics: String,
    dir: tempfile::TempDir,
    learner_args: std::cell::Cell<&'static str>,
}

impl Cluster {
    fn compose(&self) -> Command {
        let mut c = Command::new("docker-compose");
        c.args(["-p", &self.project, "-f"])
            .arg(repo().join("deploy/docker-compose.yml"))
            .env("MILLRACE_TOKEN_FILE", self.dir.path().join("token"))
            .env(
                "MILLRACE_METRICS_PORT",
                self.metrics.rsplit(':').next().unwrap(),
            )
            .env("MILLRACE_CHECKPOINT_EVERY_S", "5")
            .env("MILLRACE_LEARNER_ARGS", self.learner_args.get())
            // The learner's cpuset: its CPU plan must start from it (below).
            .env("MILLRACE_LEARNER_CPUS", "0")
            .env_remove("MILLRACE_LEARNER_IMAGE")
            .env_remove("MILLRACE_ACTOR_IMAGE");
        c
    }

    fn compose_ok(&self, args: &[&str]) -> String {
        ok(self.compose().args(args))
    }

    /// Container ids of a service (running or not).
    fn containers(&self, service: &str) -> Vec<String> {
        self.compose_ok(&["ps", "-q", service])
            .lines()
            .map(str::to_string)
            .filter(|l| !l.is_empty())
            .collect()
    }

    fn one(&self, service: &str) -> String {
        let ids = self.containers(service);
        assert_eq!(ids.len(), 1, "{service}: {ids:?}");
        ids[0].clone()
    }

    fn logs(&self, service: &str) -> String {
        let out = run(self.compose().args(["logs", "--no-color", service]));
        output_text(&out)
    }

    /// Fails with the learner's log, so a timeout says how far the run got.
    fn wait(&self, what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
        let start = Instant::now();
        while !cond() {
            if start.elapsed() > limit {
                let page = metrics(&self.metrics);
                panic!(
                    "timed out after {limit:?}: {what}\nlearner metrics: {page:?}\nlearner log:\n{}",
                    self.logs("learner")
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = run(self
            .compose()
            .args(["down", "-v", "--remove-orphans", "--timeout", "5"]));
    }
}

/// The learner's unlabelled samples (`name value`), empty when it does not answer.
fn metrics(addr: &str) -> HashMap<String, f64> {
    let Ok(page) = millrace_telemetry::check(addr, "/metrics", Duration::from_secs(2)) else {
        return HashMap::new();
    };
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(' '))
        .filter(|(name, _)| !name.contains('{'))
        .filter_map(|(name, v)| Some((name.to_string(), v.parse().ok()?)))
        .collect()
}

fn get(addr: &str, name: &str) -> f64 {
    metrics(addr).get(name).copied().unwrap_or(f64::NAN)
}

/// What `docker inspect` says of a container.
#[derive(Debug, PartialEq)]
struct State {
    status: String,
    pid: u32,
    exit_code: i32,
    restarts: u32,
}

fn state(id: &str) -> State {
    let s = docker(&[
        "inspect",
        "-f",
        "{{.State.Status}} {{.State.Pid}} {{.State.ExitCode}} {{.RestartCount}}",
        id,
    ]);
    let f: Vec<&str> = s.split_whitespace().collect();
    State {
        status: f[0].to_string(),
        pid: f[1].parse().unwrap(),
        exit_code: f[2].parse().unwrap(),
        restarts: f[3].parse().unwrap(),
    }
}

/// Kills a container's program (the child of its init) with SIGKILL from the host: a
/// crash, as far as the restart policy can tell (`docker kill` would count as a stop).
fn crash(id: &str) {
    let init = state(id).pid;
    assert!(init > 0, "{id} is not running");
    let children = std::fs::read_to_string(format!("/proc/{init}/task/{init}/children"))
        .unwrap_or_else(|e| panic!("the container's init (pid {init}): {e}"));
    let program = children
        .split_whitespace()
        .next()
        .unwrap_or_else(|| panic!("the container's init (pid {init}) has no child"));
    ok(Command::new("kill").args(["-KILL", program]));
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
#[ignore = "needs Docker, docker-compose and deploy/build.sh's images; scripts/test.sh runs it when `docker info` succeeds"]
fn the_compose_cluster_trains_scales_survives_crashes_and_resumes() {
    for image in [LEARNER_IMAGE, ACTOR_IMAGE] {
        let found = run(Command::new("docker").args(["image", "inspect", image]));
        assert!(
            found.status.success(),
            "no image {image}: run deploy/build.sh first"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("token"), "cluster-test-token").unwrap();
    let c = Cluster {
        project: format!("millrace-test-{}", std::process::id()),
        metrics: format!("127.0.0.1:{}", free_port()),
        dir,
        learner_args: std::cell::Cell::new(OUT_OF_REACH),
    };
    let m = c.metrics.clone();
    let connected = || get(&m, "millrace_actors_connected");
    let steps = || get(&m, "millrace_env_steps_total");

    // Two actors, from a clean state.
    let started = Instant::now();
    c.compose_ok(&["up", "-d", "--scale", "actor=2"]);
    c.wait(
        "2 actors connected and training",
        Duration::from_secs(120),
        || connected() == 2.0 && get(&m, "millrace_updates_total") > 0.0,
    );
    let phase = |what: &str| {
        println!(
            "{:>5.1} s, {:>6} env steps: {what}",
            started.elapsed().as_secs_f64(),
            steps()
        );
    };
    phase("training with 2 actors");

    // Scaled up to 4 and down to 1; the learner is left as it is.
    let learner = c.one("learner");
    c.compose_ok(&["up", "-d", "--no-recreate", "--scale", "actor=4"]);
    c.wait("4 actors connected", Duration::from_secs(60), || {
        connected() == 4.0
    });
    c.compose_ok(&["up", "-d", "--no-recreate", "--scale", "actor=1"]);
    c.wait("1 actor connected", Duration::from_secs(60), || {
        connected() == 1.0 && c.containers("actor").len() == 1
    });
    phase("scaled to 4 actors and back to 1");
    assert_eq!(c.one("learner"), learner, "scaling left the learner alone");
    assert_eq!(state(&learner).restarts, 0);

    // An actor crashes: its restart policy brings it back and training goes on.
    let actor = c.one("actor");
    let before = steps();
    crash(&actor);
    c.wait(
        "the crashed actor restarted",
        Duration::from_secs(60),
        || {
            let s = state(&actor);
            s.restarts == 1 && s.status == "running"
        },
    );
    c.wait(
        "training goes on with the restarted actor",
        Duration::from_secs(60),
        || connected() == 1.0 && steps() > before + 1000.0,
    );

    phase("an actor crashed and was restarted by its policy");
    // The learner is stopped (SIGTERM: it checkpoints and exits) and started again:
    // it resumes from its checkpoint; the actor, left alone, reconnects by itself.
    let before = steps();
    let stopping = Instant::now();
    c.compose_ok(&["stop", "learner"]);
    let stop_s = stopping.elapsed().as_secs_f64();
    let s = state(&learner);
    assert_eq!(
        (s.status.as_str(), s.exit_code),
        ("exited", 130),
        "SIGTERM: checkpoint, exit 130"
    );
    let log = c.logs("learner");
    // The container's cpuset (CPU 0), not the host's CPUs, is what the plan starts from.
    assert!(
        log.contains("CPU plan: 1 CPU(s) allowed (0)"),
        "the learner's CPU plan ignores its cpuset: {}",
        log.lines()
            .find(|l| l.contains("CPU plan"))
            .unwrap_or("no CPU plan line")
    );
    println!("docker-compose stop learner: {stop_s:.1} s (SIGTERM, final checkpoint, exit)");
    c.compose_ok(&["start", "learner"]);
    c.wait(
        "the learner resumed and the actor reconnected",
        Duration::from_secs(90),
        || connected() == 1.0 && steps() >= before,
    );
    let resumed = c.logs("learner");
    assert!(
        resumed.len() > log.len()
            && resumed.contains(
                "--resume-if-present: continuing the run saved in /runs/cartpole/checkpoint"
            ),
        "{resumed}"
    );
    assert_eq!(
        state(&c.one("actor")).restarts,
        1,
        "the actor reconnected without a restart"
    );
    phase("the learner stopped, started and resumed; the actor reconnected");

    // The learner crashes: its restart policy brings it back, resuming from its last
    // periodic checkpoint.
    let restarts = state(&learner).restarts;
    crash(&learner);
    c.wait(
        "the crashed learner restarted and the actor reconnected",
        Duration::from_secs(90),
        || state(&learner).restarts == restarts + 1 && connected() == 1.0 && steps() > 0.0,
    );
    phase("the learner crashed, was restarted by its policy and resumed");
    assert_eq!(
        c.logs("learner")
            .matches("continuing the run saved")
            .count(),
        2,
        "resumed after the stop and after the crash"
    );

    // Stopped and started with CartPole's own target: docker-compose recreates the
    // container (its command changed) on the same volume; it resumes, the actor
    // reconnects by itself, and the run ends.
    let before = steps();
    c.compose_ok(&["stop", "learner"]);
    let in_budget = format!("--max-steps {} --seed 1", before as u64 + BUDGET);
    c.learner_args.set(Box::leak(in_budget.into_boxed_str()));
    c.compose_ok(&["up", "-d", "--no-deps", "learner"]);
    let learner = c.one("learner");
    c.wait(
        "the learner resumed with the target in reach",
        Duration::from_secs(90),
        || {
            let s = state(&learner);
            s.status == "exited" || (connected() == 1.0 && steps() >= before)
        },
    );
    phase("the learner restarted with CartPole's target");

    // Trained to the end: solved (exit 0), or out of steps (exit 2, restarted once by
    // its policy to say the run is finished, exit 0); the actor told and stopped.
    c.wait("the run ends", Duration::from_secs(900), || {
        let s = state(&learner);
        s.status == "exited" && s.exit_code == 0
    });
    let end = state(&learner);
    let log = c.logs("learner");
    let solved = log.contains("result:          solved");
    assert!(
        solved
            || (log.contains("not reached within") && log.contains("already finished: max steps")),
        "solved, or out of steps and said so when restarted:\n{log}"
    );
    assert!(
        log.contains("continuing the run saved in /runs/cartpole/checkpoint"),
        "{log}"
    );
    let actor = c.one("actor");
    // Actors are named after their container's host name (and their pid).
    let host = docker(&["inspect", "-f", "{{.Config.Hostname}}", &actor]);
    let joined = format!("actor \"{}-", host.trim());
    assert!(
        log.lines()
            .any(|l| l.contains(&joined) && l.contains("joined")),
        "the actor ({joined}...) joined the last learner by itself:\n{log}"
    );
    c.wait("the actor exits", Duration::from_secs(60), || {
        state(&actor).status == "exited"
    });
    let a = state(&actor);
    assert_eq!(a.exit_code, 0, "{}", c.logs("actor"));
    assert_eq!(
        a.restarts, 1,
        "the actor reconnected to each new learner by itself"
    );
    // Left stopped: a restart policy would have started them again by now.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(state(&learner).status, "exited");
    assert_eq!(state(&learner).restarts, end.restarts);
    assert_eq!(state(&actor).status, "exited");
    println!(
        "{:>5.1} s: {}; the learner and the actor exited 0 and stayed stopped",
        started.elapsed().as_secs_f64(),
        if solved { "solved" } else { "out of steps" }
    );

    // The run out of the volume (as docs/guide/cluster.md says to copy it): its TensorBoard events
    // read by TensorBoard's own reader, across all four learners that wrote them ...
    let run_dir = c.dir.path().join("run");
    docker(&[
        "cp",
        &format!("{learner}:/runs/cartpole"),
        run_dir.to_str().unwrap(),
    ]);
    let scalars = ok(Command::new(venv_python())
        .arg(repo().join("bench/check_tensorboard.py"))
        .arg(&run_dir));
    for tag in ["eval/mean_return", "actors/connected", "perf/updates_per_s"] {
        assert!(
            scalars.lines().any(|l| l.starts_with(tag)),
            "TensorBoard reads no {tag}:\n{scalars}"
        );
    }
    // ... and the saved policy replayed in Gymnasium itself.
    let out = run_dir.join("checkpoint");
    let which = if solved { "solved" } else { "best" };
    let saved = read_json(&out.join(which).join("meta.json"));
    let policy = c.dir.path().join("policy.safetensors");
    ok(Command::new(binary("learner"))
        .args(["export", "--which", which, "--checkpoint"])
        .arg(&out)
        .arg("--out")
        .arg(&policy));
    let played = ok(Command::new(venv_python())
        .arg(repo().join("scripts/play_policy.py"))
        .arg(&policy)
        .args(["--episodes", "100", "--seed", "12345"]));
    let played: serde_json::Value = serde_json::from_str(played.trim()).unwrap();
    let mean = played["mean"].as_f64().unwrap();
    println!(
        "the {which} policy (v{}) in Gymnasium: {mean:.1} over 100 episodes",
        saved["params_version"]
    );
    let want = if solved { SOLVED_IN_GYMNASIUM } else { LEARNED };
    assert!(mean >= want, "the {which} policy plays {mean} in Gymnasium");

    // Torn down with its volume.
    let volume = format!("{}_runs", c.project);
    assert!(docker(&["volume", "ls", "-q"]).lines().any(|v| v == volume));
    c.compose_ok(&["down", "-v", "--timeout", "5"]);
    assert!(
        !docker(&["volume", "ls", "-q"]).lines().any(|v| v == volume),
        "the volume is gone"
    );
    assert!(c.containers("learner").is_empty() && c.containers("actor").is_empty());
}
