//! Builders for the plots and tables that `kvlab lab` reports (issue 4), so every report
//! labels its axes with units, pairs a model's prediction with its measurement, and says
//! when they disagree.

use crate::axis::format_value;
use crate::model::{
    Estimate, Histogram, HistogramSeries, HistogramY, Item, LinePlot, LineStyle, Note, Point, Row,
    Series, Table,
};
use serde::{Deserialize, Serialize};

/// One system or configuration measured against a variable (e.g. the number of clients).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Curve {
    /// The name in the legend.
    pub name: String,
    /// `(x, measured value with its confidence interval)`.
    pub points: Vec<(f64, Estimate)>,
}

impl Curve {
    fn series(&self, style: LineStyle, color: usize) -> Series {
        Series {
            name: self.name.clone(),
            style,
            color: Some(color),
            points: self.points.iter().map(|(x, e)| Point::at(*x, *e)).collect(),
        }
    }
}

/// Ticks at the measured x values when there are few of them (client counts such as
/// 1, 2, 4, ..., 64 read better than 1, 10, 100).
fn data_ticks(curves: &[Curve]) -> Option<Vec<(f64, String)>> {
    let mut xs: Vec<f64> = curves
        .iter()
        .flat_map(|c| c.points.iter().map(|p| p.0))
        .filter(|x| x.is_finite())
        .collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    (2..=12)
        .contains(&xs.len())
        .then(|| xs.into_iter().map(|x| (x, format_value(x))).collect())
}

/// Throughput against clients, one line per system/configuration, with CI error bars.
/// `ci` says what the bars are, e.g. "95% confidence interval".
pub fn throughput_vs_clients(curves: &[Curve], ci: &str) -> LinePlot {
    LinePlot {
        title: "Throughput vs clients".into(),
        x_label: "clients (N)".into(),
        x_ticks: data_ticks(curves),
        y_label: "throughput (req/s)".into(),
        y_from_zero: true,
        error_bars: Some(ci.into()),
        series: curves
            .iter()
            .enumerate()
            .map(|(i, c)| c.series(LineStyle::Solid, i))
            .collect(),
        ..LinePlot::default()
    }
}

/// Response time against clients: each measured curve (solid, with CI error bars) beside
/// the interactive law's prediction `R = N/X − Z` for it (dashed, same colour).
/// `predicted[i]` belongs to `measured[i]`; name them so the legend reads, e.g.
/// "epoll (interactive law)".
pub fn response_time_vs_clients(
    measured: &[Curve],
    predicted: &[Curve],
    latency_unit: &str,
    ci: &str,
) -> LinePlot {
    let mut series = Vec::new();
    for (i, m) in measured.iter().enumerate() {
        series.push(m.series(LineStyle::Solid, i));
        if let Some(p) = predicted.get(i) {
            series.push(p.series(LineStyle::Dashed, i));
        }
    }
    for (i, p) in predicted.iter().enumerate().skip(measured.len()) {
        series.push(p.series(LineStyle::Dashed, i));
    }
    LinePlot {
        title: "Response time vs clients: measured and interactive law".into(),
        x_label: "clients (N)".into(),
        x_ticks: data_ticks(measured),
        y_label: format!("mean response time ({latency_unit})"),
        y_from_zero: true,
        error_bars: Some(ci.into()),
        series,
        caption: Some(
            "Solid: measured. Dashed: predicted by the interactive response time law \
             R = N/X − Z from the measured throughput X and think time Z."
                .into(),
        ),
        ..LinePlot::default()
    }
}

/// The interactive response time law: `R = N/X − Z` (N clients, throughput X in requests
/// per second, think time Z in seconds); the result is in seconds.
pub fn interactive_law(clients: f64, throughput: f64, think_time: f64) -> f64 {
    clients / throughput - think_time
}

/// Latency percentiles at one level of a factor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// 25th percentile.
    pub p25: f64,
    /// Median.
    pub p50: f64,
    /// 75th percentile.
    pub p75: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
}

/// p25, p50, p75, p90 and p99 latency (one line each) against the levels of a factor,
/// drawn at equal spacing and labelled by the levels' names.
pub fn percentiles_vs_factor(
    title: &str,
    factor: &str,
    levels: &[(String, Percentiles)],
    latency_unit: &str,
) -> LinePlot {
    let names = ["p25", "p50", "p75", "p90", "p99"];
    let pick = |p: &Percentiles, k: usize| [p.p25, p.p50, p.p75, p.p90, p.p99][k];
    LinePlot {
        title: title.into(),
        x_label: factor.into(),
        y_label: format!("latency ({latency_unit})"),
        y_from_zero: true,
        x_ticks: Some(
            levels
                .iter()
                .enumerate()
                .map(|(i, (l, _))| (i as f64, l.clone()))
                .collect(),
        ),
        series: names
            .iter()
            .enumerate()
            .map(|(k, n)| Series {
                name: (*n).into(),
                points: levels
                    .iter()
                    .enumerate()
                    .map(|(i, (_, p))| Point::new(i as f64, pick(p, k)))
                    .collect(),
                ..Series::default()
            })
            .collect(),
        ..LinePlot::default()
    }
}

/// One interval of a trace run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct TracePoint {
    /// Seconds since the start of the run (end of the interval).
    pub t: f64,
    /// 95th-percentile latency in the interval.
    pub p95: f64,
    /// Requests per second completed in the interval.
    pub rate: f64,
}

/// p95 latency and request rate over time, as two stacked plots sharing the time axis.
pub fn trace_plots(name: &str, points: &[TracePoint], latency_unit: &str) -> [LinePlot; 2] {
    let ts = points.iter().map(|p| p.t).filter(|t| t.is_finite());
    let (lo, hi) = ts.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), t| {
        (a.min(t), b.max(t))
    });
    let x_range = (lo < hi).then_some((lo.min(0.0), hi));
    let plot = |title: String, y_label: String, y: &dyn Fn(&TracePoint) -> f64, color| LinePlot {
        title,
        x_label: "time (s)".into(),
        y_label,
        x_range,
        y_from_zero: true,
        series: vec![Series {
            name: name.into(),
            color: Some(color),
            points: points.iter().map(|p| Point::new(p.t, y(p))).collect(),
            ..Series::default()
        }],
        ..LinePlot::default()
    };
    [
        plot(
            format!("p95 latency over time: {name}"),
            format!("p95 latency ({latency_unit})"),
            &|p| p.p95,
            1,
        ),
        plot(
            format!("Request rate over time: {name}"),
            "rate (req/s)".into(),
            &|p| p.rate,
            0,
        ),
    ]
}

/// `buckets` logarithmically spaced buckets from `lo` to `hi` (both > 0), `buckets + 1` edges.
pub fn log_edges(lo: f64, hi: f64, buckets: usize) -> Vec<f64> {
    let (a, b) = (lo.ln(), hi.ln());
    (0..=buckets)
        .map(|i| (a + (b - a) * i as f64 / buckets as f64).exp())
        .collect()
}

/// `buckets` equal buckets from `lo` to `hi`, `buckets + 1` edges.
pub fn linear_edges(lo: f64, hi: f64, buckets: usize) -> Vec<f64> {
    (0..=buckets)
        .map(|i| lo + (hi - lo) * i as f64 / buckets as f64)
        .collect()
}

impl HistogramSeries {
    /// Counts samples into the buckets `[edges[i], edges[i+1])`; the rest go to `below` and
    /// `above`. NaN samples count as `above` so they are seen.
    pub fn from_samples(
        name: impl Into<String>,
        edges: &[f64],
        samples: impl IntoIterator<Item = f64>,
    ) -> HistogramSeries {
        HistogramSeries::from_weighted(name, edges, samples.into_iter().map(|v| (v, 1)))
    }

    /// Like [`from_samples`](Self::from_samples) for `(value, count)` pairs, e.g. an
    /// HdrHistogram's recorded values.
    pub fn from_weighted(
        name: impl Into<String>,
        edges: &[f64],
        values: impl IntoIterator<Item = (f64, u64)>,
    ) -> HistogramSeries {
        let n = edges.len().saturating_sub(1);
        let mut s = HistogramSeries {
            name: name.into(),
            counts: vec![0; n],
            below: 0,
            above: 0,
        };
        for (v, c) in values {
            if n == 0 || v.is_nan() || v >= edges[n] {
                s.above += c;
            } else if v < edges[0] {
                s.below += c;
            } else {
                // First edge greater than v, minus one: the bucket whose [low, high) holds v.
                let i = edges.partition_point(|e| *e <= v) - 1;
                s.counts[i.min(n - 1)] += c;
            }
        }
        s
    }
}

/// Latency histograms of several cases over the same buckets, as percent of each case.
pub fn latency_histogram(
    title: &str,
    latency_unit: &str,
    edges: Vec<f64>,
    cases: Vec<HistogramSeries>,
) -> Histogram {
    Histogram {
        title: title.into(),
        x_label: format!("latency ({latency_unit})"),
        edges,
        y: HistogramY::Percent,
        series: cases,
        caption: None,
    }
}

/// One row of the maximum-throughput table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MaxThroughput {
    /// The configuration.
    pub config: String,
    /// Its maximum throughput, with its confidence interval.
    pub max: Estimate,
    /// The number of clients at which the maximum was measured.
    pub at_clients: f64,
}

fn ci_cell(e: &Estimate) -> String {
    match (e.ci_low, e.ci_high) {
        (Some(l), Some(h)) => format!("[{}, {}]", format_value(l), format_value(h)),
        _ => "—".into(),
    }
}

/// Maximum throughput per configuration, highest first.
pub fn max_throughput_table(rows: &[MaxThroughput], ci: &str) -> Table {
    let mut rows: Vec<&MaxThroughput> = rows.iter().collect();
    rows.sort_by(|a, b| b.max.value.total_cmp(&a.max.value));
    Table {
        title: "Maximum throughput per configuration".into(),
        columns: vec![
            "configuration".into(),
            "max throughput (req/s)".into(),
            ci.into(),
            "at clients (N)".into(),
        ],
        rows: rows
            .iter()
            .map(|r| {
                Row::new([
                    r.config.clone(),
                    format_value(r.max.value),
                    ci_cell(&r.max),
                    format_value(r.at_clients),
                ])
            })
            .collect(),
        caption: None,
    }
}

/// A model's prediction of a measured quantity.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelCheck {
    /// What is predicted, with its conditions, e.g. "mean response time at N = 32".
    pub quantity: String,
    /// Which model, e.g. "interactive law", "M/M/1".
    pub model: String,
    /// The unit of both values.
    pub unit: String,
    /// The model's value.
    pub predicted: f64,
    /// The measured value with its confidence interval.
    pub measured: Estimate,
    /// Relative difference still called agreement when the prediction is outside the CI
    /// (0 = the CI alone decides; without a CI this is the only test).
    #[serde(default)]
    pub tolerance: f64,
}

impl ModelCheck {
    /// `(predicted − measured) / measured`.
    pub fn relative_error(&self) -> f64 {
        (self.predicted - self.measured.value) / self.measured.value
    }

    /// Whether the model disagrees with the measurement: the prediction lies outside the
    /// measurement's confidence interval and further than `tolerance` from it (a non-finite
    /// prediction or measurement always disagrees).
    pub fn disagrees(&self) -> bool {
        if !(self.predicted.is_finite() && self.measured.value.is_finite()) {
            return true;
        }
        let inside = self.measured.ci_low.is_some() && self.measured.contains(self.predicted);
        let close = self.relative_error().abs() <= self.tolerance;
        !(inside || close)
    }
}

/// Model against measurement: a table (disagreeing rows highlighted) followed by a warning
/// note naming every disagreement, or an info note saying all agree.
pub fn model_vs_measurement(checks: &[ModelCheck], ci: &str) -> Vec<Item> {
    let rows = checks
        .iter()
        .map(|c| {
            let bad = c.disagrees();
            let verdict = if bad {
                "DISAGREES".to_string()
            } else if c.measured.ci_low.is_some() && c.measured.contains(c.predicted) {
                format!("agrees (inside {ci})")
            } else {
                format!("agrees (within {:.0}%)", c.tolerance * 100.0)
            };
            Row::new([
                c.quantity.clone(),
                c.model.clone(),
                format!("{} {}", format_value(c.predicted), c.unit),
                format!("{} {}", format_value(c.measured.value), c.unit),
                ci_cell(&c.measured),
                format!("{:+.1}%", c.relative_error() * 100.0),
                verdict,
            ])
            .highlighted(bad)
        })
        .collect();
    let table = Table {
        title: "Model vs measurement".into(),
        columns: vec![
            "quantity".into(),
            "model".into(),
            "predicted".into(),
            "measured".into(),
            ci.into(),
            "model error".into(),
            "verdict".into(),
        ],
        rows,
        caption: Some(
            "Model error = (predicted − measured) / measured. Highlighted rows: the prediction \
             lies outside the measurement's confidence interval."
                .into(),
        ),
    };
    let bad: Vec<&ModelCheck> = checks.iter().filter(|c| c.disagrees()).collect();
    let note = if bad.is_empty() {
        Note::info(
            "Every model agrees with the measurement",
            format!(
                "All {} prediction(s) lie inside the measured {ci}.",
                checks.len()
            ),
        )
    } else {
        let lines: Vec<String> = bad
            .iter()
            .map(|c| {
                format!(
                    "{} ({}): predicted {} {}, measured {} {} {} — off by {:+.1}%.",
                    c.quantity,
                    c.model,
                    format_value(c.predicted),
                    c.unit,
                    format_value(c.measured.value),
                    c.unit,
                    ci_cell(&c.measured),
                    c.relative_error() * 100.0
                )
            })
            .collect();
        Note::warning(
            format!(
                "{} of {} model prediction(s) disagree with the measurement",
                bad.len(),
                checks.len()
            ),
            lines.join("\n\n"),
        )
    };
    vec![Item::Table(table), Item::Note(note)]
}

/// One term of a 2^k factorial design: a factor, an interaction or the error.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Effect {
    /// "A", "B", "AB", ..., or "error".
    pub name: String,
    /// What the letters stand for, e.g. "I/O model (epoll / threads)".
    #[serde(default)]
    pub description: String,
    /// The effect q_i in the response's unit (none for the error term).
    #[serde(default)]
    pub effect: Option<Estimate>,
    /// Fraction of the total variation it explains, in [0, 1].
    pub fraction: f64,
}

/// Allocation of variation of a 2^k design, largest share first, with a total row. An
/// effect whose confidence interval contains zero is marked not significant.
pub fn allocation_of_variation_table(response: &str, unit: &str, effects: &[Effect]) -> Table {
    let mut effects: Vec<&Effect> = effects.iter().collect();
    effects.sort_by(|a, b| b.fraction.total_cmp(&a.fraction));
    let mut rows: Vec<Row> = effects
        .iter()
        .map(|e| {
            let (q, ci, sig) = match &e.effect {
                Some(q) => {
                    let sig = match (q.ci_low, q.ci_high) {
                        (Some(l), Some(h)) if l <= 0.0 && h >= 0.0 => "no (CI contains 0)",
                        (Some(_), Some(_)) => "yes",
                        _ => "—",
                    };
                    (format_value(q.value), ci_cell(q), sig)
                }
                None => ("—".into(), "—".into(), "—"),
            };
            Row::new([
                e.name.clone(),
                e.description.clone(),
                q,
                ci,
                format!("{:.1}%", e.fraction * 100.0),
                sig.into(),
            ])
        })
        .collect();
    let total: f64 = effects.iter().map(|e| e.fraction).sum();
    rows.push(
        Row::new([
            "total".to_string(),
            String::new(),
            String::new(),
            String::new(),
            format!("{:.1}%", total * 100.0),
            String::new(),
        ])
        // A total far from 100% means the allocation is wrong: say so.
        .highlighted((total - 1.0).abs() > 0.005),
    );
    Table {
        title: format!("2^k allocation of variation: {response}"),
        columns: vec![
            "term".into(),
            "factor levels".into(),
            format!("effect ({unit})"),
            "confidence interval".into(),
            "variation explained".into(),
            "significant".into(),
        ],
        rows,
        caption: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_fall_in_half_open_buckets() {
        let edges = linear_edges(0.0, 10.0, 10);
        assert_eq!(edges.len(), 11);
        let s = HistogramSeries::from_samples(
            "x",
            &edges,
            [-1.0, 0.0, 0.999, 1.0, 9.999, 10.0, f64::NAN],
        );
        assert_eq!(s.below, 1);
        assert_eq!(s.above, 2);
        assert_eq!(s.counts[0], 2);
        assert_eq!(s.counts[1], 1);
        assert_eq!(s.counts[9], 1);
        assert_eq!(s.counts.iter().sum::<u64>() + s.below + s.above, 7);
    }

    #[test]
    fn log_edges_span_the_range() {
        let e = log_edges(10.0, 100_000.0, 12);
        assert_eq!(e.len(), 13);
        assert!((e[0] - 10.0).abs() < 1e-9 && (e[12] - 100_000.0).abs() < 1e-6);
        assert!(e.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn histograms_with_too_few_buckets_are_flagged() {
        let h = latency_histogram("h", "µs", linear_edges(0.0, 1.0, 5), vec![]);
        assert!(h.problems().iter().any(|p| p.contains("at least 10")));
        let edges = linear_edges(0.0, 1.0, 10);
        let h = latency_histogram(
            "h",
            "µs",
            edges.clone(),
            vec![HistogramSeries::from_samples("a", &edges, [0.5])],
        );
        assert!(h.problems().is_empty(), "{:?}", h.problems());
    }

    #[test]
    fn model_disagreement_is_flagged_and_said() {
        let ok = ModelCheck {
            quantity: "R at N=8".into(),
            model: "interactive law".into(),
            unit: "ms".into(),
            predicted: 1.02,
            measured: Estimate::with_ci(1.0, 0.95, 1.05),
            tolerance: 0.0,
        };
        let bad = ModelCheck {
            predicted: 2.0,
            ..ok.clone()
        };
        assert!(!ok.disagrees());
        assert!(bad.disagrees());
        let close = ModelCheck {
            tolerance: 1.5,
            ..bad.clone()
        };
        assert!(!close.disagrees());
        let nan = ModelCheck {
            predicted: f64::NAN,
            ..ok.clone()
        };
        assert!(nan.disagrees());

        let items = model_vs_measurement(&[ok.clone(), bad], "95% CI");
        let Item::Table(t) = &items[0] else {
            panic!("table first")
        };
        assert_eq!(t.rows.iter().filter(|r| r.highlight).count(), 1);
        let Item::Note(n) = &items[1] else {
            panic!("note second")
        };
        assert_eq!(n.level, crate::model::Level::Warning);
        assert!(n.text.contains("+100.0%"), "{}", n.text);

        let items = model_vs_measurement(&[ok], "95% CI");
        let Item::Note(n) = &items[1] else {
            panic!("note second")
        };
        assert_eq!(n.level, crate::model::Level::Info);
    }

    #[test]
    fn allocation_table_sorts_and_totals() {
        let t = allocation_of_variation_table(
            "throughput",
            "req/s",
            &[
                Effect {
                    name: "B".into(),
                    fraction: 0.2,
                    effect: Some(Estimate::with_ci(-5.0, -9.0, -1.0)),
                    ..Effect::default()
                },
                Effect {
                    name: "A".into(),
                    fraction: 0.7,
                    effect: Some(Estimate::with_ci(10.0, 6.0, 14.0)),
                    ..Effect::default()
                },
                Effect {
                    name: "AB".into(),
                    fraction: 0.05,
                    effect: Some(Estimate::with_ci(1.0, -3.0, 5.0)),
                    ..Effect::default()
                },
                Effect {
                    name: "error".into(),
                    fraction: 0.05,
                    ..Effect::default()
                },
            ],
        );
        let names: Vec<&str> = t.rows.iter().map(|r| r.cells[0].as_str()).collect();
        assert_eq!(names, ["A", "B", "AB", "error", "total"]);
        assert_eq!(t.rows[2].cells[5], "no (CI contains 0)");
        assert_eq!(t.rows[4].cells[4], "100.0%");
        assert!(!t.rows[4].highlight);
        assert!(t.problems().is_empty());
    }

    #[test]
    fn interactive_law() {
        assert!((super::interactive_law(10.0, 1000.0, 0.005) - 0.005).abs() < 1e-12);
    }

    #[test]
    fn trace_plots_share_the_time_axis() {
        let pts: Vec<TracePoint> = (1..=30)
            .map(|i| TracePoint {
                t: i as f64,
                p95: 100.0 + i as f64,
                rate: 1000.0,
            })
            .collect();
        let [a, b] = trace_plots("run", &pts, "µs");
        assert_eq!(a.x_range, b.x_range);
        assert_eq!(a.x_range, Some((0.0, 30.0)));
        assert!(a.y_label.contains("µs") && b.y_label.contains("req/s"));
    }
}
