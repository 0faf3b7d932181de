//! A model's prediction beside a measurement, with an explicit tolerance.
//!
//! relative error e = (predicted − measured) / |measured| (signed: > 0 means the model
//! over-predicts); the check *agrees* when |e| ≤ tolerance. When the measurement has a
//! confidence interval, [`ModelCheck::within_ci`] also says whether the prediction falls
//! inside it. A disagreement is a result to report, not an error: nothing here hides it.

use std::fmt;

use serde::{Deserialize, Serialize};

/// One prediction checked against one measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelCheck {
    /// What is compared, e.g. `"M/M/1 response time"` or `"interactive law R"`.
    pub name: String,
    /// Unit of `predicted` and `measured`, e.g. `"s"`, `"req/s"`.
    pub unit: String,
    /// The model's value.
    pub predicted: f64,
    /// The measured value.
    pub measured: f64,
    /// (predicted − measured) / |measured|; ±∞ when measured is 0 and predicted is not,
    /// 0 when both are 0, NaN when either is NaN.
    pub relative_error: f64,
    /// Largest |relative_error| that counts as agreement (0.10 = 10 %).
    pub tolerance: f64,
    /// |relative_error| ≤ tolerance (false for a NaN or infinite error).
    pub agrees: bool,
    /// Confidence interval of the measurement, if known.
    pub measured_ci: Option<(f64, f64)>,
    /// Whether the prediction lies inside `measured_ci`; `None` without an interval.
    pub within_ci: Option<bool>,
}

impl ModelCheck {
    /// Compares `predicted` to `measured` with a relative `tolerance` (0.10 = 10 %).
    pub fn new(
        name: impl Into<String>,
        unit: impl Into<String>,
        predicted: f64,
        measured: f64,
        tolerance: f64,
    ) -> Self {
        let relative_error = relative_error(predicted, measured);
        ModelCheck {
            name: name.into(),
            unit: unit.into(),
            predicted,
            measured,
            relative_error,
            tolerance,
            agrees: relative_error.abs() <= tolerance,
            measured_ci: None,
            within_ci: None,
        }
    }

    /// Adds the measurement's confidence interval and whether the prediction lies in it.
    pub fn with_measured_ci(mut self, low: f64, high: f64) -> Self {
        self.measured_ci = Some((low, high));
        self.within_ci = Some(low <= self.predicted && self.predicted <= high);
        self
    }
}

/// (predicted − measured) / |measured|, with the edge cases of
/// [`ModelCheck::relative_error`].
pub fn relative_error(predicted: f64, measured: f64) -> f64 {
    if predicted == measured {
        // Covers 0 vs 0 (and equal infinities, where the difference would be NaN).
        return 0.0;
    }
    (predicted - measured) / measured.abs()
}

impl fmt::Display for ModelCheck {
    /// One line: `name: predicted P unit, measured M unit, error +E% (tolerance T%): agrees`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: predicted {:.4} {}, measured {:.4} {}, error {:+.1}% (tolerance {:.1}%): {}",
            self.name,
            self.predicted,
            self.unit,
            self.measured,
            self.unit,
            self.relative_error * 100.0,
            self.tolerance * 100.0,
            if self.agrees { "agrees" } else { "DISAGREES" }
        )?;
        if let (Some((lo, hi)), Some(inside)) = (self.measured_ci, self.within_ci) {
            write!(
                f,
                "; measured CI [{lo:.4}, {hi:.4}] {} the prediction",
                if inside { "contains" } else { "excludes" }
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agreement_and_disagreement() {
        let c = ModelCheck::new("R", "s", 0.052, 0.050, 0.10);
        assert!((c.relative_error - 0.04).abs() < 1e-12);
        assert!(c.agrees);
        let c = ModelCheck::new("R", "s", 0.040, 0.050, 0.10);
        assert!((c.relative_error + 0.2).abs() < 1e-12);
        assert!(!c.agrees);
        assert!(c.to_string().contains("DISAGREES"), "{c}");
        assert!(c.to_string().contains("-20.0%"), "{c}");
    }

    #[test]
    fn edge_cases_never_agree_by_accident() {
        assert_eq!(relative_error(0.0, 0.0), 0.0);
        assert!(ModelCheck::new("x", "", 0.0, 0.0, 0.0).agrees);
        let c = ModelCheck::new("x", "", 1.0, 0.0, 0.5);
        assert!(c.relative_error.is_infinite() && !c.agrees);
        let c = ModelCheck::new("x", "", f64::NAN, 1.0, 0.5);
        assert!(!c.agrees);
    }

    #[test]
    fn measured_ci() {
        let c = ModelCheck::new("X", "req/s", 100.0, 98.0, 0.05).with_measured_ci(95.0, 101.0);
        assert_eq!(c.within_ci, Some(true));
        assert!(c.to_string().contains("contains"));
        let c = ModelCheck::new("X", "req/s", 100.0, 98.0, 0.05).with_measured_ci(97.0, 99.0);
        assert_eq!(c.within_ci, Some(false));
        assert!(c.agrees, "within tolerance even though outside the CI");
    }
}
