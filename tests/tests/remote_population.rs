//! A population served by remote actors, as users run it: `learner --population 2
//! --listen` and three `actor --n 8` processes. Each actor is assigned an agent at its
//! handshake (the one with the fewest actors); when an agent ends, its actors are sent
//! to serve another; both agents solve CartPole, and when the last one ends the actors
//! are told the run is finished and exit by themselves.
//!
//! The binaries must be built first (`cargo build --bins`; `scripts/test.sh` does).

use std::process::Child;
use std::time::Duration;

mod common;
use common::{actor, exits_by_itself, learner_on};

#[test]
fn remote_actors_serve_a_population_and_exit_when_it_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let mut l = learner_on(
        "127.0.0.1:0",
        dir.path(),
        &[
            "--population",
            "2",
            "--population-threads",
            "1",
            "--max-steps",
            "150000",
        ],
    );
    let mut actors: Vec<Child> = ["one", "two", "three"]
        .iter()
        .enumerate()
        .map(|(i, name)| actor(&l.addr, i as u64 + 1, name))
        .collect();
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = l.child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > Duration::from_secs(240) {
            let _ = l.child.kill();
            panic!(
                "the learner did not finish:\n{}",
                l.log.lock().unwrap().join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut out = String::new();
    std::io::Read::read_to_string(l.child.stdout.as_mut().unwrap(), &mut out).unwrap();
    l.reader.join().unwrap();
    let log = l.log.lock().unwrap().clone();
    let all = log.join("\n");
    assert_eq!(status.code(), Some(0), "both agents solve:\n{out}\n{all}");
    assert!(out.contains("2 solved"), "{out}");
    // Actors spread over both agents at their handshakes.
    for agent in 0..2 {
        assert!(
            log.iter()
                .any(|l| l.contains(&format!("joined for agent {agent} "))),
            "an actor served agent {agent}:\n{all}"
        );
    }
    // The first agent to end sent its actors to the other; the last one's end is the
    // run's: every actor still connected is told it finished, and exits 0.
    assert!(
        log.iter().any(|l| l.contains("told LearnerStopping")),
        "the first agent's actors were sent on:\n{all}"
    );
    assert!(log.iter().any(|l| l.contains("told RunFinished")), "{all}");
    for a in &mut actors {
        let status = exits_by_itself(a, Duration::from_secs(30), &log);
        assert!(status.success(), "{status}");
    }
    for agent in 0..2 {
        let solved = dir.path().join(format!(
            "agents/agent-{agent:03}/checkpoint/solved/meta.json"
        ));
        assert!(solved.exists(), "{}", solved.display());
    }
}
