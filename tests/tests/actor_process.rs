//! The `actor` process against a scripted learner ([`FakeLearner`]): a permanent
//! refusal stops it with a clear message and exit status 1 (one test per kind), a
//! temporary one makes it back off and retry (one test per kind), "the learner is
//! stopping" makes it reconnect, "the run is finished" makes it exit 0, and SIGTERM or
//! SIGINT stop it cleanly with a goodbye. `actor doctor` explains a missing libtorch.

use std::process::{Command, Output, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use millrace_proto::wire::{Goodbye, GoodbyeReason, Refusal, RefusalCode};
use millrace_proto::EnvConfig;
use millrace_tests::{binary, wait_until, Answer, FakeLearner, KillOnDrop};

const LIMIT: Duration = Duration::from_secs(30);

fn actor(addr: &std::net::SocketAddr) -> KillOnDrop {
    actor_with(addr, &[], None)
}

/// An actor with `extra` flags, and `pythonpath` for a `gym:` environment's module.
fn actor_with(
    addr: &std::net::SocketAddr,
    extra: &[&str],
    pythonpath: Option<&std::path::Path>,
) -> KillOnDrop {
    let mut cmd = Command::new(binary("actor"));
    if let Some(p) = pythonpath {
        cmd.env("PYTHONPATH", p);
    }
    KillOnDrop::spawn(
        cmd.args(["--n", "4", "--learner", &addr.to_string()])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )
}

/// Waits for the actor to exit (failing the test after `LIMIT`).
fn exit(mut child: KillOnDrop) -> Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        // The guard kills it as the test fails.
        assert!(
            start.elapsed() <= LIMIT,
            "the actor did not exit within {LIMIT:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.into_inner().wait_with_output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn finished(after_batches: usize) -> Answer {
    Answer::WelcomeThenGoodbye {
        after_batches,
        goodbye: Goodbye {
            reason: GoodbyeReason::RunFinished,
            message: "solved".into(),
        },
    }
}

#[test]
fn a_permanent_refusal_stops_the_actor_with_a_clear_error() {
    for code in [
        RefusalCode::WrongToken,
        RefusalCode::ProtocolVersion,
        RefusalCode::EnvUnsupported,
        RefusalCode::BatchTooLarge,
        RefusalCode::BadRequest,
        RefusalCode::ProtocolViolation,
    ] {
        let message = format!("scripted {code:?}");
        let fake = FakeLearner::start(vec![Answer::Refuse(Refusal::new(code, message.clone()))]);
        let out = exit(actor(&fake.addr));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{code:?}: {err}");
        let line = err
            .lines()
            .find(|l| l.starts_with("error:"))
            .unwrap_or_default();
        assert!(
            line.contains("refused this actor for good") && line.contains(&message),
            "{code:?}: {line}"
        );
        assert!(line.contains("permanent"), "{code:?}: {line}");
        assert_eq!(fake.connections(), 1, "{code:?}: no retry");
    }
}

#[test]
fn a_temporary_refusal_makes_the_actor_back_off_and_retry() {
    for code in [
        RefusalCode::TooManyConnections,
        RefusalCode::NotReady,
        RefusalCode::Timeout,
    ] {
        let refuse = Answer::Refuse(Refusal::new(code, "come back later"));
        let fake = FakeLearner::start(vec![refuse.clone(), refuse, finished(2)]);
        let start = Instant::now();
        let out = exit(actor(&fake.addr));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(0), "{code:?}: {err}");
        assert_eq!(
            fake.connections(),
            3,
            "{code:?}: retried after each refusal"
        );
        assert!(fake.seen.batches.load(Ordering::SeqCst) >= 2, "{code:?}");
        // Two backoffs of 0.2 s and 0.4 s, each with ±50% jitter.
        assert!(
            start.elapsed() >= Duration::from_millis(250),
            "{code:?}: backed off"
        );
        assert!(err.contains("reconnecting in"), "{code:?}: {err}");
        assert!(
            err.contains("the run is finished: solved"),
            "{code:?}: {err}"
        );
    }
}

#[test]
fn an_actor_that_cannot_act_exits_instead_of_reconnecting() {
    let fake = FakeLearner::start(vec![Answer::WelcomeWithBadParams]);
    let out = exit(actor(&fake.addr));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_default();
    assert!(
        line.contains("the actor loop failed: bad parameters"),
        "{line}"
    );
    assert_eq!(fake.connections(), 1, "no retry");
}

#[test]
fn parameters_past_the_handshakes_frame_limit_are_read_up_to_the_welcomes() {
    // A 25 MiB parameter frame, under the 64 MiB the welcome announces: the actor acts
    // with it (its batches arrive) and leaves when the run is finished, on its first
    // connection (it used to reject the frame and reconnect for ever).
    let fake = FakeLearner::start(vec![Answer::LargeParamsThenGoodbye {
        after_batches: 2,
        goodbye: Goodbye {
            reason: GoodbyeReason::RunFinished,
            message: "solved".into(),
        },
    }]);
    let out = exit(actor(&fake.addr));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("the run is finished: solved"), "{err}");
    assert_eq!(fake.connections(), 1, "no reconnection: {err}");
    assert!(fake.seen.batches.load(Ordering::SeqCst) >= 2);
}

#[test]
fn a_learner_that_is_stopping_is_waited_for() {
    let stopping = Answer::WelcomeThenGoodbye {
        after_batches: 1,
        goodbye: Goodbye {
            reason: GoodbyeReason::LearnerStopping,
            message: "SIGTERM".into(),
        },
    };
    let fake = FakeLearner::start(vec![stopping, finished(1)]);
    let out = exit(actor(&fake.addr));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        fake.connections(),
        2,
        "reconnected after the learner stopped"
    );
}

#[test]
fn sigterm_and_sigint_stop_the_actor_cleanly_with_a_goodbye() {
    for signal in ["-TERM", "-INT"] {
        let fake = FakeLearner::start(vec![Answer::WelcomeAndServe]);
        let child = actor(&fake.addr);
        wait_until("the actor streams", LIMIT, || {
            fake.seen.batches.load(Ordering::SeqCst) > 0
        });
        millrace_tests::signal(&child, signal);
        let out = exit(child);
        assert_eq!(out.status.code(), Some(0), "{signal}: {}", stderr(&out));
        wait_until("the goodbye arrives", LIMIT, || {
            !fake.seen.goodbyes.lock().unwrap().is_empty()
        });
        let g = fake.seen.goodbyes.lock().unwrap()[0].clone();
        assert_eq!(g.reason, GoodbyeReason::ActorStopping, "{signal}");
    }
}

#[test]
fn actor_doctor_explains_a_missing_libtorch() {
    let out = Command::new(binary("actor"))
        .args(["doctor", "--libtorch", "/nonexistent/torch/lib"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("libtorch_cpu.so not found"), "{text}");
    assert!(text.contains("scripts/setup.sh"), "{text}");
    // The project's own libtorch (its virtualenv) loads.
    let out = Command::new(binary("actor"))
        .arg("doctor")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(text.contains("PyTorch 2.11.0"), "{text}");
    assert!(
        text.contains("libtorch_cpu.so") && text.contains("loads"),
        "{text}"
    );
    // The bridge's interpreter and packages, each with its version.
    for line in [
        "ok    python",
        "ok    gymnasium          1.4.0",
        "ok    ale_py",
        "ok    minatar",
    ] {
        assert!(text.contains(line), "{line:?} in:\n{text}");
    }
}

/// A module that leaves a marker when imported, on a Python path of its own.
fn marker_module() -> (tempfile::TempDir, std::path::PathBuf, EnvConfig) {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("imported");
    std::fs::write(
        dir.path().join("evil_probe.py"),
        format!("open({:?}, 'w').close()\n", marker.to_str().unwrap()),
    )
    .unwrap();
    let mut env = EnvConfig::new("gym:CartPole-v1");
    env.module = Some("evil_probe".into());
    (dir, marker, env)
}

#[test]
fn an_actor_imports_only_the_modules_its_command_line_allows() {
    // The `actor` binary is built with the Gymnasium bridge (its default features).
    let (dir, marker, env) = marker_module();
    // A real learner naming a module the actor was not told to allow: refused, for good.
    let fake = FakeLearner::start(vec![Answer::WelcomeTo(env.clone())]);
    let out = exit(actor_with(&fake.addr, &[], Some(dir.path())));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let line = millrace_tests::error_line(&err);
    assert!(
        line.contains("\"evil_probe\"") && line.contains("--allow-env-module evil_probe"),
        "{line}"
    );
    assert!(!marker.exists(), "imported without being allowed");
    // Allowed, it is imported (so the marker can tell).
    let fake = FakeLearner::start(vec![Answer::WelcomeTo(env)]);
    let mut child = actor_with(
        &fake.addr,
        &["--allow-env-module", "evil_probe"],
        Some(dir.path()),
    );
    wait_until("the allowed module is imported", LIMIT, || marker.exists());
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn an_impersonator_without_the_token_gets_nothing_run() {
    let (dir, marker, env) = marker_module();
    // It collects the actor's proof and welcomes it to a module the actor even allows:
    // its welcome's seal fails, nothing is built, and the actor keeps looking for the
    // real learner.
    let fake = FakeLearner::start(vec![Answer::Impersonate(env)]);
    let mut child = actor_with(
        &fake.addr,
        &["--allow-env-module", "evil_probe"],
        Some(dir.path()),
    );
    wait_until("the actor tried again", LIMIT, || fake.connections() >= 2);
    let _ = child.kill();
    let out = child.into_inner().wait_with_output().unwrap();
    let err = stderr(&out);
    assert!(err.contains("the learner failed authentication"), "{err}");
    assert_eq!(fake.seen.batches.load(Ordering::SeqCst), 0);
    assert!(!marker.exists(), "an impersonator's module was imported");
}

#[test]
fn a_refusal_only_the_learner_could_give_is_not_believed_unsealed() {
    // A relay's forged "bad request" after the proof: the actor does not exit on it.
    let forged = Answer::RefuseUnsealed(Refusal::new(RefusalCode::BadRequest, "go away"));
    let fake = FakeLearner::start(vec![forged, finished(1)]);
    let out = exit(actor(&fake.addr));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("an unauthenticated BadRequest refusal was ignored"),
        "{err}"
    );
    assert_eq!(
        fake.connections(),
        2,
        "it tried again and was told the run is over"
    );
}
