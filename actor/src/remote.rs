//! The remote actor: connects to a learner, hands shakes, runs the actor loop on its own
//! thread and streams transitions; reconnects with exponential backoff and jitter when
//! the learner goes away, and continues with the newest parameters it is sent.
//!
//! What ends it is typed: a permanent [`Refusal`] (wrong token, another protocol
//! version, an environment it cannot run, batches too large for the learner's replay)
//! is an error; a temporary one (too many connections, the learner not ready), a lost
//! connection or the learner stopping for a restart mean reconnecting; the learner's
//! [`GoodbyeReason::RunFinished`] means the run is over and the actor is done.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use millrace_proto::auth::{actor_proof, fresh_nonce, AuthError, Seal};
use millrace_proto::codec::DEFAULT_MAX_FRAME;
use millrace_proto::env::{supported, Family};
use millrace_proto::io::{write_msg, FrameReader, MinRate, ReadError, SOCKET_BUFFER_BYTES};
use millrace_proto::peer_text::{peer_text, MAX_REASON_CHARS};
use millrace_proto::wire::{
    ActorMsg, ActorStats, Capabilities, Goodbye, GoodbyeReason, Hello, LearnerMsg, Refusal,
    RefusalCode, Welcome, MAX_RETURNS_PER_STATS, PROTOCOL_VERSION,
};
use millrace_proto::{ParamsCell, StepCounter, TransitionBatch};
use rand::Rng;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{mpsc, watch};

use crate::env;
use crate::runner::{run_actor, ActorConfig, ActorSink, EpisodeStats, SinkClosed};
use crate::schedule::EpsilonSchedule;
use crate::status::ActorStatus;

/// Settings of a remote actor process.
#[derive(Clone, Debug)]
pub struct RemoteConfig {
    /// `HOST:PORT` of the learner.
    pub learner: String,
    pub token: String,
    pub name: String,
    /// Environment instances to run.
    pub envs: usize,
    pub seed: u64,
    pub max_frame: usize,
    /// Waiting for the learner's answer to `Hello`.
    pub handshake_timeout: Duration,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// Send episode statistics this often.
    pub stats_every: Duration,
    /// The learner heartbeats every 5 s; this much silence ends the session.
    pub read_timeout: Duration,
    /// What this process reports (`actor --metrics-addr`).
    pub status: Arc<ActorStatus>,
    /// Python packages a `gym:` environment may import (`--allow-env-module`).
    pub allowed_modules: Vec<String>,
}

impl RemoteConfig {
    pub fn new(learner: String, envs: usize) -> Self {
        Self {
            learner,
            token: String::new(),
            name: format!("actor-{}", std::process::id()),
            envs,
            seed: 0,
            max_frame: DEFAULT_MAX_FRAME,
            handshake_timeout: Duration::from_secs(10),
            backoff_initial: Duration::from_millis(200),
            backoff_max: Duration::from_secs(10),
            stats_every: Duration::from_secs(1),
            read_timeout: Duration::from_secs(20),
            status: Arc::default(),
            allowed_modules: Vec::new(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("the learner refused this actor for good: {0}")]
    Refused(Refusal),
    /// The actor loop itself failed (an environment, or parameters that do not fit the
    /// network): reconnecting would fail the same way.
    #[error("the actor loop failed: {0}")]
    Actor(String),
    /// The learner's welcome asks for what this actor cannot do (its environment port
    /// differs): reconnecting would not change that.
    #[error("this actor cannot work for this learner: {0}")]
    Incompatible(Incompatible),
}

/// What in the learner's welcome this actor cannot do ([`RemoteError::Incompatible`]).
#[derive(Debug, thiserror::Error)]
pub enum Incompatible {
    #[error("the learner's environment: {0}")]
    Module(#[from] millrace_proto::env::ModuleNotAllowed),
    #[error("the learner names two environments: {0} and {1}")]
    TwoEnvironments(String, String),
    #[error(transparent)]
    Env(#[from] env::EnvError),
    #[error("the learner's {0} differs from this actor's port")]
    PortDiffers(String),
    #[error("the learner's network: {0}")]
    Network(#[from] millrace_proto::SpecError),
    #[error("the learner handed out no exploration indices")]
    NoIndices,
}

/// How a remote actor ended without an error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finished {
    /// Asked to stop (a signal).
    Stopped,
    /// The learner said the run is over (solved, or out of steps).
    RunFinished(String),
}

/// How a session with the learner ended.
#[derive(Debug)]
enum End {
    /// We were asked to stop.
    Shutdown,
    /// The run is over.
    RunFinished(String),
    /// The learner refused us for a reason that retrying cannot fix.
    Refused(Refusal),
    /// Connection lost or never made, or a temporary refusal: worth retrying, backing
    /// off further each time.
    Lost(String),
    /// The learner said goodbye for now (stopping for a restart, or a population's agent
    /// that ended sending its actors on to another): reconnect soon, from the shortest
    /// backoff (the learner may have only moments left to take us, e.g. when the
    /// population's last agent is about to end).
    SentAway(String),
    /// The actor loop failed: not worth retrying.
    Failed(String),
    /// The welcome asks for what this actor cannot do: not worth retrying.
    Incompatible(Incompatible),
}

/// Where the handshake is, for what an unsealed refusal may say.
#[derive(Clone, Copy, Debug)]
enum Stage {
    /// Answering the `Hello`.
    Hello,
    /// Answering the proof.
    Proof,
}

impl End {
    /// What a refusal from the learner means for this actor.
    fn refused(mut r: Refusal) -> Self {
        // The learner's words go into this actor's log: bounded and escaped.
        r.message = peer_text(&r.message, MAX_REASON_CHARS);
        if r.code.is_permanent() {
            End::Refused(r)
        } else {
            End::Lost(format!("the learner refused this actor for now: {r}"))
        }
    }

    /// A refusal before the learner has proved the token: only the kinds a learner
    /// sends at that step (`stage`), which the protocol keeps typed so that actors exit
    /// on them rather than retry. A relay could forge one of these (the threat model
    /// says so); it cannot forge any other.
    fn unsealed_refusal(r: Refusal, stage: Stage) -> Self {
        let expected = match stage {
            Stage::Hello => matches!(
                r.code,
                RefusalCode::ProtocolVersion
                    | RefusalCode::ProtocolViolation
                    | RefusalCode::Timeout
            ),
            Stage::Proof => matches!(r.code, RefusalCode::WrongToken | RefusalCode::Timeout),
        };
        if expected {
            End::refused(r)
        } else {
            End::Lost(format!(
                "an unauthenticated {:?} refusal was ignored (only a learner that proves the token is believed)",
                r.code
            ))
        }
    }

    /// A message that does not carry the token's proof: an impersonator, a relay that
    /// rewrote it, or a learner with another token. Nothing in it is used; retrying may
    /// reach the real learner.
    fn forged(e: &AuthError) -> Self {
        End::Lost(format!(
            "the learner failed authentication ({e}); is it started with this actor's token?"
        ))
    }

    fn goodbye(mut g: Goodbye) -> Self {
        g.message = peer_text(&g.message, MAX_REASON_CHARS);
        match g.reason {
            GoodbyeReason::RunFinished => End::RunFinished(g.message),
            GoodbyeReason::LearnerStopping | GoodbyeReason::ActorStopping => {
                End::SentAway(format!("the learner said goodbye for now: {}", g.message))
            }
        }
    }
}

/// Actor output that becomes messages on the connection; blocks when the connection's
/// queue is full, which is how the learner's backpressure reaches the actor loop.
struct ChannelSink {
    tx: mpsc::Sender<ActorMsg>,
    /// Batches the writer has sent, back for the actor to fill again.
    spares: std::sync::mpsc::Receiver<TransitionBatch>,
    stats: ActorStats,
    last_stats: Instant,
    every: Duration,
    status: Arc<ActorStatus>,
}

impl ActorSink for ChannelSink {
    fn transitions(&mut self, batch: &mut TransitionBatch) -> Result<(), SinkClosed> {
        self.stats.env_steps += batch.len() as u64;
        self.stats.params_version = batch.version;
        self.status.stepped(batch.len() as u64, batch.version);
        // An empty one until the writer has sent a batch and handed it back.
        let batch = std::mem::replace(batch, self.spares.try_recv().unwrap_or_default());
        self.tx
            .blocking_send(ActorMsg::Transitions(batch))
            .map_err(|_| SinkClosed)?;
        if self.last_stats.elapsed() >= self.every {
            let stats = std::mem::take(&mut self.stats);
            self.tx
                .blocking_send(ActorMsg::Stats(stats))
                .map_err(|_| SinkClosed)?;
            self.last_stats = Instant::now();
        }
        Ok(())
    }

    fn episode(&mut self, stats: EpisodeStats) {
        self.status.episode(stats.episode_return);
        self.stats.episodes += 1;
        // Bounded: at most this many returns per report.
        if self.stats.episode_returns.len() < MAX_RETURNS_PER_STATS {
            self.stats.episode_returns.push(stats.episode_return);
        }
    }
}

/// Runs until `shutdown` turns true or the learner ends the run, reconnecting as
/// needed. Returns an error only when the learner refuses the actor for good (see
/// [`RefusalCode::is_permanent`]).
pub async fn run(
    cfg: RemoteConfig,
    mut shutdown: watch::Receiver<bool>,
) -> Result<Finished, RemoteError> {
    let mut backoff = cfg.backoff_initial;
    loop {
        let started = Instant::now();
        let end = session(&cfg, &mut shutdown).await;
        cfg.status.disconnected();
        let sent_away = matches!(end, End::SentAway(_));
        match end {
            End::Shutdown => return Ok(Finished::Stopped),
            End::RunFinished(message) => return Ok(Finished::RunFinished(message)),
            End::Refused(refusal) => return Err(RemoteError::Refused(refusal)),
            End::Failed(reason) => return Err(RemoteError::Actor(reason)),
            End::Incompatible(reason) => return Err(RemoteError::Incompatible(reason)),
            End::Lost(reason) | End::SentAway(reason) => {
                if sent_away || started.elapsed() > Duration::from_secs(10) {
                    backoff = cfg.backoff_initial;
                }
                let jitter = rand::rng().random_range(0.5..1.5);
                let wait = backoff.mul_f64(jitter);
                tracing::warn!("{reason}; reconnecting in {:.1} s", wait.as_secs_f64());
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = shutdown.changed() => return Ok(Finished::Stopped),
                }
                backoff = (backoff * 2).min(cfg.backoff_max);
            }
        }
    }
}

/// The shared token from `file` (trimmed), else from `MILLRACE_TOKEN`; `None` when
/// neither gives a non-empty one. Both binaries read it the same way.
pub fn read_token(file: Option<&std::path::Path>) -> std::io::Result<Option<String>> {
    let token = match file {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?
            .trim()
            .to_string(),
        None => std::env::var("MILLRACE_TOKEN").unwrap_or_default(),
    };
    Ok(Some(token).filter(|t| !t.is_empty()))
}

/// A session past its handshake: the learner proved it knows the token and welcomed
/// this actor.
struct Joined {
    rd: FrameReader<OwnedReadHalf>,
    wr: OwnedWriteHalf,
    seal: Seal,
    welcome: Box<Welcome>,
    /// The actor loop's configuration, from the welcome.
    acfg: ActorConfig,
}

async fn session(cfg: &RemoteConfig, shutdown: &mut watch::Receiver<bool>) -> End {
    let Joined {
        rd,
        wr,
        mut seal,
        welcome,
        acfg,
    } = match join(cfg, shutdown).await {
        Ok(j) => j,
        Err(end) => return end,
    };
    let mut rd = rd;
    // Parameters received and waiting for their seal.
    let mut pending = None;
    // The current parameters follow the welcome (a heartbeat may come first); the actor
    // starts once it has them.
    let latest = loop {
        let next = tokio::select! {
            m = tokio::time::timeout(cfg.handshake_timeout, rd.read_msg::<LearnerMsg>()) => m,
            _ = shutdown.changed() => return End::Shutdown,
        };
        let msg = match next {
            Ok(Ok(Some(m))) => m,
            _ => return End::Lost("no parameters after the welcome".into()),
        };
        match receive(msg, &mut seal, &mut pending) {
            Received::Params(p) => break Arc::new(ParamsCell::new(p)),
            Received::Nothing => continue,
            Received::End(end) => return end,
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel::<ActorMsg>(2);
    // Sent batches go back to the actor: as many as can be in flight, and one more.
    let (spare_tx, spares) = std::sync::mpsc::sync_channel::<TransitionBatch>(4);
    let sink = ChannelSink {
        tx: tx.clone(),
        spares,
        stats: ActorStats::default(),
        last_stats: Instant::now(),
        every: cfg.stats_every,
        status: Arc::clone(&cfg.status),
    };
    let mut actor = spawn_actor(acfg, &welcome, Arc::clone(&latest), Arc::clone(&stop), sink);
    // Batches are sized by the learner to fit the frames it reads from this session.
    let max_frame = usize::try_from(welcome.max_frame)
        .unwrap_or(usize::MAX)
        .min(millrace_proto::codec::MAX_FRAME_CEILING);
    let mut writer = tokio::spawn(send_all(wr, rx, spare_tx, max_frame));

    // From here the learner heartbeats: a link with no progress for `read_timeout` is
    // dead (progress, not whole frames: a large parameter frame may take a while).
    // A frame must also arrive whole at a minimum rate: a relay trickling bytes of one
    // cannot hold the session open either.
    let mut rd = rd
        .with_idle_timeout(cfg.read_timeout)
        .with_min_rate(MinRate {
            grace: cfg.read_timeout,
            bytes_per_s: 256 << 10,
        });
    let mut actor_result = None;
    let end = loop {
        tokio::select! {
            // What the learner said comes first: when it says goodbye and closes, the
            // writer fails too, and the goodbye (already read off the socket) must win.
            biased;
            // The learner sends a heartbeat every few seconds: silence means a dead link.
            // Cancel-safe: another branch winning mid-frame ends the session anyway.
            msg = rd.read_msg::<LearnerMsg>() => match msg {
                Ok(Some(msg)) => match receive(msg, &mut seal, &mut pending) {
                    Received::Params(p) => latest.publish(p),
                    Received::Nothing => {}
                    Received::End(end) => break end,
                },
                Ok(None) => break End::Lost("the learner closed the connection".into()),
                Err(e @ ReadError::Idle(_)) => break End::Lost(format!("the learner went quiet: {e}")),
                Err(ReadError::Io(e)) => break End::Lost(format!("connection to the learner lost: {e}")),
                Err(e) => break End::Lost(format!("bad data from the learner: {e}")),
            },
            // The write side failed (or the actor loop ended): this session is over.
            w = &mut writer => break End::Lost(match w {
                Ok(reason) if !reason.is_empty() => reason,
                _ => "the sending task ended".into(),
            }),
            a = &mut actor => {
                actor_result = Some(a);
                break End::Lost("the actor loop ended".into());
            }
            _ = shutdown.changed() => {
                let goodbye = ActorMsg::Goodbye(Goodbye {
                    reason: GoodbyeReason::ActorStopping,
                    message: "actor shutting down".into(),
                });
                let _ = tokio::time::timeout(Duration::from_secs(1), tx.send(goodbye)).await;
                break End::Shutdown;
            }
        }
    };
    stop.store(true, Ordering::Relaxed);
    drop(tx);
    // Let the writer flush (a goodbye), but never wait on a stalled socket for long:
    // aborting it drops its queue, which unblocks an actor thread stuck sending.
    if !writer.is_finished()
        && tokio::time::timeout(Duration::from_secs(1), &mut writer)
            .await
            .is_err()
    {
        writer.abort();
    }
    if matches!(end, End::Shutdown) {
        // Leaving: read what the learner still sends until it closes after our goodbye,
        // so that closing with unread data does not reset the connection under it.
        let drain = async { while let Ok(Some(_)) = rd.read_msg::<LearnerMsg>().await {} };
        let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
    }
    let result = match actor_result {
        Some(r) => r,
        None => actor.await,
    };
    match result {
        Ok(Err(e)) => End::Failed(e),
        Err(e) => End::Failed(format!("the actor thread panicked: {e}")),
        Ok(Ok(_)) => end,
    }
}

/// Connects and joins: the hello, the learner's challenge, this actor's proof, and the
/// welcome, sealed (the learner proves it knows the token too); how it ended, if it
/// did not.
async fn join(cfg: &RemoteConfig, shutdown: &mut watch::Receiver<bool>) -> Result<Joined, End> {
    let connected = tokio::select! {
        c = tokio::time::timeout(cfg.handshake_timeout, connect(&cfg.learner)) => c,
        _ = shutdown.changed() => return Err(End::Shutdown),
    };
    let stream = match connected {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(End::Lost(format!("cannot connect to {}: {e}", cfg.learner))),
        Err(_) => {
            return Err(End::Lost(format!(
                "connecting to {} timed out",
                cfg.learner
            )))
        }
    };
    let _ = stream.set_nodelay(true);
    let (rd, mut wr) = stream.into_split();
    let mut rd = FrameReader::new(rd, cfg.max_frame);
    let hello = Hello {
        protocol_version: PROTOCOL_VERSION,
        nonce: fresh_nonce(),
        actor_name: cfg.name.clone(),
        capabilities: Capabilities {
            envs: cfg.envs as u32,
            env_ids: env::capabilities(),
            // It can send initial priorities (its n-step TD errors).
            features: vec![millrace_proto::wire::FEATURE_PRIORITIES.into()],
        },
        agent: None,
    };
    let handshake_failed = |e: &dyn std::fmt::Display| End::Lost(format!("handshake failed: {e}"));
    let unexpected = |other: &LearnerMsg| {
        End::Lost(format!(
            "unexpected answer to the handshake: {}",
            other.kind()
        ))
    };
    write_msg(&mut wr, &ActorMsg::Hello(hello.clone()), cfg.max_frame)
        .await
        .map_err(|e| handshake_failed(&e))?;
    // The learner's challenge (or a typed refusal: another version, a flood).
    let challenge = match read_answer(cfg, &mut rd, shutdown).await? {
        LearnerMsg::Challenge(c) => c,
        LearnerMsg::Refused(r) => return Err(End::unsealed_refusal(r, Stage::Hello)),
        other => return Err(unexpected(&other)),
    };
    let token = cfg.token.as_bytes();
    let (proof, mut seal) = match (
        actor_proof(token, &hello, &challenge),
        Seal::for_session(token, &hello, &challenge),
    ) {
        (Ok(p), Ok(s)) => (p, s),
        (Err(e), _) | (_, Err(e)) => return Err(handshake_failed(&e)),
    };
    write_msg(&mut wr, &ActorMsg::Proof(proof), cfg.max_frame)
        .await
        .map_err(|e| handshake_failed(&e))?;
    // From here the learner proves it knows the token too: nothing unsealed is believed.
    let welcome = match read_answer(cfg, &mut rd, shutdown).await? {
        LearnerMsg::Sealed(s) => match seal.open(&s) {
            Ok(LearnerMsg::Welcome(w)) => w,
            Ok(LearnerMsg::Refused(r)) => return Err(End::refused(r)),
            Ok(LearnerMsg::Goodbye(g)) => return Err(End::goodbye(g)),
            Ok(other) => return Err(unexpected(&other)),
            Err(e) => return Err(End::forged(&e)),
        },
        // Before the learner has proved itself, only what any peer may say.
        LearnerMsg::Refused(r) => return Err(End::unsealed_refusal(r, Stage::Proof)),
        other => return Err(unexpected(&other)),
    };
    let acfg = actor_config(cfg, &welcome).map_err(End::Incompatible)?;
    // The learner's frames (its parameters first of all) may be as large as the limit it
    // announced for ours: a pixel network's parameters pass the handshake's 16 MiB.
    let read_limit = usize::try_from(welcome.max_frame)
        .unwrap_or(usize::MAX)
        .max(cfg.max_frame)
        .min(millrace_proto::codec::MAX_FRAME_CEILING);
    rd.set_max_frame(read_limit);
    cfg.status.connected();
    tracing::info!(
        "connected to {} (run {}): {} envs, exploration indices {}..={}, params version {}",
        cfg.learner,
        welcome.run_id,
        acfg.num_envs,
        welcome.env_indices.first().copied().unwrap_or(0),
        welcome.env_indices.last().copied().unwrap_or(0),
        welcome.params_version
    );
    Ok(Joined {
        rd,
        wr,
        seal,
        welcome,
        acfg,
    })
}

/// The session's writer: sends what the actor queues in `rx` (frames of at most
/// `max_frame`), handing each sent batch back through `spares`; the reason it stopped
/// early, or nothing once everything (a goodbye last) is sent.
async fn send_all(
    mut wr: OwnedWriteHalf,
    mut rx: mpsc::Receiver<ActorMsg>,
    spares: std::sync::mpsc::SyncSender<TransitionBatch>,
    max_frame: usize,
) -> String {
    while let Some(msg) = rx.recv().await {
        if let Err(e) = write_msg(&mut wr, &msg, max_frame).await {
            return format!("sending to the learner failed: {e}");
        }
        if let ActorMsg::Transitions(batch) = msg {
            // Never waits: with the actor's spares full, this one is dropped.
            let _ = spares.try_send(batch);
        }
    }
    // Everything is sent (a goodbye last): the learner sees the end of the stream.
    let _ = tokio::io::AsyncWriteExt::shutdown(&mut wr).await;
    String::new()
}

/// The actor loop on a blocking thread, once the environment it builds matches the
/// learner's: it acts with `latest` and sends through `sink` until `stop`.
fn spawn_actor(
    acfg: ActorConfig,
    welcome: &Welcome,
    mut latest: Arc<ParamsCell>,
    stop: Arc<AtomicBool>,
    mut sink: ChannelSink,
) -> tokio::task::JoinHandle<Result<u64, String>> {
    let (expected, network) = (welcome.env.clone(), welcome.network.clone());
    tokio::task::spawn_blocking(move || -> Result<u64, String> {
        // A bridged environment's spaces are known once it is built.
        let built = env::spec_of(&acfg.env).map_err(|e| e.to_string())?;
        if built != expected {
            return Err(format!(
                "this actor's {} differs from the learner's: {built:?} vs {expected:?}",
                expected.id
            ));
        }
        // This process's own view of the run's step count, raised to the learner's
        // with every parameter snapshot (it drives the exploration schedule).
        let steps = StepCounter::default();
        run_actor(&acfg, &network, &mut latest, &mut sink, &steps, &stop).map_err(|e| e.to_string())
    })
}

/// Reads the learner's next handshake message, within the handshake timeout.
async fn read_answer(
    cfg: &RemoteConfig,
    rd: &mut FrameReader<tokio::net::tcp::OwnedReadHalf>,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<LearnerMsg, End> {
    let answer = tokio::select! {
        a = tokio::time::timeout(cfg.handshake_timeout, rd.read_msg::<LearnerMsg>()) => a,
        _ = shutdown.changed() => return Err(End::Shutdown),
    };
    match answer {
        Err(_) => Err(End::Lost("the learner did not answer the handshake".into())),
        Ok(Err(e)) => Err(End::Lost(format!("handshake failed: {e}"))),
        Ok(Ok(None)) => Err(End::Lost(
            "the learner closed the connection during the handshake".into(),
        )),
        Ok(Ok(Some(m))) => Ok(m),
    }
}

/// What a message from an authenticated learner means for the session.
enum Received {
    /// Parameters whose seal held.
    Params(millrace_proto::Params),
    /// A heartbeat, or parameters waiting for their seal.
    Nothing,
    End(End),
}

/// Handles one message after the welcome: parameters count only once their seal holds,
/// and a goodbye or refusal only sealed.
fn receive(
    msg: LearnerMsg,
    seal: &mut Seal,
    pending: &mut Option<millrace_proto::Params>,
) -> Received {
    if pending.is_some() && !matches!(msg, LearnerMsg::ParamsSeal(_)) {
        return Received::End(End::Lost(
            "protocol error: parameters without their seal".into(),
        ));
    }
    match msg {
        LearnerMsg::Params(p) => {
            *pending = Some(p);
            Received::Nothing
        }
        LearnerMsg::ParamsSeal(tag) => match pending.take() {
            Some(p) => match seal.open_params(&p, &tag) {
                Ok(()) => Received::Params(p),
                Err(e) => Received::End(End::forged(&e)),
            },
            None => Received::End(End::Lost(
                "protocol error: a seal without parameters".into(),
            )),
        },
        LearnerMsg::Sealed(s) => match seal.open(&s) {
            // Sealed, so a relay cannot keep a dead link looking alive.
            Ok(LearnerMsg::Heartbeat) => Received::Nothing,
            Ok(LearnerMsg::Refused(r)) => Received::End(End::refused(r)),
            Ok(LearnerMsg::Goodbye(g)) => Received::End(End::goodbye(g)),
            Ok(other) => Received::End(End::Lost(format!(
                "protocol error: a sealed {} after the welcome",
                other.kind()
            ))),
            Err(e) => Received::End(End::forged(&e)),
        },
        other => Received::End(End::Lost(format!(
            "protocol error: an unsealed {} after the welcome",
            other.kind()
        ))),
    }
}

async fn connect(learner: &str) -> std::io::Result<TcpStream> {
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
    for addr in tokio::net::lookup_host(learner).await? {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        socket.set_send_buffer_size(SOCKET_BUFFER_BYTES)?;
        match socket.connect(addr).await {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// The actor's configuration, all from the learner's [`Welcome`].
fn actor_config(cfg: &RemoteConfig, w: &Welcome) -> Result<ActorConfig, Incompatible> {
    // Before anything is built: a learner decides the environment, not what this
    // process imports.
    millrace_proto::env::check_modules_allowed(
        &w.env_config,
        &cfg.allowed_modules,
        "--allow-env-module",
    )?;
    if w.env_config.id != w.env.id {
        return Err(Incompatible::TwoEnvironments(
            w.env.id.clone(),
            w.env_config.id.clone(),
        ));
    }
    if w.env_config.family() == Family::Native {
        if env::spec_of(&w.env_config)? != w.env {
            return Err(Incompatible::PortDiffers(w.env.id.clone()));
        }
    } else if !supported(&env::capabilities(), &w.env.id) {
        return Err(env::EnvError::NoBridge(w.env.id.clone()).into());
    }
    w.network.validate()?;
    if w.env_indices.is_empty() || w.env_indices.len() != w.epsilons.len() {
        return Err(Incompatible::NoIndices);
    }
    Ok(ActorConfig {
        actor_id: w.env_indices[0],
        env: w.env_config.clone(),
        num_envs: w.env_indices.len(),
        seed: crate::derive_seed(cfg.seed, u64::from(w.env_indices[0])),
        n_step: w.n_step.max(1) as usize,
        gamma: w.gamma,
        batch_rows: w.batch_rows.max(1) as usize,
        // The run's decaying schedule on the learner's env steps, or Ape-X's fixed ε.
        epsilon: match w.epsilon_decay {
            Some(d) => EpsilonSchedule::Linear {
                start: d.start,
                end: d.end,
                steps: d.steps,
            },
            None => EpsilonSchedule::Constant(w.epsilons[0]),
        },
        env_epsilons: w.epsilon_decay.is_none().then(|| w.epsilons.clone()),
        clip_rewards: w.clip_rewards,
        initial_priorities: w
            .features
            .iter()
            .any(|f| f == millrace_proto::wire::FEATURE_PRIORITIES),
        // The learner screens against its own bounds (which may be raised past the
        // defaults); refusing here what it would accept would lose data.
        value_bounds: millrace_proto::ValueBounds::FINITE,
    })
}
