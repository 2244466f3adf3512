//! The learner's network service: actors connect over TCP, hand-shake, stream transition
//! batches into replay and receive the newest parameters.
//!
//! Each connection is owned by one task ([`connection`]); nothing a connection does can
//! block another. Inserts that the rate limiter holds back stop that connection's reads
//! (so TCP pushes back on that actor alone), and every frame being read or handled is
//! charged to one memory budget shared by all connections. Parameters are encoded once
//! per version and broadcast latest-only through a `watch` channel: a slow actor gets the
//! newest version, never a queue. Refusals are typed ([`RefusalCode`]): the actor knows
//! whether to stop or to retry. When the run ends, every connection gets a typed
//! [`Goodbye`]: "finished" (actors exit) or "stopping" (actors retry; the learner is
//! coming back).

mod auth;
mod board;
mod connection;
mod exploration;
mod handshake;
mod ports;
pub mod sources;

use std::net::SocketAddr;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::Sender;
use millrace_proto::auth::params_digest;
use millrace_proto::codec;
use millrace_proto::io::SOCKET_BUFFER_BYTES;
use millrace_proto::io::{write_msg, Contended, MemoryBudget};
use millrace_proto::wire::{Goodbye, GoodbyeReason, LearnerMsg};
use millrace_proto::EpisodeStats;
use millrace_proto::{EnvSpec, NetworkSpec, ParamsCell};
use serde::Serialize;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{watch, Semaphore};

pub use board::{ActorBoard, ActorEntry, BoardSummary};
pub use connection::goodbye_for;
use connection::Connection;
pub use exploration::{ExplorationIndices, MAX_INDICES};
pub use ports::{AgentPorts, AgentSpec, Route, Routes};
pub use sources::SourceLimits;

use millrace_proto::durations::secs;

/// The frame limit before a peer has authenticated: a `Hello` is a few hundred bytes.
pub const HANDSHAKE_MAX_FRAME: usize = 64 << 10;
/// Default port of `learner --listen`.
pub const DEFAULT_PORT: u16 = 7787;
pub use millrace_proto::wire::MAX_ENVS_PER_ACTOR;
/// Answers being written at once during the last call (see [`DEFAULT_LAST_CALL`]);
/// beyond it, extra connections are closed without one.
const MAX_PENDING_ANSWERS: usize = 64;

/// Server settings, all decided by the run's configuration (see `cli`).
#[derive(Clone, Debug, Serialize)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// Required from every actor when set (always set for non-loopback addresses).
    /// Never written to the saved configuration.
    #[serde(skip)]
    pub token: Option<String>,
    pub max_frame: usize,
    /// Bytes that frames being received may hold at once, all connections together.
    pub max_inflight_bytes: usize,
    #[serde(serialize_with = "secs")]
    pub handshake_timeout: Duration,
    /// The `Hello` must arrive within this much of the connection (and within
    /// `handshake_timeout`): an actor sends it at once, so a silent socket gives its
    /// handshake place back soon.
    #[serde(serialize_with = "secs")]
    pub hello_timeout: Duration,
    /// A connection that sends nothing for this long is closed.
    #[serde(serialize_with = "secs")]
    pub idle_timeout: Duration,
    /// Once its header is in, a frame of `len` bytes must arrive whole within
    /// `frame_grace + len / min_frame_rate` (the idle timeout resets on every byte: a
    /// trickled frame would hold its share of the memory budget for ever).
    #[serde(serialize_with = "secs")]
    pub frame_grace: Duration,
    /// Bytes per second (see `frame_grace`).
    pub min_frame_rate: u64,
    /// Once a frame is found holding more than its fair share of `max_inflight_bytes`
    /// (the budget over the connections holding or waiting for some) while another
    /// connection waits, its rest must arrive within `contended_grace + rest /
    /// contended_frame_rate`: a few peers trickling large frames cannot hold the budget
    /// while honest actors wait.
    #[serde(serialize_with = "secs")]
    pub contended_grace: Duration,
    /// Bytes per second (see `contended_grace`).
    pub contended_frame_rate: u64,
    /// A write (parameters, heartbeat) that takes longer than this closes the connection.
    #[serde(serialize_with = "secs")]
    pub write_timeout: Duration,
    #[serde(serialize_with = "secs")]
    pub heartbeat_every: Duration,
    pub n_step: u32,
    pub gamma: f32,
    /// Transitions per batch for an actor of `batch_envs` environments; an actor with
    /// more gets proportionally more (so each batch carries over as few duplicated
    /// observation rows, per transition, as replay was sized for), up to what fits a
    /// replay shard.
    pub batch_rows: u32,
    pub batch_envs: u32,
    /// Ape-X exploration: environment index i of N gets `base^(1 + alpha·i/(N−1))`...
    pub eps_base: f32,
    pub eps_alpha: f32,
    /// ...when set (`learner --apex-epsilon`); otherwise remote actors follow
    /// `epsilon_decay` on the global env steps, as embedded actors do.
    pub apex_epsilon: bool,
    pub epsilon_decay: Option<millrace_proto::wire::EpsilonDecay>,
    /// Authenticated sessions at once; an actor past it is refused, temporarily, once it
    /// has proved the token.
    pub max_connections: usize,
    /// Connections still in their handshake at once (not yet authenticated: they do not
    /// count against `max_connections`); more are closed at accept without a word.
    pub max_handshakes: usize,
    /// What a stored transition's values may be: a batch beyond them is refused with a
    /// protocol violation that names the field.
    pub value_bounds: millrace_proto::ValueBounds,
    /// Bounds per source address on handshakes in flight and connections per second
    /// (beyond them, closed at accept without a word): one source cannot hold the places
    /// of `max_handshakes` that honest actors need ([`sources`]).
    pub source_limits: SourceLimits,
    /// How long the listener stays open for actors coming back once the run is
    /// finished (see [`DEFAULT_LAST_CALL`]).
    #[serde(serialize_with = "secs")]
    pub last_call: Duration,
}

impl ServerConfig {
    pub fn new(listen: SocketAddr) -> Self {
        Self {
            listen,
            token: None,
            max_frame: codec::DEFAULT_MAX_FRAME,
            max_inflight_bytes: 256 << 20,
            handshake_timeout: Duration::from_secs(5),
            hello_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(60),
            // A 16 MiB batch then has 69 s: far more than any link an actor uses needs.
            frame_grace: Duration::from_secs(5),
            min_frame_rate: 256 << 10,
            // A 16 MiB frame then has 3 s: 100 Mbit/s or more meets it.
            contended_grace: Duration::from_secs(1),
            contended_frame_rate: 8 << 20,
            write_timeout: Duration::from_secs(30),
            heartbeat_every: Duration::from_secs(5),
            n_step: 3,
            gamma: 0.99,
            batch_rows: 64,
            batch_envs: 8,
            eps_base: 0.4,
            eps_alpha: 7.0,
            apex_epsilon: false,
            epsilon_decay: None,
            max_connections: 256,
            max_handshakes: 64,
            source_limits: SourceLimits::default(),
            value_bounds: millrace_proto::ValueBounds::FINITE,
            last_call: DEFAULT_LAST_CALL,
        }
    }
}

/// What the server shares with the rest of the learner.
#[derive(Clone, Debug)]
pub struct ServerContext {
    pub env: EnvSpec,
    /// How actors build it (sent in the welcome).
    pub env_config: millrace_proto::EnvConfig,
    pub clip_rewards: bool,
    /// The network of a single run (a population's agents bring their own).
    pub network: NetworkSpec,
    pub run_id: String,
    /// Where actors' transitions go and their parameters come from.
    pub routes: Routes,
    pub episodes: Sender<EpisodeStats>,
    pub board: Arc<ActorBoard>,
}

/// What connections learn when the server stops: nothing yet, or the goodbye to send.
type StopSignal = watch::Receiver<Option<Goodbye>>;

/// A running server.
#[derive(Debug)]
pub struct ServerHandle {
    pub addr: SocketAddr,
    stop: watch::Sender<Option<Goodbye>>,
    thread: JoinHandle<()>,
}

impl ServerHandle {
    /// Tells every connection the session is ending with `goodbye`, without waiting.
    /// Announce before closing replay: a connection whose insert is cut short by the
    /// closing then still says goodbye instead of just hanging up.
    pub fn announce(&self, goodbye: Goodbye) {
        let _ = self.stop.send(Some(goodbye));
    }

    /// Whether the server thread has ended (by itself, only a failure does).
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Stops accepting, says `goodbye` on every connection (unless one was announced
    /// already), closes them and waits for the server thread; `Err` if it panicked.
    pub fn shutdown(self, goodbye: Goodbye) -> Result<(), millrace_proto::panics::Panicked> {
        self.stop.send_if_modified(|current| {
            if current.is_none() {
                *current = Some(goodbye);
                true
            } else {
                false
            }
        });
        millrace_proto::panics::joined(self.thread)
    }
}

/// Binds `cfg.listen` and serves on a thread of its own (a small tokio runtime).
pub fn spawn(cfg: ServerConfig, ctx: ServerContext) -> std::io::Result<ServerHandle> {
    // Parameters never change size during a run: refuse to start rather than fail to
    // send them later.
    let params_bytes = ctx.network.layout().len * ctx.network.population.max(1) * 4 + 64;
    if params_bytes > cfg.max_frame.min(codec::MAX_FRAME_CEILING) {
        return Err(std::io::Error::other(format!(
            "parameters ({params_bytes} bytes) exceed the frame limit ({} bytes)",
            cfg.max_frame
        )));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("server")
        .enable_all()
        .build()?;
    let listen = cfg.listen;
    let listener = runtime
        .block_on(async {
            let socket = if listen.is_ipv4() {
                TcpSocket::new_v4()?
            } else {
                TcpSocket::new_v6()?
            };
            socket.set_reuseaddr(true)?;
            // Accepted connections inherit this: a small receive buffer keeps
            // backpressure prompt (see `millrace_proto::io::SOCKET_BUFFER_BYTES`).
            socket.set_recv_buffer_size(SOCKET_BUFFER_BYTES)?;
            socket.bind(listen)?;
            socket.listen(1024)
        })
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {listen}: {e}")))?;
    let addr = listener.local_addr()?;
    let (stop_tx, stop_rx) = watch::channel(None);
    let thread = std::thread::Builder::new()
        .name("server".into())
        .spawn(move || {
            runtime.block_on(serve(listener, Arc::new(cfg), Arc::new(ctx), stop_rx));
            runtime.shutdown_timeout(Duration::from_secs(2));
        })?;
    tracing::info!("listening for actors on {addr}");
    Ok(ServerHandle {
        addr,
        stop: stop_tx,
        thread,
    })
}

/// What every connection shares.
#[derive(Debug)]
struct Shared {
    cfg: Arc<ServerConfig>,
    ctx: Arc<ServerContext>,
    indices: ExplorationIndices,
    budget: Arc<MemoryBudget>,
    /// Sessions so far, for their stream ids (see [`remote_stream`]).
    sessions: AtomicU32,
    /// When a connection last ended while the run went on (a population's agent that
    /// ended sending its actors on, a temporary refusal, an actor that dropped): its
    /// actor may be reconnecting. A std mutex: nothing awaits while holding it.
    away: std::sync::Mutex<Option<std::time::Instant>>,
    /// Authenticated sessions' places (`max_connections`), taken once the token is
    /// proved, so sockets that never authenticate cannot take them.
    session_places: Arc<Semaphore>,
    /// Recent failed authentications by source address, to throttle guessing.
    auth_failures: std::sync::Mutex<auth::Failures>,
}

impl Shared {
    /// Notes that an actor may be on its way back (see [`ServerConfig::last_call`]).
    fn mark_away(&self) {
        *self.away.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::time::Instant::now());
    }

    fn last_away(&self) -> Option<std::time::Instant> {
        *self.away.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How long after a connection last ended mid-run, or sent its actor on (a goodbye for
/// now, a temporary refusal, a last word it could not deliver), the listener stays open
/// once the run is finished and every connection has closed, telling each actor that
/// comes back that it is over (actors reconnect from a 0.2 s backoff, jittered to at
/// most 0.3 s, after a goodbye; after a lost connection or a refusal the backoff grows,
/// and an actor refused several times in a row may come back after this). Without it,
/// an actor sent on by a population's agent just before the last agent ended would
/// retry an address nobody answers, for ever.
pub const DEFAULT_LAST_CALL: Duration = Duration::from_secs(2);

/// The id a remote session's batches carry into replay (`actor_id`): replay keys frame
/// streams by it, so it must differ from every other stream's while the session's
/// frames are stored. Local actors use `0..count` and restored checkpoints `u32::MAX −
/// shard`; sessions count up from 2³⁰, wrapping after 2³⁰ of them.
fn remote_stream(session: u32) -> u32 {
    (1 << 30) | (session & ((1 << 30) - 1))
}

async fn serve(
    listener: TcpListener,
    cfg: Arc<ServerConfig>,
    ctx: Arc<ServerContext>,
    mut stop: StopSignal,
) {
    let (frames_tx, frames_rx) = watch::channel::<Option<Arc<ParamsFrame>>>(None);
    tokio::spawn(broadcast_params(
        Arc::clone(&cfg),
        Arc::clone(&ctx),
        frames_tx,
        stop.clone(),
    ));
    let shared = Arc::new(Shared {
        budget: Arc::new(
            MemoryBudget::new(cfg.max_inflight_bytes).with_contended(Contended {
                grace: cfg.contended_grace,
                bytes_per_s: cfg.contended_frame_rate,
            }),
        ),
        indices: ExplorationIndices::default(),
        cfg: Arc::clone(&cfg),
        ctx,
        sessions: AtomicU32::new(0),
        away: std::sync::Mutex::new(None),
        session_places: Arc::new(Semaphore::new(cfg.max_connections)),
        auth_failures: std::sync::Mutex::new(auth::Failures::default()),
    });
    // Bounds the handshakes in flight (sockets not yet authenticated); sessions have
    // places of their own (`Shared::session_places`), which bound the threads parked in
    // replay inserts.
    let handshakes = Arc::new(Semaphore::new(cfg.max_handshakes));
    let sources = Arc::new(std::sync::Mutex::new(sources::Sources::new(
        cfg.source_limits,
    )));
    let mut turned_away: u64 = 0;
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    // Its source's place first (one source cannot take every place),
                    // then one of all; nothing is said to a peer that has not proved
                    // the token, and a flood is logged once per power of two.
                    let place = Arc::clone(&handshakes)
                        .try_acquire_owned()
                        .map_err(|_| format!("{} handshakes already in flight", cfg.max_handshakes))
                        .and_then(|global| {
                            let source = sources::SourcePlace::take(&sources, peer.ip(), std::time::Instant::now())
                                .map_err(|why| why.to_string())?;
                            Ok(connection::HandshakePlace { _global: global, _source: source })
                        });
                    let place = match place {
                        Ok(place) => place,
                        Err(why) => {
                            turned_away += 1;
                            if turned_away.is_power_of_two() {
                                tracing::warn!(
                                    "{peer}: closed at once: {why} ({turned_away} turned away so far)"
                                );
                            }
                            drop(stream);
                            continue;
                        }
                    };
                    let conn = Connection {
                        handshake_place: std::sync::Mutex::new(Some(place)),
                        shared: Arc::clone(&shared),
                        frames: frames_rx.clone(),
                        stop: stop.clone(),
                        peer,
                    };
                    connections.spawn(conn.run(stream));
                }
                // Per-connection accept errors (e.g. too many open files) are transient.
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            // Reap finished connection tasks as they end.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = stop.changed() => break,
        }
    }
    let goodbye = stop.borrow().clone();
    // Every connection watches `stop` too: wait for their goodbyes (each gives up on a
    // stalled peer after a few seconds), then tell the last call they are all closed.
    let (closed_tx, closed_rx) = watch::channel(false);
    let wait = async {
        let all = async { while connections.join_next().await.is_some() {} };
        if tokio::time::timeout(connection::CLOSE_WITHIN, all)
            .await
            .is_err()
        {
            tracing::warn!("some connections did not close in time");
        }
        let _ = closed_tx.send(true);
    };
    tokio::join!(
        last_call(
            listener,
            goodbye,
            &shared,
            Arc::new(Semaphore::new(MAX_PENDING_ANSWERS)),
            closed_rx,
        ),
        wait
    );
}

/// When the run is finished, keeps accepting until every connection has closed and
/// [`ServerConfig::last_call`] has passed since one last ended mid-run or sent its actor on (its
/// actor may be reconnecting), telling each newcomer that the run is finished, so that
/// it exits instead of retrying for ever. The deadline is read once the connections
/// have closed: one that was sending its actor on as the run stopped marks it on its
/// way out.
async fn last_call(
    listener: TcpListener,
    goodbye: Option<Goodbye>,
    shared: &Arc<Shared>,
    refusals: Arc<Semaphore>,
    mut closed: watch::Receiver<bool>,
) {
    let Some(goodbye) = goodbye else { return };
    if !matches!(goodbye.reason, GoodbyeReason::RunFinished) {
        return;
    }
    loop {
        // No deadline before the connections have closed (`closed` wakes this loop);
        // then `last_call` after the last one away, or none if nobody is.
        let all_closed = *closed.borrow_and_update();
        let until = match (all_closed, shared.last_away()) {
            (false, _) => None,
            (true, Some(away)) => Some(tokio::time::Instant::from_std(away + shared.cfg.last_call)),
            (true, None) => return,
        };
        let deadline = async {
            match until {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = deadline => return,
            changed = closed.changed(), if !all_closed => {
                if changed.is_err() {
                    return;
                }
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    tracing::info!("{peer}: an actor came back after the run finished: telling it so");
                    if let Ok(p) = Arc::clone(&refusals).try_acquire_owned() {
                        let msg = LearnerMsg::Goodbye(goodbye.clone());
                        let shared = Arc::clone(shared);
                        tokio::spawn(async move {
                            answer(stream, peer, &shared, msg).await;
                            drop(p);
                        });
                    }
                }
                // Transient (e.g. too many open files), as in `serve`.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            },
        }
    }
}

/// Authenticates a fresh connection and sends it `msg` (sealed) instead of a welcome,
/// then closes it without losing it to a reset, never waiting long: an actor believes
/// "the run is finished" only from a learner that proved the token.
async fn answer(stream: TcpStream, peer: SocketAddr, shared: &Shared, msg: LearnerMsg) {
    let (rd, mut wr) = stream.into_split();
    let mut rd = millrace_proto::io::FrameReader::new(rd, HANDSHAKE_MAX_FRAME);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    let deadlines = (deadline, deadline);
    let token = shared.cfg.token.as_deref();
    let msg = match handshake::authenticate(&mut rd, &mut wr, token, deadlines).await {
        Ok(mut a) => match a.seal.seal(&msg) {
            Ok(sealed) => sealed,
            Err(_) => return,
        },
        Err(failed) => {
            if failed.wrong_token {
                // Throttled as during the run: guessing costs time here too.
                let wait = shared
                    .auth_failures
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .failed(peer.ip(), std::time::Instant::now());
                tokio::time::sleep(wait).await;
            }
            LearnerMsg::Refused(failed.refusal)
        }
    };
    let sent = tokio::time::timeout(
        Duration::from_secs(1),
        write_msg(&mut wr, &msg, HANDSHAKE_MAX_FRAME),
    )
    .await;
    if matches!(sent, Ok(Ok(()))) {
        connection::close_gracefully(wr, rd.into_inner()).await;
    }
}

/// A parameter version encoded once for every connection, with the digest each
/// session seals it by ([`millrace_proto::auth`]).
#[derive(Debug)]
pub struct ParamsFrame {
    pub frame: Vec<u8>,
    pub digest: millrace_proto::auth::Tag,
}

/// Encodes each new parameter version once for all connections (of each agent, in a
/// population).
async fn broadcast_params(
    cfg: Arc<ServerConfig>,
    ctx: Arc<ServerContext>,
    frames: watch::Sender<Option<Arc<ParamsFrame>>>,
    mut stop: StopSignal,
) {
    let mut sent = None;
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    // Encodes `params` into `frames` if its version is not `sent` yet; false if it
    // cannot be sent at all.
    let publish = |params: &ParamsCell,
                   frames: &watch::Sender<Option<Arc<ParamsFrame>>>,
                   sent: &mut Option<u64>| {
        let version = params.version();
        if *sent == Some(version) {
            return true;
        }
        let latest = params.latest();
        match codec::encode(&LearnerMsg::Params((*latest).clone()), cfg.max_frame) {
            Ok(frame) => {
                let digest = params_digest(&latest);
                frames.send_replace(Some(Arc::new(ParamsFrame { frame, digest })));
                *sent = Some(version);
                true
            }
            Err(e) => {
                tracing::error!("cannot send parameters ({e}); raise the frame limit");
                false
            }
        }
    };
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let ok = match &ctx.routes {
            Routes::One(route) => publish(&route.params, &frames, &mut sent),
            Routes::Agents(ports) => ports.all().iter().all(|port| {
                let mut sent = port.sent.lock().unwrap_or_else(|e| e.into_inner());
                publish(&port.spec.route.params, &port.frames, &mut sent)
            }),
        };
        if !ok {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_streams_stay_apart_from_local_actors_and_restores() {
        for session in [0, 1, (1 << 30) - 1, 1 << 30, u32::MAX] {
            let id = remote_stream(session);
            assert!(id >= 1 << 30, "above local actors' ids");
            assert!(
                id < u32::MAX - u32::from(u16::MAX),
                "below restored shards' streams"
            );
        }
        assert_ne!(remote_stream(0), remote_stream(1));
    }
}
