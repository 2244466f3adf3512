//! A soak over loopback: two honest actors train a `learner --listen --token-file
//! --metrics-addr` while hostile clients, for a bounded time and each kind from a
//! loopback address of its own, hold silent sockets reconnecting on the actor port and
//! 2,000 idle ones on the metrics port, trickle frames, guess tokens, claim oversized
//! frames, send garbage, and (with the token, as a buggy actor would) send non-finite
//! batches and a finite but huge reward. What must hold: the honest actors keep
//! training (env steps rising, evaluations going on), every honest join tried under the
//! load is welcomed, every health probe is answered, the sessions sending poison are
//! closed (tests/tests/poison.rs checks the refusal's words), nothing panics, and the
//! learner's memory stays bounded.
//! It prints the honest throughput with and without the hostile load, measured side by
//! side in this one run, and the learner's peak memory (docs/results/robustness.md
//! records a run).

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::learner_on;
use common::prometheus::metrics_addr;
use millrace_proto::auth;
use millrace_proto::codec::{self, Framer, DEFAULT_MAX_FRAME};
use millrace_proto::wire::{ActorMsg, LearnerMsg, RefusalCode, PROTOCOL_VERSION};
use millrace_tests::{batch, binary, hello, wait_until, KillOnDrop};

const TOKEN: &str = "soak-token-5d1c0a8f2e7b4c39";
/// Each phase: without, then with the hostile load.
const PHASE: Duration = Duration::from_secs(15);
/// Bound on the learner's peak resident memory: replay of 1M CartPole transitions
/// (~100 MiB), libtorch, and the 256 MiB frame budget with room to spare.
const PEAK_RSS_LIMIT_KIB: u64 = 2 << 20;

fn env_steps(metrics: &str) -> f64 {
    let page = millrace_telemetry::check(metrics, "/metrics", Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("GET /metrics: {e}"));
    page.lines()
        .find_map(|l| l.strip_prefix("millrace_env_steps_total "))
        .and_then(|v| v.trim().parse().ok())
        // Not rendered yet (the first tick has not come).
        .unwrap_or(0.0)
}

fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn honest_actor(addr: &str, token: &std::path::Path, seed: u64) -> KillOnDrop {
    KillOnDrop::spawn(
        Command::new(binary("actor"))
            .args(["--n", "8", "--learner", addr, "--seed", &seed.to_string()])
            .arg("--token-file")
            .arg(token)
            .args(["--name", &format!("honest-{seed}")])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
}

/// Hostile clients, each kind on its own thread until `stop`; counts what they did.
#[derive(Default)]
struct Hostile {
    silent: AtomicU64,
    idle_metrics: AtomicU64,
    trickled: AtomicU64,
    wrong_tokens: AtomicU64,
    oversized: AtomicU64,
    garbage: AtomicU64,
    poisoned: AtomicU64,
    huge_rewards: AtomicU64,
    /// Honest joins tried (from the honest actors' address) while the load runs, and
    /// those that were welcomed.
    honest_tries: AtomicU64,
    honest_joins: AtomicU64,
}

/// Each kind of hostile client comes from its own loopback address, as attackers come
/// from machines of their own (the learner bounds what one source may hold before
/// authentication); honest actors come from 127.0.0.1.
fn source(last: u8) -> std::net::IpAddr {
    std::net::Ipv4Addr::new(127, 0, 0, last).into()
}

fn connect_from(addr: SocketAddr, last: u8) -> Option<TcpStream> {
    millrace_tests::connect_from(addr, source(last)).ok()
}

fn spawn_hostile(
    actors: SocketAddr,
    metrics: SocketAddr,
    stop: &Arc<AtomicBool>,
    seen: &Arc<Hostile>,
) -> Vec<std::thread::JoinHandle<()>> {
    let mut threads = Vec::new();
    let go = |f: Box<dyn Fn(&Hostile) + Send>| {
        let (stop, seen) = (Arc::clone(stop), Arc::clone(seen));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                f(&seen);
            }
        })
    };
    // Silent sockets: 200 on the actor port, reopened as the learner closes them (a
    // trickle of reconnections that used to hold every handshake place); 2,000 idle
    // ones on the metrics port, opened at up to ~500 a second (they used to make
    // `/livez` answer 503).
    for (port, n, from, per_tick) in [(actors, 200, 2, 200), (metrics, 2_000, 3, 100)] {
        let stop = Arc::clone(stop);
        let seen = Arc::clone(seen);
        threads.push(std::thread::spawn(move || {
            let mut held: Vec<TcpStream> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                held.retain(|s| {
                    let _ = s.set_nonblocking(true);
                    let mut b = [0u8; 1];
                    !matches!((&*s).read(&mut b), Ok(0))
                });
                for _ in 0..per_tick {
                    if held.len() >= n {
                        break;
                    }
                    let Some(s) = connect_from(port, from) else {
                        break;
                    };
                    let counter = if port == actors {
                        &seen.silent
                    } else {
                        &seen.idle_metrics
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    held.push(s);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }));
    }
    // Trickle: 16 frames that claim 60,000 bytes and send one byte every 100 ms.
    for _ in 0..16 {
        threads.push(go(Box::new(move |seen| {
            let Some(mut s) = connect_from(actors, 4) else {
                std::thread::sleep(Duration::from_millis(50));
                return;
            };
            seen.trickled.fetch_add(1, Ordering::Relaxed);
            let _ = s.write_all(&60_000u32.to_le_bytes());
            for _ in 0..100 {
                if s.write_all(&[0]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })));
    }
    // Guesses at the token.
    for _ in 0..4 {
        threads.push(go(Box::new(move |seen| {
            if let Some((_, LearnerMsg::Refused(r))) = try_join(actors, 5, "guess") {
                if r.code == RefusalCode::WrongToken {
                    seen.wrong_tokens.fetch_add(1, Ordering::Relaxed);
                }
            }
        })));
    }
    // Frames that claim 2 GiB, and garbage.
    threads.push(go(Box::new(move |seen| {
        if let Some(mut s) = connect_from(actors, 6) {
            let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
            let _ = s.write_all(&(2u32 << 30).to_le_bytes());
            let _ = s.read(&mut [0u8; 64]);
            seen.oversized.fetch_add(1, Ordering::Relaxed);
        }
        std::thread::sleep(Duration::from_millis(20));
    })));
    threads.push(go(Box::new(move |seen| {
        if let Some(mut s) = connect_from(actors, 6) {
            let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
            let junk: Vec<u8> = (0..4096u32)
                .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
                .collect();
            let _ = s.write_all(&junk);
            let _ = s.read(&mut [0u8; 64]);
            seen.garbage.fetch_add(1, Ordering::Relaxed);
        }
        std::thread::sleep(Duration::from_millis(20));
    })));
    // A token holder whose environment returns NaN: its batches are refused.
    threads.push(go(Box::new(move |seen| {
        if let Some((mut s, LearnerMsg::Sealed(_))) = try_join(actors, 7, TOKEN) {
            let mut b = batch(64, 4);
            b.push_f32(&[f32::NAN; 4], 0, 1.0, 0.99, &[0.0; 4]);
            if let Ok(frame) = codec::encode(&ActorMsg::Transitions(b), DEFAULT_MAX_FRAME) {
                let _ = s.write_all(&frame);
                // Read until the learner closes the session.
                let mut sink = [0u8; 4096];
                while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
                seen.poisoned.fetch_add(1, Ordering::Relaxed);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    })));
    // A token holder whose environment returns a finite but huge reward (3e38): its
    // batches are refused at the door, naming the field (one such transition used to
    // end the run).
    threads.push(go(Box::new(move |seen| {
        if let Some((mut s, LearnerMsg::Sealed(_))) = try_join(actors, 8, TOKEN) {
            let mut b = batch(64, 4);
            b.rewards[10] = 3e38;
            if let Ok(frame) = codec::encode(&ActorMsg::Transitions(b), DEFAULT_MAX_FRAME) {
                let _ = s.write_all(&frame);
                let mut sink = [0u8; 4096];
                while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
                seen.huge_rewards.fetch_add(1, Ordering::Relaxed);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    })));
    // Honest joins from the honest actors' own address while all that goes on: each
    // must be welcomed (64 silent sockets reconnecting from one address used to lock
    // every one of them out).
    threads.push(go(Box::new(move |seen| {
        seen.honest_tries.fetch_add(1, Ordering::Relaxed);
        if let Some((_, LearnerMsg::Sealed(_))) = try_join(actors, 1, TOKEN) {
            seen.honest_joins.fetch_add(1, Ordering::Relaxed);
        }
        std::thread::sleep(Duration::from_millis(500));
    })));
    threads
}

/// The handshake as an actor does it, giving up quietly on a closed connection (the
/// learner turns handshakes past its bound away at accept): the stream and the answer
/// to the proof.
fn try_join(addr: SocketAddr, from: u8, token: &str) -> Option<(TcpStream, LearnerMsg)> {
    let mut s = connect_from(addr, from)?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut framer = Framer::new(DEFAULT_MAX_FRAME);
    let ActorMsg::Hello(h) = hello(PROTOCOL_VERSION, 4) else {
        return None;
    };
    let first = codec::encode(&ActorMsg::Hello(h.clone()), DEFAULT_MAX_FRAME).ok()?;
    s.write_all(&first).ok()?;
    let Some(LearnerMsg::Challenge(c)) = codec::read_msg(&mut s, &mut framer).ok()? else {
        return None;
    };
    let proof = auth::actor_proof(token.as_bytes(), &h, &c).ok()?;
    s.write_all(&codec::encode(&ActorMsg::Proof(proof), DEFAULT_MAX_FRAME).ok()?)
        .ok()?;
    let answer = codec::read_msg(&mut s, &mut framer).ok()??;
    Some((s, answer))
}

/// `/livez` and `/healthz` every 500 ms until `stop`: (answered 200, failed).
fn probe(metrics: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<(u32, Vec<String>)> {
    std::thread::spawn(move || {
        let (mut ok, mut failed) = (0, Vec::new());
        while !stop.load(Ordering::Relaxed) {
            for path in ["/livez", "/healthz"] {
                match millrace_telemetry::check(&metrics, path, Duration::from_secs(2)) {
                    Ok(_) => ok += 1,
                    Err(e) => failed.push(format!("{path}: {e}")),
                }
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        (ok, failed)
    })
}

#[test]
fn honest_actors_keep_training_through_a_hostile_load_and_memory_stays_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, TOKEN).unwrap();
    let mut l = learner_on(
        "127.0.0.1:0",
        &dir.path().join("run"),
        &[
            "--token-file",
            token.to_str().unwrap(),
            "--metrics-addr",
            "127.0.0.1:0",
            "--max-steps",
            "1000000000",
            "--target-return",
            "1e9",
            "--eval-every",
            "5000",
            "--eval-episodes",
            "5",
        ],
    );
    let mut metrics = None;
    wait_until("the metrics address", Duration::from_secs(30), || {
        metrics = l.log.lock().unwrap().iter().find_map(|s| metrics_addr(s));
        metrics.is_some()
    });
    let metrics = metrics.unwrap();
    let mut honest: Vec<KillOnDrop> = (0..2).map(|i| honest_actor(&l.addr, &token, i)).collect();
    wait_until("the honest actors train", Duration::from_secs(60), || {
        env_steps(&metrics) > 20_000.0
    });
    let evals = |l: &common::Learner| {
        l.log
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.contains("eval: mean return"))
            .count()
    };

    // Quiet, then hostile, side by side.
    let (stop_probe, probe_quiet) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let quiet_probe = probe(metrics.clone(), Arc::clone(&probe_quiet));
    let (s0, t0) = (env_steps(&metrics), Instant::now());
    std::thread::sleep(PHASE);
    let quiet = (env_steps(&metrics) - s0) / t0.elapsed().as_secs_f64();
    probe_quiet.store(true, Ordering::Relaxed);
    let (quiet_ok, quiet_failed) = quiet_probe.join().unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Hostile::default());
    let actors: SocketAddr = l.addr.parse().unwrap();
    let hostile = spawn_hostile(actors, metrics.parse().unwrap(), &stop, &seen);
    let probes = probe(metrics.clone(), Arc::clone(&stop_probe));
    let (evals_before, s1, t1) = (evals(&l), env_steps(&metrics), Instant::now());
    std::thread::sleep(PHASE);
    let under_load = (env_steps(&metrics) - s1) / t1.elapsed().as_secs_f64();
    // Evaluations go on under load: the load stays on until one has finished, since on
    // a slow VM (151 honest env steps/s under load) the next evaluation point can be
    // more than one phase away.
    wait_until("an evaluation under load", Duration::from_secs(120), || {
        evals(&l) > evals_before
    });
    let evals_during = evals(&l) - evals_before;
    stop.store(true, Ordering::Relaxed);
    stop_probe.store(true, Ordering::Relaxed);
    let (probe_ok, probe_failed) = probes.join().unwrap();
    for t in hostile {
        t.join().unwrap();
    }
    let peak = peak_rss_kib(l.child.id());
    let running = l.child.try_wait().unwrap().is_none();
    for a in &mut honest {
        assert!(a.try_wait().unwrap().is_none(), "an honest actor stopped");
        let _ = a.kill();
        let _ = a.wait();
    }
    let _ = l.child.kill();
    let _ = l.child.wait();
    let log = l.log.lock().unwrap().join("\n");

    let h = &seen;
    println!(
        "soak: honest env steps/s {quiet:.0} quiet, {under_load:.0} under load ({:.2}x); \
         probes answered {} of {} quiet, {} of {} under load; evaluations under load {evals_during}; \
         learner peak RSS {:.0} MiB; hostile: {} silent sockets, {} idle metrics sockets, {} trickled frames, \
         {} wrong tokens, {} oversized claims, {} garbage streams, {} poisoned sessions, {} huge rewards; \
         honest joins {} of {}",
        under_load / quiet,
        quiet_ok,
        quiet_ok as usize + quiet_failed.len(),
        probe_ok,
        probe_ok as usize + probe_failed.len(),
        peak as f64 / 1024.0,
        h.silent.load(Ordering::Relaxed),
        h.idle_metrics.load(Ordering::Relaxed),
        h.trickled.load(Ordering::Relaxed),
        h.wrong_tokens.load(Ordering::Relaxed),
        h.oversized.load(Ordering::Relaxed),
        h.garbage.load(Ordering::Relaxed),
        h.poisoned.load(Ordering::Relaxed),
        h.huge_rewards.load(Ordering::Relaxed),
        h.honest_joins.load(Ordering::Relaxed),
        h.honest_tries.load(Ordering::Relaxed),
    );
    assert!(running, "the learner stopped under load:\n{log}");
    assert!(!log.contains("panicked"), "{log}");
    assert!(under_load > 0.0, "no env steps under load");
    assert!(evals_during > 0, "no evaluation under load");
    assert!(
        probe_failed.is_empty() && quiet_failed.is_empty(),
        "unanswered probes: {probe_failed:?} {quiet_failed:?}"
    );
    assert!(peak < PEAK_RSS_LIMIT_KIB, "peak RSS {peak} KiB");
    // Every kind of hostile client ran.
    for (what, n) in [
        ("silent", &h.silent),
        ("trickled", &h.trickled),
        ("wrong tokens", &h.wrong_tokens),
        ("oversized", &h.oversized),
        ("garbage", &h.garbage),
        ("poisoned", &h.poisoned),
        ("idle metrics", &h.idle_metrics),
        ("huge rewards", &h.huge_rewards),
        ("honest joins", &h.honest_joins),
    ] {
        assert!(n.load(Ordering::Relaxed) > 0, "no {what} client ran");
    }
    assert_eq!(
        h.honest_joins.load(Ordering::Relaxed),
        h.honest_tries.load(Ordering::Relaxed),
        "every honest join under the load was welcomed"
    );
}
