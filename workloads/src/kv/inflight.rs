//! How many client reads a ring keeps in flight, and how much of their time they spent queued.
//!
//! The schedule decides when reads are due, not how many are in flight: that is the arrival
//! rate times the time each takes. A device serves only so many at once; past that, a read
//! waits behind the others, and past the device's request slots the kernel hands reads to
//! worker threads, which slows every read (on a loop device over memory, 128 in flight took
//! five times as long per read as 32 at the same rate). So a ring bounds its reads in flight
//! by what the device completes in time, as TCP Vegas and BBR bound a sender's window:
//!
//! - A read that went out alone (none of the ring's others in flight) took the device's own
//!   time; the fastest such read of the last two seconds is the device's time, and a read's
//!   time beyond it was spent queued (reads when no read went alone in two seconds are not
//!   counted). An adaptive ring with no read alone for a second holds new reads until the ones
//!   out are done and sends one alone (BBR's ProbeRTT): a pause of one drain a second, so the
//!   figure it steers by is never older than that; a fixed-depth ring never pauses.
//! - When reads take long on average and most of it is queueing, fewer go out at once (a read
//!   then waits in the generator, where the client's definition still counts it); when reads
//!   wait for room while the device keeps them short, more go out. A device that is simply
//!   slow (every read long, little of it queueing: a cloud volume's milliseconds) keeps its
//!   depth. A lower limit is a trial, kept only if the reads got faster and as many were done:
//!   the fastest read sent alone is only an estimate of the device's own time (a disk behind a
//!   host's cache has fast hits and slower misses), and reads that waited for a CPU (another
//!   process running where the ring or the device's worker would) rather than for each other
//!   get no faster with fewer in flight; fewer would only put the ring behind.
//!
//! The queued share is measured on every ring run; the limit adapts only when asked
//! (`--adaptive-qd`, `[kv] adaptive_qd = true`), with `--qd` its ceiling. It is not the default:
//! a kv verdict needs both definitions to pass, and a lower depth mostly moves the wait from the
//! device into the ring (README, "kv", has the figures).

use std::collections::VecDeque;

/// Reads taking longer than this on average, mostly queued, lower the limit: a quarter of
/// ACT's first threshold (1 ms), so the tail has room under it.
pub const QUEUE_TARGET_NS: u64 = 250_000;

/// The share of read time spent queued above which a long average is the queue's doing.
const MOSTLY_QUEUED: f64 = 0.5;

/// A window closes at its first completion this long after it opened...
const WINDOW_NS: u64 = 10_000_000;
/// ...and once it holds this many reads (fewer say little of a device).
const WINDOW_READS: u64 = 16;

/// A lower limit stays only if the reads' mean time fell below this share of what it was...
const TRIAL_FASTER: f64 = 0.9;
/// ...and the reads per second held to this share...
const TRIAL_KEEPS: f64 = 0.95;
/// ...else no other is tried for this many windows.
const TRIAL_COOLDOWN_WINDOWS: u32 = 50;

/// The device's own time is the fastest read that went out alone over this long...
const ALONE_HORIZON_NS: u64 = 2_000_000_000;
/// ...and one is sent alone when none has for this long.
const PROBE_EVERY_NS: u64 = 1_000_000_000;

/// A ring's limit on its reads in flight.
#[derive(Debug)]
pub struct InFlightLimit {
    limit: u32,
    /// (when, how long) of reads that went out alone, fastest last: a monotonic queue of the
    /// horizon's minimum.
    alone: VecDeque<(u64, u64)>,
    last_alone_ns: u64,
    /// Holding new reads until the ring is empty, to send one alone.
    probing: bool,
    /// A lower limit on trial (see `Trial`).
    trial: Option<Trial>,
    /// Windows to go before another trial, after one that was undone.
    trial_cooldown: u32,
    /// When the last window closed: windows tile the time, so reads per window are a rate.
    last_close_ns: Option<u64>,
    window: Window,
    tally: QueueTally,
}

/// A lower limit being tried: the limit, reads per second and mean read time before it, and
/// the windows until it is judged (the one after it took effect: the reads out when it began
/// drain first). Kept only if the reads got faster (they were waiting for each other) and the
/// reads per second held (the ring was not held back by it).
#[derive(Debug, Clone, Copy)]
struct Trial {
    limit: u32,
    per_s: f64,
    mean_ns: u64,
    windows_left: u32,
}

/// The reads completed since the window opened.
#[derive(Debug, Default)]
struct Window {
    opened_ns: u64,
    reads: u64,
    service_ns: u64,
    /// Of the reads whose queueing is known (the device's time was): their time, the part
    /// queued.
    known_ns: u64,
    queued_ns: u64,
    /// Due reads found no room under the limit.
    waited: bool,
}

/// A run's reads as the limit saw them: their time, the part spent queued, and the limit
/// over time.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct QueueTally {
    pub reads: u64,
    pub service_ns: u128,
    /// Of the reads whose queueing is known: their time, and the part beyond the device's own
    /// time (the fastest read that went out alone, then).
    pub known_ns: u128,
    pub queued_ns: u128,
    /// Σ limit × window length, and Σ window length: the time-weighted mean limit.
    pub limit_ns: u128,
    pub windows_ns: u128,
    pub limit_min: u32,
    pub limit_max: u32,
    /// The most reads a ring may keep in flight (`--qd`).
    pub ceiling: u32,
    pub adaptive: bool,
}

impl QueueTally {
    /// The share of the reads' time spent queued (None where no read's was known).
    pub fn queued_share(&self) -> Option<f64> {
        (self.known_ns > 0).then(|| self.queued_ns as f64 / self.known_ns as f64)
    }

    /// The limit's mean over the time measured (None before a window closed).
    pub fn mean_limit(&self) -> Option<f64> {
        (self.windows_ns > 0).then(|| self.limit_ns as f64 / self.windows_ns as f64)
    }

    /// Adds another ring's tally.
    pub fn merge(&mut self, other: &QueueTally) {
        self.reads += other.reads;
        self.service_ns += other.service_ns;
        self.known_ns += other.known_ns;
        self.queued_ns += other.queued_ns;
        self.limit_ns += other.limit_ns;
        self.windows_ns += other.windows_ns;
        self.limit_min = self.limit_min.min(other.limit_min);
        self.limit_max = self.limit_max.max(other.limit_max);
        self.ceiling = self.ceiling.max(other.ceiling);
        self.adaptive |= other.adaptive;
    }
}

impl InFlightLimit {
    /// A limit of at most `ceiling` reads, adapting when `adaptive` (else fixed at `ceiling`).
    /// It starts at the ceiling: a device that needs the depth has it from the first read.
    pub fn new(ceiling: u32, adaptive: bool) -> Self {
        let ceiling = ceiling.max(1);
        Self {
            limit: ceiling,
            alone: VecDeque::new(),
            last_alone_ns: 0,
            probing: false,
            trial: None,
            trial_cooldown: 0,
            last_close_ns: None,
            window: Window::default(),
            tally: QueueTally {
                limit_min: ceiling,
                limit_max: ceiling,
                ceiling,
                adaptive,
                ..QueueTally::default()
            },
        }
    }

    /// Whether one more read may go out with `in_flight` already out.
    pub fn allows(&self, in_flight: usize) -> bool {
        if self.probing {
            return in_flight == 0;
        }
        in_flight < self.limit as usize
    }

    /// A due read found no room: it waits in the generator.
    pub fn waited(&mut self) {
        self.window.waited = true;
    }

    /// The current limit.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// The device's own time for a read, as of `now_ns` (None before a read went out alone).
    fn device_ns(&mut self, now_ns: u64) -> Option<u64> {
        while self
            .alone
            .front()
            .is_some_and(|&(at, _)| at + ALONE_HORIZON_NS < now_ns)
        {
            self.alone.pop_front();
        }
        self.alone.front().map(|&(_, ns)| ns)
    }

    /// A read completed at `now_ns` after `service_ns` with the device; `alone`: none of the
    /// ring's other reads was in flight when it went out.
    pub fn completed(&mut self, service_ns: u64, alone: bool, now_ns: u64) {
        if alone {
            // Keep the horizon's minimum at the front: slower, older samples go.
            while self.alone.back().is_some_and(|&(_, ns)| ns >= service_ns) {
                self.alone.pop_back();
            }
            self.alone.push_back((now_ns, service_ns));
            self.last_alone_ns = now_ns;
            self.probing = false;
        }
        let device = self.device_ns(now_ns);
        let w = &mut self.window;
        if w.reads == 0 {
            w.opened_ns = self
                .last_close_ns
                .unwrap_or(now_ns.saturating_sub(service_ns));
        }
        w.reads += 1;
        w.service_ns += service_ns;
        if let Some(device) = device {
            w.known_ns += service_ns;
            w.queued_ns += service_ns.saturating_sub(device);
        }
        if w.reads >= WINDOW_READS && now_ns >= w.opened_ns + WINDOW_NS {
            self.close_window(now_ns);
        }
    }

    /// What the limit saw, its last window closed.
    pub fn finish(&mut self, now_ns: u64) -> QueueTally {
        if self.window.reads > 0 {
            self.close_window(now_ns);
        }
        self.tally
    }

    fn close_window(&mut self, now_ns: u64) {
        let w = std::mem::take(&mut self.window);
        self.last_close_ns = Some(now_ns);
        let t = &mut self.tally;
        let length = u128::from(now_ns.saturating_sub(w.opened_ns));
        t.reads += w.reads;
        t.service_ns += u128::from(w.service_ns);
        t.known_ns += u128::from(w.known_ns);
        t.queued_ns += u128::from(w.queued_ns);
        t.limit_ns += u128::from(self.limit) * length;
        t.windows_ns += length;
        if !t.adaptive {
            return;
        }
        if now_ns.saturating_sub(self.last_alone_ns) >= PROBE_EVERY_NS {
            self.probing = true;
        }
        let mean = w.service_ns / w.reads.max(1);
        let mostly_queued =
            w.known_ns > 0 && w.queued_ns as f64 > MOSTLY_QUEUED * w.known_ns as f64;
        let per_s = w.reads as f64 * 1e9 / length.max(1) as f64;
        // Multiplicative decrease: a queue drains in a few windows.
        let lower = (self.limit - self.limit / 4)
            .saturating_sub(u32::from(self.limit < 4))
            .max(1);
        self.trial_cooldown = self.trial_cooldown.saturating_sub(1);
        match self.trial.take() {
            Some(trial) if trial.windows_left > 1 => {
                self.trial = Some(Trial {
                    windows_left: trial.windows_left - 1,
                    ..trial
                });
                return;
            }
            // Reads no faster, or fewer of them: they were not waiting for each other (a busy
            // CPU, a device slow at any depth, a cache behind it). Back, for a while.
            Some(trial)
                if mean as f64 >= TRIAL_FASTER * trial.mean_ns as f64
                    || per_s < TRIAL_KEEPS * trial.per_s =>
            {
                self.limit = trial.limit;
                self.trial_cooldown = TRIAL_COOLDOWN_WINDOWS;
                t.limit_min = t.limit_min.min(self.limit);
                return;
            }
            _ => {}
        }
        let long_and_queued = mean > QUEUE_TARGET_NS && mostly_queued;
        self.limit = if long_and_queued {
            // Fewer in flight, on trial.
            if self.trial_cooldown == 0 && lower < self.limit {
                self.trial = Some(Trial {
                    limit: self.limit,
                    per_s,
                    mean_ns: mean,
                    windows_left: 2,
                });
                lower
            } else {
                self.limit
            }
        } else if w.waited {
            // Additive increase, by an eighth: back to a deep device's depth in a few dozen
            // windows, without overshooting a shallow one by much.
            (self.limit + (self.limit / 8).max(1)).min(t.ceiling)
        } else {
            self.limit
        };
        t.limit_min = t.limit_min.min(self.limit);
        t.limit_max = t.limit_max.max(self.limit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device that serves one read at a time — `fast_ns` each while at most `slots` are in
    /// flight, `slow_ns` each beyond (as reads past a device's request slots are handed to the
    /// kernel's worker threads) — fed `rate_per_s` reads a second, each issued when due as far
    /// as `limit` allows. The device stops for 5 ms at 100 ms (a stall, as when the CPUs were
    /// busy elsewhere). Returns the reads' service times (submission to completion), the worst
    /// lag of a read's submission behind its schedule, and the limit's tally at the end.
    fn simulate(
        mut limit: InFlightLimit,
        rate_per_s: u64,
        seconds: u64,
        (slots, fast_ns, slow_ns): (usize, u64, u64),
    ) -> (Vec<u64>, u64, QueueTally) {
        const STALL: (u64, u64) = (100_000_000, 105_000_000);
        let gap = 1_000_000_000 / rate_per_s;
        let total = rate_per_s * seconds;
        // (submitted, went out alone), in service order.
        let mut queue: VecDeque<(u64, bool)> = VecDeque::new();
        let mut device_free_at = 0u64;
        let (mut issued, mut now, mut worst_lag) = (0u64, 0u64, 0u64);
        let mut service = Vec::new();
        while issued < total || !queue.is_empty() {
            while issued < total && issued * gap <= now && limit.allows(queue.len()) {
                worst_lag = worst_lag.max(now - issued * gap);
                queue.push_back((now, queue.is_empty()));
                issued += 1;
            }
            if issued < total && issued * gap <= now {
                limit.waited();
            }
            let next_due = if issued < total {
                issued * gap
            } else {
                u64::MAX
            };
            let head_done = queue.front().map(|&(submitted, _)| {
                let mut start = device_free_at.max(submitted);
                if (STALL.0..STALL.1).contains(&start) {
                    start = STALL.1;
                }
                start
                    + if queue.len() > slots {
                        slow_ns
                    } else {
                        fast_ns
                    }
            });
            match head_done {
                Some(done) if done <= next_due || !limit.allows(queue.len()) => {
                    now = now.max(done);
                    device_free_at = now;
                    let (submitted, alone) = queue.pop_front().unwrap();
                    service.push(now - submitted);
                    limit.completed(now - submitted, alone, now);
                }
                _ => now = now.max(next_due),
            }
        }
        (service, worst_lag, limit.finish(now))
    }

    fn share_over(service: &[u64], ns: u64) -> f64 {
        service.iter().filter(|&&s| s >= ns).count() as f64 / service.len() as f64
    }

    #[test]
    fn reads_slow_only_for_being_too_many_are_seen_queued_and_the_limit_brings_them_under_1ms() {
        // 20 µs a read up to 16 in flight, 60 µs past that; 40k reads/s wants ~1 in flight.
        // A stall that queues more than 16 slows the device below the rate, and the queue
        // never drains: it stays at whatever the ring allows.
        let device = (16, 20_000, 60_000);
        let (service, _, fixed) = simulate(InFlightLimit::new(64, false), 40_000, 2, device);
        let slow = share_over(&service, 1_000_000);
        assert!(
            slow > 0.5,
            "with 64 in flight most reads take over 1 ms: {slow:.2}"
        );
        let queued = fixed.queued_share().unwrap();
        assert!(queued > 0.9, "and the time is queueing: {queued:.3}");
        assert_eq!((fixed.limit_min, fixed.limit_max), (64, 64));

        let (service, worst_lag, adaptive) =
            simulate(InFlightLimit::new(64, true), 40_000, 2, device);
        assert!(
            adaptive.limit_min <= 16,
            "the limit came down to the device's slots: {adaptive:?}"
        );
        // Once the stall is over and drained, reads stay well under 1 ms.
        let settled = &service[service.len() / 4..];
        assert_eq!(
            share_over(settled, 1_000_000),
            0.0,
            "settled reads under 1 ms"
        );
        // What queueing there was is the stall's (fixed: the whole run's).
        assert!(adaptive.queued_share() < Some(queued), "{adaptive:?}");
        assert!(
            worst_lag < 100_000_000,
            "the schedule was kept: worst lag {worst_lag} ns"
        );
        assert!(adaptive.mean_limit().unwrap() < 32.0, "{adaptive:?}");
    }

    #[test]
    fn reads_waiting_for_a_cpu_do_not_lose_their_depth() {
        // Behind its schedule (reads wait for room), every read long and mostly "queued" (its
        // completion waits for a busy CPU), and the reads per second are the limit's: each of
        // the 64 in flight completes 5 times a window whatever else happens. A lower limit
        // only costs throughput, so it is tried, undone, and not tried again for a while.
        let mut limit = InFlightLimit::new(64, true);
        let mut now = 0u64;
        for i in 0..300_000u64 {
            now += WINDOW_NS / (u64::from(limit.limit()) * 5);
            limit.waited();
            let alone = i % 50_000 == 0;
            limit.completed(if alone { 10_000 } else { 2_000_000 }, alone, now);
        }
        assert_eq!(limit.limit(), 64);
        let tally = limit.finish(now);
        assert!(tally.limit_min >= 48, "one step down at a time: {tally:?}");
        assert!(tally.mean_limit().unwrap() > 60.0, "{tally:?}");
    }

    #[test]
    fn reads_no_faster_with_fewer_in_flight_keep_their_depth() {
        // A disk behind a host's cache: hits in 30 µs, misses in 300-400 µs, whatever the
        // depth. Against the fastest read sent alone most of the time looks queued, but a
        // lower limit makes no read faster: each trial is undone.
        let mut limit = InFlightLimit::new(64, true);
        let mut now = 0u64;
        for i in 0..200_000u64 {
            now += 25_000;
            let alone = i % 7 == 0;
            let service = if i % 5 == 0 {
                30_000
            } else {
                300_000 + i % 11 * 10_000
            };
            limit.completed(service, alone, now);
        }
        assert_eq!(limit.limit(), 64);
        let tally = limit.finish(now);
        assert!(
            tally.queued_share().unwrap() > 0.5,
            "it looked queued: {tally:?}"
        );
        assert!(tally.limit_min >= 48, "one trial step at a time: {tally:?}");
        assert!(tally.mean_limit().unwrap() > 60.0, "{tally:?}");
    }

    #[test]
    fn a_slow_device_keeps_its_depth() {
        // 2 ms a read however many are in flight (a cloud volume): long reads, none of it
        // queueing, so the limit stays at the ceiling.
        let mut limit = InFlightLimit::new(64, true);
        let mut now = 0;
        for i in 0..4_000 {
            now += 250_000;
            limit.waited();
            limit.completed(2_000_000 + i % 7 * 10_000, i % 50 == 0, now);
        }
        let tally = limit.finish(now);
        assert_eq!(tally.limit_min, 64);
        assert!(tally.queued_share().unwrap() < 0.05, "{tally:?}");
    }

    #[test]
    fn a_limit_waited_on_while_reads_are_short_grows_back_to_the_ceiling() {
        let mut limit = InFlightLimit::new(64, true);
        let mut now = 0;
        // Reads that wait behind the others in flight, 30 µs each (one alone takes 10 µs):
        // fewer in flight, faster reads, so down.
        for i in 0..2_000u64 {
            now += 100_000;
            let alone = i % 10 == 0;
            let service = if alone {
                10_000
            } else {
                u64::from(limit.limit()) * 30_000
            };
            limit.completed(service, alone, now);
        }
        let low = limit.limit();
        assert!(low < 16, "came down: {low}");
        // Short reads that wait for room: back up, and no further than the ceiling.
        for i in 0..20_000 {
            now += 100_000;
            limit.waited();
            limit.completed(10_000, i % 10 == 0, now);
        }
        assert_eq!(limit.limit(), 64);
        let tally = limit.finish(now);
        assert!(tally.limit_min <= low && tally.limit_max == 64, "{tally:?}");
        assert!(tally.mean_limit().unwrap() > f64::from(low));
    }

    #[test]
    fn a_ring_with_no_read_alone_for_a_second_sends_one_alone() {
        let mut limit = InFlightLimit::new(8, true);
        let mut now = 0;
        assert!(limit.allows(7));
        while now < PROBE_EVERY_NS + WINDOW_NS {
            now += 1_000_000;
            limit.completed(50_000, false, now);
        }
        assert!(
            !limit.allows(1) && limit.allows(0),
            "holds reads until one goes alone"
        );
        now += 1_000_000;
        limit.completed(40_000, true, now);
        assert!(limit.allows(7), "and lets them go after it");
        // Without a read alone before, nothing was known of the queueing.
        assert_eq!(limit.finish(now).known_ns, 40_000);
    }

    #[test]
    fn tallies_of_rings_add_up() {
        let mut a = InFlightLimit::new(8, true);
        a.completed(1_000, true, 20_000_000);
        let mut b = InFlightLimit::new(8, true);
        b.completed(3_000, true, 20_000_000);
        let mut t = a.finish(20_000_000);
        t.merge(&b.finish(20_000_000));
        assert_eq!(t.reads, 2);
        assert_eq!(t.service_ns, 4_000);
        assert_eq!((t.limit_min, t.limit_max, t.ceiling), (8, 8, 8));
        assert_eq!(QueueTally::default().queued_share(), None);
    }
}
