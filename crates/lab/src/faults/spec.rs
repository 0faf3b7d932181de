//! A faults experiment as written: its keys and their defaults, the checks, the
//! configurations it makes (topology × replicas × client) and the harness's settings for
//! each run.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use kvlab_faults::clients::Workload;
use kvlab_faults::{Capabilities, ClientKind, Durable, Mix, RunConfig, TopologyKind};
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
fn d_cache_items() -> usize {
    Durable::CACHE_ITEMS
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
    /// Durable nodes: a data directory each, `--durability sync`, kept across `kill -9`.
    #[serde(default)]
    pub durable: bool,
    /// With `durable`: the entries each node's write-back cache holds.
    #[serde(default = "d_cache_items")]
    pub cache_items: usize,
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
            if c.client == "pool" && self.durable {
                bail!("durable = true runs a cluster's nodes: not with client = \"pool\"");
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
            durable: self.durable && Durable::syncs(&self.node_args),
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
            write_policy: kvlab_faults::runner::CopyWritePolicy::All,
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
            durable: self.durable.then_some(Durable {
                cache_items: self.cache_items,
            }),
            interrupt: Arc::clone(interrupt),
        })
    }
}
