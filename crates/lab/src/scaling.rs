//! Scaling events: a kvlab cluster under a verified load while nodes are added, removed
//! or killed on a timed schedule, and the report of what each event cost.
//!
//! ```text
//! kind = "scaling" experiment ─► start etcd (topology = "etcd") and N nodes, create the
//!   cluster ─► fill the key space ─► one verified run through the cluster's ring
//!   (kvlab_bench, Config::cluster) while an event thread adds (a node it starts),
//!   removes or kills nodes at their times (kvlab_cluster::coordinator) ─► scaling.json
//!   ─► report: throughput, p99 and errors per interval with the events marked; a table
//!   per event: time, keys moved vs expected, MB/s, lost writes, client errors
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

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kvlab_bench::load::Options;
use kvlab_client::process::{free_ports, Probe, Process, Spawn};
use kvlab_client::testing::Etcd;
use kvlab_cluster::coordinator::{self, node_status, MigrationReport};
use kvlab_cluster::{open_store, TopologyStore};
use kvlab_report::{Item, LinePlot, LineStyle, Point, Report, Section, Series, Table};
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
    _etcd: Option<Etcd>,
}

impl Cluster {
    fn start_node(&mut self, port: u16) -> anyhow::Result<String> {
        let name = format!("127.0.0.1:{port}");
        let p = Spawn::new(self.bin.as_os_str())
            .args(["server", "-l", "127.0.0.1"])
            .args(["-p".to_string(), port.to_string()])
            .args(["--cluster".to_string(), self.topology.clone()])
            .args(["--cluster-node".to_string(), name.clone()])
            .args(self.args.iter().cloned())
            .ready(Probe::Version(SocketAddr::from(([127, 0, 0, 1], port))))
            .start()
            .with_context(|| format!("starting node {name}"))?;
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
    coordinator::create(
        store.as_ref(),
        kvlab_client::cluster::DEFAULT_VNODES,
        spec.replicas,
        names,
    )?;
    let mut cluster = Cluster {
        topology,
        store,
        nodes: Vec::new(),
        args: spec.node_args.clone(),
        bin: bin.to_path_buf(),
        _etcd: etcd,
    };
    for p in ports {
        cluster.start_node(p)?;
    }
    let load = spec.load()?;
    let seed: SocketAddr = cluster.nodes[0].0.parse()?;
    let cfg = load.config(seed)?;
    let keys = cfg.workload.keys;

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
        notes: result
            .notes
            .iter()
            .chain(&result.warnings)
            .cloned()
            .collect(),
    };
    crate::runner::write_json(&out.join("scaling.json"), &res)?;
    if let Ok(mut c) = cluster.lock() {
        c.nodes.clear(); // stops them
    }
    write(out, &res)
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
                let name = ring[e.node].clone();
                rec.node = name.clone();
                let items = node_status(&name)?["items"].as_u64().unwrap_or(0);
                rec.expected_fraction = items as f64 / rec.items_before.max(1) as f64;
                rec.migration = Some(coordinator::remove(c.store.as_ref(), &name, &mut |_| {})?);
                c.nodes.retain(|(n, _)| *n != name); // stops it
            }
            Action::Kill => {
                let name = ring[e.node].clone();
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

/// Writes the report; returns the summary and `index.html`'s path.
fn write(out: &Path, res: &ScalingResult) -> anyhow::Result<(String, PathBuf)> {
    let marks = |max: f64| -> Vec<Series> {
        res.events
            .iter()
            .map(|e| Series {
                name: format!("{} {} at {:.1} s", e.action, e.node, e.started),
                style: LineStyle::Dashed,
                color: None,
                points: vec![Point::new(e.started, 0.0), Point::new(e.started, max)],
            })
            .collect()
    };
    let series = |name: &str, f: &dyn Fn(&IntervalPoint) -> f64| Series {
        name: name.into(),
        style: LineStyle::Solid,
        color: Some(0),
        points: res
            .intervals
            .iter()
            .map(|i| Point::new(i.t, f(i)))
            .collect(),
    };
    let span = res.intervals.last().map_or(1.0, |i| i.t);
    let plot = |title: &str, y: &str, name: &str, f: &dyn Fn(&IntervalPoint) -> f64| {
        let max = res.intervals.iter().map(f).fold(1.0, f64::max);
        let mut s = vec![series(name, f)];
        s.extend(marks(max));
        Item::LinePlot(LinePlot {
            title: title.into(),
            x_label: "time (s)".into(),
            y_label: y.into(),
            x_range: Some((0.0, span)),
            y_from_zero: true,
            series: s,
            caption: Some("Dashed vertical lines: the events (when each began).".into()),
            ..LinePlot::default()
        })
    };
    let t = &res.totals;
    let lost = t.verify_errors + t.misses;
    let mut rows = Vec::new();
    for e in &res.events {
        let m = e.migration.as_ref();
        let moved = m.map_or(0, |m| m.keys_copied);
        rows.push(kvlab_report::Row {
            highlight: Default::default(),
            cells: vec![
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
                e.error.clone().unwrap_or_else(|| "ok".into()),
            ],
        });
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
        rows: vec![kvlab_report::Row {
            highlight: Default::default(),
            cells: vec![
                t.completed.to_string(),
                t.errors.to_string(),
                t.timeouts.to_string(),
                lost.to_string(),
                t.redirects.to_string(),
            ],
        }],
        ..Table::default()
    };
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
                     wrong value is a lost write. {} requests, {} client errors, {} lost writes.",
                    t.completed, t.errors, lost
                )],
                items: vec![
                    plot("Throughput", "throughput (req/s)", "completed", &|i| i.qps),
                    plot("p99 latency", "p99 (µs)", "p99", &|i| i.p99_us),
                    plot("Errors", "errors per interval", "errors + timeouts", &|i| {
                        i.errors as f64
                    }),
                ],
            },
            Section {
                title: "Events".into(),
                text: vec![
                    "Keys moved are the items copied by the migration's snapshots, as a share of \
                     the items in the cluster before it; expected: 1/(N+1) for an add to N \
                     nodes, the node's own share for a remove. A kill has no migration: it took \
                     until the ring no longer listed the node."
                        .into(),
                ],
                items: vec![Item::Table(table), Item::Table(totals)],
            },
        ],
    };
    let files = kvlab_report::write_report(out.join("report"), &report)?;
    let mut summary = format!(
        "{}: {} requests, {} client errors, {} timeouts, {} lost writes, {} redirects followed\n",
        res.name, t.completed, t.errors, t.timeouts, lost, t.redirects
    );
    for e in &res.events {
        summary.push_str(&format!(
            "  {:>5.1} s {} {}: {:.3} s{}{}\n",
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
            e.error
                .as_ref()
                .map(|x| format!(" FAILED: {x}"))
                .unwrap_or_default()
        ));
    }
    Ok((summary, files.index))
}
