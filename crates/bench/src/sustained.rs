//! Sustained throughput search (`kvlab bench --find-sustained`): the largest open-loop rate a
//! target sustains within a latency bound.
//!
//! A rate is *sustained* when, over a short measured run at that offered rate (after a brief
//! warm-up), the latency measured from the planned send time (mean or p95) stays under the
//! bound **and** the replies keep up with the offer: at least 99 % of the requests planned in
//! the measured time were answered in it (planned requests are counted exactly, so Poisson
//! noise in the offer does not count against the target).
//!
//! The search grows the rate geometrically (×`growth`) from `start` until a step fails, then
//! bisects between the last good and the first bad rate until they are within `precision`
//! of each other. A failure at the very first rate walks down instead (÷`growth`) until a rate
//! passes or the rate falls below `min`. [`Search`] is that walk as a state machine (propose a
//! rate, record its measurement) for callers that measure in their own way, such as a
//! controller; [`find_sustained`] drives it with runs. There every step is one
//! [`crate::run()`] on fresh connections; the cache is filled once before the first (the
//! configuration's `load`), and again before every step with `reload_each_step`. The search
//! stops early, with what it has, when `max_time_s` is spent.

use std::net::SocketAddr;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::config::BenchConfig;
use crate::run::RunResult;
use crate::schedule::{Arrival, RatePlan};
use crate::stats::Counters;
use crate::BenchError;

/// Which latency figure the bound applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Bound {
    /// The mean latency from the planned send time.
    Mean,
    /// The 95th percentile from the planned send time.
    P95,
}

/// How to search.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SearchSpec {
    /// Which latency figure must stay below `bound_us`.
    pub bound: Bound,
    /// The latency bound, µs.
    pub bound_us: f64,
    /// First rate tried, requests/s.
    pub start: f64,
    /// Highest rate tried, requests/s.
    pub max: f64,
    /// Lowest rate tried when walking down, requests/s.
    pub min: f64,
    /// Factor between rates while growing (and walking down).
    pub growth: f64,
    /// Stop bisecting when (bad − good) / good is at most this.
    pub precision: f64,
    /// Measured time per step, s.
    pub step_s: f64,
    /// Warm-up per step (run and discarded), s.
    pub warmup_s: f64,
    /// Fraction of the planned requests that must be answered within the step.
    pub keep_up: f64,
    /// Total time budget, s (the search stops early with what it has).
    pub max_time_s: f64,
    /// Open-loop arrival process of the steps.
    pub arrival: Arrival,
    /// With the configuration's `load`: set the key space again before every step, so a
    /// workload with deletes starts every step from a full cache.
    #[serde(default)]
    pub reload_each_step: bool,
    /// A failed rate is measured again up to this many times, and fails only if every try
    /// does: where the latency does not rise with the rate alone (a virtual CPU's wake-up
    /// at a low rate), one slow step does not end the growth.
    #[serde(default)]
    pub retries: u32,
}

impl SearchSpec {
    /// A search for `bound` below `bound_us` with the default steps: from 1000 req/s ×2, 5 %
    /// precision, 2 s steps after 0.5 s warm-up, at most 300 s.
    pub fn new(bound: Bound, bound_us: f64) -> Self {
        SearchSpec {
            bound,
            bound_us,
            start: 1000.0,
            max: 10_000_000.0,
            min: 10.0,
            growth: 2.0,
            precision: 0.05,
            step_s: 2.0,
            warmup_s: 0.5,
            keep_up: 0.99,
            max_time_s: 300.0,
            arrival: Arrival::Poisson,
            reload_each_step: false,
            retries: 0,
        }
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<(), BenchError> {
        let bad = |m: &str| Err(BenchError::Spec(m.into()));
        if !(self.bound_us > 0.0 && self.bound_us.is_finite()) {
            return bad("the latency bound must be > 0");
        }
        if !(self.start > 0.0 && self.max >= self.start && self.min > 0.0) {
            return bad("search rates: want 0 < min, 0 < start <= max");
        }
        if !(self.growth > 1.0 && self.growth.is_finite()) {
            return bad("search growth factor must be > 1");
        }
        if !(self.precision > 0.0 && self.precision < 1.0) {
            return bad("search precision must be in (0, 1)");
        }
        if !(self.step_s > 0.0 && self.warmup_s >= 0.0 && self.max_time_s > 0.0) {
            return bad("search step time must be > 0, warm-up >= 0");
        }
        if !(self.keep_up > 0.0 && self.keep_up <= 1.0) {
            return bad("keep-up fraction must be in (0, 1]");
        }
        Ok(())
    }
}

/// Why a step passed or failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Latency under the bound and the replies kept up.
    Ok,
    /// The latency figure was at or above the bound.
    Latency,
    /// Fewer than the keep-up fraction of planned requests were answered.
    Rate,
    /// Both.
    LatencyAndRate,
}

impl Verdict {
    /// True for [`Verdict::Ok`].
    pub fn ok(self) -> bool {
        self == Verdict::Ok
    }

    /// Short text for tables.
    pub fn text(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Latency => "latency",
            Verdict::Rate => "rate",
            Verdict::LatencyAndRate => "latency+rate",
        }
    }
}

/// One step of the walk.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SearchStep {
    /// Order in the walk (0-based).
    pub index: usize,
    /// Offered rate, requests/s.
    pub offered_qps: f64,
    /// Requests planned in the measured time per second (the realised offer), requests/s.
    pub planned_qps: f64,
    /// Replies per second.
    pub achieved_qps: f64,
    /// Mean latency from the planned send, µs.
    pub mean_us: f64,
    /// p50 from the planned send, µs.
    pub p50_us: f64,
    /// p95 from the planned send, µs.
    pub p95_us: f64,
    /// p99 from the planned send, µs.
    pub p99_us: f64,
    /// Fraction of requests answered correctly (see [`success_rate`]).
    pub success_rate: f64,
    /// Counts.
    pub counters: Counters,
    /// The outcome.
    pub verdict: Verdict,
}

/// What the search found.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SearchResult {
    /// The target.
    pub target: String,
    /// How it searched.
    pub spec: SearchSpec,
    /// The largest rate that passed, requests/s (`None`: none did).
    pub sustained_qps: Option<f64>,
    /// The step of that rate.
    pub sustained: Option<SearchStep>,
    /// The smallest rate that failed, requests/s (`None`: none did, up to `max`).
    pub first_bad_qps: Option<f64>,
    /// Every step in the order walked.
    pub steps: Vec<SearchStep>,
    /// Why the search ended.
    pub ended: String,
    /// The load phase's counts, if there was one.
    pub load: Option<Counters>,
    /// Warnings of the steps, one per kind: the steps that raised it and its first text.
    pub warnings: Vec<String>,
}

/// The fraction of requests that ended correctly: replies that were not errors (a verified
/// hit, a miss, a stored set, a delete) over everything that ended (replies and timeouts).
/// Connection failures count their lost requests as errors.
pub fn success_rate(c: &Counters) -> f64 {
    let ended = c.completed + c.timeouts;
    if ended == 0 {
        return 0.0;
    }
    c.completed.saturating_sub(c.errors) as f64 / ended as f64
}

/// Judges one measured step.
pub fn judge(spec: &SearchSpec, r: &RunResult) -> SearchStep {
    let c = r.counters;
    let lat = match spec.bound {
        Bound::Mean => r.latency.mean_us,
        Bound::P95 => r.latency.p95_us,
    };
    // No replies at all: nothing met the bound.
    let latency_ok = c.completed > 0 && lat < spec.bound_us;
    let rate_ok = c.planned > 0 && c.completed as f64 >= spec.keep_up * c.planned as f64;
    let verdict = match (latency_ok, rate_ok) {
        (true, true) => Verdict::Ok,
        (false, true) => Verdict::Latency,
        (true, false) => Verdict::Rate,
        (false, false) => Verdict::LatencyAndRate,
    };
    let d = r.duration_s.max(1e-9);
    SearchStep {
        index: 0,
        offered_qps: r.config.plan.segments.first().map_or(0.0, |s| s.qps),
        planned_qps: c.planned as f64 / d,
        achieved_qps: r.throughput_qps,
        mean_us: r.latency.mean_us,
        p50_us: r.latency.p50_us,
        p95_us: r.latency.p95_us,
        p99_us: r.latency.p99_us,
        success_rate: success_rate(&c),
        counters: c,
        verdict,
    }
}

/// The search as a state machine that others drive step by step: it proposes a rate, the
/// caller measures it however it likes (a [`crate::run()`], a controller's own window of
/// traffic) and records the outcome, until it proposes nothing more.
///
/// ```text
///   let mut search = Search::new(spec)?;
///   while let Some(qps) = search.next_rate() {
///       let result = /* measure at qps */;
///       let verdict = search.record(qps, &result);
///   }
///   let found = search.finish(target, None);
/// ```
///
/// The walk: grow ×`growth` from `start` until a rate fails (or `max` passes); a failure at
/// the first rate walks down ÷`growth` until one passes (or the next would be below `min`);
/// then bisect (geometric midpoint) between the last good and the first bad rate until they
/// are within `precision`. It keeps no clock: a caller with a time budget calls
/// [`Search::stop`].
#[derive(Debug, Clone)]
pub struct Search {
    spec: SearchSpec,
    next: Option<f64>,
    good: Option<f64>,
    bad: Option<f64>,
    steps: Vec<SearchStep>,
    ended: Option<String>,
    /// Failed tries of the current rate so far.
    failed_tries: u32,
    /// (kind, first full text, steps that raised it)
    warnings: Vec<(String, String, Vec<usize>)>,
}

impl Search {
    /// A search by `spec` (checked); its first rate is `spec.start`.
    pub fn new(spec: SearchSpec) -> Result<Self, BenchError> {
        spec.validate()?;
        Ok(Search {
            next: Some(spec.start),
            spec,
            good: None,
            bad: None,
            steps: Vec::new(),
            ended: None,
            failed_tries: 0,
            warnings: Vec::new(),
        })
    }

    /// How it searches.
    pub fn spec(&self) -> &SearchSpec {
        &self.spec
    }

    /// The rate to measure next, requests/s; `None` once the search has ended.
    pub fn next_rate(&self) -> Option<f64> {
        self.next
    }

    /// The run of one step at `qps` from `base` (its target, workload, connections): open
    /// loop with the spec's arrival process, its warm-up and step time, no load phase.
    pub fn step_config(&self, base: &BenchConfig, qps: f64) -> Result<BenchConfig, BenchError> {
        let mut cfg = base.clone();
        cfg.load = false;
        cfg.open = Some(self.spec.arrival);
        cfg.plan = RatePlan::fixed(qps, self.spec.step_s)?;
        cfg.requests = None;
        cfg.warmup_s = self.spec.warmup_s;
        // One interval per step keeps the reports small.
        cfg.interval_s = self.spec.step_s.max(cfg.interval_s);
        Ok(cfg)
    }

    /// Records the measurement of offered rate `qps` (normally the one [`Search::next_rate`]
    /// proposed): judges it, keeps it as a step, and moves to the next rate.
    pub fn record(&mut self, qps: f64, r: &RunResult) -> Verdict {
        let index = self.steps.len();
        for w in &r.warnings {
            // Shortfall warnings are what the verdict already says. Others are kept once per
            // kind (the text before the figures), with the steps that raised them.
            if w.contains("below the target") {
                continue;
            }
            let kind = w.split('(').next().unwrap_or(w).trim_end();
            match self.warnings.iter_mut().find(|(k, _, _)| k == kind) {
                Some((_, _, at)) => at.push(index),
                None => self
                    .warnings
                    .push((kind.to_string(), w.clone(), vec![index])),
            }
        }
        let mut s = judge(&self.spec, r);
        s.index = index;
        s.offered_qps = qps;
        let verdict = s.verdict;
        self.steps.push(s);
        if self.ended.is_none() {
            self.advance(qps, verdict.ok());
        }
        verdict
    }

    fn advance(&mut self, q: f64, ok: bool) {
        if ok {
            self.failed_tries = 0;
        } else if self.failed_tries < self.spec.retries {
            self.failed_tries += 1;
            self.next = Some(q);
            return;
        } else {
            self.failed_tries = 0;
        }
        let spec = &self.spec;
        self.next = None;
        if ok {
            self.good = Some(q);
            if self.bad.is_none() {
                if q >= spec.max {
                    let why = format!("the highest rate tried ({:.0} req/s) passed", spec.max);
                    self.stop(why);
                } else {
                    self.next = Some((q * spec.growth).min(spec.max));
                }
                return;
            }
        } else {
            self.bad = Some(q);
            if self.good.is_none() {
                let next = q / spec.growth;
                if next < spec.min {
                    let why = format!("no rate down to {:.0} req/s passed", spec.min);
                    self.stop(why);
                } else {
                    self.next = Some(next);
                }
                return;
            }
        }
        // Bracketed: bisect.
        if let (Some(g), Some(b)) = (self.good, self.bad) {
            if (b - g) / g <= self.spec.precision {
                let why = format!("bracketed to {:.0} %", self.spec.precision * 100.0);
                self.stop(why);
            } else {
                // Geometric midpoint: the bracket is a ratio.
                self.next = Some((g * b).sqrt());
            }
        }
    }

    /// Ends the search now (a time budget spent, a controller's decision), with `why`; a
    /// search that has already ended keeps its reason.
    pub fn stop(&mut self, why: impl Into<String>) {
        self.next = None;
        if self.ended.is_none() {
            self.ended = Some(why.into());
        }
    }

    /// Why the search ended (`None` while it goes on).
    pub fn ended(&self) -> Option<&str> {
        self.ended.as_deref()
    }

    /// The steps so far, in the order walked.
    pub fn steps(&self) -> &[SearchStep] {
        &self.steps
    }

    /// The largest rate that passed so far (the bracket's good end).
    pub fn sustained_qps(&self) -> Option<f64> {
        self.good
    }

    /// The smallest rate that failed so far (the bracket's bad end).
    pub fn first_bad_qps(&self) -> Option<f64> {
        self.bad
    }

    /// What the search found, for `target`, with the load phase's counts if there was one.
    pub fn finish(self, target: String, load: Option<Counters>) -> SearchResult {
        let good = self.good;
        let sustained = good.and_then(|g| {
            self.steps
                .iter()
                .rev()
                .find(|s| s.offered_qps == g && s.verdict.ok())
                .cloned()
        });
        SearchResult {
            target,
            spec: self.spec,
            sustained_qps: good,
            sustained,
            first_bad_qps: self.bad,
            steps: self.steps,
            ended: self
                .ended
                .unwrap_or_else(|| "stopped before its end".into()),
            load,
            warnings: self
                .warnings
                .into_iter()
                .map(|(_, first, at)| {
                    let at: Vec<String> = at.iter().map(usize::to_string).collect();
                    format!("steps {}: {first}", at.join(","))
                })
                .collect(),
        }
    }
}

/// Runs the search against `base`'s target with `base`'s workload and connections (its load
/// model and rate plan are replaced). `on_step` sees every step when it is measured.
pub fn find_sustained(
    base: &BenchConfig,
    spec: &SearchSpec,
    agents: &[SocketAddr],
    on_step: &mut dyn FnMut(&SearchStep),
) -> Result<SearchResult, BenchError> {
    find_sustained_with(
        base,
        spec,
        &mut |cfg| crate::run(cfg, agents, &mut |_| {}),
        on_step,
    )
}

/// [`find_sustained`] with the step runner supplied (tests drive it with a model): a
/// [`Search`] driven by runs of [`Search::step_config`], within `spec.max_time_s`.
pub fn find_sustained_with(
    base: &BenchConfig,
    spec: &SearchSpec,
    run_step: &mut dyn FnMut(&BenchConfig) -> Result<RunResult, BenchError>,
    on_step: &mut dyn FnMut(&SearchStep),
) -> Result<SearchResult, BenchError> {
    let mut search = Search::new(spec.clone())?;
    base.validate()?;
    let load = if base.load {
        Some(crate::run::load_phase(base)?)
    } else {
        None
    };
    let t0 = Instant::now();
    let mut first = true;
    while let Some(qps) = search.next_rate() {
        if t0.elapsed().as_secs_f64() >= spec.max_time_s {
            search.stop("time budget spent");
            break;
        }
        if base.load && spec.reload_each_step && !std::mem::take(&mut first) {
            crate::run::load_phase(base)?;
        }
        let r = run_step(&search.step_config(base, qps)?)?;
        if base.stop.raised() {
            // A step cut short measured less than its plan: not recorded.
            search.stop("interrupted");
            break;
        }
        search.record(qps, &r);
        if let Some(s) = search.steps().last() {
            on_step(s);
        }
    }
    Ok(search.finish(base.target.to_string(), load))
}

/// The walk as a table (rates in requests/s, latencies in µs from the planned send).
pub fn table(r: &SearchResult) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let what = match r.spec.bound {
        Bound::Mean => "mean",
        Bound::P95 => "p95",
    };
    let _ = writeln!(
        out,
        "sustained-throughput search on {}: {what} latency (from planned send) < {:.1} µs and ≥ {:.0} % of planned requests answered; {:.1} s steps after {:.1} s warm-up",
        r.target,
        r.spec.bound_us,
        r.spec.keep_up * 100.0,
        r.spec.step_s,
        r.spec.warmup_s
    );
    let _ = writeln!(
        out,
        "  {:>4} {:>12} {:>12} {:>10} {:>10} {:>10} {:>10} {:>9}  verdict",
        "step", "offered/s", "achieved/s", "mean µs", "p50 µs", "p95 µs", "p99 µs", "success"
    );
    for s in &r.steps {
        let _ = writeln!(
            out,
            "  {:>4} {:>12.0} {:>12.0} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>8.3}%  {}",
            s.index,
            s.offered_qps,
            s.achieved_qps,
            s.mean_us,
            s.p50_us,
            s.p95_us,
            s.p99_us,
            s.success_rate * 100.0,
            s.verdict.text()
        );
    }
    match (&r.sustained, r.first_bad_qps) {
        (Some(s), bad) => {
            let _ = writeln!(
                out,
                "  sustained: {:.0} req/s (achieved {:.0} req/s, mean {:.1} µs, p95 {:.1} µs, p99 {:.1} µs, success {:.3} %){}; {}",
                s.offered_qps,
                s.achieved_qps,
                s.mean_us,
                s.p95_us,
                s.p99_us,
                s.success_rate * 100.0,
                bad.map_or(String::new(), |b| format!("; first failing rate {b:.0} req/s")),
                r.ended
            );
        }
        (None, _) => {
            let _ = writeln!(out, "  sustained: none ({})", r.ended);
        }
    }
    for w in &r.warnings {
        let _ = writeln!(out, "  WARNING: {w}");
    }
    out
}

/// The CSV header of [`to_csv`].
pub const CSV_HEADER: &str = "search,target,step,offered_qps,planned_qps,achieved_qps,mean_us,p50_us,p95_us,p99_us,success_rate,completed,errors,timeouts,verdict,sustained";

/// Every step of every search as CSV (`sustained` is true on the step reported).
pub fn to_csv(results: &[SearchResult]) -> String {
    use std::fmt::Write as _;
    let mut out = String::from(CSV_HEADER);
    out.push('\n');
    for (n, r) in results.iter().enumerate() {
        for s in &r.steps {
            let chosen = r.sustained.as_ref().is_some_and(|c| c.index == s.index);
            let _ = writeln!(
                out,
                "{n},{},{},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.6},{},{},{},{},{chosen}",
                r.target,
                s.index,
                s.offered_qps,
                s.planned_qps,
                s.achieved_qps,
                s.mean_us,
                s.p50_us,
                s.p95_us,
                s.p99_us,
                s.success_rate,
                s.counters.completed,
                s.counters.errors,
                s.counters.timeouts,
                s.verdict.text()
            );
        }
    }
    out
}

/// Every search as JSON.
pub fn to_json(results: &[SearchResult]) -> String {
    #[derive(Serialize)]
    struct Doc<'a> {
        units: &'a str,
        searches: &'a [SearchResult],
    }
    serde_json::to_string_pretty(&Doc {
        units: "rates in requests/s, latencies in µs from the planned send time, durations in s, success_rate a fraction",
        searches: results,
    })
    .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::run::StepRow;
    use crate::stats::Percentiles;

    /// A run result for a modelled server: latency 100 µs below `cap` req/s, 5 ms above, and
    /// above `cap` only `cap` replies per second.
    fn model(cfg: &BenchConfig, cap: f64) -> RunResult {
        let q = cfg.plan.segments[0].qps;
        let planned = (q * 2.0) as u64;
        let completed = if q <= cap {
            planned
        } else {
            (cap * 2.0) as u64
        };
        let lat = Percentiles {
            mean_us: if q <= cap { 100.0 } else { 5000.0 },
            p95_us: if q <= cap { 150.0 } else { 9000.0 },
            count: completed,
            ..Percentiles::default()
        };
        let counters = Counters {
            planned,
            sent: planned,
            completed,
            ..Counters::default()
        };
        RunResult {
            target: cfg.target.to_string(),
            config: cfg.clone(),
            participants: 1,
            ts_start: 0,
            ts_end: 0,
            duration_s: 2.0,
            counters,
            throughput_qps: completed as f64 / 2.0,
            latency: lat,
            latency_send: lat,
            latency_by_op: Default::default(),
            steps: Vec::<StepRow>::new(),
            intervals: Vec::new(),
            load: None,
            thread_cpu: Vec::new(),
            gaps: None,
            warnings: Vec::new(),
            notes: Vec::new(),
            hist: None,
            by_participant: Vec::new(),
        }
    }

    fn base() -> BenchConfig {
        BenchConfig {
            target: "127.0.0.1:1".parse().unwrap(),
            protocol: Default::default(),
            meta_base64: false,
            cluster: false,
            threads: 1,
            connections: 1,
            depth: 1,
            think_us: 0,
            open: None,
            plan: RatePlan::fixed(0.0, 1.0).unwrap(),
            requests: None,
            warmup_s: 0.0,
            interval_s: 1.0,
            timeout_ms: 1000,
            workload: Default::default(),
            seed: 1,
            load: false,
            stop: Default::default(),
        }
    }

    #[test]
    fn grows_then_bisects_to_the_capacity() {
        let spec = SearchSpec::new(Bound::Mean, 1000.0);
        for cap in [1500.0, 37_000.0, 999_999.0] {
            let r = find_sustained_with(&base(), &spec, &mut |c| Ok(model(c, cap)), &mut |_| {})
                .unwrap();
            let s = r.sustained_qps.unwrap();
            let b = r.first_bad_qps.unwrap();
            assert!(s <= cap && b > cap, "cap {cap}: {s} .. {b}");
            assert!((b - s) / s <= 0.05, "cap {cap}: {s} .. {b}");
            assert!(r.steps.len() < 25, "{} steps", r.steps.len());
            assert_eq!(r.sustained.as_ref().unwrap().verdict, Verdict::Ok);
            let t = table(&r);
            assert!(t.contains("sustained:") && t.contains("rate"), "{t}");
            assert_eq!(
                to_csv(std::slice::from_ref(&r)).lines().count(),
                r.steps.len() + 1
            );
        }
    }

    #[test]
    fn walks_down_when_the_start_fails_and_reports_none_below_min() {
        let spec = SearchSpec::new(Bound::P95, 1000.0);
        let r =
            find_sustained_with(&base(), &spec, &mut |c| Ok(model(c, 300.0)), &mut |_| {}).unwrap();
        let s = r.sustained_qps.unwrap();
        assert!((285.0..=300.0).contains(&s), "{s}");
        let r =
            find_sustained_with(&base(), &spec, &mut |c| Ok(model(c, 1.0)), &mut |_| {}).unwrap();
        assert_eq!(r.sustained_qps, None);
        assert!(r.ended.contains("no rate"), "{}", r.ended);
    }

    /// Drives a [`Search`] by hand with the model's results; returns the rates it proposed.
    fn drive(spec: SearchSpec, cap: f64) -> (Vec<f64>, Search) {
        let mut s = Search::new(spec).unwrap();
        let mut rates = Vec::new();
        while let Some(q) = s.next_rate() {
            rates.push(q);
            let mut cfg = base();
            cfg.plan = RatePlan::fixed(q, 2.0).unwrap();
            let v = s.record(q, &model(&cfg, cap));
            assert_eq!(v.ok(), q <= cap, "{q}");
            assert!(rates.len() < 100, "runaway search");
        }
        (rates, s)
    }

    #[test]
    fn search_grows_by_its_factor_then_bisects_geometrically() {
        let (rates, s) = drive(SearchSpec::new(Bound::Mean, 1000.0), 5000.0);
        assert_eq!(&rates[..4], [1000.0, 2000.0, 4000.0, 8000.0]);
        assert!(
            (rates[4] - (4000.0f64 * 8000.0).sqrt()).abs() < 1e-9,
            "{rates:?}"
        );
        let (g, b) = (s.sustained_qps().unwrap(), s.first_bad_qps().unwrap());
        assert!(g <= 5000.0 && b > 5000.0 && (b - g) / g <= 0.05, "{g} {b}");
        assert!(s.ended().unwrap().contains("bracketed"));
        assert_eq!(s.steps().len(), rates.len());
        let r = s.finish("t".into(), None);
        assert_eq!(r.sustained.unwrap().offered_qps, g);
    }

    #[test]
    fn search_walks_down_from_a_failing_start_and_ends_below_min() {
        let (rates, s) = drive(SearchSpec::new(Bound::P95, 1000.0), 300.0);
        assert_eq!(&rates[..3], [1000.0, 500.0, 250.0]);
        assert_eq!(
            s.first_bad_qps(),
            Some(
                rates
                    .iter()
                    .copied()
                    .filter(|&q| q > 300.0)
                    .fold(f64::MAX, f64::min)
            )
        );
        let (rates, s) = drive(SearchSpec::new(Bound::P95, 1000.0), 1.0);
        assert_eq!(rates.last(), Some(&15.625));
        assert_eq!(s.sustained_qps(), None);
        assert!(
            s.ended().unwrap().contains("no rate down to 10"),
            "{:?}",
            s.ended()
        );
    }

    #[test]
    fn with_retries_a_rate_fails_only_when_every_try_does() {
        let mut spec = SearchSpec::new(Bound::P95, 1000.0);
        spec.start = 1000.0;
        spec.retries = 1;
        let mut s = Search::new(spec).unwrap();
        let (good, bad) = (true, false);
        // 1000 passes; 2000 fails once (a slow moment), passes on its retry; 4000 fails
        // twice: bracketed between 2000 and 4000.
        let mut walk = Vec::new();
        for pass in [good, bad, good, bad, bad] {
            let q = s.next_rate().unwrap();
            walk.push(q);
            s.advance(q, pass);
        }
        assert_eq!(walk, [1000.0, 2000.0, 2000.0, 4000.0, 4000.0]);
        assert_eq!(s.sustained_qps(), Some(2000.0));
        assert_eq!(s.first_bad_qps(), Some(4000.0));
    }

    #[test]
    fn search_ends_when_the_highest_rate_passes_or_when_stopped() {
        let mut spec = SearchSpec::new(Bound::Mean, 1000.0);
        spec.max = 3000.0;
        let (rates, s) = drive(spec.clone(), 1e9);
        assert_eq!(rates, [1000.0, 2000.0, 3000.0]);
        assert!(s.ended().unwrap().contains("highest rate"));
        let mut s = Search::new(spec).unwrap();
        assert_eq!(s.next_rate(), Some(1000.0));
        s.stop("the controller needs the cores");
        assert_eq!(s.next_rate(), None);
        let r = s.finish("t".into(), None);
        assert_eq!(r.ended, "the controller needs the cores");
        assert!(r.steps.is_empty() && r.sustained_qps.is_none());
    }

    #[test]
    fn a_search_with_bad_settings_does_not_start() {
        let mut spec = SearchSpec::new(Bound::Mean, 1000.0);
        spec.growth = 1.0;
        let e = Search::new(spec).unwrap_err();
        assert!(e.to_string().contains("growth"), "{e}");
    }

    #[test]
    fn success_rate_counts_errors_and_timeouts() {
        let c = Counters {
            completed: 90,
            errors: 9,
            timeouts: 10,
            ..Counters::default()
        };
        assert!((success_rate(&c) - 0.81).abs() < 1e-12);
        assert_eq!(success_rate(&Counters::default()), 0.0);
    }
}
