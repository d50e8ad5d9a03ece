//! The TUI's state: what is shown, what is selected, and the data the pipeline delivered. Keys
//! and pipeline events change it; rendering only reads it.

use std::collections::VecDeque;
use std::time::Duration;

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use virtgap_probes::{CapabilityReport, ProbeSnapshot};
use virtgap_workloads::stats::IntervalSample;
use virtgap_workloads::LatencyHistogram;

use crate::model::host::Fingerprint;
use crate::model::profile::Profile;
use crate::run::series::IntervalSeries;

/// Intervals kept for the sparklines (five minutes at the default 1 s).
const HISTORY: usize = 300;

/// Slow I/Os, and slow requests, the TUI keeps for the tail autopsy (each ~50 bytes).
pub const MAX_TAIL_MATERIAL: usize = 500_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    Time,
    Cpus,
    Hypervisor,
    Devices,
}

impl View {
    pub const ALL: [View; 4] = [View::Time, View::Cpus, View::Hypervisor, View::Devices];

    pub fn title(self) -> &'static str {
        match self {
            View::Time => "Where the time goes",
            View::Cpus => "CPUs",
            View::Hypervisor => "Hypervisor",
            View::Devices => "Devices",
        }
    }

    fn index(self) -> usize {
        Self::ALL.iter().position(|v| *v == self).unwrap_or(0)
    }
}

/// What a key asks the event loop to do beyond changing state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    None,
    Quit,
    Save,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunState {
    Running,
    Finished,
    Failed(String),
}

/// One interval as the sparklines need it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Point {
    pub iops: f64,
    pub bytes_per_s: f64,
    pub p99_ns: Option<u64>,
}

/// The measured data. Cloned when the display is paused, so the frozen view stays as it was.
#[derive(Clone, Debug, Default)]
pub struct Data {
    pub elapsed: Duration,
    pub points: VecDeque<Point>,
    /// App latency (both directions) since start or the last reset.
    pub app: LatencyHistogram,
    pub read_ios: u64,
    pub write_ios: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Probe totals since start or the last reset.
    pub probes: Option<ProbeSnapshot>,
    /// The most recent probe interval.
    pub probe_interval: Option<ProbeSnapshot>,
}

/// What the TUI says of a kv run: ACT's verdict needs whole slices, so it comes when the run
/// ends.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KvPanel {
    /// "4000 reads/s + 2000 writes/s, 60 s slices".
    pub load: String,
    /// The verdict line, once the run ended.
    pub verdict: Option<String>,
    /// Shares of the load delivered, once the run ended.
    pub delivered: Option<String>,
    /// One line per verdict slice, once the run ended.
    pub slices: Vec<String>,
}

impl KvPanel {
    /// The panel filled in from the run's outcome.
    pub fn finish(&mut self, k: &virtgap_workloads::kv::KvOutcome) {
        self.verdict = Some(crate::render::kv_report::verdict_text(k));
        self.delivered = Some(format!(
            "delivered {:.1}% of the client operations and {:.1}% of the large-block operations; worst lag {}",
            k.achieved_fraction() * 100.0,
            k.large_block_fraction() * 100.0,
            virtgap_workloads::units::latency(k.worst_lag.as_nanos() as f64)
        ));
        self.slices = k
            .slices
            .iter()
            .map(|s| {
                let r = &s.reads;
                format!(
                    "slice {:.0}-{:.0} s: {} reads, {:.2}% >= 1 ms, {:.2}% >= 8 ms, {:.2}% >= 64 ms (judged on {}) {}",
                    s.start_s,
                    s.end_s,
                    r.reads,
                    r.over_1ms_pct,
                    r.over_8ms_pct,
                    r.over_64ms_pct,
                    s.judged_on.label(),
                    crate::render::kv_report::slice_word(k, s)
                )
            })
            .collect();
    }
}

/// Everything the TUI shows.
#[derive(Debug)]
pub struct App {
    pub view: View,
    pub help: bool,
    pub paused: Option<Data>,
    /// The CPU picked with the arrows; until then the CPU panels follow the busiest CPU
    /// (see [`App::focus_cpu`]).
    pub selected_cpu: Option<usize>,
    pub selected_device: usize,
    pub host: Fingerprint,
    pub workload: String,
    pub report: Option<CapabilityReport>,
    pub state: RunState,
    pub baseline: Option<Profile>,
    /// A one-line note at the bottom ("saved profile to …").
    pub message: Option<String>,
    pub live: Data,
    /// Probe totals at the last reset, subtracted from what the collector reports.
    reset_base: Option<ProbeSnapshot>,
    /// Probe intervals of the workload's ramp still to come: at its end the counters restart,
    /// so the probes' totals cover the same window as the workload's measured intervals.
    ramp_intervals_left: u64,
    /// The raw cumulative probe totals, as reported.
    pub probe_total: Option<ProbeSnapshot>,
    /// Kernel names of the block devices the probes saw, resolved outside the render path.
    pub device_names: std::collections::BTreeMap<(u32, u32), String>,
    disks: crate::model::host::TargetDisks,
    /// The disks whose stages are the target's (None: unknown, every device counts).
    target_devs: Option<Vec<(u32, u32)>>,
    /// A kv run's load and, once it ended, ACT's verdict.
    pub kv: Option<KvPanel>,
    /// Intervals joined with probe data since start or the last reset, kept for saving a
    /// profile; bounded however long the TUI runs.
    pub series: IntervalSeries,
    /// The tail autopsy's material since start or the last reset: the block probe's slow
    /// requests as they come, the workers' slow I/Os as they hand them over (and the rest when
    /// they finish). At most [`MAX_TAIL_MATERIAL`] of each: past it the older half goes.
    pub slow_requests: Vec<virtgap_probes::model::SlowRequest>,
    pub slow_ios: Vec<virtgap_workloads::slow::SlowIo>,
    /// CLOCK_MONOTONIC at the last reset: slow I/Os and requests before it are left out.
    tail_since_ns: u64,
    /// Where the workers hand their slow I/Os over while they run (None: no block probe).
    pub tail_watch: Option<std::sync::Arc<virtgap_workloads::slow::TailWatch>>,
    /// The tail autopsy: of the run so far while it runs (refreshed every few seconds), of the
    /// whole run once it finished.
    pub tail: Option<crate::model::tail::TailAutopsy>,
    /// The interval of the idle host measured before the workload started.
    pub idle: Option<crate::model::profile::IdleBaseline>,
}

impl App {
    pub fn new(
        host: Fingerprint,
        workload: String,
        disks: crate::model::host::TargetDisks,
    ) -> Self {
        Self {
            view: View::Time,
            help: false,
            paused: None,
            selected_cpu: None,
            selected_device: 0,
            host,
            workload,
            report: None,
            state: RunState::Running,
            baseline: None,
            message: None,
            live: Data::default(),
            reset_base: None,
            ramp_intervals_left: 0,
            probe_total: None,
            device_names: Default::default(),
            target_devs: disks.devs(),
            kv: None,
            series: IntervalSeries::new(
                Duration::from_secs(1),
                Duration::ZERO,
                disks.devs(),
                false,
            ),
            disks,
            slow_requests: Vec::new(),
            slow_ios: Vec::new(),
            tail_since_ns: 0,
            tail_watch: None,
            tail: None,
            idle: None,
        }
    }

    /// The idle interval before the workload: kept as the baseline, and the probes' totals at
    /// its end become the base the shown figures count from (as after a reset).
    pub fn on_idle_interval(&mut self, cumulative: ProbeSnapshot, interval: &ProbeSnapshot) {
        let seconds = interval.elapsed_ns as f64 / 1e9;
        if seconds > 0.0 {
            let devs = self.target_devs.clone();
            self.idle = Some(crate::model::profile::IdleBaseline::of(
                &crate::model::profile::ProbeInterval::of(interval, devs.as_deref()),
                seconds,
                self.report.as_ref().is_some_and(|r| r.counts_ipis()),
            ));
        }
        self.reset_base = Some(cumulative.clone());
        self.probe_total = Some(cumulative);
    }

    pub fn on_slow_requests(&mut self, requests: Vec<virtgap_probes::model::SlowRequest>) {
        let since = self.tail_since_ns;
        self.slow_requests
            .extend(requests.into_iter().filter(|r| r.complete_ns >= since));
        self.bound_tail_material();
    }

    /// Keeps slow I/Os a worker handed over or left when it finished (those since the last
    /// reset).
    pub fn on_slow_ios(&mut self, ios: &[virtgap_workloads::slow::SlowIo]) {
        let since = self.tail_since_ns;
        self.slow_ios
            .extend(ios.iter().filter(|io| io.start_ns >= since));
        self.bound_tail_material();
    }

    /// Takes what the workers handed over since the last call.
    pub fn collect_slow_ios(&mut self) {
        if let Some(handed) = self.tail_watch.as_ref().map(|w| w.take_handed()) {
            self.on_slow_ios(&handed);
        }
    }

    /// A TUI runs for as long as it is left open: past [`MAX_TAIL_MATERIAL`] slow I/Os or
    /// requests, both drop what came before the middle of the kept I/Os, so the autopsy covers
    /// the later part of the run (its sets then say fewer I/Os were kept than expected).
    fn bound_tail_material(&mut self) {
        if self.slow_ios.len() <= MAX_TAIL_MATERIAL && self.slow_requests.len() <= MAX_TAIL_MATERIAL
        {
            return;
        }
        // The middle of whichever list is over the bound (the later one when both are).
        let middle = |mut times: Vec<u64>| -> u64 {
            let at = times.len() / 2;
            *times.select_nth_unstable(at).1
        };
        let ios_over = self.slow_ios.len() > MAX_TAIL_MATERIAL;
        let requests_over = self.slow_requests.len() > MAX_TAIL_MATERIAL;
        let of_ios = || middle(self.slow_ios.iter().map(|io| io.start_ns).collect());
        let of_requests = || middle(self.slow_requests.iter().map(|r| r.complete_ns).collect());
        let cutoff = match (ios_over, requests_over) {
            (true, true) => of_ios().max(of_requests()),
            (true, false) => of_ios(),
            _ => of_requests(),
        };
        self.slow_ios.retain(|io| io.start_ns >= cutoff);
        self.slow_requests.retain(|r| r.complete_ns >= cutoff);
        self.tail_since_ns = self.tail_since_ns.max(cutoff);
    }

    /// The data to draw: the frozen copy while paused.
    pub fn shown(&self) -> &Data {
        self.paused.as_ref().unwrap_or(&self.live)
    }

    /// The CPU the CPU panels show: the one picked with the arrows, else the busiest in the
    /// latest interval — where the workload and its interrupts run, not an idle cpu0.
    pub fn focus_cpu(&self) -> usize {
        self.selected_cpu
            .or_else(|| busiest_cpu(self.shown().probe_interval.as_ref()?))
            .unwrap_or(0)
    }

    /// The disks whose stages are the target's, for filtering snapshots.
    pub fn target_devs(&self) -> Option<&[(u32, u32)]> {
        self.target_devs.as_deref()
    }

    pub fn disks(&self) -> &crate::model::host::TargetDisks {
        &self.disks
    }

    /// Number of CPUs to list.
    pub fn cpus(&self) -> usize {
        self.host.cpus.max(1) as usize
    }

    pub fn handle_key(&mut self, key: KeyEvent) -> Action {
        if key.kind == KeyEventKind::Release {
            return Action::None;
        }
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            return Action::Quit;
        }
        if self.help {
            // Any key closes the help; q still quits.
            self.help = false;
            return if key.code == KeyCode::Char('q') {
                Action::Quit
            } else {
                Action::None
            };
        }
        match key.code {
            KeyCode::Char('q') | KeyCode::Esc => return Action::Quit,
            KeyCode::Char('?') | KeyCode::F(1) => self.help = true,
            KeyCode::Tab => self.view = View::ALL[(self.view.index() + 1) % View::ALL.len()],
            KeyCode::BackTab => {
                self.view = View::ALL[(self.view.index() + View::ALL.len() - 1) % View::ALL.len()]
            }
            KeyCode::Char(c @ '1'..='4') => self.view = View::ALL[(c as u8 - b'1') as usize],
            KeyCode::Char('5') => self.help = true,
            KeyCode::Up | KeyCode::Left => self.select(-1),
            KeyCode::Down | KeyCode::Right => self.select(1),
            KeyCode::Char('p') => {
                self.paused = match self.paused.take() {
                    Some(_) => None,
                    None => Some(self.live.clone()),
                }
            }
            KeyCode::Char('r') => self.reset(),
            KeyCode::Char('s') => return Action::Save,
            _ => {}
        }
        Action::None
    }

    fn select(&mut self, step: isize) {
        let (slot, len) = match self.view {
            View::Devices => (
                &mut self.selected_device,
                self.host.block_devices.len().max(1),
            ),
            _ => {
                let from = self.focus_cpu();
                (
                    self.selected_cpu.insert(from),
                    self.host.cpus.max(1) as usize,
                )
            }
        };
        *slot = ((*slot as isize + step).rem_euclid(len as isize)) as usize;
    }

    /// Clears the cumulative counters; the next data starts from zero.
    pub fn reset(&mut self) {
        self.reset_base = self.probe_total.clone();
        let points = std::mem::take(&mut self.live.points);
        self.live = Data {
            points,
            elapsed: self.live.elapsed,
            ..Data::default()
        };
        self.series.clear();
        self.slow_requests.clear();
        self.slow_ios.clear();
        self.tail_since_ns = virtgap_workloads::slow::monotonic_ns();
        self.tail = None;
        self.message = Some("counters reset".into());
    }

    pub fn on_probe_report(&mut self, report: CapabilityReport) {
        self.report = Some(report);
    }

    /// The workload ramps up for `ramp` before it measures, probe intervals being `interval`
    /// long: the probes' counters restart where its measured window begins (as the interval
    /// series drops the ramp's probe intervals).
    pub fn measure_after_ramp(&mut self, interval: Duration, ramp: Duration) {
        self.ramp_intervals_left = IntervalSeries::ramp_intervals(interval, ramp);
    }

    pub fn on_probe_snapshot(&mut self, cumulative: ProbeSnapshot, interval: ProbeSnapshot) {
        if self.ramp_intervals_left > 0 {
            self.ramp_intervals_left -= 1;
            if self.ramp_intervals_left == 0 {
                // The ramp ends here: what it did is not the measured window's.
                self.reset_base = Some(cumulative.clone());
                self.tail_since_ns = virtgap_workloads::slow::monotonic_ns();
                self.slow_requests.clear();
            }
        }
        self.live.probes = Some(match &self.reset_base {
            Some(base) => cumulative.since(base),
            None => cumulative.clone(),
        });
        self.probe_total = Some(cumulative);
        self.series.add_probe(&interval);
        self.live.probe_interval = Some(interval);
    }

    pub fn on_interval(&mut self, sample: &IntervalSample, elapsed: Duration) {
        let secs = (sample.end_ns - sample.start_ns) as f64 / 1e9;
        let rate = |x: u64| if secs > 0.0 { x as f64 / secs } else { 0.0 };
        let d = &mut self.live;
        d.elapsed = elapsed;
        d.points.push_back(Point {
            iops: rate(sample.ios()),
            bytes_per_s: rate(sample.read_bytes + sample.write_bytes),
            p99_ns: sample.lat.percentile_ns(99.0),
        });
        while d.points.len() > HISTORY {
            d.points.pop_front();
        }
        d.app.merge(&sample.lat);
        d.read_ios += sample.read_ios;
        d.write_ios += sample.write_ios;
        d.read_bytes += sample.read_bytes;
        d.write_bytes += sample.write_bytes;
        self.series.add_sample(sample.clone());
    }

    pub fn set_elapsed(&mut self, elapsed: Duration) {
        self.live.elapsed = elapsed;
    }

    /// Hard-IRQ + softirq share of each CPU in the latest probe interval, in percent.
    pub fn irq_load(&self) -> Vec<(u32, f64, f64)> {
        let Some(iv) = &self.shown().probe_interval else {
            return vec![];
        };
        let secs = iv.elapsed_ns as f64 / 1e9;
        let Some(irq) = &iv.irq else { return vec![] };
        if secs <= 0.0 {
            return vec![];
        }
        irq.cpu_irq_time()
            .into_iter()
            .map(|(cpu, hard, soft)| {
                (
                    cpu,
                    hard as f64 / 1e9 / secs * 100.0,
                    soft as f64 / 1e9 / secs * 100.0,
                )
            })
            .collect()
    }
}

/// The CPU with the most non-idle sampler samples; without the sampler, the most interrupt
/// time, then the most user and system time.
fn busiest_cpu(iv: &ProbeSnapshot) -> Option<usize> {
    use virtgap_probes::virt::SampleCategory;
    if let Some(sampler) = &iv.sampler {
        let busy = |c: &virtgap_probes::model::CpuSamples| {
            c.total()
                - c.categories()
                    .get(&SampleCategory::Idle)
                    .copied()
                    .unwrap_or(0)
        };
        if let Some(c) = sampler
            .cpus
            .iter()
            .filter(|c| busy(c) > 0)
            .max_by_key(|c| busy(c))
        {
            return Some(c.cpu as usize);
        }
    }
    iv.cpu_times
        .iter()
        .filter(|t| t.irq_ns + t.softirq_ns + t.user_ns + t.system_ns > 0)
        .max_by_key(|t| (t.irq_ns + t.softirq_ns, t.user_ns + t.system_ns))
        .map(|t| t.cpu as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::crossterm::event::KeyEvent;

    fn key(c: KeyCode) -> KeyEvent {
        KeyEvent::new(c, KeyModifiers::NONE)
    }

    pub(crate) fn app() -> App {
        let host: Fingerprint =
            serde_json::from_str::<Profile>(include_str!("../../tests/data/minimal-profile.json"))
                .unwrap()
                .host;
        App::new(
            host,
            "rand4k".into(),
            crate::model::host::TargetDisks::plain("vda", 254, 0),
        )
    }

    #[test]
    fn views_switch_by_number_and_tab() {
        let mut a = app();
        assert_eq!(a.handle_key(key(KeyCode::Char('2'))), Action::None);
        assert_eq!(a.view, View::Cpus);
        a.handle_key(key(KeyCode::Tab));
        assert_eq!(a.view, View::Hypervisor);
        a.handle_key(key(KeyCode::BackTab));
        a.handle_key(key(KeyCode::BackTab));
        assert_eq!(a.view, View::Time);
        a.handle_key(key(KeyCode::Char('4')));
        assert_eq!(a.view, View::Devices);
    }

    #[test]
    fn quit_save_help_pause_and_reset() {
        let mut a = app();
        assert_eq!(a.handle_key(key(KeyCode::Char('s'))), Action::Save);
        a.handle_key(key(KeyCode::Char('?')));
        assert!(a.help);
        assert_eq!(
            a.handle_key(key(KeyCode::Char('x'))),
            Action::None,
            "any key closes help"
        );
        assert!(!a.help);
        a.live.read_ios = 10;
        a.handle_key(key(KeyCode::Char('p')));
        a.live.read_ios = 20;
        assert_eq!(a.shown().read_ios, 10, "paused display is frozen");
        a.handle_key(key(KeyCode::Char('p')));
        assert_eq!(a.shown().read_ios, 20);
        a.handle_key(key(KeyCode::Char('r')));
        assert_eq!(a.shown().read_ios, 0);
        assert_eq!(a.handle_key(key(KeyCode::Char('q'))), Action::Quit);
        assert_eq!(
            a.handle_key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)),
            Action::Quit
        );
    }

    /// The probes' counters restart where the workload's measured window begins: what the
    /// ramp did is in neither the live figures nor a saved profile's totals.
    #[test]
    fn the_ramps_probe_counts_are_left_out() {
        use virtgap_probes::model::{BlockSnapshot, DeviceGauge};
        let snapshot = |completed: u64| ProbeSnapshot {
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
        };
        let completed = |a: &App| {
            a.live
                .probes
                .as_ref()
                .unwrap()
                .block
                .as_ref()
                .unwrap()
                .devices[0]
                .completed
        };
        let mut a = app();
        a.on_idle_interval(snapshot(10), &snapshot(10).since(&snapshot(0)));
        // Two 1-s probe intervals of ramp, then the measured window.
        a.measure_after_ramp(Duration::from_secs(1), Duration::from_secs(2));
        a.on_probe_snapshot(snapshot(110), snapshot(110).since(&snapshot(10)));
        assert_eq!(completed(&a), 100, "the ramp shows while it runs");
        a.on_probe_snapshot(snapshot(210), snapshot(210).since(&snapshot(110)));
        a.on_probe_snapshot(snapshot(330), snapshot(330).since(&snapshot(210)));
        assert_eq!(completed(&a), 120, "only the measured interval counts");
        // Without a ramp, everything after the idle interval counts.
        let mut b = app();
        b.on_idle_interval(snapshot(10), &snapshot(10).since(&snapshot(0)));
        b.measure_after_ramp(Duration::from_secs(1), Duration::ZERO);
        b.on_probe_snapshot(snapshot(110), snapshot(110).since(&snapshot(10)));
        assert_eq!(completed(&b), 100);
    }

    #[test]
    fn arrows_select_cpus_and_wrap() {
        let mut a = app();
        a.handle_key(key(KeyCode::Char('2')));
        a.handle_key(key(KeyCode::Down));
        assert_eq!(a.focus_cpu(), 1);
        a.handle_key(key(KeyCode::Down));
        assert_eq!(a.focus_cpu(), 0, "wraps over 2 CPUs");
        a.handle_key(key(KeyCode::Up));
        assert_eq!(a.focus_cpu(), 1);
    }

    #[test]
    fn cpu_panels_follow_the_busiest_cpu_until_one_is_picked() {
        use virtgap_probes::model::{CpuSamples, SamplerSnapshot};
        let mut a = app();
        let cpu = |cpu, idle, work| CpuSamples {
            cpu,
            user: work,
            kernel: [("pv_native_safe_halt".to_string(), idle)].into(),
        };
        a.live.probe_interval = Some(ProbeSnapshot {
            sampler: Some(SamplerSnapshot {
                cpus: vec![cpu(0, 990, 9), cpu(1, 200, 799)],
                ..Default::default()
            }),
            ..Default::default()
        });
        assert_eq!(a.focus_cpu(), 1, "cpu1 does the work; cpu0 idles");
        // Picking starts from the CPU shown.
        a.handle_key(key(KeyCode::Char('2')));
        a.handle_key(key(KeyCode::Down));
        assert_eq!(a.selected_cpu, Some(0));
        assert_eq!(a.focus_cpu(), 0, "a picked CPU stays picked");
    }

    #[test]
    fn a_long_session_keeps_the_later_half_of_its_slow_ios_and_their_requests() {
        use virtgap_probes::model::{BlockOp, SlowRequest};
        use virtgap_workloads::slow::SlowIo;
        let mut a = app();
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
        };
        let n = MAX_TAIL_MATERIAL as u64;
        a.on_slow_requests((0..n).map(request).collect());
        a.on_slow_ios(&(0..n).map(io).collect::<Vec<_>>());
        assert_eq!(
            a.slow_ios.len(),
            MAX_TAIL_MATERIAL,
            "at the bound, nothing goes"
        );
        // One more of each: the I/Os before the middle go, with the requests that ended before it.
        a.on_slow_ios(&[io(n)]);
        a.on_slow_requests(vec![request(n)]);
        let middle = n / 2; // the middle index of the n + 1 kept (n is even)
        assert_eq!(a.slow_ios.first().map(|io| io.start_ns), Some(middle));
        assert_eq!(a.slow_ios.len() as u64, n + 1 - middle);
        assert!(a.slow_requests.iter().all(|r| r.complete_ns >= middle));
        // Those that completed at or after the cutoff (t + 9 >= middle), and the new one.
        assert_eq!(a.slow_requests.len() as u64, n - (middle - 9) + 1);
        // Slow I/Os a worker hands over later from before the cutoff are not taken back.
        a.on_slow_ios(&[io(3)]);
        assert!(a.slow_ios.iter().all(|io| io.start_ns >= middle));
    }
}
