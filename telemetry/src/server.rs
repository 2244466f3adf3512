//! The monitoring endpoint's HTTP server: `GET /metrics`, `/healthz`, `/livez` on one
//! listener, served by hyper (HTTP/1.1, one request per connection).
//!
//! Its own thread, running a small single-threaded tokio runtime of its own (never the
//! one that carries the actors' data): a scrape every few seconds and health probes,
//! not traffic. hyper parses each request (a head over [`MAX_REQUEST`] bytes gets 431)
//! within a deadline from its acceptance ([`IO_TIMEOUT`]); the places connections hold
//! are kept by [`crate::connections`], which closes the oldest idle connection when a
//! new one finds none, so sockets held open without a word cannot starve the probes.
//!
//! Why hyper rather than the hand-written responder this replaced: the responder's own
//! parsing was where its bugs were (a 9,016-byte head answered 404, not 431, because it
//! looked for the blank line before checking the size), and a well-kept HTTP stack
//! parses, bounds and times out requests the way every client expects; what is ours is
//! only the policy of which connection keeps a place.

use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONNECTION, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};

use crate::connections::{Connections, Place};
use crate::endpoint::Endpoint;

/// Requests larger than this (request line and headers) are refused with 431 (hyper's
/// smallest read buffer, which bounds the head).
const MAX_REQUEST: usize = 8 * 1024;
/// A client has this long to send its request, and as long again to take the answer.
const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// The answer when every place holds a request being answered.
const BUSY: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nConnection: close\r\n\r\nbusy\n";

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
        let connections = Arc::new(Mutex::new(Connections::default()));
        loop {
            let conn = listener.accept().await;
            if stop.load(Ordering::Relaxed) {
                // Dropping the runtime ends every connection's task.
                return;
            }
            let Ok((conn, peer)) = conn else {
                // Out of descriptors, say: try again shortly rather than spin.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let Some(place) = lock(&connections).admit(peer.ip()) else {
                // Without waiting for the request: at most the socket buffer's worth.
                let _ = conn.try_write(BUSY);
                continue;
            };
            let (endpoint, connections) = (Arc::clone(&endpoint), Arc::clone(&connections));
            tokio::spawn(async move {
                let id = place.id;
                serve_one(conn, endpoint, place).await;
                lock(&connections).close(id);
            });
        }
    });
}

/// Answers one connection's one request, unless it is evicted first (see
/// [`crate::connections`]); the whole exchange within twice [`IO_TIMEOUT`].
async fn serve_one(conn: tokio::net::TcpStream, endpoint: Arc<Endpoint>, place: Place) {
    let Place { busy, evicted, .. } = place;
    let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
        busy.store(true, Ordering::Release);
        let answer = route(&request, &endpoint);
        async move { Ok::<_, Infallible>(answer) }
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(IO_TIMEOUT)
        .keep_alive(false)
        .max_buf_size(MAX_REQUEST);
    let serving = http.serve_connection(TokioIo::new(conn), service);
    tokio::select! {
        _ = tokio::time::timeout(2 * IO_TIMEOUT, serving) => {}
        _ = evicted => {}
    }
}

/// The answer to a request.
fn route<B>(request: &Request<B>, endpoint: &Endpoint) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return response(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "only GET\n");
    }
    let text = "text/plain";
    match request.uri().path() {
        "/metrics" => response(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            Bytes::copy_from_slice(endpoint.page().as_bytes()),
        ),
        "/healthz" => match endpoint.ready() {
            Ok(()) => match endpoint.warning() {
                None => response(StatusCode::OK, text, "ready\n"),
                Some(w) => response(StatusCode::OK, text, format!("ready; warning: {w}\n")),
            },
            Err(why) => response(
                StatusCode::SERVICE_UNAVAILABLE,
                text,
                format!("not ready: {why}\n"),
            ),
        },
        "/livez" => match endpoint.live() {
            Ok(()) => response(StatusCode::OK, text, "alive\n"),
            Err(why) => response(
                StatusCode::SERVICE_UNAVAILABLE,
                text,
                format!("not alive: {why}\n"),
            ),
        },
        _ => response(
            StatusCode::NOT_FOUND,
            text,
            "not found: /metrics, /healthz, /livez\n",
        ),
    }
}

/// A whole answer; the connection closes after it (hyper leaves a HEAD's body out).
fn response(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut answer = Response::new(Full::new(body.into()));
    *answer.status_mut() = status;
    let headers = answer.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(CONNECTION, HeaderValue::from_static("close"));
    answer
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::time::Instant;

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
        // Regression (issue "One bad transition…", part 4): a 9,016-byte head whose
        // blank line came in its last read was answered 404, not 431.
        let mut head = b"GET /nope HTTP/1.1\r\nX-Pad: ".to_vec();
        head.resize(9_012, b'p');
        head.extend_from_slice(b"\r\n\r\n");
        assert_eq!(head.len(), 9_016);
        let answer = get(addr, &head);
        assert!(answer.starts_with("HTTP/1.1 431"), "{answer:?}");
        // Meanwhile a silent client does not keep others waiting.
        let _silent = TcpStream::connect(addr).unwrap();
        let answer = get(addr, b"GET /livez HTTP/1.0\r\n\r\n");
        assert!(answer.starts_with("HTTP/1.0 200"), "{answer:?}");
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
        // Closed at the deadline (hyper says 408 or nothing): never answered.
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
            "{answer:?}"
        );
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
    fn probes_are_answered_under_two_thousand_idle_sockets() {
        // Regression (issue "One bad transition…", part 4): 2,000 idle connections
        // opened at ~500 a second filled every place, and `/livez` answered `503 busy`
        // to 13-16 of 17 probes. Now the oldest idle connection makes room.
        let server = serve("127.0.0.1:0", Endpoint::new("x")).unwrap();
        let addr = server.addr();
        let opening = Arc::new(AtomicBool::new(true));
        let opened = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let opener = {
            let (opening, opened) = (Arc::clone(&opening), Arc::clone(&opened));
            std::thread::spawn(move || {
                let mut held = Vec::with_capacity(2_000);
                while opening.load(Ordering::Relaxed) {
                    // Those the endpoint closed are opened again: up to 2,000 held at a
                    // time, about 500 new ones a second.
                    held.retain(|s: &TcpStream| {
                        let mut byte = [0u8; 1];
                        matches!(s.peek(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
                    });
                    for _ in 0..10 {
                        if held.len() >= 2_000 {
                            break;
                        }
                        if let Ok(s) = TcpStream::connect(addr) {
                            s.set_nonblocking(true).unwrap();
                            held.push(s);
                            opened.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        // The probes begin once 2,000 idle sockets were opened (more than the endpoint
        // has places), and the flood goes on while they run.
        let start = Instant::now();
        while opened.load(Ordering::Relaxed) < 2_000 {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the flood did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        for (i, path) in ["/livez", "/healthz"].iter().cycle().take(17).enumerate() {
            let t = Instant::now();
            let answer = check(&addr.to_string(), path, Duration::from_secs(2));
            match (path, &answer) {
                (&"/livez", Ok(body)) => assert_eq!(body, "alive\n"),
                (&"/healthz", Err(HealthError::Status(503, body))) => {
                    assert!(body.starts_with("not ready: x"), "probe {i}: {body}")
                }
                _ => panic!("probe {i} of {path}: {answer:?}"),
            }
            assert!(
                t.elapsed() < Duration::from_secs(2),
                "probe {i}: {:?}",
                t.elapsed()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        opening.store(false, Ordering::Relaxed);
        opener.join().unwrap();
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
