//! An experiment placed on hosts: each host with its clock at the start and the end (offset
//! and bound) and its machine over the measured runs (busy cores, steal, load, the lab's
//! processes on it); and, when agents generated the load in closed loop, the interactive
//! response-time law per agent host: its clients N against X·(R + Z) from its own share.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use kvlab_report::{Row, Section, Table};

use crate::placement::{HostCpu, HostMeta};
use crate::runner::{Meta, RawRun};
use crate::spec::levels_text;

/// The hosts section, or `None` when no role ran on a host; its lines go into `summary`.
pub(super) fn hosts_section(
    meta: &Meta,
    raws: &[RawRun],
    tolerance: f64,
    summary: &mut String,
) -> Option<Section> {
    if meta.hosts.is_empty() {
        return None;
    }
    let readings: Vec<&HostCpu> = raws.iter().flat_map(|r| &r.hosts).collect();
    let mut items = vec![kvlab_report::Item::Table(hosts_table(
        &meta.hosts,
        &readings,
        "measured time",
        summary,
    ))];
    if let Some(t) = law_per_host(raws, tolerance) {
        items.push(kvlab_report::Item::Table(t));
    }
    Some(Section {
        title: "Hosts".into(),
        text: Vec::new(),
        items,
    })
}

/// The hosts' table: each host with its clock at the start and the end, and its machine
/// over the runs (`readings`, each over a run's `span`), means over the runs; its lines go
/// into `summary`.
pub(crate) fn hosts_table(
    hosts: &[HostMeta],
    readings: &[&HostCpu],
    span: &str,
    summary: &mut String,
) -> Table {
    let clock = |c: Option<crate::placement::Clock>| c.map_or("–".into(), |c| c.to_string());
    let mut rows = Vec::new();
    let _ = writeln!(
        summary,
        "hosts (clock offset ± bound at the start, at the end):"
    );
    for h in hosts {
        let readings: Vec<&HostCpu> = readings
            .iter()
            .copied()
            .filter(|x| x.host == h.name)
            .collect();
        let n = readings.len().max(1) as f64;
        let mean = |f: &dyn Fn(&HostCpu) -> f64| readings.iter().map(|x| f(x)).sum::<f64>() / n;
        let mut procs: BTreeMap<String, (f64, usize)> = BTreeMap::new();
        for x in &readings {
            for (name, cores) in &x.processes {
                // agent-h3-0, near-2: the role, without its start number.
                let role = name.rsplit_once('-').map_or(name.as_str(), |(r, _)| r);
                let e = procs.entry(role.to_string()).or_default();
                e.0 += cores;
                e.1 += 1;
            }
        }
        let procs: Vec<String> = procs
            .iter()
            .map(|(role, (sum, k))| format!("{role} {:.2}", sum / *k as f64))
            .collect();
        let _ = writeln!(
            summary,
            "  {} ({}, {}): {}, {}{}",
            h.name,
            h.reach,
            h.address,
            clock(h.clock_start),
            clock(h.clock_end),
            if readings.is_empty() {
                String::new()
            } else {
                format!(
                    "; busy {:.2} cores, load {:.2}{}",
                    mean(&|x| x.busy_cores),
                    mean(&|x| x.load1),
                    if procs.is_empty() {
                        String::new()
                    } else {
                        format!(", {}", procs.join(", "))
                    }
                )
            }
        );
        rows.push(Row {
            cells: vec![
                h.name.clone(),
                h.reach.clone(),
                clock(h.clock_start),
                clock(h.clock_end),
                format!("{:.2}", mean(&|x| x.busy_cores)),
                format!("{:.2}", 100.0 * mean(&|x| x.steal)),
                format!("{:.2}", mean(&|x| x.load1)),
                if procs.is_empty() {
                    "–".into()
                } else {
                    procs.join(", ")
                },
            ],
            highlight: false,
        });
    }
    Table {
        title: "Hosts".into(),
        columns: [
            "host",
            "reached",
            "clock at start (offset ± bound)",
            "clock at end",
            "busy (cores)",
            "steal (%)",
            "load (1 min)",
            "lab's processes (cores)",
        ]
        .map(String::from)
        .to_vec(),
        rows,
        caption: Some(format!(
            "Each host's clock against the lab's, over its control connection (the tightest \
             of several round trips; the bound is half of it), and its machine over the runs' \
             {span}, means over the runs: /proc/stat's busy and steal, /proc/loadavg, each \
             process' utime + stime."
        )),
    }
}

/// The interactive response-time law per agent host and point (closed loop): N = X (R + Z)
/// from the host's own agents, means over repetitions.
fn law_per_host(raws: &[RawRun], tolerance: f64) -> Option<Table> {
    // (part, point, host) → (levels, N, X sum, R·X sum, Z, repetitions)
    type Acc = (String, usize, f64, f64, f64, usize);
    let mut by: BTreeMap<(String, usize, String), Acc> = BTreeMap::new();
    for r in raws
        .iter()
        .filter(|r| r.error.is_none() && r.population > 0)
    {
        let mut per_host: BTreeMap<&str, (usize, f64, f64)> = BTreeMap::new();
        for a in &r.agents {
            let e = per_host.entry(&a.host).or_default();
            e.0 += a.population;
            e.1 += a.throughput_qps;
            e.2 += a.throughput_qps * a.mean_us;
        }
        for (host, (n, x, rx)) in per_host {
            let e = by
                .entry((r.part.clone(), r.point, host.to_string()))
                .or_insert_with(|| (levels_text(&r.levels), n, 0.0, 0.0, r.think_s, 0));
            e.2 += x;
            e.3 += rx;
            e.5 += 1;
        }
    }
    if by.is_empty() {
        return None;
    }
    let rows = by
        .into_iter()
        .map(|((part, _, host), (levels, n, x, rx, z, k))| {
            let x = x / k as f64;
            let r_us = if x > 0.0 { rx / k as f64 / x } else { 0.0 };
            let predicted = x * (r_us / 1e6 + z);
            let off = (predicted - n as f64).abs() / n as f64;
            Row {
                cells: vec![
                    part,
                    levels,
                    host,
                    n.to_string(),
                    format!("{x:.0}"),
                    format!("{r_us:.1}"),
                    format!("{predicted:.2}"),
                    format!("{:.1}", 100.0 * off),
                ],
                highlight: off > tolerance,
            }
        })
        .collect();
    Some(Table {
        title: "Interactive response-time law per agent host".into(),
        columns: [
            "part",
            "point",
            "host",
            "clients N",
            "throughput X (req/s)",
            "response time R (µs)",
            "X·(R + Z)",
            "off (%)",
        ]
        .map(String::from)
        .to_vec(),
        rows,
        caption: Some(format!(
            "Each agent host's own clients against X·(R + Z) from its own share of the run \
             (its throughput and mean response time, the think time Z), means over \
             repetitions; rows off by more than the tolerance ({:.0} %) are highlighted.",
            100.0 * tolerance
        )),
    })
}
