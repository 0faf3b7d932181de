//! Carrying out a scaling experiment: the cluster's nodes as processes, the fill, the
//! measured run, and the event thread that adds, removes and kills nodes on schedule.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kvlab_client::cluster::fetch_ring;
use kvlab_client::ClusterClient;
use kvlab_cluster::coordinator::{self, node_status};
use kvlab_cluster::{NodeCommand, TopologyStore};
use kvlab_etcd::open_store;
use kvlab_process::Etcd;
use kvlab_process::{free_ports, Output, Probe, Process, Spawn};
use kvlab_ring::key_hash;

use super::{write, Action, EventRecord, EventSpec, IntervalPoint, ScalingResult, ScalingSpec};

/// The cluster under test: its topology store, its nodes (each stopped when dropped) and
/// what starting another one takes.
struct Cluster {
    topology: String,
    store: Box<dyn TopologyStore>,
    nodes: Vec<(String, Process)>,
    args: Vec<String>,
    bin: PathBuf,
    logs: PathBuf,
    _etcd: Option<Etcd>,
}

impl Cluster {
    fn start_node(&mut self, port: u16) -> anyhow::Result<String> {
        let p = spawn_node(&self.bin, &self.topology, &self.args, &self.logs, port)?;
        let name = format!("127.0.0.1:{port}");
        self.nodes.push((name.clone(), p));
        Ok(name)
    }

    fn items(&self) -> u64 {
        self.ring()
            .iter()
            .filter_map(|n| node_status(n).ok())
            .filter_map(|s| s["items"].as_u64())
            .sum()
    }

    fn ring(&self) -> Vec<String> {
        sorted_nodes(&*self.store)
    }
}

/// Starts one node per address at once (one after the other, many nodes — durable ones
/// above all — take a while to start): each's outcome, in order.
pub(crate) fn start_all<A: Copy + Send, T: Send>(
    addrs: &[A],
    start: impl Fn(A) -> anyhow::Result<T> + Sync,
) -> Vec<anyhow::Result<T>> {
    std::thread::scope(|s| {
        let start = &start;
        let handles: Vec<_> = addrs.iter().map(|&a| s.spawn(move || start(a))).collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("starting a node panicked")))
            })
            .collect()
    })
}

/// The nodes of the ring `store` holds, sorted (none if it holds none or cannot be read).
pub(crate) fn sorted_nodes(store: &dyn TopologyStore) -> Vec<String> {
    store
        .load()
        .ok()
        .flatten()
        .map(|t| {
            let mut n = t.nodes;
            n.sort();
            n
        })
        .unwrap_or_default()
}

/// Starts a node (`kvlab server --cluster`) on `port`, its log in `logs`, and waits until it
/// answers.
fn spawn_node(
    bin: &Path,
    topology: &str,
    args: &[String],
    logs: &Path,
    port: u16,
) -> anyhow::Result<Process> {
    let name = format!("127.0.0.1:{port}");
    Spawn::new(bin.as_os_str())
        .output(Output::File(logs.join(format!("node-{port}.log"))))
        .args(
            NodeCommand::node("127.0.0.1", port, topology, &name)
                .args(args)
                .to_args(),
        )
        .ready(Probe::Version(SocketAddr::from(([127, 0, 0, 1], port))))
        .start()
        .with_context(|| format!("starting node {name}"))
}

/// Runs a scaling experiment into `out` and writes its report; returns the summary.
pub fn run(
    spec: &ScalingSpec,
    text: &str,
    out: &Path,
    bin: &Path,
) -> anyhow::Result<(String, PathBuf)> {
    let (cluster, seeds) = start_cluster(spec, out, bin)?;
    let mut notes = Vec::new();
    let (cfg, keys) = fill(spec, &cluster, &seeds, &mut notes)?;
    let cluster = Arc::new(Mutex::new(cluster));
    let (result, events) = measured_run(spec, &cfg, &cluster);
    let result = result.context("the load run")?;
    let res = ScalingResult {
        spec_text: text.to_string(),
        name: spec.name.clone(),
        intervals: interval_points(&result),
        events,
        totals: result.counters,
        keys,
        notes: notes
            .into_iter()
            .chain(result.notes.iter().chain(&result.warnings).cloned())
            .collect(),
    };
    crate::runner::write_json(&out.join("scaling.json"), &res)?;
    if let Ok(mut c) = cluster.lock() {
        c.nodes.clear(); // stops them
    }
    write(out, &res)
}

/// Starts etcd (with `topology = "etcd"`), creates the ring, starts its nodes at once and
/// waits until each serves it; returns the cluster and its nodes' addresses.
fn start_cluster(
    spec: &ScalingSpec,
    out: &Path,
    bin: &Path,
) -> anyhow::Result<(Cluster, Vec<SocketAddr>)> {
    let etcd = if spec.topology == "etcd" {
        Some(
            Etcd::start(&out.join("etcd"))
                .context("starting etcd (apt-get install etcd-server)")?,
        )
    } else {
        None
    };
    let topology = match &etcd {
        Some(e) => e.spec(&spec.name),
        None => out.join("topology.json").display().to_string(),
    };
    let store = open_store(&topology)?;
    let ports = free_ports(spec.nodes)?;
    let names: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let logs = out.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let mut cluster = Cluster {
        topology,
        store,
        nodes: Vec::new(),
        args: spec.node_args.clone(),
        bin: bin.to_path_buf(),
        logs,
        _etcd: etcd,
    };
    // The ring first (a node reads it as it starts), then every node at once: with leases,
    // a node of the ring that is not alive for a lease's time (3 s with etcd) is taken out
    // of it by the others, and one after the other, each waiting to answer, the starts can
    // take that long on a busy machine.
    coordinator::create(
        cluster.store.as_ref(),
        kvlab_ring::DEFAULT_VNODES,
        spec.replicas,
        kvlab_cluster::CopyWritePolicy::All,
        names.clone(),
    )?;
    let c = &cluster;
    let started = start_all(&ports, |p| {
        spawn_node(&c.bin, &c.topology, &c.args, &c.logs, p)
    });
    for (name, p) in names.iter().zip(started) {
        // Those started are stopped (dropped) if one failed.
        cluster.nodes.push((name.clone(), p?));
    }
    let seeds: Vec<SocketAddr> = names.iter().filter_map(|n| n.parse().ok()).collect();
    wait_for_ring(&seeds, spec.nodes)?;
    Ok((cluster, seeds))
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

/// Waits (up to 20 s) until every node serves a ring of `nodes` nodes: each has taken up
/// the topology just created.
pub(crate) fn wait_for_ring(seeds: &[SocketAddr], nodes: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let behind: Vec<String> = seeds
            .iter()
            .filter(|a| {
                fetch_ring(**a, Duration::from_secs(2)).map_or(true, |r| r.nodes().len() != nodes)
            })
            .map(|a| a.to_string())
            .collect();
        if behind.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{} did not serve the ring of {nodes} nodes within 20 s",
                behind.join(", ")
            );
        }
        // A readiness probe: the nodes poll or watch the topology store.
        std::thread::sleep(Duration::from_millis(50));
    }
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
                let port = free_ports(1)?[0];
                let name = c.start_node(port)?;
                rec.node = name.clone();
                rec.expected_fraction = 1.0 / (ring.len() as f64 + 1.0);
                rec.migration = Some(coordinator::add(c.store.as_ref(), &name, &mut |_| {})?);
            }
            Action::Remove => {
                let name = nth(&ring, e.node)?;
                rec.node = name.clone();
                let items = node_status(&name)?["items"].as_u64().unwrap_or(0);
                rec.expected_fraction = items as f64 / rec.items_before.max(1) as f64;
                rec.migration = Some(coordinator::remove(c.store.as_ref(), &name, &mut |_| {})?);
                c.nodes.retain(|(n, _)| *n != name); // stops it
            }
            Action::Kill => {
                let name = nth(&ring, e.node)?;
                rec.node = name.clone();
                if let Some((_, p)) = c.nodes.iter_mut().find(|(n, _)| *n == name) {
                    p.kill();
                }
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
