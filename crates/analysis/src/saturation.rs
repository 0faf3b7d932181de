//! The saturation point: the knee of throughput X (req/s) against the number of
//! closed-loop clients N.
//!
//! # The rule
//!
//! Points are sorted by N. X(0) = 0, so the *initial slope* is s₀ = X₁/N₁, the
//! throughput each client adds while nothing queues. For each segment i → i+1 the
//! *marginal gain* is gᵢ = (X_{i+1} − X_i)/(N_{i+1} − N_i) (req/s per added client).
//!
//! 1. *Slope rule*: the knee is the smallest Nᵢ whose next segment gains less than
//!    `slope_fraction` (default 10 %) of s₀: adding clients beyond it buys (almost)
//!    nothing. Absent when the gain never falls that low (not saturated in range).
//! 2. *Fraction-of-max rule*: the smallest N with X ≥ `max_fraction` (default 95 %) of
//!    the largest measured X. Always defined.
//!
//! The reported knee is the smaller of the two: the first sign of saturation. With a
//! throughput curve that keeps rising steeply up to the last point only rule 2 fires
//! (at or near the last point) and `saturated` is false: the load did not go far
//! enough to find the knee.
//!
//! When the points carry confidence half-widths, each segment also says whether its
//! gain is *significant*: |ΔX| larger than the sum of the two half-widths (the
//! intervals do not overlap). A knee found among non-significant gains is a knee within
//! noise; the report can say so.
//!
//! # From operational analysis
//!
//! With known demands, N* = (D + Z)/D_max (D = total service demand, Z = think time,
//! D_max = the bottleneck's demand; all in s) is where the asymptotic throughput bounds
//! N/(D+Z) and 1/D_max cross: beyond N*, clients only queue. See [`knee_population`].

use serde::{Deserialize, Serialize};

use crate::error::{finite, non_negative, positive, AnalysisError, Result};

/// One measured point of the throughput curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LoadPoint {
    /// Number of clients N (> 0).
    pub clients: f64,
    /// Mean throughput X (req/s).
    pub throughput: f64,
    /// Half-width of X's confidence interval (req/s), if known.
    pub ci_half_width: Option<f64>,
}

impl LoadPoint {
    /// A point without a confidence interval.
    pub fn new(clients: f64, throughput: f64) -> Self {
        LoadPoint {
            clients,
            throughput,
            ci_half_width: None,
        }
    }
}

/// Parameters of the knee rule.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct KneeOptions {
    /// Slope rule threshold, as a fraction of the initial slope (default 0.10).
    pub slope_fraction: f64,
    /// Fraction-of-max rule threshold (default 0.95).
    pub max_fraction: f64,
}

impl Default for KneeOptions {
    fn default() -> Self {
        KneeOptions {
            slope_fraction: 0.10,
            max_fraction: 0.95,
        }
    }
}

/// One segment between consecutive points.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    /// N at the start of the segment.
    pub from_clients: f64,
    /// N at the end of the segment.
    pub to_clients: f64,
    /// Marginal gain ΔX/ΔN (req/s per client).
    pub gain_per_client: f64,
    /// Gain relative to the initial slope (1.0 = as good as the first clients).
    pub relative_gain: f64,
    /// Whether |ΔX| exceeds the sum of the two CI half-widths; `None` without CIs.
    pub significant: Option<bool>,
}

/// Which rule decided the knee.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum KneeRule {
    /// The marginal gain fell below the slope fraction.
    Slope,
    /// Throughput reached the fraction of its maximum (first, or alone).
    FractionOfMax,
}

/// The saturation point of a throughput curve.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Knee {
    /// N at the knee (clients).
    pub clients: f64,
    /// X at the knee (req/s).
    pub throughput: f64,
    /// Which rule gave the knee.
    pub rule: KneeRule,
    /// The slope rule's N, if it fired.
    pub by_slope: Option<f64>,
    /// The fraction-of-max rule's N.
    pub by_fraction_of_max: f64,
    /// Whether the slope rule fired (the curve flattened within the measured range).
    pub saturated: bool,
    /// Largest measured throughput (req/s) and its N.
    pub max_throughput: f64,
    /// N at the largest measured throughput.
    pub max_throughput_clients: f64,
    /// Initial slope X₁/N₁ (req/s per client).
    pub initial_slope: f64,
    /// The segments, in order of N.
    pub segments: Vec<Segment>,
}

/// Finds the knee of `points` (any order) with the rules in the module documentation.
/// Errors: fewer than 2 points, a non-positive N, duplicate N, a negative or non-finite
/// X, all-zero throughput.
pub fn find_knee(points: &[LoadPoint], options: KneeOptions) -> Result<Knee> {
    if points.len() < 2 {
        return Err(AnalysisError::TooFew {
            what: "load points",
            needed: 2,
            got: points.len(),
        });
    }
    for p in points {
        positive("clients N", p.clients)?;
        non_negative("throughput X", p.throughput)?;
        if let Some(h) = p.ci_half_width {
            non_negative("CI half-width", h)?;
        }
    }
    finite("slope fraction", options.slope_fraction)?;
    finite("max fraction", options.max_fraction)?;
    let mut pts = points.to_vec();
    pts.sort_by(|a, b| a.clients.total_cmp(&b.clients));
    if pts.windows(2).any(|w| w[0].clients == w[1].clients) {
        return Err(AnalysisError::InvalidArgument {
            what: "clients N",
            value: f64::NAN,
            expected: "distinct values of N",
        });
    }
    // Invariant: pts has at least 2 points (checked above), so a maximum exists.
    let max_p = *pts
        .iter()
        .max_by(|a, b| a.throughput.total_cmp(&b.throughput))
        .ok_or(AnalysisError::TooFew {
            what: "load points",
            needed: 2,
            got: 0,
        })?;
    if max_p.throughput <= 0.0 {
        return Err(AnalysisError::InvalidArgument {
            what: "largest throughput",
            value: max_p.throughput,
            expected: "a number > 0",
        });
    }
    let s0 = pts[0].throughput / pts[0].clients;
    let segments: Vec<Segment> = pts
        .windows(2)
        .map(|w| {
            let dx = w[1].throughput - w[0].throughput;
            let g = dx / (w[1].clients - w[0].clients);
            Segment {
                from_clients: w[0].clients,
                to_clients: w[1].clients,
                gain_per_client: g,
                relative_gain: if s0 > 0.0 { g / s0 } else { f64::INFINITY },
                significant: match (w[0].ci_half_width, w[1].ci_half_width) {
                    (Some(a), Some(b)) => Some(dx.abs() > a + b),
                    _ => None,
                },
            }
        })
        .collect();
    let by_slope = segments
        .iter()
        .find(|s| s.gain_per_client < options.slope_fraction * s0)
        .map(|s| s.from_clients);
    let target = options.max_fraction * max_p.throughput;
    // Invariant: the maximum itself satisfies X ≥ target, so the fallback is unused.
    let by_max = pts
        .iter()
        .find(|p| p.throughput >= target)
        .map_or(max_p.clients, |p| p.clients);
    let (clients, rule) = match by_slope {
        Some(n) if n <= by_max => (n, KneeRule::Slope),
        _ => (by_max, KneeRule::FractionOfMax),
    };
    let throughput = pts
        .iter()
        .find(|p| p.clients == clients)
        .map_or(f64::NAN, |p| p.throughput);
    Ok(Knee {
        clients,
        throughput,
        rule,
        by_slope,
        by_fraction_of_max: by_max,
        saturated: by_slope.is_some(),
        max_throughput: max_p.throughput,
        max_throughput_clients: max_p.clients,
        initial_slope: s0,
        segments,
    })
}

/// N* = (D + Z)/D_max (clients): the population where a closed system saturates, from
/// the total demand `total_demand` D (s), think time `think_time` Z (s) and the
/// bottleneck's demand `max_demand` D_max (s).
pub fn knee_population(total_demand: f64, think_time: f64, max_demand: f64) -> Result<f64> {
    non_negative("total demand D", total_demand)?;
    non_negative("think time Z", think_time)?;
    positive("bottleneck demand D_max", max_demand)?;
    if max_demand > total_demand {
        return Err(AnalysisError::InvalidArgument {
            what: "bottleneck demand D_max",
            value: max_demand,
            expected: "at most the total demand D",
        });
    }
    Ok((total_demand + think_time) / max_demand)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn curve(f: impl Fn(f64) -> f64, ns: &[f64]) -> Vec<LoadPoint> {
        ns.iter().map(|&n| LoadPoint::new(n, f(n))).collect()
    }

    #[test]
    fn knee_of_a_hard_ceiling() {
        // X = min(1000 N, 10 000): s₀ = 1000; gains 1000, 1000, 1000, 250, 0.
        // Slope rule: first gain < 100 is the segment 16 → 32 → N = 16.
        // 95 % rule: first X ≥ 9500 is N = 16 (X = 10 000).
        let pts = curve(|n| (1000.0 * n).min(10_000.0), &[1., 2., 4., 8., 16., 32.]);
        let k = find_knee(&pts, KneeOptions::default()).unwrap();
        assert_eq!(k.clients, 16.0);
        assert_eq!(k.throughput, 10_000.0);
        assert_eq!(k.by_slope, Some(16.0));
        assert_eq!(k.by_fraction_of_max, 16.0);
        assert!(k.saturated);
        assert_eq!(k.initial_slope, 1000.0);
        assert_eq!(k.segments[3].relative_gain, 0.25);
    }

    #[test]
    fn knee_of_a_smooth_curve_in_any_order() {
        // X = 10 000 N/(N + 8): s₀ = 1111.1; gain 8 → 16: (6666.7 − 5000)/8 = 208.3
        // (18.75 % of s₀); 16 → 32: (8000 − 6666.7)/16 = 83.3 (7.5 %) → slope knee 16.
        // Max 9411.8 at N = 128; 95 % = 8941.2 → first N with X ≥ it: 128 (X(64) = 8888.9).
        let mut pts = curve(
            |n| 10_000.0 * n / (n + 8.0),
            &[1., 2., 4., 8., 16., 32., 64., 128.],
        );
        pts.reverse();
        let k = find_knee(&pts, KneeOptions::default()).unwrap();
        assert_eq!(k.by_slope, Some(16.0));
        assert_eq!(k.by_fraction_of_max, 128.0);
        assert_eq!(k.clients, 16.0);
        assert_eq!(k.rule, KneeRule::Slope);
    }

    #[test]
    fn a_linear_curve_is_not_saturated() {
        let pts = curve(|n| 500.0 * n, &[1., 2., 4., 8.]);
        let k = find_knee(&pts, KneeOptions::default()).unwrap();
        assert!(!k.saturated);
        assert_eq!(k.by_slope, None);
        assert_eq!(k.clients, 8.0);
        assert_eq!(k.rule, KneeRule::FractionOfMax);
    }

    #[test]
    fn thrashing_counts_as_saturation() {
        let pts = curve(
            |n| if n <= 4.0 { 100.0 * n } else { 300.0 },
            &[1., 2., 4., 8.],
        );
        let k = find_knee(&pts, KneeOptions::default()).unwrap();
        assert_eq!(k.by_slope, Some(4.0));
        assert_eq!(k.max_throughput, 400.0);
        assert_eq!(k.clients, 4.0);
    }

    #[test]
    fn significance_of_gains_from_cis() {
        let pts = [
            LoadPoint {
                clients: 1.0,
                throughput: 100.0,
                ci_half_width: Some(5.0),
            },
            LoadPoint {
                clients: 2.0,
                throughput: 190.0,
                ci_half_width: Some(5.0),
            },
            LoadPoint {
                clients: 4.0,
                throughput: 196.0,
                ci_half_width: Some(5.0),
            },
        ];
        let k = find_knee(&pts, KneeOptions::default()).unwrap();
        assert_eq!(k.segments[0].significant, Some(true));
        assert_eq!(k.segments[1].significant, Some(false));
        assert_eq!(k.clients, 2.0);
    }

    #[test]
    fn bad_points_are_errors() {
        assert!(find_knee(&[LoadPoint::new(1.0, 1.0)], KneeOptions::default()).is_err());
        let dup = [LoadPoint::new(1.0, 1.0), LoadPoint::new(1.0, 2.0)];
        assert!(find_knee(&dup, KneeOptions::default()).is_err());
        let zero = [LoadPoint::new(1.0, 0.0), LoadPoint::new(2.0, 0.0)];
        assert!(find_knee(&zero, KneeOptions::default()).is_err());
        let neg = [LoadPoint::new(0.0, 1.0), LoadPoint::new(2.0, 2.0)];
        assert!(find_knee(&neg, KneeOptions::default()).is_err());
    }

    #[test]
    fn operational_knee() {
        // D = 0.3 s, Z = 1 s, D_max = 0.2 s: N* = 1.3/0.2 = 6.5.
        assert!((knee_population(0.3, 1.0, 0.2).unwrap() - 6.5).abs() < 1e-12);
        assert!(knee_population(0.3, 1.0, 0.0).is_err());
        assert!(knee_population(0.1, 1.0, 0.2).is_err());
    }
}
