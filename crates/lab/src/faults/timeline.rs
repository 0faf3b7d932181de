//! The timeline of one faults run: operations per interval by outcome, the nemesis's
//! actions and the anomalies as marks, anomalies per interval on the right-hand axis.

use kvlab_faults::{AnomalyKind, History, Outcome};
use kvlab_report::{LinePlot, LineStyle, Mark, Point, Series, Y2};

/// When an anomaly happened, in seconds since its run's start: a stale read or a value never
/// written when its read returned; a lost write when the write it lost was acknowledged.
pub(super) fn anomaly_time(a: &kvlab_faults::Anomaly) -> Option<f64> {
    let read = a.ops.first()?;
    let ns = if a.kind == AnomalyKind::LostWrite && read.final_read {
        a.ops
            .iter()
            .skip(1)
            .filter(|o| o.outcome == Outcome::Ok && o.kind == kvlab_faults::OpKind::Write)
            .map(|o| o.complete_ns)
            .max()
            .unwrap_or(read.complete_ns)
    } else {
        read.complete_ns
    };
    Some(ns as f64 / 1e9)
}

/// An anomaly's kind as the report names it.
pub(super) fn kind_name(k: AnomalyKind) -> &'static str {
    match k {
        AnomalyKind::LostWrite => "lost write",
        AnomalyKind::StaleRead => "stale read",
        AnomalyKind::NeverWritten => "never written",
    }
}

/// A node's name without the address every node shares (`127.0.0.1:7102` → `:7102`).
fn short(target: &str) -> &str {
    target.strip_prefix("127.0.0.1").unwrap_or(target)
}

/// Most bins a timeline has (a longer run gets wider ones).
const MAX_BINS: usize = 600;
/// Most nemesis marks on one timeline (the first ones; the table of the run has them all).
const MAX_MARKS: usize = 60;
/// Most anomalies marked one by one on a timeline (all are counted on its right axis).
const MAX_ANOMALY_MARKS: usize = 12;

/// The timeline of one run: operations per interval by outcome (by when they completed),
/// the final reads, the nemesis's actions as marks, anomalies on the right axis.
pub(super) fn timeline(
    title: &str,
    h: &History,
    anomalies: &[kvlab_faults::Anomaly],
    interval: f64,
) -> LinePlot {
    let end_ns = h
        .ops
        .iter()
        .map(|o| o.complete_ns)
        .chain(h.nemesis.iter().map(|e| e.end_ns))
        .filter(|&t| t != u64::MAX)
        .max()
        .unwrap_or(0);
    let end = end_ns as f64 / 1e9;
    let mut dt = interval;
    if end / dt > MAX_BINS as f64 {
        dt = end / MAX_BINS as f64;
    }
    let bins = ((end / dt).ceil() as usize).max(1);
    let bin = |s: f64| ((s / dt) as usize).min(bins - 1);
    // ok, failed, unknown, final reads
    let mut counts = vec![[0u64; 4]; bins];
    for o in &h.ops {
        let b = bin(o.complete_ns as f64 / 1e9);
        let i = if o.final_read {
            3
        } else {
            match o.outcome {
                Outcome::Ok => 0,
                Outcome::Failed => 1,
                Outcome::Unknown => 2,
            }
        };
        counts[b][i] += 1;
    }
    let series = |name: &str, i: usize, color: usize, style: LineStyle| Series {
        name: name.into(),
        style,
        color: Some(color),
        points: counts
            .iter()
            .enumerate()
            .map(|(b, c)| Point::new((b as f64 + 1.0) * dt, c[i] as f64))
            .collect(),
    };
    let mut lines = vec![
        series("ok", 0, 0, LineStyle::Solid),
        series("failed", 1, 6, LineStyle::Solid),
        series("unknown", 2, 3, LineStyle::Solid),
    ];
    if h.ops.iter().any(|o| o.final_read) {
        lines.push(series("final reads", 3, 2, LineStyle::Dashed));
    }
    let mut marks: Vec<Mark> = h
        .nemesis
        .iter()
        .filter(|e| {
            !e.detail
                .as_deref()
                .is_some_and(|d| d.starts_with(kvlab_faults::nemesis::SKIPPED))
        })
        .take(MAX_MARKS)
        .map(|e| Mark {
            x: e.start_ns as f64 / 1e9,
            label: format!(
                "{} {}{}",
                e.what,
                short(&e.target),
                if e.ok { "" } else { " FAILED" }
            )
            .trim_end()
            .to_string(),
        })
        .collect();
    let mut times: Vec<(f64, &kvlab_faults::Anomaly)> = anomalies
        .iter()
        .filter_map(|a| anomaly_time(a).map(|t| (t, a)))
        .collect();
    times.sort_by(|a, b| a.0.total_cmp(&b.0));
    if times.len() <= MAX_ANOMALY_MARKS {
        marks.extend(times.iter().map(|(t, a)| Mark {
            x: *t,
            label: format!("{} {}", kind_name(a.kind).to_uppercase(), a.key),
        }));
    }
    let y2 = (!times.is_empty()).then(|| {
        let mut per = vec![0u64; bins];
        for (t, _) in &times {
            per[bin(*t)] += 1;
        }
        Y2 {
            label: "anomalies per interval".into(),
            series: vec![Series {
                name: "anomalies".into(),
                color: Some(1),
                points: per
                    .iter()
                    .enumerate()
                    .map(|(b, n)| Point::new((b as f64 + 1.0) * dt, *n as f64))
                    .collect(),
                ..Series::default()
            }],
        }
    });
    let caption = format!(
        "Operations completed per {dt:.2} s interval, by outcome (ok: acknowledged; failed: \
         certainly not applied; unknown: sent, then no answer), and the final reads after \
         the heal. Marks: the nemesis's actions as they began{}.{}",
        if times.is_empty() || times.len() > MAX_ANOMALY_MARKS {
            ""
        } else {
            ", and each anomaly (upper case: a stale read or a value never written when its \
             read returned, a lost write when the write it lost was acknowledged)"
        },
        if times.is_empty() {
            " The checker found no anomaly."
        } else {
            " Right axis (red): anomalies per interval."
        }
    );
    LinePlot {
        title: title.into(),
        x_label: "time since the run's start (s)".into(),
        y_label: format!("operations per {dt:.2} s"),
        x_range: Some((0.0, (bins as f64 * dt).max(dt))),
        y_from_zero: true,
        series: lines,
        y2,
        marks,
        caption: Some(caption),
        ..LinePlot::default()
    }
}
