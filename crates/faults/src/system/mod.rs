//! The system under test, started by shelling out to the kvlab binary: cluster nodes
//! (`kvlab server --cluster`, a process each), the topology store (a file, or an etcd of
//! one or more members), optionally `kvlab proxy --cluster` in front, and coordinators
//! (`kvlab cluster add|remove|resume|abort`, a process each, so one can be killed
//! mid-migration). Everything it starts is stopped by [`System::shutdown`] (also on drop),
//! whatever state it was left in: paused nodes are continued first.
//!
//! Nodes, etcd members and the proxy listen on free 127.0.0.1 ports, or — with
//! [`SystemConfig::netns`] — each in a network namespace of its own ([`crate::netns`]) on
//! port 11211 (etcd 2379) of its own address, where the nemesis can partition and delay
//! them; coordinators and clients stay in the root namespace and cross the bridge.
//!
//! With [`SystemConfig::durable`] every node keeps its keys on disk ([`Durable`]), and a
//! node killed with `kill -9` is restarted over the same data directory.
//!
//! ```text
//!  System ── nodes: name → slot (address, host, process, Up │ Paused │ Down │ Stopped, busy,
//!         │        data directory: durable nodes, kept across a restart)
//!         ├─ etcd members (process, address, host, data dir) ┐ the nemesis's lanes act on
//!         ├─ coordinators running (id → child process)       │ these through &System;
//!         ├─ proxy                                           ┘ each behind its own lock
//!         └─ the network (namespaces, bridge), taken down last
//! ```

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kvlab_client::Client;
use kvlab_cluster::coordinator::node_status;
use kvlab_cluster::{NodeCommand, Topology, TopologyStore};
use kvlab_etcd::open_store;
use kvlab_process::{free_port, free_ports, wait_ready, Output, Probe, Process, Spawn};
use parking_lot::Mutex;

use crate::netns::{Net, ETCD_HOST, PROXY_HOST};

/// Where the topology lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopologyKind {
    /// A JSON file in the run's directory (one machine).
    File,
    /// An etcd of this many members (1 or 3: a quorum survives one member's death).
    Etcd {
        /// Members.
        members: usize,
    },
}

/// What to start.
#[derive(Debug, Clone)]
pub struct SystemConfig {
    /// The kvlab binary.
    pub exe: PathBuf,
    /// Where logs, the topology file and etcd's data go.
    pub dir: PathBuf,
    /// Nodes in the ring at the start.
    pub nodes: usize,
    /// Copies of every key.
    pub replicas: u32,
    /// When a write with copies is acknowledged.
    pub write_policy: kvlab_cluster::WritePolicy,
    /// Where the topology lives.
    pub topology: TopologyKind,
    /// Start `kvlab proxy --cluster` in front.
    pub proxy: bool,
    /// A plain pool instead of a cluster: the nodes are plain `kvlab server`s and the proxy
    /// in front shards over them with `--replicas` copies of every key. The topology file
    /// then only lists the backends for the nemesis (no node reads it).
    pub pool: bool,
    /// Flags for every node's `kvlab server`.
    pub server_args: Vec<String>,
    /// Each node, etcd member and the proxy in a network namespace of its own.
    pub netns: bool,
    /// Durable nodes (a cluster's, not a plain pool's): each keeps its keys in a data
    /// directory of its own.
    pub durable: Option<Durable>,
}

/// Durable nodes: each node keeps its keys under the run's `data/` in a directory of its
/// own (`data/node-127.0.0.1-PORT`), with `--durability sync` (every acknowledged write and
/// delete is on its disk before the reply) and a write-back cache of `cache_items` entries,
/// so most keys live on disk only. A node killed and restarted opens the same directory
/// again; a node started fresh (added, or its address used again) gets a new, empty one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Durable {
    /// The write-back cache's bound, in entries (`--cache-items`).
    pub cache_items: usize,
}

impl Durable {
    /// The cache bound a run uses unless told otherwise: small beside the 200 keys the
    /// clients share, so most reads and writes of old keys go to the disk.
    pub const CACHE_ITEMS: usize = 64;

    /// `kvlab server` flags for a node over `dir`, beside `server_args` (which may set
    /// `--durability` or `--cache-items` themselves: theirs are kept).
    pub fn server_flags(&self, dir: &Path, server_args: &[String]) -> Vec<String> {
        let mut flags = vec!["--data-dir".to_string(), dir.display().to_string()];
        if flag_value(server_args, "--durability").is_none() {
            flags.extend(["--durability".to_string(), "sync".to_string()]);
        }
        if flag_value(server_args, "--cache-items").is_none() {
            flags.extend(["--cache-items".to_string(), self.cache_items.to_string()]);
        }
        flags
    }

    /// Whether durable nodes started with `server_args` run under `--durability sync` (the
    /// harness's choice unless the flags say otherwise): only then is a killed node's disk
    /// expected to hold every acknowledged write.
    pub fn syncs(server_args: &[String]) -> bool {
        flag_value(server_args, "--durability").is_none_or(|d| d == "sync")
    }
}

/// The value the last `FLAG VALUE` or `FLAG=VALUE` in `args` gives, if any.
fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let mut said = None;
    for (i, a) in args.iter().enumerate() {
        if a == flag {
            said = args.get(i + 1).map(String::as_str);
        } else if let Some(v) = a.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            said = Some(v);
        }
    }
    said
}

/// A node's state as the harness left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeState {
    /// Running.
    Up,
    /// SIGSTOPped.
    Paused,
    /// Killed, to be restarted.
    Down,
    /// Stopped for good (removed from the ring, or a spare).
    Stopped,
}

struct NodeSlot {
    addr: SocketAddr,
    /// Its network namespace's host number (with namespaces).
    host: Option<u32>,
    process: Option<Process>,
    state: NodeState,
    /// A fault or a membership change is acting on it.
    busy: bool,
    /// Times started (names its log files).
    starts: u32,
    /// Its data directory (durable nodes): kept across restarts, new for a fresh start.
    data: Option<PathBuf>,
}

struct Member {
    name: String,
    client: SocketAddr,
    /// Its network namespace's host number (with namespaces).
    host: Option<u32>,
    args: Vec<String>,
    process: Option<Process>,
    starts: u32,
}

/// How long a coordinator may run before it is killed and reported stuck (a migration
/// that makes no progress for 60 s fails by itself).
pub const COORDINATOR_TIMEOUT: Duration = Duration::from_secs(90);

/// What a start error says when a port chosen free was taken before the node bound it
/// (another program on the machine): the run starts again on other ports.
pub const ADDRESS_TAKEN: &str = "address already in use";

/// How long a node or an etcd member may take to answer after it is started.
const START_TIMEOUT: Duration = Duration::from_secs(15);

/// The system under test (see the module docs).
pub struct System {
    cfg: SystemConfig,
    spec: String,
    store: Box<dyn TopologyStore>,
    nodes: Mutex<BTreeMap<String, NodeSlot>>,
    etcd: Mutex<Vec<Member>>,
    proxy: Mutex<Option<Process>>,
    proxy_addr: Option<SocketAddr>,
    coordinators: Mutex<HashMap<u64, Child>>,
    next_coordinator: AtomicU64,
    /// Held by whoever drives a migration (a membership fault, a rejoin, the heal), so
    /// that one runs at a time.
    pub migrations: Mutex<()>,
    /// The run's network, with namespaces (taken down by `shutdown`, after the processes).
    net: Option<Net>,
}

/// The port every node and the proxy listen on in a namespace of its own.
const NETNS_PORT: u16 = 11211;
/// etcd's client and peer ports in a namespace.
const NETNS_ETCD_PORTS: (u16, u16) = (2379, 2380);

fn addr_of(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn addr_in(ip: Ipv4Addr, port: u16) -> SocketAddr {
    SocketAddr::from((ip, port))
}

/// A network of namespaces for this run, named after this process (so that runs of other
/// processes do not meet it) on the first of a few subnets that is free here.
fn make_net(dir: &Path) -> Result<Net, String> {
    crate::netns::preflight()?;
    let pid = std::process::id();
    let name = format!("kvf{}", pid % 100_000);
    let mut tried = Vec::new();
    // 10.77.1–99: below the range the netns tests use (100–249) and the script's default
    // (10.77.0).
    for i in 0..4 {
        let subnet = ((pid + i * 37) % 99 + 1) as u8;
        match Net::up(&name, subnet, dir) {
            Ok(net) => return Ok(net),
            Err(e) => tried.push(e),
        }
    }
    Err(format!("making the network: {}", tried.join("; ")))
}

/// What a coordinator said, on one line: its output up to a backtrace, the last `n`
/// characters of it.
fn said(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let text = text.split("Stack backtrace:").next().unwrap_or_default();
    let text = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" | ");
    let start = text.char_indices().rev().nth(n).map_or(0, |(i, _)| i);
    text[start..].to_string()
}

impl System {
    /// Starts the topology store, creates the cluster, starts its nodes (and the proxy),
    /// and returns once every one answers. What was started is stopped on failure.
    pub fn start(cfg: SystemConfig) -> Result<System, String> {
        for d in ["nodes", "coordinators"] {
            std::fs::create_dir_all(cfg.dir.join(d))
                .map_err(|e| format!("creating {}: {e}", cfg.dir.join(d).display()))?;
        }
        let net = if cfg.netns {
            Some(make_net(&cfg.dir.join("netns"))?)
        } else {
            None
        };
        // Each node's address and host.
        let mut places = Vec::new();
        let proxy_addr = match &net {
            None => {
                let ports = free_ports(cfg.nodes + 1).map_err(|e| format!("free ports: {e}"))?;
                places.extend(ports[..cfg.nodes].iter().map(|&p| (addr_of(p), None)));
                cfg.proxy.then(|| addr_of(ports[cfg.nodes]))
            }
            Some(net) => {
                for _ in 0..cfg.nodes {
                    let h = net.new_node_host()?;
                    places.push((addr_in(net.ip(h), NETNS_PORT), Some(h)));
                }
                if cfg.proxy {
                    Some(addr_in(net.host(PROXY_HOST)?, NETNS_PORT))
                } else {
                    None
                }
            }
        };
        let (etcd, spec) = match cfg.topology {
            TopologyKind::File => (
                Vec::new(),
                cfg.dir.join("topology.json").display().to_string(),
            ),
            TopologyKind::Etcd { members } => {
                let dir = cfg.dir.join("etcd");
                std::fs::create_dir_all(&dir)
                    .map_err(|e| format!("creating {}: {e}", dir.display()))?;
                start_etcd(&dir, members, net.as_ref())?
            }
        };
        let mut sys = System {
            store: open_store(&spec).map_err(|e| e.to_string())?,
            spec,
            nodes: Mutex::new(BTreeMap::new()),
            etcd: Mutex::new(etcd),
            proxy: Mutex::new(None),
            proxy_addr,
            coordinators: Mutex::new(HashMap::new()),
            next_coordinator: AtomicU64::new(0),
            migrations: Mutex::new(()),
            net,
            cfg,
        };
        let names: Vec<String> = places.iter().map(|(a, _)| a.to_string()).collect();
        // The topology first: a node reads it when it starts.
        kvlab_cluster::coordinator::create(
            sys.store.as_ref(),
            kvlab_client::cluster::DEFAULT_VNODES,
            sys.cfg.replicas,
            sys.cfg.write_policy,
            names,
        )
        .map_err(|e| format!("creating the cluster: {e}"))?;
        for &(addr, host) in &places {
            sys.launch(addr, host, true)?;
        }
        if let Some(addr) = sys.proxy_addr {
            let routing: Vec<String> = if sys.cfg.pool {
                let mut a: Vec<String> = places
                    .iter()
                    .flat_map(|(b, _)| ["--backend".to_string(), b.to_string()])
                    .collect();
                a.extend(["--replicas".to_string(), sys.cfg.replicas.to_string()]);
                a
            } else {
                vec!["--cluster".to_string(), places[0].0.to_string()]
            };
            let p = sys
                .spawn(sys.net.as_ref().map(|_| PROXY_HOST), &sys.cfg.exe)
                .args(["proxy", "-t", "2"])
                .args(["-l".to_string(), addr.ip().to_string()])
                .args(["-p".to_string(), addr.port().to_string()])
                .args(routing)
                .output(Output::File(sys.cfg.dir.join("proxy.log")))
                .grace(Duration::from_secs(2))
                .timeout(START_TIMEOUT)
                .ready(Probe::Version(addr))
                .start()
                .map_err(|e| format!("starting the proxy: {e}"))?;
            *sys.proxy.get_mut() = Some(p);
        }
        Ok(sys)
    }

    /// A [`Spawn`] of `program`, inside host `host`'s namespace if it has one.
    fn spawn(&self, host: Option<u32>, program: &Path) -> Spawn {
        spawn_in(self.net.as_ref(), host, program)
    }

    /// The run's network, with namespaces.
    pub fn net(&self) -> Option<&Net> {
        self.net.as_ref()
    }

    /// Node `name`'s host (with namespaces).
    pub fn host_of(&self, name: &str) -> Option<u32> {
        self.nodes.lock().get(name).and_then(|s| s.host)
    }

    /// The etcd members' names and hosts (with namespaces).
    pub fn etcd_hosts(&self) -> Vec<(String, u32)> {
        self.etcd
            .lock()
            .iter()
            .filter_map(|m| Some((format!("etcd {} ({})", m.name, m.client), m.host?)))
            .collect()
    }

    /// The proxy's host (with namespaces and a proxy).
    pub fn proxy_host(&self) -> Option<u32> {
        (self.net.is_some() && self.proxy_addr.is_some()).then_some(PROXY_HOST)
    }

    /// The `--topology`/`--cluster` value of this cluster.
    pub fn spec(&self) -> &str {
        &self.spec
    }

    /// The proxy's address, if one runs.
    pub fn proxy_addr(&self) -> Option<SocketAddr> {
        self.proxy_addr
    }

    /// Whether the topology lives in etcd.
    pub fn etcd_members(&self) -> usize {
        self.etcd.lock().len()
    }

    /// The cluster's topology now.
    pub fn topology(&self) -> Result<Topology, String> {
        match self.store.load() {
            Ok(Some(t)) => Ok(t),
            Ok(None) => Err("the topology is gone".into()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Every node in the ring or joining it.
    pub fn ring_nodes(t: &Topology) -> Vec<String> {
        let mut all = t.nodes.clone();
        if let Some(m) = &t.migration {
            for n in &m.to {
                if !all.contains(n) {
                    all.push(n.clone());
                }
            }
        }
        all
    }

    /// Addresses of the nodes the run started with (clients' seeds).
    pub fn seeds(&self) -> Vec<SocketAddr> {
        self.nodes.lock().values().map(|s| s.addr).collect()
    }

    /// Nodes started and not stopped for good.
    pub fn live_nodes(&self) -> usize {
        self.nodes
            .lock()
            .values()
            .filter(|s| s.state != NodeState::Stopped)
            .count()
    }

    /// Starts the node of `addr` (a `fresh` start, or a restart; in host `host`'s namespace
    /// if it has one) and records it `Up`. A durable node started fresh gets a new data
    /// directory; restarted, it opens the one it had.
    fn launch(&self, addr: SocketAddr, host: Option<u32>, fresh: bool) -> Result<(), String> {
        let name = addr.to_string();
        let (starts, data) = {
            let mut nodes = self.nodes.lock();
            let slot = nodes.entry(name.clone()).or_insert(NodeSlot {
                addr,
                host,
                process: None,
                state: NodeState::Down,
                busy: false,
                starts: 0,
                data: None,
            });
            slot.starts += 1;
            if self.cfg.durable.is_some() && (fresh || slot.data.is_none()) {
                slot.data = Some(self.new_data_dir(&name)?);
            }
            (slot.starts, slot.data.clone())
        };
        let durable_flags = match (&self.cfg.durable, &data) {
            (Some(d), Some(dir)) => d.server_flags(dir, &self.cfg.server_args),
            _ => Vec::new(),
        };
        let log = format!("node-{}.{starts}.log", name.replace(':', "-"));
        let log_path = self.cfg.dir.join("nodes").join(&log);
        let p = self
            .spawn(host, &self.cfg.exe)
            .args(
                if self.cfg.pool {
                    NodeCommand::server(addr.ip(), addr.port())
                } else {
                    NodeCommand::node(addr.ip(), addr.port(), &self.spec, &name)
                }
                .args(&self.cfg.server_args)
                .args(durable_flags)
                .to_args(),
            )
            .output(Output::File(self.cfg.dir.join("nodes").join(log)))
            .grace(Duration::from_secs(2))
            .timeout(START_TIMEOUT)
            .ready(Probe::Version(addr))
            .start();
        let p = match p {
            Ok(p) => p,
            Err(e) => {
                // A node that never ran is given up (a killed one stays down, to be
                // started again by the heal).
                if starts == 1 {
                    if let Some(slot) = self.nodes.lock().get_mut(&name) {
                        slot.state = NodeState::Stopped;
                    }
                }
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                let taken = if log.contains("Address already in use") {
                    format!(" ({ADDRESS_TAKEN})")
                } else {
                    String::new()
                };
                return Err(format!("starting {name}: {e}{taken}"));
            }
        };
        let mut nodes = self.nodes.lock();
        if let Some(slot) = nodes.get_mut(&name) {
            slot.process = Some(p);
            slot.state = NodeState::Up;
        }
        Ok(())
    }

    /// A new, empty data directory for node `name` under the run's `data/`: named after
    /// the node, with `.2`, `.3`, … when a node of that name (its address used again) had
    /// one before.
    fn new_data_dir(&self, name: &str) -> Result<PathBuf, String> {
        let base = format!("node-{}", name.replace(':', "-"));
        let root = self.cfg.dir.join("data");
        let dir = (1..)
            .map(|i| match i {
                1 => root.join(&base),
                i => root.join(format!("{base}.{i}")),
            })
            .find(|d| !d.exists())
            .ok_or("no free data directory name")?;
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        Ok(dir)
    }

    /// Node `name`'s data directory now (durable nodes).
    pub fn data_dir(&self, name: &str) -> Option<PathBuf> {
        self.nodes.lock().get(name).and_then(|s| s.data.clone())
    }

    /// Starts a new node on a free port, or in a new namespace (not in the ring yet);
    /// returns its name.
    pub fn start_node(&self) -> Result<String, String> {
        let (addr, host) = match &self.net {
            None => (
                addr_of(free_port().map_err(|e| format!("a free port: {e}"))?),
                None,
            ),
            Some(net) => {
                let h = net.new_node_host()?;
                (addr_in(net.ip(h), NETNS_PORT), Some(h))
            }
        };
        self.launch(addr, host, true)?;
        Ok(addr.to_string())
    }

    /// Chooses `pick % n` among the nodes in `among` whose state is one of `states` and
    /// that nothing else is acting on, and marks it busy (until [`System::release`]).
    pub fn claim(&self, pick: u32, among: &[String], states: &[NodeState]) -> Option<String> {
        let mut nodes = self.nodes.lock();
        let fit: Vec<&String> = among
            .iter()
            .filter(|n| {
                nodes
                    .get(*n)
                    .is_some_and(|s| !s.busy && states.contains(&s.state))
            })
            .collect();
        if fit.is_empty() {
            return None;
        }
        let name = fit[pick as usize % fit.len()].clone();
        if let Some(s) = nodes.get_mut(&name) {
            s.busy = true;
        }
        Some(name)
    }

    /// Marks a node free again.
    pub fn release(&self, name: &str) {
        if let Some(s) = self.nodes.lock().get_mut(name) {
            s.busy = false;
        }
    }

    fn signal(&self, name: &str, sig: i32, want: NodeState, next: NodeState) -> Result<(), String> {
        let mut nodes = self.nodes.lock();
        let slot = nodes
            .get_mut(name)
            .ok_or_else(|| format!("no node {name}"))?;
        if slot.state != want {
            return Err(format!("{name} is {:?}", slot.state));
        }
        let pid = slot.process.as_ref().map_or(0, Process::pid);
        let pid = i32::try_from(pid).ok().filter(|p| *p > 0);
        let pid = pid.ok_or_else(|| format!("{name} has no process"))?;
        // SAFETY: kill(2) has no memory-safety preconditions; `pid` is our own child, not
        // yet reaped (its `Process` holds it), so the id cannot have been reused.
        if unsafe { libc::kill(pid, sig) } != 0 {
            return Err(format!(
                "signal {sig} to {name}: {}",
                std::io::Error::last_os_error()
            ));
        }
        slot.state = next;
        Ok(())
    }

    /// SIGSTOP.
    pub fn pause(&self, name: &str) -> Result<(), String> {
        self.signal(name, libc::SIGSTOP, NodeState::Up, NodeState::Paused)
    }

    /// SIGCONT.
    pub fn resume(&self, name: &str) -> Result<(), String> {
        self.signal(name, libc::SIGCONT, NodeState::Paused, NodeState::Up)
    }

    /// `kill -9` (and reap).
    pub fn kill(&self, name: &str) -> Result<(), String> {
        let mut p = {
            let mut nodes = self.nodes.lock();
            let slot = nodes
                .get_mut(name)
                .ok_or_else(|| format!("no node {name}"))?;
            let p = slot
                .process
                .take()
                .ok_or_else(|| format!("{name} has no process"))?;
            slot.state = NodeState::Down;
            p
        };
        p.kill();
        Ok(())
    }

    /// Starts a killed node again on its address.
    pub fn restart(&self, name: &str) -> Result<(), String> {
        let (addr, host) = {
            let nodes = self.nodes.lock();
            let slot = nodes.get(name).ok_or_else(|| format!("no node {name}"))?;
            if slot.state != NodeState::Down {
                return Err(format!("{name} is {:?}", slot.state));
            }
            (slot.addr, slot.host)
        };
        self.launch(addr, host, false)
    }

    /// Stops a node for good (SIGCONT first if paused, then SIGTERM, SIGKILL after 2 s).
    pub fn stop(&self, name: &str) {
        let p = {
            let mut nodes = self.nodes.lock();
            let Some(slot) = nodes.get_mut(name) else {
                return;
            };
            if slot.state == NodeState::Paused {
                if let Some(pid) = slot
                    .process
                    .as_ref()
                    .and_then(|p| i32::try_from(p.pid()).ok())
                {
                    // SAFETY: as in `signal`: our own unreaped child.
                    unsafe {
                        libc::kill(pid, libc::SIGCONT);
                    }
                }
            }
            slot.state = NodeState::Stopped;
            slot.busy = false;
            slot.process.take()
        };
        if let Some(p) = p {
            p.stop();
        }
    }

    /// `flush_all` on a node: it drops every item and keeps running.
    pub fn flush(&self, name: &str) -> Result<(), String> {
        let addr = self
            .nodes
            .lock()
            .get(name)
            .map(|s| s.addr)
            .ok_or_else(|| format!("no node {name}"))?;
        let mut c = Client::connect(addr, Duration::from_secs(2)).map_err(|e| e.to_string())?;
        match c.call(b"flush_all\r\n").map_err(|e| e.to_string())? {
            kvlab_client::Answer::Line(l) if l == b"OK" => Ok(()),
            other => Err(format!("flush_all: {other:?}")),
        }
    }

    /// `kill -9` etcd member `i`.
    pub fn etcd_kill(&self, i: usize) -> Result<String, String> {
        let mut etcd = self.etcd.lock();
        let n = etcd.len();
        let m = etcd.get_mut(i % n.max(1)).ok_or("no etcd")?;
        let mut p = m
            .process
            .take()
            .ok_or_else(|| format!("{} is not running", m.name))?;
        p.kill();
        Ok(m.name.clone())
    }

    /// Starts every etcd member that is not running, and waits until each answers.
    pub fn etcd_restart(&self) -> Result<(), String> {
        let mut etcd = self.etcd.lock();
        let dir = self.cfg.dir.join("etcd");
        let mut started = Vec::new();
        for m in etcd.iter_mut().filter(|m| m.process.is_none()) {
            m.starts += 1;
            m.process = Some(spawn_member(&dir, m, self.net.as_ref())?);
            started.push(m.client);
        }
        drop(etcd);
        for addr in started {
            wait_ready(&Probe::HttpGetPath(addr, "/health"), START_TIMEOUT)
                .map_err(|e| format!("etcd {addr}: {e}"))?;
        }
        Ok(())
    }

    /// Starts `kvlab cluster --topology SPEC <args>` in the background; its output goes to
    /// a log of its own. Returns its id.
    pub fn coordinator_start(&self, args: &[&str]) -> Result<u64, String> {
        let id = self.next_coordinator.fetch_add(1, Ordering::Relaxed);
        let log = self.coordinator_log(id, args);
        let f = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let g = f.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(&self.cfg.exe)
            .args(["cluster", "--topology", &self.spec])
            .args(args)
            .stdin(Stdio::null())
            .stdout(f)
            .stderr(g)
            .spawn()
            .map_err(|e| format!("starting kvlab cluster {}: {e}", args.join(" ")))?;
        self.coordinators.lock().insert(id, child);
        Ok(id)
    }

    fn coordinator_log(&self, id: u64, args: &[&str]) -> PathBuf {
        let what: String = args
            .iter()
            .map(|a| a.replace([':', '.'], "_"))
            .collect::<Vec<_>>()
            .join("-");
        self.cfg
            .dir
            .join("coordinators")
            .join(format!("{id:03}-{what}.log"))
    }

    /// Whether coordinator `id` has ended; `Some((success, what it said last))` once it has.
    pub fn coordinator_poll(&self, id: u64, args: &[&str]) -> Option<(bool, String)> {
        let mut running = self.coordinators.lock();
        let child = running.get_mut(&id)?;
        match child.try_wait() {
            Ok(None) => None,
            Ok(Some(status)) => {
                running.remove(&id);
                Some((status.success(), said(&self.coordinator_log(id, args), 300)))
            }
            Err(e) => {
                running.remove(&id);
                Some((false, e.to_string()))
            }
        }
    }

    /// `kill -9` coordinator `id` (and reap it): `None` if it was killed, its result if it
    /// had already ended.
    pub fn coordinator_kill(&self, id: u64, args: &[&str]) -> Option<(bool, String)> {
        let mut child = self.coordinators.lock().remove(&id)?;
        if let Ok(Some(status)) = child.try_wait() {
            return Some((status.success(), said(&self.coordinator_log(id, args), 300)));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// Waits for coordinator `id` (at most [`COORDINATOR_TIMEOUT`]; then kills it).
    pub fn coordinator_wait(&self, id: u64, args: &[&str]) -> (bool, String) {
        let deadline = Instant::now() + COORDINATOR_TIMEOUT;
        let mut pause = Duration::from_millis(1);
        loop {
            if let Some(r) = self.coordinator_poll(id, args) {
                return r;
            }
            if Instant::now() >= deadline {
                if let Some(r) = self.coordinator_kill(id, args) {
                    return r;
                }
                return (
                    false,
                    format!(
                        "no end within {} s (killed): {}",
                        COORDINATOR_TIMEOUT.as_secs(),
                        said(&self.coordinator_log(id, args), 300)
                    ),
                );
            }
            // Polling a child's exit: a bounded back-off.
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }

    /// Runs a coordinator to its end: `(success, what it said last)`.
    pub fn coordinator(&self, args: &[&str]) -> (bool, String) {
        match self.coordinator_start(args) {
            Ok(id) => self.coordinator_wait(id, args),
            Err(e) => (false, e),
        }
    }

    /// Continues paused nodes, restarts killed nodes and etcd members. Returns what could
    /// not be brought back.
    pub fn revive(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(net) = &self.net {
            // Every partition healed, every delay removed (each fault heals its own; this
            // is for a run cut short).
            let mut hosts: Vec<u32> = self.nodes.lock().values().filter_map(|s| s.host).collect();
            hosts.extend(self.etcd_hosts().into_iter().map(|(_, h)| h));
            hosts.extend(self.proxy_host());
            for h in hosts {
                if let Err(e) = net.heal(h).and_then(|_| net.clear(h)) {
                    problems.push(e);
                }
            }
        }
        if let Err(e) = self.etcd_restart() {
            problems.push(e);
        }
        let states: Vec<(String, NodeState)> = self
            .nodes
            .lock()
            .iter()
            .map(|(n, s)| (n.clone(), s.state))
            .collect();
        for (name, state) in states {
            let r = match state {
                NodeState::Paused => self.resume(&name),
                NodeState::Down => self.restart(&name),
                NodeState::Up | NodeState::Stopped => Ok(()),
            };
            if let Err(e) = r {
                problems.push(e);
            }
        }
        problems
    }

    /// Whether the cluster is at rest: no migration, and every ring node answers with the
    /// topology's epoch.
    pub fn settled(&self) -> Result<(), String> {
        if self.cfg.pool {
            return self.pool_settled();
        }
        let t = self.topology()?;
        if let Some(m) = &t.migration {
            return Err(format!("migration {} in its {:?} phase", m.id, m.phase));
        }
        for n in &t.nodes {
            let s = node_status(n).map_err(|e| e.to_string())?;
            let epoch = s["epoch"].as_u64().unwrap_or(0);
            if epoch != t.epoch {
                return Err(format!(
                    "{n} serves epoch {epoch}, the topology's is {}",
                    t.epoch
                ));
            }
        }
        Ok(())
    }

    /// A plain pool is at rest when the proxy has every backend back in (a replica that
    /// missed writes is repaired before it is).
    fn pool_settled(&self) -> Result<(), String> {
        let addr = self.proxy_addr.ok_or("no proxy runs")?;
        let stats = kvlab_process::stats(addr, None, Duration::from_secs(2))
            .map_err(|e| format!("the proxy's stats: {e}"))?;
        let ejected = stats
            .iter()
            .find(|(k, _)| k == "proxy_backends_ejected")
            .map(|(_, v)| v.clone())
            .ok_or("the proxy's stats lack proxy_backends_ejected")?;
        if ejected != "0" {
            return Err(format!("{ejected} backends still out of the proxy's pool"));
        }
        Ok(())
    }

    /// Stops everything this system started: coordinators (SIGKILL), then nodes (paused
    /// ones continued first), the proxy and etcd (SIGTERM, SIGKILL after a grace period).
    /// Safe to call more than once, from any thread.
    pub fn shutdown(&self) {
        for (_, mut child) in self.coordinators.lock().drain() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let processes: Vec<Process> = {
            let mut nodes = self.nodes.lock();
            nodes
                .values_mut()
                .filter_map(|s| {
                    let p = s.process.take()?;
                    if let Ok(pid) = i32::try_from(p.pid()) {
                        // SAFETY: our own unreaped child (held by `p`). Continued first (a
                        // stopped process acts on SIGTERM only once continued), then asked
                        // to stop, all before any is waited for.
                        unsafe {
                            if s.state == NodeState::Paused {
                                libc::kill(pid, libc::SIGCONT);
                            }
                            libc::kill(pid, libc::SIGTERM);
                        }
                    }
                    s.state = NodeState::Stopped;
                    Some(p)
                })
                .collect()
        };
        for p in processes {
            p.stop();
        }
        if let Some(p) = self.proxy.lock().take() {
            p.stop();
        }
        let etcd_dir = self.cfg.dir.join("etcd");
        for m in self.etcd.lock().iter_mut() {
            if let Some(p) = m.process.take() {
                p.stop();
            }
            // Its data (about 60 MB a member) goes; its logs stay beside it. A soak of
            // many seeds on etcd would otherwise fill the disk.
            let _ = std::fs::remove_dir_all(etcd_dir.join(&m.name));
        }
        if let Some(net) = &self.net {
            if let Err(e) = net.down() {
                eprintln!("kvlab faults: {e}");
            }
        }
    }
}

impl Drop for System {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Starts an etcd of `members` members (on free ports, or each in a namespace of its own
/// with `net`) with data under `dir`; returns them and the `etcd://…/faults` topology spec
/// once every member answers `/health`.
fn start_etcd(
    dir: &Path,
    members: usize,
    net: Option<&Net>,
) -> Result<(Vec<Member>, String), String> {
    let members = members.max(1);
    // Each member's client and peer address, and host.
    let mut places = Vec::new();
    match net {
        None => {
            let ports = free_ports(members * 2).map_err(|e| format!("free ports: {e}"))?;
            for i in 0..members {
                places.push((addr_of(ports[2 * i]), addr_of(ports[2 * i + 1]), None));
            }
        }
        Some(net) => {
            for i in 0..members as u32 {
                let ip = net.host(ETCD_HOST + i)?;
                let (client, peer) = NETNS_ETCD_PORTS;
                places.push((addr_in(ip, client), addr_in(ip, peer), Some(ETCD_HOST + i)));
            }
        }
    }
    let peers: Vec<String> = places
        .iter()
        .enumerate()
        .map(|(i, (_, peer, _))| format!("m{i}=http://{peer}"))
        .collect();
    let mut out = Vec::new();
    for (i, &(client, peer, host)) in places.iter().enumerate() {
        let peer = format!("http://{peer}");
        let name = format!("m{i}");
        let args = vec![
            "--name".to_string(),
            name.clone(),
            "--data-dir".to_string(),
            dir.join(&name).display().to_string(),
            "--listen-client-urls".to_string(),
            format!("http://{client}"),
            "--advertise-client-urls".to_string(),
            format!("http://{client}"),
            "--listen-peer-urls".to_string(),
            peer.clone(),
            "--initial-advertise-peer-urls".to_string(),
            peer,
            "--initial-cluster".to_string(),
            peers.join(","),
            "--initial-cluster-token".to_string(),
            "kvlab-faults".to_string(),
            "--log-level".to_string(),
            "warn".to_string(),
        ];
        let mut m = Member {
            name,
            client,
            host,
            args,
            process: None,
            starts: 1,
        };
        // Members start together: one alone has no quorum and never becomes healthy.
        m.process = Some(spawn_member(dir, &m, net)?);
        out.push(m);
    }
    for m in &out {
        wait_ready(&Probe::HttpGetPath(m.client, "/health"), START_TIMEOUT)
            .map_err(|e| format!("etcd {}: {e}", m.name))?;
    }
    let hosts: Vec<String> = out.iter().map(|m| m.client.to_string()).collect();
    let spec = format!("etcd://{}/faults", hosts.join(","));
    Ok((out, spec))
}

/// A [`Spawn`] of `program`, inside host `host`'s namespace of `net` if it has one.
fn spawn_in(net: Option<&Net>, host: Option<u32>, program: &Path) -> Spawn {
    match (net, host) {
        (Some(net), Some(h)) => Spawn::new("ip")
            .args(net.exec_args(h))
            .arg(program.as_os_str()),
        _ => Spawn::new(program.as_os_str()),
    }
}

fn spawn_member(dir: &Path, m: &Member, net: Option<&Net>) -> Result<Process, String> {
    let program = PathBuf::from(std::env::var("ETCD").unwrap_or_else(|_| "etcd".into()));
    spawn_in(net, m.host, &program)
        .args(&m.args)
        .output(Output::File(
            dir.join(format!("{}.{}.log", m.name, m.starts)),
        ))
        .grace(Duration::from_secs(2))
        .start()
        .map_err(|e| format!("starting etcd {}: {e}", m.name))
}
