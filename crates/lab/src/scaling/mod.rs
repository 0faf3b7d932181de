//! Scaling events: a kvlab cluster under a verified load while nodes are added, removed
//! or killed on a timed schedule, and the report of what each event cost.
//!
//! ```text
//! kind = "scaling" experiment ─► start etcd (topology = "etcd"), create the cluster, start
//!   its N nodes at once (logs in logs/) ─► wait until each serves the ring ─► with copies,
//!   open every node's copy streams (one write per owner and holder) ─► fill the key space
//!   ─► one verified run through the cluster's ring (kvlab_bench, BenchConfig::cluster) while an
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

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use kvlab_bench::load::Options;
use kvlab_cluster::coordinator::MigrationReport;
use serde::{Deserialize, Serialize};

mod report;
pub(crate) mod run;

use report::write;
pub use run::run;

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

/// Re-renders a scaling results directory's report from its `scaling.json`.
pub fn analyse_dir(dir: &Path) -> anyhow::Result<(String, PathBuf)> {
    let text = std::fs::read(dir.join("scaling.json")).context("scaling.json")?;
    let res: ScalingResult = serde_json::from_slice(&text)?;
    write(dir, &res)
}
