//! Remote actors on pixel environments, as users run them: a learner with `--listen`
//! and `actor` processes serving MinAtar (through the Gymnasium bridge) and Atari
//! (ale-py), their u8 image batches over the wire into replay. Apart from the CartPole
//! cluster tests: these are heavy (CNN inference, 64 Atari games), and test binaries
//! run one after another.
//!
//! The binaries must be built first (`cargo build --bins`; `scripts/test.sh` does).

use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use millrace_tests::{binary, KillOnDrop};

mod common;
use common::{exits_by_itself, finish, learner_on, received_from};

/// A finished run: `learner --listen` on a CPU with `flags` (the environment, its
/// budget, replay), served by one `actor --n <envs>` process named `name`.
struct Served {
    dir: tempfile::TempDir,
    code: Option<i32>,
    out: String,
    log: Vec<String>,
    actor: ExitStatus,
    actor_err: String,
}

fn served(flags: &[&str], envs: &str, name: &str) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let mut all = vec!["--cpu", "--learning-starts", "256", "--batch-size", "32"];
    // No evaluation inside the budget: these runs are about the data path.
    all.extend(["--eval-every", "1000000"]);
    all.extend_from_slice(flags);
    let l = learner_on("127.0.0.1:0", dir.path(), &all);
    let mut a = KillOnDrop::spawn(
        Command::new(binary("actor"))
            .args(["--n", envs, "--learner", &l.addr, "--name", name])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    let (code, out, log) = finish(l, Duration::from_secs(180));
    let actor = exits_by_itself(&mut a, Duration::from_secs(30), &log);
    let mut actor_err = String::new();
    std::io::Read::read_to_string(a.stderr.as_mut().unwrap(), &mut actor_err).unwrap();
    Served {
        dir,
        code,
        out,
        log,
        actor,
        actor_err,
    }
}

#[test]
fn remote_actors_serve_a_bridged_pixel_env_through_the_wire_into_replay() {
    // MinAtar through the Gymnasium bridge on both sides: the learner sends how to
    // build the environment in the welcome; the actor builds it, checks its spaces
    // against the learner's, and streams u8 image batches.
    let r = served(
        &[
            "--env",
            "gym:MinAtar/Breakout-v1",
            "--max-steps",
            "3000",
            "--replay-capacity",
            "8192",
            "--target-return",
            "1000",
        ],
        "4",
        "pixels",
    );
    // The step budget ends the run (MinAtar Breakout cannot return 1000).
    assert_eq!(r.code, Some(2), "{}\n{}", r.out, r.log.join("\n"));
    assert!(
        received_from(&r.log, "pixels") >= 3000,
        "{}",
        r.log.join("\n")
    );
    let latest = millrace_tests::read_json(&r.dir.path().join("checkpoint/latest/meta.json"));
    assert_eq!(
        latest["env"]["obs"]["shape"],
        serde_json::json!([4, 10, 10])
    );
    assert!(latest["updates"].as_u64().unwrap() > 0, "{latest}");
    assert!(r.actor.success(), "{}: {}", r.actor, r.actor_err);
}

#[test]
fn an_actor_with_64_atari_games_sends_batches_the_learner_reads() {
    // Pong's 28,224-byte stacks: the learner sizes each actor's batches to fit the
    // frames it reads (64 MiB for images, told in the welcome), so `actor --n 64`
    // delivers instead of failing to encode.
    let r = served(
        &[
            "--env",
            "PongNoFrameskip-v4",
            "--max-steps",
            "2000",
            "--samples-per-insert",
            "1",
            "--replay-capacity",
            "16384",
        ],
        "64",
        "pong",
    );
    // Pong has no reward threshold: the step budget ends the run (exit status 2).
    let log = r.log.join("\n");
    assert_eq!(r.code, Some(2), "{}\n{log}\nactor: {}", r.out, r.actor_err);
    assert!(received_from(&r.log, "pong") >= 2000, "{log}");
    assert!(r.actor.success(), "{}: {}", r.actor, r.actor_err);
}
