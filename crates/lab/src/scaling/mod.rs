//! Scaling events: a kvlab cluster under a verified load while nodes are added, removed
//! or killed on a timed schedule, and the report of what each event cost.
//!
//! ```text
//! kind = "scaling" experiment ─► (placed: connect the hosts, ship kvlab, check etcd on its
//!   host) ─► start etcd (topology = "etcd": here, or on etcd_host) ─► create the cluster,
//!   start its N nodes at once, here or on node_hosts (crate::nodes; logs in logs/) ─► wait
//!   until each serves the ring ─► with copies,
//!   open every node's copy streams (one write per owner and holder) ─► fill the key space
//!   ─► one verified run through the cluster's ring (kvlab_bench, BenchConfig::cluster) while an
//!   event thread adds (a node it starts), removes or kills nodes at their times
//!   (kvlab_cluster::coordinator) ─► scaling.json
//!   ─► every node, etcd and the hosts' processes stopped (also on an error)
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
//! topology = "file"           # file | etcd (Debian's etcd, started for the run); with
//!                             # node_hosts or etcd_host the default is etcd, and "file"
//!                             # is refused there with an add or a remove
//! node_hosts = []             # node i on node_hosts[i % len] (the added ones too),
//!                             # listening on its host's address; [] = here
//! etcd_host = ""              # etcd's host (listening on its address); none with
//!                             # node_hosts: here, at a `local = true` host's `address`
//! [[host]]                    # the hosts (name, ssh, local, dir, address) and [ssh], as
//! [ssh]                       # in lab experiments (docs/lab.md, Hosts); `--hosts FILE`
//!                             # replaces them. The verified load and the coordinator run
//!                             # in the lab's process and reach the nodes' addresses
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
//! action = "add"              # add (starts a node) | remove | kill (kill -9; on a host,
//!                             # through the placement: SIGKILL to the process there)
//! node = 0                    # remove, kill: which of the nodes in the ring (sorted), 0..
//! ```

use std::path::{Path, PathBuf};

use crate::nodes::etcd::EtcdAt;
use crate::placement::{HostMeta, PlacedProcess};
use crate::spec::{HostFile, HostTable, SshSpec};
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
    /// `file` or `etcd`; default `etcd` when a role is placed on a host, else `file`.
    #[serde(default)]
    pub topology: Option<String>,
    /// Node i on `node_hosts[i % len]` (none: here).
    #[serde(default)]
    pub node_hosts: Vec<String>,
    /// The host etcd runs on (none: here — with nodes on hosts, at a `local = true` host's
    /// `address`).
    #[serde(default)]
    pub etcd_host: Option<String>,
    /// The hosts.
    #[serde(default, rename = "host")]
    pub(crate) hosts: Vec<HostFile>,
    /// How ssh reaches them.
    #[serde(default)]
    pub ssh: Option<SshSpec>,
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
        match s.topology.as_deref() {
            None | Some("file" | "etcd") => {}
            Some(t) => bail!("topology = {t:?}: file or etcd"),
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
        s.placed()?;
        Ok(s)
    }

    /// Whether some role is placed on a host.
    pub fn on_hosts(&self) -> bool {
        !self.node_hosts.is_empty() || self.etcd_host.is_some()
    }

    /// Whether the topology lives in etcd (`topology`, or its default: on hosts).
    pub fn uses_etcd(&self) -> bool {
        match self.topology.as_deref() {
            Some(t) => t == "etcd",
            None => self.on_hosts(),
        }
    }

    /// Where etcd runs, the table's hosts resolved: none with a topology file — refused
    /// with nodes on hosts and an add or a remove, as nodes on several hosts cannot share
    /// one file while the ring changes; else as [`crate::nodes::etcd::etcd_at`] says.
    pub(crate) fn etcd_place(&self) -> anyhow::Result<EtcdAt> {
        let (hosts, _, _) = crate::spec::resolve_hosts(self.hosts.clone(), self.ssh.clone(), None)?;
        self.etcd_at(&hosts)
    }

    fn etcd_at(&self, hosts: &[kvlab_hosts::Host]) -> anyhow::Result<EtcdAt> {
        if !self.uses_etcd() {
            if self.etcd_host.is_some() {
                bail!(
                    "etcd_host with topology = \"file\": etcd runs with topology = \"etcd\" \
                     (or leave topology out)"
                );
            }
            let changes = self
                .event
                .iter()
                .any(|e| matches!(e.action, Action::Add | Action::Remove));
            if !self.node_hosts.is_empty() && changes {
                bail!(
                    "topology = \"file\" with node_hosts and an add or a remove: nodes on \
                     several hosts cannot share one topology file while the ring changes (each \
                     reads a copy of it) — set topology = \"etcd\" (the default there)"
                );
            }
            return Ok(EtcdAt::None);
        }
        crate::nodes::etcd::etcd_at(self.etcd_host.as_deref(), &self.node_hosts, hosts)
    }

    /// The hosts the roles name, resolved, and how ssh reaches them; checks the roles
    /// against the table.
    pub(crate) fn placed(&self) -> anyhow::Result<(Vec<kvlab_hosts::Host>, SshSpec)> {
        let (hosts, pools, ssh) =
            crate::spec::resolve_hosts(self.hosts.clone(), self.ssh.clone(), None)?;
        for h in &self.node_hosts {
            crate::spec::check_defined(&hosts, "node_hosts", h)?;
        }
        if !pools.is_empty() && self.on_hosts() {
            bail!("[[host]] pool: agent pools load lab experiments; a scaling experiment's nodes run on ssh or local hosts");
        }
        let mut used = self.node_hosts.clone();
        if let EtcdAt::Host(h) = self.etcd_at(&hosts)? {
            used.push(h);
        }
        let hosts = hosts
            .into_iter()
            .filter(|h| used.contains(&h.name))
            .collect();
        Ok((hosts, ssh))
    }

    /// Takes `--hosts FILE`'s table in place of its own.
    pub fn use_hosts(&mut self, table: &HostTable) -> anyhow::Result<()> {
        let (hosts, ssh) = table.parse()?;
        (self.hosts, self.ssh) = (hosts, ssh);
        self.placed().map(|_| ())
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
    /// Its host, when placed on one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Its process there (host, pid, network namespace), when placed on a host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placed: Option<PlacedProcess>,
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
    /// Copies of every key (`replicas`): the store's items are this many per key, while a
    /// migration counts each key it moves once.
    #[serde(default = "one_copy")]
    pub replicas: u32,
    /// What the load generator noted (connection problems, its self-checks).
    #[serde(default)]
    pub notes: Vec<String>,
    /// Where the topology lived: `file`, `etcd ADDR, here` or `etcd ADDR on host H`.
    #[serde(default)]
    pub topology: String,
    /// Placed on hosts: etcd's process there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<PlacedProcess>,
    /// Placed on hosts: where each node ran (those at the start, then the added).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placed: Vec<PlacedProcess>,
    /// The hosts, when roles were placed on them (name, how reached, address, clocks).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<HostMeta>,
}

/// Re-renders a scaling results directory's report from its `scaling.json`.
pub fn analyse_dir(dir: &Path) -> anyhow::Result<(String, PathBuf)> {
    let text = std::fs::read(dir.join("scaling.json")).context("scaling.json")?;
    let res: ScalingResult = serde_json::from_slice(&text)?;
    write(dir, &res)
}

fn one_copy() -> u32 {
    1
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOSTS: &str = "[[host]]\nname = \"s1\"\nssh = \"root@10.0.0.11\"\n\
                         [[host]]\nname = \"s2\"\nssh = \"root@10.0.0.12\"\n";

    fn spec(body: &str) -> anyhow::Result<ScalingSpec> {
        ScalingSpec::parse(
            &format!("kind = \"scaling\"\nnodes = 2\n{body}\n{HOSTS}"),
            "t",
        )
    }

    #[test]
    fn nodes_on_hosts_change_the_ring_only_over_etcd_that_the_hosts_reach() {
        let shipped =
            ScalingSpec::parse(crate::shipped("cluster-scaling-hosts").unwrap(), "s").unwrap();
        assert!(shipped.on_hosts() && shipped.uses_etcd());
        assert_eq!(shipped.etcd_place().unwrap(), EtcdAt::Host("s3".into()));
        assert_eq!(shipped.placed().unwrap().0.len(), 3, "s1, s2 and etcd's s3");
        let local = ScalingSpec::parse(crate::shipped("cluster-scaling").unwrap(), "s").unwrap();
        assert!(!local.on_hosts() && !local.uses_etcd());
        assert_eq!(local.etcd_place().unwrap(), EtcdAt::None);
        // etcd on a host of the table, or here at a local host's address.
        let s = spec("node_hosts = [\"s1\", \"s2\"]\netcd_host = \"s2\"").unwrap();
        assert_eq!(s.etcd_place().unwrap(), EtcdAt::Host("s2".into()));
        let s = spec(
            "node_hosts = [\"s1\"]\n[[host]]\nname = \"lab\"\nlocal = true\naddress = \"10.0.0.1\"",
        )
        .unwrap();
        assert!(s.uses_etcd());
        assert_eq!(s.etcd_place().unwrap(), EtcdAt::Host("lab".into()));
        // A file is fine on hosts while the ring does not change.
        let s = spec("node_hosts = [\"s1\"]\ntopology = \"file\"").unwrap();
        assert_eq!(s.etcd_place().unwrap(), EtcdAt::None);
        let add = "[[event]]\nat = 1.0\naction = \"add\"";
        for (body, says) in [
            (
                format!("node_hosts = [\"s1\"]\ntopology = \"file\"\n{add}"),
                "cannot share one topology file",
            ),
            (
                "node_hosts = [\"s9\"]".to_string(),
                "host \"s9\" is not defined",
            ),
            (
                format!("node_hosts = [\"s1\"]\n{add}"),
                "add a [[host]] with local = true",
            ),
            (
                "etcd_host = \"s1\"\ntopology = \"file\"".to_string(),
                "etcd_host with topology = \"file\"",
            ),
        ] {
            let e = format!("{:#}", spec(&body).unwrap_err());
            assert!(e.contains(says), "{body}: {e}");
        }
    }
}
