//! The report of a scaling experiment: the time series with each event marked, a table of
//! what each event cost, and the summary `kvlab lab` prints.

use std::path::{Path, PathBuf};

use kvlab_report::{Item, LinePlot, Mark, Note, Point, Report, Row, Section, Series, Table, Y2};

use super::{EventRecord, IntervalPoint, ScalingResult};

/// What the clients saw after an event: errors from its start until the next event (or
/// the run's end), and until when they lasted.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Aftermath {
    /// Errors and timeouts in the intervals that end after the event began and begin
    /// before the next one.
    errors: u64,
    /// Seconds from the event's start to the end of the last of those intervals with an
    /// error (0: none): how long some keys could not be served.
    unavailable_s: f64,
}

/// The length of one interval of the time series, s (they are equal but the last).
fn interval_s(intervals: &[IntervalPoint]) -> f64 {
    match intervals {
        [] => 0.0,
        [only] => only.t,
        [a, b, ..] => b.t - a.t,
    }
}

/// What the clients saw after event `e`.
fn aftermath(res: &ScalingResult, e: &EventRecord) -> Aftermath {
    let dt = interval_s(&res.intervals);
    let next = res
        .events
        .iter()
        .map(|x| x.started)
        .filter(|&s| s > e.started)
        .fold(f64::INFINITY, f64::min);
    let mut a = Aftermath::default();
    for i in &res.intervals {
        if i.t > e.started && i.t - dt < next {
            a.errors += i.errors;
            if i.errors > 0 {
                a.unavailable_s = i.t - e.started;
            }
        }
    }
    a
}

/// An event's marks on the time series: where it began and where it was over.
fn event_marks(events: &[EventRecord]) -> Vec<Mark> {
    let mut marks = Vec::new();
    for e in events {
        marks.push(Mark {
            x: e.started,
            label: format!("{} {}", e.action, e.node),
        });
        let over = match (e.action.as_str(), &e.error) {
            (_, Some(_)) => format!("{} failed", e.action),
            ("kill", None) => "ring healed".to_string(),
            (a, None) => format!("{a} done"),
        };
        marks.push(Mark {
            x: e.finished,
            label: over,
        });
    }
    marks
}

/// Writes the report; returns the summary and `index.html`'s path.
pub(super) fn write(out: &Path, res: &ScalingResult) -> anyhow::Result<(String, PathBuf)> {
    let t = &res.totals;
    let lost = t.verify_errors + t.misses;
    let report = Report {
        title: format!("kvlab lab: {}", res.name),
        subtitle: Some("A kvlab cluster under a verified load while nodes come and go".into()),
        metadata: vec![
            ("kvlab".into(), env!("CARGO_PKG_VERSION").into()),
            ("commit".into(), crate::runner::commit().into()),
            ("keys".into(), res.keys.to_string()),
        ],
        sections: vec![
            Section {
                title: "Over time".into(),
                text: vec![format!(
                    "Every key was set before the run and every hit is verified: a miss or a \
                     wrong value is a lost write. {} requests, {} client errors, {} timeouts, \
                     {} lost writes.",
                    t.completed, t.errors, t.timeouts, lost
                )],
                items: over_time_items(res),
            },
            Section {
                title: "Events".into(),
                text: vec![
                    "Keys moved are the items copied by the migration's snapshots, as a share of \
                     the items in the cluster before it; expected: 1/(N+1) for an add to N \
                     nodes, the node's own share for a remove. A kill has no migration: it took \
                     until the ring no longer listed the node. Client errors after an event are \
                     those of the intervals from its start to the next event (or the run's \
                     end); they were seen for as long as the last such interval with an error \
                     ends after the event's start: how long some keys could not be served."
                        .into(),
                ],
                items: events_items(res),
            },
        ],
    };
    let files = kvlab_report::write_report(out.join("report"), &report)?;
    Ok((summary_text(res), files.index))
}

/// One value per interval of the time series.
fn points(res: &ScalingResult, f: &dyn Fn(&IntervalPoint) -> f64) -> Vec<Point> {
    res.intervals
        .iter()
        .map(|i| Point::new(i.t, f(i)))
        .collect()
}

/// "Over time": warnings for failed events and lost writes, then the throughput and errors
/// timeline, the p99 latency and the errors, each with the events marked.
fn over_time_items(res: &ScalingResult) -> Vec<Item> {
    let marks = event_marks(&res.events);
    let span = res.intervals.last().map_or(1.0, |i| i.t);
    let plot = |title: &str, y: &str, name: &str, f: &dyn Fn(&IntervalPoint) -> f64| {
        Item::LinePlot(LinePlot {
            title: title.into(),
            x_label: "time (s)".into(),
            y_label: y.into(),
            x_range: Some((0.0, span)),
            y_from_zero: true,
            series: vec![Series {
                name: name.into(),
                points: points(res, f),
                ..Series::default()
            }],
            marks: marks.clone(),
            caption: Some("Marks: each event's start and its end.".into()),
            ..LinePlot::default()
        })
    };
    let timeline = Item::LinePlot(LinePlot {
        title: "Throughput and errors over time".into(),
        x_label: "time (s)".into(),
        y_label: "throughput (req/s)".into(),
        x_range: Some((0.0, span)),
        y_from_zero: true,
        series: vec![Series {
            name: "completed (req/s)".into(),
            points: points(res, &|i| i.qps),
            ..Series::default()
        }],
        y2: Some(Y2 {
            label: "errors + timeouts per interval".into(),
            series: vec![Series {
                name: "errors + timeouts".into(),
                color: Some(1),
                points: points(res, &|i| i.errors as f64),
                ..Series::default()
            }],
        }),
        marks: marks.clone(),
        caption: Some(format!(
            "Per {:.1} s interval. Marks: each event's start (the action and its node) and \
             its end (a migration done, or the ring healed: the killed node no longer in \
             it).",
            interval_s(&res.intervals)
        )),
        ..LinePlot::default()
    });
    let t = &res.totals;
    let lost = t.verify_errors + t.misses;
    let mut over_time = vec![timeline];
    if lost > 0 {
        over_time.insert(
            0,
            Item::Note(Note::warning(
                "Acknowledged writes lost",
                format!(
                    "{lost} reads found a key missing or with a wrong value ({} misses, {} \
                     wrong values): writes the cluster had acknowledged were lost.",
                    t.misses, t.verify_errors
                ),
            )),
        );
    }
    for e in res.events.iter().filter(|e| e.error.is_some()) {
        over_time.insert(
            0,
            Item::Note(Note::warning(
                format!("{} {} at {:.1} s failed", e.action, e.node, e.started),
                e.error.clone().unwrap_or_default(),
            )),
        );
    }
    over_time.push(plot("p99 latency", "p99 (µs)", "p99", &|i| i.p99_us));
    over_time.push(plot(
        "Errors",
        "errors per interval",
        "errors + timeouts",
        &|i| i.errors as f64,
    ));
    over_time
}

/// The event's node, and its host when placed on one (`10.0.0.5:21000 on s1`).
fn node_on(e: &EventRecord) -> String {
    match &e.host {
        Some(h) => format!("{} on {h}", e.node),
        None => e.node.clone(),
    }
}

/// "Events": a row per event, the whole run's totals, where the cluster ran (placed on
/// hosts), and the run's notes.
fn events_items(res: &ScalingResult) -> Vec<Item> {
    let mut events_items = vec![
        Item::Table(events_table(res)),
        Item::Table(totals_table(res)),
    ];
    if !res.hosts.is_empty() {
        let mut rows: Vec<Row> = res
            .placed
            .iter()
            .map(|p| {
                Row::new([
                    p.name.clone(),
                    p.host.clone(),
                    p.pid.to_string(),
                    p.netns.map_or("-".into(), |n| n.to_string()),
                ])
            })
            .collect();
        if let Some(p) = &res.etcd {
            rows.push(Row::new([
                "etcd".into(),
                p.host.clone(),
                p.pid.to_string(),
                p.netns.map_or("-".into(), |n| n.to_string()),
            ]));
        }
        events_items.push(Item::Table(Table {
            title: format!("Hosts: where the nodes ran (topology: {})", res.topology),
            columns: ["process", "host", "pid", "network namespace"]
                .map(String::from)
                .to_vec(),
            rows,
            ..Table::default()
        }));
    }
    if !res.notes.is_empty() {
        events_items.push(Item::Note(Note::info(
            "Notes of the run",
            res.notes.join("; "),
        )));
    }
    events_items
}

/// A row per event: when, how long, what moved and how fast, the client errors after it.
fn events_table(res: &ScalingResult) -> Table {
    let mut rows = Vec::new();
    for e in &res.events {
        let m = e.migration.as_ref();
        let moved = m.map_or(0, |m| m.keys_copied);
        let after = aftermath(res, e);
        rows.push(
            Row::new([
                format!("{:.1}", e.started),
                format!("{} {}", e.action, node_on(e)),
                format!("{:.3}", e.finished - e.started),
                m.map_or("-".into(), |m| {
                    format!("{:.3} / {:.3}", m.copy_s, m.handoff_s)
                }),
                m.map_or("-".into(), |_| moved.to_string()),
                m.map_or("-".into(), |_| {
                    format!(
                        "{:.1}% (expected {:.1}%)",
                        // Keys moved of the keys held (the items over their copies).
                        100.0 * moved as f64 * f64::from(res.replicas.max(1))
                            / e.items_before.max(1) as f64,
                        100.0 * e.expected_fraction
                    )
                }),
                m.map_or("-".into(), |m| {
                    format!("{:.1}", m.bytes_sent as f64 / 1e6 / m.total_s.max(1e-9))
                }),
                after.errors.to_string(),
                format!("{:.1}", after.unavailable_s),
                e.error.clone().unwrap_or_else(|| "ok".into()),
            ])
            .highlighted(e.error.is_some()),
        );
    }
    Table {
        title: "Events".into(),
        columns: [
            "at (s)",
            "event",
            "took (s)",
            "copy / hand-off (s)",
            "keys moved",
            "share moved",
            "MB/s",
            "client errors after it",
            "errors seen for (s)",
            "outcome",
        ]
        .map(String::from)
        .to_vec(),
        rows,
        ..Table::default()
    }
}

/// The whole run's counters in one row (highlighted when writes were lost).
fn totals_table(res: &ScalingResult) -> Table {
    let t = &res.totals;
    let lost = t.verify_errors + t.misses;
    Table {
        title: "The whole run".into(),
        columns: [
            "requests",
            "client errors",
            "timeouts",
            "lost writes (wrong values + misses)",
            "redirects followed",
        ]
        .map(String::from)
        .to_vec(),
        rows: vec![Row::new([
            t.completed.to_string(),
            t.errors.to_string(),
            t.timeouts.to_string(),
            lost.to_string(),
            t.redirects.to_string(),
        ])
        .highlighted(lost > 0)],
        ..Table::default()
    }
}

/// What `kvlab lab` prints: the run's totals, then a line per event.
fn summary_text(res: &ScalingResult) -> String {
    let t = &res.totals;
    let lost = t.verify_errors + t.misses;
    let mut summary = format!(
        "{}: {} requests, {} client errors, {} timeouts, {} lost writes, {} redirects followed\n",
        res.name, t.completed, t.errors, t.timeouts, lost, t.redirects
    );
    for e in &res.events {
        let after = aftermath(res, e);
        summary.push_str(&format!(
            "  {:>5.1} s {} {}: {:.3} s{}; {} client errors after it, seen for {:.1} s{}\n",
            e.started,
            e.action,
            node_on(e),
            e.finished - e.started,
            e.migration
                .as_ref()
                .map(|m| format!(
                    ", {} keys moved ({:.1}% of {}; expected {:.1}%)",
                    m.keys_copied,
                    100.0 * m.keys_copied as f64 / e.items_before.max(1) as f64,
                    e.items_before,
                    100.0 * e.expected_fraction
                ))
                .unwrap_or_default(),
            after.errors,
            after.unavailable_s,
            e.error
                .as_ref()
                .map(|x| format!(" FAILED: {x}"))
                .unwrap_or_default()
        ));
    }
    summary
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(t: f64, errors: u64) -> IntervalPoint {
        IntervalPoint {
            t,
            qps: 100.0,
            errors,
            ..IntervalPoint::default()
        }
    }

    #[test]
    fn the_share_moved_is_of_the_keys_held_whatever_their_copies() {
        for (replicas, items_before, share) in [(1, 20_000, "25.0%"), (2, 40_000, "25.0%")] {
            let res = ScalingResult {
                replicas,
                events: vec![EventRecord {
                    action: "add".into(),
                    items_before,
                    expected_fraction: 0.25,
                    migration: Some(kvlab_cluster::coordinator::MigrationReport {
                        keys_copied: 5_000,
                        ..Default::default()
                    }),
                    ..EventRecord::default()
                }],
                ..ScalingResult::default()
            };
            let t = events_table(&res);
            assert_eq!(t.rows[0].cells[5], format!("{share} (expected 25.0%)"));
        }
    }

    #[test]
    fn an_events_errors_are_counted_until_the_next_event() {
        let res = ScalingResult {
            intervals: [0, 0, 3, 0, 2, 0, 1, 0]
                .iter()
                .enumerate()
                .map(|(i, &e)| point(0.5 * (i + 1) as f64, e))
                .collect(),
            events: vec![
                EventRecord {
                    action: "kill".into(),
                    started: 1.2,
                    finished: 2.1,
                    ..EventRecord::default()
                },
                EventRecord {
                    action: "add".into(),
                    started: 3.0,
                    finished: 3.4,
                    ..EventRecord::default()
                },
            ],
            ..ScalingResult::default()
        };
        // The kill: intervals ending at 1.5 .. 3.0 (the one ending at 3.5 began at 3.0).
        let a = aftermath(&res, &res.events[0]);
        assert_eq!(a.errors, 5);
        assert!((a.unavailable_s - (2.5 - 1.2)).abs() < 1e-9, "{a:?}");
        let b = aftermath(&res, &res.events[1]);
        assert_eq!(b.errors, 1);
        assert!((b.unavailable_s - 0.5).abs() < 1e-9, "{b:?}");
        let marks = event_marks(&res.events);
        assert_eq!(marks.len(), 4);
        assert_eq!(marks[1].label, "ring healed");
        assert_eq!(marks[3].label, "add done");
    }
}
