//! Axis ranges, tick positions and tick labels.

use crate::model::Scale;

/// A numeric axis: the data range widened to round ticks, and a mapping to pixels.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Axis {
    pub scale: Scale,
    /// Axis bounds in data units (for `Log10`, both > 0).
    pub lo: f64,
    pub hi: f64,
    /// Tick positions in data units with their labels.
    pub ticks: Vec<(f64, String)>,
}

impl Axis {
    /// An axis covering `[lo, hi]` (data units) with about `target` ticks. For a linear axis
    /// the bounds are widened to the ticks; a flat range is widened around its value.
    pub fn new(scale: Scale, lo: f64, hi: f64, target: usize) -> Axis {
        match scale {
            Scale::Linear => {
                let (lo, hi, step) = nice_range(lo, hi, target);
                let n = ((hi - lo) / step).round() as usize;
                let ticks = (0..=n)
                    .map(|i| {
                        let v = lo + step * i as f64;
                        // Snap -0.0 and float dust to the grid so labels read "0", not "-0".
                        let v = (v / step).round() * step;
                        (v, format_tick(v, step))
                    })
                    .collect();
                Axis {
                    scale,
                    lo,
                    hi,
                    ticks,
                }
            }
            Scale::Log10 => {
                let lo = if lo > 0.0 && lo.is_finite() { lo } else { 1.0 };
                let hi = if hi > lo && hi.is_finite() {
                    hi
                } else {
                    lo * 10.0
                };
                let d0 = lo.log10().floor() as i32;
                let d1 = (hi.log10().ceil() as i32).max(d0 + 1);
                // Enough ticks to read values off: decades alone when there are many,
                // 1-2-5 within them when fewer than four decade ticks would show.
                let ticks_with = |mantissas: &[f64]| -> Vec<(f64, String)> {
                    let mut ticks = Vec::new();
                    for d in d0..=d1 {
                        for &m in mantissas {
                            let v = m * 10f64.powi(d);
                            if v >= lo * 0.999_999 && v <= hi * 1.000_001 {
                                ticks.push((v, format_tick(v, v)));
                            }
                        }
                    }
                    ticks
                };
                let mut ticks = ticks_with(&[1.0]);
                if ticks.len() < 4 {
                    ticks = ticks_with(&[1.0, 2.0, 5.0]);
                }
                // Widen to whole decades when that keeps ticks readable.
                let (lo, hi) = if ticks.len() < 2 {
                    let (a, b) = (10f64.powi(d0), 10f64.powi(d1));
                    ticks = vec![(a, format_tick(a, a)), (b, format_tick(b, b))];
                    (a, b)
                } else {
                    (lo, hi)
                };
                Axis {
                    scale,
                    lo,
                    hi,
                    ticks,
                }
            }
        }
    }

    /// An axis with exactly the bounds `[lo, hi]` (lo < hi; > 0 for `Log10`), its ticks the
    /// round values inside them.
    pub fn fixed(scale: Scale, lo: f64, hi: f64, target: usize) -> Axis {
        let mut a = Axis::new(scale, lo, hi, target);
        let step = match scale {
            Scale::Linear => nice_range(lo, hi, target).2,
            Scale::Log10 => 1.0,
        };
        a.ticks
            .retain(|(v, _)| *v >= lo - step * 1e-9 && *v <= hi + step * 1e-9);
        a.lo = lo;
        a.hi = hi;
        a
    }

    /// Position of `v` in `[0, 1]` along the axis (outside for values out of range).
    pub fn frac(&self, v: f64) -> f64 {
        match self.scale {
            Scale::Linear => (v - self.lo) / (self.hi - self.lo),
            Scale::Log10 => (v.log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10()),
        }
    }
}

/// Round bounds and step for `[lo, hi]` with about `target` intervals (1-2-5 steps).
pub(crate) fn nice_range(lo: f64, hi: f64, target: usize) -> (f64, f64, f64) {
    let (mut lo, mut hi) = if lo.is_finite() && hi.is_finite() {
        (lo.min(hi), lo.max(hi))
    } else {
        (0.0, 1.0)
    };
    if hi - lo <= f64::EPSILON * hi.abs().max(1.0) {
        // A flat series: show it in the middle of a unit-ish range.
        let pad = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
        lo -= pad;
        hi += pad;
    }
    let raw = (hi - lo) / target.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let nlo = (lo / step).floor() * step;
    let nhi = (hi / step).ceil() * step;
    (nlo, nhi, step)
}

/// A tick label: `step` decides the decimals; large values get a k/M/G suffix.
pub(crate) fn format_tick(v: f64, step: f64) -> String {
    if v == 0.0 {
        return "0".to_string();
    }
    let (div, suffix) = match v.abs().max(step.abs()) {
        a if a >= 1e9 => (1e9, "G"),
        a if a >= 1e6 => (1e6, "M"),
        a if a >= 1e4 => (1e3, "k"),
        _ => (1.0, ""),
    };
    let s = step.abs() / div;
    let decimals = if s >= 1.0 || s == 0.0 {
        0
    } else {
        ((-s.log10()).ceil() as usize).min(9)
    };
    // 2.5-steps need one more digit than their magnitude says.
    let decimals = if ((s * 10f64.powi(decimals as i32)).round() - s * 10f64.powi(decimals as i32))
        .abs()
        > 1e-6
    {
        decimals + 1
    } else {
        decimals
    };
    format!("{:.*}{suffix}", decimals, v / div)
}

/// A value for a table cell: integers above 1000, otherwise 3 significant digits.
pub fn format_value(v: f64) -> String {
    if !v.is_finite() {
        return format!("{v}");
    }
    let a = v.abs();
    if a >= 1000.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        let decimals = (2 - a.log10().floor() as i32).clamp(0, 12) as usize;
        format!("{v:.decimals$}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(a: &Axis) -> Vec<&str> {
        a.ticks.iter().map(|(_, l)| l.as_str()).collect()
    }

    #[test]
    fn linear_ticks_are_round_and_cover_the_data() {
        let a = Axis::new(Scale::Linear, 0.0, 97.0, 5);
        assert_eq!((a.lo, a.hi), (0.0, 100.0));
        assert_eq!(labels(&a), ["0", "20", "40", "60", "80", "100"]);

        let a = Axis::new(Scale::Linear, 0.0, 123_456.0, 5);
        assert_eq!(labels(&a), ["0", "25k", "50k", "75k", "100k", "125k"]);

        let a = Axis::new(Scale::Linear, 0.013, 0.049, 4);
        assert_eq!(labels(&a), ["0.01", "0.02", "0.03", "0.04", "0.05"]);
        assert!(a.lo <= 0.013 && a.hi >= 0.049);

        let a = Axis::new(Scale::Linear, -3.0, 3.0, 6);
        assert!(labels(&a).contains(&"0"));
        assert!(!labels(&a).iter().any(|l| l.starts_with("-0")));
    }

    #[test]
    fn flat_and_bad_ranges_still_make_an_axis() {
        let a = Axis::new(Scale::Linear, 5.0, 5.0, 5);
        assert!(a.lo < 5.0 && a.hi > 5.0 && a.ticks.len() >= 2);
        let a = Axis::new(Scale::Linear, 0.0, 0.0, 5);
        assert!(a.lo <= 0.0 && a.hi > 0.0);
        let a = Axis::new(Scale::Linear, f64::NAN, 1.0, 5);
        assert!(a.lo.is_finite() && a.hi.is_finite() && a.lo < a.hi);
    }

    #[test]
    fn fixed_axis_keeps_its_bounds() {
        let a = Axis::fixed(Scale::Linear, 3.0, 117.0, 5);
        assert_eq!((a.lo, a.hi), (3.0, 117.0));
        assert_eq!(labels(&a), ["25", "50", "75", "100"]);
    }

    #[test]
    fn log_ticks() {
        let a = Axis::new(Scale::Log10, 1.0, 1000.0, 5);
        assert_eq!(labels(&a), ["1", "10", "100", "1000"]);
        let a = Axis::new(Scale::Log10, 1.0, 64.0, 5);
        assert_eq!(labels(&a), ["1", "2", "5", "10", "20", "50"]);
        assert!((a.frac(1.0)).abs() < 1e-12 && (a.frac(64.0) - 1.0).abs() < 1e-12);
        let a = Axis::new(Scale::Log10, 3.0, 4.0, 5);
        assert!(a.ticks.len() >= 2);
    }

    #[test]
    fn tick_labels() {
        assert_eq!(format_tick(2_000_000.0, 500_000.0), "2.0M");
        assert_eq!(format_tick(2_500_000.0, 500_000.0), "2.5M");
        assert_eq!(format_tick(0.25, 0.25), "0.25");
        assert_eq!(format_tick(7.5, 2.5), "7.5");
        assert_eq!(format_tick(1500.0, 500.0), "1500");
    }

    #[test]
    fn table_values() {
        assert_eq!(format_value(123_456.7), "123457");
        assert_eq!(format_value(12.345), "12.3");
        assert_eq!(format_value(0.012_34), "0.0123");
        assert_eq!(format_value(0.0), "0");
        assert_eq!(format_value(32.0), "32");
        assert_eq!(format_value(f64::NAN), "NaN");
    }
}
