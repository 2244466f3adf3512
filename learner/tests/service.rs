//! The learner's server over loopback, driven by hand-written clients: the handshake,
//! transitions into replay, parameters out, and every kind of bad input closing that
//! connection alone with a clear reason while a good actor carries on.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use millrace_actor::ParamsSlot;
use millrace_actor::{ActorControl, EpisodeStats};
use millrace_learner::server::{self, ServerConfig, ServerContext, ServerHandle};
use millrace_proto::codec::{self, DEFAULT_MAX_FRAME};
use millrace_proto::wire::{
    ActorMsg, ActorStats, Capabilities, Hello, LearnerMsg, PROTOCOL_VERSION,
};
use millrace_proto::{NetworkSpec, Params, TransitionBatch};
use millrace_replay::{RateLimiterConfig, ReplayConfig, Table};

struct Fixture {
    server: Option<ServerHandle>,
    addr: SocketAddr,
    table: Arc<Table>,
    params: Arc<ParamsSlot>,
    episodes: crossbeam_channel::Receiver<EpisodeStats>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.table.close();
        if let Some(s) = self.server.take() {
            s.shutdown();
        }
    }
}

fn fixture(token: Option<&str>) -> Fixture {
    let env = millrace_actor::env::spec("CartPole-v1").unwrap();
    let network = NetworkSpec::mlp(&env.obs, &[8], 2, 1).unwrap();
    let table = Arc::new(Table::new(&ReplayConfig {
        capacity: 10_000,
        shards: 2,
        obs_row_bytes: env.obs.row_bytes(),
        obs_rows_per_item: 2.0,
        limiter: RateLimiterConfig::sample_to_insert_ratio(1.0, 1, 1e9, 1).unwrap(),
    }));
    let params = Arc::new(ParamsSlot::new(Params {
        version: 0,
        env_steps: 0,
        population: 1,
        data: vec![0.0; network.layout().len],
    }));
    let (tx, episodes) = crossbeam_channel::bounded(1024);
    let mut cfg = ServerConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.token = token.map(String::from);
    cfg.handshake_timeout = Duration::from_secs(2);
    let server = server::spawn(
        cfg,
        ServerContext {
            env,
            network,
            run_id: "test".into(),
            table: Arc::clone(&table),
            params: Arc::clone(&params),
            episodes: tx,
            control: Arc::new(ActorControl::default()),
            board: Arc::default(),
        },
    )
    .unwrap();
    Fixture {
        addr: server.addr,
        server: Some(server),
        table,
        params,
        episodes,
    }
}

struct Client(TcpStream);

impl Client {
    fn connect(addr: SocketAddr) -> Self {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        Client(s)
    }

    fn send(&mut self, msg: &ActorMsg) {
        self.0
            .write_all(&codec::encode(msg, DEFAULT_MAX_FRAME).unwrap())
            .unwrap();
    }

    /// The next message, or `None` once the server has closed the connection.
    fn recv(&mut self) -> Option<LearnerMsg> {
        let mut header = [0u8; 4];
        self.0.read_exact(&mut header).ok()?;
        let len = codec::payload_len(header, DEFAULT_MAX_FRAME).unwrap();
        let mut payload = vec![0u8; len];
        self.0.read_exact(&mut payload).ok()?;
        Some(codec::decode(&payload).unwrap())
    }

    /// Reads until an `Error` arrives or the connection closes; returns the reason.
    fn refused(&mut self) -> Option<String> {
        loop {
            match self.recv() {
                Some(LearnerMsg::Error { reason }) => {
                    assert!(self.recv().is_none(), "closed after the error");
                    return Some(reason);
                }
                Some(_) => continue,
                None => return None,
            }
        }
    }

    fn hello(&mut self, token: &str) -> LearnerMsg {
        self.send(&hello(token, PROTOCOL_VERSION));
        self.recv().expect("an answer to Hello")
    }
}

fn hello(token: &str, version: u32) -> ActorMsg {
    hello_with_envs(token, version, 4)
}

fn hello_with_envs(token: &str, version: u32, envs: u32) -> ActorMsg {
    ActorMsg::Hello(Hello {
        protocol_version: version,
        token: token.into(),
        actor_name: "test".into(),
        capabilities: Capabilities {
            envs,
            env_ids: vec!["CartPole-v1".into()],
        },
    })
}

fn batch(rows: usize, obs_floats: usize) -> ActorMsg {
    let mut b = TransitionBatch::with_capacity(obs_floats * 4, rows, 2 * rows);
    for i in 0..rows {
        let obs = vec![i as f32; obs_floats];
        b.push_f32(&obs, (i % 2) as i64, 1.0, 0.99, &obs);
    }
    ActorMsg::Transitions(b)
}

fn wait_for(mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < Duration::from_secs(5), "timed out");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn an_actor_joins_streams_transitions_and_receives_parameters() {
    let f = fixture(None);
    let mut c = Client::connect(f.addr);
    let LearnerMsg::Welcome(w) = c.hello("") else {
        panic!("no welcome")
    };
    assert_eq!(w.env.id, "CartPole-v1");
    assert_eq!(w.slots, [0, 1, 2, 3]);
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

    c.send(&batch(32, 4));
    c.send(&ActorMsg::Stats(ActorStats {
        env_steps: 32,
        episodes: 2,
        episode_returns: vec![10.0, 20.0],
        params_version: 0,
    }));
    wait_for(|| f.table.len() == 32);
    let got: Vec<f32> = (0..2)
        .map(|_| {
            f.episodes
                .recv_timeout(Duration::from_secs(5))
                .unwrap()
                .episode_return
        })
        .collect();
    assert_eq!(got, [10.0, 20.0]);

    // Latest-only: of many quick versions the actor ends up with the newest.
    for v in 1..=50 {
        f.params.publish(Params {
            version: v,
            env_steps: 0,
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
    // A second actor gets the next slots; when the first leaves and comes back it gets
    // its old slots (and their ε) again.
    let mut d = Client::connect(f.addr);
    let LearnerMsg::Welcome(w2) = d.hello("") else {
        panic!("no welcome")
    };
    assert_eq!(w2.slots, [4, 5, 6, 7]);
    drop(c);
    std::thread::sleep(Duration::from_millis(200));
    let mut e = Client::connect(f.addr);
    let LearnerMsg::Welcome(w3) = e.hello("") else {
        panic!("no welcome")
    };
    assert_eq!(w3.slots, [0, 1, 2, 3]);
}

/// A good actor that keeps streaming while bad ones come and go.
fn good_actor_still_works(f: &Fixture, c: &mut Client) {
    let before = f.table.len();
    c.send(&batch(16, 4));
    wait_for(|| f.table.len() >= before + 16);
}

#[test]
fn bad_input_closes_that_connection_alone_with_a_reason() {
    let f = fixture(Some("s3cret"));
    let mut good = Client::connect(f.addr);
    assert!(matches!(good.hello("s3cret"), LearnerMsg::Welcome(_)));

    // Wrong token, wrong protocol version, not a Hello first.
    let mut c = Client::connect(f.addr);
    c.send(&hello("guess", PROTOCOL_VERSION));
    assert_eq!(c.refused().as_deref(), Some("wrong token"));
    let mut c = Client::connect(f.addr);
    c.send(&hello("s3cret", PROTOCOL_VERSION + 1));
    let unsupported = format!("protocol version {} is not supported", PROTOCOL_VERSION + 1);
    assert!(c.refused().unwrap().contains(&unsupported));
    let mut c = Client::connect(f.addr);
    c.send(&ActorMsg::Heartbeat);
    assert!(c.refused().unwrap().contains("expected Hello first"));
    good_actor_still_works(&f, &mut good);

    // Garbage bytes, and a length prefix beyond the limit (nothing is allocated for it).
    let mut c = Client::connect(f.addr);
    c.0.write_all(&[0xde, 0xad, 0xbe, 0xef, 0, 1, 2, 3])
        .unwrap();
    assert!(c.refused().unwrap().contains("bad handshake"));
    let mut c = Client::connect(f.addr);
    c.0.write_all(&u32::MAX.to_le_bytes()).unwrap();
    assert!(c.refused().unwrap().contains("exceeds the limit"));
    good_actor_still_works(&f, &mut good);

    // After the handshake: observations of the wrong shape, an action out of range, an
    // oversized frame, a truncated frame.
    let mut c = Client::connect(f.addr);
    assert!(matches!(c.hello("s3cret"), LearnerMsg::Welcome(_)));
    c.send(&batch(8, 3));
    let reason = c.refused().unwrap();
    assert!(
        reason.contains("does not match CartPole-v1") && reason.contains("obs row bytes"),
        "{reason}"
    );
    let mut c = Client::connect(f.addr);
    assert!(matches!(c.hello("s3cret"), LearnerMsg::Welcome(_)));
    let ActorMsg::Transitions(mut b) = batch(4, 4) else {
        unreachable!()
    };
    b.actions[2] = 7;
    c.send(&ActorMsg::Transitions(b));
    assert!(c.refused().unwrap().contains("action 7 outside 0..2"));
    // Far more observation rows than transitions: it would flush replay past the rate
    // limiter, which counts transitions.
    let mut c = Client::connect(f.addr);
    assert!(matches!(c.hello("s3cret"), LearnerMsg::Welcome(_)));
    let ActorMsg::Transitions(mut b) = batch(1, 4) else {
        unreachable!()
    };
    for _ in 0..100 {
        b.push_obs_f32(&[0.0; 4]);
    }
    c.send(&ActorMsg::Transitions(b));
    let reason = c.refused().unwrap();
    assert!(
        reason.contains("102 observation rows for 1 transitions"),
        "{reason}"
    );
    let mut c = Client::connect(f.addr);
    assert!(matches!(c.hello("s3cret"), LearnerMsg::Welcome(_)));
    c.0.write_all(&((DEFAULT_MAX_FRAME + 1) as u32).to_le_bytes())
        .unwrap();
    assert!(c.refused().unwrap().contains("exceeds the limit"));
    let mut c = Client::connect(f.addr);
    assert!(matches!(c.hello("s3cret"), LearnerMsg::Welcome(_)));
    let frame = codec::encode(&batch(8, 4), DEFAULT_MAX_FRAME).unwrap();
    c.0.write_all(&frame[..frame.len() / 2]).unwrap();
    c.0.shutdown(std::net::Shutdown::Write).unwrap();
    let before = f.table.len();
    assert!(c.refused().unwrap().contains("closed mid-frame"));
    assert_eq!(
        f.table.len(),
        before,
        "nothing from a truncated frame is stored"
    );

    good_actor_still_works(&f, &mut good);
}

#[test]
fn batch_size_follows_the_actor_and_must_fit_replay() {
    // Replay: 10,000 transitions in 2 shards; batches of 64 are sized for 8 envs.
    let f = fixture(None);
    let welcome = |envs: u32| {
        let mut c = Client::connect(f.addr);
        c.send(&hello_with_envs("", PROTOCOL_VERSION, envs));
        match c.recv().expect("an answer") {
            LearnerMsg::Welcome(w) => Ok(w.batch_rows),
            LearnerMsg::Error { reason } => Err(reason),
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(welcome(4), Ok(64), "at least the configured batch");
    assert_eq!(welcome(32), Ok(256), "as many rows per env as 64 for 8");
    // 600 envs: 4,800 wanted, but two batches plus an n-step flush must fit a shard
    // of 5,000: 2,500 - 600 x 3.
    assert_eq!(welcome(600), Ok(700));
    let reason = welcome(4096).unwrap_err();
    assert!(reason.contains("too large for replay's shards"), "{reason}");
}

#[test]
fn a_stalled_actor_blocks_nobody() {
    let f = fixture(None);
    // Connected and welcomed, then never reads a byte.
    let mut stalled = Client::connect(f.addr);
    assert!(matches!(stalled.hello(""), LearnerMsg::Welcome(_)));
    let mut good = Client::connect(f.addr);
    assert!(matches!(good.hello(""), LearnerMsg::Welcome(_)));
    // Publish large parameter snapshots, far more than the stalled socket can buffer.
    let big = 1 << 20;
    let start = Instant::now();
    for v in 1..=40u64 {
        f.params.publish(Params {
            version: v,
            env_steps: 0,
            population: 1,
            data: vec![v as f32; big],
        });
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
    }
    good_actor_still_works(&f, &mut good);
}
