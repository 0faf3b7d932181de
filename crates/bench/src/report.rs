//! Output: the terminal summary, JSON (whole runs and every interval), CSV (intervals), and
//! the side-by-side comparison of several targets. Every figure names its unit.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::run::{IntervalRow, RunResult};
use crate::stats::Percentiles;

pub use kvlab_measure::{interval_json, median};

/// One target's medians over its repeats.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TargetSummary {
    /// The target.
    pub target: String,
    /// Number of runs.
    pub runs: usize,
    /// Median throughput, requests/s.
    pub throughput_qps: f64,
    /// Median of the runs' mean latency (from planned send), µs.
    pub mean_us: f64,
    /// Median of the runs' p50, µs.
    pub p50_us: f64,
    /// Median of the runs' p99, µs.
    pub p99_us: f64,
    /// Median of the runs' p99.9, µs.
    pub p99_9_us: f64,
    /// Throughput relative to the first target.
    pub throughput_ratio: f64,
    /// p99 relative to the first target.
    pub p99_ratio: f64,
    /// Mean latency relative to the first target.
    pub mean_ratio: f64,
}

/// Per-target medians, in order of first appearance, with ratios to the first target.
pub fn compare(runs: &[RunResult]) -> Vec<TargetSummary> {
    let mut targets: Vec<String> = Vec::new();
    for r in runs {
        if !targets.contains(&r.target) {
            targets.push(r.target.clone());
        }
    }
    let mut out: Vec<TargetSummary> = targets
        .iter()
        .map(|t| {
            let mine: Vec<&RunResult> = runs.iter().filter(|r| &r.target == t).collect();
            let pick = |f: &dyn Fn(&RunResult) -> f64| {
                let mut v: Vec<f64> = mine.iter().map(|r| f(r)).collect();
                median(&mut v)
            };
            TargetSummary {
                target: t.clone(),
                runs: mine.len(),
                throughput_qps: pick(&|r| r.throughput_qps),
                mean_us: pick(&|r| r.latency.mean_us),
                p50_us: pick(&|r| r.latency.p50_us),
                p99_us: pick(&|r| r.latency.p99_us),
                p99_9_us: pick(&|r| r.latency.p99_9_us),
                throughput_ratio: 1.0,
                p99_ratio: 1.0,
                mean_ratio: 1.0,
            }
        })
        .collect();
    if let Some(base) = out.first().cloned() {
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
        for s in &mut out {
            s.throughput_ratio = ratio(s.throughput_qps, base.throughput_qps);
            s.p99_ratio = ratio(s.p99_us, base.p99_us);
            s.mean_ratio = ratio(s.mean_us, base.mean_us);
        }
    }
    out
}

fn lat_line(out: &mut String, label: &str, p: &Percentiles) {
    let _ = write!(out, "  {label:<16}");
    for (_, v) in p.columns() {
        let _ = write!(out, "{v:>10.1}");
    }
    out.push('\n');
}

fn lat_header(out: &mut String) {
    let _ = write!(out, "  {:<16}", "latency (µs)");
    for (name, _) in Percentiles::default().columns() {
        let _ = write!(out, "{name:>10}");
    }
    out.push('\n');
}

/// The terminal summary of one run.
pub fn summary(r: &RunResult) -> String {
    let c = &r.config;
    let mut out = String::new();
    let model = match c.open {
        None => format!(
            "closed loop, depth {}{}",
            c.depth,
            if c.think_us > 0 {
                format!(", think {} µs", c.think_us)
            } else {
                String::new()
            }
        ),
        Some(a) => format!(
            "open loop ({a:?} arrivals, at most {} in flight per connection)",
            c.depth
        ),
    };
    let _ = writeln!(
        out,
        "target {}: {model}; {} participant(s) × {} thread(s) × {} connection(s)",
        r.target, r.participants, c.threads, c.connections
    );
    if let Some(d) = c.workload.data_set.summary() {
        let _ = writeln!(out, "  {}", d.text());
    }
    if let Some(l) = &r.load {
        let _ = writeln!(out, "  load phase: {} keys set", l.completed);
    }
    let k = &r.counters;
    let _ = writeln!(
        out,
        "  measured {:.2} s: {} requests, {:.1} req/s; gets {} (hits {}, misses {}), sets {}, deletes {}",
        r.duration_s, k.completed, r.throughput_qps, k.gets, k.hits, k.misses, k.sets, k.deletes
    );
    let _ = writeln!(
        out,
        "  errors {} (verification {}), timeouts {}, sent {}{}",
        k.errors,
        k.verify_errors,
        k.timeouts,
        k.sent,
        if k.redirects > 0 {
            format!(", cluster redirects followed {}", k.redirects)
        } else {
            String::new()
        }
    );
    lat_header(&mut out);
    lat_line(&mut out, "from planned", &r.latency);
    lat_line(&mut out, "from send", &r.latency_send);
    let by_op = r.latency_by_op.present();
    if by_op.len() > 1 {
        for (kind, p) in by_op {
            lat_line(&mut out, &format!("{}s (planned)", kind.name()), p);
        }
    }
    if r.steps.len() > 1 {
        let _ = writeln!(
            out,
            "  {:>4} {:>12} {:>12} {:>10} {:>10} {:>10} {:>10}  (rates req/s, latency µs from planned)",
            "step", "target", "achieved", "p50", "p99", "p99.9", "p99 send"
        );
        for s in &r.steps {
            let _ = writeln!(
                out,
                "  {:>4} {:>12} {:>12.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
                s.step,
                s.target_qps.map_or("-".into(), |t| format!("{t:.0}")),
                s.achieved_qps,
                s.latency.p50_us,
                s.latency.p99_us,
                s.latency.p99_9_us,
                s.latency_send.p99_us
            );
        }
    }
    if let Some(g) = &r.gaps {
        let ks = match (g.ks_d, g.ks_critical) {
            (Some(d), Some(c)) => format!(", KS D {d:.4} vs Exp(1) (critical {c:.4})"),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "  inter-arrival check of actual sends: {} gaps, mean {:.3} × planned, CV {:.3}{ks}",
            g.n, g.mean, g.cv
        );
    }
    let cpu: Vec<String> = r
        .thread_cpu
        .iter()
        .map(|u| format!("{:.0} %", u * 100.0))
        .collect();
    let _ = writeln!(
        out,
        "  generator CPU per thread (% of one core): {}",
        cpu.join(", ")
    );
    for n in &r.notes {
        let _ = writeln!(out, "  note: {n}");
    }
    for w in &r.warnings {
        let _ = writeln!(out, "  WARNING: {w}");
    }
    out
}

/// The comparison table of several targets.
pub fn comparison_table(s: &[TargetSummary]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<24} {:>5} {:>14} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9}",
        "target (medians)",
        "runs",
        "req/s",
        "mean µs",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "req/s ×",
        "p99 ×"
    );
    for t in s {
        let _ = writeln!(
            out,
            "{:<24} {:>5} {:>14.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>9.3} {:>9.3}",
            t.target,
            t.runs,
            t.throughput_qps,
            t.mean_us,
            t.p50_us,
            t.p99_us,
            t.p99_9_us,
            t.throughput_ratio,
            t.p99_ratio
        );
    }
    let _ = writeln!(out, "(ratios are relative to the first target)");
    out
}

/// The whole output as JSON: every run (with its intervals and steps) and the comparison.
pub fn to_json(runs: &[RunResult], comparison: &[TargetSummary]) -> String {
    #[derive(Serialize)]
    struct Doc<'a> {
        units: &'a str,
        runs: &'a [RunResult],
        comparison: &'a [TargetSummary],
    }
    let doc = Doc {
        units:
            "rates in requests/s, latencies in µs, ts_* in ms since the Unix epoch, durations in s",
        runs,
        comparison,
    };
    serde_json::to_string_pretty(&doc).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// The CSV header of [`csv_row`].
pub const CSV_HEADER: &str = "run,target,ts_start,ts_end,warmup,step,target_qps,achieved_qps,completed,hits,misses,errors,timeouts,p25_us,p50_us,p75_us,p90_us,p95_us,p99_us,p99_9_us,p99_99_us,max_us,mean_us,send_p50_us,send_p99_us,send_p99_9_us,send_max_us";

/// One interval as a CSV line (no newline).
pub fn csv_row(run: usize, target: &str, i: &IntervalRow) -> String {
    let l = &i.latency;
    let s = &i.latency_send;
    format!(
        "{run},{target},{},{},{},{},{},{:.1},{},{},{},{},{},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1}",
        i.ts_start,
        i.ts_end,
        i.warmup,
        i.step,
        i.target_qps.map_or(String::new(), |t| format!("{t:.1}")),
        i.achieved_qps,
        i.counters.completed,
        i.counters.hits,
        i.counters.misses,
        i.counters.errors,
        i.counters.timeouts,
        l.p25_us,
        l.p50_us,
        l.p75_us,
        l.p90_us,
        l.p95_us,
        l.p99_us,
        l.p99_9_us,
        l.p99_99_us,
        l.max_us,
        l.mean_us,
        s.p50_us,
        s.p99_us,
        s.p99_9_us,
        s.max_us
    )
}

/// All intervals of all runs as CSV.
pub fn to_csv(runs: &[RunResult]) -> String {
    let mut out = String::from(CSV_HEADER);
    out.push('\n');
    for (n, r) in runs.iter().enumerate() {
        for i in &r.intervals {
            out.push_str(&csv_row(n, &r.target, i));
            out.push('\n');
        }
    }
    out
}

/// A one-line progress report for an interval.
pub fn progress_line(i: &IntervalRow, elapsed_s: f64, total_s: f64) -> String {
    let width = 20usize;
    let filled = if total_s > 0.0 {
        ((elapsed_s / total_s).min(1.0) * width as f64) as usize
    } else {
        0
    };
    format!(
        "[{}{}] {:>6.1}/{:.0} s {:>10.0} req/s  p50 {:>8.1} µs  p99 {:>8.1} µs{}",
        "#".repeat(filled),
        " ".repeat(width - filled),
        elapsed_s,
        total_s,
        i.achieved_qps,
        i.latency.p50_us,
        i.latency.p99_us,
        if i.warmup { "  (warm-up)" } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&mut []), 0.0);
    }

    #[test]
    fn csv_header_matches_rows() {
        let row = IntervalRow {
            ts_start: 1,
            ts_end: 2,
            warmup: false,
            step: 0,
            target_qps: None,
            achieved_qps: 1.0,
            counters: Default::default(),
            latency: Default::default(),
            latency_send: Default::default(),
            latency_hist: None,
        };
        assert_eq!(
            csv_row(0, "t", &row).split(',').count(),
            CSV_HEADER.split(',').count()
        );
    }
}
