//! One actor connection: the handshake, then transitions into replay and statistics in,
//! parameters and heartbeats out, until either side ends it.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use millrace_proto::auth::Seal;
use millrace_proto::batch::Overshoot;
use millrace_proto::exploration::apex_epsilon;
use millrace_proto::io::{write_frame, write_msg, FrameReader, MinRate, ReadError};
use millrace_proto::peer_text::{peer_text, MAX_NAME_CHARS, MAX_REASON_CHARS};
use millrace_proto::wire::{
    ActorMsg, Goodbye, GoodbyeReason, Hello, LearnerMsg, Refusal, RefusalCode, Welcome,
    MAX_RETURNS_PER_STATS,
};
use millrace_proto::EpisodeStats;
use millrace_replay::ReplayError;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// Bytes of a transition frame that are not rows: the header, the batch's scalar fields
/// and the columns' length prefixes, with room to spare.
const FRAME_HEADROOM: u64 = 64 << 10;
/// Transitions of one session evicted from replay as poison after which the actor is
/// refused (`ProtocolViolation`): a few are an environment's bad moment, this many a
/// source of bad data.
pub(super) const MAX_EVICTED_PER_SESSION: u64 = 64;
use tokio::sync::{watch, OwnedSemaphorePermit};

use super::handshake::authenticate;
use super::{ActorEntry, ParamsFrame, Shared, StopSignal, HANDSHAKE_MAX_FRAME, MAX_ENVS_PER_ACTOR};

pub(super) struct Connection {
    /// Its place among the handshakes in flight, given back once the peer has proved the
    /// token (or the connection ends).
    pub(super) handshake_place: std::sync::Mutex<Option<HandshakePlace>>,
    pub(super) shared: Arc<Shared>,
    pub(super) frames: watch::Receiver<Option<Arc<ParamsFrame>>>,
    pub(super) stop: StopSignal,
    pub(super) peer: SocketAddr,
}

/// A connection's place among the handshakes in flight: one of all and one of its
/// source's ([`super::sources`]), both given back when dropped.
#[derive(Debug)]
pub(super) struct HandshakePlace {
    pub(super) _global: tokio::sync::OwnedSemaphorePermit,
    pub(super) _source: super::sources::SourcePlace,
}

/// Marks, when a connection ends, that its actor may be reconnecting (the server's last
/// call, [`super::ServerConfig::last_call`]): when it ends while the server is not stopping, and
/// whenever its actor was told to come back (a goodbye for now, a temporary refusal),
/// even if the server stopped meanwhile: a population's agent that ended a moment
/// before the run did sends its actors on, and they must find someone to tell them the
/// run is over.
struct MarkAway<'a> {
    conn: &'a Connection,
    /// The actor was told to come back, or was told nothing it could act on.
    sent_on: bool,
}

impl Drop for MarkAway<'_> {
    fn drop(&mut self) {
        if self.sent_on || self.conn.stop.borrow().is_none() {
            self.conn.shared.mark_away();
        }
    }
}

/// How a session ended.
enum Outcome {
    /// The actor left, or the connection broke: nothing to send.
    Closed(String),
    /// The actor did something wrong or went quiet: tell it why (and whether to retry).
    Refused(Refusal),
    /// The learner is stopping: say goodbye.
    Goodbye(Goodbye),
}

/// The longest a closing connection waits to deliver its last word (a refusal or a
/// goodbye).
const GOODBYE_WAIT: Duration = Duration::from_secs(5);

/// The longest a connection takes to close once the server stops: its writer's last
/// frame, its last word and the peer's close, each waited for at most
/// [`GOODBYE_WAIT`], and a second for the rest.
pub(super) const CLOSE_WITHIN: Duration = Duration::from_secs(3 * GOODBYE_WAIT.as_secs() + 1);

/// Ends a connection after its last word without losing that word: closing a socket
/// that still has unread data from the peer makes the kernel send a reset, and a reset
/// can discard our last message before the peer reads it (an actor that misses "the run
/// is finished" would retry forever). So: shut the write side (the peer sees the end
/// after the message), then read and drop what the peer still sends until it closes
/// too, for a few seconds at most.
pub(super) async fn close_gracefully(mut wr: OwnedWriteHalf, mut rd: OwnedReadHalf) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = wr.shutdown().await;
    let drain = async {
        let mut sink = vec![0u8; 64 << 10];
        while matches!(rd.read(&mut sink).await, Ok(n) if n > 0) {}
    };
    let _ = tokio::time::timeout(GOODBYE_WAIT, drain).await;
}

fn violation(message: impl Into<String>) -> Refusal {
    Refusal::new(RefusalCode::ProtocolViolation, message)
}

/// Where a session's transitions go and its parameters come from, as the handshake
/// settled it.
struct SessionRoute {
    route: super::Route,
    frames: watch::Receiver<Option<Arc<ParamsFrame>>>,
    /// A population's agent: its port (for its actor count), and whether it ended.
    port: Option<Arc<super::ports::AgentPort>>,
    ended: Option<watch::Receiver<bool>>,
}

impl Drop for SessionRoute {
    fn drop(&mut self) {
        if let Some(port) = &self.port {
            super::AgentPorts::leave(port);
        }
    }
}

/// Who a session's transitions come from, as the handshake settled it.
#[derive(Clone, Debug)]
struct Session {
    /// The actor's id (its first exploration index).
    id: u32,
    /// What its batches are known by in replay: unique to the session.
    stream: u32,
    agent: u32,
    envs: usize,
    n_step: u32,
    /// Transitions per batch the welcome asked for.
    batch_rows: u32,
    /// What the actor calls itself (for the log).
    name: String,
}

/// The agent a session serves and what its actor needs to know of it.
struct Terms {
    agent: u32,
    route: SessionRoute,
    network: millrace_proto::NetworkSpec,
    n_step: u32,
    gamma: f32,
    epsilon_decay: Option<millrace_proto::wire::EpsilonDecay>,
}

impl Connection {
    pub(super) async fn run(self, stream: TcpStream) {
        let mut away = MarkAway {
            conn: &self,
            sent_on: false,
        };
        let _ = stream.set_nodelay(true);
        let (rd, mut wr) = stream.into_split();
        let mut rd = FrameReader::new(rd, HANDSHAKE_MAX_FRAME);
        let peer = self.peer;
        let (hello, welcome, route, _session_place, mut seal) =
            match self.handshake(&mut rd, &mut wr).await {
                Ok(w) => w,
                Err((refusal, seal)) => {
                    self.refuse(wr, rd.into_inner(), refusal, seal, &mut away.sent_on)
                        .await;
                    return;
                }
            };
        let cfg = &self.shared.cfg;
        let (id, agent, n_step, batch_rows) = (
            welcome.env_indices[0],
            welcome.agent,
            welcome.n_step,
            welcome.batch_rows,
        );
        let indices = welcome.env_indices.clone();
        tracing::info!(
            "{peer}: actor {:?} joined for agent {agent} with {} envs (exploration indices {}..={})",
            hello.actor_name,
            indices.len(),
            id,
            indices.last().copied().unwrap_or(id)
        );
        // Counted as connected from the welcome on (before the actor can see it).
        self.shared.ctx.board.join(
            id,
            ActorEntry {
                name: hello.actor_name.clone(),
                peer: peer.to_string(),
                envs: indices.len(),
                ..ActorEntry::default()
            },
        );
        let written = match seal.seal(&LearnerMsg::Welcome(Box::new(welcome))) {
            Ok(msg) => write_msg(&mut wr, &msg, cfg.max_frame).await,
            Err(e) => Err(ReadError::Codec(e)),
        };
        if let Err(e) = written {
            tracing::warn!("{peer}: closed during the handshake: {e}");
            self.shared.ctx.board.leave(id);
            self.shared.indices.give_back(&indices);
            return;
        }
        // Authenticated: the session's frame limit, charged to the shared budget, and a
        // peer that sends nothing for the idle timeout is closed.
        rd.set_max_frame(cfg.max_frame);
        let mut rd = rd
            .with_budget(Arc::clone(&self.shared.budget))
            .with_idle_timeout(cfg.idle_timeout)
            .with_min_rate(MinRate {
                grace: cfg.frame_grace,
                bytes_per_s: cfg.min_frame_rate,
            });
        // The writer stops when the reader does (the reader also watches shutdown).
        let (close_tx, close_rx) = watch::channel(false);
        let writer = tokio::spawn(send_loop(
            wr,
            seal,
            route.frames.clone(),
            close_rx,
            cfg.heartbeat_every,
            cfg.write_timeout,
        ));
        let mut received = 0;
        let session = Session {
            id,
            stream: super::remote_stream(self.shared.sessions.fetch_add(1, Ordering::Relaxed)),
            agent,
            envs: indices.len(),
            n_step,
            batch_rows,
            name: hello.actor_name.clone(),
        };
        let stream = session.stream;
        let outcome = self.session(&mut rd, session, &route, &mut received).await;
        route.route.table.forget_evicted(stream);
        drop(route);
        self.shared.ctx.board.leave(id);
        self.shared.indices.give_back(&indices);
        let _ = close_tx.send(true);
        // Take the write half back to send the reason, unless the peer stalled it: the
        // writer finishes the frame in flight first (a goodbye decides whether the actor
        // exits or retries, so it is worth a few seconds on a loaded machine).
        let mut writer = writer;
        let wait = cfg.write_timeout.min(GOODBYE_WAIT);
        let wr = match tokio::time::timeout(wait, &mut writer).await {
            Ok(Ok(w)) => w,
            _ => {
                writer.abort();
                None
            }
        };
        let name = &hello.actor_name;
        self.last_word(
            outcome,
            wr,
            rd.into_inner(),
            name,
            received,
            &mut away.sent_on,
        )
        .await;
    }

    /// Refuses a handshake, sealed once the actor has proved the token (it acts on
    /// nothing else); `sent_on` says whether the actor is sent on (told to retry, or not
    /// told), set as soon as that is known.
    async fn refuse(
        &self,
        mut wr: OwnedWriteHalf,
        rd: OwnedReadHalf,
        refusal: Refusal,
        seal: Option<Seal>,
        sent_on: &mut bool,
    ) {
        let peer = self.peer;
        tracing::warn!("{peer}: refused: {refusal}");
        let retry = !refusal.code.is_permanent();
        let msg = LearnerMsg::Refused(refusal);
        let sent = match seal {
            Some(mut seal) => match seal.seal(&msg) {
                Ok(sealed) => self.send(&mut wr, &sealed).await,
                Err(_) => false,
            },
            None => self.send(&mut wr, &msg).await,
        };
        // Unheard, the actor retries as after a lost connection.
        *sent_on = retry || !sent;
        if sent {
            close_gracefully(wr, rd).await;
        }
    }

    /// The session's last word to actor `name`, by how it ended, on the write half the
    /// writer gave back (`None`: it stalled); `sent_on` says whether the actor is sent on
    /// (told to retry, or not told), set before anything is awaited.
    async fn last_word(
        &self,
        outcome: Outcome,
        wr: Option<(OwnedWriteHalf, Seal)>,
        rd: OwnedReadHalf,
        name: &str,
        received: u64,
        sent_on: &mut bool,
    ) {
        let peer = self.peer;
        let msg = match outcome {
            Outcome::Closed(reason) => {
                tracing::info!(
                    "{peer}: actor {name:?} left: {reason} ({received} transitions received)"
                );
                return;
            }
            Outcome::Refused(refusal) => {
                tracing::warn!(
                    "{peer}: closing actor {name:?}: {refusal} ({received} transitions received)"
                );
                *sent_on = !refusal.code.is_permanent();
                LearnerMsg::Refused(refusal)
            }
            Outcome::Goodbye(goodbye) => {
                *sent_on = !matches!(goodbye.reason, GoodbyeReason::RunFinished);
                LearnerMsg::Goodbye(goodbye)
            }
        };
        let sent = match wr {
            Some((mut wr, mut seal)) => {
                let sent = match seal.seal(&msg) {
                    Ok(sealed) => self.send(&mut wr, &sealed).await,
                    Err(_) => false,
                };
                if sent {
                    close_gracefully(wr, rd).await;
                }
                sent
            }
            None => false,
        };
        // An actor that did not hear its last word retries as after a lost connection:
        // if the run is over, someone must be there to tell it.
        *sent_on |= !sent;
        if let LearnerMsg::Goodbye(g) = &msg {
            if sent {
                tracing::info!(
                    "{peer}: actor {name:?} told {:?} ({received} transitions received)",
                    g.reason
                );
            } else {
                tracing::warn!(
                    "{peer}: actor {name:?} could not be told {:?}: its link stalled ({received} transitions received)",
                    g.reason
                );
            }
        }
    }

    /// Writes `msg`, giving up after a few seconds; whether it went out.
    async fn send(&self, wr: &mut OwnedWriteHalf, msg: &LearnerMsg) -> bool {
        matches!(
            tokio::time::timeout(GOODBYE_WAIT, write_msg(wr, msg, self.shared.cfg.max_frame)).await,
            Ok(Ok(()))
        )
    }

    /// The handshake: authentication, then what the actor is welcomed to. A refusal
    /// comes with the session's seal once the actor has proved the token.
    #[allow(clippy::type_complexity)]
    async fn handshake(
        &self,
        rd: &mut FrameReader<OwnedReadHalf>,
        wr: &mut OwnedWriteHalf,
    ) -> Result<(Hello, Welcome, SessionRoute, OwnedSemaphorePermit, Seal), (Refusal, Option<Seal>)>
    {
        let cfg = &self.shared.cfg;
        let now = tokio::time::Instant::now();
        let deadlines = (now + cfg.hello_timeout, now + cfg.handshake_timeout);
        let authenticated = match authenticate(rd, wr, cfg.token.as_deref(), deadlines).await {
            Ok(a) => a,
            Err(failed) => {
                if failed.wrong_token {
                    // Guessing costs time: the wait grows with this address's recent
                    // failures (and holds one of the few handshake places meanwhile).
                    let wait = self
                        .shared
                        .auth_failures
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .failed(self.peer.ip(), Instant::now());
                    tokio::time::sleep(wait).await;
                }
                return Err((failed.refusal, None));
            }
        };
        let seal = authenticated.seal;
        let mut hello = authenticated.hello;
        // A name is a log field and a label value: bounded and escaped before anything
        // uses it.
        hello.actor_name = peer_text(&hello.actor_name, MAX_NAME_CHARS);
        match self.welcome(hello).await {
            Ok((hello, welcome, route, place)) => Ok((hello, welcome, route, place, seal)),
            Err(refusal) => Err((refusal, Some(seal))),
        }
    }

    /// What an authenticated actor is welcomed to, or why it is refused.
    async fn welcome(
        &self,
        hello: Hello,
    ) -> Result<(Hello, Welcome, SessionRoute, OwnedSemaphorePermit), Refusal> {
        let cfg = &self.shared.cfg;
        let ctx = &self.shared.ctx;
        // Authenticated: it takes a session's place, and gives its handshake place to
        // the next peer.
        let session_place = Arc::clone(&self.shared.session_places)
            .try_acquire_owned()
            .map_err(|_| {
                Refusal::new(
                    RefusalCode::TooManyConnections,
                    format!("the learner has {} connections open", cfg.max_connections),
                )
            })?;
        self.handshake_place
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if self.stop.borrow().is_some() {
            return Err(Refusal::new(
                RefusalCode::NotReady,
                "the learner is stopping",
            ));
        }
        if !millrace_proto::env::supported(&hello.capabilities.env_ids, &ctx.env.id) {
            return Err(Refusal::new(
                RefusalCode::EnvUnsupported,
                format!("this run trains {}, which the actor cannot run", ctx.env.id),
            ));
        }
        // The agent this actor serves, and what it needs to know of it.
        let Terms {
            agent,
            route,
            network,
            n_step,
            gamma,
            epsilon_decay,
        } = self.terms(&hello)?;
        let envs = hello.capabilities.envs;
        if envs == 0 || envs > MAX_ENVS_PER_ACTOR {
            return Err(Refusal::new(
                RefusalCode::BadRequest,
                format!("{envs} environments requested (1..={MAX_ENVS_PER_ACTOR} allowed)"),
            ));
        }
        let batch_rows = self.batch_rows_for(envs, n_step, &route.route.table)?;
        let (indices, total) = self.shared.indices.take(envs).ok_or_else(|| {
            Refusal::new(
                RefusalCode::TooManyConnections,
                "the learner has handed out all its exploration indices",
            )
        })?;
        let epsilons = indices
            .iter()
            .map(|&i| apex_epsilon(i, total, cfg.eps_base, cfg.eps_alpha))
            .collect();
        let welcome = Welcome {
            run_id: ctx.run_id.clone(),
            env: ctx.env.clone(),
            env_config: ctx.env_config.clone(),
            clip_rewards: ctx.clip_rewards,
            network,
            agent,
            params_version: route.route.params.version(),
            env_indices: indices,
            epsilons,
            epsilon_decay,
            n_step,
            gamma,
            batch_rows,
            // Initial priorities, where replay is prioritized and the actor sends them.
            features: if route.route.table.prioritized()
                && hello
                    .capabilities
                    .features
                    .iter()
                    .any(|f| f == millrace_proto::wire::FEATURE_PRIORITIES)
            {
                vec![millrace_proto::wire::FEATURE_PRIORITIES.to_string()]
            } else {
                Vec::new()
            },
            max_frame: cfg.max_frame as u64,
        };
        Ok((hello, welcome, route, session_place))
    }

    /// The agent an actor serves (the one it asks for, or one the population assigns)
    /// and what it needs to know of it; why not, if it cannot serve one.
    fn terms(&self, hello: &Hello) -> Result<Terms, Refusal> {
        let cfg = &self.shared.cfg;
        let ctx = &self.shared.ctx;
        Ok(match &ctx.routes {
            super::Routes::One(route) => {
                let population = ctx.network.population as u32;
                let agent = hello.agent.unwrap_or(0);
                if agent >= population {
                    return Err(Refusal::new(
                        RefusalCode::BadRequest,
                        format!(
                            "agent {agent} asked for, but this run trains {population} agent(s)"
                        ),
                    ));
                }
                let route = SessionRoute {
                    route: route.clone(),
                    frames: self.frames.clone(),
                    port: None,
                    ended: None,
                };
                let decay = cfg.epsilon_decay.filter(|_| !cfg.apex_epsilon);
                Terms {
                    agent,
                    route,
                    network: ctx.network.clone(),
                    n_step: cfg.n_step,
                    gamma: cfg.gamma,
                    epsilon_decay: decay,
                }
            }
            super::Routes::Agents(ports) => {
                // Not there now (ended, or not started): worth retrying.
                let (agent, port) = ports.assign(hello.agent).map_err(|why| match why {
                    super::ports::Unavailable::NotNow(why) => {
                        Refusal::new(RefusalCode::NotReady, why)
                    }
                    super::ports::Unavailable::Never(why) => {
                        Refusal::new(RefusalCode::BadRequest, why)
                    }
                })?;
                let spec = &port.spec;
                let decay = spec.epsilon_decay.filter(|_| !cfg.apex_epsilon);
                let route = SessionRoute {
                    route: spec.route.clone(),
                    frames: port.frames.subscribe(),
                    ended: Some(port.ended.subscribe()),
                    port: Some(Arc::clone(&port)),
                };
                Terms {
                    agent,
                    route,
                    network: spec.network.clone(),
                    n_step: spec.n_step,
                    gamma: spec.gamma,
                    epsilon_decay: decay,
                }
            }
        })
    }

    /// Transitions per batch for an actor of `envs` environments building `n_step`
    /// returns (see [`super::ServerConfig::batch_rows`]), or why `table` cannot take
    /// its batches.
    fn batch_rows_for(
        &self,
        envs: u32,
        n_step: u32,
        table: &millrace_replay::Table,
    ) -> Result<u32, Refusal> {
        let cfg = &self.shared.cfg;
        let envs = u64::from(envs);
        let (rows, ref_envs) = (
            u64::from(cfg.batch_rows.max(1)),
            u64::from(cfg.batch_envs.max(1)),
        );
        let wanted = rows.max((envs * rows).div_ceil(ref_envs)).max(envs);
        // A batch may exceed its target (Overshoot); two must fit a shard, or replay
        // would hold little else.
        let past = Overshoot::of(envs as usize, n_step.max(1) as usize);
        let shard = table.shard_capacity() as u64;
        let fits = (shard / 2).saturating_sub(past.transitions as u64);
        if fits < envs {
            return Err(Refusal::new(
                RefusalCode::BatchTooLarge,
                format!(
                    "{envs} environments make batches too large for replay's shards of {shard} \
                     transitions (raise --replay-capacity or lower --replay-shards, or run fewer envs)"
                ),
            ));
        }
        // And one batch must fit a frame, with its observation rows past the target, at
        // the observation's size plus the columns.
        let row_bytes = self.shared.ctx.env.obs.row_bytes() as u64;
        let frame_rows = (cfg.max_frame as u64).saturating_sub(FRAME_HEADROOM) / (row_bytes + 40);
        let in_frame = frame_rows.saturating_sub(past.obs_rows as u64);
        if in_frame < envs {
            // Each environment's rows past the target, and one of its own.
            let most = frame_rows / (Overshoot::of(1, n_step.max(1) as usize).obs_rows as u64 + 1);
            return Err(Refusal::new(
                RefusalCode::BatchTooLarge,
                format!(
                    "{envs} environments of {row_bytes}-byte observations make batches larger \
                     than a frame ({} MiB): run at most {most} environments per actor",
                    cfg.max_frame >> 20
                ),
            ));
        }
        Ok(wanted.min(fits).min(in_frame) as u32)
    }

    /// Runs the session until it ends; counts the transitions received.
    async fn session(
        &self,
        rd: &mut FrameReader<OwnedReadHalf>,
        Session {
            id,
            stream,
            agent,
            envs,
            n_step,
            batch_rows,
            name,
        }: Session,
        route: &SessionRoute,
        received: &mut u64,
    ) -> Outcome {
        let ctx = &self.shared.ctx;
        let (table, params, steps) = (&route.route.table, &route.route.params, &route.route.steps);
        // A population's agent that ends sends its actors away for another.
        let mut ended = route.ended.clone();
        let agent_ended = || Goodbye {
            reason: GoodbyeReason::LearnerStopping,
            message: format!("agent {agent} ended; reconnect to serve another"),
        };
        let row_bytes = ctx.env.obs.row_bytes();
        // An actor's batch holds one row per step, one more per truncated episode, and
        // at most n_step + 1 rows per environment carried over: more rows than that
        // would let one actor flush replay past the rate limiter (which counts
        // transitions).
        let carried = envs * (n_step as usize + 1);
        // An actor hands a batch on once it holds the welcome's `batch_rows`; the step
        // that completes it may add one transition per environment and flush up to
        // n_step more per environment (episodes that end).
        let most = batch_rows as usize + envs * (n_step as usize + 1);
        let stack = ctx.env.frame_stack.max(1);
        let num_actions = ctx.env.num_actions;
        let mut stop = self.stop.clone();
        // Transitions received as of the last log line and the last stats report.
        let (mut log_mark, mut since) = (*received, Instant::now());
        let (mut window_mark, mut window_start) = (*received, Instant::now());
        // Whether this session's implausible returns were logged (once is enough).
        let mut flagged = false;
        loop {
            // Cancel-safe: stopping mid-frame loses nothing that matters (the session ends).
            let msg = tokio::select! {
                m = rd.read_msg_charged::<ActorMsg>() => m,
                _ = stop.changed() => {
                    let goodbye = stop.borrow().clone();
                    return match goodbye {
                        Some(g) => Outcome::Goodbye(g),
                        None => Outcome::Closed("learner shutting down".into()),
                    };
                }
                _ = async { ended.as_mut()?.wait_for(|e| *e).await.ok() }, if ended.is_some() => {
                    // The run may have stopped at the same moment: then its word is the
                    // last one.
                    let stopped = stop.borrow().clone();
                    return Outcome::Goodbye(stopped.unwrap_or_else(agent_ended));
                }
            };
            let (msg, _budget) = match msg {
                Ok(Some(m)) => m,
                Ok(None) => return Outcome::Closed("actor disconnected".into()),
                Err(
                    e @ (ReadError::Idle(_)
                    | ReadError::TooSlow { .. }
                    | ReadError::OverShare { .. }),
                ) => return Outcome::Refused(Refusal::new(RefusalCode::Timeout, e.to_string())),
                Err(ReadError::Io(e)) => return Outcome::Closed(format!("connection lost: {e}")),
                Err(e @ ReadError::Truncated { .. }) => return Outcome::Closed(e.to_string()),
                Err(e) => return Outcome::Refused(violation(e.to_string())),
            };
            match msg {
                ActorMsg::Transitions(mut batch) => {
                    // Checked first: nothing of a batch counts before it is stored.
                    if batch.len() > most {
                        return Outcome::Refused(violation(format!(
                            "a batch of {} transitions; this session's batches hold at most {most} \
                             ({batch_rows} asked for, {envs} environments, {n_step}-step)",
                            batch.len()
                        )));
                    }
                    if let Err(e) = batch
                        .validate(row_bytes, ctx.env.frame_stack)
                        .and_then(|()| {
                            let bounds = &self.shared.cfg.value_bounds;
                            batch.check_values(num_actions, ctx.env.obs.dtype, bounds)
                        })
                    {
                        return Outcome::Refused(violation(format!(
                            "transition batch does not match {}: {e}",
                            ctx.env.id
                        )));
                    }
                    // In frame mode a row is a frame: an episode start adds a stack.
                    if batch.obs_rows() > stack * (2 * batch.len() + carried) {
                        return Outcome::Refused(violation(format!(
                            "{} observation rows for {} transitions from {envs} environments",
                            batch.obs_rows(),
                            batch.len()
                        )));
                    }
                    // The connection's own identity (the agent it was welcomed as),
                    // whatever the actor claims.
                    batch.actor_id = stream;
                    batch.agent = agent;
                    // An actor whose transitions keep being evicted as poison (finite
                    // values within bounds whose TD errors still explode) is sent away
                    // with a reason, and named on /metrics until then.
                    let evicted = table.evicted_from(stream);
                    if evicted >= MAX_EVICTED_PER_SESSION {
                        return Outcome::Refused(violation(format!(
                            "{evicted} of its transitions were evicted from replay as poison (their TD errors were not finite or exploded): its environment gives values no learner can use"
                        )));
                    }
                    let table = Arc::clone(table);
                    // Blocks while the rate limiter holds inserts back: this connection
                    // stops reading, and TCP pushes back on this actor alone. The frame's
                    // budget is held until the batch is stored.
                    match tokio::task::block_in_place(|| table.insert(&batch)) {
                        // Env steps count once their transitions are stored: a refused
                        // batch cannot end a run by its step budget.
                        Ok(()) => {
                            if *received == 0 && !batch.is_empty() {
                                tracing::info!(
                                    "{}: actor {name:?} feeds replay: its first {} are stored",
                                    self.peer,
                                    batch.len()
                                );
                            }
                            *received += batch.len() as u64;
                            steps.add(batch.len() as u64);
                        }
                        // Replay closes as the run ends, after the goodbye is announced.
                        Err(ReplayError::Closed) => {
                            if route.ended.as_ref().is_some_and(|e| *e.borrow()) {
                                return Outcome::Goodbye(agent_ended());
                            }
                            let goodbye = self.stop.borrow().clone();
                            return match goodbye {
                                Some(g) => Outcome::Goodbye(g),
                                None => Outcome::Closed("learner shutting down".into()),
                            };
                        }
                        Err(e) => return Outcome::Refused(violation(e.to_string())),
                    }
                }
                ActorMsg::Stats(stats) => {
                    // Returns the environment cannot give (not finite, or beyond its
                    // reward range over a whole episode) are not counted: an actor
                    // cannot make the run's train return say 1e9.
                    let returns = &stats.episode_returns
                        [..stats.episode_returns.len().min(MAX_RETURNS_PER_STATS)];
                    let (plausible, implausible): (Vec<f32>, Vec<f32>) =
                        returns.iter().partition(|r| ctx.env.plausible_return(**r));
                    if let (Some(example), false) = (implausible.first(), flagged) {
                        flagged = true;
                        tracing::warn!(
                            "{}: actor {name:?} reported {} episode return(s) {} cannot give (e.g. {example:?}): not counted (said once per session)",
                            self.peer,
                            implausible.len(),
                            ctx.env.id
                        );
                    }
                    ctx.board.returns(id, &plausible);
                    for r in &plausible {
                        let _ = ctx.episodes.try_send(EpisodeStats {
                            actor_id: id,
                            episode_return: *r,
                            length: 0,
                            env_steps: stats.env_steps,
                        });
                    }
                    let lag = params.version().saturating_sub(stats.params_version);
                    let window = window_start.elapsed().as_secs_f64();
                    let rate = (*received - window_mark) as f64 / window.max(1e-3);
                    ctx.board.report(id, rate, lag);
                    ctx.board.evicted(id, table.evicted_from(stream));
                    (window_mark, window_start) = (*received, Instant::now());
                    let dt = since.elapsed().as_secs_f64();
                    if dt >= 10.0 {
                        tracing::info!(
                            "{}: {:.0} transitions/s, params version {} (learner at {})",
                            self.peer,
                            (*received - log_mark) as f64 / dt,
                            stats.params_version,
                            params.version()
                        );
                        (log_mark, since) = (*received, Instant::now());
                    }
                }
                ActorMsg::Heartbeat => {}
                ActorMsg::Goodbye(g) => {
                    return Outcome::Closed(format!(
                        "actor said goodbye: {}",
                        peer_text(&g.message, MAX_REASON_CHARS)
                    ))
                }
                ActorMsg::Hello(_) => return Outcome::Refused(violation("a second Hello")),
                ActorMsg::Proof(_) => return Outcome::Refused(violation("a second Proof")),
            }
        }
    }
}

/// Sends the newest parameters whenever they change, each followed by its seal, and
/// sealed heartbeats. Returns the write half and the seal (for the session's last word) when
/// it stops for a reason other than a failed or stalled write.
async fn send_loop(
    mut wr: OwnedWriteHalf,
    mut seal: Seal,
    mut frames: watch::Receiver<Option<Arc<ParamsFrame>>>,
    mut stop: watch::Receiver<bool>,
    heartbeat_every: Duration,
    write_timeout: Duration,
) -> Option<(OwnedWriteHalf, Seal)> {
    frames.mark_changed();
    let mut heartbeat = tokio::time::interval(heartbeat_every);
    loop {
        // A parameters frame and its seal, or a heartbeat.
        let params = tokio::select! {
            // Stopping first (the session's last word waits for this writer); then
            // parameters; a heartbeat is only for a quiet link.
            biased;
            _ = stop.changed() => return Some((wr, seal)),
            changed = frames.changed() => {
                if changed.is_err() {
                    return Some((wr, seal));
                }
                match frames.borrow_and_update().clone() {
                    Some(f) => Some(f),
                    None => continue,
                }
            }
            _ = heartbeat.tick() => None,
        };
        let write = async {
            match &params {
                Some(p) => {
                    let tag = LearnerMsg::ParamsSeal(seal.seal_params(&p.digest));
                    let tag = millrace_proto::codec::encode(&tag, HANDSHAKE_MAX_FRAME)
                        .map_err(std::io::Error::other)?;
                    write_frame(&mut wr, &p.frame).await?;
                    write_frame(&mut wr, &tag).await
                }
                // Sealed (a 32-byte tag): a relay cannot fake a live link.
                None => {
                    let beat = seal
                        .seal(&LearnerMsg::Heartbeat)
                        .and_then(|m| millrace_proto::codec::encode(&m, HANDSHAKE_MAX_FRAME))
                        .map_err(std::io::Error::other)?;
                    write_frame(&mut wr, &beat).await
                }
            }
        };
        match tokio::time::timeout(write_timeout, write).await {
            Ok(Ok(())) => {}
            // A stalled or broken peer: stop writing; the reader notices and closes.
            _ => return None,
        }
    }
}

/// Why the learner ends sessions when a run stops: for good, or for a restart.
pub fn goodbye_for(finished: bool, message: impl Into<String>) -> Goodbye {
    Goodbye {
        reason: if finished {
            GoodbyeReason::RunFinished
        } else {
            GoodbyeReason::LearnerStopping
        },
        message: message.into(),
    }
}
