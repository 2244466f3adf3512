//! A population with the single run's learner features, as a user runs it:
//! `learner --population 4 --replay prioritized --dueling --lr-final 1e-4
//! --metrics-addr ...` trains CartPole; its `/metrics` page, read by Prometheus' own
//! parser while it trains, has one series per agent; every agent solves, and each
//! agent's saved `solved/` policy replays at the target in Gymnasium itself.

use std::process::{Command, Stdio};
use std::time::Duration;

use millrace_tests::{binary, play_in_gymnasium};

mod common;
use common::prometheus::{kind, page, parsed, serving, value, Served};
use common::reference::{assert_documented, sample_names, tensorboard_tags};

const AGENTS: usize = 4;

#[test]
fn a_prioritized_dueling_population_with_decay_solves_and_serves_metrics_per_agent() {
    let dir = tempfile::tempdir().unwrap();
    let logdir = dir.path().join("pop");
    let Served {
        mut child,
        addr,
        log,
        reader,
    } = serving(
        Command::new(binary("learner"))
            .args(["--env", "CartPole-v1", "--cpu", "--seed", "1"])
            // Lock-step: the same seeds train the same way on any machine once the
            // thread count is fixed (its default, one per core, changes the grouping);
            // seed 1 on two threads is shown to solve (issue "One bad transition…",
            // part 6).
            .args([
                "--population",
                &AGENTS.to_string(),
                "--population-threads",
                "2",
            ])
            .args(["--replay", "prioritized", "--dueling", "--lr-final", "1e-4"])
            .args(["--max-steps", "100000", "--metrics-addr", "127.0.0.1:0"])
            .arg("--logdir")
            .arg(&logdir)
            .arg("--no-progress")
            .env("RUST_LOG", "info")
            .env_remove("MILLRACE_INJECT_FAULT")
            .stdout(Stdio::piped()),
    );
    // While it trains: every agent has its series, with steps and updates counted.
    let agent = |k: usize| format!("{k:03}");
    // Polled twice a second: each look runs the parser.
    let sample = |f: &serde_json::Map<String, serde_json::Value>, name: &str, a: &str| {
        let fam = f.get(name.trim_end_matches("_total"))?;
        fam["samples"]
            .as_array()?
            .iter()
            .find(|s| s["name"] == name && s["labels"]["agent"] == a)
            .and_then(|s| s["value"].as_f64())
    };
    let started = std::time::Instant::now();
    loop {
        let f = parsed(&page(&addr));
        let training = (0..AGENTS).all(|k| {
            let a = agent(k);
            sample(&f, "millrace_agent_updates_total", &a).is_some_and(|v| v > 0.0)
                && sample(&f, "millrace_agent_env_steps_total", &a).is_some_and(|v| v > 0.0)
        });
        if training {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "every agent's series shows training: {f:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let f = parsed(&page(&addr));
    assert_eq!(kind(&f, "millrace_agent_env_steps_total"), "counter");
    assert_eq!(kind(&f, "millrace_agent_learning_rate"), "gauge");
    assert_eq!(kind(&f, "millrace_population_agents_training"), "gauge");
    for k in 0..AGENTS {
        let a = agent(k);
        let lr = value(&f, "millrace_agent_learning_rate", &[("agent", &a)]);
        // Decaying from --lr (CartPole's 2.3e-3) towards --lr-final.
        assert!(lr > 1e-4 && lr <= 2.3e-3 + 1e-9, "agent {k}: rate {lr}");
        assert!(value(&f, "millrace_agent_replay_size", &[("agent", &a)]) > 0.0);
    }
    assert_documented("Prometheus: a population", &sample_names(&f), &["always"]);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        // A safety net far above the measured time; the guard kills the learner.
        assert!(
            started.elapsed() < Duration::from_secs(1200),
            "the population did not finish: {}",
            log.lock().unwrap().join("\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("the population finished after {:?}", started.elapsed());
    reader.join().unwrap();
    let mut stdout = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut stdout).unwrap();
    let text = format!("{stdout}\n{}", log.lock().unwrap().join("\n"));
    assert_eq!(status.code(), Some(0), "every agent solved: {text}");
    assert!(text.contains(&format!("{AGENTS} solved")), "{text}");
    // Each agent's TensorBoard run, read by TensorBoard's own reader, holds what the
    // reference lists (it evaluated, and it ended).
    for k in 0..AGENTS {
        assert_documented(
            "TensorBoard: a population's agents",
            &tensorboard_tags(&logdir.join(format!("agents/agent-{k:03}"))),
            &["after each evaluation", "when the agent ends"],
        );
    }
    // What each agent keeps: its solved policy, played by Gymnasium.
    for k in 0..AGENTS {
        let played = play_in_gymnasium(&binary("learner"), &logdir, Some(k), "solved", dir.path());
        let mean = played["mean"].as_f64().unwrap();
        eprintln!("agent {k}: solved/ in Gymnasium: {played}");
        assert!(
            mean >= 475.0,
            "agent {k}'s solved policy returned {mean}: {played}"
        );
    }
}
