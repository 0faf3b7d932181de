//! Scaling events: a kvlab cluster under a verified load while nodes are added, removed
//! or killed on a timed schedule, and the report of what each event cost.
//!
//! ```text
//! kind = "scaling" experiment ─► start etcd (topology = "etcd"), create the cluster, start
//!   its N nodes at once (logs in logs/) ─► wait until each serves the ring ─► with copies,
//!   open every node's copy streams (one write per owner and holder) ─► fill the key space
//!   ─► one verified run through the cluster's ring (kvlab_bench, Config::cluster) while an
//!   event thread adds (a node it starts), removes or kills nodes at their times
//!   (kvlab_cluster::coordinator) ─► scaling.json
//!   ─► report: a timeline of throughput and errors per interval (then p99, errors) with
//!   each event's start and end marked; a table per event: time, keys moved vs expected,
//!   MB/s, the client errors after it and how long they were seen; lost writes
//! ```
//!
//! The file (every key optional; defaults after `=`):
//!
//! ```toml
//! kind = "scaling"            # *required*: this kind of experiment
//! name = "<file stem>"
//! description = ""
//! nodes = 3                   # nodes at the start
//! replicas = 1                # copies of every key (kill needs 2 to lose nothing)
//! topology = "file"           # file | etcd (Debian's etcd, started for the run)
//! node_args = ["-t", "1", "-m", "512"]   # every node's `kvlab server` flags
//! duration = 20.0             # seconds of the measured run
//! interval = 0.5              # seconds per point of the time series
//!
//! [workload]                  # bench's flat load keys (as in other experiments); the run
//! keys = 100000               # is open or closed loop as they say; `verify` is always on,
//!                             # every key is set first (a miss is a lost key)
//!
//! [[event]]
//! at = 6.0                    # seconds into the measured run
//! action = "add"              # add (starts a node) | remove | kill (kill -9)
//! node = 0                    # remove, kill: which of the nodes in the ring (sorted), 0..
//! ```

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kvlab_bench::load::Options;
use kvlab_client::cluster::{fetch_ring, key_hash};
use kvlab_client::process::{free_ports, Output, Probe, Process, Spawn};
use kvlab_client::testing::Etcd;
use kvlab_client::ClusterClient;
use kvlab_cluster::coordinator::{self, node_status, MigrationReport};
use kvlab_cluster::{open_store, TopologyStore};
use kvlab_report::{Item, LinePlot, Mark, Note, Point, Report, Row, Section, Series, Table, Y2};
use serde::{Deserialize, Serialize};

/// What an event does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Start a node and add it (a migration to it).
    Add,
    /// Move a node's keys to the others and take it out (it is stopped afterwards).
    Remove,
    /// `kill -9` a node (with copies and etcd, the ring heals when its lease lapses).
    Kill,
}

/// One event of the schedule.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventSpec {
    /// Seconds into the measured run.
    pub at: f64,
    /// What happens.
    pub action: Action,
    /// Remove, kill: the index of the node in the ring's (sorted) node list.
    #[serde(default)]
    pub node: usize,
}

fn d_nodes() -> usize {
    3
}
fn d_one() -> u32 {
    1
}
fn d_topology() -> String {
    "file".into()
}
fn d_node_args() -> Vec<String> {
    ["-t", "1", "-m", "512"].map(String::from).to_vec()
}
fn d_duration() -> f64 {
    20.0
}
fn d_interval() -> f64 {
    0.5
}

/// A scaling experiment (see the module docs).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScalingSpec {
    /// Must be `"scaling"`.
    pub kind: String,
    /// Names the results directory.
    #[serde(default)]
    pub name: String,
    /// Shown in the report.
    #[serde(default)]
    pub description: String,
    /// Nodes at the start.
    #[serde(default = "d_nodes")]
    pub nodes: usize,
    /// Copies of every key.
    #[serde(default = "d_one")]
    pub replicas: u32,
    /// `file` or `etcd`.
    #[serde(default = "d_topology")]
    pub topology: String,
    /// Every node's `kvlab server` flags.
    #[serde(default = "d_node_args")]
    pub node_args: Vec<String>,
    /// Seconds of the measured run.
    #[serde(default = "d_duration")]
    pub duration: f64,
    /// Seconds per interval.
    #[serde(default = "d_interval")]
    pub interval: f64,
    /// The load.
    #[serde(default)]
    pub workload: Options,
    /// The schedule.
    #[serde(default)]
    pub event: Vec<EventSpec>,
}

/// Whether `text` is a scaling experiment (top-level `kind = "scaling"`).
pub fn is_scaling(text: &str) -> bool {
    toml::from_str::<toml::Table>(text)
        .ok()
        .and_then(|t| {
            t.get("kind")
                .and_then(|k| k.as_str().map(|k| k == "scaling"))
        })
        .unwrap_or(false)
}

impl ScalingSpec {
    /// Reads and checks a scaling experiment file.
    pub fn parse(text: &str, stem: &str) -> anyhow::Result<ScalingSpec> {
        let mut s: ScalingSpec = toml::from_str(text).context("scaling experiment")?;
        if s.kind != "scaling" {
            bail!(
                "kind = {:?}: a scaling experiment says kind = \"scaling\"",
                s.kind
            );
        }
        if s.name.is_empty() {
            s.name = stem.to_string();
        }
        if s.nodes == 0 || s.replicas == 0 || s.replicas as usize > s.nodes {
            bail!(
                "nodes = {}, replicas = {}: need 1 <= replicas <= nodes",
                s.nodes,
                s.replicas
            );
        }
        if s.topology != "file" && s.topology != "etcd" {
            bail!("topology = {:?}: file or etcd", s.topology);
        }
        if !(s.duration > 0.0 && s.interval > 0.0) {
            bail!("duration and interval must be positive");
        }
        let mut ring = s.nodes;
        for e in &s.event {
            if !(0.0..s.duration).contains(&e.at) {
                bail!(
                    "event at {} s: outside the run (0 ..< {} s)",
                    e.at,
                    s.duration
                );
            }
            match e.action {
                Action::Add => ring += 1,
                Action::Remove | Action::Kill => {
                    if ring <= s.replicas as usize || e.node >= ring {
                        bail!(
                            "event at {} s: {:?} of node {} with {ring} in the ring",
                            e.at,
                            e.action,
                            e.node
                        );
                    }
                    ring -= 1;
                }
            }
        }
        s.load()?;
        Ok(s)
    }

    fn load(&self) -> anyhow::Result<kvlab_bench::load::Load> {
        let mut o = self.workload.clone();
        o.verify = Some(true);
        o.load = Some(true);
        o.cluster = Some(true);
        o.duration = Some(self.duration);
        o.interval = Some(self.interval);
        Ok(o.to_load()?)
    }
}

/// What happened at one event.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct EventRecord {
    /// Planned, seconds into the run.
    pub at: f64,
    /// What.
    pub action: String,
    /// The node.
    pub node: String,
    /// Seconds into the run when it began and when it was over (migration done, or the
    /// ring healed).
    pub started: f64,
    /// See `started`.
    pub finished: f64,
    /// Items in the cluster before it (sum over nodes).
    pub items_before: u64,
    /// The share of the items expected to move: 1/(N+1) for an add to N nodes, the node's
    /// share for a remove.
    pub expected_fraction: f64,
    /// The migration's figures (add, remove).
    pub migration: Option<MigrationReport>,
    /// Why it failed, if it did.
    pub error: Option<String>,
}

/// One interval of the run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct IntervalPoint {
    /// Seconds into the run at the interval's end.
    pub t: f64,
    /// Completed requests per second.
    pub qps: f64,
    /// p99 latency, µs.
    pub p99_us: f64,
    /// Error replies, broken connections and timeouts.
    pub errors: u64,
    /// Redirects followed.
    pub redirects: u64,
}

/// Everything a scaling run measured (`scaling.json`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ScalingResult {
    /// The experiment as run.
    pub spec_text: String,
    /// Its name.
    pub name: String,
    /// The time series.
    pub intervals: Vec<IntervalPoint>,
    /// The events.
    pub events: Vec<EventRecord>,
    /// The whole run's counters: completed, errors, verify_errors, misses, timeouts,
    /// redirects.
    pub totals: kvlab_bench::stats::Counters,
    /// Keys in the key space.
    pub keys: u64,
    /// What the load generator noted (connection problems, its self-checks).
    #[serde(default)]
    pub notes: Vec<String>,
}

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
        self.store
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
        .args(["server", "-l", "127.0.0.1"])
        .args(["-p".to_string(), port.to_string()])
        .args(["--cluster".to_string(), topology.to_string()])
        .args(["--cluster-node".to_string(), name.clone()])
        .args(args.iter().cloned())
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
        kvlab_client::cluster::DEFAULT_VNODES,
        spec.replicas,
        names.clone(),
    )?;
    let started: Vec<anyhow::Result<Process>> = std::thread::scope(|s| {
        let c = &cluster;
        let handles: Vec<_> = ports
            .iter()
            .map(|&p| s.spawn(move || spawn_node(&c.bin, &c.topology, &c.args, &c.logs, p)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("starting a node panicked")))
            })
            .collect()
    });
    for (name, p) in names.iter().zip(started) {
        // Those started are stopped (dropped) if one failed.
        cluster.nodes.push((name.clone(), p?));
    }
    let seeds: Vec<SocketAddr> = names.iter().filter_map(|n| n.parse().ok()).collect();
    wait_for_ring(&seeds, spec.nodes)?;
    let mut notes = Vec::new();
    if spec.replicas >= 2 {
        let pairs = open_copy_streams(&seeds, spec.replicas as usize)
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

    let cluster = Arc::new(Mutex::new(cluster));
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
    let result = kvlab_bench::run::run(&cfg, &[], &mut |_| {
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
    let result = result.context("the load run")?;

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
    let events = records.lock().map(|r| r.clone()).unwrap_or_default();
    let res = ScalingResult {
        spec_text: text.to_string(),
        name: spec.name.clone(),
        intervals,
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

/// Waits (up to 20 s) until every node serves a ring of `nodes` nodes: each has taken up
/// the topology just created.
fn wait_for_ring(seeds: &[SocketAddr], nodes: usize) -> anyhow::Result<()> {
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

/// Re-renders a scaling results directory's report from its `scaling.json`.
pub fn analyse_dir(dir: &Path) -> anyhow::Result<(String, PathBuf)> {
    let text = std::fs::read(dir.join("scaling.json")).context("scaling.json")?;
    let res: ScalingResult = serde_json::from_slice(&text)?;
    write(dir, &res)
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

/// What the clients saw after an event: errors from its start until the next event (or
/// the run's end), and until when they lasted.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Aftermath {
    /// Errors and timeouts in the intervals that end after the event began and begin
    /// before the next one.
    errors: u64,
    /// Seconds from the event's start to the end of the last of those intervals with an
    /// error (0: none): how long some keys could not be served.
    unavailable_s: f64,
}

/// The length of one interval of the time series, s (they are equal but the last).
fn interval_s(intervals: &[IntervalPoint]) -> f64 {
    match intervals {
        [] => 0.0,
        [only] => only.t,
        [a, b, ..] => b.t - a.t,
    }
}

fn aftermath(res: &ScalingResult, e: &EventRecord) -> Aftermath {
    let dt = interval_s(&res.intervals);
    let next = res
        .events
        .iter()
        .map(|x| x.started)
        .filter(|&s| s > e.started)
        .fold(f64::INFINITY, f64::min);
    let mut a = Aftermath::default();
    for i in &res.intervals {
        if i.t > e.started && i.t - dt < next {
            a.errors += i.errors;
            if i.errors > 0 {
                a.unavailable_s = i.t - e.started;
            }
        }
    }
    a
}

/// An event's marks on the time series: where it began and where it was over.
fn event_marks(events: &[EventRecord]) -> Vec<Mark> {
    let mut marks = Vec::new();
    for e in events {
        marks.push(Mark {
            x: e.started,
            label: format!("{} {}", e.action, e.node),
        });
        let over = match (e.action.as_str(), &e.error) {
            (_, Some(_)) => format!("{} failed", e.action),
            ("kill", None) => "ring healed".to_string(),
            (a, None) => format!("{a} done"),
        };
        marks.push(Mark {
            x: e.finished,
            label: over,
        });
    }
    marks
}

/// Writes the report; returns the summary and `index.html`'s path.
fn write(out: &Path, res: &ScalingResult) -> anyhow::Result<(String, PathBuf)> {
    let marks = event_marks(&res.events);
    let points = |f: &dyn Fn(&IntervalPoint) -> f64| -> Vec<Point> {
        res.intervals
            .iter()
            .map(|i| Point::new(i.t, f(i)))
            .collect()
    };
    let span = res.intervals.last().map_or(1.0, |i| i.t);
    let plot = |title: &str, y: &str, name: &str, f: &dyn Fn(&IntervalPoint) -> f64| {
        Item::LinePlot(LinePlot {
            title: title.into(),
            x_label: "time (s)".into(),
            y_label: y.into(),
            x_range: Some((0.0, span)),
            y_from_zero: true,
            series: vec![Series {
                name: name.into(),
                points: points(f),
                ..Series::default()
            }],
            marks: marks.clone(),
            caption: Some("Marks: each event's start and its end.".into()),
            ..LinePlot::default()
        })
    };
    let timeline = Item::LinePlot(LinePlot {
        title: "Throughput and errors over time".into(),
        x_label: "time (s)".into(),
        y_label: "throughput (req/s)".into(),
        x_range: Some((0.0, span)),
        y_from_zero: true,
        series: vec![Series {
            name: "completed (req/s)".into(),
            points: points(&|i| i.qps),
            ..Series::default()
        }],
        y2: Some(Y2 {
            label: "errors + timeouts per interval".into(),
            series: vec![Series {
                name: "errors + timeouts".into(),
                color: Some(1),
                points: points(&|i| i.errors as f64),
                ..Series::default()
            }],
        }),
        marks: marks.clone(),
        caption: Some(format!(
            "Per {:.1} s interval. Marks: each event's start (the action and its node) and \
             its end (a migration done, or the ring healed: the killed node no longer in \
             it).",
            interval_s(&res.intervals)
        )),
        ..LinePlot::default()
    });
    let t = &res.totals;
    let lost = t.verify_errors + t.misses;
    let mut rows = Vec::new();
    for e in &res.events {
        let m = e.migration.as_ref();
        let moved = m.map_or(0, |m| m.keys_copied);
        let after = aftermath(res, e);
        rows.push(
            Row::new([
                format!("{:.1}", e.started),
                format!("{} {}", e.action, e.node),
                format!("{:.3}", e.finished - e.started),
                m.map_or("-".into(), |m| {
                    format!("{:.3} / {:.3}", m.copy_s, m.handoff_s)
                }),
                m.map_or("-".into(), |_| moved.to_string()),
                m.map_or("-".into(), |_| {
                    format!(
                        "{:.1}% (expected {:.1}%)",
                        100.0 * moved as f64 / e.items_before.max(1) as f64,
                        100.0 * e.expected_fraction
                    )
                }),
                m.map_or("-".into(), |m| {
                    format!("{:.1}", m.bytes_sent as f64 / 1e6 / m.total_s.max(1e-9))
                }),
                after.errors.to_string(),
                format!("{:.1}", after.unavailable_s),
                e.error.clone().unwrap_or_else(|| "ok".into()),
            ])
            .highlighted(e.error.is_some()),
        );
    }
    let table = Table {
        title: "Events".into(),
        columns: [
            "at (s)",
            "event",
            "took (s)",
            "copy / hand-off (s)",
            "keys moved",
            "share moved",
            "MB/s",
            "client errors after it",
            "errors seen for (s)",
            "outcome",
        ]
        .map(String::from)
        .to_vec(),
        rows,
        ..Table::default()
    };
    let totals = Table {
        title: "The whole run".into(),
        columns: [
            "requests",
            "client errors",
            "timeouts",
            "lost writes (wrong values + misses)",
            "redirects followed",
        ]
        .map(String::from)
        .to_vec(),
        rows: vec![Row::new([
            t.completed.to_string(),
            t.errors.to_string(),
            t.timeouts.to_string(),
            lost.to_string(),
            t.redirects.to_string(),
        ])
        .highlighted(lost > 0)],
        ..Table::default()
    };
    let mut over_time = vec![timeline];
    if lost > 0 {
        over_time.insert(
            0,
            Item::Note(Note::warning(
                "Acknowledged writes lost",
                format!(
                    "{lost} reads found a key missing or with a wrong value ({} misses, {} \
                     wrong values): writes the cluster had acknowledged were lost.",
                    t.misses, t.verify_errors
                ),
            )),
        );
    }
    for e in res.events.iter().filter(|e| e.error.is_some()) {
        over_time.insert(
            0,
            Item::Note(Note::warning(
                format!("{} {} at {:.1} s failed", e.action, e.node, e.started),
                e.error.clone().unwrap_or_default(),
            )),
        );
    }
    over_time.push(plot("p99 latency", "p99 (µs)", "p99", &|i| i.p99_us));
    over_time.push(plot(
        "Errors",
        "errors per interval",
        "errors + timeouts",
        &|i| i.errors as f64,
    ));
    let mut events_items = vec![Item::Table(table), Item::Table(totals)];
    if !res.notes.is_empty() {
        events_items.push(Item::Note(Note::info(
            "Notes of the run",
            res.notes.join("; "),
        )));
    }
    let report = Report {
        title: format!("kvlab lab: {}", res.name),
        subtitle: Some("A kvlab cluster under a verified load while nodes come and go".into()),
        metadata: vec![
            ("kvlab".into(), env!("CARGO_PKG_VERSION").into()),
            ("commit".into(), crate::runner::commit().into()),
            ("keys".into(), res.keys.to_string()),
        ],
        sections: vec![
            Section {
                title: "Over time".into(),
                text: vec![format!(
                    "Every key was set before the run and every hit is verified: a miss or a \
                     wrong value is a lost write. {} requests, {} client errors, {} timeouts, \
                     {} lost writes.",
                    t.completed, t.errors, t.timeouts, lost
                )],
                items: over_time,
            },
            Section {
                title: "Events".into(),
                text: vec![
                    "Keys moved are the items copied by the migration's snapshots, as a share of \
                     the items in the cluster before it; expected: 1/(N+1) for an add to N \
                     nodes, the node's own share for a remove. A kill has no migration: it took \
                     until the ring no longer listed the node. Client errors after an event are \
                     those of the intervals from its start to the next event (or the run's \
                     end); they were seen for as long as the last such interval with an error \
                     ends after the event's start: how long some keys could not be served."
                        .into(),
                ],
                items: events_items,
            },
        ],
    };
    let files = kvlab_report::write_report(out.join("report"), &report)?;
    let mut summary = format!(
        "{}: {} requests, {} client errors, {} timeouts, {} lost writes, {} redirects followed\n",
        res.name, t.completed, t.errors, t.timeouts, lost, t.redirects
    );
    for e in &res.events {
        let after = aftermath(res, e);
        summary.push_str(&format!(
            "  {:>5.1} s {} {}: {:.3} s{}; {} client errors after it, seen for {:.1} s{}\n",
            e.started,
            e.action,
            e.node,
            e.finished - e.started,
            e.migration
                .as_ref()
                .map(|m| format!(
                    ", {} keys moved ({:.1}% of {}; expected {:.1}%)",
                    m.keys_copied,
                    100.0 * m.keys_copied as f64 / e.items_before.max(1) as f64,
                    e.items_before,
                    100.0 * e.expected_fraction
                ))
                .unwrap_or_default(),
            after.errors,
            after.unavailable_s,
            e.error
                .as_ref()
                .map(|x| format!(" FAILED: {x}"))
                .unwrap_or_default()
        ));
    }
    Ok((summary, files.index))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(t: f64, errors: u64) -> IntervalPoint {
        IntervalPoint {
            t,
            qps: 100.0,
            errors,
            ..IntervalPoint::default()
        }
    }

    #[test]
    fn an_events_errors_are_counted_until_the_next_event() {
        let res = ScalingResult {
            intervals: [0, 0, 3, 0, 2, 0, 1, 0]
                .iter()
                .enumerate()
                .map(|(i, &e)| point(0.5 * (i + 1) as f64, e))
                .collect(),
            events: vec![
                EventRecord {
                    action: "kill".into(),
                    started: 1.2,
                    finished: 2.1,
                    ..EventRecord::default()
                },
                EventRecord {
                    action: "add".into(),
                    started: 3.0,
                    finished: 3.4,
                    ..EventRecord::default()
                },
            ],
            ..ScalingResult::default()
        };
        // The kill: intervals ending at 1.5 .. 3.0 (the one ending at 3.5 began at 3.0).
        let a = aftermath(&res, &res.events[0]);
        assert_eq!(a.errors, 5);
        assert!((a.unavailable_s - (2.5 - 1.2)).abs() < 1e-9, "{a:?}");
        let b = aftermath(&res, &res.events[1]);
        assert_eq!(b.errors, 1);
        assert!((b.unavailable_s - 0.5).abs() < 1e-9, "{b:?}");
        let marks = event_marks(&res.events);
        assert_eq!(marks.len(), 4);
        assert_eq!(marks[1].label, "ring healed");
        assert_eq!(marks[3].label, "add done");
    }
}
