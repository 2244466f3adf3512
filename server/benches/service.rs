//! The service's data paths, measured side by side in one run:
//! (1) transitions/s and bytes/s from actors into replay over loopback TCP (the real
//!     server, N client connections sending encoded batches as fast as replay takes
//!     them) against the in-process path (N threads inserting the same batches), each
//!     measured once replay has wrapped (its pages touched: the steady state);
//! (2) parameter broadcast latency: publish a Nature-DQN-sized snapshot (~1.69M floats,
//!     6.7 MB) and time until every one of 64 connected actors has received it.
//!
//! With `--atari`, transitions carry Atari observations (`[4, 84, 84]` u8, 28,224 bytes
//! a row) instead of CartPole's 16 bytes: pixel columns travel as raw bytes.
//!
//! `cargo bench -p millrace-server --bench service -- [--seconds 3] [--connections 4]
//!  [--rows 64] [--actors 64] [--repeats 5] [--atari]`

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use millrace_proto::codec::{self, Framer, DEFAULT_MAX_FRAME};
use millrace_proto::wire::{ActorMsg, LearnerMsg, PROTOCOL_VERSION};
use millrace_proto::wire::{Capabilities, Hello};
use millrace_proto::{
    DType, EnvSpec, NetworkSpec, ObsSpec, Params, ParamsCell, StepCounter, TransitionBatch,
};
use millrace_replay::{RateLimiterConfig, ReplayConfig, Table};
use millrace_server::{self as server, goodbye_for, Route, Routes, ServerConfig, ServerContext};

/// Nature-DQN parameter count: conv 8x8x4→32, 4x4x32→64, 3x3x64→64, fc 3136→512→18.
const NATURE_DQN_PARAMS: usize = (8 * 8 * 4 * 32 + 32)
    + (4 * 4 * 32 * 64 + 64)
    + (3 * 3 * 64 * 64 + 64)
    + (3136 * 512 + 512)
    + (512 * 18 + 18);

fn arg(name: &str, default: f64) -> f64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().expect("a number"))
        .unwrap_or(default)
}

/// Observations the transitions carry: CartPole's four floats, or Atari's stacked
/// frames.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Shape {
    CartPole,
    Atari,
}

impl Shape {
    fn env(self) -> EnvSpec {
        match self {
            Shape::CartPole => millrace_actor::env::spec("CartPole-v1").unwrap(),
            Shape::Atari => EnvSpec {
                id: "PongNoFrameskip-v4".into(),
                obs: ObsSpec {
                    shape: vec![4, 84, 84],
                    dtype: DType::U8,
                },
                num_actions: 6,
                max_episode_steps: 27_000,
                reward_threshold: None,
                reward_range: None,
                frame_stack: 1,
            },
        }
    }

    fn row_bytes(self) -> usize {
        self.env().obs.row_bytes()
    }

    /// Replay capacity in transitions: Atari rows are large, keep the table under 1 GB
    /// (it is filled once before measuring).
    fn capacity(self) -> usize {
        match self {
            Shape::CartPole => 1 << 20,
            Shape::Atari => 1 << 14,
        }
    }
}

fn table(shape: Shape) -> Arc<Table> {
    Arc::new(
        Table::new(&ReplayConfig {
            capacity: shape.capacity(),
            shards: 4,
            obs_row_bytes: shape.row_bytes(),
            // Whole observations, also for the Atari shape: synthetic rows are not
            // frame streams, so this is the heavier layout (real Atari actors send each
            // frame once).
            stack: 1,
            obs_rows_per_item: 2.0,
            // No rate limiting: measure the transport, not the replay ratio.
            limiter: RateLimiterConfig::sample_to_insert_ratio(1e-9, 1, 1e18, 1).unwrap(),
            priority: None,
        })
        .unwrap(),
    )
}

/// A batch shaped like an actor's: one environment's consecutive 3-step transitions,
/// sharing observation rows.
fn batch(shape: Shape, rows: usize) -> TransitionBatch {
    let row_bytes = shape.row_bytes();
    let mut b = TransitionBatch::with_capacity(row_bytes, rows, rows + 3);
    for i in 0..rows + 3 {
        match shape {
            Shape::CartPole => {
                let x = i as f32 * 0.01;
                b.push_obs_f32(&[x, -x, 0.5 * x, 0.1]);
            }
            Shape::Atari => {
                let row: Vec<u8> = (0..row_bytes).map(|p| (p * 7 + i) as u8).collect();
                b.push_obs_bytes(&row);
            }
        }
    }
    for i in 0..rows as u32 {
        b.push_transition(i, i64::from(i % 2), 1.0, 0.970299, i + 3);
    }
    b
}

fn server(shape: Shape, table: Arc<Table>, params: Arc<ParamsCell>) -> server::ServerHandle {
    let env = shape.env();
    let network = match shape {
        Shape::CartPole => NetworkSpec::mlp(&env.obs, &[64, 64], 2, 1).unwrap(),
        Shape::Atari => NetworkSpec::nature_cnn(&env.obs, env.num_actions).unwrap(),
    };
    let (tx, _rx) = crossbeam_channel::bounded(1);
    let mut cfg = ServerConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.idle_timeout = Duration::from_secs(600);
    server::spawn(
        cfg,
        ServerContext {
            env_config: millrace_proto::EnvConfig::new(env.id.clone()),
            clip_rewards: false,
            env,
            network,
            run_id: "bench".into(),
            routes: Routes::One(Route {
                table,
                params,
                steps: Arc::new(StepCounter::default()),
            }),
            episodes: tx,
            board: Arc::default(),
        },
    )
    .unwrap()
}

fn connect(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let hello = Hello {
        protocol_version: PROTOCOL_VERSION,
        nonce: millrace_proto::auth::fresh_nonce(),
        actor_name: "bench".into(),
        capabilities: Capabilities {
            envs: 1,
            env_ids: vec!["CartPole-v1".into(), millrace_proto::env::ANY_ATARI.into()],
            features: Vec::new(),
        },
        agent: None,
    };
    s.write_all(&codec::encode(&ActorMsg::Hello(hello.clone()), DEFAULT_MAX_FRAME).unwrap())
        .unwrap();
    // The challenge, answered for the empty token (the bench's learner has none); the
    // framer reads exactly one frame, leaving the rest to the caller's.
    let mut framer = Framer::new(DEFAULT_MAX_FRAME);
    let Some(LearnerMsg::Challenge(challenge)) = recv(&mut s, &mut framer) else {
        panic!("a challenge");
    };
    let proof = millrace_proto::auth::actor_proof(b"", &hello, &challenge).unwrap();
    s.write_all(&codec::encode(&ActorMsg::Proof(proof), DEFAULT_MAX_FRAME).unwrap())
        .unwrap();
    s
}

fn recv(s: &mut TcpStream, framer: &mut Framer) -> Option<LearnerMsg> {
    codec::read_msg(s, framer).ok().flatten()
}

/// Waits until replay has wrapped once: every page of its storage touched, so the
/// measurement is the steady state, not the kernel zeroing fresh pages.
fn warmed(t: &Table, shape: Shape) {
    let start = Instant::now();
    while t.stats().inserted < shape.capacity() as u64 {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "replay did not fill"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn throughput(shape: Shape, seconds: f64, connections: usize, rows: usize) {
    let b = batch(shape, rows);
    let frame = codec::encode(&ActorMsg::Transitions(b.clone()), DEFAULT_MAX_FRAME).unwrap();
    let raw_bytes = b.obs.len() + rows * (4 + 4 + 8 + 4 + 4);

    // In process: N threads inserting into replay, as embedded actors do.
    let t = table(shape);
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..connections)
        .map(|i| {
            let (t, stop, mut b) = (Arc::clone(&t), Arc::clone(&stop), b.clone());
            b.actor_id = i as u32;
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    t.insert(&b).unwrap();
                    b.seq += 1;
                }
            })
        })
        .collect();
    warmed(&t, shape);
    let (rows0, t0) = (t.stats().inserted, Instant::now());
    std::thread::sleep(Duration::from_secs_f64(seconds));
    let local_rows = (t.stats().inserted - rows0) as f64 / t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    threads.into_iter().for_each(|h| h.join().unwrap());

    // Over loopback: N connections to the real server.
    let t = table(shape);
    let params = Arc::new(ParamsCell::new(Params::of_one(0, vec![0.0; 4610])));
    let srv = server(shape, Arc::clone(&t), params);
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..connections)
        .map(|_| {
            let (stop, sent, frame) = (Arc::clone(&stop), Arc::clone(&sent), frame.clone());
            let mut s = connect(srv.addr);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if s.write_all(&frame).is_err() {
                        break;
                    }
                    sent.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    warmed(&t, shape);
    let (rows0, t0) = (t.stats().inserted, Instant::now());
    std::thread::sleep(Duration::from_secs_f64(seconds));
    let remote_rows = (t.stats().inserted - rows0) as f64 / t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    t.close();
    srv.shutdown(goodbye_for(true, "benchmark over")).unwrap();
    clients.into_iter().for_each(|h| {
        let _ = h.join();
    });
    let wire_per_row = frame.len() as f64 / rows as f64;
    println!(
        "transitions into replay ({connections} producers, batches of {rows}, {shape:?} rows, {} raw bytes per transition):",
        raw_bytes / rows
    );
    println!("  {:<22} {:>14} {:>12}", "path", "transitions/s", "MB/s");
    println!(
        "  {:<22} {:>14.0} {:>12.1}",
        "in-process",
        local_rows,
        local_rows * (raw_bytes / rows) as f64 / 1e6
    );
    println!(
        "  {:<22} {:>14.0} {:>12.1}",
        "loopback TCP",
        remote_rows,
        remote_rows * wire_per_row / 1e6
    );
    println!(
        "  loopback / in-process: {:.2}; {:.1} wire bytes per transition",
        remote_rows / local_rows,
        wire_per_row
    );
}

fn broadcast(actors: usize, repeats: usize) {
    let t = table(Shape::CartPole);
    let params = Arc::new(ParamsCell::new(Params::of_one(0, vec![0.0; 16])));
    let srv = server(Shape::CartPole, Arc::clone(&t), Arc::clone(&params));
    let received: Arc<Mutex<Vec<(u64, Instant)>>> = Arc::default();
    let ready = Arc::new(Barrier::new(actors + 1));
    let readers: Vec<_> = (0..actors)
        .map(|_| {
            let (received, ready) = (Arc::clone(&received), Arc::clone(&ready));
            let mut s = connect(srv.addr);
            std::thread::spawn(move || {
                let mut waited = false;
                let mut framer = Framer::new(DEFAULT_MAX_FRAME);
                while let Some(msg) = recv(&mut s, &mut framer) {
                    match msg {
                        LearnerMsg::Params(p) if p.version == 0 && !waited => {
                            ready.wait();
                            waited = true;
                        }
                        LearnerMsg::Params(p) => {
                            received.lock().unwrap().push((p.version, Instant::now()))
                        }
                        _ => {}
                    }
                }
            })
        })
        .collect();
    ready.wait();
    let mut latencies = Vec::new();
    for v in 1..=repeats as u64 {
        let data = vec![v as f32; NATURE_DQN_PARAMS];
        let t0 = Instant::now();
        params.publish(Params {
            version: v,
            env_steps: 0,
            updates: 0,
            population: 1,
            data,
        });
        loop {
            let done: Vec<Instant> = received
                .lock()
                .unwrap()
                .iter()
                .filter(|(ver, _)| *ver == v)
                .map(|(_, at)| *at)
                .collect();
            if done.len() == actors {
                let last = done.iter().max().unwrap();
                latencies.push((*last - t0).as_secs_f64() * 1e3);
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "broadcast did not complete"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    t.close();
    srv.shutdown(goodbye_for(true, "benchmark over")).unwrap();
    drop(readers);
    latencies.sort_by(f64::total_cmp);
    println!(
        "parameter broadcast, {:.1} MB ({NATURE_DQN_PARAMS} floats) to {actors} actors over loopback, {repeats} publishes:",
        NATURE_DQN_PARAMS as f64 * 4.0 / 1e6
    );
    println!(
        "  publish -> last actor has it: median {:.0} ms, min {:.0} ms, max {:.0} ms",
        latencies[latencies.len() / 2],
        latencies[0],
        latencies[latencies.len() - 1]
    );
}

fn main() {
    let seconds = arg("--seconds", 3.0);
    let connections = arg("--connections", 4.0) as usize;
    let rows = arg("--rows", 64.0) as usize;
    let shape = if std::env::args().any(|a| a == "--atari") {
        Shape::Atari
    } else {
        Shape::CartPole
    };
    throughput(shape, seconds, connections, rows);
    broadcast(
        arg("--actors", 64.0) as usize,
        arg("--repeats", 5.0) as usize,
    );
}
