//! Remote actors on pixel environments, as users run them: a learner with `--listen`
//! and `actor` processes serving MinAtar (through the Gymnasium bridge) and Atari
//! (ale-py), their u8 image batches over the wire into replay. Apart from the CartPole
//! cluster tests: these are heavy (CNN inference, 64 Atari games), and test binaries
//! run one after another.
//!
//! The binaries must be built first (`cargo build --bins`; `scripts/test.sh` does).

use std::process::{Command, Stdio};
use std::time::Duration;

use millrace_tests::binary;

mod common;
use common::{exits_by_itself, finish, learner_on, received_from};

#[test]
fn remote_actors_serve_a_bridged_pixel_env_through_the_wire_into_replay() {
    // MinAtar through the Gymnasium bridge on both sides: the learner sends how to
    // build the environment in the welcome; the actor builds it, checks its spaces
    // against the learner's, and streams u8 image batches.
    let dir = tempfile::tempdir().unwrap();
    let l = learner_on(
        "127.0.0.1:0",
        dir.path(),
        &[
            "--env",
            "gym:MinAtar/Breakout-v1",
            "--cpu",
            "--max-steps",
            "3000",
            "--learning-starts",
            "256",
            "--batch-size",
            "32",
            "--replay-capacity",
            "8192",
            "--eval-every",
            "1000000",
            "--target-return",
            "1000",
        ],
    );
    let mut a = Command::new(binary("actor"))
        .args(["--n", "4", "--learner", &l.addr, "--name", "pixels"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (code, out, log) = finish(l, Duration::from_secs(180));
    // The step budget ends the run (MinAtar Breakout cannot return 1000).
    assert_eq!(code, Some(2), "{out}\n{}", log.join("\n"));
    assert!(received_from(&log, "pixels") >= 3000, "{}", log.join("\n"));
    let latest = millrace_tests::read_json(&dir.path().join("checkpoint/latest/meta.json"));
    assert_eq!(
        latest["env"]["obs"]["shape"],
        serde_json::json!([4, 10, 10])
    );
    assert!(latest["updates"].as_u64().unwrap() > 0, "{latest}");
    let status = exits_by_itself(&mut a, Duration::from_secs(20), &log);
    let mut err = String::new();
    std::io::Read::read_to_string(a.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{status}: {err}");
}

#[test]
fn an_actor_with_64_atari_games_sends_batches_the_learner_reads() {
    // Pong's 28,224-byte stacks: the learner sizes each actor's batches to fit the
    // frames it reads (64 MiB for images, told in the welcome), so `actor --n 64`
    // delivers instead of failing to encode.
    let dir = tempfile::tempdir().unwrap();
    let l = learner_on(
        "127.0.0.1:0",
        dir.path(),
        &[
            "--env",
            "PongNoFrameskip-v4",
            "--cpu",
            "--max-steps",
            "2000",
            "--learning-starts",
            "256",
            "--batch-size",
            "32",
            "--samples-per-insert",
            "1",
            "--replay-capacity",
            "16384",
            "--eval-every",
            "1000000",
        ],
    );
    let mut a = Command::new(binary("actor"))
        .args(["--n", "64", "--learner", &l.addr, "--name", "pong"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (code, out, log) = finish(l, Duration::from_secs(180));
    let status = exits_by_itself(&mut a, Duration::from_secs(30), &log);
    let mut err = String::new();
    std::io::Read::read_to_string(a.stderr.as_mut().unwrap(), &mut err).unwrap();
    // Pong has no reward threshold: the step budget ends the run (exit status 2).
    assert_eq!(code, Some(2), "{out}\n{}\nactor: {err}", log.join("\n"));
    assert!(received_from(&log, "pong") >= 2000, "{}", log.join("\n"));
    assert!(status.success(), "{status}: {err}");
}
