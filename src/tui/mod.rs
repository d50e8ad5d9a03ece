//! The live TUI: the default workload with every probe the host allows, shown as it runs. Its
//! [`App`] keeps the view and the run's one [`Recorder`], fed from the pipeline's one channel;
//! an input thread puts key presses on the same channel, and the screen is redrawn once per
//! second or after a key, never per event.

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
use virtgap_workloads::{RunOptions, WorkloadEvent};

use crate::cli::TuiArgs;
use crate::run::pipeline::{Carries, Event};
use crate::run::prepare::prepare;
use crate::run::recorder::{unix_ms, RecordPlan, Recorder, RunContext};
use app::{Action, App, RunState};

/// Without --duration the workload runs until the user quits (up to this long).
const UNTIL_QUIT: Duration = Duration::from_secs(30 * 24 * 3600);

/// What the TUI's one channel carries: the pipeline's events, and the terminal's.
// Events pass one at a time through the channel: boxing each would allocate per interval.
#[allow(clippy::large_enum_variant)]
enum Input {
    Pipeline(Event),
    Terminal(TermEvent),
}

impl From<WorkloadEvent> for Input {
    fn from(e: WorkloadEvent) -> Self {
        Self::Pipeline(Event::Workload(e))
    }
}

impl From<ProbeEvent> for Input {
    fn from(e: ProbeEvent) -> Self {
        Self::Pipeline(Event::Probe(e))
    }
}

impl Carries for Input {
    fn into_event(self) -> std::result::Result<Event, Self> {
        match self {
            Self::Pipeline(e) => Ok(e),
            other => Err(other),
        }
    }
}

/// The run as the TUI keeps it: what `s` saves and the autopsy reads besides the recorder.
struct Session<'a> {
    spec: &'a virtgap_workloads::WorkloadSpec,
    loaded: &'a virtgap_workloads::LoadedSpec,
    target: &'a virtgap_workloads::Target,
    args: &'a TuiArgs,
    started: std::time::SystemTime,
}

pub fn run(args: &TuiArgs) -> Result<ExitCode> {
    if args.attach.any() {
        return run_attached(args);
    }
    args.attach.check_no_devices()?;
    let loaded = spec::load(&args.workload)?;
    let mut spec = loaded.spec.clone();
    let mut overrides = args.overrides.to_overrides();
    if overrides.duration.is_none() {
        overrides.duration = Some(Span(UNTIL_QUIT));
    }
    overrides.apply(&mut spec)?;
    crate::cli::check_interval(&args.interval)?;
    let baseline = match &args.baseline {
        Some(path) => Some(crate::model::file::load(path)?),
        None => None,
    };
    if let Some(path) = &args.save {
        save_outputs(args, path, true)?;
    }
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        anyhow::bail!(
            "the live view needs a terminal (stdin and stdout are not both one); for a headless run use `virtgap record`"
        );
    }
    if args.listen.is_some() && args.probe.no_probes {
        anyhow::bail!("--listen serves what the probes measure: drop --no-probes or --listen");
    }
    let metrics = crate::run::endpoint::listen(args.listen)?;
    let signals = crate::run::signals::StopSignals::install(true)?;
    let target_options = args.target.options();
    let size_explicit = args.overrides.size.is_some();
    let Some(prepared) = prepare(&spec, size_explicit, &target_options, true, &signals)? else {
        return Ok(signals.exit_code());
    };
    let (tx, rx) = mpsc::channel::<Input>();
    let mut app = start(
        args,
        &spec,
        &prepared,
        (baseline, metrics.as_ref()),
        &tx,
        &rx,
    )?;
    let stop = &prepared.stop;
    // The workers hand their slow I/Os over as they go, so the autopsy shows while they run.
    let block_attached = app
        .app
        .report()
        .is_some_and(|r| r.attached(virtgap_probes::Family::Block));
    let tail_watch = block_attached.then(|| {
        virtgap_workloads::slow::TailWatch::handing_over(spec.workers, app.slow_request_ns.clone())
    });
    if let Some(w) = &tail_watch {
        app.app.recorder.watch_tail(Arc::clone(w));
    }
    let options = RunOptions {
        interval: args.interval.0,
        tail_watch,
        ..RunOptions::default()
    };
    let workers = prepared.start(&spec, &options, tx.clone());
    app.app.recorder.workload_started(workers.workers());
    let session = Session {
        spec: &spec,
        loaded: &loaded,
        target: &prepared.target,
        args,
        started: std::time::SystemTime::now(),
    };

    // Terminal input on its own thread, into the one channel with the pipeline.
    let input_stop = Arc::new(AtomicBool::new(false));
    let input = spawn_input(tx, Arc::clone(&input_stop))?;
    let mut terminal = ratatui::init();
    let result = event_loop(
        &mut terminal,
        &mut app.app,
        &rx,
        stop,
        Mode::Workload(&session),
    );
    ratatui::restore();

    stop.store(true, Ordering::Relaxed);
    input_stop.store(true, Ordering::Relaxed);
    workers.join();
    if let Some(c) = app.collector {
        c.stop();
    }
    let _ = input.join();
    result?;
    if let RunState::Failed(e) = &app.app.state {
        anyhow::bail!("the workload failed: {e}");
    }
    if signals.received().is_some() {
        return Ok(signals.exit_code());
    }
    Ok(ExitCode::SUCCESS)
}

/// The app, ready for the workload: probes attached, the idle host measured.
struct Started {
    app: App,
    collector: Option<virtgap_probes::ProbeHandle>,
    /// Requests at least this long are sent for the tail autopsy (the workers move it).
    slow_request_ns: Arc<std::sync::atomic::AtomicU64>,
}

fn start(
    args: &TuiArgs,
    spec: &virtgap_workloads::WorkloadSpec,
    prepared: &crate::run::prepare::Prepared,
    (baseline, metrics): (
        Option<crate::model::profile::Profile>,
        Option<&crate::run::endpoint::SharedEndpoint>,
    ),
    tx: &mpsc::Sender<Input>,
    rx: &mpsc::Receiver<Input>,
) -> Result<Started> {
    let host = crate::run::host::this_host();
    // The recorder (its interval series' temporary file included) before the probes: creating
    // that file may read the filesystem's metadata, a block request of this process.
    let plan = RecordPlan {
        interval: args.interval.0,
        ramp: spec.ramp.0,
        disks: prepared.disks.clone(),
        probed: !args.probe.no_probes,
        hypervisor: crate::run::host::this_hypervisor(),
    };
    let recorder = Recorder::of_workload(plan, &spec.name, metrics);
    // The tail autopsy, as `record` keeps it.
    let slow_request_ns = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let probes = crate::run::session::start_probes(
        &args.probe.choice(),
        args.interval.0,
        Some(Arc::clone(&slow_request_ns)),
        tx,
        rx,
    )?;
    let workload = virtgap_workloads::units::printable(&spec.describe()).into_owned();
    let mut app = App::new(host, workload, recorder);
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
    let collector = probes.map(|(handle, report)| {
        app.on_probe_report(report);
        handle
    });
    if collector.is_some() {
        // The idle host first, as `record` measures it (the screen is not up yet: the line goes
        // where the target's preparation printed its own).
        say!("measuring the idle host for a second before the workload starts");
        let recorder = &mut app.recorder;
        let idle = crate::run::session::wait_for_idle_interval(
            rx,
            &prepared.stop,
            args.interval.0,
            |ev| {
                recorder.on_event(Event::Probe(ev));
            },
        );
        if let Some((cumulative, interval)) = idle {
            recorder.set_idle(cumulative, interval);
        }
    }
    Ok(Started {
        app,
        collector,
        slow_request_ns,
    })
}

/// The live view of processes already running (`--pid`, `--cgroup`, `--comm`, `--all`): no
/// workload; the probes follow them until `q`, a signal, or the last of them exits (the view
/// then stays, marked finished, until `q`).
fn run_attached(args: &TuiArgs) -> Result<ExitCode> {
    let given = |set: bool, flag: &'static str| set.then_some(flag);
    let workload_flag = args
        .overrides
        .workload_flag()
        .or(given(args.workload != spec::DEFAULT_PRESET, "--workload"))
        .or(args.target.given());
    if let Some(flag) = workload_flag {
        anyhow::bail!("{flag} is for a built-in workload, and --pid, --cgroup, --comm and --all show processes already running: drop one or the other");
    }
    if args.probe.no_probes {
        anyhow::bail!(
            "--pid, --cgroup, --comm and --all show processes through the probes: drop --no-probes"
        );
    }
    crate::cli::check_interval(&args.interval)?;
    let baseline = match &args.baseline {
        Some(path) => Some(crate::model::file::load(path)?),
        None => None,
    };
    let (plan, _) = args
        .attach
        .plan(args.interval.0, None, args.probe.choice())?;
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        anyhow::bail!(
            "the live view needs a terminal (stdin and stdout are not both one); for a headless run use `virtgap record --pid/--cgroup/--comm/--all`"
        );
    }
    let describe = plan.describe();
    let metrics = crate::run::endpoint::listen(args.listen)?;
    let signals = crate::run::signals::StopSignals::install(true)?;
    let config = crate::run::attached::follow_config(&plan)?;
    // Before the probes: the recorder's own temporary file is not measured (`--all`).
    let mut recorder = Recorder::attached(
        args.interval.0,
        crate::run::host::this_hypervisor(),
        plan.disks.clone(),
    );
    let (tx, rx) = mpsc::channel::<Input>();
    let (collector, report) =
        crate::run::session::start_collector(config, args.interval.0, &tx, &rx)?;
    let label = args
        .attach
        .label
        .clone()
        .unwrap_or_else(|| describe.clone());
    if let Some(endpoint) = &metrics {
        recorder.serve_metrics(crate::run::recorder::Metrics::new(
            endpoint, &label, &describe,
        ));
    }
    let workload =
        virtgap_workloads::units::printable(&format!("attached to {label}")).into_owned();
    let mut app = App::new(crate::run::host::this_host(), workload, recorder);
    app.attached = true;
    app.baseline = baseline;
    app.on_probe_report(report);
    let input_stop = Arc::new(AtomicBool::new(false));
    let input = spawn_input(tx, Arc::clone(&input_stop))?;
    let mut saves = AttachedSave {
        plan: &plan,
        args,
        started: std::time::SystemTime::now(),
        seen: crate::run::attached::Seen::at_start(&plan),
    };
    let mut terminal = ratatui::init();
    let result = event_loop(
        &mut terminal,
        &mut app,
        &rx,
        &signals.stop,
        Mode::Attached(&mut saves),
    );
    ratatui::restore();
    input_stop.store(true, Ordering::Relaxed);
    collector.stop();
    let _ = input.join();
    result?;
    if signals.received().is_some() {
        return Ok(signals.exit_code());
    }
    Ok(ExitCode::SUCCESS)
}

/// Key presses and resizes, polled on their own thread into the channel.
fn spawn_input(
    tx: mpsc::Sender<Input>,
    stop: Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<()>> {
    Ok(std::thread::Builder::new()
        .name("vgtool-input".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if event::poll(Duration::from_millis(100)).unwrap_or(false) {
                    match event::read() {
                        Ok(ev) => {
                            if tx.send(Input::Terminal(ev)).is_err() {
                                break;
                            }
                        }
                        Err(_) => break,
                    }
                }
            }
        })?)
}

fn event_loop(
    terminal: &mut ratatui::DefaultTerminal,
    app: &mut App,
    rx: &mpsc::Receiver<Input>,
    stop: &AtomicBool,
    mut mode: Mode<'_, '_>,
) -> Result<()> {
    let session = match &mode {
        Mode::Workload(s) => Some(*s),
        Mode::Attached(_) => None,
    };
    let started = Instant::now();
    let mut redraw = true;
    let mut next_tick = Instant::now();
    let mut next_tail = Instant::now() + LIVE_TAIL_EVERY;
    // How much material the shown autopsy was made of: redone only when more came.
    let mut tail_made_of = 0;
    loop {
        // The tail autopsy joins the workload's own slow I/Os (none in attach mode).
        if let Some(session) = session.filter(|_| {
            app.state == RunState::Running && app.paused.is_none() && Instant::now() >= next_tail
        }) {
            app.recorder.collect_slow_ios();
            let material = app.recorder.tail_material().len();
            if material != tail_made_of {
                if let Some(tail) = tail_so_far(app, session) {
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
                match (app.handle_key(key), &mode) {
                    (Action::Quit, _) => return Ok(()),
                    (Action::Save, Mode::Workload(session)) => save(app, session),
                    (Action::Save, Mode::Attached(saves)) => save_attached(app, saves),
                    (Action::None, _) => {}
                }
            }
            Input::Terminal(TermEvent::Resize(..)) => redraw = true,
            Input::Terminal(_) => {}
            Input::Pipeline(ev) => {
                if let (
                    Mode::Attached(saves),
                    Event::Probe(ProbeEvent::Snapshot { cumulative, .. }),
                ) = (&mut mode, &ev)
                {
                    if let Some(pids) = &cumulative.followed {
                        saves.seen.add(pids);
                    }
                }
                let was_running = app.state == RunState::Running;
                redraw |= app.on_event(ev, started.elapsed());
                if let Some(session) =
                    session.filter(|_| was_running && app.state != RunState::Running)
                {
                    // The whole run's autopsy (or what a failed run left).
                    refresh_tail(app, session);
                }
            }
        }
    }
}

/// What the event loop runs: a workload's session, or an attached view and what it needs to
/// save itself.
enum Mode<'s, 'a> {
    Workload(&'s Session<'a>),
    Attached(&'s mut AttachedSave<'a>),
}

/// What an attached view keeps to save itself as `record --pid/--cgroup/--comm/--all` would:
/// what it attached to, since when, and the processes it has followed.
struct AttachedSave<'a> {
    plan: &'a crate::run::attached::AttachPlan,
    args: &'a TuiArgs,
    started: std::time::SystemTime,
    seen: crate::run::attached::Seen,
}

/// Saves what the attached view has seen so far, in the `record --pid -o` format (incomplete
/// while the processes still run).
fn save_attached(app: &mut App, saves: &AttachedSave<'_>) {
    use crate::model::attached::AttachEnd;
    let end = if app.state == RunState::Running {
        AttachEnd::Interrupted
    } else {
        AttachEnd::ProcessesExited
    };
    let host = crate::model::host::Fingerprint {
        label: saves.plan.label.clone(),
        ..app.host.clone()
    };
    let profile = crate::run::attached::attached_profile(
        saves.plan,
        &app.recorder,
        (host, saves.started),
        saves.seen.clone(),
        end,
    );
    app.message = Some(match profile {
        Ok(profile) => write_saved(saves.args, "attached", &profile),
        Err(e) => format!("save failed: {e}"),
    });
}

/// Writes `profile` where `s` saves (`--save`, else `virtgap-<stem>-<time>.json` here) and
/// says where, or why not.
fn write_saved(args: &TuiArgs, stem: &str, profile: &crate::model::profile::Profile) -> String {
    let path = args.save.clone().unwrap_or_else(|| {
        let stamp = unix_ms(std::time::SystemTime::now()) / 1000;
        std::path::PathBuf::from(format!("virtgap-{stem}-{stamp}.json"))
    });
    let result = serde_json::to_vec_pretty(profile)
        .map_err(anyhow::Error::from)
        .and_then(|bytes| {
            // Checked again as it is now; an explicit --save is consent to replace that file.
            let outputs = save_outputs(args, &path, args.save.is_some())?;
            Ok(outputs.write("--save", &path, &bytes)?)
        });
    saved_message(result, &path)
}

/// "saved profile PATH", or why not.
fn saved_message(result: Result<()>, path: &std::path::Path) -> String {
    match result {
        Ok(()) => format!(
            "saved profile {}",
            virtgap_workloads::units::printable(&path.display().to_string())
        ),
        Err(e) => format!(
            "save failed: {}",
            virtgap_workloads::units::printable(&format!("{e:#}"))
        ),
    }
}

/// How often a running workload's tail autopsy is redone.
const LIVE_TAIL_EVERY: Duration = Duration::from_secs(5);

/// Takes what the workers handed over and redoes the autopsy with it.
fn refresh_tail(app: &mut App, session: &Session<'_>) {
    app.recorder.collect_slow_ios();
    app.tail = tail_so_far(app, session);
}

/// The tail autopsy of the run so far (since start or reset), over the stages a saved profile
/// holds.
fn tail_so_far(app: &App, session: &Session<'_>) -> Option<crate::model::tail::TailAutopsy> {
    app.recorder
        .tail_autopsy(session.target, &app.recorder.stages())
}

/// The `--save` file checked against what the TUI reads.
fn save_outputs(
    args: &TuiArgs,
    path: &std::path::Path,
    force: bool,
) -> Result<crate::run::output::Outputs> {
    crate::run::output::tui_save(
        &args.workload,
        args.target.target.as_deref(),
        args.baseline.as_deref(),
        path,
        force,
    )
}

/// Saves what has run so far, in the `record --output` format.
fn save(app: &mut App, session: &Session<'_>) {
    if app.state == RunState::Running {
        // The autopsy as of now, not of the last refresh.
        refresh_tail(app, session);
    }
    let profile = match saved_profile(app, session) {
        Ok(p) => p,
        Err(e) => {
            app.message = Some(format!("save failed: {e}"));
            return;
        }
    };
    app.message = Some(write_saved(session.args, &session.spec.name, &profile));
}

/// What has run so far as a profile, in the `record --output` format (one run, incomplete
/// until the workload finished), with the autopsy as last shown.
fn saved_profile(
    app: &App,
    session: &Session<'_>,
) -> std::result::Result<crate::model::profile::Profile, String> {
    let cx = RunContext {
        spec: session.spec,
        loaded: session.loaded,
        target: session.target,
        host: app.host.clone(),
        interval: session.args.interval.0,
        started: session.started,
        calibration: None,
        recorder_cpu_pct: None,
        complete: app.state == RunState::Finished,
    };
    let mut profile = app.recorder.profile(&cx, false)?;
    profile.runs[0].tail = app.tail.clone();
    Ok(profile)
}
