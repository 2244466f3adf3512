//! One bad transition does not end a run (issue "One bad transition…", part 1).
//!
//! A reward of 3e38 is finite: it used to be stored, and within ~10 s the learner
//! stopped, "132 consecutive updates had a non-finite loss … the run diverged" (5 runs
//! of 5). Now, with the default bounds, the batch is refused at the door naming the
//! field, and the run goes on; with the bound raised past it by the user, the item is
//! stored, its TD error found poison by the learner's feedback, evicted and counted on
//! `/metrics`, and the run goes on to its end.
//!
//! The binaries must be built first (`cargo build --bins`; `scripts/test.sh` does).

use std::time::Duration;

use millrace_proto::wire::{ActorMsg, RefusalCode};
use millrace_tests::{batch, wait_until, WireClient};

mod common;
use common::prometheus::{metrics_addr, page, parsed, value};
use common::{actor, finish, learner_on};

/// A valid CartPole batch of `rows` transitions, one of whose rewards is 2.9e38.
fn poisoned(rows: usize) -> ActorMsg {
    let mut b = batch(rows, 4);
    b.rewards[rows / 2] = 2.9e38;
    ActorMsg::Transitions(b)
}

#[test]
fn a_reward_of_3e38_is_refused_at_the_door_naming_the_field_and_the_run_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let l = learner_on("127.0.0.1:0", dir.path(), &["--cpu", "--max-steps", "6000"]);
    let mut honest = actor(&l.addr, 1, "honest");
    let mut c = WireClient::connect(l.addr.parse().unwrap());
    let _ = c.join("");
    c.send(&poisoned(16));
    let r = c.refused().expect("a typed refusal");
    assert_eq!(r.code, RefusalCode::ProtocolViolation, "{r}");
    assert!(
        r.message.contains("rewards[8] = 2.9e38") && r.message.contains("out of bounds"),
        "{r}"
    );
    let (code, out, log) = finish(l, Duration::from_secs(600));
    assert!(
        matches!(code, Some(0 | 2)),
        "the run went on to its end:\n{out}"
    );
    assert!(
        !log.iter().any(|l| l.contains("diverged")),
        "{}",
        log.join("\n")
    );
    assert!(honest.wait().unwrap().success());
}

#[test]
fn a_reward_of_3e38_within_a_raised_bound_is_evicted_as_poison_and_the_run_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let l = learner_on(
        "127.0.0.1:0",
        dir.path(),
        &[
            "--cpu",
            "--max-steps",
            "20000",
            "--target-return",
            "1000",
            "--max-abs-reward",
            "1e38",
            "--metrics-addr",
            "127.0.0.1:0",
        ],
    );
    let mut metrics = None;
    wait_until("the metrics address", Duration::from_secs(30), || {
        metrics = l.log.lock().unwrap().iter().find_map(|s| metrics_addr(s));
        metrics.is_some()
    });
    let metrics = metrics.unwrap();
    let mut honest = actor(&l.addr, 1, "honest");
    // Stored (it is within the raised bound): the session goes on.
    let mut c = WireClient::connect(l.addr.parse().unwrap());
    let _ = c.join("");
    c.send(&poisoned(16));
    // Read off the page as it is published (empty until the first metrics tick).
    let evicted = || {
        page(&metrics)
            .lines()
            .find_map(|l| l.strip_prefix("millrace_replay_evicted_poison_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    wait_until(
        "the learner evicts the poisoned item",
        Duration::from_secs(300),
        || evicted() >= 1.0,
    );
    // Counted, and charged to the session that sent it.
    let f = parsed(&page(&metrics));
    let (total, diverged) = (
        value(&f, "millrace_replay_evicted_poison_total", &[]),
        value(&f, "millrace_losses_nonfinite_skipped", &[]),
    );
    eprintln!("evicted {total}, non-finite updates in the last report: {diverged}");
    drop(c);
    let (code, out, log) = finish(l, Duration::from_secs(600));
    assert_eq!(code, Some(2), "the run went on to its step budget:\n{out}");
    assert!(out.contains("poison:"), "the summary counts it:\n{out}");
    assert!(
        !log.iter().any(|l| l.contains("diverged")),
        "{}",
        log.join("\n")
    );
    assert!(
        log.iter().any(|l| l.contains("evicted as poison")),
        "{}",
        log.join("\n")
    );
    assert!(honest.wait().unwrap().success());
}
