//! Stalls and pauses in words, as the summary and the diff say them.

use virtgap_workloads::units;

use crate::model::stalls::Stalls;

impl Stalls {
    /// The finding in one line ("no I/O completed for 6 s (3.0–9.0 s) with I/Os in flight; …").
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.stalled_intervals > 0 {
            let secs: f64 = self.spans.iter().map(|s| s.end_s - s.start_s).sum();
            let at: Vec<String> = self
                .spans
                .iter()
                .take(3)
                .map(|s| format!("{:.1}–{:.1} s", s.start_s, s.end_s))
                .collect();
            let oldest = self.spans.iter().map(|s| s.oldest_in_flight_ns).max();
            parts.push(format!(
                "no I/O completed in {} interval{} ({:.1} s: {}{}) while I/Os were in flight{}",
                self.stalled_intervals,
                if self.stalled_intervals == 1 { "" } else { "s" },
                secs,
                at.join(", "),
                if self.spans.len() > 3 { ", …" } else { "" },
                oldest.map_or(String::new(), |o| format!(
                    " (oldest {})",
                    units::latency(o as f64)
                ))
            ));
        }
        if self.slow_ios > 0 {
            parts.push(format!(
                "{} I/O{} took over {} (slowest {})",
                self.slow_ios,
                if self.slow_ios == 1 { "" } else { "s" },
                units::latency(self.slow_io_ns as f64),
                units::latency(self.max_lat_ns.unwrap_or(0) as f64)
            ));
        }
        if let (Some(e), Some(t)) = (self.errors, self.timeouts) {
            if e > 0 {
                parts.push(format!(
                    "kernel: {e} request{} completed with an error ({t} timed out)",
                    if e == 1 { "" } else { "s" }
                ));
            }
        }
        parts.join("; ")
    }

    /// The process's own pauses in one line ("virtgap itself did not run for 3.0 s (2.1–5.1 s):
    /// …"), None when there were none.
    pub fn describe_pauses(&self) -> Option<String> {
        if self.process_paused.is_empty() {
            return None;
        }
        let secs: f64 = self
            .process_paused
            .iter()
            .map(|p| p.end_s - p.start_s)
            .sum();
        let at: Vec<String> = self
            .process_paused
            .iter()
            .take(3)
            .map(|p| format!("{:.1}–{:.1} s", p.start_s, p.end_s))
            .collect();
        Some(format!(
            "virtgap itself did not run for {secs:.1} s ({}{}): the process was stopped (SIGSTOP, a debugger) or not scheduled; I/Os in flight then are not counted as a device stall",
            at.join(", "),
            if self.process_paused.len() > 3 { ", …" } else { "" }
        ))
    }
}
