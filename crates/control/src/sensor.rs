//! What a sample reads:
//!
//! - the server's CPU: `utime + stime` of `/proc/PID/stat` (all its threads), as cores busy
//!   over the last sample;
//! - its request rate and connections from `stats` (`cmd_get + cmd_set`, `curr_connections`:
//!   kvlab's server and memcached alike), when its address is known;
//! - the latency: the p95 of the load generator's latest interval, read from the JSON
//!   lines `kvlab bench --live FILE` appends as each interval ends (latency from the planned
//!   send time, so queueing counts). An interval older than [`STALE_MS`] is no signal.
//!   Without a stats address the rate comes from the same lines.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use kvlab_bench::run::IntervalRow;

use crate::controller::Sensor;
use crate::event::unix_ms;
use crate::policy::Signal;

/// An interval that ended longer ago than this (ms) is not used.
pub const STALE_MS: u64 = 2_000;

/// How long one `stats` may take before the sample goes without it.
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
    stats: Option<SocketAddr>,
    live: Option<LiveFile>,
    ticks_per_s: f64,
    last_cpu: Option<(Duration, u64)>,
    last_requests: Option<(Duration, u64)>,
}

impl ServerSensor {
    /// A sensor of process `pid`, asking `stats` at `stats` and reading the load's
    /// intervals from `live`.
    pub fn new(pid: u32, stats: Option<SocketAddr>, live: Option<PathBuf>) -> ServerSensor {
        // SAFETY: sysconf has no preconditions.
        let tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        ServerSensor {
            pid,
            stats,
            live: live.map(LiveFile::new),
            ticks_per_s: if tck > 0 { tck as f64 } else { 100.0 },
            last_cpu: None,
            last_requests: None,
        }
    }

    fn cpu_ticks(&self) -> Option<u64> {
        let s = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).ok()?;
        let (_, rest) = s.rsplit_once(')')?;
        // After the name: state is field 3; utime and stime are fields 14 and 15.
        let f: Vec<&str> = rest.split_whitespace().collect();
        Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
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
        if let Some(addr) = self.stats {
            if let Ok(st) = kvlab_client::process::stats(addr, None, STATS_TIMEOUT) {
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
        }
        if let Some(live) = &mut self.live {
            live.poll();
            if let Some(row) = &live.latest {
                if unix_ms().saturating_sub(row.ts_end) <= STALE_MS {
                    s.p95_us = Some(row.latency.p95_us);
                    if self.stats.is_none() {
                        s.qps = Some(row.achieved_qps);
                    }
                }
            }
        }
        s
    }
}
