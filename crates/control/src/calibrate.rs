//! Calibration where the controller runs: the server's capacity per core count (requests/s
//! whose p95 from the planned send stays within the SLO), measured on this machine before
//! the jobs start, for the predictive policy.
//!
//! ```text
//!  for k in 1..=CPUs:  server's threads ── sched_setaffinity ──► the k lowest CPUs
//!                      this process: a thread pinned to the generator's CPUs runs
//!                      kvlab_bench::sustained::find_sustained (open loop, the load's
//!                      workload, p95 < SLO, ≥ 99 % answered; bounded in time)
//!                      ──► capacity[k - 1] = the largest rate that passed
//!  then the server gets every CPU back
//! ```
//!
//! Why a scan and not an online estimate from the sensor's rate and p95: a trace only
//! visits the rates it draws, mostly on the cores the policy gave at the time, so an
//! online estimate learns the capacity of a core count only where the trace pushed it
//! to the SLO — the rates the predictive policy needs most are the ones it sees least.
//! A scan measures every core count up to its limit in a bounded time (about 10–20 s a
//! core count at 1 s steps), with the same search `kvlab bench --find-sustained` runs.
//! It needs the server to itself: another load at the same time would be measured
//! too, so [`calibrate`] refuses when the server's `stats` show one.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kvlab_bench::load::Options as LoadOptions;
use kvlab_bench::sustained::{find_sustained, Bound, SearchSpec};
use serde::{Deserialize, Serialize};

use crate::cpus::{pinned, CpuSet};
use crate::event::unix_ms;
use crate::machine::set_affinity;
use crate::ControlError;

/// How to calibrate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CalibrateSpec {
    /// The SLO: p95 from the planned send below this, µs.
    pub slo_p95_us: f64,
    /// The load's workload as `kvlab bench` keys (keys, value_size, mix, connections, …);
    /// its rate keys are replaced by the search's.
    pub load: LoadOptions,
    /// The CPUs the generator runs on (the real load's), `None`: wherever this process may.
    pub generator_cpus: Option<CpuSet>,
    /// Measured seconds per rate.
    pub step_s: f64,
    /// Warm-up per rate (run and discarded), s.
    pub warmup_s: f64,
    /// The first rate tried, requests/s.
    pub start_qps: f64,
    /// The most time one core count's search may take, s.
    pub max_time_s: f64,
}

impl CalibrateSpec {
    /// A calibration against `slo_p95_us` with the default steps: from 5000 req/s, 1 s
    /// steps after 0.3 s of warm-up, at most 30 s a core count.
    pub fn new(slo_p95_us: f64, load: LoadOptions) -> CalibrateSpec {
        CalibrateSpec {
            slo_p95_us,
            load,
            generator_cpus: None,
            step_s: 1.0,
            warmup_s: 0.3,
            start_qps: 5000.0,
            max_time_s: 30.0,
        }
    }

    fn search(&self) -> SearchSpec {
        let mut s = SearchSpec::new(Bound::P95, self.slo_p95_us);
        s.start = self.start_qps;
        s.min = (self.start_qps / 64.0).max(10.0);
        s.step_s = self.step_s;
        s.warmup_s = self.warmup_s;
        s.max_time_s = self.max_time_s;
        // A rate fails only when a second try fails too: at low rates this kind of machine's
        // latency follows its CPUs' wake-ups more than the rate (docs/control.md), and one
        // slow step must not end the growth far below the knee.
        s.retries = 1;
        s
    }
}

/// One core count's search.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CoreScan {
    /// The server's cores.
    pub cores: usize,
    /// Its CPUs.
    pub server_cpus: String,
    /// The largest rate that passed, requests/s (`None`: none did).
    pub sustained_qps: Option<f64>,
    /// The smallest rate that failed, requests/s.
    pub first_bad_qps: Option<f64>,
    /// The p95 at the sustained rate, µs.
    pub p95_us: Option<f64>,
    /// Rates measured.
    pub steps: usize,
    /// Why the search ended.
    pub ended: String,
    /// How long it took, s.
    pub took_s: f64,
}

/// What a calibration found, and where and when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// Requests/s within the SLO with 1, 2, … cores (`capacity[c - 1]`; 0 where no rate
    /// passed): what the predictive policy takes.
    pub capacity: Vec<f64>,
    /// Each core count's search.
    pub scans: Vec<CoreScan>,
    /// How it searched.
    pub spec: CalibrateSpec,
    /// When it started, ms since the Unix epoch.
    pub unix_ms: u64,
    /// `/proc/loadavg` before and after (the machine's load while it measured).
    pub loadavg: [String; 2],
    /// The machine's CPU stolen by the hypervisor while it measured, % of the CPUs' time.
    pub steal_pct: Option<f64>,
}

impl Calibration {
    /// The figures in one line: `1 core 41000 req/s, 2 cores 78000 req/s`.
    pub fn text(&self) -> String {
        self.capacity
            .iter()
            .enumerate()
            .map(|(i, q)| {
                let s = if i == 0 { "" } else { "s" };
                let measured = self.scans.get(i).and_then(|c| c.sustained_qps);
                match measured {
                    Some(m) if m < *q => format!(
                        "{} core{s} {q:.0} req/s (measured {m:.0}: taken as fewer cores')",
                        i + 1
                    ),
                    _ => format!("{} core{s} {q:.0} req/s", i + 1),
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The capacities the policy takes from each core count's measured one: never less than
/// fewer cores' (a server given more cores can leave one idle; a smaller figure is the
/// machine's noise at the moment it was measured, not the server's limit).
fn at_least_fewer_cores(measured: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut best = 0.0f64;
    measured
        .map(|q| {
            best = best.max(q);
            best
        })
        .collect()
}

/// The calibration's workload from `kvlab bench` keys (`[workload]` of an experiment).
pub fn load_of(table: toml::Table) -> Result<LoadOptions, ControlError> {
    toml::Value::Table(table)
        .try_into::<LoadOptions>()
        .map_err(|e| ControlError::Spec(format!("the calibration's workload: {}", e.message())))
}

/// [`load_of`] from `KEY=VALUE` texts (`keys=50000`, `mix=get=9,set=1`): a value that is
/// not a TOML number, boolean or array is a string.
pub fn load_of_pairs(pairs: &[String]) -> Result<LoadOptions, ControlError> {
    let mut t = toml::Table::new();
    for p in pairs {
        let (k, v) = p
            .split_once('=')
            .ok_or_else(|| ControlError::Spec(format!("{p:?}: want KEY=VALUE")))?;
        let key = k.trim().replace('-', "_");
        let value = toml::from_str::<toml::Table>(&format!("v = {v}"))
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(v.to_string()));
        t.insert(key, value);
    }
    load_of(t)
}

/// The machine's load now (`/proc/loadavg`'s first three fields).
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|t| t.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// The server's requests served so far (`cmd_get + cmd_set` of `stats`).
fn requests(addr: SocketAddr) -> Result<u64, ControlError> {
    let st = kvlab_process::stats(addr, None, Duration::from_secs(2))
        .map_err(|e| ControlError::io(format!("stats of {addr}"), e))?;
    let get = |k: &str| {
        st.iter()
            .find(|(n, _)| n == k)
            .and_then(|(_, v)| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Ok(get("cmd_get") + get("cmd_set"))
}

/// Fails when the server at `addr` serves another load now (more than 50 req/s over half
/// a second): a calibration would measure the two together.
pub fn check_idle(addr: SocketAddr) -> Result<(), ControlError> {
    let a = requests(addr)?;
    std::thread::sleep(Duration::from_millis(500));
    let rate = (requests(addr)?.saturating_sub(a)) as f64 * 2.0;
    if rate > 50.0 {
        return Err(ControlError::Spec(format!(
            "the server serves another load ({rate:.0} req/s): calibrate before the load \
             starts (kvlab control --calibrate-only), or give --capacity"
        )));
    }
    Ok(())
}

/// Measures the capacity per core count of the server `pid` (answering at `addr`) on
/// `cpus`: for 1 ..= all of them, the server confined to the lowest-numbered ones, a
/// sustained-rate search; every CPU is the server's again afterwards. `stop` ends it early
/// (between searches) with an error.
pub fn calibrate(
    pid: u32,
    addr: SocketAddr,
    cpus: &CpuSet,
    spec: &CalibrateSpec,
    stop: &dyn Fn() -> bool,
) -> Result<Calibration, ControlError> {
    check_idle(addr)?;
    let search = spec.search();
    let load = LoadOptions {
        qps: Some(spec.start_qps),
        qps_min: None,
        qps_max: None,
        qps_list: None,
        qps_file: None,
        scan: None,
        ..spec.load.clone()
    }
    .to_load()
    .map_err(|e| ControlError::Spec(format!("the calibration's load: {e}")))?;
    let mut base = load
        .config(addr)
        .map_err(|e| ControlError::Spec(format!("the calibration's load: {e}")))?;
    let started = unix_ms();
    let before = (loadavg(), kvlab_procfs::read_machine_ticks().ok());
    let mut scans = Vec::new();
    let mut result = Ok(());
    for k in 1..=cpus.len() {
        if stop() {
            result = Err(ControlError::Spec("calibration stopped".into()));
            break;
        }
        let (server, _) = cpus.split(k);
        if let Err(e) = set_affinity(pid, &server) {
            result = Err(e);
            break;
        }
        let t0 = Instant::now();
        let found = pinned(spec.generator_cpus.as_ref(), || {
            find_sustained(&base, &search, &[], &mut |_| {})
        })
        .and_then(|r| {
            r.map_err(|e| ControlError::Spec(format!("calibration at {k} core(s): {e}")))
        });
        // The cache is filled once, before the first search.
        base.load = false;
        match found {
            Ok(r) => scans.push(CoreScan {
                cores: k,
                server_cpus: server.to_string(),
                sustained_qps: r.sustained_qps,
                first_bad_qps: r.first_bad_qps,
                p95_us: r.sustained.as_ref().map(|s| s.p95_us),
                steps: r.steps.len(),
                ended: r.ended,
                took_s: t0.elapsed().as_secs_f64(),
            }),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    let back = set_affinity(pid, cpus);
    result?;
    back?;
    let steal_pct = match (before.1, kvlab_procfs::read_machine_ticks().ok()) {
        (Some(a), Some(b)) if b.total > a.total => {
            Some((b.steal - a.steal) as f64 / (b.total - a.total) as f64 * 100.0)
        }
        _ => None,
    };
    let capacity = at_least_fewer_cores(scans.iter().map(|s| s.sustained_qps.unwrap_or(0.0)));
    if capacity.iter().all(|&c| c <= 0.0) {
        let why: Vec<String> = scans
            .iter()
            .map(|s| format!("{} core(s): {}", s.cores, s.ended))
            .collect();
        return Err(ControlError::Spec(format!(
            "calibration: no rate kept the p95 under {} µs at any core count ({}; load \
             average {} before, {} after): the machine does not meet this SLO now",
            spec.slo_p95_us,
            why.join("; "),
            before.0,
            loadavg()
        )));
    }
    Ok(Calibration {
        capacity,
        scans,
        spec: spec.clone(),
        unix_ms: started,
        loadavg: [before.0, loadavg()],
        steal_pct,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_figures_read_as_cores_and_rates() {
        let c = Calibration {
            capacity: vec![41000.0, 78000.4],
            scans: Vec::new(),
            spec: CalibrateSpec::new(1000.0, LoadOptions::default()),
            unix_ms: 0,
            loadavg: ["0".into(), "0".into()],
            steal_pct: None,
        };
        assert_eq!(c.text(), "1 core 41000 req/s, 2 cores 78000 req/s");
        let s = c.spec.search();
        assert_eq!((s.bound, s.bound_us, s.start), (Bound::P95, 1000.0, 5000.0));
        assert!(s.validate().is_ok());
    }

    #[test]
    fn more_cores_are_taken_as_serving_at_least_what_fewer_do() {
        let measured = [61688.0, 19152.0, 70000.0];
        assert_eq!(
            at_least_fewer_cores(measured.into_iter()),
            [61688.0, 61688.0, 70000.0]
        );
        let scan = |cores, q| CoreScan {
            cores,
            server_cpus: String::new(),
            sustained_qps: Some(q),
            first_bad_qps: None,
            p95_us: None,
            steps: 0,
            ended: String::new(),
            took_s: 0.0,
        };
        let c = Calibration {
            capacity: at_least_fewer_cores([61688.0, 19152.0].into_iter()),
            scans: vec![scan(1, 61688.0), scan(2, 19152.0)],
            spec: CalibrateSpec::new(1000.0, LoadOptions::default()),
            unix_ms: 0,
            loadavg: ["0".into(), "0".into()],
            steal_pct: None,
        };
        assert_eq!(
            c.text(),
            "1 core 61688 req/s, 2 cores 61688 req/s (measured 19152: taken as fewer cores')"
        );
    }

    #[test]
    fn the_workload_maps_onto_the_bench_s_keys() {
        let o = load_of_pairs(&[
            "keys=50000".into(),
            "value-size=100".into(),
            "mix=get=9,set=1".into(),
        ])
        .unwrap();
        assert_eq!(o.keys, Some(50000));
        assert_eq!(o.mix.as_deref(), Some("get=9,set=1"));
        assert!(o.value_size.is_some());
        assert!(load_of_pairs(&["colour=blue".into()]).is_err());
        assert!(load_of_pairs(&["keys".into()]).is_err());
    }
}
