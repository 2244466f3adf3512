//! Shared fakes and helpers for millrace's behaviour tests (`tests/tests/*.rs` and the
//! learner's `learner/tests/*.rs`): defined once here, not per test file.
//!
//! - [`TableSink`]: an actor sink straight into replay.
//! - [`WireClient`]: a hand-written actor speaking the protocol over a blocking socket
//!   (good and bad input alike), reading with the one framed reader.
//! - [`FakeLearner`]: a scripted learner that answers each connection as a test says
//!   (welcome and parameters, a refusal, a goodbye), for testing `actor` processes.
//! - [`wait_until`], [`binary`], message builders.

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use millrace_actor::runner::SinkClosed;
use millrace_actor::{ActorSink, EpisodeStats};
use millrace_proto::auth::{self, Seal};
use millrace_proto::codec::{self, Framer, DEFAULT_MAX_FRAME};
use millrace_proto::wire::{
    ActorMsg, Capabilities, Goodbye, Hello, LearnerMsg, Refusal, RefusalCode, Welcome,
    PROTOCOL_VERSION,
};
use millrace_proto::{NetworkSpec, Params, TransitionBatch};
use millrace_replay::Table;

/// A process's one-line error (`error: …`) from its standard error, or "" if none.
pub fn error_line(stderr: &str) -> &str {
    stderr
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_default()
}

/// An actor sink that inserts straight into a replay table and counts episodes.
#[derive(Debug)]
pub struct TableSink {
    pub table: Arc<Table>,
    pub episodes: Vec<EpisodeStats>,
    /// Stop the actor after this many batches.
    pub max_batches: usize,
    pub batches: usize,
}

impl TableSink {
    pub fn new(table: Arc<Table>, max_batches: usize) -> Self {
        Self {
            table,
            episodes: Vec::new(),
            max_batches,
            batches: 0,
        }
    }
}

impl ActorSink for TableSink {
    fn transitions(&mut self, batch: &mut TransitionBatch) -> Result<(), SinkClosed> {
        self.table.insert(batch).map_err(|_| SinkClosed)?;
        self.batches += 1;
        if self.batches >= self.max_batches {
            Err(SinkClosed)
        } else {
            Ok(())
        }
    }

    fn episode(&mut self, stats: EpisodeStats) {
        self.episodes.push(stats);
    }
}

/// Polls `cond` every few milliseconds until it holds; fails the test with `what` after
/// `limit`.
pub fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out after {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Sends `signal` (`-TERM`, `-INT`) to a child process, as a container runtime or a
/// terminal would.
pub fn signal(child: &std::process::Child, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill {signal} {}", child.id());
}

/// A JSON file (a checkpoint's metadata, a saved configuration).
pub fn read_json(path: &std::path::Path) -> serde_json::Value {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A population's `population.csv` (in `dir`) as its rows by agent number, each row by
/// column, without the wall-time column (which differs between runs of the same
/// population): what two runs that must agree are compared on.
pub fn population_rows(
    dir: &std::path::Path,
) -> std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>> {
    let csv = std::fs::read_to_string(dir.join("population.csv"))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
    lines
        .map(|l| {
            let row: std::collections::BTreeMap<String, String> = header
                .iter()
                .zip(l.split(','))
                .filter(|(h, _)| **h != "wall_s")
                .map(|(h, v)| (h.to_string(), v.to_string()))
                .collect();
            (row["agent"].clone(), row)
        })
        .collect()
}

/// A child process that is killed and reaped when dropped, also when the test that
/// started it fails: no test leaves a learner or an actor running (an actor reconnects
/// for ever to a learner that is gone). Derefs to the [`std::process::Child`].
#[derive(Debug)]
pub struct KillOnDrop(Option<std::process::Child>);

impl KillOnDrop {
    /// Starts `cmd` (panics, naming it, when it cannot start).
    pub fn spawn(cmd: &mut std::process::Command) -> Self {
        Self(Some(cmd.spawn().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))))
    }

    /// The child, no longer killed when dropped (to wait for its output, say).
    pub fn into_inner(mut self) -> std::process::Child {
        self.0.take().expect("the child is held until now")
    }
}

impl std::ops::Deref for KillOnDrop {
    type Target = std::process::Child;

    fn deref(&self) -> &Self::Target {
        self.0.as_ref().expect("the child is held until into_inner")
    }
}

impl std::ops::DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.0.as_mut().expect("the child is held until into_inner")
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }
}

/// Runs a command to its end (panics, naming it, when it cannot start).
pub fn run(cmd: &mut std::process::Command) -> std::process::Output {
    cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

/// Runs a command that must succeed; its stdout.
pub fn ok(cmd: &mut std::process::Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}",
        output_text(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A finished process's stdout then stderr, for assertion messages.
pub fn output_text(out: &std::process::Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Exports `which` (`best`, `solved`, `latest`) of a saved run with `learner export`
/// (`learner` the binary, `agent` a population's agent, `ckpt` then its log directory)
/// and plays it in Gymnasium itself (`scripts/play_policy.py`, 100 episodes from seed
/// 1000); what the script printed (`mean`, `stderr`, ...). `out` holds the export.
pub fn play_in_gymnasium(
    learner: &std::path::Path,
    ckpt: &std::path::Path,
    agent: Option<usize>,
    which: &str,
    out: &std::path::Path,
) -> serde_json::Value {
    let name = match agent {
        Some(k) => format!("agent-{k:03}-{which}.safetensors"),
        None => format!("{which}.safetensors"),
    };
    let weights = out.join(name);
    let mut export = std::process::Command::new(learner);
    export
        .args(["export", "--checkpoint"])
        .arg(ckpt)
        .args(["--which", which, "--out"])
        .arg(&weights);
    if let Some(k) = agent {
        export.args(["--agent", &k.to_string()]);
    }
    let exported = export.output().expect("learner export runs");
    assert!(exported.status.success(), "{}", output_text(&exported));
    // The repository's scripts, as cargo gives the crate's directory now (a path baked
    // in at build time may be another clone's, with a shared target dir).
    let crate_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    let script = crate_dir.join("../scripts/play_policy.py");
    let played = std::process::Command::new(venv_python())
        .arg(script)
        .arg(&weights)
        .args(["--episodes", "100", "--seed", "1000"])
        .output()
        .expect("python runs");
    assert!(played.status.success(), "{}", output_text(&played));
    let stdout = String::from_utf8_lossy(&played.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON in:\n{}", output_text(&played)));
    serde_json::from_str(line).expect("play_policy.py prints JSON")
}

/// The project virtualenv's Python (`scripts/setup.sh` installs Gymnasium, torch,
/// safetensors and TensorBoard there).
pub fn venv_python() -> PathBuf {
    let venv = std::env::var_os("MILLRACE_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/millrace/venv")
        });
    let python = venv.join("bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup.sh",
        python.display()
    );
    python
}

/// TensorBoard's HParams view of a log directory, as TensorBoard's own plugin reads
/// it (`scripts/read_hparams.py`: the hyperparameters and, per configuration, its
/// sessions with their status and metrics).
pub fn hparams_view(logdir: &std::path::Path) -> serde_json::Value {
    let out = std::process::Command::new(venv_python())
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/read_hparams.py"))
        .arg(logdir)
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "read_hparams.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("read_hparams.py prints JSON")
}

/// A binary of this workspace, built beside the test executable (`cargo build --bins`
/// first; `scripts/test.sh` does).
pub fn binary(name: &str) -> PathBuf {
    // Test executables live in target/<profile>/deps; binaries one level up.
    let exe = std::env::current_exe().expect("the test executable's path");
    let path = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>/deps")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --bins` first (scripts/test.sh does)",
        path.display()
    );
    path
}

/// A `Hello` for CartPole-v1 with `envs` environments (and a fresh nonce).
pub fn hello(version: u32, envs: u32) -> ActorMsg {
    ActorMsg::Hello(Hello {
        protocol_version: version,
        nonce: auth::fresh_nonce(),
        actor_name: "test".into(),
        capabilities: Capabilities {
            envs,
            env_ids: vec!["CartPole-v1".into()],
            features: Vec::new(),
        },
        agent: None,
    })
}

/// `rows` CartPole-shaped transitions (`obs_floats` floats per observation), each with
/// its own two observation rows.
pub fn batch(rows: usize, obs_floats: usize) -> TransitionBatch {
    let mut b = TransitionBatch::with_capacity(obs_floats * 4, rows, 2 * rows);
    for i in 0..rows {
        let obs = vec![i as f32; obs_floats];
        b.push_f32(&obs, (i % 2) as i64, 1.0, 0.99, &obs);
    }
    b
}

/// A hand-written actor over a blocking socket. Once [`WireClient::send_hello`] has
/// authenticated the session, [`WireClient::recv`] opens the learner's sealed messages
/// and checks each parameter snapshot's seal (panicking on a forgery: the learner
/// under test made it).
#[derive(Debug)]
pub struct WireClient {
    pub stream: TcpStream,
    framer: Framer,
    seal: Option<Seal>,
    /// Parameters waiting for their seal.
    pending: Option<Params>,
}

/// A TCP connection to `addr` from the local address `source` (another loopback
/// address, `127.0.0.2`, is another source to a server on `127.0.0.1`), or the error.
pub fn connect_from(addr: SocketAddr, source: std::net::IpAddr) -> std::io::Result<TcpStream> {
    use socket2::{Domain, SockAddr, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.bind(&SockAddr::from(SocketAddr::new(source, 0)))?;
    socket.connect_timeout(&SockAddr::from(addr), Duration::from_secs(10))?;
    Ok(socket.into())
}

impl WireClient {
    pub fn connect(addr: SocketAddr) -> Self {
        Self::of(TcpStream::connect(addr).expect("connect to the learner"))
    }

    /// A client whose connection comes from the local address `source` (see
    /// [`connect_from`]).
    pub fn connect_from(addr: SocketAddr, source: std::net::IpAddr) -> Self {
        Self::of(connect_from(addr, source).expect("connect to the learner"))
    }

    fn of(stream: TcpStream) -> Self {
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("a read timeout");
        Self {
            stream,
            framer: Framer::new(DEFAULT_MAX_FRAME),
            seal: None,
            pending: None,
        }
    }

    /// Sends `first` (a `Hello`, or anything else a test opens with) and, when the
    /// learner answers with a challenge, the proof for `token`; returns the learner's
    /// answer after that (opened, if sealed), or its first answer if it was no
    /// challenge.
    pub fn send_hello(&mut self, first: &ActorMsg, token: &str) -> LearnerMsg {
        self.send(first);
        let answer = self.recv_raw().expect("an answer to Hello");
        let (LearnerMsg::Challenge(challenge), ActorMsg::Hello(hello)) = (&answer, first) else {
            return answer;
        };
        let proof = auth::actor_proof(token.as_bytes(), hello, challenge).expect("a proof");
        self.seal = Some(Seal::for_session(token.as_bytes(), hello, challenge).expect("a key"));
        // A learner that refuses the proof may close before reading it.
        let _ = self.try_send(&ActorMsg::Proof(proof));
        self.recv().expect("an answer to the proof")
    }

    /// The next frame as it came.
    fn recv_raw(&mut self) -> Option<LearnerMsg> {
        codec::read_msg(&mut self.stream, &mut self.framer)
            .ok()
            .flatten()
    }

    /// Opens a sealed message, and checks parameters by the seal that follows them.
    fn open(&mut self, msg: LearnerMsg) -> Option<LearnerMsg> {
        match (msg, &mut self.seal) {
            (LearnerMsg::Sealed(s), Some(seal)) => {
                Some(seal.open(&s).expect("the learner's seal holds"))
            }
            (LearnerMsg::Params(p), Some(_)) => {
                self.pending = Some(p);
                None
            }
            (LearnerMsg::ParamsSeal(tag), Some(seal)) => {
                let p = self.pending.take().expect("parameters before their seal");
                seal.open_params(&p, &tag)
                    .expect("the parameters' seal holds");
                Some(LearnerMsg::Params(p))
            }
            (msg, _) => Some(msg),
        }
    }

    pub fn send(&mut self, msg: &ActorMsg) {
        let frame = codec::encode(msg, DEFAULT_MAX_FRAME).expect("encodable");
        self.stream.write_all(&frame).expect("the learner reads");
    }

    /// Sends `msg`, or says why it could not (the learner dropped the connection).
    pub fn try_send(&mut self, msg: &ActorMsg) -> std::io::Result<()> {
        let frame = codec::encode(msg, DEFAULT_MAX_FRAME).expect("encodable");
        self.stream.write_all(&frame)
    }

    /// Raw bytes, for malformed input.
    pub fn send_bytes(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("the learner reads");
    }

    /// The next message (opened, if sealed), or `None` once the learner has closed the
    /// connection.
    pub fn recv(&mut self) -> Option<LearnerMsg> {
        loop {
            let msg = self.recv_raw()?;
            if let Some(m) = self.open(msg) {
                return Some(m);
            }
        }
    }

    /// Reads until the learner closes the connection cleanly, returning what came
    /// before; panics on a reset or a read timeout (a close must be a close, not a
    /// lost connection or a hang).
    pub fn expect_closed(&mut self) -> Vec<LearnerMsg> {
        let mut seen = Vec::new();
        loop {
            match codec::read_msg(&mut self.stream, &mut self.framer) {
                Ok(Some(msg)) => seen.extend(self.open(msg)),
                Ok(None) => return seen,
                Err(e) => panic!("the connection did not close cleanly: {e}"),
            }
        }
    }

    /// Reads until a refusal arrives (then checks the connection closes cleanly, with
    /// nothing after it) or the connection closes; returns the refusal.
    pub fn refused(&mut self) -> Option<Refusal> {
        loop {
            match self.recv() {
                Some(LearnerMsg::Refused(r)) => {
                    let after = self.expect_closed();
                    assert!(after.is_empty(), "closed after the refusal: {after:?}");
                    return Some(r);
                }
                Some(_) => continue,
                None => return None,
            }
        }
    }

    /// Reads until a goodbye arrives or the connection closes.
    pub fn goodbye(&mut self) -> Option<Goodbye> {
        loop {
            match self.recv() {
                Some(LearnerMsg::Goodbye(g)) => return Some(g),
                Some(_) => continue,
                None => return None,
            }
        }
    }

    /// Sends a `Hello`, proves `token` and returns the answer.
    pub fn hello(&mut self, token: &str) -> LearnerMsg {
        self.send_hello(&hello(PROTOCOL_VERSION, 4), token)
    }

    /// Sends a `Hello`, expects a `Welcome`.
    pub fn join(&mut self, token: &str) -> Welcome {
        match self.hello(token) {
            LearnerMsg::Welcome(w) => *w,
            other => panic!("expected a welcome, got {other:?}"),
        }
    }
}

/// How the [`FakeLearner`] answers one connection.
#[derive(Clone, Debug)]
pub enum Answer {
    /// Refuse the `Hello`.
    Refuse(Refusal),
    /// Welcome the actor, send parameters, read its transitions until it has sent
    /// `after_batches` of them, then say goodbye.
    WelcomeThenGoodbye {
        after_batches: usize,
        goodbye: Goodbye,
    },
    /// Welcome the actor and keep reading until it leaves (its goodbye is recorded).
    WelcomeAndServe,
    /// Welcome the actor, then send parameters that do not fit its network.
    WelcomeWithBadParams,
    /// As [`Answer::WelcomeThenGoodbye`], for a network whose parameters take a frame
    /// of about 25 MiB: the welcome announces frames of up to 64 MiB (as a pixel
    /// learner's does), past the handshake's 16 MiB.
    LargeParamsThenGoodbye {
        after_batches: usize,
        goodbye: Goodbye,
    },
    /// An impersonator that does not know the token: it collects the actor's proof and
    /// welcomes it to `env` (a `gym:` id whose `module` would be imported), sealed under
    /// a key of its own.
    Impersonate(millrace_proto::EnvConfig),
    /// Welcome the actor to `env` (a real learner's welcome) and serve it.
    WelcomeTo(millrace_proto::EnvConfig),
    /// A relay's forgery: after the proof, a refusal without the seal.
    RefuseUnsealed(Refusal),
}

/// What the fake learner saw.
#[derive(Debug, Default)]
pub struct Seen {
    pub connections: AtomicUsize,
    pub batches: AtomicUsize,
    /// Goodbyes actors sent.
    pub goodbyes: Mutex<Vec<Goodbye>>,
}

/// A scripted learner on loopback for testing `actor` processes: connection `i` is
/// answered with `answers[i]` (the last answer repeats).
#[derive(Debug)]
pub struct FakeLearner {
    pub addr: SocketAddr,
    pub seen: Arc<Seen>,
}

impl FakeLearner {
    pub fn start(answers: Vec<Answer>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let addr = listener.local_addr().expect("bound");
        let seen = Arc::new(Seen::default());
        let shared = Arc::clone(&seen);
        std::thread::spawn(move || {
            for (i, stream) in listener.incoming().enumerate() {
                let Ok(stream) = stream else { continue };
                shared.connections.fetch_add(1, Ordering::SeqCst);
                let answer = answers[i.min(answers.len() - 1)].clone();
                let seen = Arc::clone(&shared);
                std::thread::spawn(move || serve(stream, answer, &seen));
            }
        });
        Self { addr, seen }
    }

    pub fn connections(&self) -> usize {
        self.seen.connections.load(Ordering::SeqCst)
    }
}

fn send(stream: &mut TcpStream, msg: &LearnerMsg) {
    send_limited(stream, msg, DEFAULT_MAX_FRAME);
}

fn send_limited(stream: &mut TcpStream, msg: &LearnerMsg, max_frame: usize) {
    if let Ok(frame) = codec::encode(msg, max_frame) {
        let _ = stream.write_all(&frame);
    }
}

/// Says a last word and closes as the learner does: write side first, then whatever the
/// actor still sends is read and dropped until it closes (closing with unread data would
/// reset the connection and could discard the last word).
fn last_word(mut stream: TcpStream, msg: &LearnerMsg) {
    send(&mut stream, msg);
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut sink = [0u8; 4096];
    while matches!(std::io::Read::read(&mut stream, &mut sink), Ok(n) if n > 0) {}
}

/// The token the fake learner's actors run with (none).
const FAKE_TOKEN: &[u8] = b"";

fn serve(mut stream: TcpStream, answer: Answer, seen: &Seen) {
    let mut framer = Framer::new(DEFAULT_MAX_FRAME);
    let mut read = stream.try_clone().expect("a second handle");
    let Ok(Some(ActorMsg::Hello(hello))) = codec::read_msg::<ActorMsg, _>(&mut read, &mut framer)
    else {
        return;
    };
    // As the learner does: another version is refused before any challenge.
    if let Answer::Refuse(r) = &answer {
        if r.code == RefusalCode::ProtocolVersion {
            last_word(stream, &LearnerMsg::Refused(r.clone()));
            return;
        }
    }
    let challenge = auth::fresh_nonce();
    send(&mut stream, &LearnerMsg::Challenge(challenge));
    let Ok(Some(ActorMsg::Proof(_))) = codec::read_msg::<ActorMsg, _>(&mut read, &mut framer)
    else {
        return;
    };
    let key: &[u8] = match &answer {
        Answer::Impersonate(_) => b"a guess at the token",
        _ => FAKE_TOKEN,
    };
    let mut seal = Seal::for_session(key, &hello, &challenge).expect("a session key");
    if let Answer::RefuseUnsealed(r) = &answer {
        last_word(stream, &LearnerMsg::Refused(r.clone()));
        return;
    }
    let bad_params = matches!(answer, Answer::WelcomeWithBadParams);
    let large = matches!(answer, Answer::LargeParamsThenGoodbye { .. });
    let mut env_config = millrace_proto::EnvConfig::new("CartPole-v1");
    let (after, goodbye) = match answer {
        Answer::Refuse(r) => {
            // A wrong token is refused unsealed (the actor has not proved it); anything
            // after the proof is sealed.
            let msg = LearnerMsg::Refused(r.clone());
            let msg = if r.code == RefusalCode::WrongToken {
                msg
            } else {
                seal.seal(&msg).expect("sealed")
            };
            last_word(stream, &msg);
            return;
        }
        Answer::WelcomeThenGoodbye {
            after_batches,
            goodbye,
        }
        | Answer::LargeParamsThenGoodbye {
            after_batches,
            goodbye,
        } => (Some(after_batches), Some(goodbye)),
        Answer::WelcomeAndServe | Answer::WelcomeWithBadParams => (None, None),
        Answer::Impersonate(env) | Answer::WelcomeTo(env) => {
            env_config = env;
            (None, None)
        }
        Answer::RefuseUnsealed(_) => unreachable!("answered above"),
    };
    let mut env = millrace_actor::env::spec("CartPole-v1").expect("a known env");
    env.id = env_config.id.clone();
    // 2,500 x 2,500: 6.3 M parameters, a 25 MiB frame.
    let (hidden, max_frame): (&[usize], usize) = if large {
        (&[2500, 2500], codec::MAX_FRAME_CEILING)
    } else {
        (&[8], DEFAULT_MAX_FRAME)
    };
    let network = NetworkSpec::mlp(&env.obs, hidden, env.num_actions, 1).expect("a valid network");
    let n = hello.capabilities.envs;
    let welcome = Welcome {
        env_config,
        clip_rewards: false,
        max_frame: max_frame as u64,
        run_id: "fake".into(),
        env,
        network: network.clone(),
        agent: 0,
        params_version: 1,
        env_indices: (0..n).collect(),
        epsilons: vec![0.5; n as usize],
        epsilon_decay: None,
        n_step: 1,
        gamma: 0.99,
        batch_rows: 16,
        features: Vec::new(),
    };
    let welcome = seal
        .seal(&LearnerMsg::Welcome(Box::new(welcome)))
        .expect("sealed");
    send(&mut stream, &welcome);
    let params = Params::of_one(1, vec![0.0; network.layout().len + usize::from(bad_params)]);
    let tag = seal.seal_params(&auth::params_digest(&params));
    send_limited(&mut stream, &LearnerMsg::Params(params), max_frame);
    send(&mut stream, &LearnerMsg::ParamsSeal(tag));
    let mut batches = 0;
    loop {
        match codec::read_msg::<ActorMsg, _>(&mut read, &mut framer) {
            Ok(Some(ActorMsg::Transitions(_))) => {
                batches += 1;
                seen.batches.fetch_add(1, Ordering::SeqCst);
                if after.is_some_and(|a| batches >= a) {
                    if let Some(g) = goodbye.clone() {
                        let bye = seal.seal(&LearnerMsg::Goodbye(g)).expect("sealed");
                        last_word(stream, &bye);
                    }
                    return;
                }
            }
            Ok(Some(ActorMsg::Goodbye(g))) => {
                seen.goodbyes
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(g);
                return;
            }
            Ok(Some(_)) => {}
            _ => return,
        }
    }
}
