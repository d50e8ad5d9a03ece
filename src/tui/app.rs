//! The TUI's state: what is shown, what is selected, and the data the pipeline delivered. Keys
//! and pipeline events change it; rendering only reads it.

use std::collections::VecDeque;
use std::time::Duration;

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use virtgap_probes::{CapabilityReport, ProbeSnapshot};
use virtgap_workloads::stats::IntervalSample;
use virtgap_workloads::LatencyHistogram;

use crate::host::Fingerprint;
use crate::profile::Profile;
use crate::series::IntervalSeries;

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

/// Everything the TUI shows.
#[derive(Debug)]
pub struct App {
    pub view: View,
    pub help: bool,
    pub paused: Option<Data>,
    pub selected_cpu: usize,
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
    /// The raw cumulative probe totals, as reported.
    pub probe_total: Option<ProbeSnapshot>,
    /// Kernel names of the block devices the probes saw, resolved outside the render path.
    pub device_names: std::collections::BTreeMap<(u32, u32), String>,
    disks: crate::host::TargetDisks,
    /// The disks whose stages are the target's (None: unknown, every device counts).
    target_devs: Option<Vec<(u32, u32)>>,
    /// Intervals joined with probe data since start or the last reset, kept for saving a
    /// profile; bounded however long the TUI runs.
    pub series: IntervalSeries,
}

impl App {
    pub fn new(host: Fingerprint, workload: String, disks: crate::host::TargetDisks) -> Self {
        Self {
            view: View::Time,
            help: false,
            paused: None,
            selected_cpu: 0,
            selected_device: 0,
            host,
            workload,
            report: None,
            state: RunState::Running,
            baseline: None,
            message: None,
            live: Data::default(),
            reset_base: None,
            probe_total: None,
            device_names: Default::default(),
            target_devs: disks.devs(),
            series: IntervalSeries::new(
                Duration::from_secs(1),
                Duration::ZERO,
                disks.devs(),
                false,
            ),
            disks,
        }
    }

    /// The data to draw: the frozen copy while paused.
    pub fn shown(&self) -> &Data {
        self.paused.as_ref().unwrap_or(&self.live)
    }

    /// The disks whose stages are the target's, for filtering snapshots.
    pub fn target_devs(&self) -> Option<&[(u32, u32)]> {
        self.target_devs.as_deref()
    }

    pub fn disks(&self) -> &crate::host::TargetDisks {
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
            _ => (&mut self.selected_cpu, self.host.cpus.max(1) as usize),
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
        self.message = Some("counters reset".into());
    }

    pub fn on_probe_report(&mut self, report: CapabilityReport) {
        self.report = Some(report);
    }

    pub fn on_probe_snapshot(&mut self, cumulative: ProbeSnapshot, interval: ProbeSnapshot) {
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
            crate::host::TargetDisks::plain("vda", 254, 0),
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

    #[test]
    fn arrows_select_cpus_and_wrap() {
        let mut a = app();
        a.handle_key(key(KeyCode::Char('2')));
        a.handle_key(key(KeyCode::Down));
        assert_eq!(a.selected_cpu, 1);
        a.handle_key(key(KeyCode::Down));
        assert_eq!(a.selected_cpu, 0, "wraps over 2 CPUs");
        a.handle_key(key(KeyCode::Up));
        assert_eq!(a.selected_cpu, 1);
    }
}
