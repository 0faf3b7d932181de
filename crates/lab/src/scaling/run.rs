//! Carrying out a scaling experiment: the cluster's nodes as processes, the fill, the
//! measured run, and the event thread that adds, removes and kills nodes on schedule.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kvlab_client::ClusterClient;
use kvlab_cluster::coordinator::node_status;
use kvlab_ring::key_hash;

use super::{write, Action, EventRecord, EventSpec, IntervalPoint, ScalingResult, ScalingSpec};
use crate::nodes::etcd::{ClusterEtcd, EtcdAt};
use crate::nodes::{open_placement, Kind, Nodes, Site};
use crate::placement::Placement;

/// The cluster under test: its nodes (here or on hosts; stopped when dropped, before its
/// etcd), and its etcd, if its topology lives in one.
struct Cluster {
    nodes: Nodes,
    etcd: Option<ClusterEtcd>,
    logs: PathBuf,
}

impl Cluster {
    fn items(&self) -> u64 {
        self.ring()
            .iter()
            .filter_map(|n| node_status(n).ok())
            .filter_map(|s| s["items"].as_u64())
            .sum()
    }

    fn ring(&self) -> Vec<String> {
        self.nodes.ring()
    }
}

/// Runs a scaling experiment into `out` and writes its report; returns the summary. Placed
/// on hosts, the hosts are connected (kvlab shipped, etcd checked on its host) first, and
/// whatever the run started there is stopped before it returns, on an error too.
pub fn run(
    spec: &ScalingSpec,
    text: &str,
    out: &Path,
    bin: &Path,
) -> anyhow::Result<(String, PathBuf)> {
    let logs = out.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let etcd_at = spec.etcd_place()?;
    let placement = match spec.on_hosts() {
        true => {
            let (hosts, ssh) = spec.placed()?;
            let needs: Vec<(&str, Vec<&str>)> = match &etcd_at {
                EtcdAt::Host(h) => vec![(h.as_str(), vec!["etcd"])],
                _ => Vec::new(),
            };
            open_placement(&hosts, &ssh, bin, out, &logs, &needs)?
        }
        false => None,
    };
    let mut res = ScalingResult {
        spec_text: text.to_string(),
        name: spec.name.clone(),
        replicas: spec.replicas,
        ..ScalingResult::default()
    };
    if let Some(pl) = &placement {
        res.hosts = pl.meta(&Default::default());
    }
    // Every node and etcd are gone when it returns (dropped), before the placement's
    // teardown, which stops whatever else it started on the hosts.
    let outcome = run_cluster(spec, out, bin, &etcd_at, placement.as_ref(), &mut res);
    if let Some(pl) = placement {
        match pl.finish() {
            Ok(end) => res.hosts = pl.meta(&end),
            Err(e) if outcome.is_ok() => return Err(e.context("the hosts' teardown")),
            Err(e) => eprintln!("note: the hosts' teardown: {e:#}"),
        }
    }
    outcome?;
    crate::runner::write_json(&out.join("scaling.json"), &res)?;
    write(out, &res)
}

/// Starts etcd and the cluster, fills it and runs the measured run with its events into
/// `res`; stops the cluster and etcd.
fn run_cluster(
    spec: &ScalingSpec,
    out: &Path,
    bin: &Path,
    etcd_at: &EtcdAt,
    placement: Option<&Arc<Placement>>,
    res: &mut ScalingResult,
) -> anyhow::Result<()> {
    let (cluster, seeds) = start_cluster(spec, out, bin, etcd_at, placement)?;
    res.topology = cluster
        .etcd
        .as_ref()
        .map_or("file".into(), ClusterEtcd::describe);
    res.etcd = cluster.etcd.as_ref().and_then(ClusterEtcd::placed);
    res.placed = cluster.nodes.placed();
    let mut notes = Vec::new();
    let (cfg, keys) = fill(spec, &cluster, &seeds, &mut notes)?;
    let cluster = Arc::new(Mutex::new(cluster));
    let (result, events) = measured_run(spec, &cfg, &cluster);
    let result = result.context("the load run")?;
    res.intervals = interval_points(&result);
    res.events = events;
    res.totals = result.counters;
    res.keys = keys;
    res.notes = notes
        .into_iter()
        .chain(result.notes.iter().chain(&result.warnings).cloned())
        .collect();
    if let Ok(c) = cluster.lock() {
        for p in c.nodes.placed() {
            if !res.placed.contains(&p) {
                res.placed.push(p);
            }
        }
    }
    Ok(())
}

/// Starts etcd (with `topology = "etcd"`: here, or on its host), creates the ring, starts
/// its nodes at once (here, or node i on `node_hosts[i % len]`) and waits until each serves
/// it; returns the cluster and its nodes' addresses.
fn start_cluster(
    spec: &ScalingSpec,
    out: &Path,
    bin: &Path,
    etcd_at: &EtcdAt,
    placement: Option<&Arc<Placement>>,
) -> anyhow::Result<(Cluster, Vec<SocketAddr>)> {
    let logs = out.join("logs");
    let etcd = ClusterEtcd::start(etcd_at, placement, out, &logs)?;
    let site = Site {
        replicas: spec.replicas,
        durable: false,
        net: None,
        hosts: placement
            .filter(|_| !spec.node_hosts.is_empty())
            .map(|pl| (pl.clone(), spec.node_hosts.clone())),
        etcd: etcd.as_ref().map(|e| e.addr().to_string()),
    };
    // The ring first (a node reads it as it starts), then every node at once: with leases,
    // a node of the ring that is not alive for a lease's time (3 s with etcd) is taken out
    // of it by the others, and one after the other, each waiting to answer, the starts can
    // take that long on a busy machine.
    let nodes = Nodes::start(Kind::Kvlab, spec.nodes, &spec.node_args, bin, out, site)?;
    let seeds = nodes.addrs();
    Ok((Cluster { nodes, etcd, logs }, seeds))
}

/// Opens the copy streams (with copies) and sets every key; returns the measured run's
/// settings and the keys. What it did is added to `notes`.
fn fill(
    spec: &ScalingSpec,
    cluster: &Cluster,
    seeds: &[SocketAddr],
    notes: &mut Vec<String>,
) -> anyhow::Result<(kvlab_bench::config::BenchConfig, u64)> {
    if spec.replicas >= 2 {
        let pairs = open_copy_streams(seeds, spec.replicas as usize)
            .context("opening the nodes' copy streams before the fill")?;
        notes.push(format!(
            "before the fill, one connection set and deleted one key for each of the {pairs} \
             (node, copy holder) pairs, one at a time, so every node opened its copy streams \
             before the fill's pipelined sets"
        ));
    }
    let load = spec.load()?;
    let seed = *seeds.first().context("no node to load")?;
    let mut cfg = load.config(seed)?;
    let keys = cfg.workload.keys;
    let filled = Instant::now();
    kvlab_bench::run::load_phase(&cfg).context("the fill (every key set before the run)")?;
    notes.push(format!(
        "the fill set {keys} keys in {:.1} s",
        filled.elapsed().as_secs_f64()
    ));
    cfg.load = false;
    let ring = cluster.ring();
    if ring.len() != spec.nodes {
        bail!(
            "after the fill the ring has {} of the {} nodes ({}): a node's lease lapsed (see \
             the nodes' logs in {})",
            ring.len(),
            spec.nodes,
            ring.join(", "),
            cluster.logs.display()
        );
    }
    Ok((cfg, keys))
}

/// The measured run: the load on this thread, the events on another, timed from the run's
/// start; returns the load's result and what happened at each event.
fn measured_run(
    spec: &ScalingSpec,
    cfg: &kvlab_bench::config::BenchConfig,
    cluster: &Arc<Mutex<Cluster>>,
) -> (
    Result<kvlab_bench::run::RunResult, kvlab_bench::BenchError>,
    Vec<EventRecord>,
) {
    let records = Arc::new(Mutex::new(Vec::new()));
    let started = Arc::new(Mutex::new(None::<Instant>));
    let stop = Arc::new(AtomicBool::new(false));
    let events = spec.event.clone();
    let runner = std::thread::spawn({
        let (cluster, records, started, stop) = (
            cluster.clone(),
            records.clone(),
            started.clone(),
            stop.clone(),
        );
        move || run_events(&events, &cluster, &records, &started, &stop)
    });
    let mut first = true;
    let interval = Duration::from_secs_f64(spec.interval);
    let result = kvlab_bench::run::run(cfg, &[], &mut |_| {
        if first {
            // The first interval just ended: the run began one interval ago.
            first = false;
            if let Ok(mut s) = started.lock() {
                s.get_or_insert_with(|| Instant::now() - interval);
            }
        }
    });
    stop.store(true, Ordering::Relaxed);
    let _ = runner.join();
    let events = records.lock().map(|r| r.clone()).unwrap_or_default();
    (result, events)
}

/// The load's measured intervals as the time series, in seconds from the first interval's
/// start.
fn interval_points(result: &kvlab_bench::run::RunResult) -> Vec<IntervalPoint> {
    let mut intervals = Vec::new();
    let t0 = result.intervals.first().map_or(0, |i| i.ts_start);
    for i in result.intervals.iter().filter(|i| !i.warmup) {
        intervals.push(IntervalPoint {
            t: (i.ts_end.saturating_sub(t0)) as f64 / 1000.0,
            qps: i.achieved_qps,
            p99_us: i.latency.p99_us,
            errors: i.counters.errors + i.counters.timeouts,
            redirects: i.counters.redirects,
        });
    }
    intervals
}

/// Opens every node's copy streams before the fill: for each (owner, copy holder) pair of
/// the ring, a key that the one owns and the other holds a copy of is set and deleted from
/// one connection, one write at a time; returns how many pairs. A node opens its stream to
/// a holder at its first copy to it (`cluster import`, answered by the holder's worker), so
/// a fill that opens them all at once with pipelined sets can leave two nodes' workers each
/// waiting for the other's answer until the copy times out and fails its sets.
fn open_copy_streams(seeds: &[SocketAddr], replicas: usize) -> anyhow::Result<usize> {
    let mut client = ClusterClient::connect(seeds, Duration::from_secs(5))?;
    let ring = client.ring().clone();
    let n = ring.nodes().len();
    let mut seen: BTreeSet<(usize, usize)> = BTreeSet::new();
    let mut owners = Vec::with_capacity(replicas);
    // With the default ring points every pair turns up within a few dozen keys; the bound
    // only stops a ring too coarse to have some pair.
    for i in 0..20_000u32 {
        if seen.len() == n * n.saturating_sub(1) {
            break;
        }
        let key = format!("kvlab-lab:copy-streams:{i}");
        ring.owners_of_hash(key_hash(key.as_bytes()), replicas, &mut owners);
        let Some((&owner, holders)) = owners.split_first() else {
            break;
        };
        let new: Vec<(usize, usize)> = holders
            .iter()
            .map(|&h| (owner, h))
            .filter(|p| !seen.contains(p))
            .collect();
        if new.is_empty() {
            continue;
        }
        let stored = client
            .set(key.as_bytes(), b"1")
            .with_context(|| format!("set {key}"))?;
        if !stored {
            bail!("set {key}: not stored");
        }
        client
            .delete(key.as_bytes())
            .with_context(|| format!("delete {key}"))?;
        seen.extend(new);
    }
    Ok(seen.len())
}

fn run_events(
    events: &[EventSpec],
    cluster: &Mutex<Cluster>,
    records: &Mutex<Vec<EventRecord>>,
    started: &Mutex<Option<Instant>>,
    stop: &AtomicBool,
) {
    // The run's clock starts at its first interval report; events are timed from the
    // run's start, which is at most one interval earlier.
    let origin = loop {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        if let Some(t) = started.lock().ok().and_then(|s| *s) {
            break t;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let mut order: Vec<&EventSpec> = events.iter().collect();
    order.sort_by(|a, b| a.at.total_cmp(&b.at));
    for e in order {
        while origin.elapsed().as_secs_f64() < e.at {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let rec = event(e, cluster, origin);
        if let Ok(mut r) = records.lock() {
            r.push(rec);
        }
    }
}

fn event(e: &EventSpec, cluster: &Mutex<Cluster>, origin: Instant) -> EventRecord {
    let mut rec = EventRecord {
        at: e.at,
        action: format!("{:?}", e.action).to_lowercase(),
        started: origin.elapsed().as_secs_f64(),
        ..EventRecord::default()
    };
    let Ok(mut c) = cluster.lock() else {
        rec.error = Some("cluster state poisoned".into());
        return rec;
    };
    let ring = c.ring();
    rec.items_before = c.items();
    let outcome: anyhow::Result<()> = (|| {
        match e.action {
            Action::Add => {
                rec.expected_fraction = 1.0 / (ring.len() as f64 + 1.0);
                // On hosts, the next node host in turn; the migration to it timed by the
                // event's start and end.
                let (name, _, m, _) = c.nodes.add()?;
                rec.host = c.nodes.host_of(&name);
                rec.placed = c.nodes.placed_node(&name);
                rec.node = name;
                rec.migration = Some(m);
            }
            Action::Remove => {
                let name = nth(&ring, e.node)?;
                rec.node = name.clone();
                rec.host = c.nodes.host_of(&name);
                rec.placed = c.nodes.placed_node(&name);
                let items = node_status(&name)?["items"].as_u64().unwrap_or(0);
                rec.expected_fraction = items as f64 / rec.items_before.max(1) as f64;
                // Stopped afterwards (on a host: its log brought back).
                rec.migration = Some(c.nodes.remove(&name)?.0);
            }
            Action::Kill => {
                let name = nth(&ring, e.node)?;
                rec.node = name.clone();
                rec.host = c.nodes.host_of(&name);
                rec.placed = c.nodes.placed_node(&name);
                c.nodes.kill(&name)?;
                // Over when the ring no longer has it (copies and leases heal it).
                let deadline = Instant::now() + Duration::from_secs(20);
                while c.ring().contains(&name) {
                    if Instant::now() > deadline {
                        bail!("the ring still lists {name} 20 s after its kill");
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
        Ok(())
    })();
    rec.finished = origin.elapsed().as_secs_f64();
    if let Err(err) = outcome {
        rec.error = Some(format!("{err:#}"));
    }
    rec
}

/// Node `i` of the ring (sorted), or why there is none.
fn nth(ring: &[String], i: usize) -> anyhow::Result<String> {
    ring.get(i).cloned().with_context(|| {
        format!(
            "no node {i}: the ring has {} nodes ({})",
            ring.len(),
            ring.join(", ")
        )
    })
}
