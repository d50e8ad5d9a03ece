//! The `/metrics` endpoint of `serve` (and of `record` and the TUI with `--listen`): the page is
//! built once per probe interval from the probes' totals and scrapes only copy the latest one,
//! so a scrape never waits for the probes and the probes never wait for a scrape, whatever the
//! scrape rate. The pages are encoded by `exposition`, the exporter's wire format.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use virtgap_probes::ProbeSnapshot;

use crate::model::metrics::MetricFamily;
use crate::run::exporter::{Exporter, ExporterContext};

/// The content type of the OpenMetrics page.
const OPENMETRICS_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The content type of the classic text format's page.
const CLASSIC_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// An endpoint shared by the runs of one command (`record --runs`, the TUI's restarts).
pub type SharedEndpoint = Arc<MetricsEndpoint>;

/// `--listen ADDR` on `record` and the TUI: the endpoint, bound before anything runs.
pub fn listen(addr: Option<SocketAddr>) -> Result<Option<SharedEndpoint>> {
    addr.map(|a| MetricsEndpoint::bind(a).map(Arc::new))
        .transpose()
}

/// The latest figures in both formats.
#[derive(Debug, Default)]
struct Pages {
    openmetrics: String,
    classic: String,
}

/// The latest pages, shared between the collector's side and the endpoint's thread.
type Latest = Arc<RwLock<Arc<Pages>>>;

/// A listening endpoint and the exporter that fills it.
#[derive(Debug)]
pub struct MetricsEndpoint {
    latest: Latest,
    /// Set once the probes attached; the one writer is the run's loop, so the lock is
    /// uncontended (scrapes read `latest`).
    exporter: Mutex<Option<Exporter>>,
    stop: Arc<AtomicBool>,
    /// Wakes the endpoint's loop to see `stop`.
    waker: Arc<Waker>,
    /// Where it listens (the port the system chose, for `:0`).
    local_addr: SocketAddr,
    thread: Option<JoinHandle<()>>,
}

impl MetricsEndpoint {
    /// Listens on `addr` (an error names the flag and a fix) and answers from now on: 503
    /// until [`Self::follow`] gives the first page.
    pub fn bind(addr: SocketAddr) -> Result<Self> {
        let listener = std::net::TcpListener::bind(addr).with_context(|| {
            format!(
                "--listen {addr}: cannot listen there; pick a free port (e.g. --listen 127.0.0.1:9478)"
            )
        })?;
        let local_addr = listener
            .local_addr()
            .context("reading the listening socket's address")?;
        listener
            .set_nonblocking(true)
            .context("making the listening socket non-blocking")?;
        let listener = TcpListener::from_std(listener);
        let poll = Poll::new().context("starting the metrics endpoint's poll")?;
        let waker = Arc::new(
            Waker::new(poll.registry(), WAKER).context("starting the metrics endpoint's waker")?,
        );
        let latest: Latest = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let latest = Arc::clone(&latest);
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("metrics-endpoint".into())
                .spawn(move || endpoint(poll, listener, &latest, &stop))
                .context("starting the metrics endpoint")?
        };
        Ok(Self {
            latest,
            exporter: Mutex::new(None),
            stop,
            waker,
            local_addr,
            thread: Some(thread),
        })
    }

    /// The address it listens on, with the port the system chose when asked for port 0.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// What the probes follow on this host, once they are attached: the page then holds the
    /// host's fingerprint, and each snapshot published after it.
    pub fn follow(&self, cx: ExporterContext) {
        let mut exporter = Exporter::new(cx);
        let families = exporter.families(&ProbeSnapshot::default());
        *self.exporter.lock().unwrap_or_else(|e| e.into_inner()) = Some(exporter);
        self.store(families);
    }

    /// The probes' totals since they attached, as the next page.
    pub fn publish(&self, total: &ProbeSnapshot) {
        let mut exporter = self.exporter.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(exporter) = exporter.as_mut() {
            let families = exporter.families(total);
            self.store(families);
        }
    }

    fn store(&self, families: Vec<MetricFamily>) {
        let (openmetrics, classic) = crate::run::exposition::pages(families);
        let pages = Arc::new(Pages {
            openmetrics,
            classic,
        });
        *self.latest.write().unwrap_or_else(|e| e.into_inner()) = pages;
    }
}

impl Drop for MetricsEndpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // No client holds the loop: it sees the stop at once, whoever is connected.
        let _ = self.waker.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Most a request may send before its blank line; a scrape's is a few hundred bytes.
const MAX_REQUEST: usize = 8 * 1024;
/// How long one client has, from its connection, to send its request and read the whole
/// answer: a scrape takes milliseconds, Prometheus' own timeout is 10 s.
const CLIENT_DEADLINE: Duration = Duration::from_secs(5);
/// Most connections open at once. Past it the connection open longest is closed to make room:
/// a scrape is answered within milliseconds of its connect, so the oldest is a client that
/// stalls, and a crowd of idle or trickling connections cannot lock scrapers out.
const MAX_CONNECTIONS: usize = 64;

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);

/// The endpoint: one thread serving every open connection at once from one readiness loop
/// (mio). Not a thread per connection, and not an HTTP crate's server (tiny_http and hyper
/// start a thread or task per connection): the endpoint costs the same whatever the number of
/// scrapers, and no client, however slow, holds up another or the shutdown — each has a
/// deadline for its whole exchange, counted from its connection.
fn endpoint(mut poll: Poll, mut listener: TcpListener, latest: &Latest, stop: &AtomicBool) {
    if poll
        .registry()
        .register(&mut listener, LISTENER, Interest::READABLE)
        .is_err()
    {
        return;
    }
    let mut events = Events::with_capacity(128);
    let mut open: HashMap<Token, Connection> = HashMap::new();
    let mut next = WAKER.0 + 1;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        let wait = open
            .values()
            .map(|c| c.deadline.saturating_duration_since(now))
            .min();
        if let Err(e) = poll.poll(&mut events, wait) {
            if e.kind() != ErrorKind::Interrupted {
                // Nothing to wait on any more; the page is still published, just not served.
                return;
            }
        }
        for event in &events {
            match event.token() {
                WAKER => {}
                LISTENER => accept_all(&listener, &poll, &mut open, &mut next),
                token => {
                    let done = open
                        .get_mut(&token)
                        .is_none_or(|c| c.advance(latest, poll.registry(), token));
                    if done {
                        close(&poll, &mut open, token);
                    }
                }
            }
        }
        let now = Instant::now();
        let late: Vec<Token> = open
            .iter()
            .filter(|(_, c)| c.deadline <= now)
            .map(|(t, _)| *t)
            .collect();
        for token in late {
            close(&poll, &mut open, token);
        }
    }
}

/// Accepts every waiting connection (the listener is edge-triggered), closing the oldest open
/// one for each past the limit.
fn accept_all(
    listener: &TcpListener,
    poll: &Poll,
    open: &mut HashMap<Token, Connection>,
    next: &mut usize,
) {
    loop {
        let (mut stream, _) = match listener.accept() {
            Ok(accepted) => accepted,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            // Out of descriptors, or a connection reset before it was accepted: the next
            // readiness event tries again.
            Err(_) => return,
        };
        if open.len() >= MAX_CONNECTIONS {
            if let Some(oldest) = open.iter().min_by_key(|(_, c)| c.deadline).map(|(t, _)| *t) {
                close(poll, open, oldest);
            }
        }
        let token = Token(*next);
        *next = next.wrapping_add(1).max(WAKER.0 + 1);
        if poll
            .registry()
            .register(&mut stream, token, Interest::READABLE)
            .is_ok()
        {
            open.insert(token, Connection::new(stream));
        }
    }
}

fn close(poll: &Poll, open: &mut HashMap<Token, Connection>, token: Token) {
    if let Some(mut c) = open.remove(&token) {
        let _ = poll.registry().deregister(&mut c.stream);
    }
}

/// One client's exchange: its request as it arrives, then the answer as the socket takes it.
struct Connection {
    stream: TcpStream,
    deadline: Instant,
    request: Vec<u8>,
    answer: Option<Answer>,
}

/// How much of a request has arrived.
enum Request {
    Partial,
    Whole,
    TooLong,
}

/// An answer being written: its head, its body (shared, not copied), and how much is sent.
struct Answer {
    head: Vec<u8>,
    body: Option<Body>,
    sent: usize,
}

impl Connection {
    fn new(stream: TcpStream) -> Self {
        Self {
            stream,
            deadline: Instant::now() + CLIENT_DEADLINE,
            request: Vec::with_capacity(512),
            answer: None,
        }
    }

    /// Reads and writes what the socket allows now; true when the exchange is over (answered,
    /// closed by the client, or failed: a client that misbehaves loses its own answer only).
    fn advance(&mut self, latest: &Latest, registry: &Registry, token: Token) -> bool {
        if self.answer.is_none() {
            let answer = match self.read_request() {
                Err(()) => return true,
                Ok(Request::Partial) => return false,
                Ok(Request::TooLong) => Answer {
                    head: b"HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\nContent-Length: 0\r\n\r\n".to_vec(),
                    body: None,
                    sent: 0,
                },
                Ok(Request::Whole) => answer_for(&String::from_utf8_lossy(&self.request), latest),
            };
            self.answer = Some(answer);
            if registry
                .reregister(&mut self.stream, token, Interest::WRITABLE)
                .is_err()
            {
                return true;
            }
        }
        self.write_answer()
    }

    /// Reads what has arrived of the request; Err when the client closed or failed.
    fn read_request(&mut self) -> Result<Request, ()> {
        let mut buf = [0u8; 1024];
        loop {
            match self.stream.read(&mut buf) {
                Ok(0) => return Err(()),
                Ok(n) => self.request.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(Request::Partial),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return Err(()),
            }
            if self.request.len() > MAX_REQUEST {
                return Ok(Request::TooLong);
            }
            if self.request.windows(4).any(|w| w == b"\r\n\r\n") {
                return Ok(Request::Whole);
            }
        }
    }

    /// Writes what the socket takes; true once all of it is sent (or the write failed).
    fn write_answer(&mut self) -> bool {
        let Some(a) = self.answer.as_mut() else {
            return false;
        };
        loop {
            let body = a.body.as_ref().map_or(&b""[..], |b| b.as_str().as_bytes());
            let pending: &[u8] = if a.sent < a.head.len() {
                &a.head[a.sent..]
            } else if a.sent - a.head.len() < body.len() {
                &body[a.sent - a.head.len()..]
            } else {
                return true;
            };
            match self.stream.write(pending) {
                Ok(0) => return true,
                Ok(n) => a.sent += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return true,
            }
        }
    }
}

/// The answer to a whole request head: status line and headers, and the body unless HEAD.
fn answer_for(head: &str, latest: &Latest) -> Answer {
    let (status, content_type, body) = route(head, latest);
    let allow = if status.starts_with("405") {
        "Allow: GET, HEAD\r\n"
    } else {
        ""
    };
    let header = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
        body.as_str().len()
    );
    Answer {
        head: header.into_bytes(),
        body: (!head.starts_with("HEAD ")).then_some(body),
        sent: 0,
    }
}

/// What a request gets: status, content type and body. `/metrics` answers in OpenMetrics when
/// the client accepts it (Prometheus does), else in the classic text format.
fn route(head: &str, latest: &Latest) -> (&'static str, &'static str, Body) {
    let mut lines = head.lines();
    let mut parts = lines.next().unwrap_or("").split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let openmetrics = lines.any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("accept") && v.contains("application/openmetrics-text")
        })
    });
    let text = |s: &'static str| Body::Text(s);
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => {
            let pages = Arc::clone(&latest.read().unwrap_or_else(|e| e.into_inner()));
            if pages.openmetrics.is_empty() {
                // An empty 200 reads as a page with no series (and no `# EOF`, which
                // OpenMetrics requires): say instead that there is nothing yet.
                (
                    "503 Service Unavailable",
                    "text/plain; charset=utf-8",
                    text("no figures yet: the probes are still attaching\n"),
                )
            } else if openmetrics {
                ("200 OK", OPENMETRICS_TYPE, Body::OpenMetrics(pages))
            } else {
                ("200 OK", CLASSIC_TYPE, Body::Classic(pages))
            }
        }
        ("GET" | "HEAD", "/") => (
            "200 OK",
            "text/plain; charset=utf-8",
            text("virtgap serve: the probes' metrics are at /metrics\n"),
        ),
        ("GET" | "HEAD", _) => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            text("not found: the metrics are at /metrics\n"),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            text("only GET and HEAD\n"),
        ),
    }
}

/// A response body: one of the shared pages, or a fixed text.
enum Body {
    OpenMetrics(Arc<Pages>),
    Classic(Arc<Pages>),
    Text(&'static str),
}

impl Body {
    fn as_str(&self) -> &str {
        match self {
            Self::OpenMetrics(p) => &p.openmetrics,
            Self::Classic(p) => &p.classic,
            Self::Text(t) => t,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GET /metrics on a fresh connection, answered within `within` or an error.
    fn scrape(addr: SocketAddr, within: Duration) -> std::io::Result<String> {
        let mut s = std::net::TcpStream::connect_timeout(&addr, within)?;
        s.set_read_timeout(Some(within))?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")?;
        let mut answer = String::new();
        s.read_to_string(&mut answer)?;
        Ok(answer)
    }

    /// Idle connections, more than the endpoint keeps, and clients that trickle their request
    /// do not hold up a scrape (each is served beside the others, the oldest closed past the
    /// limit), nor the endpoint's shutdown. The bound is far above a scrape's milliseconds and
    /// far below the 5 s one stalled client used to cost each scrape behind it.
    #[test]
    fn idle_and_trickling_clients_do_not_hold_up_a_scrape_or_the_shutdown() {
        let endpoint = MetricsEndpoint::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = endpoint.local_addr();
        assert_ne!(addr.port(), 0);
        let before = scrape(addr, Duration::from_secs(3)).unwrap();
        assert!(before.starts_with("HTTP/1.1 503"), "{before}");
        endpoint.store(vec![MetricFamily {
            name: "virtgap_page",
            help: "A page",
            unit: None,
            kind: crate::model::metrics::MetricKind::Gauge,
            samples: vec![crate::model::metrics::Sample {
                labels: vec![],
                value: crate::model::metrics::SampleValue::Number(1.0),
            }],
        }]);
        let mut idle: Vec<std::net::TcpStream> = (0..MAX_CONNECTIONS + 16)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        for s in idle.iter_mut().take(8) {
            s.write_all(b"GET /met").unwrap();
        }
        let answer = scrape(addr, Duration::from_secs(3)).expect("a scrape beside idle clients");
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
        assert!(answer.ends_with("virtgap_page 1\n"), "{answer}");
        let started = Instant::now();
        drop(endpoint);
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "shutdown waited {:?} for its clients",
            started.elapsed()
        );
    }

    #[test]
    fn requests_are_routed_by_method_path_and_accept() {
        let latest: Latest = Arc::new(RwLock::new(Arc::new(Pages {
            openmetrics: "om".into(),
            classic: "classic".into(),
        })));
        let get = |head: &str| {
            let (status, _, body) = route(head, &latest);
            (status, body.as_str().to_string())
        };
        assert_eq!(get("GET /metrics HTTP/1.1\r\nAccept: */*\r\n").1, "classic");
        assert_eq!(
            get("GET /metrics HTTP/1.1\r\naccept: application/openmetrics-text;version=1.0.0,text/plain;q=0.5\r\n").1,
            "om"
        );
        assert_eq!(get("GET /metrics?x=1 HTTP/1.1").0, "200 OK");
        assert_eq!(get("GET /other HTTP/1.1").0, "404 Not Found");
        assert_eq!(get("POST /metrics HTTP/1.1").0, "405 Method Not Allowed");
        assert_eq!(get("").0, "405 Method Not Allowed");
        let before: Latest = Arc::default();
        assert_eq!(
            route("GET /metrics HTTP/1.1\r\n", &before).0,
            "503 Service Unavailable"
        );
    }
}
