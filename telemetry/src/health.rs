//! The health-check client: what `millrace-health` (the images' probe: no libtorch, so a
//! probe costs milliseconds, not libtorch's start-up), `learner health` and `actor
//! health` run inside their containers (docker-compose `healthcheck`, Kubernetes probes),
//! so images need no curl.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Largest answer read (the metrics page is a few KiB; health answers a line).
const MAX_ANSWER: u64 = 4 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    #[error("cannot reach {addr}: {source}")]
    Unreachable {
        addr: String,
        source: std::io::Error,
    },
    #[error("answered {0}: {1}")]
    Status(u16, String),
    #[error("not an HTTP answer: {0:?}")]
    Malformed(String),
    #[error("--timeout-s must be more than 0 and at most 3600 seconds, got {0}")]
    BadTimeout(f64),
}

/// `GET path` from `addr` (`HOST:PORT`) within `timeout`; the body when the answer is
/// 200, else why not.
pub fn check(addr: &str, path: &str, timeout: Duration) -> Result<String, HealthError> {
    let unreachable = |source| HealthError::Unreachable {
        addr: addr.to_string(),
        source,
    };
    let deadline = Instant::now() + timeout;
    // Every address the name resolves to, in turn (`localhost` may be ::1 first while
    // the endpoint listens on 0.0.0.0).
    let mut last = std::io::Error::new(
        std::io::ErrorKind::NotFound,
        "the name resolves to no address",
    );
    let mut conn = None;
    for sock in addr.to_socket_addrs().map_err(unreachable)? {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match TcpStream::connect_timeout(&sock, left) {
            Ok(c) => {
                conn = Some(c);
                break;
            }
            Err(e) => last = e,
        }
    }
    let mut conn = conn.ok_or_else(|| unreachable(last))?;
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    conn.set_read_timeout(Some(left)).map_err(unreachable)?;
    conn.set_write_timeout(Some(left)).map_err(unreachable)?;
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(unreachable)?;
    let mut answer = Vec::new();
    conn.take(MAX_ANSWER)
        .read_to_end(&mut answer)
        .map_err(unreachable)?;
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or_else(|| HealthError::Malformed(answer.chars().take(80).collect()))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .filter(|_| head.starts_with("HTTP/1."))
        .ok_or_else(|| HealthError::Malformed(head.chars().take(80).collect()))?;
    if code == 200 {
        Ok(body.to_string())
    } else {
        Err(HealthError::Status(code, body.trim().to_string()))
    }
}

/// `millrace-health`'s command line (the images' probe; `src/bin/millrace-health.rs`).
#[derive(clap::Parser, Debug)]
#[command(name = "millrace-health", version, about = "Ask a millrace learner or actor whether it is healthy (exit status 0) or not (1).", long_about = None)]
pub struct Probe {
    #[command(flatten)]
    pub health: HealthArgs,
}

/// `millrace-health`, `learner health` and `actor health`: which endpoint to ask, and
/// what. Exit status 0 when the answer is 200, 1 otherwise (what docker-compose
/// `healthcheck` and Kubernetes `exec` probes read).
#[derive(clap::Args, Debug, Clone)]
pub struct HealthArgs {
    /// The process's --metrics-addr (HOST:PORT; the images' learner serves 9100, actors
    /// 9101).
    #[arg(long)]
    pub metrics_addr: String,
    /// Only whether the process answers at all (/livez: a liveness probe), not whether
    /// it is ready (/healthz).
    #[arg(long)]
    pub live: bool,
    /// Seconds to wait for the answer.
    #[arg(long, default_value_t = 3.0)]
    pub timeout_s: f64,
}

impl HealthArgs {
    /// The path asked: `/livez` or `/healthz`.
    pub fn path(&self) -> &'static str {
        if self.live {
            "/livez"
        } else {
            "/healthz"
        }
    }

    /// Asks; the answer's body when healthy.
    pub fn check(&self) -> Result<String, HealthError> {
        if !(self.timeout_s.is_finite() && self.timeout_s > 0.0 && self.timeout_s <= 3600.0) {
            return Err(HealthError::BadTimeout(self.timeout_s));
        }
        check(
            &self.metrics_addr,
            self.path(),
            Duration::from_secs_f64(self.timeout_s),
        )
    }
}
