//! Reading a control experiment's results back and writing its report: a table of the
//! policies compared (and each job's runtime), then per run its latency and its server's
//! cores over time.

use std::path::{Path, PathBuf};

use anyhow::Context;
use kvlab_bench::run::IntervalRow;
use kvlab_control::app::Outcome;
use kvlab_control::event::{read_log, Event, What};
use kvlab_control::sensor::LiveFile;
use kvlab_control::summary::{self, Segment};
use kvlab_report::{Item, LinePlot, Mark, Point, Report, Row, Section, Series, Table, Y2};

use super::{WorkflowMeta, WorkflowRun, WorkflowSpec};

/// The static split the others are compared with: among the static policies without idle
/// jobs whose every run finished its jobs, the one that gives the server the most cores;
/// (its name, its mean jobs' total time).
fn static_reference(runs: &[WorkflowRun], system: &str, interval: &str) -> Option<(String, f64)> {
    let mut by: Vec<(String, usize, Vec<Option<f64>>)> = Vec::new();
    for r in runs
        .iter()
        .filter(|r| r.system == system && format!("{}", r.qps_interval) == interval)
    {
        let Some(o) = &r.outcome else { continue };
        if o.policy != "static" || o.idle_jobs {
            continue;
        }
        let cores = o.server_cores_max;
        match by.iter_mut().find(|(n, _, _)| *n == r.policy) {
            Some((_, _, v)) => v.push(o.summary.total_s.filter(|_| o.summary.jobs.len() == o.jobs)),
            None => by.push((
                r.policy.clone(),
                cores,
                vec![o.summary.total_s.filter(|_| o.summary.jobs.len() == o.jobs)],
            )),
        }
    }
    by.into_iter()
        .filter(|(_, _, v)| v.iter().all(Option::is_some))
        .max_by_key(|(_, c, _)| *c)
        .map(|(n, _, v)| (n, mean_sd(&v.into_iter().flatten().collect::<Vec<_>>()).0))
}

/// Mean and sample standard deviation (NaN for none, sd 0 for one).
pub fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let m = v.iter().sum::<f64>() / n;
    let sd = if v.len() > 1 {
        (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    (m, sd)
}

fn pm(v: &[f64], digits: usize) -> String {
    let (m, sd) = mean_sd(v);
    if m.is_nan() {
        "-".into()
    } else {
        format!("{m:.digits$} ± {sd:.digits$}")
    }
}

/// Reads a control experiment's results and writes its report (`report/`); returns the
/// index page's path.
pub fn analyse(dir: &Path) -> anyhow::Result<PathBuf> {
    let meta: WorkflowMeta = serde_json::from_str(
        &std::fs::read_to_string(dir.join("meta.json")).context("reading meta.json")?,
    )?;
    let spec = WorkflowSpec::parse(&meta.text)?;
    let runs = read_runs(dir)?;
    let mut report = report_head(&spec, &meta);
    let window = spec.window_ms() as f64 / 1000.0;
    report.sections.push(policies_section(&runs, window));
    if let Some(sec) = calibration_section(dir, &spec) {
        report.sections.push(sec);
    }
    if !meta.hosts.is_empty() {
        let readings: Vec<&crate::placement::HostCpu> =
            runs.iter().flat_map(|r| &r.hosts).collect();
        let table = crate::analyse::hosts::hosts_table(
            &meta.hosts,
            &readings,
            "load (from the load's start to its end)",
            &mut String::new(),
        );
        report.sections.push(Section {
            title: "Hosts".into(),
            text: Vec::new(),
            items: vec![Item::Table(table)],
        });
    }
    for r in &runs {
        report.sections.push(run_section(dir, r, spec.slo()));
    }
    let files = kvlab_report::write_report(dir.join("report"), &report)?;
    Ok(files.index)
}

/// The runs stored in `raw/`, in their order.
fn read_runs(dir: &Path) -> anyhow::Result<Vec<WorkflowRun>> {
    let mut runs: Vec<WorkflowRun> = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("raw"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    for f in files {
        runs.push(serde_json::from_str(&std::fs::read_to_string(&f)?)?);
    }
    Ok(runs)
}

/// The report with its title and metadata (the trace, the SLO) and no sections yet.
fn report_head(spec: &WorkflowSpec, meta: &WorkflowMeta) -> Report {
    let slo = spec.slo();
    let mut report = Report {
        title: format!(
            "kvlab control: {}",
            spec.name
                .clone()
                .unwrap_or_else(|| "control workflow".into())
        ),
        subtitle: spec.description.clone(),
        metadata: meta.facts.clone(),
        sections: Vec::new(),
    };
    report.metadata.push((
        "trace".into(),
        format!(
            "{}..{} req/s, new rate every {:?} s, seeds {:?}, at most {} s",
            spec.qps_min, spec.qps_max, spec.qps_intervals, spec.seeds, spec.duration
        ),
    ));
    let window = spec.window_ms() as f64 / 1000.0;
    report.metadata.push((
        "SLO".into(),
        format!(
            "p95 ≤ {slo} µs per trace segment of the load (over all its requests); also per \
             100 ms interval and per {window} s window"
        ),
    ));
    report
}

/// "Policies compared": a row per system × interval × policy, each job's runtime, and the
/// failed runs.
fn policies_section(runs: &[WorkflowRun], window: f64) -> Section {
    let mut summary = Section {
        title: "Policies compared".into(),
        text: vec![
            "Each row: the runs of one policy (one per seed). The jobs' total time is the \
             first job's start to the last job's end. Violations are counted over the \
             jobs' span three ways: the trace segments (one data point per segment of the \
             load's rate trace, its p95 over all its requests, as the generator reports \
             it; a segment partly inside the span counts) — the headline; the load's \
             100 ms intervals, each judged on its own p95, which is stricter (a burst \
             that a segment's p95 absorbs still counts); and windows, each on the p95 of \
             all its requests. Each job's runtime excludes its paused time. Every run set \
             (system × trace interval × seed) ends with a baseline: the same trace with no \
             jobs; the jobs' cost is a run's violated segments less the baseline's among the \
             same segments (summed over the seeds); with `baselines` ≥ 2 the row \"no jobs \
             (again)\" is the same trace with no jobs once more, its cost column the machine's \
             own spread against the first no-jobs run (net, and the segments whose verdicts \
             differ): the noise floor of every jobs' cost beside it. The idle-capacity bound is the time from \
             the jobs' first start until the idle cores the load left in the baseline \
             (/proc/stat's idle time of the shared CPUs) add up to the jobs' work alone on \
             one core (jobs-alone.json)."
                .into(),
        ],
        items: Vec::new(),
    };
    let mut rows = Vec::new();
    let mut job_rows = Vec::new();
    let mut keys: Vec<(String, String, String)> = Vec::new();
    for r in runs {
        let k = (
            r.system.clone(),
            format!("{}", r.qps_interval),
            r.policy.clone(),
        );
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    for (system, interval, policy) in &keys {
        let of: Vec<&WorkflowRun> = runs
            .iter()
            .filter(|r| {
                &r.system == system
                    && &format!("{}", r.qps_interval) == interval
                    && &r.policy == policy
            })
            .collect();
        let ok: Vec<&Outcome> = of.iter().filter_map(|r| r.outcome.as_ref()).collect();
        rows.push(policy_row(runs, (system, interval, policy), &of, &ok));
        job_rows.extend(job_runtime_rows((system, interval, policy), &ok));
    }
    let window_column = format!("violations (% of {window} s windows)");
    summary.items.push(Item::Table(Table {
        title: "Jobs' total time and SLO violations by policy".into(),
        columns: [
            "system",
            "trace interval (s)",
            "policy",
            "runs ok",
            "jobs' total time (s, mean ± sd)",
            "total time / static's",
            "violations (% of trace segments)",
            "highest segment p95 (µs)",
            "violations (% of 100 ms intervals)",
            window_column.as_str(),
            "violated segments with jobs / without (baseline) / jobs' cost",
            "jobs' cost (% of segments)",
            "idle-capacity bound (s)",
            "jobs' total / idle bound",
            "core changes",
            "pauses",
            "server CPU (cores)",
            "server's own p95 (µs)",
            "load's send lag p95 (µs)",
        ]
        .map(String::from)
        .to_vec(),
        rows,
        caption: Some(
            "The last three columns are the regime over the jobs' span: the server's CPU \
             (mean of the controller's samples), its own p95 (kvlab's `stats latency`, \
             median of the samples'; none for memcached) and how late the load generator \
             sent (planned send to sent, p95, median of its intervals'). The load's p95 is \
             timed from the planned send, so when the generator shares a CPU with the \
             jobs its lag is part of every violation."
                .into(),
        ),
    }));
    summary.items.push(Item::Table(Table {
        title: "Each job's runtime without pauses".into(),
        columns: [
            "system",
            "trace interval (s)",
            "policy",
            "job",
            "runtime (s)",
            "paused (s)",
        ]
        .map(String::from)
        .to_vec(),
        rows: job_rows,
        caption: None,
    }));
    let failed: Vec<String> = runs
        .iter()
        .filter_map(|r| r.error.as_ref().map(|e| format!("run {}: {e}", r.index)))
        .collect();
    if !failed.is_empty() {
        summary.items.push(Item::Note(kvlab_report::Note::warning(
            "failed runs",
            failed.join("; "),
        )));
    }
    summary
}

/// One row of the policies' table: the runs `of` one system × interval × policy, `ok`
/// their outcomes.
fn policy_row(
    runs: &[WorkflowRun],
    (system, interval, policy): (&String, &String, &String),
    of: &[&WorkflowRun],
    ok: &[&Outcome],
) -> Row {
    let total: Vec<f64> = ok.iter().filter_map(|o| o.summary.total_s).collect();
    let ratio = static_reference(runs, system, interval)
        .map(|(name, b)| match mean_sd(&total).0 {
            a if a.is_finite() && b > 0.0 => format!("{:.2} (vs {name})", a / b),
            _ => "-".into(),
        })
        .unwrap_or_else(|| "-".into());
    let seg: Vec<f64> = ok
        .iter()
        .filter_map(|o| o.summary.segment_violation_ratio.map(|v| v * 100.0))
        .collect();
    let worst: Vec<f64> = ok
        .iter()
        .filter_map(|o| {
            o.summary
                .segments
                .iter()
                .map(|s| s.p95_us)
                .max_by(f64::total_cmp)
        })
        .collect();
    let viol: Vec<f64> = ok
        .iter()
        .map(|o| o.summary.violation_ratio * 100.0)
        .collect();
    let wviol: Vec<f64> = of
        .iter()
        .filter(|r| r.outcome.is_some() && r.slo_windows > 0)
        .map(|r| r.slo_window_violations as f64 / r.slo_windows as f64 * 100.0)
        .collect();
    let costs: Vec<&kvlab_control::summary::Cost> =
        of.iter().filter_map(|r| r.cost.as_ref()).collect();
    let sum = |f: fn(&kvlab_control::summary::Cost) -> i64| costs.iter().map(|c| f(c)).sum::<i64>();
    let (with, without, diff, n, differ) = (
        sum(|c| c.with_jobs as i64),
        sum(|c| c.without_jobs as i64),
        sum(|c| c.difference),
        sum(|c| c.segments as i64),
        sum(|c| c.differing as i64),
    );
    let cost_text = if costs.is_empty() {
        ("-".to_string(), "-".to_string())
    } else {
        (
            format!("{with} / {without} / {diff} of {n} ({differ} differ)"),
            if n > 0 {
                format!("{:.2}", diff as f64 / n as f64 * 100.0)
            } else {
                "-".into()
            },
        )
    };
    let bounds: Vec<f64> = of
        .iter()
        .filter_map(|r| r.idle_bound.as_ref().map(|b| b.bound_s))
        .collect();
    let over_bound: Vec<f64> = of
        .iter()
        .filter_map(|r| {
            let t = r.outcome.as_ref()?.summary.total_s?;
            Some(t / r.idle_bound.as_ref()?.bound_s)
        })
        .collect();
    let changes: Vec<f64> = ok.iter().map(|o| o.summary.core_changes as f64).collect();
    let pauses: Vec<f64> = ok.iter().map(|o| o.summary.pauses as f64).collect();
    let regime = |f: fn(&kvlab_control::summary::Regime) -> Option<f64>| -> Vec<f64> {
        ok.iter().filter_map(|o| f(&o.summary.regime)).collect()
    };
    Row::new([
        system.clone(),
        interval.clone(),
        policy.clone(),
        format!("{}/{}", ok.len(), of.len()),
        pm(&total, 1),
        ratio,
        pm(&seg, 2),
        pm(&worst, 0),
        pm(&viol, 2),
        pm(&wviol, 2),
        cost_text.0,
        cost_text.1,
        pm(&bounds, 1),
        pm(&over_bound, 2),
        pm(&changes, 0),
        pm(&pauses, 0),
        pm(&regime(|g| g.server_cpu), 2),
        pm(&regime(|g| g.server_p95_us), 0),
        pm(&regime(|g| g.send_lag_p95_us), 0),
    ])
}

/// Each job's runtime and paused time over the outcomes `ok` of one system × interval ×
/// policy: a row per job, in the order the jobs first appear.
fn job_runtime_rows(
    (system, interval, policy): (&String, &String, &String),
    ok: &[&Outcome],
) -> Vec<Row> {
    let mut names: Vec<String> = Vec::new();
    for o in ok {
        for j in &o.summary.jobs {
            if !names.contains(&j.name) {
                names.push(j.name.clone());
            }
        }
    }
    let mut job_rows = Vec::new();
    for n in names {
        let rt: Vec<f64> = ok
            .iter()
            .flat_map(|o| o.summary.jobs.iter().filter(|j| j.name == n))
            .map(|j| j.runtime_s)
            .collect();
        let paused: Vec<f64> = ok
            .iter()
            .flat_map(|o| o.summary.jobs.iter().filter(|j| j.name == n))
            .map(|j| j.paused_s)
            .collect();
        job_rows.push(Row::new([
            system.clone(),
            interval.clone(),
            policy.clone(),
            n,
            pm(&rt, 2),
            pm(&paused, 2),
        ]));
    }
    job_rows
}

/// "Capacity calibrated here": each system's calibration of the run set (its
/// `calibration-<system>.json`), if any.
fn calibration_section(dir: &Path, spec: &WorkflowSpec) -> Option<Section> {
    let mut rows = Vec::new();
    for sys in &spec.systems {
        let Ok(text) = std::fs::read_to_string(dir.join(format!("calibration-{}.json", sys.name)))
        else {
            continue;
        };
        let Ok(c) = serde_json::from_str::<kvlab_control::calibrate::Calibration>(&text) else {
            continue;
        };
        for s in &c.scans {
            rows.push(Row::new([
                sys.name.clone(),
                s.cores.to_string(),
                s.server_cpus.clone(),
                s.sustained_qps.map_or("-".into(), |q| format!("{q:.0}")),
                s.first_bad_qps.map_or("-".into(), |q| format!("{q:.0}")),
                s.p95_us.map_or("-".into(), |p| format!("{p:.0}")),
                s.steps.to_string(),
                format!("{:.1}", s.took_s),
                format!("{} → {}", c.loadavg[0], c.loadavg[1]),
            ]));
        }
    }
    if rows.is_empty() {
        return None;
    }
    Some(Section {
        title: "Capacity calibrated here".into(),
        text: vec![format!(
            "Before the runs, on this machine: the server's capacity per core count — a \
             sustained-rate search (open loop, the experiment's workload, the generator on \
             its CPUs) with the server's threads confined to the lowest-numbered CPUs; the \
             largest rate whose p95 from the planned send stayed under {} µs with 99 % \
             answered. The predictive policies without a capacity of their own took these.",
            spec.slo()
        )],
        items: vec![Item::Table(Table {
            title: "Capacity per core count".into(),
            columns: [
                "system",
                "cores",
                "server CPUs",
                "capacity (req/s)",
                "first failing rate (req/s)",
                "p95 at capacity (µs)",
                "rates measured",
                "took (s)",
                "load average before → after",
            ]
            .map(String::from)
            .to_vec(),
            rows,
            caption: None,
        })],
    })
}

/// One run's section: its latency against the SLO and its server's cores over time, both
/// with the offered rate (or why it failed).
fn run_section(dir: &Path, r: &WorkflowRun, slo: f64) -> Section {
    let title = format!(
        "Run {}: {} {} interval {} s seed {}",
        r.index, r.system, r.policy, r.qps_interval, r.seed
    );
    let mut sec = Section {
        title: title.clone(),
        text: Vec::new(),
        items: Vec::new(),
    };
    if let Some(e) = &r.error {
        sec.text.push(format!("failed: {e}"));
        return sec;
    }
    let rows = LiveFile::new(dir.join(&r.live)).poll();
    let events = read_log(&dir.join(&r.control_log)).unwrap_or_default();
    let t0 = events
        .first()
        .map_or(0, |e| e.unix_ms.saturating_sub((e.t_s * 1000.0) as u64));
    let t = |ms: u64| (ms as f64 - t0 as f64) / 1000.0;
    let measured: Vec<&IntervalRow> = rows.iter().filter(|x| !x.warmup).collect();
    let p95: Vec<Point> = measured
        .iter()
        .filter(|x| x.counters.completed > 0)
        .map(|x| Point::new(t(x.ts_end), x.latency.p95_us))
        .collect();
    let qps: Vec<Point> = measured
        .iter()
        .map(|x| Point::new(t(x.ts_end), x.target_qps.unwrap_or(x.achieved_qps)))
        .collect();
    // Each trace segment's p95 as a step over its span.
    let segments: Vec<Segment> = summary::segments(&rows).unwrap_or_default();
    let seg_p95: Vec<Point> = segments
        .iter()
        .flat_map(|g| {
            [
                Point::new(t(g.ts_start), g.p95_us),
                Point::new(t(g.ts_end), g.p95_us),
            ]
        })
        .collect();
    let span = p95
        .iter()
        .map(|p| p.x)
        .chain(events.iter().map(|e| e.t_s))
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
            (a.min(x), b.max(x))
        });
    let marks = job_marks(&events);
    let x_range = (span.0.is_finite() && span.1 > span.0).then_some((span.0.min(0.0), span.1));
    let slo_line = vec![
        Point::new(x_range.map_or(0.0, |r| r.0), slo),
        Point::new(x_range.map_or(1.0, |r| r.1), slo),
    ];
    sec.items.push(Item::LinePlot(LinePlot {
        title: format!("{title}: p95 per 100 ms and per trace segment, offered rate"),
        x_label: "time (s)".into(),
        y_label: "p95 latency (µs)".into(),
        x_range,
        y_from_zero: true,
        series: vec![
            Series {
                name: "p95 per 100 ms".into(),
                points: p95,
                ..Series::default()
            },
            Series {
                name: "p95 per trace segment".into(),
                points: seg_p95,
                ..Series::default()
            },
            Series {
                name: "SLO".into(),
                style: kvlab_report::LineStyle::Dashed,
                points: slo_line,
                ..Series::default()
            },
        ],
        y2: Some(offered_rate(qps.clone())),
        marks: marks.clone(),
        caption: Some("Marks: job start, pause, resume and end.".into()),
        ..LinePlot::default()
    }));
    let mut cores: Vec<Point> = Vec::new();
    for e in &events {
        if let What::Sample { cores: c, .. } = e.what {
            cores.push(Point::new(e.t_s, c as f64));
        }
    }
    sec.items.push(Item::LinePlot(LinePlot {
        title: format!("{title}: the server's cores"),
        x_label: "time (s)".into(),
        y_label: "server cores".into(),
        x_range,
        y_from_zero: true,
        series: vec![Series {
            name: "server cores".into(),
            points: cores,
            ..Series::default()
        }],
        y2: Some(offered_rate(qps)),
        marks,
        ..LinePlot::default()
    }));
    if let Some(o) = &r.outcome {
        sec.text
            .push(format!("{} — stopped: {}", o.method, o.stopped));
    }
    sec
}

/// The controller's job events as marks (only starts and ends when there are over 80).
fn job_marks(events: &[Event]) -> Vec<Mark> {
    let mut marks: Vec<Mark> = events
        .iter()
        .filter_map(|e| {
            let label = match &e.what {
                What::Start { job, .. } => format!("start {job}"),
                What::End { job, .. } => format!("end {job}"),
                What::Pause { job } => format!("pause {job}"),
                What::Resume { job, .. } => format!("resume {job}"),
                _ => return None,
            };
            Some(Mark { x: e.t_s, label })
        })
        .collect();
    if marks.len() > 80 {
        marks.retain(|m| m.label.starts_with("start") || m.label.starts_with("end"));
    }
    marks
}

/// The offered rate on the right-hand axis.
fn offered_rate(qps: Vec<Point>) -> Y2 {
    Y2 {
        label: "offered rate (req/s)".into(),
        series: vec![Series {
            name: "offered rate".into(),
            points: qps,
            ..Series::default()
        }],
    }
}
