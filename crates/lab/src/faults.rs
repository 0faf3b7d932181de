//! Fault-injection experiments: `kind = "faults"` runs kvlab's fault-injection harness
//! ([`kvlab_faults`]: recording clients, a seeded nemesis, the history checker) once per
//! seed and configuration, stores every run's files and reports what the checker found,
//! with a timeline of each run.
//!
//! ```text
//! kind = "faults" experiment (+ overrides)
//!   ─► configurations: topology × replicas × client (each key one value or a list)
//!   ─► for every seed, every configuration: kvlab_faults::run — a cluster of its own
//!      through the kvlab binary, clients and nemesis for `duration`, heal, final reads,
//!      check ─► runs/<configuration>/seed-<n>/ (schedule.json, history.jsonl,
//!      anomalies.json, timeline.txt, summary.json, every process' log)
//!   ─► faults.json (the experiment as run, a summary per run)
//!   ─► report: anomalies and failed runs at the top; a table per configuration (a row
//!      per seed, then the totals); per run a timeline (operations per interval by outcome,
//!      the nemesis's actions as marks, anomalies on the right-hand axis)
//! ```
//!
//! The file (every key optional but `kind`; the default follows `=`):
//!
//! ```toml
//! kind = "faults"             # *required*: this kind of experiment
//! name = "<file stem>"
//! description = ""
//! seeds = [1, 2, 3]           # or { from = 1, to = 50 }: one run per seed and configuration
//! duration = 20.0             # seconds of load and faults per run (heal, final reads and
//!                             # the check come after)
//! nodes = 3                   # nodes at the start
//! replicas = 1                # copies of every key; a list ([1, 2]) makes a configuration
//!                             # of each value
//! topology = "file"           # file | etcd (Debian's etcd, started per run), or a list
//! etcd_members = 1            # etcd: 1, or 3 (a quorum survives one member's death)
//! netns = false               # nodes, etcd and proxy in network namespaces of their own
//!                             # (root): the nemesis may then partition and delay them
//! client = "cluster"          # cluster (cluster-aware) | proxy (plain clients through
//!                             # `kvlab proxy --cluster`), or a list
//! faults = <default>          # the kinds the nemesis draws, e.g. ["pause", "add", "remove"]
//!                             # (kill, pause, add, remove, add-two, remove-two,
//!                             # coordinator-kill, etcd-kill, flush). Default: what each
//!                             # configuration is expected to survive (kill only with 2
//!                             # copies, etcd-kill only with etcd, never flush)
//! clients = 4                 # client threads
//! keys = 200                  # keys they share
//! rate = 250                  # operations a second per client, at most
//! write_share = 0.5           # share of writes
//! timeout_ms = 1000           # one request's timeout (then its outcome is unknown)
//! node_args = ["-t", "2", "-m", "64"]   # every node's `kvlab server` flags
//! interval = 0.5              # seconds per point of the timelines
//! ```
//!
//! The command line's overrides: `--duration S` is every run's duration, `--repetitions N`
//! keeps the first N seeds, `--set KEY=VALUE` sets any key above but `kind` (VALUE read as
//! TOML, else as text: `--set seeds=[1]`, `--set keys=50`, `--set topology=etcd`);
//! `--warmup` is an error (the clients need none). They are stored in `faults.json`.
//!
//! A run's checker verdict is the experiment's finding, not its failure: `kvlab lab run`
//! succeeds when every run was carried out and checked, whatever it found, and the report
//! puts anomalies — lost writes, stale reads, values never written, histories with no
//! linearization — and runs that did not go as planned at its top.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use kvlab_faults::clients::Workload;
use kvlab_faults::{
    AnomalyKind, Capabilities, ClientKind, History, Mix, Outcome, RunConfig, RunSummary,
    TopologyKind,
};
use kvlab_report::{
    Item, LinePlot, LineStyle, Mark, Note, Point, Report, Row, Section, Series, Table, Y2,
};
use serde::{Deserialize, Serialize};

use crate::spec::Overrides;

/// One value or a list of them (a list makes a configuration of each).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany<T> {
    /// One value.
    One(T),
    /// Several.
    Many(Vec<T>),
}

impl<T: Clone> OneOrMany<T> {
    /// The values, in order.
    pub fn values(&self) -> Vec<T> {
        match self {
            OneOrMany::One(v) => vec![v.clone()],
            OneOrMany::Many(v) => v.clone(),
        }
    }
}

/// The seeds: a list, or an inclusive range.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Seeds {
    /// These seeds.
    List(Vec<u64>),
    /// `from..=to`.
    Range {
        /// The first.
        from: u64,
        /// The last (included).
        to: u64,
    },
}

impl Seeds {
    /// The seeds, in order.
    pub fn values(&self) -> Vec<u64> {
        match self {
            Seeds::List(v) => v.clone(),
            Seeds::Range { from, to } => (*from..=*to).collect(),
        }
    }
}

fn d_seeds() -> Seeds {
    Seeds::List(vec![1, 2, 3])
}
fn d_duration() -> f64 {
    20.0
}
fn d_nodes() -> usize {
    3
}
fn d_replicas() -> OneOrMany<u32> {
    OneOrMany::One(1)
}
fn d_topology() -> OneOrMany<String> {
    OneOrMany::One("file".into())
}
fn d_one() -> usize {
    1
}
fn d_client() -> OneOrMany<String> {
    OneOrMany::One("cluster".into())
}
fn d_clients() -> u32 {
    Workload::default().clients
}
fn d_keys() -> u32 {
    Workload::default().keys
}
fn d_rate() -> u32 {
    Workload::default().rate
}
fn d_write_share() -> f64 {
    Workload::default().write_share
}
fn d_timeout_ms() -> u64 {
    Workload::default().timeout.as_millis() as u64
}
fn d_node_args() -> Vec<String> {
    ["-t", "2", "-m", "64"].map(String::from).to_vec()
}
fn d_interval() -> f64 {
    0.5
}

/// A fault-injection experiment (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultsSpec {
    /// Must be `"faults"`.
    pub kind: String,
    /// Names the results directory.
    #[serde(default)]
    pub name: String,
    /// Shown in the report.
    #[serde(default)]
    pub description: String,
    /// One run per seed and configuration.
    #[serde(default = "d_seeds")]
    pub seeds: Seeds,
    /// Seconds of load and faults per run.
    #[serde(default = "d_duration")]
    pub duration: f64,
    /// Nodes at the start.
    #[serde(default = "d_nodes")]
    pub nodes: usize,
    /// Copies of every key.
    #[serde(default = "d_replicas")]
    pub replicas: OneOrMany<u32>,
    /// `file` or `etcd`.
    #[serde(default = "d_topology")]
    pub topology: OneOrMany<String>,
    /// etcd members with `topology = "etcd"`.
    #[serde(default = "d_one")]
    pub etcd_members: usize,
    /// Every node, etcd member and the proxy in a network namespace of its own (root).
    #[serde(default)]
    pub netns: bool,
    /// `cluster` or `proxy`.
    #[serde(default = "d_client")]
    pub client: OneOrMany<String>,
    /// The kinds the nemesis draws (none: each configuration's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub faults: Option<Vec<String>>,
    /// Client threads.
    #[serde(default = "d_clients")]
    pub clients: u32,
    /// Keys the clients share.
    #[serde(default = "d_keys")]
    pub keys: u32,
    /// Operations a second per client, at most.
    #[serde(default = "d_rate")]
    pub rate: u32,
    /// Share of writes.
    #[serde(default = "d_write_share")]
    pub write_share: f64,
    /// One request's timeout, ms.
    #[serde(default = "d_timeout_ms")]
    pub timeout_ms: u64,
    /// Every node's `kvlab server` flags.
    #[serde(default = "d_node_args")]
    pub node_args: Vec<String>,
    /// Seconds per point of the timelines.
    #[serde(default = "d_interval")]
    pub interval: f64,
}

/// One configuration of a faults experiment: where the topology lives, how many copies,
/// how clients reach the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Configuration {
    /// `file` or `etcd`.
    pub topology: String,
    /// Copies of every key.
    pub replicas: u32,
    /// `cluster` or `proxy`.
    pub client: String,
}

impl Configuration {
    /// Its name in the report: `file, 1 copy, cluster-aware clients`.
    pub fn label(&self) -> String {
        format!(
            "{}, {} cop{}, {}",
            self.topology,
            self.replicas,
            if self.replicas == 1 { "y" } else { "ies" },
            match self.client.as_str() {
                "proxy" => "clients through the proxy",
                "pool" => "clients through the proxy over a plain pool",
                _ => "cluster-aware clients",
            }
        )
    }

    /// Its directory's name: `file-r1-cluster`.
    pub fn slug(&self) -> String {
        format!("{}-r{}-{}", self.topology, self.replicas, self.client)
    }
}

/// Whether `text` is a faults experiment (top-level `kind = "faults"`).
pub fn is_faults(text: &str) -> bool {
    toml::from_str::<toml::Table>(text)
        .ok()
        .and_then(|t| {
            t.get("kind")
                .and_then(|k| k.as_str().map(|k| k == "faults"))
        })
        .unwrap_or(false)
}

/// `--set KEY=VALUE` as a TOML key and value (a TOML value when VALUE is one, else text).
fn assignment(kv: &str) -> anyhow::Result<(String, toml::Value)> {
    let Some((k, v)) = kv.split_once('=') else {
        bail!("--set {kv}: expected KEY=VALUE, e.g. --set keys=50");
    };
    let k = k.trim();
    if k == "kind" {
        bail!("--set {kv}: the kind of an experiment is its file's");
    }
    let value = toml::from_str::<toml::Table>(&format!("v = {v}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(v.to_string()));
    Ok((k.to_string(), value))
}

impl FaultsSpec {
    /// Reads and checks a faults experiment file with `overrides` applied.
    pub fn parse(text: &str, stem: &str, overrides: &Overrides) -> anyhow::Result<FaultsSpec> {
        let mut table: toml::Table = toml::from_str(text).context("faults experiment")?;
        if overrides.warmup.is_some() {
            bail!("--warmup: a faults experiment has no warm-up (its clients need none)");
        }
        for kv in &overrides.set {
            let (k, v) = assignment(kv)?;
            table.insert(k, v);
        }
        if let Some(d) = overrides.duration {
            table.insert("duration".into(), toml::Value::Float(d));
        }
        let mut s: FaultsSpec = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| anyhow::anyhow!("{}", e.message()))
            .with_context(|| {
                if overrides.is_empty() {
                    "faults experiment".to_string()
                } else {
                    format!("faults experiment with {}", overrides.flags())
                }
            })?;
        if s.kind != "faults" {
            bail!(
                "kind = {:?}: a faults experiment says kind = \"faults\"",
                s.kind
            );
        }
        if s.name.is_empty() {
            s.name = stem.to_string();
        }
        if let Some(n) = overrides.repetitions {
            let seeds = s.seeds.values();
            if n == 0 || n > seeds.len() {
                bail!(
                    "--repetitions {n}: a faults experiment's repetitions are its seeds (1..={})",
                    seeds.len()
                );
            }
            s.seeds = Seeds::List(seeds[..n].to_vec());
        }
        s.check()?;
        Ok(s)
    }

    fn check(&self) -> anyhow::Result<()> {
        let seeds = self.seeds.values();
        if seeds.is_empty() {
            bail!("seeds: no seed (e.g. seeds = [1, 2, 3] or {{ from = 1, to = 10 }})");
        }
        if seeds.len() > 10_000 {
            bail!(
                "seeds: {} runs per configuration; at most 10000",
                seeds.len()
            );
        }
        if !(self.duration >= 1.0 && self.duration <= 86_400.0) {
            bail!(
                "duration = {}: 1 to 86400 seconds of load and faults per run",
                self.duration
            );
        }
        if !(self.interval > 0.0 && self.interval.is_finite()) {
            bail!("interval = {}: must be > 0 seconds", self.interval);
        }
        if self.nodes < 2 {
            bail!("nodes = {}: at least 2", self.nodes);
        }
        if !matches!(self.etcd_members, 1 | 3) {
            bail!("etcd_members = {}: 1 or 3", self.etcd_members);
        }
        if self.clients == 0 || self.keys == 0 || self.rate == 0 || self.timeout_ms == 0 {
            bail!("clients, keys, rate and timeout_ms must be at least 1");
        }
        if !(0.0..=1.0).contains(&self.write_share) {
            bail!("write_share = {}: a share, 0 to 1", self.write_share);
        }
        let configs = self.configurations();
        if configs.is_empty() {
            bail!("no configuration: topology, replicas and client need a value each");
        }
        for c in &configs {
            if !matches!(c.topology.as_str(), "file" | "etcd") {
                bail!("topology = {:?}: file or etcd", c.topology);
            }
            if !matches!(c.client.as_str(), "cluster" | "proxy" | "pool") {
                bail!("client = {:?}: cluster, proxy or pool", c.client);
            }
            if c.client == "pool" && c.topology != "file" {
                bail!("client = \"pool\" has no topology: topology = \"file\"");
            }
            if c.replicas == 0 || c.replicas as usize > self.nodes {
                bail!("replicas = {}: 1 to the nodes ({})", c.replicas, self.nodes);
            }
            self.mix(c)
                .with_context(|| format!("faults for {}", c.label()))?;
        }
        Ok(())
    }

    /// Every combination of topology, replicas and client, in that order.
    pub fn configurations(&self) -> Vec<Configuration> {
        let mut out = Vec::new();
        for topology in self.topology.values() {
            for replicas in self.replicas.values() {
                for client in self.client.values() {
                    out.push(Configuration {
                        topology: topology.clone(),
                        replicas,
                        client,
                    });
                }
            }
        }
        out
    }

    fn topology_kind(&self, c: &Configuration) -> TopologyKind {
        match c.topology.as_str() {
            "etcd" => TopologyKind::Etcd {
                members: self.etcd_members,
            },
            _ => TopologyKind::File,
        }
    }

    /// The fault kinds of configuration `c` (none: the harness's default for it).
    fn mix(&self, c: &Configuration) -> anyhow::Result<Option<Mix>> {
        let caps = Capabilities {
            replicas: c.replicas,
            etcd: matches!(self.topology_kind(c), TopologyKind::Etcd { .. }),
            netns: false,
            pool: c.client == "pool",
        };
        match &self.faults {
            None => Ok(None),
            Some(list) => Mix::parse(&list.join(","), caps)
                .map(Some)
                .map_err(anyhow::Error::msg),
        }
    }

    /// The harness's settings for seed `seed` of configuration `c`, its files in `dir`.
    pub fn run_config(
        &self,
        c: &Configuration,
        seed: u64,
        dir: PathBuf,
        exe: &Path,
        interrupt: &Arc<AtomicBool>,
    ) -> anyhow::Result<RunConfig> {
        Ok(RunConfig {
            netns: self.netns,
            seed,
            duration: Duration::from_secs_f64(self.duration),
            nodes: self.nodes,
            replicas: c.replicas,
            topology: self.topology_kind(c),
            client: match c.client.as_str() {
                "proxy" => ClientKind::Proxy,
                "pool" => ClientKind::Pool,
                _ => ClientKind::Cluster,
            },
            mix: self.mix(c)?,
            workload: Workload {
                clients: self.clients,
                keys: self.keys,
                write_share: self.write_share,
                rate: self.rate,
                timeout: Duration::from_millis(self.timeout_ms),
                ..Workload::default()
            },
            exe: exe.to_path_buf(),
            dir,
            server_args: self.node_args.clone(),
            interrupt: Arc::clone(interrupt),
        })
    }
}

/// One run of a faults experiment, as `faults.json` keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRecord {
    /// The configuration.
    pub configuration: Configuration,
    /// The seed.
    pub seed: u64,
    /// Its files, relative to the results directory.
    pub dir: String,
    /// What the harness said of it.
    pub summary: RunSummary,
}

/// A faults experiment's results (`faults.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FaultsResult {
    /// The experiment file as given.
    pub spec_text: String,
    /// The command line's overrides.
    #[serde(default)]
    pub overrides: Overrides,
    /// The experiment as run (overrides applied).
    pub spec: FaultsSpec,
    /// Every run, in the order they ran.
    pub runs: Vec<RunRecord>,
    /// Whether a signal ended the experiment before its last run.
    #[serde(default)]
    pub interrupted: bool,
}

/// Runs a faults experiment into `out`, writes `faults.json` and the report; returns the
/// summary and the report's `index.html`.
pub fn run(
    spec: &FaultsSpec,
    text: &str,
    overrides: &Overrides,
    out: &Path,
    bin: &Path,
) -> anyhow::Result<(String, PathBuf)> {
    // SIGINT or SIGTERM ends the run in progress early but cleanly (the harness stops every
    // process it started and checks what was recorded) and then the experiment.
    let interrupt = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&interrupt))
            .context("installing signal handlers")?;
    }
    let mut res = FaultsResult {
        spec_text: text.to_string(),
        overrides: overrides.clone(),
        spec: spec.clone(),
        runs: Vec::new(),
        interrupted: false,
    };
    let configs = spec.configurations();
    let seeds = spec.seeds.values();
    let total = configs.len() * seeds.len();
    'all: for &seed in &seeds {
        for c in &configs {
            if interrupt.load(Ordering::Relaxed) {
                res.interrupted = true;
                break 'all;
            }
            let rel = format!("runs/{}/seed-{seed}", c.slug());
            eprintln!(
                "run {} of {total}: seed {seed}, {} ({} s of faults)",
                res.runs.len() + 1,
                c.label(),
                spec.duration
            );
            let cfg = spec.run_config(c, seed, out.join(&rel), bin, &interrupt)?;
            let summary = kvlab_faults::run(&cfg);
            eprintln!("  {}", summary.line());
            res.runs.push(RunRecord {
                configuration: c.clone(),
                seed,
                dir: rel,
                summary,
            });
            // What ran so far is on disk whatever happens to the rest.
            crate::runner::write_json(&out.join("faults.json"), &res)?;
        }
    }
    res.interrupted |= interrupt.load(Ordering::Relaxed) && res.runs.len() < total;
    crate::runner::write_json(&out.join("faults.json"), &res)?;
    write(out, &res)
}

/// Re-renders a faults results directory's report from `faults.json` and its runs' files.
pub fn analyse_dir(dir: &Path) -> anyhow::Result<(String, PathBuf)> {
    let text = std::fs::read(dir.join("faults.json")).context("faults.json")?;
    let res: FaultsResult = serde_json::from_slice(&text).context("faults.json")?;
    write(dir, &res)
}

/// A run's files as read back for the report.
struct RunFiles {
    history: Option<History>,
    report: Option<kvlab_faults::Report>,
}

fn read_run(dir: &Path) -> RunFiles {
    let history = std::fs::File::open(dir.join("history.jsonl"))
        .ok()
        .and_then(|f| History::read_jsonl(std::io::BufReader::new(f), "history.jsonl").ok());
    let report = std::fs::read(dir.join("anomalies.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    RunFiles { history, report }
}

/// When an anomaly happened, in seconds since its run's start: a stale read or a value never
/// written when its read returned; a lost write when the write it lost was acknowledged.
fn anomaly_time(a: &kvlab_faults::Anomaly) -> Option<f64> {
    let read = a.ops.first()?;
    let ns = if a.kind == AnomalyKind::LostWrite && read.final_read {
        a.ops
            .iter()
            .skip(1)
            .filter(|o| o.outcome == Outcome::Ok && o.kind == kvlab_faults::OpKind::Write)
            .map(|o| o.complete_ns)
            .max()
            .unwrap_or(read.complete_ns)
    } else {
        read.complete_ns
    };
    Some(ns as f64 / 1e9)
}

fn kind_name(k: AnomalyKind) -> &'static str {
    match k {
        AnomalyKind::LostWrite => "lost write",
        AnomalyKind::StaleRead => "stale read",
        AnomalyKind::NeverWritten => "never written",
    }
}

/// A node's name without the address every node shares (`127.0.0.1:7102` → `:7102`).
fn short(target: &str) -> &str {
    target.strip_prefix("127.0.0.1").unwrap_or(target)
}

/// Most anomalies of one run in the report's table (its anomalies.json has more).
const ANOMALY_ROWS: usize = 10;
/// Most bins a timeline has (a longer run gets wider ones).
const MAX_BINS: usize = 600;
/// Most nemesis marks on one timeline (the first ones; the table of the run has them all).
const MAX_MARKS: usize = 60;
/// Most anomalies marked one by one on a timeline (all are counted on its right axis).
const MAX_ANOMALY_MARKS: usize = 12;

/// The timeline of one run: operations per interval by outcome (by when they completed),
/// the final reads, the nemesis's actions as marks, anomalies on the right axis.
fn timeline(
    title: &str,
    h: &History,
    anomalies: &[kvlab_faults::Anomaly],
    interval: f64,
) -> LinePlot {
    let end_ns = h
        .ops
        .iter()
        .map(|o| o.complete_ns)
        .chain(h.nemesis.iter().map(|e| e.end_ns))
        .filter(|&t| t != u64::MAX)
        .max()
        .unwrap_or(0);
    let end = end_ns as f64 / 1e9;
    let mut dt = interval;
    if end / dt > MAX_BINS as f64 {
        dt = end / MAX_BINS as f64;
    }
    let bins = ((end / dt).ceil() as usize).max(1);
    let bin = |s: f64| ((s / dt) as usize).min(bins - 1);
    // ok, failed, unknown, final reads
    let mut counts = vec![[0u64; 4]; bins];
    for o in &h.ops {
        let b = bin(o.complete_ns as f64 / 1e9);
        let i = if o.final_read {
            3
        } else {
            match o.outcome {
                Outcome::Ok => 0,
                Outcome::Failed => 1,
                Outcome::Unknown => 2,
            }
        };
        counts[b][i] += 1;
    }
    let series = |name: &str, i: usize, color: usize, style: LineStyle| Series {
        name: name.into(),
        style,
        color: Some(color),
        points: counts
            .iter()
            .enumerate()
            .map(|(b, c)| Point::new((b as f64 + 1.0) * dt, c[i] as f64))
            .collect(),
    };
    let mut lines = vec![
        series("ok", 0, 0, LineStyle::Solid),
        series("failed", 1, 6, LineStyle::Solid),
        series("unknown", 2, 3, LineStyle::Solid),
    ];
    if h.ops.iter().any(|o| o.final_read) {
        lines.push(series("final reads", 3, 2, LineStyle::Dashed));
    }
    let mut marks: Vec<Mark> = h
        .nemesis
        .iter()
        .filter(|e| {
            !e.detail
                .as_deref()
                .is_some_and(|d| d.starts_with(kvlab_faults::nemesis::SKIPPED))
        })
        .take(MAX_MARKS)
        .map(|e| Mark {
            x: e.start_ns as f64 / 1e9,
            label: format!(
                "{} {}{}",
                e.what,
                short(&e.target),
                if e.ok { "" } else { " FAILED" }
            )
            .trim_end()
            .to_string(),
        })
        .collect();
    let mut times: Vec<(f64, &kvlab_faults::Anomaly)> = anomalies
        .iter()
        .filter_map(|a| anomaly_time(a).map(|t| (t, a)))
        .collect();
    times.sort_by(|a, b| a.0.total_cmp(&b.0));
    if times.len() <= MAX_ANOMALY_MARKS {
        marks.extend(times.iter().map(|(t, a)| Mark {
            x: *t,
            label: format!("{} {}", kind_name(a.kind).to_uppercase(), a.key),
        }));
    }
    let y2 = (!times.is_empty()).then(|| {
        let mut per = vec![0u64; bins];
        for (t, _) in &times {
            per[bin(*t)] += 1;
        }
        Y2 {
            label: "anomalies per interval".into(),
            series: vec![Series {
                name: "anomalies".into(),
                color: Some(1),
                points: per
                    .iter()
                    .enumerate()
                    .map(|(b, n)| Point::new((b as f64 + 1.0) * dt, *n as f64))
                    .collect(),
                ..Series::default()
            }],
        }
    });
    let caption = format!(
        "Operations completed per {dt:.2} s interval, by outcome (ok: acknowledged; failed: \
         certainly not applied; unknown: sent, then no answer), and the final reads after \
         the heal. Marks: the nemesis's actions as they began{}.{}",
        if times.is_empty() || times.len() > MAX_ANOMALY_MARKS {
            ""
        } else {
            ", and each anomaly (upper case: a stale read or a value never written when its \
             read returned, a lost write when the write it lost was acknowledged)"
        },
        if times.is_empty() {
            " The checker found no anomaly."
        } else {
            " Right axis (red): anomalies per interval."
        }
    );
    LinePlot {
        title: title.into(),
        x_label: "time since the run's start (s)".into(),
        y_label: format!("operations per {dt:.2} s"),
        x_range: Some((0.0, (bins as f64 * dt).max(dt))),
        y_from_zero: true,
        series: lines,
        y2,
        marks,
        caption: Some(caption),
        ..LinePlot::default()
    }
}

fn run_row(seed: &str, s: &RunSummary) -> Row {
    Row::new([
        seed.to_string(),
        s.mix.clone(),
        format!(
            "{} ({} failed, {} skipped)",
            s.actions, s.actions_failed, s.actions_skipped
        ),
        s.ops.to_string(),
        format!("{} / {} / {}", s.ok, s.failed, s.unknown),
        format!(
            "{} ({} / {} / {} / {})",
            s.anomalies, s.lost_writes, s.stale_reads, s.never_written, s.not_linearizable
        ),
        s.unverified_keys.to_string(),
        format!("{:.1}", s.seconds),
        s.error.clone().unwrap_or_else(|| "-".into()),
    ])
    .highlighted(!s.clean())
}

const RUN_COLUMNS: [&str; 9] = [
    "seed",
    "faults drawn",
    "nemesis actions",
    "operations checked",
    "ok / failed / unknown",
    "anomalies (lost writes / stale reads / never written / keys not linearizable)",
    "keys unverified",
    "run (s)",
    "run error",
];

/// Writes the report; returns the summary and `index.html`'s path.
fn write(out: &Path, res: &FaultsResult) -> anyhow::Result<(String, PathBuf)> {
    let spec = &res.spec;
    let files: Vec<RunFiles> = res
        .runs
        .iter()
        .map(|r| read_run(&out.join(&r.dir)))
        .collect();
    let name_of = |r: &RunRecord| format!("seed {} ({})", r.seed, r.configuration.label());

    // At the top: what the checker found, and runs that did not go as planned.
    let mut top = Vec::new();
    let mut anomaly_rows = Vec::new();
    for (r, f) in res.runs.iter().zip(&files) {
        let s = &r.summary;
        if s.anomalies > 0 {
            let mut kinds = Vec::new();
            for (n, what) in [
                (s.lost_writes, "lost writes"),
                (s.stale_reads, "stale reads"),
                (s.never_written, "reads of values never written"),
                (s.not_linearizable, "keys with no linearization"),
            ] {
                if n > 0 {
                    kinds.push(format!("{n} {what}"));
                }
            }
            top.push(Item::Note(Note::warning(
                format!("{}: {} anomalies", name_of(r), s.anomalies),
                format!(
                    "The checker found {} anomalies: {}. The history is {}/history.jsonl \
                     (`kvlab faults check` judges it again).",
                    s.anomalies,
                    kinds.join(", "),
                    r.dir
                ),
            )));
        }
        if let Some(e) = &s.error {
            top.push(Item::Note(Note::warning(
                format!("The run did not go as planned: {}", name_of(r)),
                format!("{e} (what it recorded was checked)"),
            )));
        }
        if s.unverified_keys > 0 {
            top.push(Item::Note(Note::warning(
                format!("Keys not verified: {}", name_of(r)),
                format!(
                    "{} keys with an acknowledged write were not read back after the heal: \
                     their writes may be lost unseen.",
                    s.unverified_keys
                ),
            )));
        }
        let Some(report) = &f.report else { continue };
        let mut listed: Vec<&kvlab_faults::Anomaly> = report.anomalies.iter().collect();
        listed.sort_by(|a, b| {
            let t = |a: &kvlab_faults::Anomaly| anomaly_time(a).unwrap_or(f64::INFINITY);
            t(a).total_cmp(&t(b))
        });
        for a in listed.into_iter().take(ANOMALY_ROWS) {
            anomaly_rows.push(
                Row::new([
                    r.seed.to_string(),
                    r.configuration.label(),
                    kind_name(a.kind).to_string(),
                    a.key.clone(),
                    anomaly_time(a).map_or("-".into(), |t| format!("{t:.3}")),
                    a.why.clone(),
                ])
                .highlighted(true),
            );
        }
        for k in &report.linearizability.not_linearizable {
            anomaly_rows.push(
                Row::new([
                    r.seed.to_string(),
                    r.configuration.label(),
                    "not linearizable".to_string(),
                    k.clone(),
                    "-".to_string(),
                    "the key's history has no linearization (found by the search alone)"
                        .to_string(),
                ])
                .highlighted(true),
            );
        }
    }
    let total_anomalies: u64 = res.runs.iter().map(|r| r.summary.anomalies).sum();
    let total_ops: u64 = res.runs.iter().map(|r| r.summary.ops).sum();
    let clean = res.runs.iter().all(|r| r.summary.clean());
    if res.interrupted {
        top.push(Item::Note(Note::warning(
            "Interrupted",
            format!(
                "A signal ended the experiment after {} of its runs.",
                res.runs.len()
            ),
        )));
    }
    if total_anomalies == 0 {
        top.insert(
            0,
            Item::Note(Note::info(
                "No anomalies",
                format!(
                    "{} runs, {total_ops} operations checked: no lost write, no stale read, no \
                     value never written, every history searched has a linearization.",
                    res.runs.len()
                ),
            )),
        );
    }
    if !anomaly_rows.is_empty() {
        top.push(Item::Table(Table {
            title: "Anomalies".into(),
            columns: ["seed", "configuration", "anomaly", "key", "at (s)", "why"]
                .map(String::from)
                .to_vec(),
            rows: anomaly_rows,
            caption: Some(format!(
                "The first {ANOMALY_ROWS} anomalies of each run in time (seconds since the \
                 run's start), and every key with no linearization; a run's anomalies.json \
                 lists up to {} of each kind, with the operations that show them.",
                kvlab_faults::checker::LISTED_PER_KIND
            )),
        }));
    }

    let mut sections = vec![Section {
        title: "Anomalies".into(),
        text: vec![
            "The checker judges every key's history as a register of unique values: a lost \
             write (the final read after the heal misses an acknowledged write), a stale read \
             (a read older than a write acknowledged before it began), a value never written, \
             and a key whose history has no linearization. A write of unknown outcome may \
             have taken effect at any time after it began."
                .into(),
        ],
        items: top,
    }];

    // A table per configuration: a row per seed, then the totals.
    let configs = res.spec.configurations();
    let mut tables = Vec::new();
    for c in &configs {
        let runs: Vec<&RunRecord> = res.runs.iter().filter(|r| r.configuration == *c).collect();
        if runs.is_empty() {
            continue;
        }
        let mut rows: Vec<Row> = runs
            .iter()
            .map(|r| run_row(&r.seed.to_string(), &r.summary))
            .collect();
        let mut t = RunSummary::default();
        let mut mixes: BTreeMap<String, usize> = BTreeMap::new();
        for r in &runs {
            let s = &r.summary;
            for part in s.mix.split_whitespace() {
                if let Some((k, n)) = part.split_once('=') {
                    *mixes.entry(k.to_string()).or_default() += n.parse::<usize>().unwrap_or(0);
                }
            }
            t.actions += s.actions;
            t.actions_failed += s.actions_failed;
            t.actions_skipped += s.actions_skipped;
            t.ops += s.ops;
            t.ok += s.ok;
            t.failed += s.failed;
            t.unknown += s.unknown;
            t.lost_writes += s.lost_writes;
            t.stale_reads += s.stale_reads;
            t.never_written += s.never_written;
            t.not_linearizable += s.not_linearizable;
            t.anomalies += s.anomalies;
            t.unverified_keys += s.unverified_keys;
            t.seconds += s.seconds;
        }
        t.mix = mixes
            .iter()
            .map(|(k, n)| format!("{k}={n}"))
            .collect::<Vec<_>>()
            .join(" ");
        let failed_runs = runs.iter().filter(|r| r.summary.error.is_some()).count();
        if failed_runs > 0 {
            t.error = Some(format!("{failed_runs} runs did not go as planned"));
        }
        rows.push(run_row(&format!("all {}", runs.len()), &t));
        tables.push(Item::Table(Table {
            title: format!("Runs: {}", c.label()),
            columns: RUN_COLUMNS.map(String::from).to_vec(),
            rows,
            caption: Some(
                "Operations checked include the final reads. Highlighted: a run with \
                 anomalies, unverified keys or an error."
                    .into(),
            ),
        }));
    }
    let mut faults_text = vec![format!(
        "{} runs: seeds {} × {} configuration(s), {} s of load and faults each on {} nodes \
         ({} clients over {} keys, at most {} operations a second each, {:.0}% writes, \
         {} ms timeouts); then the nemesis ends its last fault, the cluster is healed, \
         every key read back and the history checked.",
        res.runs.len(),
        seeds_text(&spec.seeds),
        configs.len(),
        spec.duration,
        spec.nodes,
        spec.clients,
        spec.keys,
        spec.rate,
        100.0 * spec.write_share,
        spec.timeout_ms
    )];
    faults_text.push(match &spec.faults {
        Some(f) => format!("Fault kinds drawn: {}.", f.join(", ")),
        None => "Fault kinds drawn: what each configuration is expected to survive (kill -9 \
                 only with two copies, etcd member kills only with etcd)."
            .into(),
    });
    sections.push(Section {
        title: "Faults: runs".into(),
        text: faults_text,
        items: tables,
    });

    for c in &configs {
        let mut items = Vec::new();
        for (r, f) in res.runs.iter().zip(&files) {
            if r.configuration != *c {
                continue;
            }
            match &f.history {
                Some(h) => {
                    let anomalies = f.report.as_ref().map_or(&[][..], |x| &x.anomalies[..]);
                    items.push(Item::LinePlot(timeline(
                        &format!("Timeline: seed {}, {}", r.seed, c.slug()),
                        h,
                        anomalies,
                        spec.interval,
                    )));
                }
                None => items.push(Item::Note(Note::info(
                    format!("Seed {}: no history", r.seed),
                    format!("{}/history.jsonl could not be read", r.dir),
                ))),
            }
        }
        if items.is_empty() {
            continue;
        }
        sections.push(Section {
            title: format!("Timelines: {}", c.label()),
            text: vec![format!(
                "One plot per seed; each run's actions, with what they said, are in its \
                 timeline.txt (runs/{}/seed-N/).",
                c.slug()
            )],
            items,
        });
    }

    let mut metadata = vec![
        ("kvlab".to_string(), env!("CARGO_PKG_VERSION").to_string()),
        ("commit".into(), crate::runner::commit().into()),
        ("seeds".into(), seeds_text(&spec.seeds)),
        (
            "configurations".into(),
            configs
                .iter()
                .map(Configuration::label)
                .collect::<Vec<_>>()
                .join("; "),
        ),
    ];
    if !res.overrides.is_empty() {
        metadata.push(("overrides".into(), res.overrides.flags()));
    }
    let report = Report {
        title: format!("kvlab lab: {}", spec.name),
        subtitle: Some(if spec.description.is_empty() {
            "Seeded faults against a kvlab cluster, every operation recorded and checked".into()
        } else {
            spec.description.clone()
        }),
        metadata,
        sections,
    };
    let written = kvlab_report::write_report(out.join("report"), &report)?;

    let mut summary = format!("{}: ", spec.name);
    summary.push_str(&if clean {
        format!(
            "{} runs, {total_ops} operations checked, no anomalies\n",
            res.runs.len()
        )
    } else {
        format!(
            "{} runs, {total_ops} operations checked, {total_anomalies} ANOMALIES; {} runs \
             not clean\n",
            res.runs.len(),
            res.runs.iter().filter(|r| !r.summary.clean()).count()
        )
    });
    for c in &configs {
        let runs: Vec<RunSummary> = res
            .runs
            .iter()
            .filter(|r| r.configuration == *c)
            .map(|r| r.summary.clone())
            .collect();
        if runs.is_empty() {
            continue;
        }
        summary.push_str(&format!("\n{}\n", c.label()));
        summary.push_str(&kvlab_faults::runner::table(&runs));
    }
    Ok((summary, written.index))
}

fn seeds_text(s: &Seeds) -> String {
    match s {
        Seeds::Range { from, to } => format!("{from}..={to}"),
        Seeds::List(v) => v.iter().map(u64::to_string).collect::<Vec<_>>().join(", "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvlab_faults::{NemesisEvent, Op, OpKind};

    const QUICK: &str = include_str!("../../../experiments/faults-quick.toml");
    const SOAK: &str = include_str!("../../../experiments/faults-soak.toml");

    #[test]
    fn shipped_files_parse_into_their_runs() {
        let q = FaultsSpec::parse(QUICK, "faults-quick", &Overrides::default()).unwrap();
        assert_eq!(q.seeds.values().len(), 3);
        assert_eq!(q.configurations().len(), 1);
        let s = FaultsSpec::parse(SOAK, "faults-soak", &Overrides::default()).unwrap();
        let c = s.configurations();
        assert_eq!(c.len(), 8, "{c:?}");
        assert!(c.iter().any(|c| c.topology == "etcd" && c.replicas == 2));
        assert!(c.iter().any(|c| c.client == "proxy"));
        assert!(is_faults(QUICK) && !is_faults("kind = \"scaling\""));
    }

    #[test]
    fn overrides_shrink_a_faults_experiment() {
        let o = Overrides {
            repetitions: Some(1),
            duration: Some(3.0),
            set: vec!["keys=20".into(), "topology=etcd".into()],
            ..Overrides::default()
        };
        let s = FaultsSpec::parse(QUICK, "q", &o).unwrap();
        assert_eq!(s.seeds.values(), vec![1]);
        assert_eq!(s.duration, 3.0);
        assert_eq!(s.keys, 20);
        assert_eq!(s.configurations()[0].topology, "etcd");
        let bad = |o: Overrides| FaultsSpec::parse(QUICK, "q", &o).unwrap_err().to_string();
        assert!(bad(Overrides {
            warmup: Some(1.0),
            ..Overrides::default()
        })
        .contains("no warm-up"));
        assert!(bad(Overrides {
            repetitions: Some(9),
            ..Overrides::default()
        })
        .contains("seeds"));
        let e = format!(
            "{:#}",
            FaultsSpec::parse(
                QUICK,
                "q",
                &Overrides {
                    set: vec!["colour=red".into()],
                    ..Overrides::default()
                }
            )
            .unwrap_err()
        );
        assert!(e.contains("colour"), "{e}");
        // etcd-kill without etcd is refused, for the configuration that lacks it.
        let text = "kind = \"faults\"\ntopology = [\"file\", \"etcd\"]\nfaults = [\"etcd-kill\"]";
        let e = format!(
            "{:#}",
            FaultsSpec::parse(text, "x", &Overrides::default()).unwrap_err()
        );
        assert!(e.contains("file, 1 copy"), "{e}");
    }

    fn op(client: u32, kind: OpKind, value: &str, ms: (u64, u64), outcome: Outcome) -> Op {
        Op {
            client,
            key: "fk:1".into(),
            kind,
            value: (!value.is_empty()).then(|| value.to_string()),
            invoke_ns: ms.0 * 1_000_000,
            complete_ns: ms.1 * 1_000_000,
            outcome,
            final_read: false,
            error: None,
        }
    }

    #[test]
    fn a_timeline_counts_outcomes_marks_actions_and_anomalies() {
        let mut fin = op(0, OpKind::Read, "", (3000, 3010), Outcome::Ok);
        fin.final_read = true;
        let h = History {
            ops: vec![
                op(0, OpKind::Write, "c0-1", (100, 200), Outcome::Ok),
                op(1, OpKind::Write, "c1-1", (600, 700), Outcome::Unknown),
                op(1, OpKind::Read, "", (800, 900), Outcome::Failed),
                fin,
            ],
            nemesis: vec![
                NemesisEvent {
                    start_ns: 500_000_000,
                    end_ns: 1_500_000_000,
                    what: "pause".into(),
                    target: "127.0.0.1:7102".into(),
                    ok: true,
                    detail: None,
                },
                NemesisEvent {
                    start_ns: 600_000_000,
                    end_ns: 600_000_000,
                    what: "add".into(),
                    target: String::new(),
                    ok: false,
                    detail: Some(format!("{}no node", kvlab_faults::nemesis::SKIPPED)),
                },
            ],
        };
        let report = kvlab_faults::check(&h.ops);
        assert_eq!(report.lost_writes, 1);
        let p = timeline("t", &h, &report.anomalies, 0.5);
        assert!(p.problems().is_empty(), "{:?}", p.problems());
        let sum = |name: &str| -> f64 {
            p.series
                .iter()
                .find(|s| s.name == name)
                .map_or(0.0, |s| s.points.iter().map(|p| p.y).sum())
        };
        assert_eq!(
            (sum("ok"), sum("failed"), sum("unknown"), sum("final reads")),
            (1.0, 1.0, 1.0, 1.0)
        );
        let labels: Vec<&str> = p.marks.iter().map(|m| m.label.as_str()).collect();
        assert_eq!(
            labels,
            ["pause :7102", "LOST WRITE fk:1"],
            "skipped: no mark"
        );
        // The lost write is placed where it was acknowledged.
        assert!((p.marks[1].x - 0.2).abs() < 1e-9);
        let y2 = p.y2.expect("anomalies on the right axis");
        assert_eq!(y2.series[0].points.iter().map(|p| p.y).sum::<f64>(), 1.0);
    }
}
