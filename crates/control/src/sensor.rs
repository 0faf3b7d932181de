//! What a sample reads:
//!
//! - the server's CPU: `utime + stime` of `/proc/PID/stat` (all its threads), as cores busy
//!   over the last sample;
//! - its request rate and connections from `stats` (`cmd_get + cmd_set`, `curr_connections`:
//!   kvlab's server and memcached alike), when its address is known — asked over one kept
//!   connection, `stats latency` in the same round trip, within 50 ms or not at all;
//! - from a kvlab server also `stats latency`, whose cumulative histograms differenced
//!   over the sample ([`crate::window`]) give the server's own p95 (service time plus the
//!   wait for an event loop) and the connections queued for its loops. A server that
//!   answers anything but its lines (memcached: `ERROR`) is not asked again;
//! - the latency: the p95 of the load generator's latest interval, read from the JSON
//!   lines `kvlab bench --live FILE` appends as each interval ends (latency from the planned
//!   send time, so queueing counts), or with a window (`Slack::latency_window_ms`) the p95
//!   over the intervals of that span, their histograms added up. An interval older than
//!   [`STALE_MS`] is no signal.
//!   Without a stats address the rate comes from the same lines.
//! - with a segment count ([`ServerSensor::count_segments`]), the requests of the load's
//!   current trace segment so far and how many were slower than the SLO, from the same
//!   rows' histograms ([`SegmentCount`]): the figure a segment budget guards.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use std::collections::VecDeque;

use kvlab_measure::IntervalRow;
use kvlab_measure::{new_histogram, Percentiles};

use crate::controller::Sensor;
use crate::event::unix_ms;
use crate::policy::{SegmentCount, Signal};
use crate::window::{Cumulative, Differ};

/// An interval that ended longer ago than this (ms) is not used.
pub const STALE_MS: u64 = 2_000;

/// How long one `stats` read may take before the sample goes without the server's figures.
const STATS_TIMEOUT: Duration = Duration::from_millis(50);

/// Reads a growing file of JSON lines (a `kvlab bench --live` file).
#[derive(Debug)]
pub struct LiveFile {
    path: PathBuf,
    offset: u64,
    partial: String,
    /// The latest measured interval read.
    pub latest: Option<IntervalRow>,
}

impl LiveFile {
    /// A reader of `path` (which may not exist yet).
    pub fn new(path: PathBuf) -> LiveFile {
        LiveFile {
            path,
            offset: 0,
            partial: String::new(),
            latest: None,
        }
    }

    /// Reads what was appended since the last call; returns the rows read.
    pub fn poll(&mut self) -> Vec<IntervalRow> {
        let mut out = Vec::new();
        let Ok(mut f) = File::open(&self.path) else {
            return out;
        };
        let mut buf = String::new();
        if f.seek(SeekFrom::Start(self.offset)).is_err() || f.read_to_string(&mut buf).is_err() {
            return out;
        }
        self.offset += buf.len() as u64;
        self.partial.push_str(&buf);
        while let Some(nl) = self.partial.find('\n') {
            let line: String = self.partial.drain(..=nl).collect();
            if let Ok(row) = serde_json::from_str::<IntervalRow>(line.trim()) {
                if !row.warmup {
                    self.latest = Some(row.clone());
                }
                out.push(row);
            }
        }
        out
    }
}

/// Samples a server process.
#[derive(Debug)]
pub struct ServerSensor {
    pid: u32,
    /// The server's `stats`, over one kept connection.
    stats: Option<kvlab_process::StatsConn>,
    live: Option<LiveFile>,
    /// The load's p95 is over its intervals of this many ms (0: the newest one's).
    window_ms: u64,
    /// The load's measured intervals within the window, oldest first.
    recent: VecDeque<IntervalRow>,
    ticks_per_s: f64,
    last_cpu: Option<(Duration, u64)>,
    last_requests: Option<(Duration, u64)>,
    latency: ServerLatency,
    /// The load's current trace segment, when counted.
    segment: Option<SegmentState>,
    /// The managed CPUs whose idle time is read, and the last reading.
    idle_of: Vec<usize>,
    last_idle: Option<(Duration, u64)>,
}

/// The server's `stats latency` from sample to sample.
#[derive(Debug, Default)]
struct ServerLatency {
    /// Whether the server answered it (unknown until asked).
    supported: Option<bool>,
    service: Differ,
    wait: Differ,
    last_t: Option<Duration>,
}

impl ServerLatency {
    /// Reads one answer of `stats latency` taken at `t` into `s`.
    fn read(&mut self, t: Duration, stats: &[(String, String)], s: &mut Signal) {
        let (Some(service), Some(wait)) = (
            Cumulative::parse("service_time", stats),
            Cumulative::parse("loop_wait", stats),
        ) else {
            self.supported = Some(false);
            return;
        };
        self.supported = Some(true);
        let dt = self.last_t.and_then(|t0| t.checked_sub(t0));
        self.last_t = Some(t);
        let (Some(service), Some(wait), Some(dt)) =
            (self.service.next(service), self.wait.next(wait), dt)
        else {
            return;
        };
        s.server_p95_us = Some(match (service.quantile(0.95), wait.quantile(0.95)) {
            (Some(a), b) => a + b.unwrap_or(0.0),
            (None, _) => 0.0,
        });
        if !dt.is_zero() {
            s.queued = Some(wait.sum_us as f64 / dt.as_micros() as f64);
        }
    }
}

impl ServerSensor {
    /// A sensor of process `pid`, asking `stats` at `stats` and reading the load's
    /// intervals from `live`, its p95 over the last `window` of them (zero: the newest).
    pub fn new(
        pid: u32,
        stats: Option<SocketAddr>,
        live: Option<PathBuf>,
        window: Duration,
    ) -> ServerSensor {
        ServerSensor {
            pid,
            stats: stats.map(|a| kvlab_process::StatsConn::new(a, STATS_TIMEOUT)),
            live: live.map(LiveFile::new),
            window_ms: window.as_millis() as u64,
            recent: VecDeque::new(),
            ticks_per_s: kvlab_procfs::clock_ticks_per_second() as f64,
            last_cpu: None,
            last_requests: None,
            latency: ServerLatency::default(),
            segment: None,
            idle_of: Vec::new(),
            last_idle: None,
        }
    }

    /// Also reads how many of `cpus` were idle over each sample ([`Signal::idle_cores`]).
    pub fn idle_of(mut self, cpus: &crate::CpuSet) -> ServerSensor {
        self.idle_of = cpus.iter().collect();
        self
    }

    /// Also counts the load's current trace segment: its requests so far and those slower
    /// than `slo_us` ([`Signal::segment`]).
    pub fn count_segments(mut self, slo_us: f64) -> ServerSensor {
        self.segment = Some(SegmentState {
            slo_ns: (slo_us * 1000.0).round() as u64,
            count: None,
            unknown: None,
        });
        self
    }

    /// The p95 over the intervals in the window (`None` without a window, or when one that
    /// served requests carries no histogram: an older `kvlab bench`).
    fn window_p95(&self) -> Option<f64> {
        if self.window_ms == 0 {
            return None;
        }
        let mut h = new_histogram();
        for r in &self.recent {
            match &r.latency_hist {
                Some(e) => e.add_to(&mut h).ok()?,
                None if r.counters.completed == 0 => {}
                None => return None,
            }
        }
        (!h.is_empty()).then(|| Percentiles::of(&h).p95_us)
    }

    fn cpu_ticks(&self) -> Option<u64> {
        kvlab_procfs::read_proc_stat(self.pid)
            .ok()
            .map(|s| s.cpu_ticks())
    }
}

/// The sensor's count of the load's current trace segment.
#[derive(Debug, Clone, Copy)]
struct SegmentState {
    /// The SLO, ns.
    slo_ns: u64,
    count: Option<SegmentCount>,
    /// The count of this step is unknown: a row that served requests carried no histogram
    /// (an older `kvlab bench`).
    unknown: Option<usize>,
}

impl SegmentState {
    /// Adds row `r` (a new step starts a new count).
    fn add(&mut self, r: &IntervalRow) {
        if self.count.is_none_or(|c| c.step != r.step) {
            self.count = Some(SegmentCount {
                step: r.step,
                ..SegmentCount::default()
            });
        }
        let mut h = new_histogram();
        match &r.latency_hist {
            Some(e) if e.add_to(&mut h).is_ok() => {
                if let Some(c) = self.count.as_mut() {
                    let n = h.len();
                    c.requests += n;
                    c.slow += n - h.count_between(0, self.slo_ns).min(n);
                }
            }
            _ if r.counters.completed == 0 => {}
            _ => self.unknown = Some(r.step),
        }
    }

    /// The count so far, unless it is unknown.
    fn current(&self) -> Option<SegmentCount> {
        self.count.filter(|c| self.unknown != Some(c.step))
    }
}

/// Change per second between two readings.
fn rate(last: &mut Option<(Duration, u64)>, t: Duration, v: u64) -> Option<f64> {
    let r = last.and_then(|(t0, v0)| {
        let dt = t.checked_sub(t0)?.as_secs_f64();
        (dt > 0.0).then(|| v.saturating_sub(v0) as f64 / dt)
    });
    *last = Some((t, v));
    r
}

impl Sensor for ServerSensor {
    fn sample(&mut self, t: Duration) -> Signal {
        let mut s = Signal {
            t,
            ..Signal::default()
        };
        if let Some(ticks) = self.cpu_ticks() {
            s.cpu = rate(&mut self.last_cpu, t, ticks).map(|r| r / self.ticks_per_s);
        }
        if !self.idle_of.is_empty() {
            if let Ok(idle) = kvlab_procfs::read_cpus_idle(&self.idle_of) {
                s.idle_cores = rate(&mut self.last_idle, t, idle).map(|r| r / self.ticks_per_s);
            }
        }
        if let Some(conn) = &mut self.stats {
            // `stats` and `stats latency` in one round trip; both or neither.
            let groups: &[Option<&str>] = match self.latency.supported {
                Some(false) => &[None],
                _ => &[None, Some("latency")],
            };
            if let Ok(answers) = conn.ask(groups) {
                let mut answers = answers.into_iter();
                if let Some(Ok(st)) = answers.next() {
                    let get = |k: &str| {
                        st.iter()
                            .find(|(n, _)| n == k)
                            .and_then(|(_, v)| v.parse::<u64>().ok())
                    };
                    s.conns = get("curr_connections");
                    if let (Some(g), Some(w)) = (get("cmd_get"), get("cmd_set")) {
                        s.qps = rate(&mut self.last_requests, t, g + w);
                    }
                }
                match answers.next() {
                    Some(Ok(lines)) => self.latency.read(t, &lines, &mut s),
                    // The server does not know the group (memcached: `ERROR`).
                    Some(Err(_)) => self.latency.supported = Some(false),
                    None => {}
                }
            }
        }
        let Some(live) = &mut self.live else {
            return s;
        };
        let rows = live.poll();
        let Some((ts_end, p95_us, qps)) = live
            .latest
            .as_ref()
            .map(|r| (r.ts_end, r.latency.p95_us, r.achieved_qps))
        else {
            return s;
        };
        if let Some(seg) = &mut self.segment {
            for r in rows.iter().filter(|r| !r.warmup) {
                seg.add(r);
            }
        }
        if self.window_ms > 0 {
            self.recent.extend(rows.into_iter().filter(|r| !r.warmup));
            let from = ts_end.saturating_sub(self.window_ms);
            while self.recent.front().is_some_and(|r| r.ts_end <= from) {
                self.recent.pop_front();
            }
        }
        if unix_ms().saturating_sub(ts_end) <= STALE_MS {
            s.p95_us = Some(self.window_p95().unwrap_or(p95_us));
            s.segment = self.segment.and_then(|seg| seg.current());
            if self.stats.is_none() {
                s.qps = Some(qps);
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(service: &[(u64, u64)], wait_sum_us: u64, waits: u64) -> Vec<(String, String)> {
        let count: u64 = service.last().map_or(0, |&(_, n)| n);
        let mut v = vec![
            ("service_time_count".to_string(), count.to_string()),
            ("service_time_sum_us".to_string(), "0".to_string()),
        ];
        v.extend(
            service
                .iter()
                .map(|(b, n)| (format!("service_time_le_{b}"), n.to_string())),
        );
        v.extend([
            ("loop_wait_count".to_string(), waits.to_string()),
            ("loop_wait_sum_us".to_string(), wait_sum_us.to_string()),
            ("loop_wait_le_1".to_string(), "0".to_string()),
            ("loop_wait_le_1000".to_string(), waits.to_string()),
        ]);
        v
    }

    #[test]
    fn the_server_latency_is_the_sample_s_window() {
        let mut l = ServerLatency::default();
        let mut s = Signal::default();
        let ms = Duration::from_millis;
        // A long calm history: a million requests within 10 µs.
        l.read(
            ms(0),
            &answer(&[(10, 1_000_000), (1000, 1_000_000)], 0, 0),
            &mut s,
        );
        assert_eq!(l.supported, Some(true));
        assert_eq!((s.server_p95_us, s.queued), (None, None));
        // Then 100 ms in which 100 requests all took 10..1000 µs, and waits summing to
        // 50 ms (half a connection waiting on average; each wait ≤ 1 ms).
        l.read(
            ms(100),
            &answer(&[(10, 1_000_000), (1000, 1_000_100)], 50_000, 100),
            &mut s,
        );
        let p95 = s.server_p95_us.expect("p95");
        let service = 10.0 + 0.95 * 990.0;
        let wait = 1.0 + 0.95 * 999.0;
        assert!((p95 - (service + wait)).abs() < 1e-6, "{p95}");
        assert_eq!(s.queued, Some(0.5));
        // Nothing served in the next sample: no latency to speak of.
        let mut s = Signal::default();
        l.read(
            ms(200),
            &answer(&[(10, 1_000_000), (1000, 1_000_100)], 50_000, 100),
            &mut s,
        );
        assert_eq!((s.server_p95_us, s.queued), (Some(0.0), Some(0.0)));
    }

    #[test]
    fn a_server_without_the_group_is_not_asked_again() {
        let mut l = ServerLatency::default();
        let mut s = Signal::default();
        l.read(Duration::ZERO, &[("pid".into(), "1".into())], &mut s);
        assert_eq!(l.supported, Some(false));
    }

    /// A row of the load as `kvlab bench --live` writes it, ending at `end` (ms since the
    /// epoch): 100 requests over 100 ms, `slow` of them at 2 ms, the rest at 200 µs.
    fn live_row(end: u64, slow: u64) -> String {
        step_row(end, slow, 0)
    }

    /// [`live_row`] of trace segment `step`.
    fn step_row(end: u64, slow: u64, step: usize) -> String {
        use kvlab_measure::{record, EncodedHistogram};
        let mut h = new_histogram();
        for k in 0..100 {
            record(&mut h, if k < slow { 2_000_000 } else { 200_000 });
        }
        let mut r = IntervalRow {
            ts_start: end - 100,
            ts_end: end,
            warmup: false,
            step,
            target_qps: None,
            achieved_qps: 1000.0,
            counters: Default::default(),
            latency: Percentiles::of(&h),
            latency_send: Default::default(),
            latency_hist: Some(EncodedHistogram::encode(&h).unwrap()),
        };
        r.counters.completed = 100;
        kvlab_measure::interval_json(&r) + "\n"
    }

    #[test]
    fn the_segment_count_adds_its_rows_and_starts_again_with_the_next_step() {
        // Segment 3: three rows, 5 + 0 + 7 slow of 300. Then segment 4 begins: 2 of 100.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("live.jsonl");
        let now = unix_ms();
        let rows = [
            step_row(now - 300, 5, 3),
            step_row(now - 200, 0, 3),
            step_row(now - 100, 7, 3),
        ];
        std::fs::write(&path, rows.concat()).unwrap();
        let mut s = ServerSensor::new(std::process::id(), None, Some(path.clone()), Duration::ZERO)
            .count_segments(1000.0);
        let seg = s.sample(Duration::ZERO).segment.unwrap();
        assert_eq!((seg.step, seg.requests, seg.slow), (3, 300, 12));
        // Read in pieces: the next poll adds only what is new.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        std::io::Write::write_all(&mut f, step_row(now, 2, 4).as_bytes()).unwrap();
        let seg = s.sample(Duration::from_millis(100)).segment.unwrap();
        assert_eq!((seg.step, seg.requests, seg.slow), (4, 100, 2));
        // Without counting segments there is no figure.
        let mut plain = ServerSensor::new(std::process::id(), None, Some(path), Duration::ZERO);
        assert!(plain.sample(Duration::ZERO).segment.is_none());
    }

    #[test]
    fn a_latency_window_weighs_a_burst_by_the_requests_it_slowed() {
        // The newest 100 ms has 40 slow requests of 100: its own p95 is 2 ms. Over the
        // last second (ten rows, 40 slow of 1000) the p95 is 200 µs; the slow row 1.5 s
        // ago is outside that window.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("live.jsonl");
        let now = unix_ms();
        let mut text = live_row(now - 1500, 100);
        for i in (1..10).rev() {
            text.push_str(&live_row(now - i * 100, 0));
        }
        text.push_str(&live_row(now, 40));
        std::fs::write(&path, text).unwrap();
        let me = std::process::id();
        let p95 = |window_ms: u64| {
            let mut s = ServerSensor::new(
                me,
                None,
                Some(path.clone()),
                Duration::from_millis(window_ms),
            );
            s.sample(Duration::ZERO).p95_us.unwrap()
        };
        assert!(p95(0) > 1900.0, "{}", p95(0));
        assert!(p95(1000) < 250.0, "{}", p95(1000));
        // Two seconds take in the old slow row too: 140 slow of 1100.
        assert!(p95(2000) > 1900.0, "{}", p95(2000));
    }
}
