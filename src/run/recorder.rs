//! The one recorder of a run, for `record` and the TUI alike, with a workload or attached to
//! processes already running (then the probes are its only source): everything the pipeline's
//! events leave behind. The workload's intervals joined with the probes' (the ramp left out), the probes'
//! totals over the measured window (from the ramp's end, or the idle interval's, or the TUI's
//! last reset), the idle baseline, the workers' merged results, the totals so far (what a
//! mid-run profile is made of), and the tail autopsy's material — and the profile of all that.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant, SystemTime};

use virtgap_probes::hypervisor::Hypervisor;
use virtgap_probes::model::{BlockOp, DevNum, SlowCall, SlowRequest};
use virtgap_probes::{CapabilityReport, ProbeEvent, ProbeSnapshot};
use virtgap_workloads::slow::{SlowIo, TailWatch};
use virtgap_workloads::stats::{IntervalMerger, IntervalSample, RunStats};
use virtgap_workloads::{LatencyHistogram, WorkloadError, WorkloadEvent};

use crate::model::attached::AttachEnd;
use crate::model::calibration::Calibration;
use crate::model::histogram::Histogram;
use crate::model::host::{Fingerprint, TargetDisks};
use crate::model::hypervisor::RunHypervisor;
use crate::model::profile::{IdleBaseline, Profile, RunInfo, RunRecord, TargetInfo, WorkloadInfo};
use crate::model::stalls::Stalls;
use crate::model::tail::TailAutopsy;
use crate::run::assemble::{assemble, ProbeInterval, ProfileInputs};
use crate::run::endpoint::SharedEndpoint;
use crate::run::exporter::{ExporterContext, SeriesOptions};
use crate::run::pipeline::{device_name, Event};
use crate::run::series::{block_requests, IntervalSeries};

/// Slow I/Os (or calls), and slow requests, kept for the tail autopsy at most (each ~50 bytes): a TUI
/// runs for as long as it is left open.
pub const MAX_TAIL_MATERIAL: usize = 500_000;

/// How many probe intervals of `interval` fall in a ramp of `ramp`: the one place the ramp is
/// cut, for the series and for the probes' totals alike.
pub fn ramp_intervals(interval: Duration, ramp: Duration) -> u64 {
    (ramp.as_secs_f64() / interval.as_secs_f64().max(1e-9)).round() as u64
}

/// What the recorder needs to know of the run before it starts.
#[derive(Clone, Debug)]
pub struct RecordPlan {
    pub interval: Duration,
    pub ramp: Duration,
    pub disks: TargetDisks,
    /// Whether probe intervals will come.
    pub probed: bool,
    /// The hypervisor the host runs on (its fingerprint's): each interval keeps its
    /// mechanisms' figures.
    pub hypervisor: Hypervisor,
}

/// What an event changed, for a view to follow.
#[derive(Debug)]
pub enum Update {
    Nothing,
    /// What attached.
    Report,
    /// Whole-run workload intervals, merged across the workers, in order.
    Intervals(Vec<IntervalSample>),
    /// A probe interval (its own activity).
    ProbeInterval(Box<ProbeSnapshot>),
    /// A worker ended; `failed` says why when it failed.
    WorkerFinished {
        failed: Option<String>,
    },
}

/// The measured data so far, merged from the intervals: what the TUI shows and a mid-run
/// profile holds (the workers' own results come only when they finish).
#[derive(Clone, Debug, Default)]
pub struct Totals {
    /// App latency (both directions) since start or the last reset.
    pub app: LatencyHistogram,
    pub read_ios: u64,
    pub write_ios: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
}

/// The workload's slow I/Os (an attached run's: the app probe's slow calls) and the block
/// probe's slow requests since the window began, bounded.
#[derive(Debug, Default)]
pub struct TailMaterial {
    pub ios: Vec<SlowIo>,
    pub requests: Vec<SlowRequest>,
    pub calls: Vec<SlowCall>,
    /// Whether the app probe sent slow calls at all (it was asked for them).
    pub calls_asked: bool,
    /// CLOCK_MONOTONIC where the window began: material from before it is left out.
    since_ns: u64,
}

impl TailMaterial {
    pub fn len(&self) -> usize {
        self.ios.len() + self.requests.len() + self.calls.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn restart(&mut self) {
        self.ios.clear();
        self.requests.clear();
        self.calls.clear();
        self.since_ns = virtgap_workloads::slow::monotonic_ns();
    }

    fn add_ios(&mut self, ios: &[SlowIo]) {
        let since = self.since_ns;
        self.ios
            .extend(ios.iter().filter(|io| io.start_ns >= since));
        self.bound();
    }

    fn add_requests(&mut self, requests: Vec<SlowRequest>) {
        let since = self.since_ns;
        self.requests
            .extend(requests.into_iter().filter(|r| r.complete_ns >= since));
        self.bound();
    }

    fn add_calls(&mut self, calls: Vec<SlowCall>) {
        self.calls_asked = true;
        let since = self.since_ns;
        self.calls
            .extend(calls.into_iter().filter(|c| c.start_ns >= since));
        self.bound();
    }

    /// Past [`MAX_TAIL_MATERIAL`] slow I/Os, calls or requests, all drop what came before the
    /// middle of the lists over the bound, so the autopsy covers the later part of the run (its
    /// sets then say fewer I/Os were kept than expected).
    fn bound(&mut self) {
        let middle = |mut times: Vec<u64>| -> Option<u64> {
            if times.len() <= MAX_TAIL_MATERIAL {
                return None;
            }
            let at = times.len() / 2;
            Some(*times.select_nth_unstable(at).1)
        };
        let over = |n: usize| n > MAX_TAIL_MATERIAL;
        if !over(self.ios.len()) && !over(self.requests.len()) && !over(self.calls.len()) {
            return;
        }
        let Some(cutoff) = [
            middle(self.ios.iter().map(|io| io.start_ns).collect()),
            middle(self.requests.iter().map(|r| r.complete_ns).collect()),
            middle(self.calls.iter().map(|c| c.start_ns).collect()),
        ]
        .into_iter()
        .flatten()
        .max() else {
            return;
        };
        self.ios.retain(|io| io.start_ns >= cutoff);
        self.requests.retain(|r| r.complete_ns >= cutoff);
        self.calls.retain(|c| c.start_ns >= cutoff);
        self.since_ns = self.since_ns.max(cutoff);
    }
}

/// The run as a profile knows it, beyond what the recorder saw.
#[derive(Debug)]
pub struct RunContext<'a> {
    pub spec: &'a virtgap_workloads::WorkloadSpec,
    pub loaded: &'a virtgap_workloads::LoadedSpec,
    pub target: &'a virtgap_workloads::Target,
    pub host: Fingerprint,
    /// The `--interval` asked for.
    pub interval: Duration,
    pub started: SystemTime,
    pub calibration: Option<Calibration>,
    pub recorder_cpu_pct: Option<f64>,
    pub complete: bool,
}

/// What the probes follow in a run of virtgap's own workload, as the metrics say it.
pub const OWN_WORKLOAD: &str = "virtgap's own workload";

#[derive(Debug)]
pub struct Recorder {
    disks: TargetDisks,
    devs: Option<Vec<DevNum>>,
    report: Option<CapabilityReport>,
    /// Totals since the probes attached, as of the last snapshot.
    cumulative: Option<ProbeSnapshot>,
    /// Where the measured window's probe totals start: the idle interval's end, then the ramp's,
    /// then the last reset's (None: from attach).
    base: Option<ProbeSnapshot>,
    idle: Option<ProbeSnapshot>,
    /// Probe intervals still in the ramp.
    ramp_left: u64,
    device_names: BTreeMap<DevNum, String>,
    series: IntervalSeries,
    /// Merges the workers' intervals, once the workload started (see [`Self::workload_started`]).
    merger: Option<IntervalMerger>,
    finished: u32,
    stats: RunStats,
    errors: Vec<WorkloadError>,
    engine_features: String,
    totals: Totals,
    tail: TailMaterial,
    tail_watch: Option<Arc<TailWatch>>,
    /// `--listen` or `serve`: where the probes' totals are served as they arrive.
    metrics: Option<Metrics>,
    /// Whether probe intervals become points of the series (not for `serve`, which writes no
    /// profile: see [`Self::keep_no_series`]).
    keeps_series: bool,
}

/// Where a recorder serves the probes' totals, and how: the label (the workload's name, or
/// `--label`), what the probes follow in words, and which series the page carries.
#[derive(Debug)]
pub struct Metrics {
    pub endpoint: SharedEndpoint,
    pub label: String,
    pub attached: String,
    pub series: SeriesOptions,
}

impl Metrics {
    /// Served at `endpoint` under `label`, following `attached` (in words), with the page's
    /// default series.
    pub fn new(endpoint: &SharedEndpoint, label: &str, attached: &str) -> Self {
        Self {
            endpoint: Arc::clone(endpoint),
            label: label.to_string(),
            attached: attached.to_string(),
            series: SeriesOptions::default(),
        }
    }
}

/// Until when a run without a workload is followed (attach mode, `serve`).
#[derive(Clone, Copy, Debug)]
pub struct FollowUntil<'a> {
    /// Set by Ctrl-C or a termination signal.
    pub stop: &'a AtomicBool,
    pub duration: Option<Duration>,
    /// Whether the run ends when every followed process is gone (`serve` goes on serving
    /// their totals).
    pub processes_gone: bool,
}

/// What a run without a workload does with each probe interval beside recording it: the
/// recorder after it took the interval, the interval, and the processes the probes follow
/// (None: not following processes).
pub type EachInterval<'f> = dyn FnMut(&Recorder, &ProbeSnapshot, Option<&[u32]>) + 'f;

impl Recorder {
    pub fn new(plan: RecordPlan) -> Self {
        let ramp = ramp_intervals(plan.interval, plan.ramp);
        let devs = plan.disks.devs();
        Self {
            series: IntervalSeries::new(
                plan.interval,
                ramp,
                devs.clone(),
                plan.probed,
                plan.hypervisor,
            ),
            merger: None,
            disks: plan.disks,
            devs,
            report: None,
            cumulative: None,
            base: None,
            idle: None,
            ramp_left: ramp,
            device_names: BTreeMap::new(),
            finished: 0,
            stats: RunStats::default(),
            errors: Vec::new(),
            engine_features: String::new(),
            totals: Totals::default(),
            tail: TailMaterial::default(),
            tail_watch: None,
            metrics: None,
            keeps_series: true,
        }
    }

    /// Serves the probes' totals as they arrive (`--listen`, `serve`).
    pub fn serve_metrics(&mut self, metrics: Metrics) {
        self.metrics = Some(metrics);
    }

    /// The recorder of a built-in workload run on this host (`record` and the live view
    /// alike), publishing to `metrics` (when there is an endpoint) under the workload's name.
    pub fn of_workload(plan: RecordPlan, workload: &str, metrics: Option<&SharedEndpoint>) -> Self {
        let mut recorder = Self::new(plan);
        if let Some(endpoint) = metrics {
            recorder.serve_metrics(Metrics::new(endpoint, workload, OWN_WORKLOAD));
        }
        recorder
    }

    /// The recorder of a run without a workload (attach mode): the probes follow processes
    /// already running, every disk is watched (or those `--device` named: `named`), and each
    /// probe interval is a point of the series (see [`IntervalSeries::probe_only`]) whose block
    /// requests count as its I/Os.
    pub fn attached(
        interval: Duration,
        hypervisor: Hypervisor,
        named: Option<TargetDisks>,
    ) -> Self {
        let counted = named.as_ref().and_then(TargetDisks::devs);
        let mut recorder = Self::new(RecordPlan {
            interval,
            ramp: Duration::ZERO,
            disks: named.unwrap_or_else(|| crate::run::host::every_disk(std::path::Path::new("/"))),
            probed: true,
            hypervisor,
        });
        recorder.series = IntervalSeries::probe_only(interval, hypervisor, counted);
        recorder
    }

    /// A recorder whose run is never saved (`serve`): its probe intervals are not kept as a
    /// series, so a server running for weeks writes no point to its temporary file — nothing
    /// of the observer's own on the disks it measures (`--all`).
    pub fn keep_no_series(&mut self) {
        self.keeps_series = false;
    }

    /// The workload's `workers` reporting threads started.
    pub fn workload_started(&mut self, workers: u32) {
        self.merger = Some(IntervalMerger::new(workers));
    }

    /// The workers hand their slow I/Os over to `watch` as they go.
    pub fn watch_tail(&mut self, watch: Arc<TailWatch>) {
        self.tail_watch = Some(watch);
    }

    /// The first snapshot, taken before the workload started: the idle baseline. It is not an
    /// interval of the run: the series and the ramp count never see it.
    pub fn set_idle(&mut self, cumulative: ProbeSnapshot, interval: ProbeSnapshot) {
        self.base = Some(cumulative.clone());
        self.cumulative = Some(cumulative);
        self.idle = Some(interval);
    }

    pub fn on_event(&mut self, event: Event) -> Update {
        match event {
            Event::Probe(ev) => self.on_probe(ev),
            Event::Workload(ev) => self.on_workload(ev),
        }
    }

    fn on_probe(&mut self, event: ProbeEvent) -> Update {
        match event {
            ProbeEvent::Attached(report) => {
                if let Some(m) = &self.metrics {
                    m.endpoint.follow(ExporterContext {
                        series: m.series.clone(),
                        ..ExporterContext::this_host(&m.label, &m.attached, &report)
                    });
                }
                self.report = Some(report);
                Update::Report
            }
            // An attached run's: the app probe's slow reads and writes.
            ProbeEvent::SlowCalls(calls) => {
                self.tail.add_calls(calls);
                Update::Nothing
            }
            ProbeEvent::SlowRequests(slow) => {
                self.tail.add_requests(slow);
                Update::Nothing
            }
            ProbeEvent::Snapshot {
                cumulative,
                interval,
            } => {
                if let Some(m) = &self.metrics {
                    m.endpoint.publish(&cumulative);
                }
                for d in cumulative.block.iter().flat_map(|b| &b.devices) {
                    self.device_names
                        .entry(d.dev)
                        .or_insert_with(|| device_name(d.dev));
                }
                if self.ramp_left > 0 {
                    self.ramp_left -= 1;
                    if self.ramp_left == 0 {
                        // The ramp ends here: what it did is not the measured window's.
                        self.base = Some((*cumulative).clone());
                        self.tail.restart();
                    }
                }
                if self.series.is_probe_only() {
                    if self.keeps_series {
                        self.series.add_probe_only(cumulative.elapsed_ns, &interval);
                    }
                    // No workload: the I/Os are the block requests over the window.
                    let since = |op| {
                        let devs = self.series.devs();
                        let base = self
                            .base
                            .as_ref()
                            .map_or(0, |b| block_requests(b, op, devs));
                        block_requests(&cumulative, op, devs).saturating_sub(base)
                    };
                    self.totals.read_ios = since(BlockOp::Read);
                    self.totals.write_ios = since(BlockOp::Write);
                } else {
                    self.series.add_probe(&interval);
                }
                self.cumulative = Some(*cumulative);
                Update::ProbeInterval(interval)
            }
        }
    }

    fn on_workload(&mut self, event: WorkloadEvent) -> Update {
        match event {
            WorkloadEvent::Started { engine_features } => {
                self.engine_features = engine_features;
                Update::Nothing
            }
            WorkloadEvent::Interval(sample) => {
                let Some(merger) = self.merger.as_mut() else {
                    return Update::Nothing;
                };
                let merged = merger.add(sample);
                self.add_intervals(&merged);
                Update::Intervals(merged)
            }
            WorkloadEvent::Finished { worker, result } => {
                let merged = self
                    .merger
                    .as_mut()
                    .map(|m| m.worker_finished(worker))
                    .unwrap_or_default();
                self.add_intervals(&merged);
                self.finished += 1;
                let failed = match result {
                    Ok(s) => {
                        self.tail.add_ios(&s.slow_ios);
                        self.stats.merge(&s);
                        None
                    }
                    Err(e) => {
                        let why = e.to_string();
                        self.errors.push(e);
                        Some(why)
                    }
                };
                self.collect_slow_ios();
                if self.all_finished() {
                    self.series.workload_ended();
                }
                Update::WorkerFinished { failed }
            }
        }
    }

    /// Whole-run intervals already merged across the workers, in order.
    pub fn add_intervals(&mut self, samples: &[IntervalSample]) {
        for s in samples {
            let t = &mut self.totals;
            t.app.merge(&s.lat);
            t.read_ios += s.read_ios;
            t.write_ios += s.write_ios;
            t.read_bytes += s.read_bytes;
            t.write_bytes += s.write_bytes;
            self.series.add_sample(s.clone());
        }
    }

    /// Takes the slow I/Os the workers handed over since the last call.
    pub fn collect_slow_ios(&mut self) {
        if let Some(handed) = self.tail_watch.as_ref().map(|w| w.take_handed()) {
            self.tail.add_ios(&handed);
        }
    }

    /// Starts the window over (the TUI's reset): totals, series and tail material from now on.
    pub fn reset(&mut self) {
        self.base = self.cumulative.clone();
        self.totals = Totals::default();
        self.series.clear();
        self.tail.restart();
    }

    /// The run is over: what still waits for a probe interval is kept without one.
    pub fn finish(&mut self) {
        self.series.finish();
        self.collect_slow_ios();
    }

    /// The loop of a run without a workload (attach mode, `serve`): hands the collector's
    /// events to the recorder until `until` says the run is over; `each` sees every probe
    /// interval. An error when the collector is gone before that (its figures would stop
    /// while the run seemed to go on).
    pub fn follow(
        &mut self,
        rx: &mpsc::Receiver<Event>,
        until: FollowUntil<'_>,
        each: &mut EachInterval<'_>,
    ) -> anyhow::Result<AttachEnd> {
        let started = Instant::now();
        loop {
            if until.stop.load(Ordering::Relaxed) {
                return Ok(AttachEnd::Interrupted);
            }
            if until.duration.is_some_and(|d| started.elapsed() >= d) {
                return Ok(AttachEnd::Duration);
            }
            let event = match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(event) => event,
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    anyhow::bail!(
                        "the probes' collector stopped; its figures are no longer updated"
                    )
                }
            };
            if self.take_followed(event, each) == Some(true) && until.processes_gone {
                return Ok(AttachEnd::ProcessesExited);
            }
        }
    }

    /// One event of a run without a workload (see [`Self::follow`]); for a probe interval,
    /// Some(whether every followed process is gone).
    pub fn take_followed(&mut self, event: Event, each: &mut EachInterval<'_>) -> Option<bool> {
        let Update::ProbeInterval(interval) = self.on_event(event) else {
            return None;
        };
        let followed = self.cumulative.as_ref().and_then(|c| c.followed.as_deref());
        each(self, &interval, followed);
        Some(followed.is_some_and(<[u32]>::is_empty))
    }

    /// Whether every worker of a started workload finished.
    pub fn all_finished(&self) -> bool {
        self.merger
            .as_ref()
            .is_some_and(|m| self.finished >= m.workers())
    }

    /// The first error a worker ended with.
    pub fn take_error(&mut self) -> Option<WorkloadError> {
        (!self.errors.is_empty()).then(|| self.errors.remove(0))
    }

    pub fn report(&self) -> Option<&CapabilityReport> {
        self.report.as_ref()
    }

    pub fn disks(&self) -> &TargetDisks {
        &self.disks
    }

    pub fn devs(&self) -> Option<&[DevNum]> {
        self.devs.as_deref()
    }

    pub fn device_names(&self) -> &BTreeMap<DevNum, String> {
        &self.device_names
    }

    pub fn series(&self) -> &IntervalSeries {
        &self.series
    }

    pub fn totals(&self) -> &Totals {
        &self.totals
    }

    pub fn tail_material(&self) -> &TailMaterial {
        &self.tail
    }

    /// The workers' merged results (those that finished).
    pub fn stats(&self) -> &RunStats {
        &self.stats
    }

    /// The probes' totals since they attached, as of the last snapshot.
    pub fn cumulative(&self) -> Option<&ProbeSnapshot> {
        self.cumulative.as_ref()
    }

    /// The probes' activity over the measured window: the totals less those at its start.
    pub fn window(&self) -> Option<ProbeSnapshot> {
        let total = self.cumulative.as_ref()?;
        Some(match &self.base {
            Some(start) => total.since(start),
            None => total.clone(),
        })
    }

    /// The idle interval's host-wide figures (None: none was taken), the hypervisor's
    /// mechanisms included for a host running on `hypervisor`.
    pub fn idle_baseline(&self, hypervisor: Hypervisor) -> Option<IdleBaseline> {
        let idle = self.idle.as_ref()?;
        let seconds = idle.elapsed_ns as f64 / 1e9;
        (seconds > 0.0).then(|| {
            let mut base = IdleBaseline::of(
                &ProbeInterval::of(idle, self.devs(), Hypervisor::None),
                seconds,
                self.report.as_ref().is_some_and(|r| r.counts_ipis()),
            );
            let section = crate::run::hypervisor::section(
                hypervisor,
                seconds,
                crate::run::assemble::virtualization(idle).as_ref(),
                self.report.as_ref(),
                None,
            );
            base.hypervisor = Some(RunHypervisor::of(&section));
            base
        })
    }

    /// The stalls in the window, from the whole-run intervals and the block probe's errors.
    pub fn stalls(&self) -> Stalls {
        let window = self.window();
        let block = window.as_ref().and_then(|w| w.block.as_ref());
        if self.all_finished() {
            self.series
                .stall_log()
                .stalls(&[&self.stats.read.lat, &self.stats.write.lat], block)
        } else {
            self.series.stall_log().stalls(&[&self.totals.app], block)
        }
    }

    /// The workload's statistics as a profile takes them: the workers' own once all finished;
    /// mid-run, the totals of the intervals so far (the merged app latency and the counts:
    /// per-direction slat/clat/lat stay empty rather than guessed).
    fn stats_so_far(&self) -> RunStats {
        if self.all_finished() {
            let mut stats = self.stats.clone();
            if stats.engine_features.is_empty() {
                stats.engine_features = self.engine_features.clone();
            }
            return stats;
        }
        let t = &self.totals;
        let mut stats = RunStats::default();
        stats.read.ios = t.read_ios;
        stats.read.bytes = t.read_bytes;
        stats.write.ios = t.write_ios;
        stats.write.bytes = t.write_bytes;
        stats.measured_ns = self.series.last_point().map_or(0, |p| p.end_ns);
        stats.engine_features = self.engine_features.clone();
        stats
    }

    /// The stage histograms of the window so far (the app stage from the workers' results once
    /// they all finished, from the intervals before).
    pub fn stages(&self) -> crate::model::stages::Stages {
        let app = if self.all_finished() {
            crate::run::assemble::app_stage(&self.stats)
        } else {
            Histogram::from_latency(&self.totals.app)
        };
        crate::run::assemble::stages(app, self.window().as_ref(), self.devs())
    }

    /// The tail autopsy of the window so far, over `stages` (None: no material, or none of it
    /// joined).
    pub fn tail_autopsy(
        &self,
        target: &virtgap_workloads::Target,
        stages: &crate::model::stages::Stages,
    ) -> Option<TailAutopsy> {
        if self.tail.is_empty() {
            return None;
        }
        let dropped = self.window().map_or(0, |w| w.slow_dropped());
        crate::run::autopsy::tail_autopsy(
            &self.tail.ios,
            &self.tail.requests,
            dropped,
            target,
            &self.disks,
            stages,
        )
    }

    /// The profile of what was recorded: the whole run once every worker finished, the run so
    /// far before (incomplete, as the TUI saves it). Its one run carries the idle baseline and
    /// the tail autopsy (`with_tail`).
    pub fn profile(&self, cx: &RunContext<'_>, with_tail: bool) -> Result<Profile, String> {
        let mut profile = self.assemble_profile(Framing {
            started: cx.started,
            interval: cx.interval,
            complete: cx.complete,
            host: cx.host.clone(),
            workload: WorkloadInfo::of(cx.spec, cx.loaded, cx.target),
            target: TargetInfo::of(cx.target, &self.disks),
            paced: cx.spec.rate_iops.is_some(),
            disks: &self.disks,
            recorder_cpu_pct: cx.recorder_cpu_pct,
            calibration: cx.calibration.clone(),
            stalls: Some(self.stalls()),
        })?;
        if !self.all_finished() {
            profile.stages.app = Histogram::from_latency(&self.totals.app);
        }
        let mut run = RunRecord::of_profile(&profile, 1);
        run.idle = self.idle_baseline(Hypervisor::of_name(&cx.host.hypervisor));
        if with_tail {
            run.tail = self.tail_autopsy(cx.target, &run.stages);
        }
        profile.runs = vec![run];
        Ok(profile)
    }

    /// The profile of what was recorded, framed by `f`: the series, the statistics so far, the
    /// probes' window and what attached. Its runs are left to the caller.
    pub fn assemble_profile(&self, f: Framing<'_>) -> Result<Profile, String> {
        let points = self
            .series
            .points()
            .map_err(|e| format!("reading back the interval series: {e}"))?;
        let stats = self.stats_so_far();
        let window = self.window();
        let series = &self.series;
        Ok(assemble(ProfileInputs {
            run: RunInfo {
                tool_version: env!("CARGO_PKG_VERSION").into(),
                command_line: std::env::args().collect(),
                started_unix_ms: unix_ms(f.started),
                ended_unix_ms: unix_ms(SystemTime::now()),
                interval_s: series.point_interval().as_secs_f64(),
                requested_interval_s: (series.coarsening() > 1).then_some(f.interval.as_secs_f64()),
                max_intervals: (series.coarsening() > 1).then_some(series.max_points() as u64),
                complete: f.complete,
            },
            host: f.host,
            workload: f.workload,
            target: f.target,
            paced: f.paced,
            stats: &stats,
            intervals: points.into_iter().map(|p| p.interval).collect(),
            capabilities: self.report.clone(),
            probe_total: window.as_ref(),
            disks: f.disks,
            recorder_cpu_pct: f.recorder_cpu_pct,
            calibration: f.calibration,
            stalls: f.stalls,
        }))
    }
}

/// What a profile is framed by beyond what the recorder saw: the run's times, the host, what
/// ran and on what (see [`Recorder::assemble_profile`]).
#[derive(Debug)]
pub struct Framing<'a> {
    pub started: SystemTime,
    /// The `--interval` asked for.
    pub interval: Duration,
    pub complete: bool,
    pub host: Fingerprint,
    pub workload: WorkloadInfo,
    pub target: TargetInfo,
    pub paced: bool,
    pub disks: &'a TargetDisks,
    pub recorder_cpu_pct: Option<f64>,
    pub calibration: Option<Calibration>,
    pub stalls: Option<Stalls>,
}

/// Milliseconds since the Unix epoch (0 for a clock before it).
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtgap_probes::model::{BlockOp, BlockSnapshot, DeviceGauge};

    fn recorder(ramp: Duration) -> Recorder {
        Recorder::new(RecordPlan {
            interval: Duration::from_secs(1),
            ramp,
            disks: TargetDisks::plain("vda", 254, 0),
            probed: true,
            hypervisor: Hypervisor::None,
        })
    }

    fn snapshot(completed: u64) -> ProbeSnapshot {
        ProbeSnapshot {
            block: Some(BlockSnapshot {
                devices: vec![DeviceGauge {
                    dev: (254, 0),
                    inflight: 0,
                    issued: completed,
                    completed,
                    from_bio_entry: 0,
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn snapshot_event(completed: u64, before: u64) -> Event {
        Event::Probe(ProbeEvent::Snapshot {
            cumulative: Box::new(snapshot(completed)),
            interval: Box::new(snapshot(completed).since(&snapshot(before))),
        })
    }

    fn completed(r: &Recorder) -> u64 {
        r.window().unwrap().block.unwrap().devices[0].completed
    }

    /// The probes' counters restart where the workload's measured window begins: what the
    /// ramp did is in neither the live figures nor a profile's totals.
    #[test]
    fn the_ramps_probe_counts_are_left_out() {
        let mut r = recorder(Duration::from_secs(2));
        r.set_idle(snapshot(10), snapshot(10).since(&snapshot(0)));
        // Two 1-s probe intervals of ramp, then the measured window.
        r.on_event(snapshot_event(110, 10));
        assert_eq!(completed(&r), 100, "the ramp shows while it runs");
        r.on_event(snapshot_event(210, 110));
        r.on_event(snapshot_event(330, 210));
        assert_eq!(completed(&r), 120, "only the measured interval counts");
        // Without a ramp, everything after the idle interval counts.
        let mut r = recorder(Duration::ZERO);
        r.set_idle(snapshot(10), snapshot(10).since(&snapshot(0)));
        r.on_event(snapshot_event(110, 10));
        assert_eq!(completed(&r), 100);
        // A reset starts the window over.
        r.reset();
        r.on_event(snapshot_event(150, 110));
        assert_eq!(completed(&r), 40);
    }

    #[test]
    fn the_ramp_is_cut_in_whole_intervals() {
        let s = Duration::from_secs;
        assert_eq!(ramp_intervals(s(1), s(0)), 0);
        assert_eq!(ramp_intervals(s(1), s(2)), 2);
        assert_eq!(ramp_intervals(Duration::from_millis(500), s(2)), 4);
    }

    #[test]
    fn a_long_session_keeps_the_later_half_of_its_slow_ios_and_their_requests() {
        let io = |t: u64| SlowIo {
            offset: t * 4096,
            len: 4096,
            write: false,
            start_ns: t,
            end_ns: t + 10,
        };
        let request = |t: u64| SlowRequest {
            dev: (254, 0),
            sector: t * 8,
            bytes: 4096,
            op: BlockOp::Read,
            start_ns: t + 1,
            issue_ns: t + 2,
            irq_ns: None,
            complete_ns: t + 9,
            tid: 1,
        };
        let mut a = TailMaterial::default();
        let n = MAX_TAIL_MATERIAL as u64;
        a.add_requests((0..n).map(request).collect());
        a.add_ios(&(0..n).map(io).collect::<Vec<_>>());
        assert_eq!(a.ios.len(), MAX_TAIL_MATERIAL, "at the bound, nothing goes");
        // One more of each: the I/Os before the middle go, with the requests that ended before it.
        a.add_ios(&[io(n)]);
        a.add_requests(vec![request(n)]);
        let middle = n / 2; // the middle index of the n + 1 kept (n is even)
        assert_eq!(a.ios.first().map(|io| io.start_ns), Some(middle));
        assert_eq!(a.ios.len() as u64, n + 1 - middle);
        assert!(a.requests.iter().all(|r| r.complete_ns >= middle));
        // Those that completed at or after the cutoff (t + 9 >= middle), and the new one.
        assert_eq!(a.requests.len() as u64, n - (middle - 9) + 1);
        // Slow I/Os a worker hands over later from before the cutoff are not taken back.
        a.add_ios(&[io(3)]);
        assert!(a.ios.iter().all(|io| io.start_ns >= middle));
    }

    fn followed_event(pids: &[u32]) -> Event {
        let with_pids = |completed| ProbeSnapshot {
            followed: Some(pids.to_vec()),
            ..snapshot(completed)
        };
        Event::Probe(ProbeEvent::Snapshot {
            cumulative: Box::new(with_pids(10)),
            interval: Box::new(with_pids(10).since(&snapshot(0))),
        })
    }

    /// The one loop of a run without a workload ends as attach mode and `serve` need: when
    /// the processes are gone (attach mode only), when the collector is gone (an error), and
    /// on a signal; every probe interval is seen with the processes it lists.
    #[test]
    fn following_ends_when_the_processes_or_the_collector_are_gone_or_on_a_signal() {
        let stop = AtomicBool::new(false);
        let until = |processes_gone| FollowUntil {
            stop: &stop,
            duration: Some(Duration::from_secs(60)),
            processes_gone,
        };
        let follow = |events: Vec<Event>, until: FollowUntil<'_>| {
            let (tx, rx) = mpsc::channel();
            for e in events {
                tx.send(e).unwrap();
            }
            drop(tx);
            let mut seen = Vec::new();
            let mut r = Recorder::attached(
                Duration::from_secs(1),
                Hypervisor::None,
                Some(TargetDisks::plain("vda", 254, 0)),
            );
            let end = r.follow(&rx, until, &mut |_, _, pids| {
                seen.push(pids.map(<[u32]>::to_vec))
            });
            (end.map_err(|e| e.to_string()), seen)
        };
        let (end, seen) = follow(vec![followed_event(&[7]), followed_event(&[])], until(true));
        assert_eq!(end, Ok(AttachEnd::ProcessesExited));
        assert_eq!(seen, vec![Some(vec![7]), Some(vec![])]);
        // `serve` goes on with the processes gone, until the collector's channel closes.
        let (end, seen) = follow(vec![followed_event(&[]), followed_event(&[])], until(false));
        assert!(end.unwrap_err().contains("collector stopped"));
        assert_eq!(seen.len(), 2);
        // `serve`'s recorder keeps the totals and no series.
        let points = |keep: bool| {
            let (tx, rx) = mpsc::channel();
            for _ in 0..3 {
                tx.send(followed_event(&[7])).unwrap();
            }
            drop(tx);
            let mut r = Recorder::attached(
                Duration::from_secs(1),
                Hypervisor::None,
                Some(TargetDisks::plain("vda", 254, 0)),
            );
            if !keep {
                r.keep_no_series();
            }
            assert!(r.follow(&rx, until(false), &mut |_, _, _| {}).is_err());
            r.finish();
            assert!(r.cumulative().is_some(), "the totals are kept");
            r.series().points().unwrap().len()
        };
        assert_eq!(points(false), 0, "serve keeps no point");
        assert!(points(true) > 0, "attach mode keeps its points");
        stop.store(true, Ordering::Relaxed);
        let (end, seen) = follow(vec![followed_event(&[7])], until(true));
        assert_eq!(end, Ok(AttachEnd::Interrupted));
        assert!(seen.is_empty(), "nothing is taken once stopped");
    }
}
