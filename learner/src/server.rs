//! The learner's network service: actors connect over TCP, hand-shake, stream transition
//! batches into replay and receive the newest parameters.
//!
//! Each connection is owned by one task; nothing a connection does can block another.
//! Inserts that the rate limiter holds back stop that connection's reads (so TCP pushes
//! back on that actor alone). Parameters are encoded once per version and broadcast
//! latest-only through a `watch` channel: a slow actor gets the newest version, never a
//! queue. Any protocol violation closes that connection alone, with a logged reason and,
//! where the socket still works, an `Error` message to the peer.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use millrace_actor::remote::SOCKET_BUFFER_BYTES;
use millrace_actor::{apex_epsilon, ActorControl, EpisodeStats};
use millrace_proto::codec::{self, tokens_equal};
use millrace_proto::io::{read_msg, write_frame, write_msg, ReadError};
use millrace_proto::wire::{ActorMsg, LearnerMsg, Welcome, PROTOCOL_VERSION};
use millrace_proto::{EnvSpec, NetworkSpec};
use millrace_replay::{ReplayError, Table};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;

use millrace_actor::ParamsSlot;

/// The frame limit before a peer has authenticated: a `Hello` is a few hundred bytes.
pub const HANDSHAKE_MAX_FRAME: usize = 64 << 10;
/// Default port of `learner --listen`.
pub const DEFAULT_PORT: u16 = 7787;
/// Most environments one actor connection may ask for.
pub const MAX_ENVS_PER_ACTOR: u32 = 4096;

/// Server settings.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// Required from every actor when set (always set for non-loopback addresses).
    pub token: Option<String>,
    pub max_frame: usize,
    pub handshake_timeout: Duration,
    /// A connection that sends nothing for this long is closed.
    pub idle_timeout: Duration,
    /// A write (parameters, heartbeat) that takes longer than this closes the connection.
    pub write_timeout: Duration,
    pub heartbeat_every: Duration,
    pub n_step: u32,
    pub gamma: f32,
    /// Transitions per batch for an actor of `batch_envs` environments; an actor with
    /// more gets proportionally more (so each batch carries over as few duplicated
    /// observation rows, per transition, as replay was sized for), up to what fits a
    /// replay shard.
    pub batch_rows: u32,
    pub batch_envs: u32,
    /// Ape-X exploration: slot i of N gets `base^(1 + alpha·i/(N−1))`...
    pub eps_base: f32,
    pub eps_alpha: f32,
    /// ...when set (`learner --apex-epsilon`); otherwise remote actors follow
    /// `epsilon_decay` on the global env steps, as embedded actors do.
    pub apex_epsilon: bool,
    pub epsilon_decay: Option<millrace_proto::wire::EpsilonDecay>,
    /// Connections open at once; more are refused at accept.
    pub max_connections: usize,
}

impl ServerConfig {
    pub fn new(listen: SocketAddr) -> Self {
        Self {
            listen,
            token: None,
            max_frame: codec::DEFAULT_MAX_FRAME,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
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
        }
    }
}

/// Actor slots: handed out lowest first and returned when a connection ends, so an actor
/// that reconnects gets its old slots (and Ape-X ε) back instead of ever-greedier new
/// ones. ε is computed over the high-water mark of slots in use.
#[derive(Debug, Default)]
struct SlotPool {
    inner: std::sync::Mutex<(std::collections::BTreeSet<u32>, u32)>,
}

/// Most slots a server hands out in all (64 actors × 4096 envs).
const MAX_SLOTS: u32 = 1 << 18;

impl SlotPool {
    /// `n` slots and the number of slots the ε schedule spans, or `None` when full.
    fn take(&self, n: u32) -> Option<(Vec<u32>, u32)> {
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (free, next) = &mut *guard;
        let from_free = (n as usize).min(free.len());
        if from_free < n as usize && next.checked_add(n - from_free as u32)? > MAX_SLOTS {
            return None;
        }
        let mut slots: Vec<u32> = (0..from_free).filter_map(|_| free.pop_first()).collect();
        while slots.len() < n as usize {
            slots.push(*next);
            *next += 1;
        }
        slots.sort_unstable();
        Some((slots, *next))
    }

    fn give_back(&self, slots: &[u32]) {
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        guard.0.extend(slots.iter().copied());
    }
}

/// Per-actor statistics, updated by connections and read by the coordinator for the
/// progress bar and TensorBoard.
#[derive(Debug, Default)]
pub struct ActorBoard {
    actors: std::sync::Mutex<std::collections::HashMap<u32, ActorEntry>>,
}

/// One connected actor, as last reported.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ActorEntry {
    pub peer: String,
    pub transitions_per_s: f64,
    /// Learner parameter version minus the version the actor last acted with.
    pub version_lag: u64,
}

/// All connected actors together.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BoardSummary {
    pub connected: usize,
    pub transitions_per_s: f64,
    pub mean_version_lag: f64,
    pub max_version_lag: u64,
}

impl ActorBoard {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u32, ActorEntry>> {
        self.actors.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn update(&self, slot: u32, entry: ActorEntry) {
        self.lock().insert(slot, entry);
    }

    pub fn remove(&self, slot: u32) {
        self.lock().remove(&slot);
    }

    /// Every connected actor by its first slot, in slot order.
    pub fn entries(&self) -> Vec<(u32, ActorEntry)> {
        let mut all: Vec<_> = self.lock().iter().map(|(s, a)| (*s, a.clone())).collect();
        all.sort_by_key(|(s, _)| *s);
        all
    }

    pub fn summary(&self) -> BoardSummary {
        let actors = self.lock();
        let n = actors.len();
        BoardSummary {
            connected: n,
            transitions_per_s: actors.values().map(|a| a.transitions_per_s).sum(),
            mean_version_lag: actors.values().map(|a| a.version_lag as f64).sum::<f64>()
                / n.max(1) as f64,
            max_version_lag: actors.values().map(|a| a.version_lag).max().unwrap_or(0),
        }
    }
}

/// What the server shares with the rest of the learner.
#[derive(Clone, Debug)]
pub struct ServerContext {
    pub env: EnvSpec,
    pub network: NetworkSpec,
    pub run_id: String,
    pub table: Arc<Table>,
    pub params: Arc<ParamsSlot>,
    pub episodes: Sender<EpisodeStats>,
    /// Remote transitions count as env steps here (one per transition).
    pub control: Arc<ActorControl>,
    pub board: Arc<ActorBoard>,
}

/// A running server.
#[derive(Debug)]
pub struct ServerHandle {
    pub addr: SocketAddr,
    stop: watch::Sender<bool>,
    thread: JoinHandle<()>,
}

impl ServerHandle {
    /// Stops accepting, closes every connection and waits for the server thread.
    pub fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.thread.join();
    }
}

/// Binds `cfg.listen` and serves on a thread of its own (a small tokio runtime).
pub fn spawn(cfg: ServerConfig, ctx: ServerContext) -> std::io::Result<ServerHandle> {
    // Parameters never change size during a run: refuse to start rather than fail to
    // send them later.
    let params_bytes = ctx.params.latest().data.len() * 4 + 64;
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
    let listener = runtime.block_on(async {
        let socket = if cfg.listen.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        // Accepted connections inherit this: a small receive buffer keeps backpressure
        // prompt (see `millrace_actor::remote::SOCKET_BUFFER_BYTES`).
        socket.set_recv_buffer_size(SOCKET_BUFFER_BYTES)?;
        socket.bind(cfg.listen)?;
        socket.listen(1024)
    })?;
    let addr = listener.local_addr()?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let thread = std::thread::Builder::new()
        .name("server".into())
        .spawn(move || {
            runtime.block_on(serve(listener, Arc::new(cfg), Arc::new(ctx), stop_rx));
            runtime.shutdown_timeout(Duration::from_secs(1));
        })?;
    tracing::info!("listening for actors on {addr}");
    Ok(ServerHandle {
        addr,
        stop: stop_tx,
        thread,
    })
}

async fn serve(
    listener: TcpListener,
    cfg: Arc<ServerConfig>,
    ctx: Arc<ServerContext>,
    mut stop: watch::Receiver<bool>,
) {
    let (frames_tx, frames_rx) = watch::channel::<Option<Arc<Vec<u8>>>>(None);
    tokio::spawn(broadcast_params(
        Arc::clone(&cfg),
        Arc::clone(&ctx),
        frames_tx,
        stop.clone(),
    ));
    let slots = Arc::new(SlotPool::default());
    // Bounds open connections, and with them the threads parked in replay inserts.
    let permits = Arc::new(tokio::sync::Semaphore::new(cfg.max_connections));
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
                        tracing::warn!("{peer}: refused: {} connections already open", cfg.max_connections);
                        drop(stream);
                        continue;
                    };
                    let conn = Connection {
                        _permit: permit,
                        cfg: Arc::clone(&cfg),
                        ctx: Arc::clone(&ctx),
                        slots: Arc::clone(&slots),
                        frames: frames_rx.clone(),
                        stop: stop.clone(),
                        peer,
                    };
                    tokio::spawn(conn.run(stream));
                }
                // Per-connection accept errors (e.g. too many open files) are transient.
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = stop.changed() => break,
        }
    }
}

/// Encodes each new parameter version once for all connections.
async fn broadcast_params(
    cfg: Arc<ServerConfig>,
    ctx: Arc<ServerContext>,
    frames: watch::Sender<Option<Arc<Vec<u8>>>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut sent = None;
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let version = ctx.params.version();
        if sent == Some(version) {
            continue;
        }
        let params = ctx.params.latest();
        match codec::encode(&LearnerMsg::Params((*params).clone()), cfg.max_frame) {
            Ok(frame) => {
                frames.send_replace(Some(Arc::new(frame)));
                sent = Some(version);
            }
            Err(e) => {
                tracing::error!("cannot send parameters ({e}); raise the frame limit");
                return;
            }
        }
    }
}

struct Connection {
    _permit: tokio::sync::OwnedSemaphorePermit,
    cfg: Arc<ServerConfig>,
    ctx: Arc<ServerContext>,
    slots: Arc<SlotPool>,
    frames: watch::Receiver<Option<Arc<Vec<u8>>>>,
    stop: watch::Receiver<bool>,
    peer: SocketAddr,
}

/// Why a connection ended: `Err` reasons are the peer's fault and are sent to it.
type Outcome = Result<String, String>;

impl Connection {
    async fn run(self, stream: TcpStream) {
        let _ = stream.set_nodelay(true);
        let (mut rd, mut wr) = stream.into_split();
        let peer = self.peer;
        let welcome = match self.handshake(&mut rd).await {
            Ok(w) => w,
            Err(reason) => {
                tracing::warn!("{peer}: refused: {reason}");
                let _ = self.send_error(&mut wr, &reason).await;
                return;
            }
        };
        let first_slot = welcome.slots[0];
        let slots = welcome.slots.clone();
        tracing::info!(
            "{peer}: actor joined with {} envs (slots {}..={})",
            welcome.slots.len(),
            first_slot,
            welcome.slots.last().copied().unwrap_or(first_slot)
        );
        if let Err(e) = write_msg(
            &mut wr,
            &LearnerMsg::Welcome(Box::new(welcome)),
            self.cfg.max_frame,
        )
        .await
        {
            tracing::warn!("{peer}: closed during the handshake: {e}");
            return;
        }
        // The writer stops when the reader does (the reader also watches shutdown).
        let (close_tx, close_rx) = watch::channel(false);
        let writer = tokio::spawn(send_loop(
            wr,
            self.frames.clone(),
            close_rx,
            self.cfg.heartbeat_every,
            self.cfg.write_timeout,
        ));
        let outcome = self.receive_loop(&mut rd, first_slot, slots.len()).await;
        self.ctx.board.remove(first_slot);
        self.slots.give_back(&slots);
        let _ = close_tx.send(true);
        // Take the write half back to send the reason, unless the peer stalled it.
        let mut writer = writer;
        let wr = match tokio::time::timeout(Duration::from_secs(1), &mut writer).await {
            Ok(Ok(wr)) => wr,
            _ => {
                writer.abort();
                None
            }
        };
        match outcome {
            Ok(reason) => tracing::info!("{peer}: connection closed: {reason}"),
            Err(reason) => {
                tracing::warn!("{peer}: closing connection: {reason}");
                if let Some(mut wr) = wr {
                    let _ = self.send_error(&mut wr, &reason).await;
                }
            }
        }
    }

    async fn send_error(&self, wr: &mut OwnedWriteHalf, reason: &str) -> Result<(), ReadError> {
        let msg = LearnerMsg::Error {
            reason: reason.to_string(),
        };
        tokio::time::timeout(
            Duration::from_secs(1),
            write_msg(wr, &msg, self.cfg.max_frame),
        )
        .await
        .unwrap_or(Ok(()))
    }

    async fn handshake(&self, rd: &mut tokio::net::tcp::OwnedReadHalf) -> Result<Welcome, String> {
        let first = tokio::time::timeout(
            self.cfg.handshake_timeout,
            read_msg::<ActorMsg, _>(rd, HANDSHAKE_MAX_FRAME),
        )
        .await
        .map_err(|_| "no handshake within the timeout".to_string())?
        .map_err(|e| format!("bad handshake: {e}"))?;
        let hello = match first {
            Some(ActorMsg::Hello(h)) => h,
            Some(other) => return Err(format!("expected Hello first, got {}", variant(&other))),
            None => return Err("closed before the handshake".into()),
        };
        if hello.protocol_version != PROTOCOL_VERSION {
            return Err(format!(
                "protocol version {} is not supported (this learner speaks {PROTOCOL_VERSION})",
                hello.protocol_version
            ));
        }
        if let Some(token) = &self.cfg.token {
            if !tokens_equal(token.as_bytes(), hello.token.as_bytes()) {
                return Err("wrong token".into());
            }
        }
        if !hello
            .capabilities
            .env_ids
            .iter()
            .any(|id| *id == self.ctx.env.id)
        {
            return Err(format!(
                "this run trains {}, which the actor cannot run",
                self.ctx.env.id
            ));
        }
        let envs = hello.capabilities.envs;
        if envs == 0 || envs > MAX_ENVS_PER_ACTOR {
            return Err(format!(
                "{envs} environments requested (1..={MAX_ENVS_PER_ACTOR} allowed)"
            ));
        }
        let batch_rows = self.batch_rows_for(envs)?;
        let (slots, total) = self
            .slots
            .take(envs)
            .ok_or_else(|| "the learner has no actor slots left".to_string())?;
        let epsilons = slots
            .iter()
            .map(|&i| apex_epsilon(i, total, self.cfg.eps_base, self.cfg.eps_alpha))
            .collect();
        Ok(Welcome {
            run_id: self.ctx.run_id.clone(),
            env: self.ctx.env.clone(),
            network: self.ctx.network.clone(),
            params_version: self.ctx.params.version(),
            slots,
            epsilons,
            epsilon_decay: self.cfg.epsilon_decay.filter(|_| !self.cfg.apex_epsilon),
            n_step: self.cfg.n_step,
            gamma: self.cfg.gamma,
            batch_rows,
        })
    }

    /// Transitions per batch for an actor of `envs` environments (see
    /// [`ServerConfig::batch_rows`]), or why replay cannot take its batches.
    fn batch_rows_for(&self, envs: u32) -> Result<u32, String> {
        let envs = u64::from(envs);
        let (rows, ref_envs) = (
            u64::from(self.cfg.batch_rows.max(1)),
            u64::from(self.cfg.batch_envs.max(1)),
        );
        let wanted = rows.max((envs * rows).div_ceil(ref_envs)).max(envs);
        // A batch may exceed its target by one n-step flush per env; two must fit a
        // shard, or replay would hold little else.
        let shard = self.ctx.table.shard_capacity() as u64;
        let flush = envs * u64::from(self.cfg.n_step.max(1));
        let fits = (shard / 2).saturating_sub(flush);
        if fits < envs {
            return Err(format!(
                "{envs} environments make batches too large for replay's shards of {shard} \
                 transitions (raise --replay-capacity or lower --replay-shards, or run fewer envs)"
            ));
        }
        Ok(wanted.min(fits) as u32)
    }

    async fn receive_loop(
        &self,
        rd: &mut tokio::net::tcp::OwnedReadHalf,
        slot: u32,
        envs: usize,
    ) -> Outcome {
        let row_bytes = self.ctx.env.obs.row_bytes();
        // An actor's batch holds one row per step, one more per truncated episode, and
        // at most n_step + 1 rows per environment carried over: more rows than that
        // would let one actor flush replay past the rate limiter (which counts
        // transitions).
        let carried = envs * (self.cfg.n_step as usize + 1);
        let num_actions = self.ctx.env.num_actions;
        let mut stop = self.stop.clone();
        let (mut steps, mut since) = (0u64, Instant::now());
        let (mut window_steps, mut window_start) = (0u64, Instant::now());
        loop {
            let msg = tokio::select! {
                m = tokio::time::timeout(self.cfg.idle_timeout, read_msg::<ActorMsg, _>(rd, self.cfg.max_frame)) => m,
                _ = stop.changed() => return Ok("learner shutting down".into()),
            };
            let msg = match msg {
                Err(_) => return Err(format!("nothing received for {:?}", self.cfg.idle_timeout)),
                Ok(Ok(Some(m))) => m,
                Ok(Ok(None)) => return Ok("actor disconnected".into()),
                Ok(Err(ReadError::Io(e))) => return Ok(format!("connection lost: {e}")),
                Ok(Err(e)) => return Err(e.to_string()),
            };
            match msg {
                ActorMsg::Transitions(mut batch) => {
                    batch
                        .validate(row_bytes)
                        .and_then(|()| batch.check_values(num_actions))
                        .map_err(|e| {
                            format!("transition batch does not match {}: {e}", self.ctx.env.id)
                        })?;
                    if batch.obs_rows() > 2 * batch.len() + carried {
                        return Err(format!(
                            "{} observation rows for {} transitions from {envs} environments",
                            batch.obs_rows(),
                            batch.len()
                        ));
                    }
                    // The connection's own slot, whatever the actor claims.
                    batch.actor_id = slot;
                    steps += batch.len() as u64;
                    window_steps += batch.len() as u64;
                    self.ctx
                        .control
                        .env_steps
                        .fetch_add(batch.len() as u64, Ordering::Relaxed);
                    let table = Arc::clone(&self.ctx.table);
                    // Blocks while the rate limiter holds inserts back: this connection
                    // stops reading, and TCP pushes back on this actor alone.
                    match tokio::task::block_in_place(|| table.insert(&batch)) {
                        Ok(()) => {}
                        Err(ReplayError::Closed) => return Ok("learner shutting down".into()),
                        Err(e) => return Err(e.to_string()),
                    }
                }
                ActorMsg::Stats(stats) => {
                    tracing::debug!(
                        "{}: stats: {} episodes, {} returns",
                        self.peer,
                        stats.episodes,
                        stats.episode_returns.len()
                    );
                    for r in stats
                        .episode_returns
                        .iter()
                        .filter(|r| r.is_finite())
                        .take(4096)
                    {
                        let _ = self.ctx.episodes.try_send(EpisodeStats {
                            actor_id: slot,
                            episode_return: *r,
                            length: 0,
                            env_steps: stats.env_steps,
                        });
                    }
                    let lag = self
                        .ctx
                        .params
                        .version()
                        .saturating_sub(stats.params_version);
                    let window = window_start.elapsed().as_secs_f64();
                    if window >= 1.0 {
                        self.ctx.board.update(
                            slot,
                            ActorEntry {
                                peer: self.peer.to_string(),
                                transitions_per_s: window_steps as f64 / window,
                                version_lag: lag,
                            },
                        );
                        (window_steps, window_start) = (0, Instant::now());
                    }
                    let dt = since.elapsed().as_secs_f64();
                    if dt >= 10.0 {
                        tracing::info!(
                            "{}: {:.0} transitions/s, params version {} (learner at {})",
                            self.peer,
                            steps as f64 / dt,
                            stats.params_version,
                            self.ctx.params.version()
                        );
                        (steps, since) = (0, Instant::now());
                    }
                }
                ActorMsg::Heartbeat => {}
                ActorMsg::Goodbye { reason } => return Ok(format!("actor said goodbye: {reason}")),
                ActorMsg::Hello(_) => return Err("a second Hello".into()),
            }
        }
    }
}

fn variant(msg: &ActorMsg) -> &'static str {
    match msg {
        ActorMsg::Hello(_) => "Hello",
        ActorMsg::Transitions(_) => "Transitions",
        ActorMsg::Stats(_) => "Stats",
        ActorMsg::Heartbeat => "Heartbeat",
        ActorMsg::Goodbye { .. } => "Goodbye",
    }
}

/// Sends the newest parameters whenever they change, and heartbeats. Returns the write
/// half when it stops for a reason other than a failed or stalled write.
async fn send_loop(
    mut wr: OwnedWriteHalf,
    mut frames: watch::Receiver<Option<Arc<Vec<u8>>>>,
    mut stop: watch::Receiver<bool>,
    heartbeat_every: Duration,
    write_timeout: Duration,
) -> Option<OwnedWriteHalf> {
    frames.mark_changed();
    let mut heartbeat = tokio::time::interval(heartbeat_every);
    loop {
        let frame = tokio::select! {
            // Parameters first: a heartbeat is only for a quiet link.
            biased;
            changed = frames.changed() => {
                if changed.is_err() {
                    return Some(wr);
                }
                match frames.borrow_and_update().clone() {
                    Some(f) => f,
                    None => continue,
                }
            }
            _ = heartbeat.tick() => match codec::encode(&LearnerMsg::Heartbeat, codec::DEFAULT_MAX_FRAME) {
                Ok(f) => Arc::new(f),
                Err(_) => continue,
            },
            _ = stop.changed() => return Some(wr),
        };
        match tokio::time::timeout(write_timeout, write_frame(&mut wr, &frame)).await {
            Ok(Ok(())) => {}
            // A stalled or broken peer: stop writing; the reader notices and closes.
            _ => return None,
        }
    }
}
