//! iotune's concurrency search: each worker's queue depth doubles from 1 until two steps in a
//! row fail to raise the best figure by the tolerance (or the depth reaches its cap); the step
//! with the highest figure is the saturation point. A pure state machine: the caller runs each
//! step and records its figure.

use crate::model::iotune::SearchStep;

/// Steps in a row without growth that end the search: one can be noise.
const FLAT_STEPS_TO_STOP: u32 = 2;

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

    /// The queue depth to try next (None: the search is over).
    pub fn next_qd(&self) -> Option<u32> {
        match self.steps.last() {
            None => Some(1),
            Some(_) if self.flat >= FLAT_STEPS_TO_STOP => None,
            Some(last) if last.qd >= self.max_qd => None,
            Some(last) => Some((last.qd * 2).min(self.max_qd)),
        }
    }

    /// The figure a step reached at depth `qd`.
    pub fn record(&mut self, qd: u32, figure: f64) {
        let best = self.peak().map_or(0.0, |s| s.figure);
        if figure > best * (1.0 + self.tolerance) {
            self.flat = 0;
        } else {
            self.flat += 1;
        }
        self.steps.push(SearchStep {
            workers: self.workers,
            qd,
            figure,
        });
    }

    /// The step with the highest figure so far.
    pub fn peak(&self) -> Option<&SearchStep> {
        self.steps
            .iter()
            .max_by(|a, b| a.figure.total_cmp(&b.figure))
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

    /// Runs the search over a device whose figure is `curve(qd)`.
    fn search(curve: impl Fn(u32) -> f64, max_qd: u32) -> Saturation {
        let mut s = Saturation::new(2, 0.03, max_qd);
        while let Some(qd) = s.next_qd() {
            s.record(qd, curve(qd));
        }
        s
    }

    #[test]
    fn the_search_stops_two_flat_steps_after_the_knee_and_keeps_the_peak() {
        // Grows to 64k IOPS at depth 16, then flat within 1%.
        let s = search(
            |qd| 4_000.0 * f64::from(qd.min(16)) + f64::from(qd % 3),
            256,
        );
        let depths: Vec<u32> = s.steps().iter().map(|x| x.qd).collect();
        assert_eq!(depths, [1, 2, 4, 8, 16, 32, 64]);
        // 64,001 / 64,002 / 64,001 at depths 16, 32, 64: the highest, noise and all.
        assert_eq!(s.peak().unwrap().qd, 32);
        assert!(s.next_qd().is_none());
    }

    #[test]
    fn one_noisy_dip_does_not_end_the_search() {
        let figures = [100.0, 200.0, 190.0, 400.0, 800.0, 805.0, 806.0];
        let s = search(|qd| figures[qd.trailing_zeros() as usize], 1024);
        assert_eq!(s.peak().unwrap().qd, 64);
        assert_eq!(s.steps().len(), 7);
    }

    #[test]
    fn the_cap_ends_a_search_that_keeps_growing() {
        let s = search(|qd| f64::from(qd) * 1000.0, 24);
        let depths: Vec<u32> = s.steps().iter().map(|x| x.qd).collect();
        assert_eq!(depths, [1, 2, 4, 8, 16, 24]);
        assert_eq!(s.peak().unwrap().qd, 24);
    }
}
