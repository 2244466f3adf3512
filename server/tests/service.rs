//! The server over loopback, driven by hand-written clients: the handshake,
//! transitions into replay, parameters out, typed refusals (permanent or temporary),
//! connection limits and timeouts, goodbyes at the end of a run, and every kind of bad
//! input closing that connection alone while a good actor carries on.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use millrace_proto::codec::{self, DEFAULT_MAX_FRAME};
use millrace_proto::wire::{
    ActorMsg, ActorStats, GoodbyeReason, Hello, LearnerMsg, RefusalCode, PROTOCOL_VERSION,
};
use millrace_proto::EpisodeStats;
use millrace_proto::{NetworkSpec, Params, ParamsCell, StepCounter, TransitionBatch};
use millrace_replay::{RateLimiterConfig, ReplayConfig, Table};
use millrace_server::{
    self as server, goodbye_for, ActorBoard, AgentPorts, AgentSpec, Route, Routes, ServerConfig,
    ServerContext, ServerHandle,
};
use millrace_tests::{batch, hello, wait_until, WireClient};

const LIMIT: Duration = Duration::from_secs(10);

struct Fixture {
    server: Option<ServerHandle>,
    addr: SocketAddr,
    table: Arc<Table>,
    params: Arc<ParamsCell>,
    steps: Arc<StepCounter>,
    board: Arc<ActorBoard>,
    episodes: crossbeam_channel::Receiver<EpisodeStats>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.table.close();
        if let Some(s) = self.server.take() {
            s.shutdown(goodbye_for(false, "test over")).unwrap();
        }
    }
}

fn fixture_with(configure: impl FnOnce(&mut ServerConfig)) -> Fixture {
    fixture_of(configure, None)
}

fn fixture_of(
    configure: impl FnOnce(&mut ServerConfig),
    priority: Option<millrace_replay::PriorityConfig>,
) -> Fixture {
    fixture_routed(configure, priority, Routes::One)
}

/// A fixture whose one route (`route`) the server reaches through `routes`, e.g. as a
/// population's agent.
fn fixture_routed(
    configure: impl FnOnce(&mut ServerConfig),
    priority: Option<millrace_replay::PriorityConfig>,
    routes: impl FnOnce(Route) -> Routes,
) -> Fixture {
    let env = millrace_actor::env::spec("CartPole-v1").unwrap();
    let network = NetworkSpec::mlp(&env.obs, &[8], 2, 1).unwrap();
    let table = Arc::new(
        Table::new(&ReplayConfig {
            capacity: 10_000,
            shards: 2,
            obs_row_bytes: env.obs.row_bytes(),
            stack: 1,
            obs_rows_per_item: 2.0,
            limiter: RateLimiterConfig::sample_to_insert_ratio(1.0, 1, 1e9, 1).unwrap(),
            priority,
        })
        .unwrap(),
    );
    let params = Arc::new(ParamsCell::new(Params::of_one(
        0,
        vec![0.0; network.layout().len],
    )));
    let (tx, episodes) = crossbeam_channel::bounded(1024);
    let board = Arc::new(ActorBoard::default());
    let steps = Arc::new(StepCounter::default());
    let mut cfg = ServerConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.handshake_timeout = Duration::from_secs(2);
    configure(&mut cfg);
    let server = server::spawn(
        cfg,
        ServerContext {
            env_config: millrace_proto::EnvConfig::new("CartPole-v1"),
            clip_rewards: false,
            env,
            network,
            run_id: "test".into(),
            routes: routes(Route {
                table: Arc::clone(&table),
                params: Arc::clone(&params),
                steps: Arc::clone(&steps),
            }),
            episodes: tx,
            board: Arc::clone(&board),
        },
    )
    .unwrap();
    Fixture {
        addr: server.addr,
        server: Some(server),
        table,
        params,
        steps,
        board,
        episodes,
    }
}

fn fixture(token: Option<&str>) -> Fixture {
    fixture_with(|cfg| cfg.token = token.map(String::from))
}

fn connected(f: &Fixture) -> usize {
    f.board.summary().connected
}

/// A good actor that keeps streaming while bad ones come and go.
fn good_actor_still_works(f: &Fixture, c: &mut WireClient) {
    let before = f.table.len();
    c.send(&ActorMsg::Transitions(batch(16, 4)));
    wait_until("the good actor's batch is stored", LIMIT, || {
        f.table.len() >= before + 16
    });
}

#[test]
fn an_actor_joins_streams_transitions_and_receives_parameters() {
    let f = fixture(None);
    let mut c = WireClient::connect(f.addr);
    let w = c.join("");
    assert_eq!(w.env.id, "CartPole-v1");
    assert_eq!(w.env_indices, [0, 1, 2, 3]);
    assert!(
        (w.epsilons[0] - 0.4).abs() < 1e-6 && w.epsilons[3] < 0.001,
        "Ape-X epsilons"
    );
    // The current parameters follow the welcome (heartbeats may come first).
    loop {
        match c.recv() {
            Some(LearnerMsg::Params(p)) => break assert_eq!(p.version, 0),
            Some(LearnerMsg::Heartbeat) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(connected(&f), 1, "counted as connected from the welcome on");

    c.send(&ActorMsg::Transitions(batch(32, 4)));
    c.send(&ActorMsg::Stats(ActorStats {
        env_steps: 32,
        episodes: 2,
        episode_returns: vec![10.0, 20.0],
        params_version: 0,
    }));
    wait_until("32 transitions stored", LIMIT, || f.table.len() == 32);
    let got: Vec<f32> = (0..2)
        .map(|_| f.episodes.recv_timeout(LIMIT).unwrap().episode_return)
        .collect();
    assert_eq!(got, [10.0, 20.0], "episode returns reach the coordinator");
    wait_until("its rate is on the board", LIMIT, || {
        f.board.summary().transitions_per_s > 0.0
    });

    // Latest-only: of many quick versions the actor ends up with the newest.
    for v in 1..=50 {
        f.params.publish(Params {
            version: v,
            env_steps: 0,
            updates: 0,
            population: 1,
            data: vec![v as f32; f.params.latest().data.len()],
        });
    }
    let mut newest = 0;
    while newest < 50 {
        match c.recv() {
            Some(LearnerMsg::Params(p)) => newest = p.version,
            Some(LearnerMsg::Heartbeat) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    // A second actor gets the next indices; when the first leaves and comes back it
    // gets its old ones (and their ε) again.
    let mut d = WireClient::connect(f.addr);
    assert_eq!(d.join("").env_indices, [4, 5, 6, 7]);
    drop(c);
    wait_until("the first actor's indices are back", LIMIT, || {
        connected(&f) == 1
    });
    let mut e = WireClient::connect(f.addr);
    assert_eq!(e.join("").env_indices, [0, 1, 2, 3]);
}

#[test]
fn refusals_say_whether_to_retry() {
    let f = fixture_with(|cfg| {
        cfg.token = Some("s3cret".into());
        cfg.handshake_timeout = Duration::from_millis(300);
    });
    let refusal_for = |msg: ActorMsg, token: &str| {
        let mut c = WireClient::connect(f.addr);
        match c.send_hello(&msg, token) {
            LearnerMsg::Refused(r) => {
                let after = c.expect_closed();
                assert!(after.is_empty(), "closed after the refusal: {after:?}");
                r
            }
            other => panic!("a typed refusal, not {other:?}"),
        }
    };
    let refusal = |msg: ActorMsg| refusal_for(msg, "s3cret");
    let permanent = [
        (
            refusal_for(hello(PROTOCOL_VERSION, 4), "guess"),
            RefusalCode::WrongToken,
        ),
        (
            refusal(hello(PROTOCOL_VERSION + 1, 4)),
            RefusalCode::ProtocolVersion,
        ),
        (refusal(hello(PROTOCOL_VERSION, 0)), RefusalCode::BadRequest),
        (
            refusal(hello(PROTOCOL_VERSION, 4096)),
            RefusalCode::BatchTooLarge,
        ),
        (refusal(ActorMsg::Heartbeat), RefusalCode::ProtocolViolation),
    ];
    for (r, code) in permanent {
        assert_eq!(r.code, code, "{r}");
        assert!(r.code.is_permanent(), "{r}");
    }
    let ActorMsg::Hello(h) = hello(PROTOCOL_VERSION, 4) else {
        unreachable!()
    };
    let r = refusal(ActorMsg::Hello(Hello {
        capabilities: millrace_proto::wire::Capabilities {
            env_ids: vec!["Pong-v5".into()],
            ..h.capabilities.clone()
        },
        ..h.clone()
    }));
    assert_eq!(r.code, RefusalCode::EnvUnsupported);
    assert!(r.message.contains("CartPole-v1"), "{r}");
    let r = refusal(ActorMsg::Hello(Hello {
        agent: Some(3),
        ..h
    }));
    assert_eq!(
        r.code,
        RefusalCode::BadRequest,
        "no agent 3 in a population of 1"
    );
    // Silence during the handshake: a temporary refusal (a slow link is worth a retry).
    let mut quiet = WireClient::connect(f.addr);
    let r = quiet
        .refused()
        .expect("refused after the handshake timeout");
    assert_eq!(r.code, RefusalCode::Timeout);
    assert!(!r.code.is_permanent());
}

#[test]
fn connections_beyond_the_limit_are_told_to_come_back_later() {
    let f = fixture_with(|cfg| cfg.max_connections = 2);
    let mut a = WireClient::connect(f.addr);
    let _ = a.join("");
    let mut b = WireClient::connect(f.addr);
    let _ = b.join("");
    // Refused once it has proved the token (sockets that never do take no place).
    let mut c = WireClient::connect(f.addr);
    let r = match c.hello("") {
        LearnerMsg::Refused(r) => r,
        other => panic!("a refusal, not {other:?}"),
    };
    assert_eq!(r.code, RefusalCode::TooManyConnections);
    assert!(!r.code.is_permanent(), "temporary: retry later");
    // One leaves: the next one is admitted.
    drop(a);
    wait_until("one connection fewer", LIMIT, || connected(&f) == 1);
    let mut d = WireClient::connect(f.addr);
    let mut admitted = false;
    // The permit returns as the old connection's task ends; retry briefly, as actors do.
    for _ in 0..100 {
        if let LearnerMsg::Welcome(_) = d.hello("") {
            admitted = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        d = WireClient::connect(f.addr);
    }
    assert!(admitted, "a freed place is taken");
}

#[test]
fn a_quiet_actor_is_closed_after_the_idle_timeout() {
    let f = fixture_with(|cfg| cfg.idle_timeout = Duration::from_millis(300));
    let mut c = WireClient::connect(f.addr);
    let _ = c.join("");
    assert_eq!(connected(&f), 1);
    let r = c.refused().expect("told why");
    assert_eq!(r.code, RefusalCode::Timeout);
    assert!(r.message.contains("nothing received"), "{r}");
    wait_until("it left the board", LIMIT, || connected(&f) == 0);
}

#[test]
fn bad_input_closes_that_connection_alone_with_a_reason() {
    let f = fixture(Some("s3cret"));
    let mut good = WireClient::connect(f.addr);
    let _ = good.join("s3cret");

    // Garbage bytes, and a length prefix beyond the limit (nothing is allocated for it).
    let mut c = WireClient::connect(f.addr);
    c.send_bytes(&[0xde, 0xad, 0xbe, 0xef, 0, 1, 2, 3]);
    let r = c.refused().unwrap();
    assert!(r.message.contains("bad handshake"), "{r}");
    let mut c = WireClient::connect(f.addr);
    c.send_bytes(&u32::MAX.to_le_bytes());
    assert!(c.refused().unwrap().message.contains("exceeds the limit"));
    good_actor_still_works(&f, &mut good);

    // After the handshake: observations of the wrong shape, an action out of range,
    // too many observation rows, an oversized frame, a truncated frame.
    let mut c = WireClient::connect(f.addr);
    let _ = c.join("s3cret");
    c.send(&ActorMsg::Transitions(batch(8, 3)));
    let r = c.refused().unwrap();
    assert_eq!(r.code, RefusalCode::ProtocolViolation);
    assert!(
        r.message.contains("does not match CartPole-v1") && r.message.contains("obs row bytes"),
        "{r}"
    );
    let mut c = WireClient::connect(f.addr);
    let _ = c.join("s3cret");
    let mut b = batch(4, 4);
    b.actions[2] = 7;
    c.send(&ActorMsg::Transitions(b));
    assert!(c
        .refused()
        .unwrap()
        .message
        .contains("actions[2] = 7, outside 0..2"));
    // A non-finite observation (it would poison every update that samples it): refused
    // with its reason, nothing of it stored.
    let mut c = WireClient::connect(f.addr);
    let _ = c.join("s3cret");
    let mut b = TransitionBatch::with_capacity(16, 1, 2);
    b.push_f32(&[0.0, f32::NAN, 0.0, 0.0], 0, 1.0, 0.99, &[0.0; 4]);
    let before = f.table.len();
    c.send(&ActorMsg::Transitions(b));
    let r = c.refused().unwrap();
    assert!(r.message.contains("non-finite observation"), "{r}");
    assert_eq!(f.table.len(), before);
    // Far more observation rows than transitions: it would flush replay past the rate
    // limiter, which counts transitions.
    let mut c = WireClient::connect(f.addr);
    let _ = c.join("s3cret");
    let mut b = batch(1, 4);
    for _ in 0..100 {
        b.push_obs_f32(&[0.0; 4]);
    }
    c.send(&ActorMsg::Transitions(b));
    let r = c.refused().unwrap();
    assert!(
        r.message.contains("102 observation rows for 1 transitions"),
        "{r}"
    );
    let mut c = WireClient::connect(f.addr);
    let _ = c.join("s3cret");
    c.send_bytes(&((DEFAULT_MAX_FRAME + 1) as u32).to_le_bytes());
    assert!(c.refused().unwrap().message.contains("exceeds the limit"));
    let mut c = WireClient::connect(f.addr);
    let _ = c.join("s3cret");
    let frame = codec::encode(&ActorMsg::Transitions(batch(8, 4)), DEFAULT_MAX_FRAME).unwrap();
    let before = f.table.len();
    c.send_bytes(&frame[..frame.len() / 2]);
    c.stream.shutdown(std::net::Shutdown::Write).unwrap();
    let answers = c.expect_closed();
    assert!(
        !answers.iter().any(|m| matches!(m, LearnerMsg::Refused(_))),
        "a broken stream gets no answer, only a close: {answers:?}"
    );
    assert_eq!(
        f.table.len(),
        before,
        "nothing from a truncated frame is stored"
    );

    good_actor_still_works(&f, &mut good);
}

#[test]
fn only_stored_transitions_count_as_env_steps() {
    let f = fixture(Some("s3cret"));
    let mut c = WireClient::connect(f.addr);
    let w = c.join("s3cret");
    // A batch may pass the welcome's size by a step and an n-step flush per environment.
    let most = w.batch_rows as usize + 4 * (w.n_step as usize + 1);
    // 100,000 transitions pointing at one observation row: past the welcome's limit
    // (and past a shard). Refused, and not one of them counts as a step (a run's step
    // budget would end it).
    let mut b = batch(1, 4);
    for _ in 1..100_000 {
        b.obs_index.push(0);
        b.next_index.push(0);
        b.actions.push(0);
        b.rewards.push(0.0);
        b.discounts.push(0.99);
    }
    c.send(&ActorMsg::Transitions(b));
    let r = c.refused().unwrap();
    assert_eq!(r.code, RefusalCode::ProtocolViolation);
    assert!(
        r.message.contains("a batch of 100000 transitions")
            && r.message.contains(&format!("at most {most}")),
        "{r}"
    );
    assert_eq!((f.steps.get(), f.table.len()), (0, 0));
    // The largest batch the welcome allows is stored and counted.
    let mut c = WireClient::connect(f.addr);
    let _ = c.join("s3cret");
    c.send(&ActorMsg::Transitions(batch(most, 4)));
    wait_until("the batch is stored", LIMIT, || f.table.len() >= most);
    wait_until("its steps are counted", LIMIT, || {
        f.steps.get() == most as u64
    });
}

#[test]
fn batch_size_follows_the_actor_and_must_fit_replay() {
    // Replay: 10,000 transitions in 2 shards; batches of 64 are sized for 8 envs.
    let f = fixture(None);
    let welcome = |envs: u32| {
        let mut c = WireClient::connect(f.addr);
        match c.send_hello(&hello(PROTOCOL_VERSION, envs), "") {
            LearnerMsg::Welcome(w) => Ok(w.batch_rows),
            LearnerMsg::Refused(r) => Err(r),
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(welcome(4), Ok(64), "at least the configured batch");
    assert_eq!(welcome(32), Ok(256), "as many rows per env as 64 for 8");
    // 600 envs: 4,800 wanted, but two batches plus an n-step flush must fit a shard
    // of 5,000: 2,500 - 600 x 3.
    assert_eq!(welcome(600), Ok(700));
    let r = welcome(4096).unwrap_err();
    assert_eq!(r.code, RefusalCode::BatchTooLarge);
    assert!(r.message.contains("too large for replay's shards"), "{r}");
}

#[test]
fn a_stalled_actor_blocks_nobody_and_is_closed() {
    let f = fixture_with(|cfg| {
        cfg.write_timeout = Duration::from_millis(500);
        cfg.idle_timeout = Duration::from_secs(2);
    });
    // Connected and welcomed, then never reads a byte (nor sends one).
    let mut stalled = WireClient::connect(f.addr);
    let _ = stalled.join("");
    let mut good = WireClient::connect(f.addr);
    let _ = good.join("");
    // Publish large parameter snapshots, far more than the stalled socket can buffer.
    let big = 1 << 20;
    let start = std::time::Instant::now();
    for v in 1..=40u64 {
        f.params.publish(Params {
            version: v,
            env_steps: 0,
            updates: 0,
            population: 1,
            data: vec![v as f32; big],
        });
        // Keep the good actor's link busy so only the stalled one goes quiet.
        good.send(&ActorMsg::Heartbeat);
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "publishing never waits on actors"
    );
    let mut newest = 0;
    while newest < 40 {
        match good.recv() {
            Some(LearnerMsg::Params(p)) => newest = p.version,
            Some(LearnerMsg::Heartbeat) => {}
            other => panic!("unexpected {other:?}"),
        }
        good.send(&ActorMsg::Heartbeat);
    }
    good_actor_still_works(&f, &mut good);
    // The stalled actor is dropped (its writes time out, then its silence does); the
    // good one stays.
    wait_until("the stalled actor is closed", LIMIT, || {
        good.send(&ActorMsg::Heartbeat);
        connected(&f) == 1
    });
    good_actor_still_works(&f, &mut good);
}

#[test]
fn the_end_of_a_run_is_a_typed_goodbye() {
    for (finished, reason) in [
        (true, GoodbyeReason::RunFinished),
        (false, GoodbyeReason::LearnerStopping),
    ] {
        let mut f = fixture(None);
        let mut c = WireClient::connect(f.addr);
        let _ = c.join("");
        wait_until("joined", LIMIT, || connected(&f) == 1);
        f.server
            .take()
            .unwrap()
            .shutdown(goodbye_for(finished, "end of the test"))
            .unwrap();
        let g = c.goodbye().expect("a goodbye before the close");
        assert_eq!(g.reason, reason);
        assert_eq!(g.message, "end of the test");
    }
}

/// Regression: a population's two agents ended 130 ms apart; the first one's actors,
/// sent on to the other, reconnected after the run had finished and found nobody, and
/// retried for ever. Now an actor that comes back within the server's last call (2 s
/// after a connection last ended mid-run) is told the run is finished.
#[test]
fn an_actor_that_comes_back_just_after_the_run_finished_is_told_so() {
    // A last call shorter than the default 2 s, still longer than an actor's
    // shortest backoff (0.1–0.3 s) and the wait below.
    let mut f = fixture_with(|cfg| cfg.last_call = Duration::from_millis(800));
    let addr = f.addr;
    let mut c = WireClient::connect(addr);
    let _ = c.join("");
    wait_until("joined", LIMIT, || connected(&f) == 1);
    // It leaves mid-run (as a population's agent sends its actors on) ...
    drop(c);
    wait_until("left", LIMIT, || connected(&f) == 0);
    // ... and the run finishes while it is away.
    let server = f.server.take().unwrap();
    let stopping = std::thread::spawn(move || {
        let start = std::time::Instant::now();
        server
            .shutdown(goodbye_for(true, "all agents ended"))
            .unwrap();
        start.elapsed()
    });
    // It comes back after an actor's shortest backoff (0.1–0.3 s).
    std::thread::sleep(Duration::from_millis(300));
    let mut back = WireClient::connect(addr);
    match back.hello("") {
        LearnerMsg::Goodbye(g) => {
            assert_eq!(g.reason, GoodbyeReason::RunFinished);
            assert_eq!(g.message, "all agents ended");
        }
        other => panic!("expected the run's goodbye, got {other:?}"),
    }
    let took = stopping.join().unwrap();
    assert!(
        took < Duration::from_secs(2),
        "the last call ends: {took:?}"
    );

    // With nobody away when the run finishes, the server does not linger.
    let mut f = fixture(None);
    let mut c = WireClient::connect(f.addr);
    let _ = c.join("");
    wait_until("joined", LIMIT, || connected(&f) == 1);
    // The actor reads its goodbye and closes meanwhile, as actors do.
    let reader = std::thread::spawn(move || c.goodbye().map(|g| g.reason));
    let start = std::time::Instant::now();
    f.server
        .take()
        .unwrap()
        .shutdown(goodbye_for(true, "done"))
        .unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(reader.join().unwrap(), Some(GoodbyeReason::RunFinished));
}

/// Regression (a CI failure of remote_population): a population's first agent ended as
/// the run finished; its actor was told to come back for another agent, but its
/// connection was still closing when the run stopped, so the server did not count it
/// as away and closed the listener at once: the actor retried an address nobody
/// answered, for ever. Now a connection that sends its actor on marks it away when it
/// ends, whenever that is, and the last call waits for every connection to close
/// before reading how long to stay.
#[test]
fn an_actor_sent_on_as_the_run_finishes_is_told_the_run_is_over_when_it_comes_back() {
    let ports = Arc::new(AgentPorts::new(2, 2));
    let network = NetworkSpec::mlp(
        &millrace_actor::env::spec("CartPole-v1").unwrap().obs,
        &[8],
        2,
        1,
    )
    .unwrap();
    let opened = Arc::clone(&ports);
    let mut f = fixture_routed(
        |_| {},
        None,
        move |route| {
            opened.open(
                0,
                AgentSpec {
                    route,
                    network,
                    n_step: 1,
                    gamma: 0.99,
                    epsilon_decay: None,
                },
            );
            Routes::Agents(opened)
        },
    );
    let addr = f.addr;
    let mut c = WireClient::connect(addr);
    let _ = c.join("");
    wait_until("joined", LIMIT, || connected(&f) == 1);
    // Agent 0 ends (agent 1 is still to come): its actor is sent on ...
    assert!(!ports.close(0), "not the population's last agent");
    let g = c.goodbye().expect("a goodbye before the close");
    assert_eq!(g.reason, GoodbyeReason::LearnerStopping);
    // ... and the run finishes while its connection is still closing: the actor has
    // not closed its end yet, so the server waits for it (up to its goodbye wait).
    let server = f.server.take().unwrap();
    let stopping = std::thread::spawn(move || {
        server
            .shutdown(goodbye_for(true, "all agents ended"))
            .unwrap();
    });
    // The server gives up waiting and drops the connection: writing finds it gone.
    wait_until("the server closed the old connection", LIMIT, || {
        c.try_send(&ActorMsg::Stats(ActorStats::default())).is_err()
    });
    drop(c);
    // The actor comes back (after its backoff, which is not what this is about) and
    // hears that the run is over.
    let mut back = WireClient::connect(addr);
    match back.hello("") {
        LearnerMsg::Goodbye(g) => {
            assert_eq!(g.reason, GoodbyeReason::RunFinished);
            assert_eq!(g.message, "all agents ended");
        }
        other => panic!("expected the run's goodbye, got {other:?}"),
    }
    stopping.join().unwrap();
}

#[test]
fn prioritized_replay_asks_actors_for_priorities_and_screens_them() {
    let with_priorities = || {
        let mut h = hello(millrace_proto::wire::PROTOCOL_VERSION, 4);
        if let ActorMsg::Hello(h) = &mut h {
            h.capabilities.features = vec![millrace_proto::wire::FEATURE_PRIORITIES.into()];
        }
        h
    };
    // Uniform replay: the feature is not taken up.
    let uniform = fixture(None);
    let mut c = WireClient::connect(uniform.addr);
    let LearnerMsg::Welcome(w) = c.send_hello(&with_priorities(), "") else {
        panic!("a welcome");
    };
    assert!(w.features.is_empty(), "{:?}", w.features);

    let f = fixture_of(
        |_| {},
        Some(millrace_replay::PriorityConfig {
            alpha: 0.6,
            beta: 0.4,
        }),
    );
    let mut c = WireClient::connect(f.addr);
    let LearnerMsg::Welcome(w) = c.send_hello(&with_priorities(), "") else {
        panic!("a welcome");
    };
    assert_eq!(w.features, [millrace_proto::wire::FEATURE_PRIORITIES]);
    // An actor's batch with a NaN and a negative priority: stored, those two counted
    // and replaced.
    let mut b = batch(16, 4);
    b.priorities = (0..16).map(|i| i as f32 * 0.5).collect();
    b.priorities[3] = f32::NAN;
    b.priorities[7] = -2.0;
    c.send(&ActorMsg::Transitions(b));
    wait_until("the batch is stored", LIMIT, || f.table.len() >= 16);
    let stats = f.table.stats();
    assert_eq!(stats.invalid_priorities, 2);
    assert_eq!(stats.max_priority, 7.5);
    let mut stored = Vec::new();
    f.table.snapshot(|_, b| stored.extend(b.priorities));
    assert_eq!(stored.len(), 16);
    assert!(
        stored.iter().all(|p| p.is_finite() && *p >= 0.0),
        "{stored:?}"
    );
    // A peer's 3.4e38 is stored at the bound (ten times the learner's largest, 1 before
    // any update) and counted: replay's running maximum, which every new item gets, and
    // so everyone else's importance weights stay as they were.
    let mut b = batch(16, 4);
    b.seq = 1;
    b.priorities = vec![0.5; 16];
    b.priorities[5] = 3.4e38;
    c.send(&ActorMsg::Transitions(b));
    wait_until("the second batch is stored", LIMIT, || f.table.len() >= 32);
    let stats = f.table.stats();
    assert_eq!(stats.clamped_priorities, 1);
    assert_eq!(stats.max_priority, millrace_replay::ACTOR_PRIORITY_HEADROOM);
}

#[test]
fn a_peers_name_and_goodbye_are_bounded_and_escaped_before_they_are_used() {
    use millrace_proto::peer_text::MAX_NAME_CHARS;
    let f = fixture(None);
    let mut c = WireClient::connect(f.addr);
    let ActorMsg::Hello(mut h) = hello(PROTOCOL_VERSION, 4) else {
        unreachable!("hello() makes a Hello")
    };
    // A forged log line and 60 KB that would become a label value on /metrics.
    h.actor_name = format!(
        "evil\n2026-12-03T00:00:00Z ERROR forged{}",
        "x".repeat(60_000)
    );
    match c.send_hello(&ActorMsg::Hello(h), "") {
        LearnerMsg::Welcome(_) => {}
        other => panic!("expected a welcome, got {other:?}"),
    }
    wait_until("the actor is on the board", LIMIT, || connected(&f) == 1);
    let (_, entry) = f.board.entries().into_iter().next().unwrap();
    assert!(
        entry.name.chars().count() <= MAX_NAME_CHARS + 1,
        "{} characters",
        entry.name.chars().count()
    );
    assert!(entry.name.starts_with("evil\\n2026"), "{}", entry.name);
    assert!(!entry.name.chars().any(char::is_control), "{}", entry.name);
    // A huge goodbye with a forged line ends that session alone.
    c.send(&ActorMsg::Goodbye(millrace_proto::wire::Goodbye {
        reason: GoodbyeReason::ActorStopping,
        message: format!("bye\n{}", "y".repeat(1 << 20)),
    }));
    wait_until("it left the board", LIMIT, || connected(&f) == 0);
    let mut good = WireClient::connect(f.addr);
    good.join("");
    good_actor_still_works(&f, &mut good);
}

#[test]
fn sockets_that_never_authenticate_take_no_session_place_and_are_bounded() {
    let f = fixture_with(|cfg| {
        cfg.token = Some("s3cret".into());
        cfg.max_connections = 2;
        cfg.max_handshakes = 8;
        // One address here: let the global bound, not the per-source one, turn the
        // ninth away.
        cfg.source_limits.in_flight = 64;
        cfg.handshake_timeout = Duration::from_millis(500);
    });
    // Silent sockets (in their handshake) take no session place: with four held, two
    // honest actors take both (the silent ones used to take them first).
    let mut silent: Vec<WireClient> = (0..4).map(|_| WireClient::connect(f.addr)).collect();
    std::thread::sleep(Duration::from_millis(100));
    let mut admitted: Vec<WireClient> = (0..2).map(|_| WireClient::connect(f.addr)).collect();
    for c in &mut admitted {
        let _ = c.join("s3cret");
    }
    // Four more fill the handshake places; a ninth is closed at once, without a word
    // before it has proved anything.
    silent.extend((0..4).map(|_| WireClient::connect(f.addr)));
    std::thread::sleep(Duration::from_millis(100));
    let mut ninth = WireClient::connect(f.addr);
    assert!(ninth.expect_closed().is_empty(), "nothing said to it");
    drop(silent);
    good_actor_still_works(&f, &mut admitted[0]);
}

#[test]
fn wrong_tokens_from_one_address_are_answered_ever_more_slowly() {
    let f = fixture(Some("s3cret"));
    let start = std::time::Instant::now();
    for _ in 0..8 {
        let mut c = WireClient::connect(f.addr);
        match c.hello("guess") {
            LearnerMsg::Refused(r) => assert_eq!(r.code, RefusalCode::WrongToken, "{r}"),
            other => panic!("a typed refusal, not {other:?}"),
        }
    }
    // 50 ms, 100 ms, ... 400 ms: 1.8 s for eight guesses (they came back in well under
    // a millisecond each).
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(1500),
        "eight guesses in {took:?}"
    );
    // The right token is still welcome at once.
    let mut c = WireClient::connect(f.addr);
    let _ = c.join("s3cret");
}

#[test]
fn a_frame_trickled_below_the_minimum_rate_is_cut_off_and_its_budget_freed() {
    let f = fixture_with(|cfg| {
        cfg.frame_grace = Duration::from_millis(200);
        cfg.min_frame_rate = 100_000;
    });
    let mut c = WireClient::connect(f.addr);
    let _ = c.join("");
    // A frame that claims 200 KB (2.2 s at the minimum rate), then a byte every 20 ms:
    // never idle, never done.
    let start = std::time::Instant::now();
    c.send_bytes(&200_000u32.to_le_bytes());
    let mut refused = None;
    while start.elapsed() < LIMIT {
        if c.stream.write_all(&[0]).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        c.stream.set_nonblocking(true).unwrap();
        let mut peek = [0u8; 1];
        let answered = c.stream.peek(&mut peek).is_ok_and(|n| n > 0);
        c.stream.set_nonblocking(false).unwrap();
        if answered {
            refused = c.refused();
            break;
        }
    }
    let r = refused.expect("a typed refusal");
    assert_eq!(r.code, RefusalCode::Timeout, "{r}");
    assert!(r.message.contains("minimum rate"), "{r}");
    let took = start.elapsed();
    assert!(took < Duration::from_secs(5), "cut off after {took:?}");
    // Its budget went back: an honest actor's batch is stored.
    let mut good = WireClient::connect(f.addr);
    good.join("");
    good_actor_still_works(&f, &mut good);
}

#[test]
fn peers_trickling_large_frames_cannot_hold_the_budget_from_an_honest_actor() {
    // Four authenticated peers each claim a 1 MiB frame of a 4 MiB budget and trickle
    // it: at the minimum rate each may take 9 s. With the budget spent, an honest
    // actor's small batch waits; the four are over their fair share (4 MiB over five
    // contenders) and must finish within 0.5 s + 1 MiB / 8 MiB/s, or go.
    let f = fixture_with(|cfg| {
        cfg.max_inflight_bytes = 4 << 20;
        cfg.contended_grace = Duration::from_millis(500);
    });
    // Each trickler's answers are read on a thread of its own, so that it stops
    // writing as soon as it is refused.
    let tricklers: Vec<_> = (0..4)
        .map(|_| {
            let mut c = WireClient::connect(f.addr);
            let _ = c.join("");
            c.send_bytes(&(1u32 << 20).to_le_bytes());
            c.send_bytes(&[0; 64]);
            let writer = c.stream.try_clone().unwrap();
            let answered = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let flag = Arc::clone(&answered);
            let reader = std::thread::spawn(move || loop {
                match c.recv() {
                    Some(LearnerMsg::Refused(r)) => {
                        flag.store(true, std::sync::atomic::Ordering::SeqCst);
                        break Some(r);
                    }
                    Some(_) => continue,
                    None => {
                        flag.store(true, std::sync::atomic::Ordering::SeqCst);
                        break None;
                    }
                }
            });
            (writer, answered, reader)
        })
        .collect();
    let mut honest = WireClient::connect(f.addr);
    let _ = honest.join("");
    let before = f.table.len();
    let start = std::time::Instant::now();
    honest.send(&ActorMsg::Transitions(batch(16, 4)));
    // A byte from each trickler every 20 ms (never idle) until the batch is stored.
    while f.table.len() < before + 16 && start.elapsed() < LIMIT {
        for (writer, answered, _) in &tricklers {
            if !answered.load(std::sync::atomic::Ordering::SeqCst) {
                let mut w: &std::net::TcpStream = writer;
                let _ = w.write_all(&[0]);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = start.elapsed();
    eprintln!("the honest batch was stored {took:?} after it was sent");
    assert!(
        f.table.len() >= before + 16,
        "the honest batch was never stored"
    );
    assert!(
        took < Duration::from_secs(4),
        "the honest batch waited {took:?} behind the tricklers (9 s without fair shares)"
    );
    for (_, _, reader) in tricklers {
        let r = reader.join().unwrap().expect("a typed refusal");
        assert_eq!(r.code, RefusalCode::Timeout, "{r}");
        assert!(r.message.contains("fair share"), "{r}");
    }
    good_actor_still_works(&f, &mut honest);
}

#[test]
fn the_token_never_crosses_the_wire_and_a_recorded_exchange_does_not_replay() {
    let token = "s3cret-token-0123456789";
    let f = fixture(Some(token));
    // What an honest actor sends: its Hello and its proof, recorded.
    let first = hello(PROTOCOL_VERSION, 4);
    let ActorMsg::Hello(h) = &first else {
        unreachable!()
    };
    let mut c = WireClient::connect(f.addr);
    c.send(&first);
    let Some(LearnerMsg::Challenge(challenge)) = c.recv() else {
        panic!("a challenge");
    };
    let proof = ActorMsg::Proof(
        millrace_proto::auth::actor_proof(token.as_bytes(), h, &challenge).unwrap(),
    );
    let mut sent = codec::encode(&first, DEFAULT_MAX_FRAME).unwrap();
    sent.extend(codec::encode(&proof, DEFAULT_MAX_FRAME).unwrap());
    assert!(
        !sent.windows(token.len()).any(|w| w == token.as_bytes()),
        "the token is on the wire"
    );
    c.send(&proof);
    // The welcome comes sealed (the client checks the seal with the same token).
    let mut seal =
        millrace_proto::auth::Seal::for_session(token.as_bytes(), h, &challenge).unwrap();
    match c.recv() {
        Some(LearnerMsg::Sealed(s)) => {
            assert!(matches!(seal.open(&s), Ok(LearnerMsg::Welcome(_))));
        }
        other => panic!("a sealed welcome, not {other:?}"),
    }
    // The recorded bytes replayed on a new connection: the learner's challenge is new,
    // so the old proof is a wrong one.
    let mut replay = WireClient::connect(f.addr);
    replay.send_bytes(&sent[..codec::encode(&first, DEFAULT_MAX_FRAME).unwrap().len()]);
    let Some(LearnerMsg::Challenge(again)) = replay.recv() else {
        panic!("a challenge");
    };
    assert_ne!(again, challenge, "a fresh challenge per connection");
    replay.send(&proof);
    let r = replay.refused().expect("a typed refusal");
    assert_eq!(r.code, RefusalCode::WrongToken, "{r}");
}

#[test]
fn an_actor_of_the_previous_protocol_is_told_its_version_is_not_spoken() {
    // Version 6 carried the token in the clear where 7 carries a nonce: the fixed
    // preamble (variant, version) still says which version it is.
    #[derive(serde::Serialize)]
    struct HelloV6 {
        protocol_version: u32,
        token: String,
        actor_name: String,
    }
    #[derive(serde::Serialize)]
    enum ActorMsgV6 {
        Hello(HelloV6),
    }
    let f = fixture(Some("s3cret"));
    let mut c = WireClient::connect(f.addr);
    let old = ActorMsgV6::Hello(HelloV6 {
        protocol_version: 6,
        token: "s3cret".into(),
        actor_name: "old".into(),
    });
    c.send_bytes(&codec::encode(&old, DEFAULT_MAX_FRAME).unwrap());
    let r = c.refused().expect("a typed refusal");
    assert_eq!(r.code, RefusalCode::ProtocolVersion, "{r}");
    assert!(r.message.contains("protocol version 6"), "{r}");
}

#[test]
fn returns_the_environment_cannot_give_are_not_counted() {
    let f = fixture(None);
    let mut c = WireClient::connect(f.addr);
    let _ = c.join("");
    // CartPole-v1 returns 0..=500: 1e9, -5 and NaN cannot be; 200 and 500 can.
    c.send(&ActorMsg::Stats(ActorStats {
        env_steps: 0,
        episodes: 5,
        episode_returns: vec![1e9, 200.0, -5.0, f32::NAN, 500.0],
        params_version: 0,
    }));
    let got: Vec<f32> = (0..2)
        .map(|_| f.episodes.recv_timeout(LIMIT).unwrap().episode_return)
        .collect();
    assert_eq!(got, [200.0, 500.0]);
    assert!(
        f.episodes.recv_timeout(Duration::from_millis(300)).is_err(),
        "nothing else is counted"
    );
    good_actor_still_works(&f, &mut c);
}

#[test]
fn a_socket_that_sends_no_hello_gives_its_handshake_place_back_soon() {
    let f = fixture_with(|cfg| {
        cfg.handshake_timeout = Duration::from_secs(5);
        cfg.hello_timeout = Duration::from_millis(300);
    });
    let start = std::time::Instant::now();
    let mut quiet = WireClient::connect(f.addr);
    let r = quiet.refused().expect("a typed refusal");
    assert_eq!(r.code, RefusalCode::Timeout, "{r}");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "held {:?}",
        start.elapsed()
    );
    // An actor that sends its Hello at once has the whole handshake.
    let mut c = WireClient::connect(f.addr);
    let _ = c.join("");
    good_actor_still_works(&f, &mut c);
}

#[test]
fn honest_actors_join_under_a_trickle_of_silent_sockets_from_another_source() {
    // Regression (issue "One bad transition…", part 3): 64 silent sockets reconnecting
    // at a few per second held every handshake place, and 0 of 28 honest joins
    // succeeded while they lasted. Now one source holds at most its own places.
    let f = fixture_with(|cfg| {
        cfg.token = Some("s3cret".into());
        cfg.hello_timeout = Duration::from_secs(2);
    });
    let attacker: std::net::IpAddr = "127.0.0.2".parse().unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let opened = Arc::new(std::sync::atomic::AtomicU64::new(0));
    // 64 silent sockets, each reopened as soon as the server closes it (its hello
    // timeout, or at accept).
    let trickle: Vec<_> = (0..64)
        .map(|_| {
            let (stop, opened, addr) = (Arc::clone(&stop), Arc::clone(&opened), f.addr);
            std::thread::spawn(move || {
                use std::io::Read;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let Ok(mut s) = millrace_tests::connect_from(addr, attacker) else {
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    };
                    opened.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
                    let mut buf = [0u8; 64];
                    // Until closed: a read of 0 bytes or a reset.
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        match s.read(&mut buf) {
                            Ok(0) => break,
                            Err(e)
                                if e.kind() == std::io::ErrorKind::WouldBlock
                                    || e.kind() == std::io::ErrorKind::TimedOut => {}
                            _ => break,
                        }
                    }
                    // Reconnecting, as a client that retries does (not a busy loop).
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        })
        .collect();
    wait_until("the trickle is under way", LIMIT, || {
        opened.load(std::sync::atomic::Ordering::Relaxed) >= 64
    });
    let mut joined = 0;
    for _ in 0..28 {
        let mut c = WireClient::connect(f.addr);
        if let LearnerMsg::Welcome(_) = c.hello("s3cret") {
            joined += 1;
        }
    }
    let under_way = opened.load(std::sync::atomic::Ordering::Relaxed);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in trickle {
        t.join().unwrap();
    }
    assert_eq!(
        joined, 28,
        "honest joins while {under_way} silent sockets came and went"
    );
}
