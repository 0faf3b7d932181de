//! Runs one configuration against one target: load phase, local generator threads and remote
//! agents started together, and the collector that merges what they measure.
//!
//! ```text
//!   run() ── spawns ──► generator thread ×T (generator/) ──┐
//!     │                                                    │ mpsc<Msg>
//!     ├── per agent: link thread ◄── JSON lines ◄── agent ─┤ (relayed)
//!     │                                                    ▼
//!     └── collector (this thread): merge interval reports of all threads by interval start,
//!         emit each interval once every thread has reported it, sum the run, self-check
//! ```
//!
//! Start-up: everyone connects first and reports `Ready`; the master then picks a start time
//! 100 ms ahead (monotonic for its threads, wall-clock for agents) so all begin together.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::agent::{AgentLink, AgentStop};
use crate::clock::{mono_ns, wall_ns};
use crate::config::BenchConfig;
use crate::generator::{Msg, Phase, ThreadDone};
use crate::local::{spawn_threads, wait_ready};
use crate::stats::{
    ks_critical_001, ks_statistic, Counters, EncodedHistogram, GapStats, IntervalReport,
    OpPercentiles, Percentiles,
};
use crate::BenchError;

/// How often the collector looks at a run's stop signal while it waits for reports.
const STOP_SLICE: Duration = Duration::from_millis(100);

pub use kvlab_measure::IntervalRow;

/// One rate step (`--scan` step, trace segment, or the whole run at a fixed rate).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StepRow {
    /// Index.
    pub step: usize,
    /// Start of its first measured interval, ms since the Unix epoch (absent in older
    /// versions' output).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ts_start: Option<u64>,
    /// End of its last measured interval, ms since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ts_end: Option<u64>,
    /// Target total rate, requests/s (`None` in closed loop).
    pub target_qps: Option<f64>,
    /// Measured time, s.
    pub duration_s: f64,
    /// Replies per second.
    pub achieved_qps: f64,
    /// Counts.
    pub counters: Counters,
    /// Latency from the planned send time, µs.
    pub latency: Percentiles,
    /// Latency from the actual send, µs.
    pub latency_send: Percentiles,
    /// Latency from the planned send time per kind of request, µs.
    #[serde(default)]
    pub latency_by_op: OpPercentiles,
}

/// Inter-arrival self-check figures (open loop).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GapSummary {
    /// Gaps observed.
    pub n: u64,
    /// Mean of gap × rate (1 when the rate is met).
    pub mean: f64,
    /// Coefficient of variation (1 for Poisson, 0 for fixed).
    pub cv: f64,
    /// KS statistic against Exp(1) on a sample (Poisson arrivals only).
    pub ks_d: Option<f64>,
    /// KS critical value at α = 0.001 for that sample.
    pub ks_critical: Option<f64>,
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunResult {
    /// The server.
    pub target: String,
    /// The configuration.
    pub config: BenchConfig,
    /// Participants (1 + agents).
    pub participants: usize,
    /// Start of measurement, ms since the Unix epoch.
    pub ts_start: u64,
    /// End, ms since the Unix epoch.
    pub ts_end: u64,
    /// Measured time, s.
    pub duration_s: f64,
    /// Totals over the measured time.
    pub counters: Counters,
    /// Replies per second over the measured time.
    pub throughput_qps: f64,
    /// Latency from the planned send time, µs.
    pub latency: Percentiles,
    /// Latency from the actual send, µs.
    pub latency_send: Percentiles,
    /// Latency from the planned send time per kind of request (gets, sets, deletes), µs;
    /// kinds the mix did not issue are absent.
    #[serde(default)]
    pub latency_by_op: OpPercentiles,
    /// Rate steps.
    pub steps: Vec<StepRow>,
    /// Time series.
    pub intervals: Vec<IntervalRow>,
    /// The load phase's counts, if there was one.
    pub load: Option<Counters>,
    /// Each generator thread's CPU use over the run, fraction of one core.
    pub thread_cpu: Vec<f64>,
    /// Inter-arrival check (open loop).
    pub gaps: Option<GapSummary>,
    /// Self-check warnings.
    pub warnings: Vec<String>,
    /// Connection problems reported by threads.
    pub notes: Vec<String>,
    /// Merged histograms (not serialised; for comparisons).
    #[serde(skip)]
    pub hist: Option<Box<IntervalReport>>,
    /// Each participant's own share of the measured time (0 = the master's threads when
    /// they generated load, then the agents in order): what the merged figures are the sum
    /// of.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_participant: Vec<ParticipantTotals>,
}

/// One participant's measured time: its counts, rate and latency.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ParticipantTotals {
    /// 0 = the master, 1.. = agents (agents from 0 when the master generated none).
    pub participant: u32,
    /// Measured time, s (its intervals' span).
    pub duration_s: f64,
    /// Totals over the measured time.
    pub counters: Counters,
    /// Replies per second over the measured time.
    pub throughput_qps: f64,
    /// Latency from the planned send time, µs.
    pub latency: Percentiles,
    /// Its latency histogram, ns (not serialised; the merged one is the sum of these).
    #[serde(skip)]
    pub hist: Option<Histogram<u64>>,
}

impl ParticipantTotals {
    fn of(participant: u32, r: IntervalReport) -> ParticipantTotals {
        let duration_s = secs(&r);
        ParticipantTotals {
            participant,
            duration_s,
            counters: r.counters,
            throughput_qps: r.counters.completed as f64 / duration_s.max(1e-9),
            latency: Percentiles::of(&r.latency),
            hist: Some(r.latency),
        }
    }
}

/// Runs `cfg`: the load phase (if asked), then the measured run on local threads and on
/// `agents`. `progress` sees every interval as soon as all threads have reported it.
pub fn run(
    cfg: &BenchConfig,
    agents: &[SocketAddr],
    progress: &mut dyn FnMut(&IntervalRow),
) -> Result<RunResult, BenchError> {
    let agents: Vec<Agent> = agents.iter().map(|&addr| Agent::at(addr)).collect();
    run_from(cfg, true, &agents, progress)
}

/// One agent of a run, as the master sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agent {
    /// Where `kvlab bench agent` listens.
    pub addr: SocketAddr,
    /// The server this agent loads, when not the configuration's target (several instances
    /// of one system, e.g. two proxies in front of the same servers, each loaded by its
    /// own agents).
    pub target: Option<SocketAddr>,
    /// The agent's clock minus the master's, ns (measured by whoever placed it): the start
    /// instant it is sent is shifted by it, so that every participant starts together and
    /// their intervals line up.
    pub clock_offset_ns: i64,
}

impl Agent {
    /// An agent at `addr`, loading the configuration's target, its clock taken as ours.
    pub fn at(addr: SocketAddr) -> Agent {
        Agent {
            addr,
            target: None,
            clock_offset_ns: 0,
        }
    }
}

/// Runs `cfg` as [`run`] does, with the master's own threads generating load only when
/// `local` (otherwise the load comes from `agents` alone, participants 0.., and the master
/// only collects — the load phase still runs here).
pub fn run_from(
    cfg: &BenchConfig,
    local: bool,
    agents: &[Agent],
    progress: &mut dyn FnMut(&IntervalRow),
) -> Result<RunResult, BenchError> {
    cfg.validate()?;
    if !local && agents.is_empty() {
        return Err(BenchError::Run(
            "no participants: no local threads and no agents".into(),
        ));
    }
    let load = if cfg.load {
        Some(load_phase(cfg)?)
    } else {
        None
    };
    let first = u32::from(local);
    let participants = first as usize + agents.len();
    let mut links = Vec::new();
    for (i, a) in agents.iter().enumerate() {
        let mut own = cfg.clone();
        if let Some(t) = a.target {
            own.target = t;
        }
        links.push((
            AgentLink::prepare(a.addr, &own, first + i as u32, participants as u32)?,
            a.clock_offset_ns,
        ));
    }
    let (tx, rx) = channel();
    let mut result = std::thread::scope(|s| -> Result<RunResult, BenchError> {
        let starts = if local {
            let starts = spawn_threads(s, cfg, 0, participants as u32, Phase::Run, &tx)?;
            wait_ready(&rx, cfg.threads)?;
            starts
        } else {
            Vec::new()
        };
        let lead = 100_000_000;
        let start = mono_ns() + lead;
        let start_wall = wall_ns() + lead;
        for st in &starts {
            let _ = st.send(Some(start));
        }
        let mut stops = Vec::new();
        for (link, offset) in links {
            stops.push(link.start(start_wall.saturating_add_signed(offset), tx.clone(), s)?);
        }
        drop(tx);
        collect(cfg, &rx, participants, start_wall, &mut stops, progress)
    })?;
    result.load = load;
    Ok(result)
}

/// Sets every key once from local threads (closed loop, pipelined).
pub fn load_phase(cfg: &BenchConfig) -> Result<Counters, BenchError> {
    let (tx, rx) = channel();
    std::thread::scope(|s| {
        let starts = spawn_threads(s, cfg, 0, 1, Phase::Load, &tx)?;
        wait_ready(&rx, cfg.threads)?;
        let start = mono_ns();
        for st in &starts {
            let _ = st.send(Some(start));
        }
        drop(tx);
        let mut total = Counters::default();
        let mut done = 0;
        while done < cfg.threads {
            match rx.recv_timeout(Duration::from_secs(120)) {
                Ok(Msg::Interval(r)) => total.add(&r.counters),
                Ok(Msg::Done(_)) => done += 1,
                Ok(Msg::Failed(e)) => return Err(BenchError::Run(format!("load phase: {e}"))),
                Ok(Msg::Ready) => {}
                Err(_) => return Err(BenchError::Run("load phase: no progress for 120 s".into())),
            }
        }
        if cfg.stop.raised() {
            return Err(BenchError::Run(format!(
                "interrupted in the load phase ({} of {} keys set)",
                total.completed, cfg.workload.keys
            )));
        }
        if total.completed < cfg.workload.keys || total.errors + total.timeouts > 0 {
            return Err(BenchError::Run(format!(
                "load phase set {} of {} keys ({} errors, {} timeouts)",
                total.completed, cfg.workload.keys, total.errors, total.timeouts
            )));
        }
        Ok(total)
    })
}

struct Pending {
    report: IntervalReport,
    seen: usize,
}

fn collect(
    cfg: &BenchConfig,
    rx: &Receiver<Msg>,
    participants: usize,
    start_wall_ns: u64,
    agents: &mut [AgentStop],
    progress: &mut dyn FnMut(&IntervalRow),
) -> Result<RunResult, BenchError> {
    let total_threads = participants * cfg.threads;
    let mut pending: BTreeMap<u64, Pending> = BTreeMap::new();
    let mut folded = Folded::default();
    let mut done: Vec<ThreadDone> = Vec::new();
    // Generous: the run's end, plus the request timeout, plus slack for a slow machine.
    let patience = Duration::from_millis(cfg.timeout_ms) + Duration::from_secs(30);
    let patience = if cfg.requests.is_some() {
        patience * 4
    } else {
        patience + Duration::from_nanos(cfg.end_ns())
    };
    let mut silent_since = Instant::now();
    let mut agents_stopped = false;
    let mut by_participant: BTreeMap<u32, IntervalReport> = BTreeMap::new();
    while done.len() < total_threads {
        // Waits in slices, to pass a raised stop on to the agents.
        if cfg.stop.raised() && !agents_stopped {
            agents.iter_mut().for_each(AgentStop::stop);
            agents_stopped = true;
        }
        let msg = match rx.recv_timeout(STOP_SLICE) {
            Err(RecvTimeoutError::Timeout) if silent_since.elapsed() < patience => continue,
            m => m,
        };
        silent_since = Instant::now();
        match msg {
            Ok(Msg::Interval(r)) => {
                if r.start_ns >= cfg.warmup_ns() {
                    by_participant
                        .entry(r.participant)
                        .or_insert_with(|| IntervalReport::new(0, r.start_ns, r.end_ns))
                        .merge(&r)?;
                }
                let start = r.start_ns;
                let p = pending.entry(start).or_insert_with(|| Pending {
                    report: IntervalReport::new(r.index, r.start_ns, r.end_ns),
                    seen: 0,
                });
                p.report.merge(&r)?;
                p.seen += 1;
                if p.seen == total_threads {
                    // Invariant: the entry was just looked up under `start`.
                    if let Some(p) = pending.remove(&start) {
                        progress(folded.add(cfg, start_wall_ns, &p.report));
                    }
                }
            }
            Ok(Msg::Done(d)) => done.push(*d),
            Ok(Msg::Failed(e)) => return Err(BenchError::Run(e)),
            Ok(Msg::Ready) => {}
            Err(RecvTimeoutError::Timeout) => {
                return Err(BenchError::Run(
                    "no report from the generator threads in time".into(),
                ))
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(BenchError::Run(format!(
                    "generators stopped early ({} of {total_threads} finished)",
                    done.len()
                )))
            }
        }
    }
    for (_, p) in std::mem::take(&mut pending) {
        progress(folded.add(cfg, start_wall_ns, &p.report));
    }
    let mut result = summarise(cfg, participants, start_wall_ns, folded, &done);
    result.by_participant = by_participant
        .into_iter()
        .map(|(participant, r)| ParticipantTotals::of(participant, r))
        .collect();
    Ok(result)
}

/// The run folded interval by interval as the reports come in: each interval is kept as
/// its row only (its percentiles and its encoded histogram, about 1 KB), its histograms
/// added to the measured total and to its step's, and a step is summarised into its row
/// once the intervals have moved two steps past it (intervals complete in order: every
/// generator thread reports its intervals in order). So memory grows by a row per
/// interval and per step, not by their histograms (about 1 MB an interval: a 10-minute
/// run in 100 ms intervals held over 4 GB).
#[derive(Default)]
struct Folded {
    /// Every interval's row (warm-up included), with its start (ns after the run's
    /// start), in the order they came.
    rows: Vec<(u64, IntervalRow)>,
    /// The measured intervals merged (`None` before the first).
    total: Option<IntervalReport>,
    /// The measured intervals of the steps not yet summarised, merged per step, with the
    /// seconds measured in each.
    open: BTreeMap<usize, (IntervalReport, f64)>,
    /// The steps summarised.
    steps: Vec<StepRow>,
    /// Intervals that came after their step was summarised (counted in the total only).
    late: usize,
}

impl Folded {
    /// Adds one interval; returns its row.
    fn add(&mut self, cfg: &BenchConfig, start_wall_ns: u64, r: &IntervalReport) -> &IntervalRow {
        if r.start_ns >= cfg.warmup_ns() {
            // Histograms of one configuration always share bounds, so merging cannot fail.
            let _ = self
                .total
                .get_or_insert_with(|| IntervalReport::new(0, r.start_ns, r.end_ns))
                .merge(r);
            let s = step_of(cfg, r);
            if self.steps.last().is_some_and(|row| row.step >= s) {
                self.late += 1;
            } else {
                let (e, d) = self
                    .open
                    .entry(s)
                    .or_insert_with(|| (IntervalReport::new(0, r.start_ns, r.end_ns), 0.0));
                let _ = e.merge(r);
                *d += secs(r);
                self.close_steps(cfg, start_wall_ns, s.saturating_sub(1));
            }
        }
        self.rows
            .push((r.start_ns, interval_row(cfg, r, start_wall_ns)));
        &self.rows[self.rows.len() - 1].1
    }

    /// Summarises the open steps before `before`.
    fn close_steps(&mut self, cfg: &BenchConfig, start_wall_ns: u64, before: usize) {
        while let Some(entry) = self.open.first_entry() {
            if *entry.key() >= before {
                break;
            }
            let (step, (r, d)) = entry.remove_entry();
            self.steps.push(step_row(cfg, start_wall_ns, step, &r, d));
        }
    }
}

fn secs(r: &IntervalReport) -> f64 {
    (r.end_ns.saturating_sub(r.start_ns)) as f64 / 1e9
}

fn target_of(cfg: &BenchConfig, step: usize) -> Option<f64> {
    cfg.open.map(|_| cfg.plan.segments[step].qps)
}

fn step_of(cfg: &BenchConfig, r: &IntervalReport) -> usize {
    cfg.plan.at(r.start_ns.saturating_sub(cfg.warmup_ns())).0
}

fn interval_row(cfg: &BenchConfig, r: &IntervalReport, start_wall_ns: u64) -> IntervalRow {
    let step = step_of(cfg, r);
    IntervalRow {
        ts_start: (start_wall_ns + r.start_ns) / 1_000_000,
        ts_end: (start_wall_ns + r.end_ns) / 1_000_000,
        warmup: r.start_ns < cfg.warmup_ns(),
        step,
        target_qps: target_of(cfg, step),
        achieved_qps: r.counters.completed as f64 / secs(r).max(1e-9),
        counters: r.counters,
        latency: Percentiles::of(&r.latency),
        latency_send: Percentiles::of(&r.latency_send),
        // Encoding a valid histogram into memory does not fail; a row without one only
        // lacks the merged figures.
        latency_hist: EncodedHistogram::encode(&r.latency).ok(),
    }
}

fn summarise(
    cfg: &BenchConfig,
    participants: usize,
    start_wall_ns: u64,
    mut folded: Folded,
    done: &[ThreadDone],
) -> RunResult {
    let total = folded
        .total
        .take()
        .unwrap_or_else(|| IntervalReport::new(0, cfg.warmup_ns(), cfg.warmup_ns()));
    let (first, last) = (total.start_ns, total.end_ns);
    let duration_s = secs(&total);
    folded.close_steps(cfg, start_wall_ns, usize::MAX);
    let step_rows = std::mem::take(&mut folded.steps);
    let mut warnings = Vec::new();
    if folded.late > 0 {
        warnings.push(format!(
            "{} intervals came after their step was summarised: they count in the totals only",
            folded.late
        ));
    }
    warn_step_shortfalls(&step_rows, &mut warnings);
    let (thread_cpu, gaps, notes) = collect_threads(done, &mut warnings);
    let gap_summary = summarise_gaps(cfg, &gaps, &mut warnings);
    if total.counters.errors + total.counters.timeouts > 0 {
        warnings.push(format!(
            "{} errors ({} failed verification), {} timeouts",
            total.counters.errors, total.counters.verify_errors, total.counters.timeouts
        ));
    }
    folded.rows.sort_by_key(|(start, _)| *start);
    RunResult {
        target: cfg.target.to_string(),
        config: cfg.clone(),
        participants,
        ts_start: (start_wall_ns + first) / 1_000_000,
        ts_end: (start_wall_ns + last) / 1_000_000,
        duration_s,
        counters: total.counters,
        throughput_qps: total.counters.completed as f64 / duration_s.max(1e-9),
        latency: Percentiles::of(&total.latency),
        latency_send: Percentiles::of(&total.latency_send),
        latency_by_op: total.latency_by_op.percentiles(),
        steps: step_rows,
        intervals: folded.rows.into_iter().map(|(_, row)| row).collect(),
        load: None,
        thread_cpu,
        gaps: gap_summary,
        warnings,
        notes,
        hist: Some(Box::new(total)),
        by_participant: Vec::new(),
    }
}

/// A step's row, with wall-clock timestamps in milliseconds: `r` its intervals merged,
/// `d` the seconds they measured.
fn step_row(
    cfg: &BenchConfig,
    start_wall_ns: u64,
    step: usize,
    r: &IntervalReport,
    d: f64,
) -> StepRow {
    StepRow {
        step,
        ts_start: Some((start_wall_ns + r.start_ns) / 1_000_000),
        ts_end: Some((start_wall_ns + r.end_ns) / 1_000_000),
        target_qps: target_of(cfg, step),
        duration_s: d,
        achieved_qps: r.counters.completed as f64 / d.max(1e-9),
        counters: r.counters,
        latency: Percentiles::of(&r.latency),
        latency_send: Percentiles::of(&r.latency_send),
        latency_by_op: r.latency_by_op.percentiles(),
    }
}

/// Warns about steps that completed clearly fewer requests than their target rate plans.
fn warn_step_shortfalls(step_rows: &[StepRow], warnings: &mut Vec<String>) {
    for s in step_rows {
        if let Some(target) = s.target_qps {
            // Poisson arrivals make the planned count itself vary (sd √(rate·T)): warn only
            // when the shortfall is beyond that noise as well as beyond 1 %.
            let expected = target * s.duration_s;
            let got = s.counters.completed as f64;
            if got < 0.99 * expected && expected - got > 3.0 * expected.sqrt() {
                warnings.push(format!(
                    "step {}: achieved {:.0} req/s is {:.1} % below the target {:.0} req/s",
                    s.step,
                    s.achieved_qps,
                    100.0 * (1.0 - got / expected),
                    target
                ));
            }
        }
    }
}

/// Gathers each generator thread's CPU use, send gaps and notes, warning about threads
/// that kept a core busy.
fn collect_threads(
    done: &[ThreadDone],
    warnings: &mut Vec<String>,
) -> (Vec<f64>, GapStats, Vec<String>) {
    let mut thread_cpu = Vec::new();
    let mut gaps = GapStats::default();
    let mut notes = Vec::new();
    for d in done {
        let u = d.cpu_ns as f64 / d.wall_ns.max(1) as f64;
        thread_cpu.push(u);
        if u > 0.95 {
            warnings.push(format!(
                "generator thread {}/{} used {:.0} % of a core: the client may be the bottleneck",
                d.ctx.participant,
                d.ctx.thread,
                100.0 * u
            ));
        }
        gaps.merge(&d.gaps);
        notes.extend(d.notes.iter().cloned());
    }
    (thread_cpu, gaps, notes)
}

/// Summarises the actual inter-arrival times of an open-loop run, warning when they do not
/// follow the planned distribution.
fn summarise_gaps(
    cfg: &BenchConfig,
    gaps: &GapStats,
    warnings: &mut Vec<String>,
) -> Option<GapSummary> {
    if cfg.open.is_some() && gaps.n > 0 {
        let mut sample = gaps.sample.clone();
        let ks_d = ks_statistic(&mut sample, |x| 1.0 - (-x).exp());
        let ks_critical = ks_critical_001(sample.len());
        let poisson = cfg.open == Some(crate::schedule::Arrival::Poisson);
        let g = GapSummary {
            n: gaps.n,
            mean: gaps.mean(),
            cv: gaps.cv(),
            ks_d: poisson.then_some(ks_d),
            ks_critical: poisson.then_some(ks_critical),
        };
        if gaps.n >= 1000 {
            match cfg.open {
                Some(crate::schedule::Arrival::Poisson) => {
                    // Wake-up jitter (tens of µs on a busy machine) blurs the smallest gaps:
                    // with per-connection gaps of a few hundred µs, D reaches ~0.1 while the
                    // schedule itself is exact. Beyond that, or a CV off by 10 %, the sends
                    // are bunched (the generator is behind) or the per-connection rate is too
                    // high for its timing precision (use more connections).
                    let limit = ks_critical.max(0.1);
                    if (g.cv - 1.0).abs() > 0.1 || ks_d > limit {
                        warnings.push(format!(
                            "actual inter-arrival times are not exponential (CV {:.2}, KS D {:.3} > {limit:.3}): \
                             sends are bunched or the per-connection rate is too high",
                            g.cv, ks_d
                        ));
                    }
                }
                Some(crate::schedule::Arrival::Fixed) if g.cv > 0.1 => {
                    warnings.push(format!(
                        "actual inter-arrival times are not constant (CV {:.2})",
                        g.cv
                    ));
                }
                Some(crate::schedule::Arrival::Fixed) => {}
                None => {}
            }
        }
        Some(g)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{Arrival, RatePlan};
    use crate::stats::{new_histogram, record};

    fn config(plan: RatePlan) -> BenchConfig {
        BenchConfig {
            target: "127.0.0.1:1".parse().unwrap(),
            protocol: Default::default(),
            meta_base64: false,
            cluster: false,
            threads: 1,
            connections: 1,
            depth: 1,
            think_us: 0,
            open: Some(Arrival::Poisson),
            plan,
            requests: None,
            warmup_s: 0.0,
            interval_s: 0.1,
            timeout_ms: 1000,
            workload: Default::default(),
            seed: 1,
            load: false,
            stop: Default::default(),
        }
    }

    #[test]
    fn a_step_is_the_merge_of_its_rows() {
        // Three 1 s segments in 100 ms intervals of 100 requests; in the second, one
        // interval has 40 slow ones (2 ms): 4% of the segment's.
        let cfg = config(RatePlan::from_rates(&[1000.0, 2000.0, 3000.0], 1.0).unwrap());
        let reports: Vec<IntervalReport> = (0..30u64)
            .map(|i| {
                let mut r = IntervalReport::new(i, i * 100_000_000, (i + 1) * 100_000_000);
                for k in 0..100u64 {
                    let slow = i == 13 && k < 40;
                    record(&mut r.latency, if slow { 2_000_000 } else { 100_000 + k });
                }
                r.counters.completed = 100;
                r
            })
            .collect();
        let wall = 1_700_000_000_000_000_000;
        // Folded as they complete: each step summarised once the intervals are two steps
        // past it, the last ones at the end; two intervals of a step swapped (a thread's
        // last report of it late) still count in their step.
        let mut folded = Folded::default();
        let mut order: Vec<&IntervalReport> = reports.iter().collect();
        order.swap(18, 19);
        for r in order {
            folded.add(&cfg, wall, r);
        }
        assert_eq!(folded.steps.len(), 1);
        let res = summarise(&cfg, 1, wall, folded, &[]);
        assert_eq!(res.steps.len(), 3);
        for s in &res.steps {
            let rows: Vec<&IntervalRow> =
                res.intervals.iter().filter(|r| r.step == s.step).collect();
            assert_eq!(rows.len(), 10);
            assert_eq!(s.ts_start, Some(rows[0].ts_start));
            assert_eq!(s.ts_end, Some(rows[9].ts_end));
            let mut merged = new_histogram();
            for r in &rows {
                r.latency_hist
                    .as_ref()
                    .unwrap()
                    .add_to(&mut merged)
                    .unwrap();
            }
            assert_eq!(Percentiles::of(&merged), s.latency, "step {}", s.step);
        }
        // The slow interval's p95 is above 1 ms, its segment's is not.
        assert!(res.intervals[13].latency.p95_us > 1000.0);
        assert!(res.steps[1].latency.p95_us < 1000.0);
        // Rows and steps survive JSON with their histograms and spans; old rows without
        // them still parse.
        let back: IntervalRow =
            serde_json::from_str(&crate::report::interval_json(&res.intervals[13])).unwrap();
        assert_eq!(back.latency_hist, res.intervals[13].latency_hist);
        let mut old = serde_json::to_value(&res.intervals[0]).unwrap();
        old.as_object_mut().unwrap().remove("latency_hist");
        let old: IntervalRow = serde_json::from_value(old).unwrap();
        assert!(old.latency_hist.is_none());
        let mut old = serde_json::to_value(&res.steps[0]).unwrap();
        old.as_object_mut().unwrap().remove("ts_start");
        assert!(serde_json::from_value::<StepRow>(old)
            .unwrap()
            .ts_start
            .is_none());
    }
}
