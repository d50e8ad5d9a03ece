//! Open-loop pacing. I/O number `i` is due at `start + i / rate`, fixed in advance, so a slow
//! device delays completions but never the schedule: latency measured from the scheduled time
//! (`lat_intended`) then includes the queueing a closed-loop generator would hide.

/// An absolute issue timeline for one worker, in nanoseconds since the run's start.
#[derive(Clone, Debug)]
pub struct RateSchedule {
    interval_ns: f64,
    issued: u64,
}

impl RateSchedule {
    /// A timeline of `ios_per_s` evenly spaced I/Os.
    pub fn new(ios_per_s: f64) -> Self {
        assert!(ios_per_s > 0.0, "rate must be positive");
        Self {
            interval_ns: 1e9 / ios_per_s,
            issued: 0,
        }
    }

    /// When the next I/O is due.
    pub fn next_due_ns(&self) -> u64 {
        (self.issued as f64 * self.interval_ns) as u64
    }

    /// If the next I/O is due at or before `now_ns`, takes it and returns its scheduled time.
    pub fn take_due(&mut self, now_ns: u64) -> Option<u64> {
        let due = self.next_due_ns();
        (due <= now_ns).then(|| {
            self.issued += 1;
            due
        })
    }

    /// How far behind schedule the generator is at `now_ns`: the age of the oldest due,
    /// not yet issued I/O, or zero when it is on time.
    pub fn lag_ns(&self, now_ns: u64) -> u64 {
        now_ns.saturating_sub(self.next_due_ns())
    }

    pub fn issued(&self) -> u64 {
        self.issued
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spaces_ios_evenly() {
        let mut s = RateSchedule::new(1000.0); // one per millisecond
        assert_eq!(s.take_due(0), Some(0));
        assert_eq!(s.take_due(0), None);
        assert_eq!(s.take_due(999_999), None);
        assert_eq!(s.take_due(1_000_000), Some(1_000_000));
        assert_eq!(s.next_due_ns(), 2_000_000);
    }

    #[test]
    fn a_stall_does_not_move_the_schedule() {
        // The generator wakes 10 ms late: ten I/Os are due at once, each keeping its own slot.
        let mut s = RateSchedule::new(1000.0);
        let now = 9_500_000;
        let due: Vec<u64> = std::iter::from_fn(|| s.take_due(now)).collect();
        assert_eq!(due.len(), 10);
        assert_eq!(due[0], 0);
        assert_eq!(due[9], 9_000_000);
        assert_eq!(s.lag_ns(now), 0);
    }

    #[test]
    fn lag_is_the_age_of_the_oldest_due_io() {
        let mut s = RateSchedule::new(100.0); // every 10 ms
        assert_eq!(s.take_due(0), Some(0));
        assert_eq!(s.lag_ns(35_000_000), 25_000_000);
    }

    #[test]
    fn long_runs_keep_the_rate_exact() {
        let mut s = RateSchedule::new(3.0);
        let mut n = 0;
        while s.take_due(60_000_000_000).is_some() {
            n += 1;
        }
        // 0 s, 1/3 s, ..., 60 s inclusive.
        assert_eq!(n, 181);
    }
}
