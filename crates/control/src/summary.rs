//! A run's figures from its control log and the load's intervals: each job's runtime
//! without its paused spans, the jobs' total time (first start to last end), and the
//! SLO-violation ratio — measured intervals whose p95 is above the SLO over all measured
//! intervals that overlap the time jobs ran.

use kvlab_bench::run::IntervalRow;
use serde::{Deserialize, Serialize};

use crate::event::{Event, What};

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

/// One run's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    /// The jobs that ended, in the order they ended.
    pub jobs: Vec<JobRun>,
    /// Jobs started.
    pub started: usize,
    /// First job start to last job end, s (`None` when no job ended).
    pub total_s: Option<f64>,
    /// Measured intervals that overlap the jobs' time.
    pub intervals: usize,
    /// Of those, intervals with p95 above the SLO.
    pub violations: usize,
    /// `violations / intervals` (0 when there are none).
    pub violation_ratio: f64,
    /// Changes of the server's cores (the initial share not counted).
    pub core_changes: usize,
    /// Pauses of jobs.
    pub pauses: usize,
}

/// The figures of a run: its log's events and the load's intervals; `slo_p95_us` in µs.
pub fn summarise(events: &[Event], intervals: &[IntervalRow], slo_p95_us: f64) -> RunSummary {
    let mut jobs = Vec::new();
    let mut first_start: Option<u64> = None;
    let mut last_end: Option<u64> = None;
    let (mut started, mut core_changes, mut pauses) = (0, 0, 0);
    for e in events {
        match &e.what {
            What::Start { .. } => {
                started += 1;
                first_start = Some(first_start.map_or(e.unix_ms, |f| f.min(e.unix_ms)));
            }
            What::End {
                job,
                exit,
                runtime_s,
                paused_s,
                pauses,
            } => {
                last_end = Some(last_end.map_or(e.unix_ms, |l| l.max(e.unix_ms)));
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
    // While jobs ran; a run in which no job started (a static split that leaves them no
    // core) is judged over its whole load.
    let (from, to) = match first_start {
        Some(s) => (s, last_end.filter(|&e| e >= s).unwrap_or(u64::MAX)),
        None => (0, u64::MAX),
    };
    let measured: Vec<&IntervalRow> = intervals
        .iter()
        .filter(|i| !i.warmup && i.counters.completed > 0)
        .filter(|i| i.ts_end > from && i.ts_start < to)
        .collect();
    let violations = measured
        .iter()
        .filter(|i| i.latency.p95_us > slo_p95_us)
        .count();
    RunSummary {
        total_s: match (first_start, last_end) {
            (Some(s), Some(e)) if e >= s => Some((e - s) as f64 / 1000.0),
            _ => None,
        },
        jobs,
        started,
        intervals: measured.len(),
        violations,
        violation_ratio: if measured.is_empty() {
            0.0
        } else {
            violations as f64 / measured.len() as f64
        },
        core_changes,
        pauses,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(ms: u64, what: What) -> Event {
        Event {
            t_s: 0.0,
            unix_ms: ms,
            what,
            reason: String::new(),
            signal: None,
        }
    }

    fn row(start: u64, p95: f64) -> IntervalRow {
        let mut r = IntervalRow {
            ts_start: start,
            ts_end: start + 1000,
            warmup: false,
            step: 0,
            target_qps: Some(1000.0),
            achieved_qps: 1000.0,
            counters: Default::default(),
            latency: Default::default(),
            latency_send: Default::default(),
        };
        r.counters.completed = 1000;
        r.latency.p95_us = p95;
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
        // Intervals 8..9 and 16..17 s are outside the jobs' time; 10..15 s inside, one bad.
        let rows: Vec<IntervalRow> = [8, 10, 11, 12, 13, 14, 16]
            .iter()
            .map(|&s| row(s * 1000, if s == 12 || s == 16 { 2000.0 } else { 300.0 }))
            .collect();
        let s = summarise(&events, &rows, 1000.0);
        assert_eq!((s.intervals, s.violations), (5, 1));
        assert!((s.violation_ratio - 0.2).abs() < 1e-12);
        assert_eq!(s.total_s, Some(5.0));
        assert_eq!((s.started, s.pauses, s.jobs.len()), (1, 1, 1));
        assert_eq!(s.jobs[0].runtime_s, 4.0);
    }
}
