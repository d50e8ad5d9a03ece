//! iotune's concurrency search: each worker's queue depth doubles from 1 until two steps in a
//! row fail to raise the best figure by the tolerance (or the depth reaches its cap); then twice
//! the workers are tried at the peak's total depth and at twice it (a device can want more
//! submitters than CPUs: fio's best on this machine's virtio disk is 4 jobs on 2 CPUs), and once
//! at the most in flight allowed, since a device's curve need not rise and then stay flat (this
//! machine's virtio disk read 1 MiB blocks 20% slower at 2 x 16 in flight than at 2 x 4, and
//! fastest of all at 4 x 128). Last, half the workers at the peak's total depth: a device can
//! also want fewer, deeper submitters (fio's best 4 KiB reads on that disk were 1 job x 128).
//! The step with the highest figure is the saturation point. A pure state machine: the caller
//! runs each step and records its figure.

use virtgap_workloads::spec::MAX_QD;

use crate::model::iotune::SearchStep;

/// Steps in a row without growth that end the depth search: one can be noise.
const FLAT_STEPS_TO_STOP: u32 = 2;
/// The most workers a search widens to.
const MAX_WORKERS: u32 = 1024;

#[derive(Clone, Debug)]
pub struct Saturation {
    workers: u32,
    tolerance: f64,
    max_qd: u32,
    steps: Vec<SearchStep>,
    flat: u32,
}

impl Saturation {
    /// A search at `workers` workers, depths 1 to `max_qd` per worker; a step grows the figure
    /// when it beats the best so far by more than `tolerance` (a fraction).
    pub fn new(workers: u32, tolerance: f64, max_qd: u32) -> Self {
        Self {
            workers: workers.max(1),
            tolerance,
            max_qd: max_qd.max(1),
            steps: Vec::new(),
            flat: 0,
        }
    }

    /// The concurrency to try next, (workers, depth per worker) (None: the search is over).
    pub fn next(&self) -> Option<(u32, u32)> {
        let depth_steps = self.steps.iter().filter(|s| s.workers == self.workers);
        let last = depth_steps.clone().next_back();
        let depth_done = match last {
            None => return Some((self.workers, 1)),
            Some(last) => self.flat >= FLAT_STEPS_TO_STOP || last.qd >= self.max_qd,
        };
        if !depth_done {
            let qd = last.map_or(1, |l| (l.qd * 2).min(self.max_qd));
            return Some((self.workers, qd));
        }
        // Twice the workers at the depth search's peak: its total in flight, and twice that.
        let peak = depth_steps.reduce(|best, s| if s.figure > best.figure { s } else { best })?;
        let wide = (self.workers * 2).min(MAX_WORKERS);
        if wide == self.workers {
            return None;
        }
        let total_cap = self.workers * self.max_qd;
        let far_end = (wide, (total_cap / wide).max(1));
        let narrow = (self.workers / 2).max(1);
        let narrow_qd = peak.qd * self.workers / narrow;
        let fewer = (narrow < self.workers && narrow_qd <= MAX_QD).then_some((narrow, narrow_qd));
        [(peak.qd / 2).max(1), peak.qd]
            .into_iter()
            .filter(|&qd| wide * qd <= total_cap.max(wide))
            .map(|qd| (wide, qd))
            .chain(std::iter::once(far_end))
            .chain(fewer)
            .find(|c| !self.steps.iter().any(|s| (s.workers, s.qd) == *c))
    }

    /// The figure a step reached at `workers` x `qd`.
    pub fn record(&mut self, workers: u32, qd: u32, figure: f64) {
        let best = self.peak().map_or(0.0, |s| s.figure);
        if figure > best * (1.0 + self.tolerance) {
            self.flat = 0;
        } else {
            self.flat += 1;
        }
        self.steps.push(SearchStep {
            workers,
            qd,
            figure,
        });
    }

    /// The step with the highest figure so far (of equals, the first: the least concurrency).
    pub fn peak(&self) -> Option<&SearchStep> {
        self.steps
            .iter()
            .reduce(|best, s| if s.figure > best.figure { s } else { best })
    }

    pub fn steps(&self) -> &[SearchStep] {
        &self.steps
    }

    pub fn into_steps(self) -> Vec<SearchStep> {
        self.steps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the search over a device whose figure is `curve(workers, qd)`.
    fn search(curve: impl Fn(u32, u32) -> f64, max_qd: u32) -> Saturation {
        let mut s = Saturation::new(2, 0.03, max_qd);
        while let Some((workers, qd)) = s.next() {
            s.record(workers, qd, curve(workers, qd));
        }
        s
    }

    fn steps(s: &Saturation) -> Vec<(u32, u32)> {
        s.steps().iter().map(|x| (x.workers, x.qd)).collect()
    }

    #[test]
    fn the_search_stops_two_flat_steps_after_the_knee_then_tries_twice_the_workers_the_far_end_and_half(
    ) {
        // Grows to 64k IOPS at 32 in flight, then flat within 1%.
        let s = search(
            |w, qd| 2_000.0 * f64::from((w * qd).min(32)) + f64::from(qd % 3),
            256,
        );
        assert_eq!(
            steps(&s),
            [
                (2, 1),
                (2, 2),
                (2, 4),
                (2, 8),
                (2, 16),
                (2, 32),
                (2, 64),
                (4, 16),
                (4, 32),
                (4, 128),
                (1, 64)
            ]
        );
        // 64,001 / 64,002 / 64,001 at depths 16, 32, 64: the highest, noise and all.
        assert_eq!((s.peak().unwrap().workers, s.peak().unwrap().qd), (2, 32));
        assert!(s.next().is_none());
    }

    #[test]
    fn more_workers_win_where_the_device_wants_more_submitters() {
        // Each worker tops out at 10k; the device at 60k.
        let s = search(
            |w, qd| {
                (f64::from(w) * 10_000.0)
                    .min(f64::from(w * qd) * 2_000.0)
                    .min(60_000.0)
            },
            256,
        );
        let peak = s.peak().unwrap();
        assert_eq!(peak.workers, 4, "{:?}", steps(&s));
        assert_eq!(peak.figure, 40_000.0);
    }

    /// A device that dips after a first knee and peaks only far beyond it, as this machine's
    /// virtio disk does for 1 MiB reads: the far end is tried and wins.
    #[test]
    fn the_far_end_is_tried_where_the_curve_dips_after_its_first_knee() {
        let s = search(
            |w, qd| match w * qd {
                n if n <= 8 => 1_000.0 + f64::from(n),
                n if n < 256 => 900.0,
                _ => 1_050.0,
            },
            128,
        );
        let peak = s.peak().unwrap();
        assert_eq!((peak.workers, peak.qd), (4, 64), "{:?}", steps(&s));
        assert!(s.next().is_none());
    }

    /// A device that serves one deep submitter best, as this machine's virtio disk did for
    /// 4 KiB reads under fio: half the workers at the peak's total depth wins.
    #[test]
    fn fewer_deeper_workers_win_where_the_device_wants_one_submitter() {
        let s = search(
            |w, qd| f64::from((w * qd).min(128)) * 1_000.0 / f64::from(w),
            64,
        );
        let peak = s.peak().unwrap();
        assert_eq!((peak.workers, peak.qd), (1, 128), "{:?}", steps(&s));
        assert!(s.next().is_none());
        // One worker has nothing narrower to try.
        let mut one = Saturation::new(1, 0.03, 4);
        while let Some((w, qd)) = one.next() {
            one.record(w, qd, f64::from(w * qd));
        }
        assert_eq!(steps(&one), [(1, 1), (1, 2), (1, 4), (2, 2)]);
    }

    #[test]
    fn one_noisy_dip_does_not_end_the_depth_search() {
        let figures = [100.0, 200.0, 190.0, 400.0, 800.0, 805.0, 806.0];
        let s = search(
            |w, qd| {
                if w == 2 {
                    figures[qd.trailing_zeros() as usize]
                } else {
                    1.0
                }
            },
            1024,
        );
        assert_eq!(s.peak().unwrap().qd, 64);
        assert_eq!(s.steps().iter().filter(|x| x.workers == 2).count(), 7);
    }

    #[test]
    fn the_cap_ends_a_search_that_keeps_growing_and_bounds_the_wider_steps() {
        let s = search(|w, qd| f64::from(w * qd) * 1000.0, 24);
        assert_eq!(
            steps(&s),
            [
                (2, 1),
                (2, 2),
                (2, 4),
                (2, 8),
                (2, 16),
                (2, 24),
                (4, 12),
                (1, 48)
            ]
        );
        assert_eq!(s.peak().unwrap().figure, 48_000.0);
    }
}
