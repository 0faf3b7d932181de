//! Statistics over repetitions: mean, sample standard deviation and a Student-t
//! confidence interval for the mean; percentiles of a sample.
//!
//! For n samples x₁…xₙ (any unit; the results carry the same unit):
//!
//! - mean x̄ = Σxᵢ / n;
//! - sample standard deviation s = √( Σ(xᵢ − x̄)² / (n − 1) );
//! - 100(1−α)% confidence interval of the mean: x̄ ± t[1−α/2; n−1] · s / √n, with
//!   t[p; ν] the p-quantile of Student's t with ν degrees of freedom (Jain, *The Art
//!   of Computer Systems Performance Analysis*, §13.2). Repetitions of an experiment
//!   are few (3–10), so t, not the normal z, is the right quantile.
//!
//! With one sample the standard deviation and the interval are undefined: the fields
//! are `None` (JSON `null`), never a made-up zero width.

use serde::{Deserialize, Serialize};
use statrs::distribution::{ContinuousCDF, Normal, StudentsT};

use crate::error::{finite, AnalysisError, Result};

/// Mean, standard deviation and confidence interval of a set of repetitions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Number of samples.
    pub n: usize,
    /// Sample mean (unit of the samples).
    pub mean: f64,
    /// Sample standard deviation with n − 1 in the denominator; `None` when n = 1.
    pub std_dev: Option<f64>,
    /// Lower end of the confidence interval of the mean; `None` when n = 1.
    pub ci_low: Option<f64>,
    /// Upper end of the confidence interval of the mean; `None` when n = 1.
    pub ci_high: Option<f64>,
    /// t[1−α/2; n−1] · s / √n; `None` when n = 1.
    pub ci_half_width: Option<f64>,
    /// The confidence level 1 − α, e.g. 0.95.
    pub confidence: f64,
}

impl Summary {
    /// The interval `(low, high)`, if defined.
    pub fn ci(&self) -> Option<(f64, f64)> {
        Some((self.ci_low?, self.ci_high?))
    }

    /// Half width relative to the mean, |h / x̄| (0.05 = "±5 %"); `None` when the
    /// interval is undefined or the mean is 0.
    pub fn relative_half_width(&self) -> Option<f64> {
        let h = self.ci_half_width?;
        (self.mean != 0.0).then(|| (h / self.mean).abs())
    }

    /// Repetitions needed for a half width of `relative_accuracy` × mean at the same
    /// confidence, n = ⌈(t · s / (r · x̄))²⌉ (Jain §13.9), using this sample's s and the
    /// current t as the estimate. `None` when s is undefined or the mean is 0.
    pub fn repetitions_for(&self, relative_accuracy: f64) -> Option<usize> {
        let s = self.std_dev?;
        if self.mean == 0.0 || relative_accuracy <= 0.0 || !relative_accuracy.is_finite() {
            return None;
        }
        let t = t_quantile_two_sided(self.confidence, (self.n - 1) as f64).ok()?;
        let n = (t * s / (relative_accuracy * self.mean.abs()))
            .powi(2)
            .ceil();
        // n is finite and >= 0 here; the cast saturates for absurdly large values.
        Some((n as usize).max(2))
    }
}

/// Summarizes `samples` with a Student-t confidence interval at level `confidence`
/// (e.g. 0.95). Errors: no samples, a non-finite sample, confidence outside (0, 1).
pub fn summarize(samples: &[f64], confidence: f64) -> Result<Summary> {
    check_confidence(confidence)?;
    if samples.is_empty() {
        return Err(AnalysisError::TooFew {
            what: "samples",
            needed: 1,
            got: 0,
        });
    }
    for &x in samples {
        finite("sample", x)?;
    }
    let n = samples.len();
    let mean = samples.iter().sum::<f64>() / n as f64;
    if n == 1 {
        return Ok(Summary {
            n,
            mean,
            std_dev: None,
            ci_low: None,
            ci_high: None,
            ci_half_width: None,
            confidence,
        });
    }
    // Two-pass variance: stable for samples with a large mean and a small spread.
    let ss: f64 = samples.iter().map(|x| (x - mean).powi(2)).sum();
    let s = (ss / (n - 1) as f64).sqrt();
    let t = t_quantile_two_sided(confidence, (n - 1) as f64)?;
    let h = t * s / (n as f64).sqrt();
    Ok(Summary {
        n,
        mean,
        std_dev: Some(s),
        ci_low: Some(mean - h),
        ci_high: Some(mean + h),
        ci_half_width: Some(h),
        confidence,
    })
}

/// t[1 − α/2; ν]: the Student-t quantile for a two-sided interval at level
/// `confidence` = 1 − α with `df` = ν degrees of freedom (e.g. 0.90, 8 → 1.860).
pub fn t_quantile_two_sided(confidence: f64, df: f64) -> Result<f64> {
    check_confidence(confidence)?;
    let t = StudentsT::new(0.0, 1.0, df).map_err(|_| AnalysisError::InvalidArgument {
        what: "degrees of freedom",
        value: df,
        expected: "a number > 0",
    })?;
    Ok(t.inverse_cdf(1.0 - (1.0 - confidence) / 2.0))
}

/// z[1 − α/2]: the standard normal quantile for a two-sided interval at level
/// `confidence` (e.g. 0.95 → 1.960).
pub fn z_quantile_two_sided(confidence: f64) -> Result<f64> {
    check_confidence(confidence)?;
    // Invariant: mean 0 and std dev 1 are valid parameters, so `new` cannot fail.
    let z = Normal::new(0.0, 1.0).map_err(|_| AnalysisError::InvalidConfidence(confidence))?;
    Ok(z.inverse_cdf(1.0 - (1.0 - confidence) / 2.0))
}

/// The `p`-th percentile (0 ≤ p ≤ 100) of `samples`, by linear interpolation between
/// the closest ranks (the "type 7" rule of R and NumPy's default): with the sorted
/// sample y₀…yₙ₋₁, h = (n − 1)·p/100 and the result is y⌊h⌋ + (h − ⌊h⌋)(y⌊h⌋₊₁ − y⌊h⌋).
pub fn percentile(samples: &[f64], p: f64) -> Result<f64> {
    percentile_of_sorted(&sorted_finite(samples)?, p)
}

/// Several percentiles of one sample (sorted once), in the order of `ps`.
pub fn percentiles(samples: &[f64], ps: &[f64]) -> Result<Vec<f64>> {
    let sorted = sorted_finite(samples)?;
    ps.iter()
        .map(|&p| percentile_of_sorted(&sorted, p))
        .collect()
}

fn sorted_finite(samples: &[f64]) -> Result<Vec<f64>> {
    if samples.is_empty() {
        return Err(AnalysisError::TooFew {
            what: "samples",
            needed: 1,
            got: 0,
        });
    }
    for &x in samples {
        finite("sample", x)?;
    }
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    Ok(v)
}

fn percentile_of_sorted(sorted: &[f64], p: f64) -> Result<f64> {
    if !(0.0..=100.0).contains(&p) {
        return Err(AnalysisError::InvalidArgument {
            what: "percentile",
            value: p,
            expected: "a number in [0, 100]",
        });
    }
    let h = (sorted.len() - 1) as f64 * p / 100.0;
    let lo = h.floor() as usize;
    let hi = (lo + 1).min(sorted.len() - 1);
    Ok(sorted[lo] + (h - lo as f64) * (sorted[hi] - sorted[lo]))
}

pub(crate) fn check_confidence(c: f64) -> Result<()> {
    if c > 0.0 && c < 1.0 {
        Ok(())
    } else {
        Err(AnalysisError::InvalidConfidence(c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn ci_of_one_to_five_by_hand() {
        // x̄ = 3; Σ(x − x̄)² = 4+1+0+1+4 = 10; s = √(10/4) = 1.58114;
        // t[0.975; 4] = 2.77645 (tables: 2.776); h = 2.77645 · 1.58114 / √5 = 1.96324.
        let s = summarize(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.95).unwrap();
        assert_eq!(s.n, 5);
        assert_eq!(s.mean, 3.0);
        assert!(close(s.std_dev.unwrap(), 1.58114, 1e-5));
        assert!(close(s.ci_half_width.unwrap(), 1.96324, 1e-5));
        let (lo, hi) = s.ci().unwrap();
        assert!(close(lo, 3.0 - 1.96324, 1e-5) && close(hi, 3.0 + 1.96324, 1e-5));
        assert!(close(s.relative_half_width().unwrap(), 1.96324 / 3.0, 1e-5));
    }

    #[test]
    fn t_and_z_quantiles_match_tables() {
        assert!(close(t_quantile_two_sided(0.90, 8.0).unwrap(), 1.860, 5e-4));
        assert!(close(t_quantile_two_sided(0.95, 4.0).unwrap(), 2.776, 5e-4));
        assert!(close(
            t_quantile_two_sided(0.99, 10.0).unwrap(),
            3.169,
            5e-4
        ));
        assert!(close(z_quantile_two_sided(0.95).unwrap(), 1.960, 5e-4));
        assert!(close(z_quantile_two_sided(0.90).unwrap(), 1.645, 5e-4));
    }

    #[test]
    fn one_sample_has_no_interval() {
        let s = summarize(&[7.5], 0.95).unwrap();
        assert_eq!(s.mean, 7.5);
        assert_eq!(s.std_dev, None);
        assert_eq!(s.ci(), None);
        assert_eq!(s.repetitions_for(0.05), None);
        // None goes to JSON as null.
        let json = serde_json::to_string(&s).unwrap();
        assert!(json.contains("\"ci_low\":null"), "{json}");
    }

    #[test]
    fn constant_samples_have_zero_width() {
        let s = summarize(&[2.0, 2.0, 2.0], 0.95).unwrap();
        assert_eq!(s.std_dev, Some(0.0));
        assert_eq!(s.ci_half_width, Some(0.0));
    }

    #[test]
    fn bad_inputs_are_errors() {
        assert!(matches!(
            summarize(&[], 0.95),
            Err(AnalysisError::TooFew { .. })
        ));
        assert!(matches!(
            summarize(&[1.0, f64::NAN], 0.95),
            Err(AnalysisError::NonFinite { .. })
        ));
        assert!(matches!(
            summarize(&[1.0, 2.0], 1.0),
            Err(AnalysisError::InvalidConfidence(_))
        ));
        assert!(percentile(&[1.0], 101.0).is_err());
    }

    #[test]
    fn repetitions_for_precision() {
        // s = 1.58114, x̄ = 3, t = 2.77645, ±5 %: (2.77645·1.58114/0.15)² = 856.5 → 857.
        let s = summarize(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.95).unwrap();
        assert_eq!(s.repetitions_for(0.05), Some(857));
    }

    #[test]
    fn percentiles_interpolate() {
        let xs = [15.0, 20.0, 35.0, 40.0, 50.0];
        assert_eq!(percentile(&xs, 0.0).unwrap(), 15.0);
        assert_eq!(percentile(&xs, 100.0).unwrap(), 50.0);
        assert_eq!(percentile(&xs, 50.0).unwrap(), 35.0);
        // h = 4 · 0.4 = 1.6 → 20 + 0.6 · 15 = 29 (NumPy: percentile(xs, 40) = 29.0).
        assert!(close(percentile(&xs, 40.0).unwrap(), 29.0, 1e-12));
        assert_eq!(
            percentiles(&[3.0, 1.0, 2.0], &[0.0, 50.0, 100.0]).unwrap(),
            vec![1.0, 2.0, 3.0]
        );
    }
}
