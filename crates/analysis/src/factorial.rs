//! 2^k·r factorial designs (Jain, *The Art of Computer Systems Performance Analysis*,
//! ch. 17–18): k factors at two levels each, every one of the 2^k combinations run r
//! times.
//!
//! # Layout
//!
//! Runs are in standard (Yates) order: in run i (0-based) factor j is at its high
//! level (+1) iff bit j of i is set. For k = 2 the runs are (A−,B−), (A+,B−), (A−,B+),
//! (A+,B+). [`run_levels`] gives the levels of a run. An effect is a set of factors
//! (bit mask m; m = 0 is the mean "I"); its column in the sign table is
//! x_{i,m} = ∏_{j∈m} (±1) = (−1)^{popcount(m ∧ ¬i)}.
//!
//! # Formulas (y_ij: replication j of run i; ȳ_i the run means; n = 2^k)
//!
//! - effects q_m = (1/n) Σ_i x_{i,m} ȳ_i (unit of y); q₀ is the grand mean;
//! - model y = Σ_m q_m x_m + e;
//! - SST = Σ_ij (y_ij − q₀)² = Σ_{m≠0} SS_m + SSE, with SS_m = n·r·q_m² and
//!   SSE = Σ_ij (y_ij − ȳ_i)²;
//! - allocation of variation: 100·SS_m/SST % explained by effect m, 100·SSE/SST % by
//!   error (all 0 when SST = 0);
//! - s_e = √(SSE / (n(r−1))); s_q = s_e / √(n·r) for every effect;
//! - 100(1−α)% CI of q_m: q_m ± t[1−α/2; n(r−1)]·s_q; an effect whose interval
//!   excludes 0 is significant.
//!
//! With r = 1 there are no degrees of freedom for error: SSE, s_e and the intervals
//! are `None` (JSON `null`), and all variation is allocated to the effects.
//!
//! For a multiplicative model (effects that scale rather than add, Jain §18.7),
//! analyze ln y and read the effects as factors e^{q}.

use serde::{Deserialize, Serialize};

use crate::error::{finite, AnalysisError, Result};
use crate::summary::{check_confidence, t_quantile_two_sided};

/// The largest supported k: 2^16 runs and 2^16 effects (the sign table is 2^32 cells).
pub const MAX_FACTORS: usize = 16;

/// One effect (including the mean I) of a 2^k·r design.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Effect {
    /// `"I"` for the mean; otherwise the factors' names concatenated when each is one
    /// character (`"AB"`), joined with `×` otherwise (`"memory×cache"`).
    pub label: String,
    /// The factors of the interaction (empty for I).
    pub factors: Vec<String>,
    /// The bit mask m of the factors (bit j = factor j).
    pub mask: u32,
    /// The estimate q_m (unit of the observations).
    pub estimate: f64,
    /// SS_m = 2^k·r·q_m² (for I: SS0).
    pub sum_of_squares: f64,
    /// 100·SS_m/SST (%); `None` for I.
    pub percent_variation: Option<f64>,
    /// Lower end of the confidence interval of q_m; `None` when r = 1.
    pub ci_low: Option<f64>,
    /// Upper end of the confidence interval of q_m; `None` when r = 1.
    pub ci_high: Option<f64>,
    /// Whether the interval excludes 0; `None` when r = 1.
    pub significant: Option<bool>,
}

/// The analysis of a 2^k·r design.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FactorialAnalysis {
    /// The factors' names, factor j first at bit j.
    pub factors: Vec<String>,
    /// Replications r per run.
    pub replications: usize,
    /// The mean ȳ_i of each run, in standard order.
    pub run_means: Vec<f64>,
    /// All 2^k effects in standard order: I, A, B, AB, C, AC, BC, ABC, …
    pub effects: Vec<Effect>,
    /// SST = Σ (y − q₀)².
    pub ss_total: f64,
    /// SSE; `None` when r = 1.
    pub ss_error: Option<f64>,
    /// 100·SSE/SST (%); `None` when r = 1.
    pub error_percent_variation: Option<f64>,
    /// Degrees of freedom for error, 2^k(r−1).
    pub error_df: usize,
    /// s_e = √(SSE/(2^k(r−1))); `None` when r = 1.
    pub error_std_dev: Option<f64>,
    /// s_q = s_e/√(2^k·r), the standard deviation of every effect; `None` when r = 1.
    pub effect_std_dev: Option<f64>,
    /// The confidence level of the intervals.
    pub confidence: f64,
    /// t[1−α/2; 2^k(r−1)]; `None` when r = 1.
    pub t_value: Option<f64>,
}

impl FactorialAnalysis {
    /// Number of factors k.
    pub fn k(&self) -> usize {
        self.factors.len()
    }

    /// The effect with `label` (`"I"`, `"A"`, `"AB"`, …).
    pub fn effect(&self, label: &str) -> Option<&Effect> {
        self.effects.iter().find(|e| e.label == label)
    }

    /// The grand mean q₀.
    pub fn mean(&self) -> f64 {
        self.effects[0].estimate
    }

    /// The model's prediction ŷ = Σ_m q_m ∏_{j∈m} x_j at `high[j]` (true = +1,
    /// false = −1). Error when `high` does not have k entries.
    pub fn predict(&self, high: &[bool]) -> Result<f64> {
        if high.len() != self.k() {
            return Err(AnalysisError::DesignShape(format!(
                "{} levels given for {} factors",
                high.len(),
                self.k()
            )));
        }
        let run = high
            .iter()
            .enumerate()
            .fold(0usize, |acc, (j, &h)| acc | (usize::from(h) << j));
        Ok(self
            .effects
            .iter()
            .map(|e| f64::from(sign(run, e.mask as usize)) * e.estimate)
            .sum())
    }
}

/// The sign x_{i,m} of effect `mask` in run `run`: +1 when an even number of the
/// effect's factors are at their low level.
pub fn sign(run: usize, mask: usize) -> i8 {
    if (mask & !run).count_ones() & 1 == 0 {
        1
    } else {
        -1
    }
}

/// The sign table of a 2^k design: `table[i][m]` is the sign of effect m (column, in
/// standard order I, A, B, AB, …) in run i (row).
pub fn sign_table(k: usize) -> Result<Vec<Vec<i8>>> {
    check_k(k)?;
    let n = 1usize << k;
    Ok((0..n)
        .map(|i| (0..n).map(|m| sign(i, m)).collect())
        .collect())
}

/// The levels of run `run` of a 2^k design: `levels[j]` is true when factor j is high.
pub fn run_levels(k: usize, run: usize) -> Vec<bool> {
    (0..k).map(|j| run >> j & 1 == 1).collect()
}

/// Analyzes a 2^k·r design. `factors` names the k factors (e.g. `["A", "B"]`);
/// `runs` holds 2^k runs in standard order, each with the same r ≥ 1 observations;
/// `confidence` (e.g. 0.90) is the level of the effects' intervals.
pub fn analyze<R: AsRef<[f64]>>(
    factors: &[&str],
    runs: &[R],
    confidence: f64,
) -> Result<FactorialAnalysis> {
    check_confidence(confidence)?;
    let k = factors.len();
    check_k(k)?;
    let n = 1usize << k;
    if runs.len() != n {
        return Err(AnalysisError::DesignShape(format!(
            "{k} factors need 2^{k} = {n} runs, got {}",
            runs.len()
        )));
    }
    let r = runs[0].as_ref().len();
    if r == 0 {
        return Err(AnalysisError::DesignShape(
            "run 0 has no observations".into(),
        ));
    }
    for (i, run) in runs.iter().enumerate() {
        let run = run.as_ref();
        if run.len() != r {
            return Err(AnalysisError::DesignShape(format!(
                "run {i} has {} observations, run 0 has {r}",
                run.len()
            )));
        }
        for &y in run {
            finite("observation", y)?;
        }
    }

    let run_means: Vec<f64> = runs
        .iter()
        .map(|run| run.as_ref().iter().sum::<f64>() / r as f64)
        .collect();
    let estimates: Vec<f64> = (0..n)
        .map(|m| {
            run_means
                .iter()
                .enumerate()
                .map(|(i, y)| f64::from(sign(i, m)) * y)
                .sum::<f64>()
                / n as f64
        })
        .collect();
    let q0 = estimates[0];
    let nr = (n * r) as f64;
    // Sums of squares from deviations, not as SSY − SS0: no cancellation when the
    // mean is large compared with the effects.
    let ss_total: f64 = runs
        .iter()
        .flat_map(|run| run.as_ref().iter())
        .map(|y| (y - q0).powi(2))
        .sum();
    let error_df = n * (r - 1);
    let (ss_error, error_std_dev, effect_std_dev, t_value) = if r > 1 {
        let sse: f64 = runs
            .iter()
            .zip(&run_means)
            .flat_map(|(run, m)| run.as_ref().iter().map(move |y| (y - m).powi(2)))
            .sum();
        let se = (sse / error_df as f64).sqrt();
        let sq = se / nr.sqrt();
        let t = t_quantile_two_sided(confidence, error_df as f64)?;
        (Some(sse), Some(se), Some(sq), Some(t))
    } else {
        (None, None, None, None)
    };
    let percent = |ss: f64| {
        if ss_total > 0.0 {
            100.0 * ss / ss_total
        } else {
            0.0
        }
    };
    let one_char = factors.iter().all(|f| f.chars().count() == 1);
    let effects = estimates
        .iter()
        .enumerate()
        .map(|(m, &q)| {
            let names: Vec<String> = (0..k)
                .filter(|j| m >> j & 1 == 1)
                .map(|j| factors[j].to_string())
                .collect();
            let label = if m == 0 {
                "I".to_string()
            } else if one_char {
                names.concat()
            } else {
                names.join("×")
            };
            let ss = nr * q * q;
            let half = effect_std_dev.zip(t_value).map(|(sq, t)| t * sq);
            Effect {
                label,
                factors: names,
                mask: m as u32,
                estimate: q,
                sum_of_squares: ss,
                percent_variation: (m != 0).then(|| percent(ss)),
                ci_low: half.map(|h| q - h),
                ci_high: half.map(|h| q + h),
                significant: half.map(|h| q - h > 0.0 || q + h < 0.0),
            }
        })
        .collect();
    Ok(FactorialAnalysis {
        factors: factors.iter().map(|f| f.to_string()).collect(),
        replications: r,
        run_means,
        effects,
        ss_total,
        ss_error,
        error_percent_variation: ss_error.map(percent),
        error_df,
        error_std_dev,
        effect_std_dev,
        confidence,
        t_value,
    })
}

fn check_k(k: usize) -> Result<()> {
    if (1..=MAX_FACTORS).contains(&k) {
        Ok(())
    } else {
        Err(AnalysisError::DesignShape(format!(
            "{k} factors: expected 1 to {MAX_FACTORS}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    /// Jain, Example 18.1 (2²·3): runs (A−,B−), (A+,B−), (A−,B+), (A+,B+).
    /// Run means 15, 48, 24, 77 → q0 = 164/4 = 41, qA = 86/4 = 21.5, qB = 38/4 = 9.5,
    /// qAB = 20/4 = 5. SST = 7032, SSA = 12·21.5² = 5547, SSB = 1083, SSAB = 300,
    /// SSE = 102 → 78.88 %, 15.40 %, 4.27 %, 1.45 %. s_e = √(102/8) = 3.5707;
    /// s_q = 3.5707/√12 = 1.0308; t[0.95; 8] = 1.860 → ±1.917 ≈ ±1.92.
    #[test]
    fn jain_example_18_1() {
        let runs = [
            [15.0, 18.0, 12.0],
            [45.0, 48.0, 51.0],
            [25.0, 28.0, 19.0],
            [75.0, 75.0, 81.0],
        ];
        let a = analyze(&["A", "B"], &runs, 0.90).unwrap();
        let labels: Vec<&str> = a.effects.iter().map(|e| e.label.as_str()).collect();
        assert_eq!(labels, ["I", "A", "B", "AB"]);
        let q = |l: &str| a.effect(l).unwrap().estimate;
        assert_eq!((q("I"), q("A"), q("B"), q("AB")), (41.0, 21.5, 9.5, 5.0));
        assert_eq!(a.mean(), 41.0);
        assert!(close(a.ss_total, 7032.0, 1e-9));
        assert!(close(a.ss_error.unwrap(), 102.0, 1e-9));
        assert!(close(a.effect("A").unwrap().sum_of_squares, 5547.0, 1e-9));
        let pct = |l: &str| a.effect(l).unwrap().percent_variation.unwrap();
        assert!(close(pct("A"), 78.9, 0.05), "{}", pct("A"));
        assert!(close(pct("B"), 15.4, 0.05), "{}", pct("B"));
        assert!(close(pct("AB"), 4.3, 0.05), "{}", pct("AB"));
        assert!(close(a.error_percent_variation.unwrap(), 1.5, 0.05));
        assert_eq!(a.effect("I").unwrap().percent_variation, None);
        assert_eq!(a.error_df, 8);
        assert!(close(a.error_std_dev.unwrap(), 3.57, 0.005));
        assert!(close(a.t_value.unwrap(), 1.860, 5e-4));
        for e in &a.effects {
            let half = (e.ci_high.unwrap() - e.ci_low.unwrap()) / 2.0;
            assert!(close(half, 1.92, 0.005), "{}: ±{half}", e.label);
            assert_eq!(e.significant, Some(true));
        }
        // Jain's intervals: q0 (39.08, 42.91), qA (19.58, 23.41), qB (7.58, 11.41),
        // qAB (3.08, 6.91), to his rounding.
        let e = a.effect("AB").unwrap();
        assert!(close(e.ci_low.unwrap(), 3.08, 0.01) && close(e.ci_high.unwrap(), 6.91, 0.01));
        // The fitted model reproduces the run means (a full model has no lack of fit).
        for (i, m) in a.run_means.iter().enumerate() {
            assert!(close(a.predict(&run_levels(2, i)).unwrap(), *m, 1e-12));
        }
    }

    /// Jain, Example 17.1 (2², r = 1): A = memory size (4 MB/16 MB), B = cache size
    /// (1 KB/2 KB), MIPS 15, 45, 25, 75 → q0 = 40, qA = 20, qB = 10, qAB = 5;
    /// SST = 4·(400 + 100 + 25) = 2100 → 76.2 %, 19.0 %, 4.8 %.
    #[test]
    fn jain_example_17_1_without_replication() {
        let runs = [[15.0], [45.0], [25.0], [75.0]];
        let a = analyze(&["memory", "cache"], &runs, 0.90).unwrap();
        let labels: Vec<&str> = a.effects.iter().map(|e| e.label.as_str()).collect();
        assert_eq!(labels, ["I", "memory", "cache", "memory×cache"]);
        let q: Vec<f64> = a.effects.iter().map(|e| e.estimate).collect();
        assert_eq!(q, [40.0, 20.0, 10.0, 5.0]);
        let pct: Vec<f64> = a.effects[1..]
            .iter()
            .map(|e| e.percent_variation.unwrap())
            .collect();
        assert!(close(pct[0], 76.2, 0.05) && close(pct[1], 19.0, 0.05) && close(pct[2], 4.8, 0.05));
        assert!(close(pct.iter().sum::<f64>(), 100.0, 1e-9));
        // No replications: no error term, no intervals.
        assert_eq!(a.error_df, 0);
        assert_eq!(a.ss_error, None);
        assert_eq!(a.error_std_dev, None);
        assert_eq!(a.t_value, None);
        assert!(a
            .effects
            .iter()
            .all(|e| e.ci_low.is_none() && e.significant.is_none()));
    }

    #[test]
    fn three_factors_recover_a_known_model() {
        // y = 10 + 3A − 2B + 1·AC exactly, two identical replications → SSE = 0.
        let runs: Vec<Vec<f64>> = (0..8)
            .map(|i| {
                let x = |j: usize| if i >> j & 1 == 1 { 1.0 } else { -1.0 };
                let y = 10.0 + 3.0 * x(0) - 2.0 * x(1) + x(0) * x(2);
                vec![y, y]
            })
            .collect();
        let a = analyze(&["A", "B", "C"], &runs, 0.95).unwrap();
        let labels: Vec<&str> = a.effects.iter().map(|e| e.label.as_str()).collect();
        assert_eq!(labels, ["I", "A", "B", "AB", "C", "AC", "BC", "ABC"]);
        let q: Vec<f64> = a.effects.iter().map(|e| e.estimate).collect();
        assert_eq!(q, [10.0, 3.0, -2.0, 0.0, 0.0, 1.0, 0.0, 0.0]);
        assert_eq!(a.ss_error, Some(0.0));
        // 16·(9 + 4 + 1) = 224.
        assert!(close(a.ss_total, 224.0, 1e-9));
        assert_eq!(a.effect("AB").unwrap().significant, Some(false));
        assert_eq!(a.effect("AC").unwrap().factors, ["A", "C"]);
    }

    #[test]
    fn sign_table_of_2_2() {
        assert_eq!(
            sign_table(2).unwrap(),
            vec![
                vec![1, -1, -1, 1],
                vec![1, 1, -1, -1],
                vec![1, -1, 1, -1],
                vec![1, 1, 1, 1],
            ]
        );
        assert_eq!(run_levels(3, 5), [true, false, true]);
        // Columns are orthogonal.
        let t = sign_table(4).unwrap();
        for a in 0..16 {
            for b in 0..16 {
                let dot: i32 = t.iter().map(|row| i32::from(row[a] * row[b])).sum();
                assert_eq!(dot, if a == b { 16 } else { 0 });
            }
        }
    }

    #[test]
    fn bad_designs_are_errors() {
        assert!(analyze(&["A", "B"], &[[1.0], [2.0], [3.0]], 0.9).is_err());
        assert!(analyze(&["A"], &[vec![1.0, 2.0], vec![3.0]], 0.9).is_err());
        assert!(analyze(&["A"], &[Vec::<f64>::new(), Vec::new()], 0.9).is_err());
        assert!(analyze(&[], &[[1.0]], 0.9).is_err());
        assert!(analyze(&["A"], &[[1.0], [f64::NAN]], 0.9).is_err());
        assert!(analyze(&["A"], &[[1.0], [2.0]], 0.0).is_err());
        let a = analyze(&["A"], &[[1.0, 1.0], [1.0, 1.0]], 0.9).unwrap();
        assert_eq!(a.effect("A").unwrap().percent_variation, Some(0.0));
        assert!(a.predict(&[true, false]).is_err());
    }

    #[test]
    fn serializes_to_json() {
        let a = analyze(&["A"], &[[1.0, 2.0], [5.0, 6.0]], 0.9).unwrap();
        let json = serde_json::to_string(&a).unwrap();
        assert!(json.contains("\"label\":\"A\""), "{json}");
    }
}
