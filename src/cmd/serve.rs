//! `virtgap serve`: the probes run continuously — following processes, a cgroup, or every
//! process — and `/metrics` serves their totals for Prometheus. The page is built once per
//! probe interval by the collector's side and scrapes only copy the latest one, so a scrape
//! never waits for the probes and the probes never wait for a scrape, whatever the scrape rate.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, RwLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use virtgap_probes::follow::AttachTarget;
use virtgap_probes::ProbeEvent;

use crate::cli::ServeArgs;
use crate::run::exporter::{Exporter, ExporterContext};
use crate::run::pipeline::Event;
use crate::run::session::{probe_config, start_collector, ProbeChoice};
use crate::run::signals::StopSignals;

pub fn run(args: &ServeArgs) -> Result<ExitCode> {
    if args.probe.no_probes {
        bail!("serve exports what the probes measure: drop --no-probes");
    }
    crate::cli::check_interval(&args.interval)?;
    let target = args.attach.target();
    if let Some(t) = &target {
        let root = std::path::Path::new("/");
        virtgap_probes::follow::check_pid_namespace(root)?;
        t.resolve(root)?;
    }
    let signals = StopSignals::install(true)?;
    let plan = ServePlan {
        listen: args.listen,
        target,
        label: args.attach.label.clone(),
        interval: args.interval.0,
        duration: args.duration.as_ref().map(|d| d.value.0),
        probes: args.probe.choice(),
    };
    serve(&plan, &signals.stop, !args.quiet)?;
    // A signal is how a server is meant to stop: that is success.
    Ok(ExitCode::SUCCESS)
}

/// What to serve and what to follow.
#[derive(Clone, Debug)]
pub struct ServePlan {
    pub listen: SocketAddr,
    /// None: every process of the host.
    pub target: Option<AttachTarget>,
    pub label: Option<String>,
    pub interval: Duration,
    /// None: until a signal.
    pub duration: Option<Duration>,
    pub probes: ProbeChoice,
}

impl ServePlan {
    fn describe(&self) -> String {
        self.target
            .as_ref()
            .map_or("every process".into(), AttachTarget::describe)
    }
}

/// The latest figures in both formats, built once per interval.
#[derive(Debug)]
struct Pages {
    openmetrics: String,
    classic: String,
}

impl Pages {
    fn of(families: Vec<crate::model::metrics::MetricFamily>) -> Self {
        Self {
            classic: crate::render::metrics::encode_classic(&families),
            openmetrics: crate::render::metrics::encode(families),
        }
    }
}

/// The latest pages, shared between the collector's loop and the endpoint.
type Latest = Arc<RwLock<Arc<Pages>>>;

/// Binds the endpoint (so a taken port is refused before any probe loads), attaches the
/// probes, and serves until `stop` or `--duration`.
pub fn serve(plan: &ServePlan, stop: &Arc<AtomicBool>, verbose: bool) -> Result<()> {
    let listener = TcpListener::bind(plan.listen).with_context(|| {
        format!(
            "--listen {}: cannot listen there; pick a free port (e.g. --listen 127.0.0.1:9478)",
            plan.listen
        )
    })?;
    let mut config = probe_config(&plan.probes, plan.interval)?
        .context("serve exports what the probes measure: drop --no-probes")?;
    config.filter_tgid = None;
    config.follow = plan.target.clone();
    if plan.probes.families.is_none() && plan.target.is_some() {
        config.families.push(virtgap_probes::Family::App);
    }
    let (tx, rx) = mpsc::channel::<Event>();
    let (collector, report) = start_collector(config, plan.interval, &tx, &rx)?;
    drop(tx);
    let mut exporter = Exporter::new(ExporterContext {
        host: crate::model::host::Fingerprint::this_host(),
        label: plan.label.clone().unwrap_or_default(),
        attached: plan.describe(),
        report,
    });
    // Until the first interval ends the page holds what is known: the host, nothing measured.
    let latest: Latest = Arc::new(RwLock::new(Arc::new(Pages::of(
        exporter.families(&virtgap_probes::ProbeSnapshot::default()),
    ))));
    let wake = wake_address(&listener)?;
    let endpoint = {
        let latest = Arc::clone(&latest);
        let stop = Arc::clone(stop);
        std::thread::Builder::new()
            .name("metrics-endpoint".into())
            .spawn(move || endpoint(&listener, &latest, &stop))
            .context("starting the metrics endpoint")?
    };
    if verbose {
        say!(
            "serving http://{}/metrics: probes attached, following {}, updated every {}",
            plan.listen,
            plan.describe(),
            humantime::format_duration(plan.interval)
        );
    }
    let started = Instant::now();
    let mut told_gone = false;
    while !stop.load(Ordering::Relaxed) {
        if plan.duration.is_some_and(|d| started.elapsed() >= d) {
            break;
        }
        let Ok(event) = rx.recv_timeout(Duration::from_millis(100)) else {
            continue;
        };
        let Event::Probe(ProbeEvent::Snapshot { cumulative, .. }) = event else {
            continue;
        };
        if verbose && !told_gone && cumulative.followed.as_ref().is_some_and(Vec::is_empty) {
            say!("every followed process has exited; serving their totals until stopped");
            told_gone = true;
        }
        let pages = Arc::new(Pages::of(exporter.families(&cumulative)));
        *latest.write().unwrap_or_else(|e| e.into_inner()) = pages;
    }
    stop.store(true, Ordering::Relaxed);
    collector.stop();
    // The endpoint waits in accept: a connection of our own wakes it to see the stop.
    let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
    let _ = endpoint.join();
    Ok(())
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
                (
                    "200 OK",
                    crate::render::metrics::CONTENT_TYPE,
                    Body::OpenMetrics(pages),
                )
            } else {
                (
                    "200 OK",
                    crate::render::metrics::CLASSIC_CONTENT_TYPE,
                    Body::Classic(pages),
                )
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
