//! What the runner reads about a system around a run's measured time: its CPU time from
//! `/proc/<pid>/stat`, a proxy's backends' CPU, and kvlab proxy's `stats` — at every interval
//! boundary kvlab bench reports, or before and after an external generator's measured run —
//! and the figures over the measured window made from them.

use std::time::Instant;

use kvlab_analysis::laws;
use kvlab_process as process;

use std::sync::Arc;

use super::results::{CpuSample, MachineCpu, ProxyFigures, RawRun};
use crate::placement::{host_cpu, HostsReading, Placement};
use crate::spec::SystemKind;
use crate::system::Instance;

/// How long the runner waits for a proxy's `stats`.
const STATS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// What the runner reads about a system at each boundary: its CPU, a proxy's backends'
/// CPU and a proxy's `stats`.
pub(super) struct Reader {
    pub(super) pid: Option<u32>,
    backend_pids: Vec<u32>,
    /// kvlab's proxy (only it reports its stages in `stats`): its backends.
    pub(super) proxy: Option<usize>,
    addr: std::net::SocketAddr,
    /// A system on hosts: its placement and the processes read there — the system's
    /// instances, its backends, then the agents.
    placed: Option<Placed>,
}

struct Placed {
    placement: Arc<Placement>,
    procs: Vec<kvlab_hosts::Started>,
    /// How many of `procs` are the system's own, and how many its backends'.
    own: usize,
    backends: usize,
}

impl Reader {
    pub(super) fn of(inst: &Instance, agents: Vec<kvlab_hosts::Started>) -> Reader {
        let placed = inst.placement().map(|placement| {
            let (own, backends) = inst.placed_processes();
            let (n_own, n_backends) = (own.len(), backends.len());
            Placed {
                placement,
                procs: own.into_iter().chain(backends).chain(agents).collect(),
                own: n_own,
                backends: n_backends,
            }
        });
        Reader {
            // A placed system's pid is its host's: read there, not here.
            pid: inst.pid.filter(|_| placed.is_none()),
            placed,
            backend_pids: inst.backend_pids(),
            proxy: inst
                .flags
                .backends
                .as_ref()
                .map(|(n, _)| *n)
                .filter(|_| inst.kind == SystemKind::Proxy),
            addr: inst.addr,
        }
    }

    /// Records in `raw` what `readings` (taken by this reader, `ticks` a second) say: the
    /// system's CPU, a proxy's stages, its backends' CPU and the machine's.
    pub(super) fn record(&self, raw: &mut RawRun, ticks: u64, readings: &[Reading]) {
        raw.cpu = cpu_sample(self.pid, ticks, readings);
        raw.proxy = self.proxy.and_then(|n| proxy_figures(readings, ticks, n));
        raw.backend_cpu = backend_cpu(readings, ticks);
        raw.machine = machine_cpu(readings, ticks);
    }

    /// The hosts read now, for a system on hosts (its processes, its backends', the
    /// agents'); none otherwise.
    pub(super) fn read_hosts(&self) -> Option<HostsReading> {
        self.placed.as_ref().map(|p| p.placement.read(&p.procs))
    }

    /// Records in `raw` what two host readings around a run say: each host's machine and
    /// the lab's processes on it, the system's CPU (its instances' summed) and its
    /// backends'. Over the whole run, warm-up included: a reading over ssh can take longer
    /// than an interval on a loaded machine, too long to mark an interval's boundary.
    pub(super) fn record_hosts(
        &self,
        raw: &mut RawRun,
        ticks: u64,
        a: Option<HostsReading>,
        b: Option<HostsReading>,
    ) {
        let (Some(p), Some(a), Some(b)) = (&self.placed, a, b) else {
            return;
        };
        raw.hosts = host_cpu(&a, &b, &p.procs);
        let elapsed = (b.at - a.at).as_secs_f64();
        let secs = |r: &HostsReading, range: std::ops::Range<usize>| -> Option<f64> {
            r.cpu[range].iter().copied().sum::<Option<f64>>()
        };
        let cores = |range: std::ops::Range<usize>| -> Option<f64> {
            let d = secs(&b, range.clone())? - secs(&a, range)?;
            (elapsed > 0.0).then(|| d.max(0.0) / elapsed)
        };
        if let (Some(u), Some(s0), Some(s1)) =
            (cores(0..p.own), secs(&a, 0..p.own), secs(&b, 0..p.own))
        {
            raw.cpu = Some(CpuSample {
                pid: p.procs.first().map_or(0, |s| s.pid),
                start_ticks: (s0 * ticks as f64).round() as u64,
                end_ticks: (s1 * ticks as f64).round() as u64,
                ticks_per_second: ticks,
                elapsed_s: elapsed,
                utilization: u,
                intervals: Vec::new(),
            });
        }
        if p.backends > 0 {
            raw.backend_cpu = cores(p.own..p.own + p.backends).or(raw.backend_cpu);
        }
    }

    /// A reading now; `warmup`: the interval that ends here was warm-up.
    pub(super) fn read(&self, warmup: bool) -> Reading {
        let backend_ticks = (!self.backend_pids.is_empty())
            .then(|| {
                self.backend_pids
                    .iter()
                    .map(|&p| laws::read_proc_stat(p).ok().map(|s| s.cpu_ticks()))
                    .sum::<Option<u64>>()
            })
            .flatten();
        Reading {
            warmup,
            at: Instant::now(),
            machine: kvlab_procfs::read_machine_ticks().ok(),
            cpu: self.pid.and_then(|p| laws::read_proc_stat(p).ok()),
            backend_ticks,
            stats: self
                .proxy
                .and_then(|_| process::stats(self.addr, None, STATS_TIMEOUT).ok()),
        }
    }
}

/// What the runner reads at an interval boundary the generator reports.
pub(super) struct Reading {
    /// The whole machine's CPU time (`/proc/stat`).
    machine: Option<kvlab_procfs::MachineTicks>,
    /// The interval was warm-up.
    pub(super) warmup: bool,
    at: Instant,
    /// The system's CPU time.
    cpu: Option<laws::ProcStat>,
    /// A proxy's backends' CPU time, summed (clock ticks; none when one was unreadable).
    backend_ticks: Option<u64>,
    /// A proxy's `stats`.
    stats: Option<Vec<(String, String)>>,
}

/// The readings that bracket the measured time: the end of the last warm-up interval (or,
/// without warm-up, the end of the first interval, so the load phase never counts) and the
/// end of the last one.
fn window(readings: &[Reading]) -> Option<(usize, usize)> {
    let start = match readings.iter().rposition(|r| r.warmup) {
        Some(i) => i,
        None if readings.len() >= 2 => 0,
        None => return None,
    };
    let end = readings.len() - 1;
    (end > start).then_some((start, end))
}

/// A proxy's figures over the measured window, with its `backends`' CPU.
fn proxy_figures(readings: &[Reading], ticks: u64, backends: usize) -> Option<ProxyFigures> {
    let (start, end) = window(readings)?;
    let (a, b) = (&readings[start], &readings[end]);
    let elapsed = (b.at - a.at).as_secs_f64();
    let mut f = ProxyFigures::between(a.stats.as_deref()?, b.stats.as_deref()?, elapsed)?;
    f.backends = backends;
    f.backend_cpu = backend_cpu(readings, ticks);
    Some(f)
}

/// A proxy's backends' CPU over the measured window, summed (cores busy).
fn backend_cpu(readings: &[Reading], ticks: u64) -> Option<f64> {
    let (start, end) = window(readings)?;
    let (a, b) = (&readings[start], &readings[end]);
    let elapsed = (b.at - a.at).as_secs_f64();
    match (a.backend_ticks, b.backend_ticks) {
        (Some(t0), Some(t1)) if t1 >= t0 && ticks > 0 && elapsed > 0.0 => {
            Some((t1 - t0) as f64 / ticks as f64 / elapsed)
        }
        _ => None,
    }
}

/// The machine's CPU over the measured window.
fn machine_cpu(readings: &[Reading], ticks: u64) -> Option<MachineCpu> {
    let (start, end) = window(readings)?;
    let (a, b) = (readings[start].machine?, readings[end].machine?);
    let elapsed = (readings[end].at - readings[start].at).as_secs_f64();
    let all = b.total.checked_sub(a.total)?;
    if !(elapsed > 0.0 && ticks > 0 && all > 0) {
        return None;
    }
    Some(MachineCpu {
        busy_cores: b.busy.checked_sub(a.busy)? as f64 / ticks as f64 / elapsed,
        steal: b.steal.checked_sub(a.steal)? as f64 / all as f64,
    })
}

fn cpu_sample(pid: Option<u32>, ticks: u64, readings: &[Reading]) -> Option<CpuSample> {
    let pid = pid?;
    let (start, end) = window(readings)?;
    let (t_start, t_end) = (readings[start].at, readings[end].at);
    let (s_start, s_end) = (readings[start].cpu.clone(), readings[end].cpu.clone());
    let (s_start, s_end) = (s_start?, s_end?);
    let elapsed = (t_end - t_start).as_secs_f64();
    let utilization = laws::cpu_utilization(&s_start, &s_end, elapsed, ticks).ok()?;
    let mut intervals = Vec::new();
    for w in readings[start..=end].windows(2) {
        if let (Some(a), Some(b)) = (&w[0].cpu, &w[1].cpu) {
            let dt = (w[1].at - w[0].at).as_secs_f64();
            if let Ok(u) = laws::cpu_utilization(a, b, dt, ticks) {
                intervals.push(((w[1].at - t_start).as_secs_f64(), u));
            }
        }
    }
    Some(CpuSample {
        pid,
        start_ticks: s_start.cpu_ticks(),
        end_ticks: s_end.cpu_ticks(),
        ticks_per_second: ticks,
        elapsed_s: elapsed,
        utilization,
        intervals,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(pairs: &[(&str, f64)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn proxy_figures_are_the_means_between_two_readings() {
        // Exact: Δsum / Δcount per stage, Δarea / Δt.
        let stages = ["net", "queue", "worker", "backend", "total"];
        let reading = |requests: f64, sums: [f64; 5], area: f64| {
            let mut out = stats(&[
                ("proxy_requests", requests),
                ("proxy_queue_area_us", area),
                ("proxy_backend_requests", 3.0 * requests),
            ]);
            for (stage, sum) in stages.iter().zip(sums) {
                out.push((format!("proxy_{stage}_count"), requests.to_string()));
                out.push((format!("proxy_{stage}_sum_us"), sum.to_string()));
            }
            out
        };
        let a = reading(100.0, [100.0, 200.0, 900.0, 800.0, 1100.0], 1_000.0);
        let b = reading(
            1100.0,
            [1100.0, 5200.0, 10_900.0, 8800.0, 16_100.0],
            501_000.0,
        );
        let f = ProxyFigures::between(&a, &b, 0.5).unwrap();
        assert!(f.exact);
        assert_eq!(f.requests, 1000);
        assert_eq!(
            (f.net_us, f.queue_us, f.worker_us, f.backend_us, f.total_us),
            (1.0, 5.0, 10.0, 8.0, 15.0)
        );
        assert_eq!((f.queue_len, f.backend_requests), (1.0, 3.0));
        // Without sums and counts: cumulative means times proxy_requests (approximate).
        let a = stats(&[
            ("proxy_requests", 100.0),
            ("proxy_queue_area_us", 0.0),
            ("proxy_net_mean_us", 1.0),
            ("proxy_queue_mean_us", 2.0),
            ("proxy_worker_mean_us", 9.0),
            ("proxy_backend_mean_us", 8.0),
            ("proxy_total_mean_us", 11.0),
        ]);
        let b = stats(&[
            ("proxy_requests", 200.0),
            ("proxy_queue_area_us", 400.0),
            ("proxy_net_mean_us", 1.0),
            ("proxy_queue_mean_us", 3.0),
            ("proxy_worker_mean_us", 9.5),
            ("proxy_backend_mean_us", 8.0),
            ("proxy_total_mean_us", 12.5),
        ]);
        let f = ProxyFigures::between(&a, &b, 0.001).unwrap();
        assert!(!f.exact);
        assert_eq!((f.queue_us, f.worker_us, f.total_us), (4.0, 10.0, 14.0));
        assert!((f.queue_len - 0.4).abs() < 1e-12);
        // No request in between, or a figure missing: nothing.
        assert!(ProxyFigures::between(&a, &a, 1.0).is_none());
        assert!(ProxyFigures::between(&a, &stats(&[("proxy_requests", 200.0)]), 1.0).is_none());
    }
}
