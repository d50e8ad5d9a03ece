//! The live TUI: the default workload with every probe the host allows, shown as it runs. It is
//! one more sink of the pipeline channel; an input thread turns key presses into events on the
//! same channel, and the screen is redrawn once per second or after a key, never per event.

pub mod app;
pub mod ui;

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ratatui::crossterm::event::{self, Event as TermEvent};
use virtgap_probes::ProbeEvent;
use virtgap_workloads::spec::{self, Span};
use virtgap_workloads::stats::{IntervalMerger, RunStats};
use virtgap_workloads::{RunOptions, WorkloadEvent};

use crate::cli::TuiArgs;
use crate::cmd::record::prepare;
use crate::run::pipeline::Event;
use app::{Action, App, RunState};

/// Without --duration the workload runs until the user quits (up to this long).
const UNTIL_QUIT: Duration = Duration::from_secs(30 * 24 * 3600);

/// Events the TUI loop handles: the pipeline's, plus the terminal's.
// Events pass one at a time through the channel: boxing each would allocate per interval.
#[allow(clippy::large_enum_variant)]
enum Input {
    Pipeline(Event),
    Terminal(TermEvent),
}

pub fn run(args: &TuiArgs) -> Result<ExitCode> {
    let loaded = spec::load(&args.workload)?;
    let mut spec = loaded.spec.clone();
    let mut overrides = args.overrides.to_overrides();
    if overrides.duration.is_none() {
        overrides.duration = Some(Span(UNTIL_QUIT));
    }
    overrides.apply(&mut spec)?;
    crate::cli::check_interval(&args.interval)?;
    let baseline = match &args.baseline {
        Some(path) => Some(crate::model::profile::load(path)?),
        None => None,
    };
    if let Some(path) = &args.save {
        crate::run::output::tui_save(args, path, true)?;
    }
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        anyhow::bail!(
            "the live view needs a terminal (stdin and stdout are not both one); for a headless run use `virtgap record`"
        );
    }
    let signals = crate::run::signals::StopSignals::install(true)?;
    let Some(prepared) = prepare(
        &spec,
        args.overrides.size.is_some(),
        &args.target,
        true,
        &signals,
    )?
    else {
        return Ok(signals.exit_code());
    };
    let (target, stop) = (&prepared.target, &prepared.stop);
    let host = crate::model::host::Fingerprint::this_host();

    let (tx, rx) = mpsc::channel::<Event>();
    // The tail autopsy, as `record` keeps it.
    let slow_request_ns = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let probes = crate::run::session::start_probes(
        &args.probe,
        args.interval.0,
        Some(Arc::clone(&slow_request_ns)),
        &tx,
        &rx,
    )?;
    let workload = virtgap_workloads::units::printable(&spec.describe()).into_owned();
    let mut app = App::new(host, workload, prepared.disks.clone());
    app.baseline = baseline;
    app.kv = spec.kv.as_ref().map(|kv| {
        let (reads, writes) = kv.rates();
        crate::tui::app::KvPanel {
            load: format!(
                "{reads} reads/s + {writes} writes/s, {} s slices",
                kv.slice_for(spec.duration.0).as_secs()
            ),
            ..Default::default()
        }
    });
    app.series = crate::run::series::IntervalSeries::new(
        args.interval.0,
        spec.ramp.0,
        prepared.disks.devs(),
        probes.is_some(),
    );
    app.measure_after_ramp(args.interval.0, spec.ramp.0);
    let collector = probes.map(|(handle, report)| {
        app.on_probe_report(report);
        handle
    });
    if collector.is_some() {
        // One interval of the idle host first, as `record` measures it (the screen is not up
        // yet: the line goes where the target's preparation printed its own).
        say!("measuring the idle host for a second before the workload starts");
        let idle = crate::run::session::wait_for_idle_interval(&rx, stop, args.interval.0, |ev| {
            if let ProbeEvent::SlowRequests(slow) = ev {
                app.on_slow_requests(slow);
            }
        });
        if let Some((cumulative, interval)) = idle {
            app.on_idle_interval(cumulative, &interval);
        }
    }
    let block_attached = app
        .report
        .as_ref()
        .is_some_and(|r| r.attached(virtgap_probes::Family::Block));
    // The workers hand their slow I/Os over as they go, so the autopsy shows while they run.
    app.tail_watch = block_attached
        .then(|| virtgap_workloads::slow::TailWatch::handing_over(spec.workers, slow_request_ns));
    let options = RunOptions {
        interval: args.interval.0,
        tail_watch: app.tail_watch.clone(),
        ..RunOptions::default()
    };
    let workers = prepared.start(&spec, &options, tx);

    // Terminal input on its own thread, into one channel with the pipeline.
    let (itx, irx) = mpsc::channel::<Input>();
    let input_stop = Arc::new(AtomicBool::new(false));
    let input = {
        let itx = itx.clone();
        let input_stop = Arc::clone(&input_stop);
        std::thread::Builder::new()
            .name("vgtool-input".into())
            .spawn(move || {
                while !input_stop.load(Ordering::Relaxed) {
                    if event::poll(Duration::from_millis(100)).unwrap_or(false) {
                        match event::read() {
                            Ok(ev) => {
                                if itx.send(Input::Terminal(ev)).is_err() {
                                    break;
                                }
                            }
                            Err(_) => break,
                        }
                    }
                }
            })?
    };
    let forward = std::thread::Builder::new()
        .name("vgtool-forward".into())
        .spawn(move || {
            for ev in rx {
                if itx.send(Input::Pipeline(ev)).is_err() {
                    break;
                }
            }
        })?;

    let mut terminal = ratatui::init();
    let result = event_loop(
        &mut terminal,
        &mut app,
        &irx,
        stop,
        &spec,
        &loaded,
        target,
        args,
        workers.workers(),
    );
    ratatui::restore();

    stop.store(true, Ordering::Relaxed);
    input_stop.store(true, Ordering::Relaxed);
    workers.join();
    if let Some(c) = collector {
        c.stop();
    }
    let _ = input.join();
    drop(irx);
    let _ = forward.join();
    result?;
    if let RunState::Failed(e) = &app.state {
        anyhow::bail!("the workload failed: {e}");
    }
    if signals.received().is_some() {
        return Ok(signals.exit_code());
    }
    Ok(ExitCode::SUCCESS)
}

#[allow(clippy::too_many_arguments)]
fn event_loop(
    terminal: &mut ratatui::DefaultTerminal,
    app: &mut App,
    rx: &mpsc::Receiver<Input>,
    stop: &AtomicBool,
    spec: &virtgap_workloads::WorkloadSpec,
    loaded: &virtgap_workloads::LoadedSpec,
    target: &virtgap_workloads::Target,
    args: &TuiArgs,
    reporting_workers: u32,
) -> Result<()> {
    let started = Instant::now();
    let mut merger = IntervalMerger::new(reporting_workers);
    let mut finished = 0;
    let mut redraw = true;
    let mut next_tick = Instant::now();
    let mut next_tail = Instant::now() + LIVE_TAIL_EVERY;
    // How much material the shown autopsy was made of: redone only when more came.
    let mut tail_made_of = 0;
    loop {
        if app.state == RunState::Running && app.paused.is_none() && Instant::now() >= next_tail {
            app.collect_slow_ios();
            let material = app.slow_ios.len() + app.slow_requests.len();
            if material != tail_made_of {
                if let Some(tail) = tail_so_far(app, spec, loaded, target, args) {
                    app.tail = Some(tail);
                    redraw = true;
                }
                tail_made_of = material;
            }
            next_tail = Instant::now() + LIVE_TAIL_EVERY;
        }
        if redraw || Instant::now() >= next_tick {
            // A finished run's clock stops with it.
            if app.paused.is_none() && app.state == RunState::Running {
                app.set_elapsed(started.elapsed());
            }
            terminal
                .draw(|f| ui::render(f, app))
                .context("drawing the screen")?;
            redraw = false;
            next_tick = Instant::now() + Duration::from_secs(1);
        }
        if stop.load(Ordering::Relaxed) {
            // SIGTERM (or SIGINT from another process).
            return Ok(());
        }
        let timeout = next_tick
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(200));
        let input = match rx.recv_timeout(timeout) {
            Ok(i) => i,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(()),
        };
        match input {
            Input::Terminal(TermEvent::Key(key)) => {
                redraw = true;
                match app.handle_key(key) {
                    Action::Quit => return Ok(()),
                    Action::Save => save(app, spec, loaded, target, args),
                    Action::None => {}
                }
            }
            Input::Terminal(TermEvent::Resize(..)) => redraw = true,
            Input::Terminal(_) => {}
            Input::Pipeline(Event::Probe(ProbeEvent::Attached(r))) => app.on_probe_report(r),
            Input::Pipeline(Event::Probe(ProbeEvent::Snapshot {
                cumulative,
                interval,
            })) => {
                if let Some(block) = &cumulative.block {
                    for d in &block.devices {
                        app.device_names
                            .entry(d.dev)
                            .or_insert_with(|| crate::run::pipeline::device_name(d.dev));
                    }
                }
                app.on_probe_snapshot(*cumulative, *interval)
            }
            Input::Pipeline(Event::Probe(ProbeEvent::SlowRequests(slow))) => {
                app.on_slow_requests(slow)
            }
            Input::Pipeline(Event::Workload(ev)) => match ev {
                WorkloadEvent::Started { .. } => {}
                WorkloadEvent::Interval(sample) => {
                    for s in merger.add(sample) {
                        app.on_interval(&s, started.elapsed());
                    }
                }
                WorkloadEvent::Finished { worker, result } => {
                    for s in merger.worker_finished(worker) {
                        app.on_interval(&s, started.elapsed());
                    }
                    finished += 1;
                    if let Ok(stats) = &result {
                        app.on_slow_ios(&stats.slow_ios);
                    }
                    if let (Ok(stats), Some(panel)) = (&result, app.kv.as_mut()) {
                        if let Some(kv) = &stats.kv {
                            panel.finish(kv);
                        }
                    }
                    match result {
                        Err(e) => {
                            app.state = RunState::Failed(e.to_string());
                            app.collect_slow_ios();
                        }
                        Ok(_)
                            if finished == reporting_workers && app.state == RunState::Running =>
                        {
                            app.state = RunState::Finished;
                            refresh_tail(app, spec, loaded, target, args);
                        }
                        Ok(_) => {}
                    }
                    redraw = true;
                }
            },
        }
    }
}

/// How often a running workload's tail autopsy is redone.
const LIVE_TAIL_EVERY: Duration = Duration::from_secs(5);

/// Takes what the workers handed over and redoes the autopsy with it.
fn refresh_tail(
    app: &mut App,
    spec: &virtgap_workloads::WorkloadSpec,
    loaded: &virtgap_workloads::LoadedSpec,
    target: &virtgap_workloads::Target,
    args: &TuiArgs,
) {
    app.collect_slow_ios();
    app.tail = tail_so_far(app, spec, loaded, target, args);
}

/// The tail autopsy of the run so far (since start or reset), over the same stages a saved
/// profile holds.
fn tail_so_far(
    app: &App,
    spec: &virtgap_workloads::WorkloadSpec,
    loaded: &virtgap_workloads::LoadedSpec,
    target: &virtgap_workloads::Target,
    args: &TuiArgs,
) -> Option<crate::model::tail::TailAutopsy> {
    if app.slow_ios.is_empty() && app.slow_requests.is_empty() {
        return None;
    }
    let profile = saved_profile(app, spec, loaded, target, args).ok()?;
    let dropped = app.live.probes.as_ref().map_or(0, |p| p.slow_dropped());
    crate::run::autopsy::tail_autopsy(
        &app.slow_ios,
        &app.slow_requests,
        dropped,
        target,
        app.disks(),
        &profile.stages,
    )
}

/// Saves what has run so far, in the `record --output` format.
fn save(
    app: &mut App,
    spec: &virtgap_workloads::WorkloadSpec,
    loaded: &virtgap_workloads::LoadedSpec,
    target: &virtgap_workloads::Target,
    args: &TuiArgs,
) {
    if app.state == RunState::Running {
        // The autopsy as of now, not of the last refresh.
        refresh_tail(app, spec, loaded, target, args);
    }
    let profile = match saved_profile(app, spec, loaded, target, args) {
        Ok(p) => p,
        Err(e) => {
            app.message = Some(format!("save failed: {e}"));
            return;
        }
    };
    let now = std::time::SystemTime::now();
    let path = args.save.clone().unwrap_or_else(|| {
        let stamp = crate::cmd::record::unix_ms(now) / 1000;
        std::path::PathBuf::from(format!("virtgap-{}-{stamp}.json", spec.name))
    });
    let result = serde_json::to_vec_pretty(&profile)
        .map_err(anyhow::Error::from)
        .and_then(|bytes| {
            // Checked again as it is now; an explicit --save is consent to replace that file.
            let outputs = crate::run::output::tui_save(args, &path, args.save.is_some())?;
            Ok(outputs.write("--save", &path, &bytes)?)
        });
    app.message = Some(match result {
        Ok(()) => format!(
            "saved profile {}",
            virtgap_workloads::units::printable(&path.display().to_string())
        ),
        Err(e) => format!(
            "save failed: {}",
            virtgap_workloads::units::printable(&format!("{e:#}"))
        ),
    });
}

/// What has run so far as a profile, in the `record --output` format (one run).
fn saved_profile(
    app: &App,
    spec: &virtgap_workloads::WorkloadSpec,
    loaded: &virtgap_workloads::LoadedSpec,
    target: &virtgap_workloads::Target,
    args: &TuiArgs,
) -> std::result::Result<crate::model::profile::Profile, String> {
    let intervals: Vec<_> = app
        .series
        .points()
        .map_err(|e| format!("reading back the interval series: {e}"))?
        .into_iter()
        .map(|p| p.interval)
        .collect();
    let d = &app.live;
    // Mid-run, only the merged app latency is at hand: per-direction slat/clat/lat stay empty
    // rather than guessed, and the profile is marked incomplete.
    let mut stats = RunStats::default();
    stats.read.ios = d.read_ios;
    stats.read.bytes = d.read_bytes;
    stats.write.ios = d.write_ios;
    stats.write.bytes = d.write_bytes;
    stats.measured_ns = app.series.last_point().map_or(0, |p| p.end_ns);
    let now = std::time::SystemTime::now();
    let mut profile = crate::model::profile::assemble(crate::model::profile::ProfileInputs {
        run: crate::model::profile::RunInfo {
            tool_version: env!("CARGO_PKG_VERSION").into(),
            command_line: std::env::args().collect(),
            started_unix_ms: crate::cmd::record::unix_ms(now - d.elapsed),
            ended_unix_ms: crate::cmd::record::unix_ms(now),
            interval_s: app.series.point_interval().as_secs_f64(),
            requested_interval_s: (app.series.coarsening() > 1)
                .then_some(args.interval.0.as_secs_f64()),
            max_intervals: (app.series.coarsening() > 1).then_some(app.series.max_points() as u64),
            complete: false,
        },
        host: app.host.clone(),
        workload: crate::model::profile::WorkloadInfo::of(spec, loaded, target),
        target: crate::model::profile::TargetInfo::of(target, app.disks()),
        paced: spec.rate_iops.is_some(),
        stats: &stats,
        intervals,
        capabilities: app.report.clone(),
        probe_total: d.probes.as_ref(),
        disks: app.disks(),
        recorder_cpu_pct: None,
        calibration: None,
        stalls: Some(
            app.series
                .stall_log()
                .stalls(&[&d.app], d.probes.as_ref().and_then(|p| p.block.as_ref())),
        ),
    });
    profile.stages.app = crate::model::profile::Histogram::from_latency(&d.app);
    // One run, as `record` writes it: the diff compares runs.
    let mut run = crate::model::profile::RunRecord::of_profile(&profile, 1);
    run.idle = app.idle.clone();
    // Mid-run, of the slow I/Os the workers have handed over so far.
    run.tail = app.tail.clone();
    profile.runs = vec![run];
    Ok(profile)
}
