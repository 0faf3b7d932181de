//! What a run leaves on disk: each run's record ([`RawRun`], with its CPU, proxy and
//! machine figures), the experiment's [`Meta`], their dates, and their JSON (written and
//! loaded).

use std::path::{Path, PathBuf};

use anyhow::Context;
use hdrhistogram::Histogram;
use kvlab_bench::{Protocol, RunResult};
use serde::{Deserialize, Serialize};

use crate::generator::ExternalRun;
use crate::placement::{HostCpu, HostMeta, PlacedProcess};
use crate::spec::{Level, Overrides};

/// The system's CPU time over a run's measured time.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CpuSample {
    /// The process read.
    pub pid: u32,
    /// utime + stime at the start of measurement, clock ticks.
    pub start_ticks: u64,
    /// utime + stime at the end, clock ticks.
    pub end_ticks: u64,
    /// Clock ticks per second.
    pub ticks_per_second: u64,
    /// Wall time between the readings, s.
    pub elapsed_s: f64,
    /// CPU-seconds per second (1 = one core busy).
    pub utilization: f64,
    /// Per interval: (seconds since the start of measurement, utilization in the interval).
    #[serde(default)]
    pub intervals: Vec<(f64, f64)>,
}

/// A latency histogram (ns) that serialises in HdrHistogram's interchange format.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hist(#[serde(with = "kvlab_bench::stats::hist_serde")] pub Histogram<u64>);

/// One run as stored in `raw/NNNN.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RawRun {
    /// Index in measurement order.
    pub index: usize,
    /// Part name.
    pub part: String,
    /// Point index in the part.
    pub point: usize,
    /// The point's levels, in factor order.
    pub levels: Vec<(String, Level)>,
    /// System name.
    pub system: String,
    /// The protocol the load generator spoke.
    #[serde(default)]
    pub protocol: Protocol,
    /// Repetition, from 0.
    pub repetition: usize,
    /// The system's flags (rendered).
    pub args: Vec<String>,
    /// How it was started.
    pub command: Vec<String>,
    /// Its answer to `version`.
    pub version: String,
    /// Its worker threads, as it reports them (`threads` in `stats`).
    pub server_threads: u32,
    /// Closed-loop clients (connections × depth), 0 in open loop.
    pub population: usize,
    /// Closed-loop think time, s.
    pub think_s: f64,
    /// Start, RFC 3339 UTC.
    pub started: String,
    /// The system's CPU time, when its pid is known (a proxy's own, its backends' not
    /// included: see [`ProxyFigures::backend_cpu`]).
    pub cpu: Option<CpuSample>,
    /// A proxy's backends, as they were started.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backends: Vec<Vec<String>>,
    /// A proxy's own figures over the measured time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ProxyFigures>,
    /// A proxy's backends' CPU over the measured time, summed (cores busy), when every
    /// backend's could be read (either kind of proxy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_cpu: Option<f64>,
    /// The whole machine's CPU over the measured time (`/proc/stat`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<MachineCpu>,
    /// The CPUs the system was pinned to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<String>,
    /// The command run beside it (interference), and its CPU over the run (cores busy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub corunner: Option<(String, Option<f64>)>,
    /// What kvlab bench measured (none when an external generator ran).
    pub result: Option<RunResult>,
    /// What an external generator (`generator = "memcaslap"`, …) measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<ExternalRun>,
    /// Latency from the planned send, ns, over the measured time.
    pub latency_hist: Option<Hist>,
    /// Why the run failed.
    pub error: Option<String>,
    /// The processes of the run placed on hosts (the system's, its backends', the agents'),
    /// with their pids there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placed: Vec<PlacedProcess>,
    /// Each host's machine and the lab's processes on it over the measured time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<HostCpu>,
    /// Each agent's share of the load (the run's figures are their sum, the histogram
    /// their merge).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agents: Vec<AgentShare>,
}

/// One agent's part of a run: where it ran, what it loaded, what it measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentShare {
    /// Its host.
    pub host: String,
    /// The system instance it loaded.
    pub target: String,
    /// Its clients (closed loop: connections × depth; 0 in open loop).
    pub population: usize,
    /// Replies over the measured time.
    pub completed: u64,
    /// Replies per second.
    pub throughput_qps: f64,
    /// Mean latency from the planned send, µs.
    pub mean_us: f64,
    /// Its latency histogram, ns.
    pub latency_hist: Option<Hist>,
}

/// Facts about the experiment and the machine, `meta.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Meta {
    /// kvlab version.
    pub kvlab_version: String,
    /// Git commit kvlab was built from.
    pub commit: String,
    /// Start, RFC 3339 UTC.
    pub date: String,
    /// Wall time of the whole experiment, s (0 while it runs).
    pub elapsed_s: f64,
    /// Host name.
    pub host: String,
    /// Kernel release.
    pub kernel: String,
    /// CPU model.
    pub cpu_model: String,
    /// Cores available to kvlab.
    pub cores: usize,
    /// Physical memory, bytes.
    pub memory_bytes: u64,
    /// The command line.
    pub command: Vec<String>,
    /// The experiment file's path (or "(built in)").
    pub experiment_file: String,
    /// Its text.
    pub experiment_text: String,
    /// The command line's overrides of the file's values.
    #[serde(default)]
    pub overrides: Overrides,
    /// Systems skipped, with the reason.
    pub skipped: Vec<(String, String)>,
    /// Runs planned.
    pub runs: usize,
    /// The hosts roles ran on, with their clocks at the start and the end.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<HostMeta>,
}

/// The commit kvlab was built from (build.rs), or "unknown".
pub fn commit() -> &'static str {
    option_env!("KVLAB_GIT_COMMIT").unwrap_or("unknown")
}

fn read_trim(p: &str) -> String {
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

impl Meta {
    /// Collects the facts now.
    pub fn collect(file: &str, text: &str, overrides: &Overrides) -> Meta {
        let memory_bytes = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find(|l| l.starts_with("MemTotal:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|kb| kb.parse::<u64>().ok())
            })
            .map_or(0, |kb| kb * 1024);
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|c| {
                c.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_default();
        Meta {
            kvlab_version: env!("CARGO_PKG_VERSION").into(),
            commit: commit().into(),
            date: rfc3339(std::time::SystemTime::now()),
            elapsed_s: 0.0,
            host: read_trim("/proc/sys/kernel/hostname"),
            kernel: read_trim("/proc/sys/kernel/osrelease"),
            cpu_model,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory_bytes,
            command: std::env::args().collect(),
            experiment_file: file.into(),
            experiment_text: text.into(),
            overrides: overrides.clone(),
            skipped: Vec::new(),
            runs: 0,
            hosts: Vec::new(),
        }
    }
}

/// `t` as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn rfc3339(t: std::time::SystemTime) -> String {
    let (y, mo, d, h, mi, s) = civil(t);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}

/// `t` as `YYYYMMDD-HHMMSS` (UTC), for directory names.
pub fn stamp(t: std::time::SystemTime) -> String {
    let (y, mo, d, h, mi, s) = civil(t);
    format!("{y:04}{mo:02}{d:02}-{h:02}{mi:02}{s:02}")
}

fn civil(t: std::time::SystemTime) -> (i64, u32, u32, u64, u64, u64) {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d, rem / 3600, rem % 3600 / 60, rem % 60)
}

/// A proxy's own figures over a run's measured time, from its `stats` read at the same two
/// moments as its CPU time ([`CpuSample`]: the end of the last warm-up interval, or without
/// warm-up the end of the first interval, and the end of the last one), so the load phase
/// and the warm-up never count. Each stage's mean is Δsum / Δcount between the two readings
/// (`proxy_<stage>_sum_us`, `proxy_<stage>_count`); a proxy whose `stats` lacks those gives
/// each stage's cumulative mean (`proxy_<stage>_mean_us`, 0.1 µs) times `proxy_requests`
/// instead, an approximation (`exact` false) whose error grows with the requests the proxy
/// served before the run. The mean queue length is Δ`proxy_queue_area_us` / Δt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProxyFigures {
    /// Requests the proxy finished (`proxy_requests`).
    pub requests: u64,
    /// Mean time of the network thread's own parse and hand-off per request, µs.
    pub net_us: f64,
    /// Mean time in the queue, µs.
    pub queue_us: f64,
    /// Mean time in the worker, µs (backend time included).
    pub worker_us: f64,
    /// Mean time waiting for backends (part of the worker's), µs.
    pub backend_us: f64,
    /// Mean time in the proxy (queue + worker), µs.
    pub total_us: f64,
    /// Time-averaged queue length (requests).
    pub queue_len: f64,
    /// Backend requests per request (`proxy_backend_requests`): replicas written, parts of a
    /// split multi-get.
    #[serde(default)]
    pub backend_requests: f64,
    /// Wall time between the two readings, s.
    pub elapsed_s: f64,
    /// The proxy's backends.
    pub backends: usize,
    /// The backends' CPU, summed (cores busy), when every backend's could be read.
    pub backend_cpu: Option<f64>,
    /// Whether the means come from exact sums and counts (else from rounded cumulative means).
    pub exact: bool,
}

impl ProxyFigures {
    /// The figures between two `stats` readings `elapsed_s` apart (`backends` and
    /// `backend_cpu` left for the caller); `None` when a needed figure is missing or no
    /// request finished in between.
    pub fn between(
        before: &[(String, String)],
        after: &[(String, String)],
        elapsed_s: f64,
    ) -> Option<ProxyFigures> {
        let get = |s: &[(String, String)], k: &str| {
            s.iter()
                .find(|(n, _)| n == k)
                .and_then(|(_, v)| v.parse::<f64>().ok())
        };
        let delta = |k: &str| Some(get(after, k)? - get(before, k)?);
        let requests = delta("proxy_requests")?;
        if !(requests > 0.0 && elapsed_s > 0.0) {
            return None;
        }
        let mut exact = true;
        let mut mean = |stage: &str| -> Option<f64> {
            let sum = delta(&format!("proxy_{stage}_sum_us"));
            let count = delta(&format!("proxy_{stage}_count"));
            if let (Some(sum), Some(count)) = (sum, count) {
                return Some(if count > 0.0 { sum / count } else { 0.0 });
            }
            exact = false;
            let mean_us = format!("proxy_{stage}_mean_us");
            let sum = |s| Some(get(s, &mean_us)? * get(s, "proxy_requests")?);
            Some(((sum(after)? - sum(before)?) / requests).max(0.0))
        };
        let (net_us, queue_us, worker_us) = (mean("net")?, mean("queue")?, mean("worker")?);
        let (backend_us, total_us) = (mean("backend")?, mean("total")?);
        Some(ProxyFigures {
            requests: requests as u64,
            net_us,
            queue_us,
            worker_us,
            backend_us,
            total_us,
            queue_len: delta("proxy_queue_area_us")? / (elapsed_s * 1e6),
            backend_requests: delta("proxy_backend_requests").unwrap_or(0.0) / requests,
            elapsed_s,
            backends: 0,
            backend_cpu: None,
            exact,
        })
    }
}

/// The whole machine's CPU over a run's measured time (`/proc/stat`, every CPU summed): what
/// a request costs everything on the box together — the kernel's loopback TCP work included —
/// and how much of the time the hypervisor gave the CPUs to others (runs with much of it are
/// noise).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MachineCpu {
    /// CPUs busy (user, nice, system, irq, softirq), cores.
    pub busy_cores: f64,
    /// Stolen time, share of all the CPUs' time (0..1).
    pub steal: f64,
}

/// Writes `v` as pretty JSON.
pub fn write_json<T: Serialize>(path: &Path, v: &T) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(v)?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}

/// Reads `meta.json` and `raw/*.json` of a results directory.
pub fn load(dir: &Path) -> anyhow::Result<(Meta, Vec<RawRun>)> {
    let mp = dir.join("meta.json");
    let text = std::fs::read_to_string(&mp).with_context(|| {
        format!(
            "reading {} (is {} a results directory of `kvlab lab run`?)",
            mp.display(),
            dir.display()
        )
    })?;
    let meta: Meta =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", mp.display()))?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("raw"))
        .with_context(|| format!("reading {}", dir.join("raw").display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut runs = Vec::new();
    for f in files {
        let text =
            std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
        let r: RawRun =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", f.display()))?;
        runs.push(r);
    }
    runs.sort_by_key(|r| r.index);
    Ok((meta, runs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        assert_eq!(rfc3339(t), "2023-11-14T22:13:20Z");
        assert_eq!(stamp(t), "20231114-221320");
    }
}
