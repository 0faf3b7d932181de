//! The storage ring evaluated: kvlab cluster nodes as bounded caches (FIFO, LRU or LFU,
//! sized in entries) in front of their own durable stores, loaded with real documents
//! (e-mails), measured as a storage service is: throughput against servers × clients,
//! against cache size × policy, and the time to scale up and down by one server — with a
//! published evaluation's figures beside kvlab's.
//!
//! ```text
//! kind = "storage-ring" ─► the messages: `data` (maildir, JSON lines, CSV), or a synthetic
//!   maildir written into the results ─► [scale]: N durable nodes, every message written,
//!   one node added, one removed (each migration timed, keys moved against the ring's own
//!   expectation), every message read back byte for byte after each
//!   ─► [throughput]: for each server count, a ring of durable nodes holding every message;
//!   for each client count, PUT then GET the original's way (each client thread sends
//!   `ops_per_client` requests of random messages one at a time; ops/s per client,
//!   averaged; `repetitions` times) and kvlab bench's (closed loop, percentiles), each
//!   process's CPU read around the measured time ─► [cache]: one node for each cache size ×
//!   policy, GETs the original's way, hit ratio from the node's `stats` ─► ring.json
//!   ─► report: the original's figures beside kvlab's, then a table per part
//! ```
//!
//! With `netns = true` every node runs in a network namespace of its own
//! (`scripts/cluster-netns.sh`, as the fault harness uses it: needs root), so the clients —
//! threads of this process in the root namespace — reach them across a bridge.
//!
//! Placed on hosts (`node_hosts`, `client_hosts`, `etcd_host`, the `[[host]]` table and
//! `[ssh]` as in lab experiments, through [`crate::placement`]): every part's nodes start on
//! their hosts (node i on `node_hosts[i % len]`; the cache part's on the first), and the
//! clients of the throughput and cache parts run there as `kvlab lab ring-clients`
//! ([`clients`]), split over the client hosts, started together at an instant set on each
//! host's clock; each host's CPU is read around every measured run. A ring that does not
//! change may keep its topology in a file (a copy in each node host's run directory); the
//! scale part's, which migrates, lives in etcd (`crate::nodes::etcd`, the nodes' module
//! shared with the scaling kind: on `etcd_host`, or here at the address the hosts reach
//! this machine at), which its nodes on every host and the lab's coordinator share — its added node starts on the next node host in turn, its removed
//! one is stopped there once the migration is done. With `memcached = true`, memcached
//! servers — as many as the ring's nodes, on the same hosts — behind a fixed client ring
//! of them (the same consistent hashing) are the second system of the throughput part,
//! loaded by the same clients the same way.
//!
//! The file (every key optional; defaults after `=`):
//!
//! ```toml
//! kind = "storage-ring"       # *required*
//! name = "<file stem>"
//! description = ""
//! data = ""                   # messages: a maildir (e.g. Enron's), JSON lines or CSV; empty:
//!                             # a synthetic maildir of `messages` e-mails in the results
//! messages = 10000            # records used: the data set's first `messages`
//! netns = false               # each node in its own network namespace (root)
//! node_args = ["-t", "1", "-m", "256", "--cache-items", "1000", "--eviction", "lru"]
//!                             # every node's `kvlab server` flags; the lab adds --data-dir
//! seed = 1                    # the clients' random choice of messages
//! memcached = false           # [throughput] also against memcached behind the client ring
//! memcached_args = ["-t", "1", "-m", "256"]  # every memcached's flags (the lab adds -l -p)
//! node_hosts = []             # every part's nodes (and memcached): node i on
//!                             # node_hosts[i % len], the scale part's added one too, the
//!                             # cache part's on the first; [] here (loopback or netns)
//! client_hosts = []           # the throughput and cache parts' clients: split over
//!                             # these hosts, a `kvlab lab ring-clients` on each; []
//!                             # threads of the lab's process
//! topology = "file"           # where each ring's topology lives: "file" (one each) or
//!                             # "etcd" (a cluster each in one etcd); the default is "etcd"
//!                             # with etcd_host, or with node_hosts and [scale] nodes > 0
//!                             # (nodes on several hosts share no file), where "file" is
//!                             # refused; "etcd" with netns = true is refused
//! etcd_host = ""              # the host etcd runs on, listening on its address (etcd
//!                             # must be installed there); none: here — on 127.0.0.1 when
//!                             # every node is here, else at the first `local = true`
//!                             # host's `address` (where the node hosts reach this machine;
//!                             # without one, an error says so)
//! [[host]]                    # the hosts (name, ssh, local, dir, clock, address) and
//! [ssh]                       # how ssh reaches them, as in lab experiments
//!
//! [original]                  # the original evaluation's figures, shown beside kvlab's; only
//! scale_down_s = 15.6         # those given are compared (none: no comparison)
//! scale_up_s = 17.8
//! get_ops_per_client = 756.0  # GET ops/s per client, 2 servers, 5 clients
//!
//! [scale]
//! nodes = 5                   # 0 skips the part
//! [throughput]
//! servers = [2, 8, 16]        # [] skips the part
//! clients = [5, 12]
//! ops_per_client = 1000
//! repetitions = 3
//! bench_duration = 3.0        # kvlab bench's closed loop, seconds per point (0: not run)
//! [cache]
//! sizes = [100, 1000, 5000]   # entries; [] skips the part
//! policies = ["fifo", "lru", "lfu"]
//! clients = 5
//! ops_per_client = 1000
//! repetitions = 3
//! ```

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use crate::nodes::etcd::EtcdAt;
use crate::placement::{HostCpu, PlacedProcess};
use crate::spec::{HostFile, HostTable, SshSpec};

pub mod clients;
mod parts;
mod report;

pub use clients::{digest, run_job, ClientsJob, ClientsOutcome, Route};
pub use parts::run;

fn d_messages() -> usize {
    10_000
}
fn d_node_args() -> Vec<String> {
    [
        "-t",
        "1",
        "-m",
        "256",
        "--cache-items",
        "1000",
        "--eviction",
        "lru",
    ]
    .map(String::from)
    .to_vec()
}
fn d_seed() -> u64 {
    1
}
fn d_memcached_args() -> Vec<String> {
    ["-t", "1", "-m", "256"].map(String::from).to_vec()
}
fn d_five() -> usize {
    5
}
fn d_servers() -> Vec<usize> {
    vec![2, 8, 16]
}
fn d_clients() -> Vec<usize> {
    vec![5, 12]
}
fn d_ops() -> usize {
    1000
}
fn d_reps() -> usize {
    3
}
fn d_bench_duration() -> f64 {
    3.0
}
fn d_sizes() -> Vec<usize> {
    vec![100, 1000, 5000]
}
fn d_policies() -> Vec<String> {
    ["fifo", "lru", "lfu"].map(String::from).to_vec()
}

/// The original evaluation's figures (constants of the experiment file).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Original {
    /// Seconds to scale down by one server.
    pub scale_down_s: Option<f64>,
    /// Seconds to scale up by one server.
    pub scale_up_s: Option<f64>,
    /// GET ops/s per client with 2 servers and 5 clients.
    pub get_ops_per_client: Option<f64>,
}

/// The scale part.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScalePart {
    /// Nodes before the add (0: skip).
    #[serde(default = "d_five")]
    pub nodes: usize,
}

impl Default for ScalePart {
    fn default() -> Self {
        ScalePart { nodes: d_five() }
    }
}

/// The throughput part.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThroughputPart {
    /// Server counts ([]: skip).
    #[serde(default = "d_servers")]
    pub servers: Vec<usize>,
    /// Client counts.
    #[serde(default = "d_clients")]
    pub clients: Vec<usize>,
    /// Requests each client sends, one at a time.
    #[serde(default = "d_ops")]
    pub ops_per_client: usize,
    /// Repetitions of each point.
    #[serde(default = "d_reps")]
    pub repetitions: usize,
    /// kvlab bench's closed loop: seconds per point (0: not run).
    #[serde(default = "d_bench_duration")]
    pub bench_duration: f64,
}

impl Default for ThroughputPart {
    fn default() -> Self {
        ThroughputPart {
            servers: d_servers(),
            clients: d_clients(),
            ops_per_client: d_ops(),
            repetitions: d_reps(),
            bench_duration: d_bench_duration(),
        }
    }
}

/// The cache part.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CachePart {
    /// Cache sizes, entries ([]: skip).
    #[serde(default = "d_sizes")]
    pub sizes: Vec<usize>,
    /// Displacement strategies (`--eviction`).
    #[serde(default = "d_policies")]
    pub policies: Vec<String>,
    /// Clients.
    #[serde(default = "d_five")]
    pub clients: usize,
    /// GETs each client sends, one at a time.
    #[serde(default = "d_ops")]
    pub ops_per_client: usize,
    /// Repetitions of each point.
    #[serde(default = "d_reps")]
    pub repetitions: usize,
}

impl Default for CachePart {
    fn default() -> Self {
        CachePart {
            sizes: d_sizes(),
            policies: d_policies(),
            clients: d_five(),
            ops_per_client: d_ops(),
            repetitions: d_reps(),
        }
    }
}

/// A storage-ring experiment (see the module docs).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RingSpec {
    /// Must be `"storage-ring"`.
    pub kind: String,
    /// Names the results directory.
    #[serde(default)]
    pub name: String,
    /// Shown in the report.
    #[serde(default)]
    pub description: String,
    /// The messages' data set (none: a synthetic maildir).
    #[serde(default)]
    pub data: Option<PathBuf>,
    /// Records used.
    #[serde(default = "d_messages")]
    pub messages: usize,
    /// Each node in its own network namespace.
    #[serde(default)]
    pub netns: bool,
    /// Every node's flags (the lab adds `--data-dir`).
    #[serde(default = "d_node_args")]
    pub node_args: Vec<String>,
    /// The clients' random choice of messages.
    #[serde(default = "d_seed")]
    pub seed: u64,
    /// The throughput part also against memcached behind the same client ring.
    #[serde(default)]
    pub memcached: bool,
    /// Every memcached's flags (the lab adds `-l` and `-p`, and `-u root` as root).
    #[serde(default = "d_memcached_args")]
    pub memcached_args: Vec<String>,
    /// Every part's nodes: node i on `node_hosts[i % len]` (none: here).
    #[serde(default)]
    pub node_hosts: Vec<String>,
    /// The throughput and cache parts' clients, split over these hosts (none: threads of the
    /// lab's process).
    #[serde(default)]
    pub client_hosts: Vec<String>,
    /// Where the rings' topologies live: `file` (one per ring) or `etcd` (one etcd, a
    /// cluster per ring); default `etcd` when `etcd_host` is set or the scale part runs on
    /// `node_hosts`, else `file`.
    #[serde(default)]
    pub topology: Option<String>,
    /// The host etcd runs on (none: here — at the address the node hosts reach this
    /// machine at, a `local = true` host's `address`, when nodes are on hosts).
    #[serde(default)]
    pub etcd_host: Option<String>,
    /// The hosts.
    #[serde(default, rename = "host")]
    pub(crate) hosts: Vec<HostFile>,
    /// How ssh reaches them.
    #[serde(default)]
    pub ssh: Option<SshSpec>,
    /// The original's figures.
    #[serde(default)]
    pub original: Original,
    /// Scale up and down.
    #[serde(default)]
    pub scale: ScalePart,
    /// Throughput against servers × clients.
    #[serde(default)]
    pub throughput: ThroughputPart,
    /// Throughput and hit ratio against cache size × policy.
    #[serde(default)]
    pub cache: CachePart,
}

/// Whether `text` is a storage-ring experiment (top-level `kind = "storage-ring"`).
pub fn is_ring(text: &str) -> bool {
    toml::from_str::<toml::Table>(text)
        .ok()
        .and_then(|t| t.get("kind").and_then(|k| k.as_str().map(|k| k == KIND)))
        .unwrap_or(false)
}

const KIND: &str = "storage-ring";

impl RingSpec {
    /// Reads and checks a storage-ring experiment file.
    pub fn parse(text: &str, stem: &str) -> anyhow::Result<RingSpec> {
        let mut s: RingSpec = toml::from_str(text).context("storage-ring experiment")?;
        if s.kind != KIND {
            bail!(
                "kind = {:?}: this experiment says kind = \"{KIND}\"",
                s.kind
            );
        }
        if s.name.is_empty() {
            s.name = stem.to_string();
        }
        if s.messages == 0 {
            bail!("messages = 0: at least one");
        }
        if s.data.as_ref().is_some_and(|d| d.as_os_str().is_empty()) {
            s.data = None;
        }
        let t = &s.throughput;
        if !t.servers.is_empty()
            && (t.clients.is_empty()
                || t.clients.contains(&0)
                || t.servers.contains(&0)
                || t.ops_per_client == 0
                || t.repetitions == 0)
        {
            bail!("[throughput]: servers, clients, ops_per_client and repetitions must be > 0");
        }
        if !(t.bench_duration >= 0.0 && t.bench_duration.is_finite()) {
            bail!("[throughput] bench_duration = {}: >= 0", t.bench_duration);
        }
        let c = &s.cache;
        if !c.sizes.is_empty() {
            if c.sizes.contains(&0) || c.clients == 0 || c.ops_per_client == 0 || c.repetitions == 0
            {
                bail!("[cache]: sizes, clients, ops_per_client and repetitions must be > 0");
            }
            for p in &c.policies {
                if !["fifo", "lru", "lfu"].contains(&p.as_str()) {
                    bail!("[cache] policies: {p:?} is not fifo, lru or lfu");
                }
            }
        }
        if s.node_args.iter().any(|a| a.starts_with("--data-dir")) {
            bail!("node_args: the lab gives each node its --data-dir");
        }
        if s.memcached_args.iter().any(|a| {
            ["-l", "-p", "--listen", "--port"].contains(&a.as_str())
                || a.starts_with("--listen=")
                || a.starts_with("--port=")
        }) {
            bail!("memcached_args: the lab gives each memcached its -l and -p");
        }
        s.placed()?;
        Ok(s)
    }

    /// Whether some role is placed on a host.
    pub fn on_hosts(&self) -> bool {
        !self.node_hosts.is_empty() || !self.client_hosts.is_empty() || self.etcd_host.is_some()
    }

    /// Whether the rings' topologies live in etcd (`topology`, or its default: with
    /// `etcd_host`, or with the scale part's nodes on hosts).
    pub fn uses_etcd(&self) -> bool {
        match self.topology.as_deref() {
            Some(t) => t == "etcd",
            None => {
                self.etcd_host.is_some() || (!self.node_hosts.is_empty() && self.scale.nodes > 0)
            }
        }
    }

    /// Where etcd runs, the table's hosts resolved (see [`RingSpec::etcd_at`]).
    pub(crate) fn etcd_place(&self) -> anyhow::Result<EtcdAt> {
        let (hosts, _, _) = crate::spec::resolve_hosts(self.hosts.clone(), self.ssh.clone(), None)?;
        self.etcd_at(&hosts)
    }

    /// Where etcd runs, if it does: `etcd_host`; else, with nodes on hosts, the table's
    /// first `local = true` host with an address other than loopback (where the node hosts
    /// reach this machine); else here on 127.0.0.1. Refused: a migrating ring on hosts
    /// over a topology file, etcd with `netns = true`, and an etcd the node hosts could not
    /// reach (on loopback while a node runs on another machine).
    pub(crate) fn etcd_at(&self, hosts: &[kvlab_hosts::Host]) -> anyhow::Result<EtcdAt> {
        match self.topology.as_deref() {
            None | Some("file" | "etcd") => {}
            Some(t) => bail!("topology = {t:?}: \"file\" or \"etcd\""),
        }
        if !self.uses_etcd() {
            if self.etcd_host.is_some() {
                bail!(
                    "etcd_host with topology = \"file\": etcd runs with topology = \"etcd\" \
                     (or leave topology out)"
                );
            }
            if !self.node_hosts.is_empty() && self.scale.nodes > 0 {
                bail!(
                    "topology = \"file\" with node_hosts and [scale]: nodes on several hosts \
                     cannot share one topology file while the ring migrates — set topology = \
                     \"etcd\" (the default there), or [scale] nodes = 0"
                );
            }
            return Ok(EtcdAt::None);
        }
        if self.netns {
            bail!(
                "topology = \"etcd\" and netns = true: nodes in namespaces of their own do not \
                 reach an etcd on 127.0.0.1 (netns = false, or nodes on hosts with node_hosts)"
            );
        }
        crate::nodes::etcd::etcd_at(self.etcd_host.as_deref(), &self.node_hosts, hosts)
    }

    /// The hosts the roles name, resolved, and how ssh reaches them; checks the roles
    /// against the table and what a placed experiment runs.
    pub(crate) fn placed(&self) -> anyhow::Result<(Vec<kvlab_hosts::Host>, SshSpec)> {
        let (hosts, pools, ssh) =
            crate::spec::resolve_hosts(self.hosts.clone(), self.ssh.clone(), None)?;
        for (role, names) in [
            ("node_hosts", &self.node_hosts),
            ("client_hosts", &self.client_hosts),
        ] {
            for h in names {
                crate::spec::check_defined(&hosts, role, h)?;
            }
        }
        if !pools.is_empty() && self.on_hosts() {
            bail!("[[host]] pool: agent pools load lab experiments; the ring's clients run on ssh or local hosts");
        }
        if self.on_hosts() {
            if self.netns {
                bail!("netns = true and hosts: the hosts place the nodes (set netns = false)");
            }
            if !self.client_hosts.is_empty() && self.throughput.bench_duration > 0.0 {
                bail!(
                    "[throughput] bench_duration: kvlab bench's closed loop runs in the lab's \
                     process, not on the client hosts: set it to 0 with client_hosts"
                );
            }
        }
        let mut used = self.node_hosts.clone();
        used.extend(self.client_hosts.iter().cloned());
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
}

/// One scaling event.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ScaleEvent {
    /// `add` or `remove`.
    pub action: String,
    /// The node.
    pub node: String,
    /// Its host, when placed on one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Nodes in the ring before it.
    pub nodes_before: usize,
    /// Seconds the migration took (the coordinator's add or remove, start to end).
    pub seconds: f64,
    /// Seconds to start the added node (not part of `seconds`).
    pub start_s: f64,
    /// The coordinator's figures.
    pub migration: Option<kvlab_cluster::coordinator::MigrationReport>,
    /// Messages whose owner the ring change moves (computed from the two rings).
    pub expected_keys: u64,
    /// Messages in the ring.
    pub keys: u64,
    /// Messages read back after it: missing, wrong bytes, and requests that failed.
    pub read_back: ReadBack,
    /// Why it failed, if it did.
    pub error: Option<String>,
}

/// A read-back of every message.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct ReadBack {
    /// Messages read.
    pub read: u64,
    /// Absent.
    pub missing: u64,
    /// Present with other bytes.
    pub wrong: u64,
    /// Requests that failed (errors, timeouts).
    pub errors: u64,
    /// Seconds the read-back took.
    pub seconds: f64,
}

impl ReadBack {
    /// Acknowledged writes lost: missing or wrong.
    pub fn lost(&self) -> u64 {
        self.missing + self.wrong
    }
}

/// The scale part's outcome.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ScaleResult {
    /// Nodes at the start.
    pub nodes: usize,
    /// Messages written before the events.
    pub keys: u64,
    /// Seconds the writes took, and writes that failed.
    pub fill_s: f64,
    /// See `fill_s`.
    pub fill_errors: u64,
    /// The add, then the remove.
    pub events: Vec<ScaleEvent>,
    /// Placed on hosts: where each of its nodes ran (those at the start, then the added).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placed: Vec<PlacedProcess>,
}

/// CPU used over a measured time, cores (CPU seconds per second).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Cpu {
    /// The client (this process: its threads send the requests).
    pub client: f64,
    /// All nodes together.
    pub nodes: f64,
    /// The busiest node.
    pub busiest_node: f64,
}

/// One measured point the original's way (one repetition).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MethodRun {
    /// Servers.
    pub servers: usize,
    /// Client threads.
    pub clients: usize,
    /// `put` or `get`.
    pub op: String,
    /// Repetition, 1..
    pub repetition: usize,
    /// Each client's ops/s (its requests over its own time).
    pub per_client: Vec<f64>,
    /// Requests answered by all clients over the wall time, per second.
    pub aggregate: f64,
    /// Failed requests, and GETs that missed or returned other bytes.
    pub errors: u64,
    /// CPU over the measured time.
    pub cpu: Cpu,
    /// Cache part: gets served from the cache, as a share of all gets (from `stats`).
    pub hit_ratio: Option<f64>,
    /// Cache part: entries and policy.
    pub cache: Option<(usize, String)>,
    /// The system: `kvlab` (the durable ring; also when absent) or `memcached`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub system: String,
    /// Placed on hosts: where each node and each client process ran.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placed: Vec<PlacedProcess>,
    /// Placed on hosts: each host's machine and the lab's processes on it over the run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<HostCpu>,
    /// Placed clients: the latest start after the instant set (s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub late_s: Option<f64>,
}

impl MethodRun {
    /// The system it measured (`kvlab` when not said).
    pub fn system(&self) -> &str {
        if self.system.is_empty() {
            "kvlab"
        } else {
            &self.system
        }
    }

    /// The mean over clients of their ops/s: the original's figure.
    pub fn mean_per_client(&self) -> f64 {
        self.per_client.iter().sum::<f64>() / self.per_client.len().max(1) as f64
    }
}

/// One kvlab bench point.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BenchPoint {
    /// Servers.
    pub servers: usize,
    /// Connections (one thread).
    pub clients: usize,
    /// `put` or `get`.
    pub op: String,
    /// Replies per second.
    pub qps: f64,
    /// Percentiles, µs.
    pub p50_us: f64,
    /// See `p50_us`.
    pub p99_us: f64,
    /// See `p50_us`.
    pub p999_us: f64,
    /// Errors, timeouts, verification failures and misses.
    pub errors: u64,
    /// CPU over the measured time.
    pub cpu: Cpu,
}

/// Everything a storage-ring run measured (`ring.json`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RingResult {
    /// The experiment as run.
    pub spec_text: String,
    /// Its name.
    pub name: String,
    /// The data set used and how many messages, their mean size.
    pub data: String,
    /// Messages used.
    pub messages: u64,
    /// Mean message size, bytes.
    pub mean_message_bytes: f64,
    /// Whether nodes ran in namespaces of their own.
    pub netns: bool,
    /// The hosts, when roles were placed on them (name, how reached, address, clocks).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<crate::placement::HostMeta>,
    /// Where the nodes and the clients ran (`node_hosts`, `client_hosts`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<(Vec<String>, Vec<String>)>,
    /// Where the rings' topologies lived: `file`, or `etcd ADDR` (and its host).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub topology: String,
    /// etcd, when placed on a host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<PlacedProcess>,
    /// CPUs of the machine.
    pub cpus: usize,
    /// The original's figures.
    pub original: Original,
    /// The scale part.
    pub scale: Option<ScaleResult>,
    /// The throughput part, the original's way.
    pub method: Vec<MethodRun>,
    /// The throughput part, kvlab bench's way.
    pub bench: Vec<BenchPoint>,
    /// The cache part.
    pub cache: Vec<MethodRun>,
    /// What the run noted.
    pub notes: Vec<String>,
}

/// Re-renders a storage-ring results directory's report from its `ring.json`.
pub fn analyse_dir(dir: &Path) -> anyhow::Result<(String, PathBuf)> {
    let text = std::fs::read(dir.join("ring.json")).context("ring.json")?;
    let res: RingResult = serde_json::from_slice(&text)?;
    report::write(dir, &res)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOSTS: &str = r#"
[[host]]
name = "c1"
ssh = "root@10.0.0.1"
[[host]]
name = "s1"
ssh = "root@10.0.0.2"
"#;

    fn placed(body: &str) -> anyhow::Result<RingSpec> {
        RingSpec::parse(&format!("kind = \"storage-ring\"\n{body}\n{HOSTS}"), "t")
    }

    const ONLY_THROUGHPUT: &str = "[scale]\nnodes = 0\n[cache]\nsizes = []\n\
                                   [throughput]\nbench_duration = 0.0\n";

    #[test]
    fn placed_roles_name_hosts_of_the_table_and_a_ring_that_migrates_on_hosts_is_in_etcd() {
        let ok = placed(&format!(
            "node_hosts = [\"s1\"]\nclient_hosts = [\"c1\"]\nmemcached = true\n{ONLY_THROUGHPUT}"
        ))
        .unwrap();
        assert!(ok.on_hosts());
        let (hosts, _) = ok.placed().unwrap();
        assert_eq!(hosts.len(), 2);
        // The shipped file without hosts: nothing placed.
        let local = RingSpec::parse(crate::shipped("storage-ring").unwrap(), "s").unwrap();
        assert!(!local.on_hosts() && !local.memcached);
        let shipped = RingSpec::parse(crate::shipped("storage-ring-hosts").unwrap(), "s").unwrap();
        assert!(shipped.on_hosts() && shipped.memcached);
        // The scale part on hosts: etcd, on etcd_host or here at a local host's address.
        let on = |body: &str| placed(&format!("node_hosts = [\"s1\"]\n{body}")).unwrap();
        let s = on("etcd_host = \"c1\"");
        assert!(s.uses_etcd());
        assert_eq!(s.etcd_place().unwrap(), EtcdAt::Host("c1".into()));
        assert_eq!(s.placed().unwrap().0.len(), 2, "s1 and etcd's c1");
        let s = on("[[host]]\nname = \"lab\"\nlocal = true\naddress = \"10.0.0.9\"");
        assert_eq!(s.etcd_place().unwrap(), EtcdAt::Host("lab".into()));
        let s = on("[scale]\nnodes = 0\n");
        assert!(!s.uses_etcd());
        assert_eq!(s.etcd_place().unwrap(), EtcdAt::None);
        let here = RingSpec::parse("kind = \"storage-ring\"\ntopology = \"etcd\"", "t").unwrap();
        assert_eq!(here.etcd_place().unwrap(), EtcdAt::Here);
        for (body, says) in [
            (
                format!("node_hosts = [\"s9\"]\n{ONLY_THROUGHPUT}"),
                "host \"s9\" is not defined",
            ),
            (
                format!("client_hosts = [\"c1\"]\nnetns = true\n{ONLY_THROUGHPUT}"),
                "netns = true and hosts",
            ),
            (
                "node_hosts = [\"s1\"]\n[throughput]\nbench_duration = 0.0\n".to_string(),
                "add a [[host]] with local = true",
            ),
            (
                "node_hosts = [\"s1\"]\ntopology = \"file\"\n".to_string(),
                "cannot share one topology file",
            ),
            (
                format!("etcd_host = \"s1\"\ntopology = \"file\"\n{ONLY_THROUGHPUT}"),
                "etcd_host with topology = \"file\"",
            ),
            (
                "netns = true\ntopology = \"etcd\"\n".to_string(),
                "netns = true",
            ),
            (
                "node_hosts = [\"s1\"]\netcd_host = \"here\"\n\
                 [[host]]\nname = \"here\"\nlocal = true\n"
                    .to_string(),
                "which node host \"s1\" cannot reach",
            ),
            (
                format!("topology = \"zk\"\n{ONLY_THROUGHPUT}"),
                "\"file\" or \"etcd\"",
            ),
            (
                "client_hosts = [\"c1\"]\n[scale]\nnodes = 0\n[cache]\nsizes = []\n".into(),
                "bench_duration",
            ),
            (
                format!("memcached_args = [\"-p\", \"1\"]\n{ONLY_THROUGHPUT}"),
                "memcached_args",
            ),
        ] {
            let e = format!("{:#}", placed(&body).unwrap_err());
            assert!(e.contains(says), "{body}: {e}");
        }
    }
}
