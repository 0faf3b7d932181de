//! Percentiles over a window from a server's cumulative histograms (kvlab's `stats
//! latency`): each reading gives, per histogram, a count, a sum and cumulative counts
//! under fixed bounds (`<name>_le_<µs>`), all only growing; the difference of two
//! readings is the histogram of what happened between them.

/// One reading of one cumulative histogram.
#[derive(Debug, Clone, PartialEq)]
pub struct Cumulative {
    /// Values counted since the start.
    pub count: u64,
    /// Their sum, µs.
    pub sum_us: u64,
    /// (upper bound µs, values at most that), bounds increasing.
    pub le: Vec<(u64, u64)>,
}

/// What happened between two readings.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    /// Values counted in the window.
    pub count: u64,
    /// Their sum, µs.
    pub sum_us: u64,
    /// (upper bound µs, values of the window at most that).
    pub le: Vec<(u64, u64)>,
}

impl Cumulative {
    /// The histogram named `prefix` in `stats` lines (`prefix_count`, `prefix_sum_us`,
    /// `prefix_le_<bound>`); `None` if its count or sum is missing.
    pub fn parse(prefix: &str, stats: &[(String, String)]) -> Option<Cumulative> {
        let mut count = None;
        let mut sum_us = None;
        let mut le = Vec::new();
        for (name, value) in stats {
            let Some(rest) = name.strip_prefix(prefix).and_then(|r| r.strip_prefix('_')) else {
                continue;
            };
            let Ok(v) = value.parse::<u64>() else {
                continue;
            };
            match rest {
                "count" => count = Some(v),
                "sum_us" => sum_us = Some(v),
                _ => {
                    if let Some(bound) = rest.strip_prefix("le_").and_then(|b| b.parse().ok()) {
                        le.push((bound, v));
                    }
                }
            }
        }
        le.sort_unstable();
        Some(Cumulative {
            count: count?,
            sum_us: sum_us?,
            le,
        })
    }

    /// The window from `earlier` to this reading; `None` when the two do not fit (a count
    /// went down: the server restarted or its stats were reset; other bounds).
    pub fn since(&self, earlier: &Cumulative) -> Option<Window> {
        if self.count < earlier.count
            || self.sum_us < earlier.sum_us
            || self.le.len() != earlier.le.len()
        {
            return None;
        }
        let le = self
            .le
            .iter()
            .zip(&earlier.le)
            .map(|(&(b, n), &(b0, n0))| (b == b0 && n >= n0).then_some((b, n - n0)))
            .collect::<Option<Vec<_>>>()?;
        Some(Window {
            count: self.count - earlier.count,
            sum_us: self.sum_us - earlier.sum_us,
            le,
        })
    }
}

impl Window {
    /// The `q` quantile (0..=1), µs: the bucket where the rank falls, interpolated linearly
    /// within it (from the previous bound, or 0); past the last bound, the last bound (the
    /// most that can be said). `None` for an empty window.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = (q.clamp(0.0, 1.0) * self.count as f64).max(1.0);
        let mut lower = (0u64, 0u64);
        for &(bound, below) in &self.le {
            if below as f64 >= rank {
                let (b0, n0) = lower;
                let inside = (below - n0) as f64;
                let frac = if inside > 0.0 {
                    (rank - n0 as f64) / inside
                } else {
                    1.0
                };
                return Some(b0 as f64 + frac * (bound - b0) as f64);
            }
            lower = (bound, below);
        }
        Some(lower.0 as f64)
    }

    /// The mean value, µs.
    pub fn mean_us(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum_us as f64 / self.count as f64)
    }
}

/// Follows one histogram from reading to reading, giving each window.
#[derive(Debug, Clone, Default)]
pub struct Differ {
    last: Option<Cumulative>,
}

impl Differ {
    /// Takes a reading; the window since the previous one (none for the first, or after a
    /// reset).
    pub fn next(&mut self, now: Cumulative) -> Option<Window> {
        let w = self.last.as_ref().and_then(|prev| now.since(prev));
        self.last = Some(now);
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(prefix: &str, count: u64, sum: u64, le: &[(u64, u64)]) -> Vec<(String, String)> {
        let mut v = vec![
            (format!("{prefix}_count"), count.to_string()),
            (format!("{prefix}_sum_us"), sum.to_string()),
        ];
        v.extend(
            le.iter()
                .map(|(b, n)| (format!("{prefix}_le_{b}"), n.to_string())),
        );
        v.push(("curr_connections".into(), "3".into()));
        v
    }

    #[test]
    fn parses_one_histogram_among_others() {
        let mut st = lines("service_time", 10, 55, &[(1, 2), (10, 9), (100, 10)]);
        st.extend(lines("loop_wait", 4, 8, &[(1, 1), (10, 4), (100, 4)]));
        let c = Cumulative::parse("service_time", &st).expect("parsed");
        assert_eq!(c.count, 10);
        assert_eq!(c.sum_us, 55);
        assert_eq!(c.le, vec![(1, 2), (10, 9), (100, 10)]);
        let w = Cumulative::parse("loop_wait", &st).expect("parsed");
        assert_eq!(w.le, vec![(1, 1), (10, 4), (100, 4)]);
        assert_eq!(Cumulative::parse("nothing", &st), None);
    }

    #[test]
    fn the_window_is_the_difference_and_ignores_what_came_before() {
        // 1000 fast requests (≤ 10 µs) before the window; in it, 100 of which 10 took
        // 500..1000 µs: the window's p95 lies in the slow bucket although the cumulative
        // one would be ≤ 10 µs.
        let before = Cumulative {
            count: 1000,
            sum_us: 5000,
            le: vec![(10, 1000), (500, 1000), (1000, 1000)],
        };
        let after = Cumulative {
            count: 1100,
            sum_us: 5000 + 90 * 5 + 10 * 800,
            le: vec![(10, 1090), (500, 1090), (1000, 1100)],
        };
        let w = after.since(&before).expect("window");
        assert_eq!(w.count, 100);
        assert_eq!(w.le, vec![(10, 90), (500, 90), (1000, 100)]);
        // Rank 95 is the 5th of the 10 in (500, 1000]: halfway.
        assert_eq!(w.quantile(0.95), Some(750.0));
        // Rank 50 is the 50th of 90 in (0, 10].
        let p50 = w.quantile(0.5).expect("p50");
        assert!((p50 - 10.0 * 50.0 / 90.0).abs() < 1e-9, "{p50}");
        assert_eq!(w.quantile(1.0), Some(1000.0));
        assert_eq!(w.mean_us(), Some(84.5));
    }

    #[test]
    fn past_the_last_bound_is_the_last_bound_and_empty_is_none() {
        let w = Window {
            count: 10,
            sum_us: 10_000,
            le: vec![(10, 1), (100, 2)],
        };
        assert_eq!(w.quantile(0.95), Some(100.0));
        let empty = Window {
            count: 0,
            sum_us: 0,
            le: vec![(10, 0)],
        };
        assert_eq!(empty.quantile(0.95), None);
        assert_eq!(empty.mean_us(), None);
    }

    #[test]
    fn a_reset_or_other_bounds_give_no_window() {
        let a = Cumulative {
            count: 10,
            sum_us: 10,
            le: vec![(1, 10)],
        };
        let reset = Cumulative {
            count: 2,
            sum_us: 2,
            le: vec![(1, 2)],
        };
        assert_eq!(reset.since(&a), None);
        let other = Cumulative {
            count: 12,
            sum_us: 12,
            le: vec![(2, 12)],
        };
        assert_eq!(other.since(&a), None);
        let mut d = Differ::default();
        assert_eq!(d.next(a.clone()), None);
        assert_eq!(d.next(reset.clone()), None);
        let later = Cumulative {
            count: 5,
            sum_us: 5,
            le: vec![(1, 5)],
        };
        assert_eq!(d.next(later).map(|w| w.count), Some(3));
    }
}
