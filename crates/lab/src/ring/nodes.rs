//! A ring of durable kvlab nodes for one part of a storage-ring experiment: each node a
//! `kvlab server --cluster` process with its own `--data-dir`, on loopback or in a network
//! namespace of its own; started, added, removed, stopped, and its CPU read.

use std::ffi::OsStr;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use kvlab_cluster::coordinator::{self, MigrationReport};
use kvlab_cluster::{NodeCommand, TopologyStore};
use kvlab_etcd::open_store;
use kvlab_faults::netns::Net;
use kvlab_process::{free_ports, Output, Probe, Process, Spawn};

/// The port of a node in a namespace of its own (it has the address to itself).
const NETNS_PORT: u16 = 11211;

/// One node.
pub(super) struct Node {
    pub name: String,
    pub addr: SocketAddr,
    pub process: Process,
}

/// The nodes of one ring (stopped when dropped).
pub(super) struct Nodes {
    topology: String,
    store: Box<dyn TopologyStore>,
    pub nodes: Vec<Node>,
    args: Vec<String>,
    bin: PathBuf,
    dir: PathBuf,
    net: Option<Arc<Net>>,
}

impl Nodes {
    /// Creates a ring of `n` nodes under `dir` (topology, logs, data) and starts them;
    /// returns once each serves the ring.
    pub fn start(
        n: usize,
        args: &[String],
        bin: &Path,
        dir: &Path,
        net: Option<Arc<Net>>,
    ) -> anyhow::Result<Nodes> {
        std::fs::create_dir_all(dir.join("logs"))
            .with_context(|| format!("creating {}", dir.display()))?;
        let topology = dir.join("topology.json").display().to_string();
        let store = open_store(&topology)?;
        let mut nodes = Nodes {
            topology,
            store,
            nodes: Vec::new(),
            args: args.to_vec(),
            bin: bin.to_path_buf(),
            dir: dir.to_path_buf(),
            net,
        };
        let addrs = (0..n)
            .map(|_| nodes.next_addr())
            .collect::<anyhow::Result<Vec<_>>>()?;
        coordinator::create(
            nodes.store.as_ref(),
            kvlab_ring::DEFAULT_VNODES,
            1,
            kvlab_cluster::CopyWritePolicy::All,
            addrs.iter().map(|a| a.to_string()).collect(),
        )?;
        let me = &nodes;
        let started = crate::scaling::run::start_all(&addrs, |a| me.spawn(a));
        for node in started {
            nodes.nodes.push(node?);
        }
        crate::scaling::run::wait_for_ring(&addrs, n)?;
        Ok(nodes)
    }

    /// A new node's address: a free loopback port, or a namespace of its own.
    fn next_addr(&self) -> anyhow::Result<SocketAddr> {
        match &self.net {
            Some(net) => {
                let h = net.new_node_host().map_err(anyhow::Error::msg)?;
                Ok(SocketAddr::new(IpAddr::V4(net.ip(h)), NETNS_PORT))
            }
            None => Ok(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                free_ports(1)?[0],
            )),
        }
    }

    /// Starts the node at `addr` (in its namespace, if it has one) and waits until it
    /// answers.
    fn spawn(&self, addr: SocketAddr) -> anyhow::Result<Node> {
        let name = addr.to_string();
        let tag = name.replace([':', '.'], "-");
        let data = self.dir.join("data").join(format!("node-{tag}"));
        let mut cmd = match (&self.net, addr.ip()) {
            (Some(net), IpAddr::V4(ip)) => {
                let h = u32::from(ip.octets()[3]).saturating_sub(10);
                Spawn::new("ip")
                    .args(net.exec_args(h))
                    .arg(self.bin.as_os_str())
            }
            _ => Spawn::new(self.bin.as_os_str()),
        };
        cmd = cmd
            .output(Output::File(
                self.dir.join("logs").join(format!("node-{tag}.log")),
            ))
            .args(
                NodeCommand::node(addr.ip(), addr.port(), &self.topology, &name)
                    .args([OsStr::new("--data-dir"), data.as_os_str()])
                    .args(&self.args)
                    .to_args(),
            )
            .ready(Probe::Version(addr))
            .timeout(Duration::from_secs(30));
        let process = cmd
            .start()
            .with_context(|| format!("starting node {name}"))?;
        Ok(Node {
            name,
            addr,
            process,
        })
    }

    /// The nodes' addresses.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(|n| n.addr).collect()
    }

    /// The ring's nodes, sorted.
    pub fn ring(&self) -> Vec<String> {
        crate::scaling::run::sorted_nodes(&*self.store)
    }

    /// Starts a node (timed: the seconds it took) and adds it (a migration).
    pub fn add(&mut self) -> anyhow::Result<(String, f64, MigrationReport, f64)> {
        let t = std::time::Instant::now();
        let addr = self.next_addr()?;
        let node = self.spawn(addr)?;
        let name = node.name.clone();
        self.nodes.push(node);
        let start_s = t.elapsed().as_secs_f64();
        let t = std::time::Instant::now();
        let m = coordinator::add(self.store.as_ref(), &name, &mut |_| {})?;
        Ok((name, start_s, m, t.elapsed().as_secs_f64()))
    }

    /// Removes node `name` (a migration from it; timed), then stops it.
    pub fn remove(&mut self, name: &str) -> anyhow::Result<(MigrationReport, f64)> {
        let t = std::time::Instant::now();
        let m = coordinator::remove(self.store.as_ref(), name, &mut |_| {})?;
        let s = t.elapsed().as_secs_f64();
        self.nodes.retain(|n| n.name != name);
        Ok((m, s))
    }

    /// Every node's CPU time so far, clock ticks.
    pub fn cpu_ticks(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .map(|n| {
                kvlab_procfs::read_proc_stat(n.process.pid())
                    .map(|s| s.cpu_ticks())
                    .unwrap_or(0)
            })
            .collect()
    }
}

/// A network of namespaces for this run, named after this process, on the first of a few
/// subnets that is free here.
pub(super) fn make_net(dir: &Path) -> anyhow::Result<Net> {
    kvlab_faults::netns::preflight().map_err(anyhow::Error::msg)?;
    let pid = std::process::id();
    let name = format!("kvr{}", pid % 100_000);
    let mut tried = Vec::new();
    // 10.77.1–99, as the fault harness does (the netns tests use 100–249); offset from its
    // choices so a concurrent fault run's network is not met first.
    for i in 0..4 {
        let subnet = ((pid + 17 + i * 37) % 99 + 1) as u8;
        match Net::up(&name, subnet, dir) {
            Ok(net) => return Ok(net),
            Err(e) => tried.push(e),
        }
    }
    anyhow::bail!("making the network: {}", tried.join("; "))
}
