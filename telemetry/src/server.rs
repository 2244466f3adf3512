//! The monitoring endpoint: `GET /metrics`, `/healthz`, `/livez` on one listener.
//!
//! Its own thread, running a small single-threaded tokio runtime of its own (never the
//! one that carries the actors' data): a scrape every few seconds and health probes,
//! not traffic. Each connection is a task that reads one request within a deadline from
//! its acceptance ([`IO_TIMEOUT`]) and a size limit, answers, and closes. An idle
//! connection costs a task and a small buffer, not a thread, so up to
//! [`MAX_CONNECTIONS`] may wait at once (more are answered 503 at once): sockets held
//! open by a client that sends nothing cannot starve the health probes, as a thread
//! per connection with a small cap would let them.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Requests larger than this (request line and headers) are refused.
const MAX_REQUEST: usize = 8 * 1024;
/// A client has this long to send its request, and to take the answer.
const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// Connections served at once (each idle one holds a task and a request buffer, at
/// most [`MAX_REQUEST`] bytes).
const MAX_CONNECTIONS: usize = 1024;

/// What the endpoint serves: the last published page and whether the process is ready.
/// Written by the process (the learner's metrics tick, the actor's session loop), read by
/// the server's threads; a std `Mutex` because nothing awaits while holding it.
#[derive(Debug)]
pub struct Endpoint {
    page: Mutex<Arc<str>>,
    /// `Ok` when ready; otherwise why not (the body of the 503).
    ready: Mutex<Result<(), String>>,
    /// Each watched part's last sign of progress and how long it may go without one,
    /// once it has shown the first (see [`Endpoint::progress_of`]); `""` is the
    /// process as a whole.
    progress: Mutex<BTreeMap<String, (Instant, Duration)>>,
    /// Whether any part ever showed progress.
    progressed: AtomicBool,
    /// Something an operator should know while the process stays ready (a checkpoint
    /// that failed): said in `/healthz`'s body, with status 200.
    warning: Mutex<Option<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Endpoint {
    /// Not ready yet, for `reason`, with an empty page.
    pub fn new(reason: impl Into<String>) -> Arc<Self> {
        Arc::new(Self {
            page: Mutex::new(Arc::from("")),
            ready: Mutex::new(Err(reason.into())),
            progress: Mutex::new(BTreeMap::new()),
            progressed: AtomicBool::new(false),
            warning: Mutex::new(None),
        })
    }

    /// Replaces the page `/metrics` serves.
    pub fn publish(&self, page: String) {
        *lock(&self.page) = Arc::from(page);
    }

    pub fn set_ready(&self) {
        *lock(&self.ready) = Ok(());
    }

    pub fn set_not_ready(&self, reason: impl Into<String>) {
        *lock(&self.ready) = Err(reason.into());
    }

    pub fn ready(&self) -> Result<(), String> {
        lock(&self.ready).clone()
    }

    /// Sets (or clears) what `/healthz` adds to "ready" (see [`Endpoint::warning`]).
    pub fn set_warning(&self, warning: Option<String>) {
        *lock(&self.warning) = warning;
    }

    /// What `/healthz` adds to "ready": a trouble that does not stop the process
    /// serving, such as checkpoints failing.
    pub fn warning(&self) -> Option<String> {
        lock(&self.warning).clone()
    }

    /// Whether any progress has been recorded (`/livez` watches from then on).
    pub fn progressed(&self) -> bool {
        self.progressed.load(Ordering::Relaxed)
    }

    /// Records progress now: from the first call on, `/livez` fails (503) once `limit`
    /// passes without another, so a wedged process is restarted. Before it (a
    /// checkpoint still loading, say), `/livez` answers as long as the process does.
    pub fn progress(&self, limit: Duration) {
        self.progress_of("", limit);
    }

    /// Records progress of one `part` of the process (a population's group of agents,
    /// named as the failure should say): `/livez` fails once any part watched goes
    /// `limit` without progress, even while the others progress, until the part is
    /// [`finished`](Endpoint::finished).
    pub fn progress_of(&self, part: &str, limit: Duration) {
        let mut parts = lock(&self.progress);
        match parts.get_mut(part) {
            Some(p) => *p = (Instant::now(), limit),
            None => {
                parts.insert(part.to_owned(), (Instant::now(), limit));
            }
        }
        self.progressed.store(true, Ordering::Relaxed);
    }

    /// `part` ended its work: its silence from now on is no failure.
    pub fn finished(&self, part: &str) {
        lock(&self.progress).remove(part);
    }

    /// `Ok` while alive; otherwise why not (the part most overdue).
    pub fn live(&self) -> Result<(), String> {
        let parts = lock(&self.progress);
        let overdue = parts
            .iter()
            .map(|(part, (last, limit))| (part, last.elapsed(), *limit))
            .filter(|(_, quiet, limit)| quiet > limit)
            .max_by_key(|(_, quiet, limit)| quiet.saturating_sub(*limit));
        match overdue {
            Some((part, quiet, limit)) => Err(format!(
                "{}no progress for {:.0} s (the limit is {:.0} s)",
                if part.is_empty() {
                    String::new()
                } else {
                    format!("{part}: ")
                },
                quiet.as_secs_f64(),
                limit.as_secs_f64()
            )),
            None => Ok(()),
        }
    }

    fn page(&self) -> Arc<str> {
        Arc::clone(&lock(&self.page))
    }
}

/// A running endpoint; dropping it stops the server (and waits for its thread).
#[derive(Debug)]
pub struct ServerHandle {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ServerHandle {
    /// The address bound (port 0 resolved).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What both binaries' `--metrics-addr` does: binds `addr`, serves a new endpoint that
/// is not ready yet (for `reason`) and logs where, in the one line tests and users look
/// for (`metrics on http://ADDR/metrics, health on /healthz`).
pub fn start(addr: SocketAddr, reason: &str) -> std::io::Result<(Arc<Endpoint>, ServerHandle)> {
    let endpoint = Endpoint::new(reason);
    let server = serve(addr, Arc::clone(&endpoint))?;
    tracing::info!(
        "metrics on http://{}/metrics, health on /healthz",
        server.addr()
    );
    Ok((endpoint, server))
}

/// Binds `addr` and serves `endpoint` until the handle is dropped.
pub fn serve(addr: impl ToSocketAddrs, endpoint: Arc<Endpoint>) -> std::io::Result<ServerHandle> {
    let listener = TcpListener::bind(addr)?;
    let mut addr = listener.local_addr()?;
    if addr.ip().is_unspecified() {
        // Where the handle's drop connects to wake the accept.
        addr.set_ip(match addr {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = Arc::clone(&stop);
    let thread = std::thread::Builder::new()
        .name("metrics-http".into())
        .spawn(move || accept_loop(listener, endpoint, stopping))?;
    Ok(ServerHandle {
        addr,
        stop,
        thread: Some(thread),
    })
}

fn accept_loop(listener: TcpListener, endpoint: Arc<Endpoint>, stop: Arc<AtomicBool>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build();
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => return tracing::error!("metrics endpoint: no runtime: {e}"),
    };
    runtime.block_on(async move {
        let listener = match listener
            .set_nonblocking(true)
            .and_then(|()| tokio::net::TcpListener::from_std(listener))
        {
            Ok(l) => l,
            Err(e) => return tracing::error!("metrics endpoint: {e}"),
        };
        let active = Arc::new(AtomicUsize::new(0));
        loop {
            let conn = listener.accept().await;
            if stop.load(Ordering::Relaxed) {
                // Dropping the runtime ends every connection's task.
                return;
            }
            let Ok((conn, _)) = conn else {
                // Out of descriptors, say: try again shortly rather than spin.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            if active.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
                active.fetch_sub(1, Ordering::AcqRel);
                // Without waiting for the request: at most the socket buffer's worth.
                let _ = conn.try_write(&response(503, "text/plain", b"busy\n", false));
                continue;
            }
            let accepted = Instant::now();
            let endpoint = Arc::clone(&endpoint);
            let active = Arc::clone(&active);
            tokio::spawn(async move {
                // The whole exchange, answer included, within twice the deadline.
                let _ =
                    tokio::time::timeout(2 * IO_TIMEOUT, handle(conn, &endpoint, accepted)).await;
                active.fetch_sub(1, Ordering::AcqRel);
            });
        }
    });
}

/// Reads the request head (up to the blank line), bounded in size and in time: the whole
/// head must arrive within [`IO_TIMEOUT`] of the connection's acceptance, however the
/// client spreads its bytes (a per-read timeout alone would let a client that sends a
/// byte a second hold its connection for hours).
async fn read_head(conn: &mut tokio::net::TcpStream, deadline: Instant) -> Result<Vec<u8>, u16> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    loop {
        let read = tokio::time::timeout_at(deadline.into(), conn.read(&mut buf)).await;
        let n = match read {
            Err(_) => return Err(408),
            Ok(Err(_)) => return Err(400),
            Ok(Ok(n)) => n,
        };
        if n == 0 {
            return Err(400);
        }
        head.extend_from_slice(&buf[..n]);
        if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
            return Ok(head);
        }
        if head.len() > MAX_REQUEST {
            return Err(431);
        }
    }
}

async fn handle(mut conn: tokio::net::TcpStream, endpoint: &Endpoint, accepted: Instant) {
    let answer = match read_head(&mut conn, accepted + IO_TIMEOUT).await {
        Ok(head) => route(&head, endpoint),
        Err(code) => response(code, "text/plain", b"bad request\n", false),
    };
    let _ = conn.write_all(&answer).await;
    let _ = conn.shutdown().await;
}

/// The answer to a request head.
fn route(head: &[u8], endpoint: &Endpoint) -> Vec<u8> {
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let head_only = method == "HEAD";
    if method != "GET" && !head_only {
        return response(405, "text/plain", b"only GET\n", false);
    }
    let path = target.split('?').next().unwrap_or("");
    match path {
        "/metrics" => response(
            200,
            "text/plain; version=0.0.4; charset=utf-8",
            endpoint.page().as_bytes(),
            head_only,
        ),
        "/healthz" => match endpoint.ready() {
            Ok(()) => match endpoint.warning() {
                None => response(200, "text/plain", b"ready\n", head_only),
                Some(w) => response(
                    200,
                    "text/plain",
                    format!("ready; warning: {w}\n").as_bytes(),
                    head_only,
                ),
            },
            Err(why) => response(
                503,
                "text/plain",
                format!("not ready: {why}\n").as_bytes(),
                head_only,
            ),
        },
        "/livez" => match endpoint.live() {
            Ok(()) => response(200, "text/plain", b"alive\n", head_only),
            Err(why) => response(
                503,
                "text/plain",
                format!("not alive: {why}\n").as_bytes(),
                head_only,
            ),
        },
        _ => response(
            404,
            "text/plain",
            b"not found: /metrics, /healthz, /livez\n",
            head_only,
        ),
    }
}

/// A whole HTTP/1.1 answer (the connection closes after it).
fn response(code: u16, content_type: &str, body: &[u8], head_only: bool) -> Vec<u8> {
    let reason = match code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        _ => "Service Unavailable",
    };
    let mut out = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !head_only {
        out.extend_from_slice(body);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;
    use crate::health::{check, HealthError};

    fn get(addr: SocketAddr, request: &[u8]) -> String {
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(request).unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn serves_the_published_page_and_readiness() {
        let ep = Endpoint::new("starting");
        let server = serve("127.0.0.1:0", Arc::clone(&ep)).unwrap();
        let addr = server.addr();
        match check(&addr.to_string(), "/healthz", Duration::from_secs(2)) {
            Err(HealthError::Status(503, body)) => assert!(body.contains("starting"), "{body}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            check(&addr.to_string(), "/livez", Duration::from_secs(2)).unwrap(),
            "alive\n"
        );
        ep.publish("m 1\n".into());
        ep.set_ready();
        assert_eq!(
            check(&addr.to_string(), "/healthz", Duration::from_secs(2)).unwrap(),
            "ready\n"
        );
        // A warning keeps the process ready (200) and says why it is worth a look.
        ep.set_warning(Some("the last 2 checkpoints failed".into()));
        assert_eq!(
            check(&addr.to_string(), "/healthz", Duration::from_secs(2)).unwrap(),
            "ready; warning: the last 2 checkpoints failed\n"
        );
        ep.set_warning(None);
        assert!(!ep.progressed());
        ep.progress(Duration::from_secs(60));
        assert!(ep.progressed());
        let page = get(addr, b"GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(page.starts_with("HTTP/1.1 200 OK\r\n"), "{page}");
        assert!(page.contains("version=0.0.4"), "{page}");
        assert!(page.ends_with("\r\n\r\nm 1\n"), "{page}");
    }

    #[test]
    fn bad_requests_get_an_error_and_the_server_carries_on() {
        let ep = Endpoint::new("x");
        let server = serve("127.0.0.1:0", ep).unwrap();
        let addr = server.addr();
        assert!(get(addr, b"POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        assert!(get(addr, b"GET /nope HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        let huge = vec![b'a'; MAX_REQUEST + 1];
        assert!(get(addr, &huge).starts_with("HTTP/1.1 431"));
        // Meanwhile a silent client does not keep others waiting.
        let _silent = TcpStream::connect(addr).unwrap();
        assert!(get(addr, b"GET /livez HTTP/1.0\r\n\r\n").starts_with("HTTP/1.1 200"));
    }

    #[test]
    fn a_client_that_trickles_its_request_is_cut_off_at_the_deadline() {
        let server = serve("127.0.0.1:0", Endpoint::new("x")).unwrap();
        let mut c = TcpStream::connect(server.addr()).unwrap();
        let start = Instant::now();
        // One byte every 200 ms: each read returns well within any per-read timeout.
        let mut answer = String::new();
        c.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
        for b in b"GET /livez HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaa" {
            // Stop once the server has answered (writing on would reset the connection
            // before its answer is read).
            if c.peek(&mut [0u8; 1]).is_ok_and(|n| n > 0) || c.write_all(&[*b]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = c.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
        let took = start.elapsed();
        assert!(
            took < IO_TIMEOUT + Duration::from_millis(1500),
            "cut off after {took:?}"
        );
    }

    #[test]
    fn probes_are_answered_while_silent_sockets_flood_the_endpoint() {
        let server = serve("127.0.0.1:0", Endpoint::new("x")).unwrap();
        let addr = server.addr();
        // Hundreds of sockets that never send a byte, reopened as the server drops them
        // (with a thread per connection and 16 slots, every probe failed).
        let flooding = Arc::new(AtomicBool::new(true));
        let flood = {
            let flooding = Arc::clone(&flooding);
            std::thread::spawn(move || {
                let mut held = Vec::new();
                while flooding.load(Ordering::Relaxed) {
                    held.retain(|s: &TcpStream| s.peek(&mut [0u8; 1]).is_err());
                    while held.len() < 300 {
                        match TcpStream::connect(addr) {
                            Ok(s) => {
                                s.set_nonblocking(true).unwrap();
                                held.push(s);
                            }
                            Err(_) => break,
                        }
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        };
        std::thread::sleep(Duration::from_millis(300));
        for i in 0..20 {
            let t = Instant::now();
            let answer = check(&addr.to_string(), "/livez", Duration::from_secs(1));
            assert_eq!(
                answer.as_deref().ok(),
                Some("alive\n"),
                "probe {i}: {answer:?}"
            );
            assert!(
                t.elapsed() < Duration::from_secs(1),
                "probe {i}: {:?}",
                t.elapsed()
            );
            std::thread::sleep(Duration::from_millis(150));
        }
        flooding.store(false, Ordering::Relaxed);
        flood.join().unwrap();
    }

    #[test]
    fn livez_fails_once_progress_stops_but_not_before_it_starts() {
        let ep = Endpoint::new("starting");
        let server = serve("127.0.0.1:0", Arc::clone(&ep)).unwrap();
        let addr = server.addr().to_string();
        let live = || check(&addr, "/livez", Duration::from_secs(2));
        // Before the first sign of progress (a checkpoint loading): alive.
        std::thread::sleep(Duration::from_millis(150));
        assert_eq!(live().unwrap(), "alive\n");
        ep.progress(Duration::from_millis(100));
        assert_eq!(live().unwrap(), "alive\n");
        std::thread::sleep(Duration::from_millis(200));
        match live() {
            Err(HealthError::Status(503, body)) => assert!(body.contains("no progress"), "{body}"),
            other => panic!("{other:?}"),
        }
        ep.progress(Duration::from_millis(100));
        assert_eq!(live().unwrap(), "alive\n");
    }

    #[test]
    fn one_wedged_part_fails_livez_while_the_others_progress() {
        let ep = Endpoint::new("starting");
        let limit = Duration::from_millis(100);
        ep.progress_of("group 0", limit);
        ep.progress_of("group 1", limit);
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(60));
            ep.progress_of("group 1", limit);
        }
        let why = ep.live().unwrap_err();
        assert!(why.starts_with("group 0: no progress"), "{why}");
        // A part that finished its work is no longer watched.
        ep.finished("group 0");
        assert_eq!(ep.live(), Ok(()));
        assert!(ep.progressed());
    }

    #[test]
    fn dropping_the_handle_stops_the_server() {
        let server = serve("127.0.0.1:0", Endpoint::new("x")).unwrap();
        let addr = server.addr();
        drop(server);
        assert!(check(&addr.to_string(), "/livez", Duration::from_millis(500)).is_err());
    }
}
