//! The `/metrics` endpoint of `serve` (and of `record` and the TUI with `--listen`): the page is
//! built once per probe interval from the probes' totals and scrapes only copy the latest one,
//! so a scrape never waits for the probes and the probes never wait for a scrape, whatever the
//! scrape rate. The encoder is handed in (the renderers' `metrics::pages`), so this module
//! serves text it does not write.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};
use virtgap_probes::ProbeSnapshot;

use crate::model::metrics::MetricFamily;
use crate::run::exporter::{Exporter, ExporterContext};

/// Encodes the families as (OpenMetrics, classic text format).
pub type Encoder = fn(Vec<MetricFamily>) -> (String, String);

/// The content type of the OpenMetrics page.
const OPENMETRICS_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The content type of the classic text format's page.
const CLASSIC_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// An endpoint shared by the runs of one command (`record --runs`, the TUI's restarts).
pub type SharedEndpoint = Arc<MetricsEndpoint>;

/// `--listen ADDR` on `record` and the TUI: the endpoint, bound before anything runs.
pub fn listen(addr: Option<SocketAddr>, encode: Encoder) -> Result<Option<SharedEndpoint>> {
    addr.map(|a| MetricsEndpoint::bind(a, encode).map(Arc::new))
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
    encode: Encoder,
    /// Set once the probes attached; the one writer is the run's loop, so the lock is
    /// uncontended (scrapes read `latest`).
    exporter: Mutex<Option<Exporter>>,
    stop: Arc<AtomicBool>,
    wake: SocketAddr,
    thread: Option<JoinHandle<()>>,
}

impl MetricsEndpoint {
    /// Listens on `addr` (an error names the flag and a fix) and answers from now on; the page
    /// is empty until [`Self::follow`] and the first [`Self::publish`].
    pub fn bind(addr: SocketAddr, encode: Encoder) -> Result<Self> {
        let listener = TcpListener::bind(addr).with_context(|| {
            format!(
                "--listen {addr}: cannot listen there; pick a free port (e.g. --listen 127.0.0.1:9478)"
            )
        })?;
        let wake = wake_address(&listener)?;
        let latest: Latest = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let latest = Arc::clone(&latest);
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("metrics-endpoint".into())
                .spawn(move || endpoint(&listener, &latest, &stop))
                .context("starting the metrics endpoint")?
        };
        Ok(Self {
            latest,
            encode,
            exporter: Mutex::new(None),
            stop,
            wake,
            thread: Some(thread),
        })
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
        let (openmetrics, classic) = (self.encode)(families);
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
        // The endpoint waits in accept: a connection of our own wakes it to see the stop.
        let _ = TcpStream::connect_timeout(&self.wake, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Where a connection reaches the listener from this host (loopback for a wildcard address).
fn wake_address(listener: &TcpListener) -> Result<SocketAddr> {
    let mut addr = listener
        .local_addr()
        .context("reading the listening socket's address")?;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    Ok(addr)
}

/// Most a request may send before its blank line; a scrape's is a few hundred bytes.
const MAX_REQUEST: usize = 8 * 1024;
/// How long one client may take to send its request or read the page.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// The endpoint: one thread answering one connection at a time. A hand-written loop rather
/// than an HTTP crate's server: tiny_http and hyper start a thread or task per open connection,
/// and this endpoint must cost the same whatever the number of scrapers — one thread, one
/// request buffer, the page shared by reference.
fn endpoint(listener: &TcpListener, latest: &Latest, stop: &AtomicBool) {
    loop {
        let accepted = listener.accept();
        if stop.load(Ordering::Relaxed) {
            return;
        }
        match accepted {
            // A client that misbehaves loses its own answer, nothing else.
            Ok((stream, _)) => drop(answer(stream, latest)),
            // Out of descriptors, or a connection reset before it was accepted: wait a little.
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
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
            if openmetrics {
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

fn answer(mut stream: TcpStream, latest: &Latest) -> std::io::Result<()> {
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut request = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        request.extend_from_slice(&buf[..n]);
        if request.len() > MAX_REQUEST {
            stream.write_all(
                b"HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
            )?;
            return Ok(());
        }
    }
    let head = String::from_utf8_lossy(&request);
    let (status, content_type, body) = route(&head, latest);
    let body = body.as_str();
    let header = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(header.as_bytes())?;
    if !head.starts_with("HEAD ") {
        stream.write_all(body.as_bytes())?;
    }
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
