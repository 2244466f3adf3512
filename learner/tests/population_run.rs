//! `learner --population K` and `--sweep` as users run them: K CartPole agents in one
//! process, each reaching its own target, reported in a table, `population.csv` and
//! TensorBoard's HParams view (read by TensorBoard itself), each agent's saved policy
//! playable by `learner eval --agent`; a sweep over actor settings and update shapes
//! in groups, streamed through fewer places than agents; the same seed and thread
//! count twice give the same results bit for bit; flags that do not combine with a
//! population are refused.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use millrace_tests::{hparams_view, read_json};

fn learner(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_learner"))
        .args(args)
        .arg("--no-progress")
        .env("RUST_LOG", "warn")
        .env_remove("MILLRACE_INJECT_FAULT")
        .output()
        .expect("learner runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn population(logdir: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "--env",
        "CartPole-v1",
        "--cpu",
        "--population",
        "3",
        "--seed",
        "1",
        "--logdir",
        logdir.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    learner(&args)
}

/// The CSV's rows by column, without the wall-time column (which differs between
/// runs).
fn rows(logdir: &Path) -> Vec<BTreeMap<String, String>> {
    let csv = std::fs::read_to_string(logdir.join("population.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    lines
        .map(|l| {
            header
                .iter()
                .zip(l.split(','))
                .filter(|(h, _)| **h != "wall_s")
                .map(|(h, v)| (h.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

#[test]
fn a_population_out_of_device_memory_saves_its_agents_and_says_what_to_change() {
    // CUDA's allocator message, injected at each of the group's device sites in turn.
    // The priorities' read-back is on the path with prioritized replay.
    for site in ["copy", "update", "priorities", "publish", "stats"] {
        let dir = tempfile::tempdir().unwrap();
        let fault = format!("oom:{site}:cuda");
        let replay: &[&str] = if site == "priorities" {
            &["--replay", "prioritized"]
        } else {
            &[]
        };
        let out = Command::new(env!("CARGO_BIN_EXE_learner"))
            .args([
                "--env",
                "CartPole-v1",
                "--cpu",
                "--population",
                "2",
                "--seed",
                "1",
            ])
            .args([
                "--max-steps",
                "1000000",
                "--target-return",
                "1000",
                "--no-progress",
            ])
            .args(replay)
            .args([
                "--publish-every",
                "1",
                "--population-threads",
                "1",
                "--logdir",
            ])
            .arg(dir.path())
            .env("RUST_LOG", "warn")
            .env("MILLRACE_INJECT_FAULT", &fault)
            .output()
            .unwrap();
        let log = text(&out);
        assert_eq!(out.status.code(), Some(1), "{fault}: {log}");
        let line = millrace_tests::error_line(&log);
        assert!(
            line.contains(
                "the population group failed: out of memory on cpu: CUDA out of memory. Tried to allocate"
            )
                && line.contains(&format!("injected fault at {site}"))
                && line.contains("--batch-size"),
            "{fault}: {line}"
        );
        assert!(
            line.contains("the state of its 2 training agents was saved"),
            "{fault}: {line}"
        );
        for agent in 0..2 {
            let meta = dir.path().join(format!(
                "agents/agent-{agent:03}/checkpoint/latest/meta.json"
            ));
            assert!(meta.exists(), "{fault}: {}", meta.display());
        }
    }
}

#[test]
fn each_agent_of_a_cartpole_population_solves_and_its_policy_plays() {
    let dir = tempfile::tempdir().unwrap();
    // One thread: the three agents share one stacked update, and leave it one by one.
    let out = population(
        dir.path(),
        &["--max-steps", "100000", "--population-threads", "1"],
    );
    let log = text(&out);
    assert_eq!(out.status.code(), Some(0), "every agent solved: {log}");
    assert!(log.contains("3 solved"), "{log}");
    let rows = rows(dir.path());
    assert_eq!(rows.len(), 3, "one row per agent");
    let seeds: Vec<&str> = rows.iter().map(|r| r["seed"].as_str()).collect();
    assert_eq!(seeds[0], "1", "agent 0 has the run's seed");
    assert!(seeds[1] != seeds[2] && seeds[1] != "1");
    for (agent, row) in rows.iter().enumerate() {
        assert_eq!(row["end"], "solved", "{row:?}");
        // The agent's solved policy, replayed on fresh episodes by `learner eval`.
        let ckpt = dir
            .path()
            .join(format!("agents/agent-{agent:03}/checkpoint"));
        let solved = read_json(&ckpt.join("solved/meta.json"));
        assert_eq!(solved["seed"].to_string(), row["seed"]);
        assert_eq!(solved["network"]["population"], 1);
        let out = Command::new(env!("CARGO_BIN_EXE_learner"))
            .args(["eval", "--episodes", "20", "--seed", "99", "--json"])
            .arg("--checkpoint")
            .arg(dir.path())
            .args(["--agent", &agent.to_string()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let mean = result["mean"].as_f64().unwrap();
        assert!(
            mean >= 400.0,
            "agent {agent}'s saved policy returned {mean}"
        );
    }
}

#[test]
fn the_same_population_twice_gives_the_same_results() {
    // One stacked update for all three (agents leave it as they solve or spend their
    // 24,000 steps), then two groups on two threads.
    for threads in ["1", "2"] {
        twice(&["--max-steps", "24000", "--population-threads", threads]);
    }
    // Two places for three agents: the third joins when one of the first two ends.
    twice(&[
        "--max-steps",
        "24000",
        "--population-threads",
        "1",
        "--max-concurrent-agents",
        "2",
    ]);
}

fn twice(extra: &[&str]) {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (x, y) = (population(a.path(), extra), population(b.path(), extra));
    assert!(matches!(x.status.code(), Some(0 | 2)), "{}", text(&x));
    assert_eq!(x.status.code(), y.status.code(), "{}", text(&y));
    assert_eq!(rows(a.path()), rows(b.path()));
    for agent in 0..3 {
        let best = |d: &Path| {
            let ckpt = d.join(format!("agents/agent-{agent:03}/checkpoint/best"));
            let meta = read_json(&ckpt.join("meta.json"));
            std::fs::read(ckpt.join(meta["policy_file"].as_str().unwrap())).unwrap()
        };
        assert_eq!(best(a.path()), best(b.path()), "agent {agent}'s parameters");
    }
}

#[test]
fn a_population_of_no_agents_is_refused() {
    let out = learner(&["--population", "0"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--population must be at least 1"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// The side stream is GPU-only: on a host without CUDA the flag is refused in one
/// line before any agent starts (`bench/gpu/runs.sh` runs a population with it on a
/// GPU, and the core's GPU tests check its batches).
#[test]
fn a_population_copies_on_a_side_stream_only_on_a_gpu() {
    if tch::Cuda::is_available() {
        eprintln!("skipped: CUDA is available (bench/gpu/runs.sh covers --copy-stream there)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let logdir = dir.path().join("run");
    let out = learner(&[
        "--env",
        "CartPole-v1",
        "--population",
        "2",
        "--copy-stream",
        "--max-steps",
        "200",
        "--logdir",
        logdir.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--copy-stream needs a CUDA device"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!logdir.join("agents").exists(), "no agent started");
}

#[test]
fn a_sweep_file_gives_each_agent_its_configuration_and_bad_ones_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let sweep = dir.path().join("sweep.toml");
    std::fs::write(
        &sweep,
        "seeds = [1, 2]\nmax_steps = 3000\n[grid]\nlr = [0.001, 0.002]\ntarget_period = [100]\n",
    )
    .unwrap();
    let logdir = dir.path().join("run");
    let out = learner(&[
        "--env",
        "CartPole-v1",
        "--cpu",
        "--target-return",
        "1000",
        "--sweep",
        sweep.to_str().unwrap(),
        "--logdir",
        logdir.to_str().unwrap(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "budgets, not targets: {}",
        text(&out)
    );
    let rows = rows(&logdir);
    let got: Vec<(&str, &str, &str, &str, &str)> = rows
        .iter()
        .map(|r| {
            (
                r["config"].as_str(),
                r["seed"].as_str(),
                r["lr"].as_str(),
                r["target_update"].as_str(),
                r["end"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("0", "1", "0.001", "hard/100", "budget"),
            ("0", "2", "0.001", "hard/100", "budget"),
            ("1", "1", "0.002", "hard/100", "budget"),
            ("1", "2", "0.002", "hard/100", "budget"),
        ]
    );
    assert!(
        rows.iter()
            .all(|r| r["env_steps"].parse::<u64>().unwrap() >= 3000),
        "{rows:?}"
    );
    assert!(
        text(&out).contains("configuration 1 (lr=0.002 target_period=100)"),
        "{}",
        text(&out)
    );

    std::fs::write(&sweep, "seeds = [5, 6]\n[grid]\nlr = [1e-3, -1.0]\n").unwrap();
    let out = learner(&["--sweep", sweep.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("agent 2 (configuration 1, seed 5): lr = -1: must be positive"),
        "{err}"
    );
}

/// A per-agent setting added through the table (`priority_alpha`, which each agent's
/// own replay holds): the CSV, each agent's saved configuration and the HParams view
/// carry each agent's own α; agents whose own α (0.9) is not the run's (0.6) train bit
/// for bit as a population of one with that α and seed, and not as the run's α would.
///
/// Agents compared have the same α: agents that act differently in one group are
/// coupled by its rounds (a stacked update waits for every agent's batch, and their
/// batches fill at different times), so an agent with another neighbour is not
/// expected to match a run alone.
#[test]
fn an_agents_own_priority_alpha_trains_it_as_alone() {
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, alphas: &str| {
        let sweep = dir.path().join(format!("{name}.toml"));
        std::fs::write(
            &sweep,
            format!("seeds = [11]\nmax_steps = 2500\n[grid]\npriority_alpha = [{alphas}]\n"),
        )
        .unwrap();
        let logdir = dir.path().join(name);
        let out = learner(&[
            "--env",
            "CartPole-v1",
            "--cpu",
            "--replay",
            "prioritized",
            "--priority-alpha",
            "0.6",
            "--target-return",
            "1000",
            "--eval-every",
            "1000",
            "--eval-episodes",
            "3",
            "--population-threads",
            "1",
            "--sweep",
            sweep.to_str().unwrap(),
            "--logdir",
            logdir.to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(2), "budgets: {}", text(&out));
        logdir
    };
    // What an agent kept: its row's outcome and its best parameters, byte for byte.
    let kept = |logdir: &Path, agent: usize| {
        let row = rows(logdir).swap_remove(agent);
        let dir = logdir.join(format!("agents/agent-{agent:03}/checkpoint/best"));
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        assert_eq!(files.len(), 1, "{files:?}");
        let params = std::fs::read(files.swap_remove(0)).unwrap();
        let outcome: Vec<String> = ["seed", "end", "env_steps", "final_eval", "best_eval"]
            .iter()
            .map(|c| row[*c].clone())
            .collect();
        (outcome, params)
    };

    let mixed = run("mixed", "0.2, 0.9");
    let rows_mixed = rows(&mixed);
    for (agent, alpha) in [(0, 0.2), (1, 0.9)] {
        assert_eq!(rows_mixed[agent]["priority_alpha"], alpha.to_string());
        let saved =
            read_json(&mixed.join(format!("agents/agent-{agent:03}/checkpoint/config.json")));
        assert_eq!(saved["replay"]["priority"]["alpha"], alpha, "{saved}");
    }
    // TensorBoard's HParams view has the column, with each agent's own value.
    let view = hparams_view(&mixed);
    let mut alphas: Vec<f64> = view["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["hparams"]["priority_alpha"].as_f64().unwrap())
        .collect();
    alphas.sort_by(f64::total_cmp);
    assert_eq!(alphas, [0.2, 0.9], "{view}");

    let pair = run("pair", "0.9, 0.9");
    let alone = run("alone", "0.9");
    let run_alpha = run("flags", "0.6");
    // agent.json names an agent by α only where its sweep gives it one (so populations
    // saved before α was per agent resume): the flags' alone leaves it out.
    let who = |logdir: &Path| read_json(&logdir.join("agents/agent-000/agent.json"));
    assert_eq!(
        who(&alone)["setup"]["priority_alpha"],
        0.9,
        "{}",
        who(&alone)
    );
    let plain = dir.path().join("plain");
    let out = learner(&[
        "--env",
        "CartPole-v1",
        "--cpu",
        "--replay",
        "prioritized",
        "--population",
        "1",
        "--max-steps",
        "600",
        "--target-return",
        "1000",
        "--logdir",
        plain.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        who(&plain)["setup"].get("priority_alpha").is_none(),
        "{}",
        who(&plain)
    );
    assert_eq!(
        rows(&plain)[0]["priority_alpha"],
        "0.6",
        "the table still says it"
    );
    assert_eq!(rows(&pair)[1]["priority_alpha"], "0.9");
    assert!(
        kept(&pair, 1) == kept(&alone, 0),
        "an agent with its own alpha 0.9 differs from a population of one with 0.9"
    );
    assert!(
        kept(&alone, 0) != kept(&run_alpha, 0),
        "alpha 0.9 trained as the run's 0.6 did"
    );

    // A uniform replay has no α to vary: one clear line.
    let sweep = dir.path().join("uniform.toml");
    std::fs::write(&sweep, "seeds = [1]\n[grid]\npriority_alpha = [0.5]\n").unwrap();
    let out = learner(&[
        "--env",
        "CartPole-v1",
        "--cpu",
        "--replay",
        "uniform",
        "--sweep",
        sweep.to_str().unwrap(),
        "--logdir",
        dir.path().join("uniform").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("priority_alpha needs --replay prioritized"),
        "{}",
        text(&out)
    );
}

#[test]
fn the_example_sweep_in_the_repository_is_valid() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sweeps/cartpole.toml");
    let sweep =
        millrace_learner::sweep::Sweep::read(&path, &millrace_core::dqn::DqnConfig::default(), 0)
            .unwrap();
    assert_eq!(sweep.agents.len(), 2 * 3 * 2 * 5);
    assert_eq!(sweep.max_steps, Some(50_000));
}

/// A sweep over actor settings (n-step, γ) and update shapes (batch size: two groups,
/// one after another), through 3 places for 8 agents: every agent runs with its own
/// settings (its saved configuration and the CSV say so), queued agents take finished
/// ones' places, and TensorBoard's own HParams plugin reads one session per agent with
/// those settings and results, seeds of a configuration grouped.
#[test]
fn a_sweep_streams_agents_with_their_own_actor_settings_in_groups() {
    let dir = tempfile::tempdir().unwrap();
    let sweep = dir.path().join("sweep.toml");
    std::fs::write(
        &sweep,
        "seeds = [1, 2]\nmax_steps = 2000\n[grid]\nn_step = [1, 3]\nbatch_size = [16, 32]\n[random]\nsamples = 1\ngamma = { choice = [0.95] }\n",
    )
    .unwrap();
    let logdir = dir.path().join("run");
    let out = learner(&[
        "--env",
        "CartPole-v1",
        "--cpu",
        "--target-return",
        "1000",
        "--eval-every",
        "1000",
        "--eval-episodes",
        "5",
        "--sweep",
        sweep.to_str().unwrap(),
        "--max-concurrent-agents",
        "3",
        "--population-threads",
        "1",
        "--logdir",
        logdir.to_str().unwrap(),
    ]);
    let log = text(&out);
    assert_eq!(out.status.code(), Some(2), "budgets, not targets: {log}");
    assert!(
        log.contains("2 group(s) on 1 thread(s), up to 3 agents at once"),
        "{log}"
    );
    let rows = rows(&logdir);
    assert_eq!(rows.len(), 8);
    for (agent, r) in rows.iter().enumerate() {
        // Configurations: batch size outermost, then n-step (fields in name order).
        let (batch, n) = (["16", "32"][agent / 4], ["1", "3"][agent / 2 % 2]);
        assert_eq!(
            (
                r["batch_size"].as_str(),
                r["n_step"].as_str(),
                r["gamma"].as_str()
            ),
            (batch, n, "0.95"),
            "{r:?}"
        );
        assert_eq!(r["end"], "budget");
        assert!(r["env_steps"].parse::<u64>().unwrap() >= 2000, "{r:?}");
        let saved =
            read_json(&logdir.join(format!("agents/agent-{agent:03}/checkpoint/config.json")));
        assert_eq!(saved["actors"]["n_step"].to_string(), n);
        assert_eq!(saved["batch_size"].to_string(), batch);
        assert_eq!(saved["seed"].to_string(), r["seed"]);
    }

    // TensorBoard's HParams view, as TensorBoard's own plugin reads it.
    let view = hparams_view(&logdir);
    for name in ["lr", "n_step", "gamma", "batch_size", "hidden", "seed"] {
        assert!(
            view["hparams"]
                .as_array()
                .unwrap()
                .iter()
                .any(|h| h == name),
            "{view}"
        );
    }
    let groups = view["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 4, "one group per configuration: {view}");
    let mut sessions = 0;
    for g in groups {
        let group_sessions = g["sessions"].as_array().unwrap();
        assert_eq!(group_sessions.len(), 2, "its two seeds: {g}");
        for s in group_sessions {
            sessions += 1;
            let agent: usize = s["name"]
                .as_str()
                .unwrap()
                .trim_start_matches("agents/agent-")
                .parse()
                .unwrap();
            let r = &rows[agent];
            for field in ["n_step", "batch_size", "gamma"] {
                let value = g["hparams"][field].as_f64();
                assert_eq!(value, r[field].parse().ok(), "{field}: {g}");
            }
            assert_eq!(s["status"], "STATUS_SUCCESS", "{s}");
            assert_eq!(
                s["metrics"]["result/env_steps"].to_string(),
                format!("{}.0", r["env_steps"]),
                "{s}"
            );
            assert_eq!(s["metrics"]["result/solved"], 0.0, "{s}");
            assert!(
                s["metrics"]["eval/mean_return"].as_f64().unwrap() > 0.0,
                "{s}"
            );
        }
    }
    assert_eq!(sessions, 8);

    // An agent's saved policy by its number; an agent that is not there is named.
    let eval = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_learner"))
            .args(["eval", "--checkpoint", logdir.to_str().unwrap()])
            .args(args)
            .output()
            .unwrap()
    };
    let out = eval(&[
        "--agent",
        "5",
        "--which",
        "best",
        "--episodes",
        "3",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let out = eval(&["--agent", "8"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("--agent 8: no "), "{}", text(&out));
}

/// A sweep stopped by SIGINT saves each training agent's state and reports the queued
/// ones as interrupted; `--resume LOGDIR` with the same flags keeps the results of
/// agents that had ended, continues the stopped ones from their state and starts the
/// rest. A new population in that
/// directory, or a resume with another sweep, is refused.
#[test]
fn a_stopped_sweep_resumes_where_it_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let sweep = dir.path().join("sweep.toml");
    let write_sweep = |lrs: &str| {
        std::fs::write(
            &sweep,
            format!("seeds = [1, 2, 3]\nmax_steps = 6000\n[grid]\nlr = [{lrs}]\n"),
        )
        .unwrap();
    };
    write_sweep("0.001, 0.002");
    let logdir = dir.path().join("run");
    let args = |extra: &[&str]| {
        let mut a = vec![
            "--env",
            "CartPole-v1",
            "--cpu",
            "--target-return",
            "1000",
            "--sweep",
            sweep.to_str().unwrap(),
            "--max-concurrent-agents",
            "2",
            "--population-threads",
            "1",
            "--no-progress",
        ];
        a.extend_from_slice(extra);
        a.into_iter().map(String::from).collect::<Vec<_>>()
    };
    // Two places for six agents: stop once the first two ended and the next two
    // started; two are still queued.
    let child = millrace_tests::KillOnDrop::spawn(
        Command::new(env!("CARGO_BIN_EXE_learner"))
            .args(args(&["--logdir", logdir.to_str().unwrap()]))
            .env("RUST_LOG", "warn")
            .stderr(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped()),
    );
    let agent_dir = |k: usize| logdir.join(format!("agents/agent-{k:03}"));
    millrace_tests::wait_until(
        "two agents ended and the next started",
        std::time::Duration::from_secs(120),
        || agent_dir(1).join("result.json").exists() && agent_dir(3).join("agent.json").exists(),
    );
    millrace_tests::signal(&child, "-INT");
    let out = child.into_inner().wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));
    assert!(text(&out).contains("--resume"), "{}", text(&out));
    let stopped = rows(&logdir);
    assert_eq!(stopped.len(), 6, "every agent is reported: {stopped:?}");
    for r in &stopped[4..] {
        assert_eq!(
            (r["end"].as_str(), r["env_steps"].as_str()),
            ("interrupted", "0")
        );
    }
    let ended: Vec<String> = (0..2)
        .map(|k| std::fs::read_to_string(agent_dir(k).join("result.json")).unwrap())
        .collect();
    for k in 2..4 {
        assert!(
            agent_dir(k).join("checkpoint/latest/meta.json").exists(),
            "agent {k}'s state was saved: {}",
            text(&out)
        );
    }
    let stopped_at: Vec<u64> = (2..4)
        .map(|k| {
            read_json(&agent_dir(k).join("checkpoint/latest/meta.json"))["env_steps"]
                .as_u64()
                .unwrap()
        })
        .collect();

    // Not without --resume; not with another sweep.
    let out = learner_args(&args(&["--logdir", logdir.to_str().unwrap()]));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains("already holds a population"),
        "{}",
        text(&out)
    );
    write_sweep("0.001, 0.003");
    let out = learner_args(&args(&["--resume", logdir.to_str().unwrap()]));
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("agent 3: "), "{}", text(&out));

    write_sweep("0.001, 0.002");
    let out = Command::new(env!("CARGO_BIN_EXE_learner"))
        .args(args(&["--resume", logdir.to_str().unwrap()]))
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let log = text(&out);
    assert_eq!(out.status.code(), Some(2), "budgets: {log}");
    assert!(
        log.contains("2 agent(s) ended before, 2 go on from their state, 2 start"),
        "{log}"
    );
    for (k, at) in (2..4).zip(&stopped_at) {
        assert!(
            log.contains(&format!("agent {k}: resumed at {at} env steps")),
            "{log}"
        );
    }
    for (k, before) in ended.iter().enumerate() {
        let now = std::fs::read_to_string(agent_dir(k).join("result.json")).unwrap();
        assert_eq!(&now, before, "agent {k}'s result stands");
    }
    let rows = rows(&logdir);
    assert_eq!(rows.len(), 6);
    assert!(
        rows.iter()
            .all(|r| r["end"] == "budget" && r["env_steps"].parse::<u64>().unwrap() >= 6000),
        "{rows:?}"
    );
}

fn learner_args(args: &[String]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_learner"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("learner runs")
}
