//! The TUI's state: what is shown, what is selected, and the data the pipeline delivered. Keys
//! and pipeline events change it; rendering only reads it.

use std::collections::VecDeque;
use std::time::Duration;

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use virtgap_probes::{CapabilityReport, ProbeEvent, ProbeSnapshot};
use virtgap_workloads::stats::IntervalSample;
use virtgap_workloads::LatencyHistogram;

use crate::model::host::Fingerprint;
use crate::model::profile::Profile;
use crate::run::pipeline::Event;
use crate::run::recorder::{Recorder, Update};

/// Intervals kept for the sparklines (five minutes at the default 1 s).
const HISTORY: usize = 300;

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
    /// None where the bytes are not seen (an attached run without the app probe).
    pub bytes_per_s: Option<f64>,
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
    /// Attach mode: the followed processes' reads and writes (system calls and io_uring
    /// requests) since start, where the app probe times them.
    pub attached_app: Option<crate::model::histogram::Histogram>,
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
    /// How the rings' reads queued and their limit in flight, once the run ended.
    pub queueing: Vec<String>,
    /// One line per verdict slice, once the run ended.
    pub slices: Vec<String>,
}

impl KvPanel {
    /// The panel filled in from the run's outcome (its profile section).
    pub fn finish(&mut self, k: &crate::model::kv::KvSection) {
        use crate::render::kv_report::{shares_words, slice_result, slice_shares, verdict_text};
        self.verdict = Some(verdict_text(k));
        self.delivered = Some(format!(
            "delivered {:.1}% of the client operations and {:.1}% of the large-block operations; worst lag {}",
            k.delivered.client_fraction * 100.0,
            k.delivered.large_block_fraction * 100.0,
            virtgap_workloads::units::latency(k.worst_lag_ns as f64)
        ));
        self.queueing = k.read_queueing.as_ref().map_or(Vec::new(), |q| {
            crate::render::kv_report::queueing_text(q).to_vec()
        });
        self.slices = k
            .slices
            .iter()
            .map(|s| {
                let (device, intended) = slice_shares(s);
                format!(
                    "slice {:.0}-{:.0} s: {} reads; device {}; intended {}: {}",
                    s.start_s,
                    s.end_s,
                    s.reads.ops,
                    shares_words(device),
                    shares_words(intended),
                    slice_result(s)
                )
            })
            .collect();
    }
}

/// Everything the TUI shows: view state, and the run's [`Recorder`] it draws from.
#[derive(Debug)]
pub struct App {
    pub view: View,
    pub help: bool,
    /// The time view draws each stage's latency by percentile instead of the rates.
    pub percentiles: bool,
    pub paused: Option<Data>,
    /// The CPU picked with the arrows; until then the CPU panels follow the busiest CPU
    /// (see [`App::focus_cpu`]).
    pub selected_cpu: Option<usize>,
    pub selected_device: usize,
    pub host: Fingerprint,
    pub workload: String,
    pub state: RunState,
    pub baseline: Option<Profile>,
    /// A one-line note at the bottom ("saved profile to …").
    pub message: Option<String>,
    pub live: Data,
    /// Kernel names of the block devices the probes saw, as the views show them.
    pub device_names: std::collections::BTreeMap<(u32, u32), String>,
    /// A kv run's load and, once it ended, ACT's verdict.
    pub kv: Option<KvPanel>,
    /// The tail autopsy: of the run so far while it runs (refreshed every few seconds), of the
    /// whole run once it finished.
    pub tail: Option<crate::model::tail::TailAutopsy>,
    /// What the run recorded since start or the last reset (the interval series, the probes'
    /// window, the tail autopsy's material): what a saved profile is made of.
    pub recorder: Recorder,
    /// Attach mode: the probes follow running processes and no workload runs, so the rates
    /// and app latency come from the probes.
    pub attached: bool,
}

impl App {
    pub fn new(host: Fingerprint, workload: String, recorder: Recorder) -> Self {
        Self {
            view: View::Time,
            help: false,
            percentiles: false,
            paused: None,
            selected_cpu: None,
            selected_device: 0,
            host,
            workload,
            state: RunState::Running,
            baseline: None,
            message: None,
            live: Data::default(),
            device_names: Default::default(),
            kv: None,
            tail: None,
            recorder,
            attached: false,
        }
    }

    /// What attached, once the collector said.
    pub fn report(&self) -> Option<&CapabilityReport> {
        self.recorder.report()
    }

    /// Feeds one pipeline event to the recorder and follows it in the view. Whether the screen
    /// should be redrawn at once.
    pub fn on_event(&mut self, event: Event, elapsed: Duration) -> bool {
        match self.recorder.on_event(event) {
            Update::Nothing | Update::Report => false,
            Update::Intervals(samples) => {
                for s in &samples {
                    self.show_interval(s, elapsed);
                }
                false
            }
            Update::ProbeInterval(interval) => {
                if self.attached {
                    self.show_attached_interval(&interval, elapsed);
                }
                self.show_probe_interval(*interval);
                false
            }
            Update::WorkerFinished { failed } => {
                self.on_worker_finished(failed);
                true
            }
        }
    }

    fn on_worker_finished(&mut self, failed: Option<String>) {
        if let (Some(panel), Some(kv)) = (self.kv.as_mut(), self.recorder.stats().kv.as_deref()) {
            if panel.verdict.is_none() {
                panel.finish(&crate::run::assemble::kv_section(kv));
            }
        }
        match failed {
            Some(why) => self.state = RunState::Failed(why),
            None if self.recorder.all_finished() && self.state == RunState::Running => {
                self.state = RunState::Finished;
            }
            None => {}
        }
    }

    /// The shown data, as of the probes' latest interval.
    fn show_probe_interval(&mut self, interval: ProbeSnapshot) {
        for (dev, name) in self.recorder.device_names() {
            if !self.device_names.contains_key(dev) {
                self.device_names.insert(*dev, name.clone());
            }
        }
        self.live.probes = self.recorder.window();
        if self.attached {
            self.live.attached_app = self
                .live
                .probes
                .as_ref()
                .and_then(crate::run::assemble::attached_app_stage);
        }
        self.live.probe_interval = Some(interval);
    }

    /// Attach mode: the interval's block requests, the bytes and p99 of the followed
    /// processes' reads and writes where the app probe sees them, and the end of the run when
    /// every followed process has exited.
    fn show_attached_interval(&mut self, interval: &ProbeSnapshot, elapsed: Duration) {
        use virtgap_probes::model::{BlockOp, BlockStage};
        let secs = interval.elapsed_ns as f64 / 1e9;
        let rate = |x: u64| if secs > 0.0 { x as f64 / secs } else { 0.0 };
        let requests: u64 = interval
            .block
            .iter()
            .flat_map(|b| &b.stages)
            .filter(|s| s.stage == BlockStage::Device && s.op != BlockOp::Flush)
            .map(|s| s.hist.count)
            .sum();
        let app = interval.app.as_ref();
        let bytes = app.map(|a| {
            a.kinds
                .iter()
                .filter(|k| k.via == virtgap_probes::model::AppVia::Syscall)
                .map(|k| k.bytes)
                .sum::<u64>()
        });
        let p99 =
            crate::run::assemble::attached_app_stage(interval).and_then(|h| h.percentile_ns(99.0));
        let d = &mut self.live;
        d.elapsed = elapsed;
        d.points.push_back(Point {
            iops: rate(requests),
            bytes_per_s: bytes.map(rate),
            p99_ns: p99.map(|v| v as u64),
        });
        while d.points.len() > HISTORY {
            d.points.pop_front();
        }
        if interval.followed.as_ref().is_some_and(Vec::is_empty) && self.state == RunState::Running
        {
            self.state = RunState::Finished;
            self.message = Some("every followed process has exited".into());
        }
    }

    /// The shown data, as of a merged whole-run interval.
    fn show_interval(&mut self, sample: &IntervalSample, elapsed: Duration) {
        let secs = (sample.end_ns - sample.start_ns) as f64 / 1e9;
        let rate = |x: u64| if secs > 0.0 { x as f64 / secs } else { 0.0 };
        let totals = self.recorder.totals();
        let d = &mut self.live;
        d.elapsed = elapsed;
        d.points.push_back(Point {
            iops: rate(sample.ios()),
            bytes_per_s: Some(rate(sample.read_bytes + sample.write_bytes)),
            p99_ns: sample.lat.percentile_ns(99.0),
        });
        while d.points.len() > HISTORY {
            d.points.pop_front();
        }
        d.app = totals.app.clone();
        d.read_ios = totals.read_ios;
        d.write_ios = totals.write_ios;
        d.read_bytes = totals.read_bytes;
        d.write_bytes = totals.write_bytes;
    }

    /// A probe snapshot, as the collector sends it.
    pub fn on_probe_snapshot(&mut self, cumulative: ProbeSnapshot, interval: ProbeSnapshot) {
        self.on_event(
            Event::Probe(ProbeEvent::Snapshot {
                cumulative: Box::new(cumulative),
                interval: Box::new(interval),
            }),
            self.live.elapsed,
        );
    }

    pub fn on_probe_report(&mut self, report: CapabilityReport) {
        self.on_event(
            Event::Probe(ProbeEvent::Attached(report)),
            self.live.elapsed,
        );
    }

    /// A whole-run interval, merged across the workers.
    pub fn on_interval(&mut self, sample: &IntervalSample, elapsed: Duration) {
        self.recorder.add_intervals(std::slice::from_ref(sample));
        self.show_interval(sample, elapsed);
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
        self.recorder.devs()
    }

    pub fn disks(&self) -> &crate::model::host::TargetDisks {
        self.recorder.disks()
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
            KeyCode::Char('n') => {
                self.percentiles = !self.percentiles || self.view != View::Time;
                self.view = View::Time;
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
        self.recorder.reset();
        let points = std::mem::take(&mut self.live.points);
        self.live = Data {
            points,
            elapsed: self.live.elapsed,
            ..Data::default()
        };
        self.tail = None;
        self.message = Some("counters reset".into());
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
                - c.categories(sampler.hypervisor)
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
pub(crate) mod tests {
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
        App::new(host, "rand4k".into(), recorder(Duration::ZERO))
    }

    /// A recorder of a workload on vda with probes, 1 s intervals and `ramp`.
    pub(crate) fn recorder(ramp: Duration) -> Recorder {
        Recorder::new(crate::run::recorder::RecordPlan {
            interval: Duration::from_secs(1),
            ramp,
            disks: crate::model::host::TargetDisks::plain("vda", 254, 0),
            probed: true,
            hypervisor: virtgap_probes::hypervisor::Hypervisor::None,
        })
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
}

/// One probe snapshot read by the three outputs that turn it into figures (the profile's
/// assembly, the live view and the exporter): each CPU's hard-IRQ and softirq time agrees in
/// all three, on a Xen guest's snapshot whose timer and IPIs arrive as per-CPU IRQs (counted as
/// vectors everywhere, their time left out of hard-IRQ time everywhere).
#[cfg(test)]
mod consistency {
    use virtgap_probes::hist::KernelHist;
    use virtgap_probes::model::{CpuEvents, HardIrq, IrqSnapshot};
    use virtgap_probes::{CapabilityReport, ProbeSnapshot};

    use crate::model::metrics::SampleValue;
    use crate::run::exporter::{Exporter, ExporterContext};

    fn xen_guest_second() -> ProbeSnapshot {
        let irq = |cpu: u32, irq: u32, name: &str, count: u64, time_ns: u64| HardIrq {
            cpu,
            irq,
            name: name.into(),
            count,
            time_ns,
            duration: KernelHist::default(),
        };
        let soft = |cpu: u32, kind: &str, count: u64, time_ns: u64| CpuEvents {
            cpu,
            kind: kind.into(),
            count,
            time_ns,
        };
        ProbeSnapshot {
            elapsed_ns: 1_000_000_000,
            irq: Some(IrqSnapshot {
                hardirqs: vec![
                    irq(0, 40, "timer0", 1000, 5_000_000),
                    irq(0, 41, "resched0", 200, 1_000_000),
                    irq(0, 60, "blkif", 4000, 8_000_000),
                    irq(1, 44, "timer1", 900, 4_000_000),
                    irq(1, 45, "callfunc1", 50, 300_000),
                    irq(1, 61, "eth0", 300, 2_000_000),
                ],
                softirqs: vec![
                    soft(0, "block", 4000, 6_000_000),
                    soft(1, "net_rx", 300, 1_500_000),
                ],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn each_cpus_interrupt_time_is_the_same_in_the_profile_the_live_view_and_the_exporter() {
        let snap = xen_guest_second();
        // The profile's reading.
        let profile: Vec<(u32, u64, u64)> = crate::run::assemble::cpu_loads(&snap)
            .iter()
            .map(|c| (c.cpu, c.hardirq_ns, c.softirq_ns))
            .collect();
        assert_eq!(
            profile,
            [(0, 8_000_000, 6_000_000), (1, 2_000_000, 1_500_000)]
        );
        // The live view's: percent of the interval's second.
        let mut app = super::tests::app();
        app.on_probe_snapshot(snap.clone(), snap.clone());
        let live: Vec<(u32, u64, u64)> = app
            .irq_load()
            .iter()
            .map(|&(cpu, hard, soft)| {
                (
                    cpu,
                    (hard * 1e7).round() as u64,
                    (soft * 1e7).round() as u64,
                )
            })
            .collect();
        assert_eq!(live, profile);
        // The exporter's: seconds per CPU, over every IRQ series of the CPU.
        let mut exporter = Exporter::new(ExporterContext {
            series: Default::default(),
            host: app.host.clone(),
            label: String::new(),
            attached: "every process".into(),
            report: CapabilityReport::default(),
            disks: Vec::new(),
        });
        let families = exporter.families(&snap);
        let per_cpu = |name: &str| -> Vec<(u32, u64)> {
            let mut by = std::collections::BTreeMap::new();
            for s in &families.iter().find(|f| f.name == name).unwrap().samples {
                let cpu: u32 = s
                    .labels
                    .iter()
                    .find(|(k, _)| k == "cpu")
                    .unwrap()
                    .1
                    .parse()
                    .unwrap();
                let SampleValue::Number(x) = s.value else {
                    panic!("{name}: not seconds")
                };
                *by.entry(cpu).or_insert(0.0) += x;
            }
            by.into_iter()
                .map(|(cpu, x): (u32, f64)| (cpu, (x * 1e9).round() as u64))
                .collect()
        };
        let exported: Vec<(u32, u64, u64)> = per_cpu("virtgap_hardirq")
            .into_iter()
            .zip(per_cpu("virtgap_softirq"))
            .map(|((cpu, hard), (_, soft))| (cpu, hard, soft))
            .collect();
        assert_eq!(exported, profile);
    }
}
