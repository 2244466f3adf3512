//! deploy/slurm's scripts on a real Slurm cluster: the controller and three compute
//! nodes of `deploy/slurm/cluster` (Debian's Slurm 22.05 and munge, images built
//! offline) brought up by docker-compose from a clean state, jobs submitted with
//! `sbatch` alone, as the non-root user `millrace` (UID 1000 on every node):
//!
//! 0. the spike: `srun` reaches all three nodes;
//! 1. the service job (`service.sbatch`) trains CartPole with the learner on one node
//!    and an actor step on each of the two others; its token is readable by the job's
//!    user alone (another user on another node is refused);
//! 2. an actor node is stopped (its container, from the host): Slurm marks it down, the
//!    job (`--no-kill`) goes on, and training goes on with the actor left;
//! 3. `scancel`: the learner gets SIGTERM and writes its checkpoint; the same job
//!    submitted again (with a step budget 20,000 past the checkpoint) resumes from it,
//!    the new actors connect, and it ends, solved or on its budget, whichever comes
//!    first (a threaded run sees its data in a different order each time: it must not
//!    have to solve by a deadline, issue "One bad transition…", part 6); its saved policy
//!    replays in Gymnasium (at CartPole's target if it solved, far above a random
//!    policy's ~22 otherwise); submitted once more, the finished run is not trained
//!    again (exit 0 at once); the same script as a
//!    heterogeneous job (the form for a GPU learner, here without a GPU) trains with
//!    both actors until its time limit's SIGTERM (`--signal=TERM@60`) makes the learner
//!    write its checkpoint;
//! 4. a sweep of 24 CartPole agents as a 3-task array (`sweep.sbatch`), merged by a
//!    job that depends on it (`merge.sbatch`): the merged table has every agent once,
//!    and its rows equal (wall time aside) those of the same sweep run in one process
//!    with `--population-threads 3` and the same `--max-concurrent-agents` (a job too);
//! 5. everything torn down.
//!
//! Needs Docker, docker-compose and the image: `deploy/slurm/cluster/build.sh`, then
//! `cargo test -p millrace-tests --test slurm_cluster -- --ignored --nocapture`.
//! `scripts/test.sh` does both where `docker info` succeeds, and says plainly that the
//! test was skipped otherwise.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use millrace_tests::{
    binary, ok, output_text, play_in_gymnasium, population_rows as rows, read_json, run,
};

const IMAGE: &str = "millrace/slurm:bookworm";
/// The job user's UID and GID on every node (deploy/slurm/cluster/slurm.Dockerfile).
const JOB_UID: u32 = 1000;
/// Where the scripts are inside the nodes (deploy/slurm, mounted read-only).
const SCRIPTS: &str = "/opt/millrace/slurm";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One compose project of its own, with its shared directory and munge key; `down -v`
/// when dropped, pass or fail.
struct Cluster {
    project: String,
    shared: PathBuf,
    munge: PathBuf,
    _dir: tempfile::TempDir,
    started: Instant,
}

impl Cluster {
    fn up() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("shared");
        let munge = dir.path().join("munge");
        std::fs::create_dir_all(&shared).unwrap();
        std::fs::create_dir_all(&munge).unwrap();
        // The shared directory belongs to the job user, as a home or scratch directory
        // would on a real cluster; the key is the cluster's one secret.
        ok(Command::new("chown")
            .arg(format!("{JOB_UID}:{JOB_UID}"))
            .arg(&shared));
        let mut key = [0u8; 1024];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut key))
            .unwrap();
        std::fs::write(munge.join("munge.key"), key).unwrap();
        let c = Self {
            project: format!("millrace-slurm-{}", std::process::id()),
            shared,
            munge,
            _dir: dir,
            started: Instant::now(),
        };
        c.compose_ok(&["up", "-d"]);
        c
    }

    fn compose(&self) -> Command {
        let mut c = Command::new("docker-compose");
        c.args(["-p", &self.project, "-f"])
            .arg(repo().join("deploy/slurm/cluster/docker-compose.yml"))
            .env("MILLRACE_SLURM_SHARED", &self.shared)
            .env("MILLRACE_SLURM_MUNGE", &self.munge)
            .env_remove("MILLRACE_SLURM_IMAGE");
        c
    }

    fn compose_ok(&self, args: &[&str]) -> String {
        ok(self.compose().args(args))
    }

    /// A command on a node, as `user`.
    fn exec(&self, node: &str, user: &str, cmd: &[&str]) -> Output {
        run(self
            .compose()
            .args(["exec", "-T", "-u", user, node])
            .args(cmd))
    }

    /// A command on the controller (the submit host) as the job user; its stdout.
    fn slurm(&self, cmd: &[&str]) -> String {
        let out = self.exec("slurmctld", "millrace", cmd);
        assert!(out.status.success(), "{cmd:?}:\n{}", output_text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `sbatch --parsable ARGS`: the job id.
    fn sbatch(&self, args: &[&str]) -> String {
        let mut cmd = vec!["sbatch", "--parsable", "--chdir=/shared"];
        cmd.extend_from_slice(args);
        let id = self.slurm(&cmd).trim().to_string();
        self.phase(&format!("submitted job {id}: sbatch {}", args.join(" ")));
        id
    }

    /// Each task's `(JobState, ExitCode)` of job `id` (an array's tasks, or one).
    fn states(&self, id: &str) -> Vec<(String, String)> {
        let out = self.exec(
            "slurmctld",
            "millrace",
            &["scontrol", "show", "job", "-o", id],
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| {
                let field = |k: &str| {
                    l.split_whitespace()
                        .find_map(|f| f.strip_prefix(k))
                        .unwrap_or("")
                        .to_string()
                };
                (field("JobState="), field("ExitCode="))
            })
            .collect()
    }

    /// Waits until every task of job `id` has ended; their `(state, exit code)`.
    fn wait_job(&self, id: &str, limit: Duration) -> Vec<(String, String)> {
        let ended = [
            "COMPLETED",
            "FAILED",
            "CANCELLED",
            "TIMEOUT",
            "NODE_FAIL",
            "OUT_OF_MEMORY",
        ];
        self.wait(&format!("job {id} ends"), limit, || {
            let s = self.states(id);
            !s.is_empty() && s.iter().all(|(state, _)| ended.contains(&state.as_str()))
        });
        self.states(id)
    }

    /// Waits until all three nodes are idle: none down, none still completing a job.
    fn wait_idle(&self, limit: Duration) {
        self.wait("three idle nodes", limit, || {
            (1..=3).all(|i| self.node_state(&format!("node{i}")) == "idle")
        });
    }

    fn node_state(&self, node: &str) -> String {
        let out = self.exec(
            "slurmctld",
            "millrace",
            &["sinfo", "-h", "-N", "-n", node, "-o", "%T"],
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.shared.join(file)).unwrap_or_default()
    }

    fn phase(&self, what: &str) {
        println!("{:>6.1} s: {what}", self.started.elapsed().as_secs_f64());
    }

    /// Fails with the controller's log and the shared directory's job output.
    fn wait(&self, what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
        let start = Instant::now();
        while !cond() {
            if start.elapsed() > limit {
                let mut outputs = String::new();
                for e in std::fs::read_dir(&self.shared).unwrap().flatten() {
                    if e.file_name().to_string_lossy().ends_with(".out") {
                        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                        let tail: Vec<&str> = text.lines().rev().take(40).collect();
                        outputs += &format!(
                            "--- {}:\n{}\n",
                            e.path().display(),
                            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                        );
                    }
                }
                let ctl = output_text(&run(self.compose().args([
                    "logs",
                    "--no-color",
                    "--tail",
                    "60",
                    "slurmctld",
                ])));
                panic!("timed out after {limit:?}: {what}\n{outputs}\nslurmctld:\n{ctl}");
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// A node's address on the cluster's network, as the host reaches it.
    fn address(&self, node: &str) -> String {
        let id = self.compose_ok(&["ps", "-q", node]).trim().to_string();
        ok(Command::new("docker").args([
            "inspect",
            "-f",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
            &id,
        ]))
        .trim()
        .to_string()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = run(self
            .compose()
            .args(["down", "-v", "--remove-orphans", "--timeout", "5"]));
    }
}

/// The learner's unlabelled Prometheus samples, empty when it does not answer.
fn metrics(addr: &str) -> BTreeMap<String, f64> {
    let Ok(page) = millrace_telemetry::check(addr, "/metrics", Duration::from_secs(2)) else {
        return BTreeMap::new();
    };
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(' '))
        .filter(|(name, _)| !name.contains('{'))
        .filter_map(|(name, v)| Some((name.to_string(), v.parse().ok()?)))
        .collect()
}

/// The service job's learner flags: while nodes are stopped and jobs cancelled, a
/// target no CartPole episode reaches, so that the run cannot end before that is done.
const OUT_OF_REACH: [&str; 2] = ["--target-return", "1000"];
/// Steps enough for any machine, while nothing is meant to end the run.
const NO_BUDGET: &str = "100000000";
/// The resumed run's step budget past its checkpoint.
const BUDGET: u64 = 20_000;
/// A random CartPole policy returns ~22; a run that learned anything doubles it.
const LEARNED: f64 = 50.0;

fn service(c: &Cluster, max_steps: &str, extra: &[&str]) -> String {
    let script = format!("{SCRIPTS}/service.sbatch");
    let mut args = vec![
        "--nodes=3",
        "--output=/shared/service-%j.out",
        script.as_str(),
        "/shared/cartpole",
        "--env",
        "CartPole-v1",
        "--seed",
        "1",
        "--max-steps",
        max_steps,
        "--checkpoint-every-s",
        "5",
        "--metrics-addr",
        "0.0.0.0:9100",
    ];
    args.extend_from_slice(extra);
    c.sbatch(&args)
}

/// The learner's node and the actors' nodes, from the first line of a job's output,
/// once the job has started (within `limit`).
fn placement(c: &Cluster, file: &str, limit: Duration) -> (String, Vec<String>) {
    c.wait("the service job says where it runs", limit, || {
        c.read(file).contains("actors on")
    });
    let text = c.read(file);
    let line = text.lines().find(|l| l.contains("actors on")).unwrap();
    let learner = line
        .split("learner on ")
        .nth(1)
        .and_then(|r| r.split(':').next())
        .unwrap()
        .to_string();
    let actors = line
        .split("actors on ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .unwrap()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    (learner, actors)
}

#[test]
#[ignore = "needs Docker, docker-compose and deploy/slurm/cluster/build.sh's image; scripts/test.sh runs it when `docker info` succeeds"]
fn a_slurm_cluster_runs_the_service_and_a_sweep_array_through_sbatch() {
    let found = run(Command::new("docker").args(["image", "inspect", IMAGE]));
    assert!(
        found.status.success(),
        "no image {IMAGE}: run deploy/slurm/cluster/build.sh first"
    );
    let c = Cluster::up();

    // 0. The spike: the controller sees three idle nodes, and a step reaches each.
    c.wait_idle(Duration::from_secs(120));
    let hosts = c.slurm(&["srun", "--nodes=3", "--ntasks=3", "hostname"]);
    let mut hosts: Vec<&str> = hosts.lines().collect();
    hosts.sort_unstable();
    assert_eq!(hosts, ["node1", "node2", "node3"]);
    c.phase("the cluster is up: srun reaches node1, node2 and node3");

    // 1. The service job: the learner on one node, an actor step on each other one.
    let job = service(&c, NO_BUDGET, &OUT_OF_REACH);
    let (learner_node, actor_nodes) =
        placement(&c, &format!("service-{job}.out"), Duration::from_secs(120));
    assert_eq!(actor_nodes.len(), 2, "{actor_nodes:?}");
    assert!(!actor_nodes.contains(&learner_node));
    let addr = format!("{}:9100", c.address(&learner_node));
    let get = |name: &str| metrics(&addr).get(name).copied().unwrap_or(f64::NAN);
    c.wait(
        "both actors connected and the learner training",
        Duration::from_secs(180),
        || get("millrace_actors_connected") == 2.0 && get("millrace_updates_total") > 0.0,
    );
    c.phase(&format!(
        "job {job}: the learner on {learner_node} trains with actors on {actor_nodes:?}"
    ));
    // The token: the job user's alone, on every node.
    let token = c.shared.join("cartpole/token");
    let meta = std::fs::metadata(&token).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o777), (JOB_UID, 0o600));
    let theirs = c.exec(&actor_nodes[0], "other", &["cat", "/shared/cartpole/token"]);
    assert!(!theirs.status.success(), "another user read the token");
    assert!(
        output_text(&theirs).contains("Permission denied"),
        "{}",
        output_text(&theirs)
    );
    let mine = c.exec(
        &actor_nodes[0],
        "millrace",
        &["cat", "/shared/cartpole/token"],
    );
    assert!(mine.status.success(), "{}", output_text(&mine));

    // 2. An actor node is lost: its container stopped from the host.
    let lost = actor_nodes[1].clone();
    let id = c.compose_ok(&["ps", "-q", &lost]).trim().to_string();
    ok(Command::new("docker").args(["kill", &id]));
    c.wait(
        &format!("{lost} marked down"),
        Duration::from_secs(60),
        || c.node_state(&lost).starts_with("down"),
    );
    let before = get("millrace_env_steps_total");
    c.wait(
        "training goes on with the actor left",
        Duration::from_secs(150),
        || {
            get("millrace_actors_connected") == 1.0
                && get("millrace_env_steps_total") > before + 2000.0
        },
    );
    assert_eq!(c.states(&job)[0].0, "RUNNING", "--no-kill: the job goes on");
    c.phase(&format!(
        "{lost} stopped and marked down: the job runs on with one actor"
    ));

    // 3. scancel: SIGTERM, the learner's checkpoint; the job again resumes and solves.
    let stopped_at = get("millrace_env_steps_total");
    c.slurm(&["scancel", &job]);
    let states = c.wait_job(&job, Duration::from_secs(120));
    assert_eq!(states[0].0, "CANCELLED", "{states:?}");
    let log = c.read(&format!("service-{job}.out"));
    assert!(
        log.contains("result:          interrupted (checkpoint written)"),
        "{log}"
    );
    // The script waited for the learner through its own SIGTERM, and says how it ended.
    c.wait("the job's last line", Duration::from_secs(60), || {
        c.read(&format!("service-{job}.out"))
            .contains("service: the learner exited with status 130")
    });
    let saved = read_json(&c.shared.join("cartpole/checkpoint/latest/meta.json"));
    let saved_steps = saved["env_steps"].as_f64().unwrap();
    assert!(
        saved_steps >= stopped_at,
        "checkpoint at {saved_steps}, stopped at {stopped_at}"
    );
    c.phase(&format!(
        "scancel: the learner checkpointed at {saved_steps} env steps"
    ));
    ok(Command::new("docker").args(["start", &id]));
    c.wait(&format!("{lost} back"), Duration::from_secs(120), || {
        c.node_state(&lost) == "idle"
    });

    let budget = (saved_steps as u64 + BUDGET).to_string();
    let again = service(&c, &budget, &[]);
    let states = c.wait_job(&again, Duration::from_secs(900));
    let log = c.read(&format!("service-{again}.out"));
    // Solved (exit 0), or out of steps (the learner's exit 2 is the job's).
    let solved = log.contains("result:          solved");
    let ended = if solved {
        ("COMPLETED".into(), "0:0".into())
    } else {
        assert!(log.contains("not reached within"), "{log}");
        ("FAILED".into(), "2:0".into())
    };
    assert_eq!(states[0], ended, "{log}");
    assert!(
        log.contains("continuing the run saved in /shared/cartpole/checkpoint"),
        "{log}"
    );
    let how = if solved { "solved" } else { "max steps" };
    c.phase(&format!("job {again} resumed the run and ended it: {how}"));
    // The saved policy, out of the shared directory, in Gymnasium itself.
    let which = if solved { "solved" } else { "best" };
    let played = play_in_gymnasium(
        &binary("learner"),
        &c.shared.join("cartpole/checkpoint"),
        None,
        which,
        c._dir.path(),
    );
    let mean = played["mean"].as_f64().unwrap();
    c.phase(&format!(
        "the {which} policy in Gymnasium: {mean:.1} over 100 episodes"
    ));
    let want = if solved { 475.0 } else { LEARNED };
    assert!(mean >= want, "the {which} policy plays {mean} in Gymnasium");
    // Submitted once more, the finished run is not trained again.
    let once_more = service(&c, &budget, &[]);
    let states = c.wait_job(&once_more, Duration::from_secs(120));
    let log = c.read(&format!("service-{once_more}.out"));
    assert_eq!(states[0], ("COMPLETED".into(), "0:0".into()), "{log}");
    assert!(log.contains(&format!("already finished: {how}")), "{log}");

    // The GPU form without a GPU: a heterogeneous job, the learner's component first,
    // the actors' second, under a 3-minute limit with SIGTERM 60 s ahead of it
    // (`--signal=TERM@60`, the script's; Slurm may send it up to a minute earlier, so
    // between 60 and 120 s in): the learner trains with both actors, and the time
    // limit's signal makes it write its checkpoint.
    //
    // Submitted while the last job's nodes were still completing, the heterogeneous
    // job once failed to start (slurmctld: "Deallocate ... due to hetjob start
    // failure") and was requeued; Slurm holds a requeued job back for its credential
    // lifetime (120 s by default), past the placement wait. So the job goes in on three
    // idle nodes, and the wait allows for one such requeue all the same.
    c.wait_idle(Duration::from_secs(120));
    let het = c.sbatch(&[
        "--time=3",
        "--nodes=1",
        "--output=/shared/het-%j.out",
        ":",
        "--time=3",
        "--nodes=2",
        &format!("{SCRIPTS}/service.sbatch"),
        "/shared/het",
        "--env",
        "CartPole-v1",
        "--target-return",
        "1000",
        "--max-steps",
        "100000000",
    ]);
    let file = format!("het-{het}.out");
    let (learner_node, actor_nodes) = placement(&c, &file, Duration::from_secs(300));
    assert_eq!(actor_nodes.len(), 2, "{actor_nodes:?}");
    assert!(!actor_nodes.contains(&learner_node));
    c.wait(
        "the time limit's SIGTERM and the learner's checkpoint",
        Duration::from_secs(300),
        || {
            c.read(&file)
                .contains("result:          interrupted (checkpoint written)")
        },
    );
    let log = c.read(&file);
    for node in &actor_nodes {
        // Actors are named after their host (and pid).
        let name = format!("actor \"{node}-");
        assert!(
            log.lines()
                .any(|l| l.contains(&name) && l.contains("joined")),
            "{node}'s actor joined the learner:\n{log}"
        );
    }
    c.wait("the job's last line", Duration::from_secs(60), || {
        c.read(&file)
            .contains("service: the learner exited with status 130")
    });
    let saved = read_json(&c.shared.join("het/checkpoint/latest/meta.json"));
    c.phase(&format!(
        "heterogeneous job {het}: the learner on {learner_node}, actors on {actor_nodes:?}; the time limit's SIGTERM, a checkpoint at {} env steps",
        saved["env_steps"]
    ));
    c.wait_job(&het, Duration::from_secs(120));

    // 4. A sweep of 24 agents as a 3-task array, merged after it; the same sweep in one
    // process with 3 threads and the same places.
    std::fs::write(
        c.shared.join("sweep.toml"),
        "seeds = 8\nmax_steps = 10000\n[grid]\nlr = [5e-4, 1e-3, 2e-3]\n",
    )
    .unwrap();
    let flags = "--env CartPole-v1 --cpu --hidden 32 --batch-size 32 --samples-per-insert 8 \
                 --target-return 1000 --eval-every 1000 --eval-episodes 3 \
                 --max-concurrent-agents 6";
    let sweep_script = format!("{SCRIPTS}/sweep.sbatch");
    let mut args = vec![
        "--array=0-2",
        "--output=/shared/sweep-%A_%a.out",
        sweep_script.as_str(),
        "/shared/sweep-array",
        "/shared/sweep.toml",
    ];
    args.extend(flags.split_whitespace());
    let array = c.sbatch(&args);
    let dependency = format!("--dependency=afterok:{array}");
    let merge_script = format!("{SCRIPTS}/merge.sbatch");
    let merge = c.sbatch(&[
        &dependency,
        "--output=/shared/merge.out",
        &merge_script,
        "/shared/sweep-array",
    ]);
    let states = c.wait_job(&array, Duration::from_secs(900));
    assert_eq!(states.len(), 3, "{states:?}");
    for (i, (state, code)) in states.iter().enumerate() {
        // A task that finished its shard succeeded (its agents spent their budgets).
        assert_eq!(
            (state.as_str(), code.as_str()),
            ("COMPLETED", "0:0"),
            "task {i}: {}",
            c.read(&format!("sweep-{array}_{i}.out"))
        );
    }
    let states = c.wait_job(&merge, Duration::from_secs(120));
    let merged_log = c.read("merge.out");
    assert_eq!(
        states[0],
        ("COMPLETED".into(), "0:0".into()),
        "{merged_log}"
    );
    assert!(merged_log.contains("merged 24 agents"), "{merged_log}");
    let one = c.sbatch(&[
        "--output=/shared/sweep-one.out",
        "--ntasks=1",
        "--cpus-per-task=2",
        &format!(
            "--wrap=learner --sweep /shared/sweep.toml --population-threads 3 --logdir /shared/sweep-one --no-progress {flags}"
        ),
    ]);
    let states = c.wait_job(&one, Duration::from_secs(900));
    assert_eq!(states[0].1, "2:0", "{}", c.read("sweep-one.out"));
    let (merged, reference) = (
        rows(&c.shared.join("sweep-array")),
        rows(&c.shared.join("sweep-one")),
    );
    assert_eq!(merged.len(), 24);
    assert_eq!(
        merged, reference,
        "the array's merged rows against the one-process run's"
    );
    let wall = |p: &str| read_json(&c.shared.join(p))["wall_s"].as_f64().unwrap();
    let shards: Vec<f64> = (0..3)
        .map(|i| wall(&format!("sweep-array/shard-{i}-of-3/population.json")))
        .collect();
    let merge_start = Instant::now();
    ok(Command::new(binary("learner"))
        .args(["merge", "--logdir"])
        .arg(c.shared.join("sweep-array"))
        .env("RUST_LOG", "warn"));
    c.phase(&format!(
        "sweep of 24: one process (3 threads) {:.1} s; the array's shards {:.1}, {:.1}, {:.1} s side by side on this host's cores; merge {:.2} s; rows equal",
        wall("sweep-one/population.json"),
        shards[0],
        shards[1],
        shards[2],
        merge_start.elapsed().as_secs_f64()
    ));

    // 5. Torn down.
    c.compose_ok(&["down", "-v", "--timeout", "5"]);
    assert!(c.compose_ok(&["ps", "-q"]).trim().is_empty());
    c.phase("torn down");
}
