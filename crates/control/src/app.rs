//! One controlled run as a library call: the job file's inputs made, the machine set up
//! around a running server, the loop until the jobs end (or the time limit, or a stop),
//! and the run's figures — once the load has finished the trace segment in which the last
//! job ended, so that segment's p95 is over all its requests, as the generator reports
//! it. `kvlab control` and the lab's control experiments both call [`control`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kvlab_measure::IntervalRow;
use serde::{Deserialize, Serialize};

use crate::calibrate::Calibration;
use crate::controller::{self, Controller, RunLimits, Share};
use crate::event::{read_log, EventLog, What};
use crate::jobs::JobFile;
use crate::machine::{CpuMethod, PauseMethod, System};
use crate::policy::{Policy, PolicySpec};
use crate::sensor::{LiveFile, ServerSensor, STALE_MS};
use crate::summary::{cost, job_span, segments, summarise, Cost, RunSummary};
use crate::ControlError;

/// The default time between samples.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(100);

/// Everything one controlled run needs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The server's process id.
    pub pid: u32,
    /// Where it answers `stats` (request rate, connections).
    pub stats: Option<SocketAddr>,
    /// The load's intervals as `kvlab bench --live` writes them (the latency signal).
    pub live: Option<PathBuf>,
    /// The jobs.
    pub jobs: JobFile,
    /// Where jobs run and their inputs and logs are (`{work}`).
    pub work: PathBuf,
    /// Run the job file's `prepare` commands first.
    pub prepare: bool,
    /// The policy.
    pub policy: PolicySpec,
    /// The CPUs shared and the server's minimum.
    pub share: Share,
    /// How CPUs move.
    pub cpu_method: CpuMethod,
    /// How jobs pause.
    pub pause_method: PauseMethod,
    /// Time between samples.
    pub interval: Duration,
    /// The longest the run may last.
    pub max: Duration,
    /// Stop when every job has ended (else run until `max` or a stop).
    pub until_jobs_done: bool,
    /// The control log (JSON lines).
    pub log: PathBuf,
    /// The SLO the summary counts violations against, µs.
    pub slo_p95_us: f64,
    /// The capacity calibration the predictive policy's figures come from (kept with the
    /// outcome); `None`: given (`--capacity`), or not predictive.
    pub calibration: Option<Calibration>,
    /// The load's intervals of the same trace and seed with no jobs (a `--live` file): the
    /// baseline the jobs' cost is counted against.
    pub baseline: Option<PathBuf>,
}

/// What a run did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Outcome {
    /// The policy's name.
    pub policy: String,
    /// How CPUs moved and jobs paused.
    pub method: String,
    /// Why the loop stopped.
    pub stopped: String,
    /// Jobs in the job file.
    pub jobs: usize,
    /// The most cores the server had.
    pub server_cores_max: usize,
    /// Whether the jobs also ran on the server's CPUs at idle priority (`--idle-jobs`).
    #[serde(default)]
    pub idle_jobs: bool,
    /// The predictive policy's capacity per core count, requests/s, and where it came
    /// from (`calibrated here` or `given`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<(Vec<f64>, String)>,
    /// The calibration that measured it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<Calibration>,
    /// The figures.
    pub summary: RunSummary,
    /// What the jobs cost against the baseline (with `Options::baseline`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<Cost>,
}

/// The predictive policy's capacity and where it came from, for the outcome and the
/// command's output.
pub fn capacity_used(
    policy: &PolicySpec,
    calibration: Option<&Calibration>,
) -> Option<(Vec<f64>, String)> {
    match policy {
        PolicySpec::Predictive { capacity, .. } => Some((
            capacity.clone(),
            match calibration {
                Some(c) if &c.capacity == capacity => "calibrated here".into(),
                _ => "given".into(),
            },
        )),
        _ => None,
    }
}

/// Runs the loop around the server until the jobs end, `max` passes or `stop` says so.
pub fn control(o: &Options, stop: &dyn Fn() -> bool) -> Result<Outcome, ControlError> {
    if let PolicySpec::Predictive { capacity, .. } = &o.policy {
        if capacity.is_empty() || capacity.iter().any(|c| !c.is_finite() || *c < 0.0) {
            return Err(ControlError::Spec(
                "the predictive policy needs a capacity per core count: calibrate or give it"
                    .into(),
            ));
        }
    }
    std::fs::create_dir_all(&o.work)
        .map_err(|e| ControlError::io(format!("creating {}", o.work.display()), e))?;
    if o.prepare {
        controller::prepare(&o.jobs.prepare, &o.work)?;
    }
    let system = System::new(o.pid, &o.share.cpus, o.cpu_method, o.pause_method, &o.work)?;
    let method = system.describe();
    let log = EventLog::file(&o.log)?;
    let mut c = Controller::new(
        system,
        Policy::new(o.policy.clone()),
        o.jobs.jobs.clone(),
        o.share.clone(),
        log,
    )?;
    let slack = match &o.policy {
        PolicySpec::Reactive { slack } | PolicySpec::Predictive { slack, .. } => Some(slack),
        PolicySpec::Static { .. } => None,
    };
    let window = slack.map_or(Duration::ZERO, |s| {
        Duration::from_millis(s.latency_window_ms)
    });
    let mut sensor =
        ServerSensor::new(o.pid, o.stats, o.live.clone(), window).idle_of(&o.share.cpus);
    if let Some(s) = slack.filter(|s| s.segment_budget.is_some()) {
        sensor = sensor.count_segments(s.slo_p95_us);
    }
    let limits = RunLimits {
        interval: o.interval,
        max: o.max,
        until_jobs_done: o.until_jobs_done && !o.jobs.jobs.is_empty(),
    };
    let stopped = controller::run(&mut c, &mut sensor, limits, stop)?;
    let jobs_ended = !o.jobs.jobs.is_empty() && c.queue.all_done();
    drop(c);
    let events = read_log(&o.log)?;
    let server_cores_max = events
        .iter()
        .filter_map(|e| match e.what {
            // The share after the run (every CPU back to the server) is not the policy's.
            What::Cores { to, .. } if e.signal.is_some() || e.reason.starts_with("initial") => {
                Some(to)
            }
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let rows = match &o.live {
        Some(p) => {
            let mut live = LiveFile::new(p.clone());
            let mut rows = live.poll();
            if jobs_ended {
                finish_segment(&mut live, &mut rows, job_span(&events).1, stop);
            }
            rows
        }
        None => Vec::new(),
    };
    let summary = summarise(&events, &rows, o.slo_p95_us);
    let cost = match &o.baseline {
        Some(p) => {
            let base = segments(&LiveFile::new(p.clone()).poll()).ok_or_else(|| {
                ControlError::Spec(format!(
                    "the baseline {}: rows without histograms (an older kvlab bench)",
                    p.display()
                ))
            })?;
            Some(cost(&summary.segments, &base, o.slo_p95_us))
        }
        None => None,
    };
    Ok(Outcome {
        policy: o.policy.name().into(),
        method,
        stopped,
        jobs: o.jobs.jobs.len(),
        server_cores_max,
        idle_jobs: o.share.idle_jobs,
        capacity: capacity_used(&o.policy, o.calibration.as_ref()),
        calibration: o.calibration.clone(),
        summary,
        cost,
    })
}

/// Whether the load's `rows` show the trace segment in force at `end_ms` complete (a row
/// of a later segment is in, or there is no load), and the longest complete segment
/// before it, ms (how long it is worth waiting for it: segments of a trace are about
/// equally long; 0 when none completed, e.g. a load at a fixed rate).
fn segment_state(rows: &[IntervalRow], end_ms: u64) -> (bool, u64) {
    let mut rows: Vec<&IntervalRow> = rows.iter().filter(|r| !r.warmup).collect();
    rows.sort_by_key(|r| r.ts_start);
    let Some(at_end) = rows
        .iter()
        .find(|r| r.ts_end > end_ms)
        .or(rows.last())
        .map(|r| r.step)
    else {
        return (true, 0);
    };
    let mut spans: Vec<(usize, u64, u64)> = Vec::new();
    for r in rows.iter().filter(|r| r.step < at_end) {
        match spans.iter_mut().find(|(s, _, _)| *s == r.step) {
            Some((_, a, b)) => (*a, *b) = ((*a).min(r.ts_start), (*b).max(r.ts_end)),
            None => spans.push((r.step, r.ts_start, r.ts_end)),
        }
    }
    (
        rows.iter().any(|r| r.step > at_end),
        spans.iter().map(|(_, a, b)| b - a).max().unwrap_or(0),
    )
}

/// Reads the load's rows on until the segment in force at `end_ms` is complete — at most
/// as long as the longest segment before it, and not past the load's end (no new row for
/// [`STALE_MS`]) or `stop`.
fn finish_segment(
    live: &mut LiveFile,
    rows: &mut Vec<IntervalRow>,
    end_ms: u64,
    stop: &dyn Fn() -> bool,
) {
    let (done, longest) = segment_state(rows, end_ms);
    if done || longest == 0 {
        return;
    }
    let started = Instant::now();
    let mut last_row = started;
    while !stop()
        && started.elapsed() < Duration::from_millis(longest)
        && last_row.elapsed() < Duration::from_millis(STALE_MS)
    {
        std::thread::sleep(Duration::from_millis(50));
        let new = live.poll();
        if !new.is_empty() {
            last_row = Instant::now();
            rows.extend(new);
            if segment_state(rows, end_ms).0 {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(start: u64, step: usize) -> IntervalRow {
        IntervalRow {
            ts_start: start,
            ts_end: start + 100,
            warmup: false,
            step,
            target_qps: Some(1000.0),
            achieved_qps: 1000.0,
            counters: Default::default(),
            latency: Default::default(),
            latency_send: Default::default(),
            latency_hist: None,
        }
    }

    #[test]
    fn the_segment_the_jobs_ended_in_is_complete_once_the_next_one_begins() {
        // 1 s segments of 100 ms rows; the jobs end at 2.45 s, in segment 2.
        let rows: Vec<IntervalRow> = (0..25u64).map(|i| row(i * 100, i as usize / 10)).collect();
        assert_eq!(segment_state(&rows, 2450), (false, 1000));
        let more: Vec<IntervalRow> = (0..31u64).map(|i| row(i * 100, i as usize / 10)).collect();
        assert_eq!(segment_state(&more, 2450), (true, 1000));
        // Ended in the first segment (or a load at a fixed rate): no length to wait for.
        assert_eq!(segment_state(&rows[..5], 450), (false, 0));
        assert_eq!(segment_state(&rows, 450), (true, 0));
        assert_eq!(segment_state(&[], 450), (true, 0));
    }
}
