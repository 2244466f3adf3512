//! The remote actor: connects to a learner, hands shakes, runs the actor loop on its own
//! thread and streams transitions; reconnects with exponential backoff and jitter when
//! the learner goes away, and continues with the newest parameters it is sent.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use millrace_proto::codec::DEFAULT_MAX_FRAME;
use millrace_proto::io::{read_msg, write_msg, ReadError};
use millrace_proto::wire::{
    ActorMsg, ActorStats, Capabilities, Hello, LearnerMsg, Welcome, PROTOCOL_VERSION,
};
use millrace_proto::TransitionBatch;
use rand::Rng;
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{mpsc, watch};

use crate::env;
use crate::params::{ParamsSlot, SlotReader};
use crate::policy::MlpPolicy;
use crate::runner::{run_actor, ActorConfig, ActorControl, ActorSink, EpisodeStats, SinkClosed};
use crate::schedule::EpsilonSchedule;

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
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("the learner refused this actor: {0}")]
    Refused(String),
}

/// How a session with the learner ended.
#[derive(Debug)]
enum End {
    /// We were asked to stop.
    Shutdown,
    /// The learner refused us for a reason that retrying cannot fix.
    Refused(String),
    /// Connection lost or never made; worth retrying.
    Lost(String),
}

/// Actor output that becomes messages on the connection; blocks when the connection's
/// queue is full, which is how the learner's backpressure reaches the actor loop.
struct ChannelSink {
    tx: mpsc::Sender<ActorMsg>,
    stats: ActorStats,
    last_stats: Instant,
    every: Duration,
}

impl ActorSink for ChannelSink {
    fn transitions(&mut self, batch: TransitionBatch) -> Result<(), SinkClosed> {
        self.stats.env_steps += batch.len() as u64;
        self.stats.params_version = batch.version;
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
        self.stats.episodes += 1;
        // Bounded: at most this many returns per report.
        if self.stats.episode_returns.len() < 4096 {
            self.stats.episode_returns.push(stats.episode_return);
        }
    }
}

/// Runs until `shutdown` turns true, reconnecting as needed. Returns an error only when
/// the learner refuses the actor for good (wrong token, incompatible protocol).
pub async fn run(
    cfg: RemoteConfig,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), RemoteError> {
    let mut backoff = cfg.backoff_initial;
    loop {
        let started = Instant::now();
        match session(&cfg, &mut shutdown).await {
            End::Shutdown => return Ok(()),
            End::Refused(reason) => return Err(RemoteError::Refused(reason)),
            End::Lost(reason) => {
                if started.elapsed() > Duration::from_secs(10) {
                    backoff = cfg.backoff_initial;
                }
                let jitter = rand::rng().random_range(0.5..1.5);
                let wait = backoff.mul_f64(jitter);
                tracing::warn!("{reason}; reconnecting in {:.1} s", wait.as_secs_f64());
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = shutdown.changed() => return Ok(()),
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

/// Refusals that retrying cannot fix (the server's reasons, see `learner::server`).
fn refused_for_good(reason: &str) -> bool {
    [
        "token",
        "protocol version",
        "environments requested",
        "cannot run",
    ]
    .iter()
    .any(|r| reason.contains(r))
}

async fn session(cfg: &RemoteConfig, shutdown: &mut watch::Receiver<bool>) -> End {
    let connected = tokio::select! {
        c = tokio::time::timeout(cfg.handshake_timeout, connect(&cfg.learner)) => c,
        _ = shutdown.changed() => return End::Shutdown,
    };
    let stream = match connected {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return End::Lost(format!("cannot connect to {}: {e}", cfg.learner)),
        Err(_) => return End::Lost(format!("connecting to {} timed out", cfg.learner)),
    };
    let _ = stream.set_nodelay(true);
    let (mut rd, mut wr) = stream.into_split();
    let hello = ActorMsg::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        token: cfg.token.clone(),
        actor_name: cfg.name.clone(),
        capabilities: Capabilities {
            envs: cfg.envs as u32,
            env_ids: env::KNOWN_IDS.iter().map(|s| s.to_string()).collect(),
        },
    });
    if let Err(e) = write_msg(&mut wr, &hello, cfg.max_frame).await {
        return End::Lost(format!("handshake failed: {e}"));
    }
    let answer = tokio::time::timeout(
        cfg.handshake_timeout,
        read_msg::<LearnerMsg, _>(&mut rd, cfg.max_frame),
    )
    .await;
    let welcome = match answer {
        Err(_) => return End::Lost("the learner did not answer the handshake".into()),
        Ok(Err(e)) => return End::Lost(format!("handshake failed: {e}")),
        Ok(Ok(None)) => {
            return End::Lost("the learner closed the connection during the handshake".into())
        }
        Ok(Ok(Some(LearnerMsg::Welcome(w)))) => w,
        Ok(Ok(Some(LearnerMsg::Error { reason }))) if refused_for_good(&reason) => {
            return End::Refused(reason)
        }
        Ok(Ok(Some(other))) => {
            return End::Lost(format!("unexpected answer to the handshake: {other:?}"))
        }
    };
    let acfg = match actor_config(cfg, &welcome) {
        Ok(c) => c,
        Err(reason) => return End::Refused(reason),
    };
    tracing::info!(
        "connected to {} (run {}): {} envs in slots {}..={}, params version {}",
        cfg.learner,
        welcome.run_id,
        acfg.num_envs,
        welcome.slots.first().copied().unwrap_or(0),
        welcome.slots.last().copied().unwrap_or(0),
        welcome.params_version
    );

    // The current parameters follow the welcome (a heartbeat may come first); the actor
    // starts once it has them.
    let latest = loop {
        let next = tokio::select! {
            m = tokio::time::timeout(cfg.handshake_timeout, read_msg::<LearnerMsg, _>(&mut rd, cfg.max_frame)) => m,
            _ = shutdown.changed() => return End::Shutdown,
        };
        match next {
            Ok(Ok(Some(LearnerMsg::Params(p)))) => break Arc::new(ParamsSlot::new(p)),
            Ok(Ok(Some(LearnerMsg::Heartbeat))) => continue,
            _ => return End::Lost("no parameters after the welcome".into()),
        }
    };
    let control = Arc::new(ActorControl::default());
    let (tx, mut rx) = mpsc::channel::<ActorMsg>(2);
    let mut actor = {
        let (latest, control, network) = (
            Arc::clone(&latest),
            Arc::clone(&control),
            welcome.network.clone(),
        );
        let mut sink = ChannelSink {
            tx: tx.clone(),
            stats: ActorStats::default(),
            last_stats: Instant::now(),
            every: cfg.stats_every,
        };
        tokio::task::spawn_blocking(move || -> Result<u64, String> {
            let mut policy = MlpPolicy::new(network, 0).map_err(|e| e.to_string())?;
            run_actor(
                &acfg,
                &mut policy,
                &mut SlotReader(latest),
                &mut sink,
                &control,
            )
            .map_err(|e| e.to_string())
        })
    };
    let max_frame = cfg.max_frame;
    let mut writer = tokio::spawn(async move {
        while let Some(msg) = rx.recv().await {
            if let Err(e) = write_msg(&mut wr, &msg, max_frame).await {
                return format!("sending to the learner failed: {e}");
            }
        }
        String::new()
    });

    let mut actor_result = None;
    let end = loop {
        tokio::select! {
            // The learner sends a heartbeat every few seconds: silence means a dead link.
            msg = tokio::time::timeout(cfg.read_timeout, read_msg::<LearnerMsg, _>(&mut rd, cfg.max_frame)) => match msg {
                Err(_) => break End::Lost(format!("nothing from the learner for {:?}", cfg.read_timeout)),
                Ok(msg) => match msg {
                Ok(Some(LearnerMsg::Params(p))) => latest.publish(p),
                Ok(Some(LearnerMsg::Heartbeat)) => {}
                Ok(Some(LearnerMsg::Welcome(_))) => break End::Lost("protocol error: a second welcome".into()),
                Ok(Some(LearnerMsg::Error { reason })) => break End::Lost(format!("the learner closed the session: {reason}")),
                Ok(Some(LearnerMsg::Goodbye { reason })) => break End::Lost(format!("the learner said goodbye: {reason}")),
                Ok(None) => break End::Lost("the learner closed the connection".into()),
                Err(ReadError::Io(e)) => break End::Lost(format!("connection to the learner lost: {e}")),
                Err(e) => break End::Lost(format!("bad data from the learner: {e}")),
            }},
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
                let goodbye = ActorMsg::Goodbye { reason: "actor shutting down".into() };
                let _ = tokio::time::timeout(Duration::from_secs(1), tx.send(goodbye)).await;
                break End::Shutdown;
            }
        }
    };
    control.stop.store(true, Ordering::Relaxed);
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
    let result = match actor_result {
        Some(r) => r,
        None => actor.await,
    };
    match result {
        Ok(Err(e)) => tracing::error!("actor loop failed: {e}"),
        Err(e) => tracing::error!("actor thread panicked: {e}"),
        Ok(Ok(_)) => {}
    }
    end
}

/// Bytes of socket send buffer. Kept small on purpose: the kernel's autotuned buffers
/// hold megabytes, i.e. tens of thousands of transitions generated with old parameters
/// that the learner would take seconds to drain; backpressure should reach the actor
/// loop instead.
pub const SOCKET_BUFFER_BYTES: u32 = 16 << 10;

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
fn actor_config(cfg: &RemoteConfig, w: &Welcome) -> Result<ActorConfig, String> {
    let local = env::spec(&w.env.id).map_err(|e| e.to_string())?;
    if local != w.env {
        return Err(format!(
            "the learner's {} differs from this actor's port",
            w.env.id
        ));
    }
    if w.slots.is_empty() || w.slots.len() != w.epsilons.len() {
        return Err("the learner handed out no slots".into());
    }
    Ok(ActorConfig {
        actor_id: w.slots[0],
        env_id: w.env.id.clone(),
        num_envs: w.slots.len(),
        seed: crate::derive_seed(cfg.seed, u64::from(w.slots[0])),
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
    })
}
