//! A run's figures from its control log and the load's intervals: each job's runtime
//! without its paused spans, the jobs' total time (first start to last end), and how often
//! the load's p95 was above the SLO while jobs ran — over the jobs' span, first start to
//! last end (the whole load when no job started), counted three ways:
//!
//! - **per trace segment** (the headline): one data point per segment of the load's rate
//!   trace (`kvlab bench --qps-interval`), its p95 over all of the segment's requests —
//!   what the generator reports for it (`steps[i].latency.p95_us` of `kvlab bench
//!   --json`) — over the segments that overlap the jobs' span (one partly inside counts
//!   whole; one outside does not);
//! - **per 100 ms interval** (stricter): each of the load's intervals judged on its own
//!   p95, so a burst of a few hundred milliseconds that a segment's p95 absorbs still
//!   counts; a segment's p95 can only be above the SLO if some of its intervals' is;
//! - **per window** of a given length ([`windows`], the lab's `slo_window`): the p95 over
//!   all of the window's requests.
//!
//! The segments' and windows' p95 are exact: the load's rows carry their histograms
//! (`IntervalRow::latency_hist`), which add up to the histogram of any span. Rows of an
//! older `kvlab bench` carry none; those two figures are then absent.

use kvlab_measure::IntervalRow;
use kvlab_measure::{new_histogram, Histogram, Percentiles};
use serde::{Deserialize, Serialize};

use crate::event::{Event, What};
use crate::policy::Signal;

/// One job's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRun {
    /// The job.
    pub name: String,
    /// Runtime without paused spans, s.
    pub runtime_s: f64,
    /// Paused time, s.
    pub paused_s: f64,
    /// Times paused.
    pub pauses: u32,
    /// Exit code (`None`: killed, or it did not end).
    pub exit: Option<i32>,
}

/// One segment of the load's rate trace, as measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    /// Its index in the trace (`steps[i].step` of the generator's report).
    pub step: usize,
    /// Start of its first measured interval, ms since the Unix epoch.
    pub ts_start: u64,
    /// End of its last measured interval, ms since the Unix epoch.
    pub ts_end: u64,
    /// The trace's rate in it, requests/s (`None` in closed loop).
    pub target_qps: Option<f64>,
    /// Requests completed in it.
    pub requests: u64,
    /// The p95 over all of its requests (from the planned send time), µs.
    pub p95_us: f64,
}

/// One run's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    /// The jobs that ended, in the order they ended.
    pub jobs: Vec<JobRun>,
    /// Jobs started.
    pub started: usize,
    /// First job start to last job end, s (`None` when no job ended).
    pub total_s: Option<f64>,
    /// The load's trace segments that overlap the jobs' span (all of them when no job
    /// started), each with its p95 over all its requests; empty when the load's rows carry
    /// no histograms (an older `kvlab bench`).
    #[serde(default)]
    pub segments: Vec<Segment>,
    /// Of those, segments whose p95 is above the SLO.
    #[serde(default)]
    pub segment_violations: usize,
    /// `segment_violations / segments`, the headline violation ratio (`None` when there is
    /// no segment to judge).
    #[serde(default)]
    pub segment_violation_ratio: Option<f64>,
    /// The load's 100 ms intervals (its `--interval`) that overlap the jobs' span.
    pub intervals: usize,
    /// Of those, intervals whose own p95 is above the SLO.
    pub violations: usize,
    /// `violations / intervals` (0 when there are none): stricter than the segments' ratio.
    pub violation_ratio: f64,
    /// Changes of the server's cores (the initial share not counted).
    pub core_changes: usize,
    /// Pauses of jobs.
    pub pauses: usize,
    /// Which process was the bottleneck while the jobs ran.
    #[serde(default)]
    pub regime: Regime,
}

/// Which process was the bottleneck over the jobs' span: the server's CPU and its own
/// latency from the controller's samples, and how late the load generator sent its
/// requests (the load's p95 is timed from the planned send, so a generator short of CPU
/// shows in it as well as a slow server does).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Regime {
    /// The server's CPU, cores busy: the mean of the samples'.
    pub server_cpu: Option<f64>,
    /// The server's own p95 (kvlab's `stats latency`: service time plus the wait for an
    /// event loop), µs: the median of the samples'.
    pub server_p95_us: Option<f64>,
    /// The generator's lag (planned send to sent) at its p95, µs: the median of the load's
    /// intervals'.
    pub send_lag_p95_us: Option<f64>,
}

/// The median of `v`, `None` when it is empty.
fn median(mut v: Vec<f64>) -> Option<f64> {
    (!v.is_empty()).then(|| kvlab_measure::median(&mut v))
}

/// The regime over the samples of `events` and the `rows` inside the span `from..to`.
fn regime(events: &[Event], rows: &[&IntervalRow], from: u64, to: u64) -> Regime {
    let signals: Vec<&Signal> = events
        .iter()
        .filter(|e| matches!(e.what, What::Sample { .. }) && (from..=to).contains(&e.unix_ms))
        .filter_map(|e| e.signal.as_ref())
        .collect();
    let cpu: Vec<f64> = signals.iter().filter_map(|s| s.cpu).collect();
    Regime {
        server_cpu: (!cpu.is_empty()).then(|| cpu.iter().sum::<f64>() / cpu.len() as f64),
        server_p95_us: median(signals.iter().filter_map(|s| s.server_p95_us).collect()),
        send_lag_p95_us: median(rows.iter().map(|r| r.latency_send.p95_us).collect()),
    }
}

/// The span the SLO is judged over, ms since the Unix epoch: the first job's start to the
/// last job's end (open-ended while a job runs); everything when no job started (a static
/// split that leaves the jobs no core is judged over its whole load).
pub fn job_span(events: &[Event]) -> (u64, u64) {
    let first_start = events
        .iter()
        .filter(|e| matches!(e.what, What::Start { .. }))
        .map(|e| e.unix_ms)
        .min();
    let last_end = events
        .iter()
        .filter(|e| matches!(e.what, What::End { .. }))
        .map(|e| e.unix_ms)
        .max();
    match first_start {
        Some(s) => (s, last_end.filter(|&e| e >= s).unwrap_or(u64::MAX)),
        None => (0, u64::MAX),
    }
}

/// The measured rows (warm-up left out) in time order.
fn measured(rows: &[IntervalRow]) -> Vec<&IntervalRow> {
    let mut v: Vec<&IntervalRow> = rows.iter().filter(|r| !r.warmup).collect();
    v.sort_by_key(|r| r.ts_start);
    v
}

/// Adds a row's histogram to `into`; `None` when a row that served requests carries none.
fn add(into: &mut Histogram<u64>, r: &IntervalRow) -> Option<()> {
    match &r.latency_hist {
        Some(h) => h.add_to(into).ok(),
        None if r.counters.completed == 0 => Some(()),
        None => None,
    }
}

/// The load's trace segments from its rows (each row names its segment, `step`): per
/// segment, the span of its rows and the p95 of their histograms added up — the figure
/// the generator reports for the segment. `None` when a row lacks its histogram.
pub fn segments(rows: &[IntervalRow]) -> Option<Vec<Segment>> {
    let mut out = Vec::new();
    // Rows come in time order and segments follow each other, so one histogram at a time.
    let mut cur: Option<(Segment, Histogram<u64>)> = None;
    let close = |(mut s, h): (Segment, Histogram<u64>), out: &mut Vec<Segment>| {
        s.p95_us = Percentiles::of(&h).p95_us;
        if s.requests > 0 {
            out.push(s);
        }
    };
    for r in measured(rows) {
        if cur.as_ref().is_some_and(|(s, _)| s.step != r.step) {
            if let Some(c) = cur.take() {
                close(c, &mut out);
            }
        }
        let (s, h) = cur.get_or_insert_with(|| {
            (
                Segment {
                    step: r.step,
                    ts_start: r.ts_start,
                    ts_end: r.ts_end,
                    target_qps: r.target_qps,
                    requests: 0,
                    p95_us: 0.0,
                },
                new_histogram(),
            )
        });
        add(h, r)?;
        s.ts_end = s.ts_end.max(r.ts_end);
        s.requests += r.counters.completed;
    }
    if let Some(c) = cur {
        close(c, &mut out);
    }
    Some(out)
}

/// Windows of `window_ms` over the rows that overlap `[from, to]` (ms since the Unix
/// epoch), the first starting at `from` (a row belongs to the window its start falls in):
/// (windows, windows whose p95 over all their requests is above `slo_p95_us`). `None`
/// when a row lacks its histogram.
pub fn windows(
    rows: &[IntervalRow],
    from: u64,
    to: u64,
    window_ms: u64,
    slo_p95_us: f64,
) -> Option<(usize, usize)> {
    let w = window_ms.max(1);
    let (mut n, mut bad) = (0, 0);
    let mut cur: Option<(u64, Histogram<u64>)> = None;
    let mut close = |h: &Histogram<u64>| {
        if !h.is_empty() {
            n += 1;
            if Percentiles::of(h).p95_us > slo_p95_us {
                bad += 1;
            }
        }
    };
    for r in measured(rows)
        .into_iter()
        .filter(|r| r.ts_end > from && r.ts_start < to)
    {
        let k = r.ts_start.saturating_sub(from) / w;
        if cur.as_ref().is_some_and(|(c, _)| *c != k) {
            if let Some((_, h)) = cur.take() {
                close(&h);
            }
        }
        let (_, h) = cur.get_or_insert_with(|| (k, new_histogram()));
        add(h, r)?;
    }
    if let Some((_, h)) = cur {
        close(&h);
    }
    Some((n, bad))
}

/// What the jobs cost in violated trace segments: a controlled run's segments beside the
/// same segments (the same trace and seed: a segment's `step` is its rate) of a run with
/// no jobs on the same machine — the baseline. The machine's own violations are in both;
/// the difference is the jobs'.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cost {
    /// The controlled run's judged segments that the baseline measured too.
    pub segments: usize,
    /// Of those, violated with the jobs.
    pub with_jobs: usize,
    /// The same segments violated without jobs (the baseline).
    pub without_jobs: usize,
    /// `with_jobs - without_jobs`: the jobs' cost in segments (negative when the baseline
    /// violated more).
    pub difference: i64,
    /// Segments violated in one of the two runs only (whichever): how far apart the two
    /// runs' verdicts are, not only their counts.
    #[serde(default)]
    pub differing: usize,
    /// `difference / segments`: the headline (`None` without segments).
    pub ratio: Option<f64>,
    /// The controlled run's segments the baseline did not reach (left out above).
    pub unmatched: usize,
}

/// The jobs' cost of a run whose judged segments are `run` against `baseline`'s segments
/// (all of a no-jobs run's, [`segments`]); a segment violates above `slo_p95_us`.
pub fn cost(run: &[Segment], baseline: &[Segment], slo_p95_us: f64) -> Cost {
    let (mut segments, mut with_jobs, mut without_jobs, mut unmatched) = (0, 0, 0, 0);
    let mut differing = 0;
    for s in run {
        let Some(b) = baseline.iter().find(|b| b.step == s.step) else {
            unmatched += 1;
            continue;
        };
        segments += 1;
        let (with, without) = (s.p95_us > slo_p95_us, b.p95_us > slo_p95_us);
        with_jobs += usize::from(with);
        without_jobs += usize::from(without);
        differing += usize::from(with != without);
    }
    let difference = with_jobs as i64 - without_jobs as i64;
    Cost {
        segments,
        with_jobs,
        without_jobs,
        difference,
        differing,
        ratio: (segments > 0).then(|| difference as f64 / segments as f64),
        unmatched,
    }
}

/// The idle-capacity bound of a job set: the shortest time in which work that scales
/// perfectly and keeps no cache could do the jobs' work on the cores the load leaves idle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdleBound {
    /// The jobs' work: each alone on one core, s (core-seconds).
    pub work_core_s: f64,
    /// The idle cores over the bound's span, mean.
    pub idle_cores: f64,
    /// The bound, s: from the jobs' start in the trace until the idle cores the load left
    /// (in the no-jobs run) add up to the work.
    pub bound_s: f64,
    /// The no-jobs run ended before; the rest at its mean idle cores.
    pub extrapolated: bool,
}

/// The trace's start: the first measured row's, ms since the Unix epoch.
pub fn trace_start(rows: &[IntervalRow]) -> Option<u64> {
    rows.iter().filter(|r| !r.warmup).map(|r| r.ts_start).min()
}

/// The idle cores of a run's samples as `(trace time at the sample's end, its length,
/// idle cores)`, s, with the trace starting at `trace_start_ms`.
pub fn idle_samples(events: &[Event], trace_start_ms: u64) -> Vec<(f64, f64, f64)> {
    let mut out = Vec::new();
    let mut last: Option<f64> = None;
    for e in events
        .iter()
        .filter(|e| matches!(e.what, What::Sample { .. }))
    {
        let t = (e.unix_ms as f64 - trace_start_ms as f64) / 1000.0;
        if let (Some(t0), Some(idle)) = (last, e.signal.as_ref().and_then(|s| s.idle_cores)) {
            if t > t0 {
                out.push((t, t - t0, idle));
            }
        }
        last = Some(t);
    }
    out
}

/// [`IdleBound`] for `work_core_s` of work starting at trace time `from_s`, over the
/// no-jobs run's `idle` samples ([`idle_samples`]). `None` when it has no sample after
/// `from_s` with idle cores.
pub fn idle_bound(work_core_s: f64, idle: &[(f64, f64, f64)], from_s: f64) -> Option<IdleBound> {
    let after: Vec<&(f64, f64, f64)> = idle.iter().filter(|(t, _, _)| *t > from_s).collect();
    let (mut done, mut span) = (0.0, 0.0);
    for &&(t, dt, cores) in &after {
        let dt = dt.min(t - from_s);
        if done + cores * dt >= work_core_s && cores > 0.0 {
            let part = (work_core_s - done) / cores;
            span += part;
            return Some(IdleBound {
                work_core_s,
                idle_cores: work_core_s / span,
                bound_s: span,
                extrapolated: false,
            });
        }
        done += cores * dt;
        span += dt;
    }
    let mean = (span > 0.0).then(|| done / span).filter(|m| *m > 0.0)?;
    let bound_s = span + (work_core_s - done) / mean;
    Some(IdleBound {
        work_core_s,
        idle_cores: work_core_s / bound_s,
        bound_s,
        extrapolated: true,
    })
}

/// The figures of a run: its log's events and the load's intervals; `slo_p95_us` in µs.
pub fn summarise(events: &[Event], intervals: &[IntervalRow], slo_p95_us: f64) -> RunSummary {
    let mut jobs = Vec::new();
    let (mut started, mut core_changes, mut pauses) = (0, 0, 0);
    for e in events {
        match &e.what {
            What::Start { .. } => started += 1,
            What::End {
                job,
                exit,
                runtime_s,
                paused_s,
                pauses,
            } => {
                jobs.push(JobRun {
                    name: job.clone(),
                    runtime_s: *runtime_s,
                    paused_s: *paused_s,
                    pauses: *pauses,
                    exit: *exit,
                });
            }
            What::Cores { .. } if e.signal.is_some() => core_changes += 1,
            What::Pause { .. } => pauses += 1,
            _ => {}
        }
    }
    let (from, to) = job_span(events);
    let inside = |s: u64, e: u64| e > from && s < to;
    let measured: Vec<&IntervalRow> = intervals
        .iter()
        .filter(|i| !i.warmup && i.counters.completed > 0)
        .filter(|i| inside(i.ts_start, i.ts_end))
        .collect();
    let violations = measured
        .iter()
        .filter(|i| i.latency.p95_us > slo_p95_us)
        .count();
    let segments: Vec<Segment> = segments(intervals)
        .unwrap_or_default()
        .into_iter()
        .filter(|s| inside(s.ts_start, s.ts_end))
        .collect();
    let segment_violations = segments.iter().filter(|s| s.p95_us > slo_p95_us).count();
    RunSummary {
        total_s: (from > 0 && to < u64::MAX).then(|| (to - from) as f64 / 1000.0),
        jobs,
        started,
        segment_violation_ratio: (!segments.is_empty())
            .then(|| segment_violations as f64 / segments.len() as f64),
        segments,
        segment_violations,
        intervals: measured.len(),
        violations,
        violation_ratio: if measured.is_empty() {
            0.0
        } else {
            violations as f64 / measured.len() as f64
        },
        core_changes,
        pauses,
        regime: regime(events, &measured, from, to),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvlab_measure::{record, EncodedHistogram};

    fn ev(ms: u64, what: What) -> Event {
        Event {
            t_s: 0.0,
            unix_ms: ms,
            what,
            reason: String::new(),
            signal: None,
        }
    }

    /// A row of the load as `kvlab bench` writes it: `n` requests, `slow` of them at
    /// 2 ms and the rest at 200 µs.
    fn row(start: u64, len: u64, step: usize, n: u64, slow: u64) -> IntervalRow {
        let mut h = new_histogram();
        for k in 0..n {
            record(&mut h, if k < slow { 2_000_000 } else { 200_000 });
        }
        let mut r = IntervalRow {
            ts_start: start,
            ts_end: start + len,
            warmup: false,
            step,
            target_qps: Some(1000.0),
            achieved_qps: n as f64 * 1000.0 / len as f64,
            counters: Default::default(),
            latency: Percentiles::of(&h),
            latency_send: Default::default(),
            latency_hist: Some(EncodedHistogram::encode(&h).unwrap()),
        };
        r.counters.completed = n;
        r
    }

    #[test]
    fn violations_count_only_while_jobs_run() {
        let events = [
            ev(
                10_000,
                What::Start {
                    job: "a".into(),
                    cores: 1,
                    pid: None,
                },
            ),
            ev(13_000, What::Pause { job: "a".into() }),
            ev(
                15_000,
                What::End {
                    job: "a".into(),
                    exit: Some(0),
                    runtime_s: 4.0,
                    paused_s: 1.0,
                    pauses: 1,
                },
            ),
        ];
        // 1 s intervals, each its own segment: 8..9 and 16..17 s are outside the jobs'
        // time; 10..15 s inside, one bad.
        let rows: Vec<IntervalRow> = [8, 10, 11, 12, 13, 14, 16]
            .iter()
            .map(|&s| {
                row(
                    s * 1000,
                    1000,
                    s as usize,
                    100,
                    if s == 12 || s == 16 { 10 } else { 0 },
                )
            })
            .collect();
        let s = summarise(&events, &rows, 1000.0);
        assert_eq!((s.intervals, s.violations), (5, 1));
        assert!((s.violation_ratio - 0.2).abs() < 1e-12);
        assert_eq!((s.segments.len(), s.segment_violations), (5, 1));
        assert_eq!(s.total_s, Some(5.0));
        assert_eq!((s.started, s.pauses, s.jobs.len()), (1, 1, 1));
        assert_eq!(s.jobs[0].runtime_s, 4.0);
    }

    #[test]
    fn the_regime_is_taken_over_the_jobs_span_only() {
        let sample = |ms: u64, cpu: f64, server: f64| Event {
            signal: Some(Signal {
                cpu: Some(cpu),
                server_p95_us: Some(server),
                ..Signal::default()
            }),
            ..ev(
                ms,
                What::Sample {
                    cores: 1,
                    running: 1,
                    paused: 0,
                },
            )
        };
        let start = What::Start {
            job: "a".into(),
            cores: 1,
            pid: None,
        };
        let end = What::End {
            job: "a".into(),
            exit: Some(0),
            runtime_s: 3.0,
            paused_s: 0.0,
            pauses: 0,
        };
        // Samples before and after the jobs (a busy server, 9 ms) do not count.
        let events = [
            sample(9_000, 2.0, 9000.0),
            ev(10_000, start),
            sample(10_100, 0.5, 40.0),
            sample(11_000, 0.7, 50.0),
            sample(12_000, 0.3, 900.0),
            ev(13_000, end),
            sample(14_000, 2.0, 9000.0),
        ];
        let rows: Vec<IntervalRow> = [8u64, 10, 11, 12, 14]
            .iter()
            .map(|&s| {
                let mut r = row(s * 1000, 1000, s as usize, 100, 0);
                r.latency_send.p95_us = if s == 11 { 4000.0 } else { s as f64 };
                r
            })
            .collect();
        let g = summarise(&events, &rows, 1000.0).regime;
        assert!((g.server_cpu.unwrap() - 0.5).abs() < 1e-9, "{g:?}");
        assert_eq!(g.server_p95_us, Some(50.0));
        // Rows 10, 11 and 12 s: lags 10, 4000 and 12 µs; the median is 12.
        assert_eq!(g.send_lag_p95_us, Some(12.0));
        // No samples and no rows: nothing to say.
        assert_eq!(summarise(&[], &[], 1000.0).regime, Regime::default());
    }

    #[test]
    fn a_segment_counts_when_it_overlaps_the_jobs_span_even_partly() {
        // The load as `kvlab bench --live` writes it: 1 s trace segments (steps 0..7) in
        // 100 ms rows of 100 requests, from t = 100 s. Segment 2 is slow throughout, 6
        // too; in segment 4 one 100 ms interval has 40 slow requests (its own p95 is 2 ms;
        // the segment's, with 4% slow, is 200 µs).
        let t0 = 100_000;
        let mut live = String::new();
        for step in 0..8u64 {
            for i in 0..10u64 {
                let slow = match (step, i) {
                    (2, _) | (6, _) => 100,
                    (4, 3) => 40,
                    _ => 0,
                };
                let r = row(t0 + step * 1000 + i * 100, 100, step as usize, 100, slow);
                live.push_str(&kvlab_measure::interval_json(&r));
                live.push('\n');
            }
        }
        // The controller's log: the jobs run from 102.5 s to 105.5 s, so segments 2 and 5
        // overlap partly, 3 and 4 wholly; 0, 1, 6 and 7 lie outside.
        let log = r#"{"t_s":0.0,"unix_ms":100000,"event":"sample","cores":2,"running":0,"paused":0}
{"t_s":2.5,"unix_ms":102500,"event":"start","job":"a","cores":1,"pid":7,"reason":"1 core(s) free"}
{"t_s":3.0,"unix_ms":103000,"event":"start","job":"b","cores":1,"pid":8,"reason":"1 core(s) free"}
{"t_s":4.0,"unix_ms":104000,"event":"end","job":"a","exit":0,"runtime_s":1.5,"paused_s":0.0,"pauses":0}
{"t_s":5.5,"unix_ms":105500,"event":"end","job":"b","exit":0,"runtime_s":2.5,"paused_s":0.0,"pauses":0}
{"t_s":5.6,"unix_ms":105600,"event":"stop","why":"every job ended"}
"#;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("live.jsonl"), &live).unwrap();
        std::fs::write(dir.path().join("control.jsonl"), log).unwrap();
        let rows = crate::sensor::LiveFile::new(dir.path().join("live.jsonl")).poll();
        let events = crate::event::read_log(&dir.path().join("control.jsonl")).unwrap();
        assert_eq!(rows.len(), 80);
        let s = summarise(&events, &rows, 1000.0);
        let steps: Vec<usize> = s.segments.iter().map(|g| g.step).collect();
        assert_eq!(steps, [2, 3, 4, 5]);
        assert_eq!(s.segment_violations, 1);
        assert_eq!(s.segment_violation_ratio, Some(0.25));
        let g = &s.segments[0];
        assert_eq!((g.ts_start, g.ts_end, g.requests), (102_000, 103_000, 1000));
        assert!(g.p95_us > 1000.0 && s.segments[2].p95_us < 1000.0);
        // The 100 ms figure: the 30 intervals of 102.5..105.5 s, 5 slow ones of segment 2
        // and the one of segment 4.
        assert_eq!((s.intervals, s.violations), (30, 6));
        assert_eq!(s.total_s, Some(3.0));
    }

    #[test]
    fn a_window_is_judged_on_the_p95_of_all_its_requests() {
        // 3 s of 100 ms rows of 100 requests from t = 10 s: in the first second one
        // interval has 30 slow requests (its own p95 is above the SLO, the second's is not:
        // 3% slow), in the second two intervals are slow throughout (20%).
        let slow = |i: u64| match i {
            4 => 30,
            13 | 17 => 100,
            _ => 0,
        };
        let rows: Vec<IntervalRow> = (0..30u64)
            .map(|i| row(10_000 + i * 100, 100, 0, 100, slow(i)))
            .collect();
        assert_eq!(windows(&rows, 10_000, 13_000, 1000, 1000.0), Some((3, 1)));
        // Only the rows inside the span count, the windows starting at its start: 11.5 s
        // (interval 17 slow) and 12.5 s.
        assert_eq!(windows(&rows, 11_500, 13_000, 1000, 1000.0), Some((2, 1)));
        // With 500 ms windows the one with interval 4 is above too (6% slow).
        assert_eq!(windows(&rows, 10_000, 13_000, 500, 1000.0), Some((6, 3)));
    }

    fn seg(step: usize, p95_us: f64) -> Segment {
        Segment {
            step,
            ts_start: 0,
            ts_end: 0,
            target_qps: None,
            requests: 1,
            p95_us,
        }
    }

    #[test]
    fn the_jobs_cost_is_the_same_segments_violated_with_them_less_without() {
        // Steps 3..7 judged in the run; the baseline violated step 4 too, and has no step 7.
        let run: Vec<Segment> = [
            (3, 500.0),
            (4, 1500.0),
            (5, 1200.0),
            (6, 900.0),
            (7, 2000.0),
        ]
        .map(|(s, p)| seg(s, p))
        .to_vec();
        let base: Vec<Segment> = (0..7)
            .map(|s| seg(s, if s == 4 { 1100.0 } else { 300.0 }))
            .collect();
        let c = cost(&run, &base, 1000.0);
        assert_eq!((c.segments, c.with_jobs, c.without_jobs), (4, 2, 1));
        assert_eq!((c.difference, c.unmatched), (1, 1));
        assert_eq!(c.ratio, Some(0.25));
        // The machine alone worse than with the jobs: a negative cost, not hidden.
        let all_bad: Vec<Segment> = (0..8).map(|s| seg(s, 5000.0)).collect();
        assert_eq!(cost(&run, &all_bad, 1000.0).difference, -2);
        assert_eq!(cost(&[], &base, 1000.0).ratio, None);
    }

    #[test]
    fn the_idle_bound_adds_up_the_idle_cores_from_the_jobs_start() {
        // 1 s samples: 0.5 idle cores for 10 s, then 1.5.
        let idle: Vec<(f64, f64, f64)> = (1..=20)
            .map(|t| (t as f64, 1.0, if t <= 10 { 0.5 } else { 1.5 }))
            .collect();
        // From t = 8: 2 s at 0.5 (1 core-s), then 2 core-s more at 1.5 (1.33 s).
        let b = idle_bound(3.0, &idle, 8.0).unwrap();
        assert!((b.bound_s - (2.0 + 2.0 / 1.5)).abs() < 1e-9, "{b:?}");
        assert!(!b.extrapolated && (b.idle_cores - 3.0 / b.bound_s).abs() < 1e-12);
        // Past the samples: the rest at their mean (from t = 10: 15 core-s in 10 s).
        let b = idle_bound(30.0, &idle, 10.0).unwrap();
        assert!(b.extrapolated && (b.bound_s - 20.0).abs() < 1e-9, "{b:?}");
        assert!(idle_bound(1.0, &idle, 25.0).is_none());
    }

    #[test]
    fn rows_without_histograms_give_no_segments() {
        let mut rows: Vec<IntervalRow> = (0..10u64)
            .map(|i| row(10_000 + i * 100, 100, 0, 100, 0))
            .collect();
        rows[3].latency_hist = None;
        assert_eq!(segments(&rows), None);
        assert_eq!(windows(&rows, 0, u64::MAX, 1000, 1000.0), None);
        let s = summarise(&[], &rows, 1000.0);
        assert!(s.segments.is_empty() && s.segment_violation_ratio.is_none());
        assert_eq!(s.intervals, 10);
        // A row that served nothing needs none.
        rows[3].latency_hist = None;
        rows[3].counters.completed = 0;
        assert_eq!(segments(&rows).map(|s| s.len()), Some(1));
    }
}
