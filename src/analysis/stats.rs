//! The statistics the diff and the run report judge by: moments of replicates, Student's t and
//! the normal quantiles, Welch's interval and the runs a comparison needs.

use statrs::distribution::{ContinuousCDF, Normal, StudentsT};

/// The confidence of one compared row's interval.
pub const CONFIDENCE: f64 = 0.95;

/// Power of the "runs that would resolve it" estimate (z of 0.80): runs enough to tell an
/// effect of the stated size from none 80% of the time.
const Z_POWER: f64 = 0.841_621;

/// Mean, standard deviation (n − 1) and count of a series of replicates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Moments {
    pub mean: f64,
    pub sd: f64,
    pub n: usize,
}

/// The moments of `xs` (None when empty; sd 0 for one value).
pub fn moments(xs: &[f64]) -> Option<Moments> {
    let n = xs.len();
    if n == 0 {
        return None;
    }
    let mean = xs.iter().sum::<f64>() / n as f64;
    let var = if n > 1 {
        xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64
    } else {
        0.0
    };
    Some(Moments {
        mean,
        sd: var.sqrt(),
        n,
    })
}

/// The quantile of a two-sided interval at `confidence`: 1 − (1 − confidence)/2.
fn two_sided(confidence: f64) -> f64 {
    1.0 - (1.0 - confidence) / 2.0
}

/// Student's t at the two-sided `confidence` with `df` degrees of freedom (at least 1).
pub fn t_quantile(df: f64, confidence: f64) -> Option<f64> {
    Some(
        StudentsT::new(0.0, 1.0, df.max(1.0))
            .ok()?
            .inverse_cdf(two_sided(confidence)),
    )
}

/// The standard normal's quantile at the two-sided `confidence`.
pub fn z_quantile(confidence: f64) -> f64 {
    Normal::standard().inverse_cdf(two_sided(confidence))
}

/// Half-width of the `confidence` interval of the difference of two means (Welch); None with
/// fewer than two values on a side.
pub fn welch_half_width(a: &[f64], b: &[f64], confidence: f64) -> Option<f64> {
    let (ma, mb) = (moments(a)?, moments(b)?);
    if ma.n < 2 || mb.n < 2 {
        return None;
    }
    let (va, vb) = (ma.sd * ma.sd / ma.n as f64, mb.sd * mb.sd / mb.n as f64);
    let se2 = va + vb;
    if se2 == 0.0 {
        return Some(0.0);
    }
    let df = se2 * se2 / (va * va / (ma.n - 1) as f64 + vb * vb / (mb.n - 1) as f64);
    Some(t_quantile(df, confidence)? * se2.sqrt())
}

/// Runs per host that tell an effect of `bound` from none 80% of the time at the `confidence`
/// level, given a per-run spread `sd` on the same scale (two-sample normal approximation; at
/// least 2, at most 1000).
pub fn runs_to_resolve(sd: f64, bound: f64, confidence: f64) -> u32 {
    let z_alpha = z_quantile(confidence);
    let n = (2.0 * (z_alpha + Z_POWER).powi(2) * sd * sd / (bound * bound)).ceil();
    if n.is_finite() {
        n.clamp(2.0, 1000.0) as u32
    } else {
        1000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn welch_interval_matches_a_textbook_case() {
        // Two samples of 5 with variances 2.5 and 2.5: SE = 1, df = 8, t(0.975, 8) = 2.306.
        let a = [1.0, 2.0, 3.0, 4.0, 5.0];
        let b = [3.0, 4.0, 5.0, 6.0, 7.0];
        let hw = welch_half_width(&a, &b, 0.95).unwrap();
        assert!((hw - 2.306).abs() < 0.001, "{hw}");
        // t(0.995, 8) = 3.355.
        let hw = welch_half_width(&a, &b, 0.99).unwrap();
        assert!((hw - 3.355).abs() < 0.001, "{hw}");
        assert_eq!(welch_half_width(&a[..1], &b, 0.95), None);
    }

    #[test]
    fn moments_of_a_series() {
        let m = moments(&[2.0, 4.0, 6.0]).unwrap();
        assert_eq!((m.mean, m.sd, m.n), (4.0, 2.0, 3));
        assert_eq!(moments(&[7.0]).map(|m| m.sd), Some(0.0));
        assert_eq!(moments(&[]), None);
    }

    #[test]
    fn runs_to_resolve_grows_with_the_spread_and_stays_in_bounds() {
        // 2 (1.96 + 0.84)² sd²/bound²: sd = bound gives 16 runs.
        assert_eq!(runs_to_resolve(0.05, 0.05, 0.95), 16);
        assert_eq!(runs_to_resolve(0.0, 0.05, 0.95), 2);
        assert_eq!(runs_to_resolve(1.0, 0.0, 0.95), 1000);
    }
}
