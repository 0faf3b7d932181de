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
use std::process::Child;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use kvlab_cluster::coordinator::node_status;
use kvlab_cluster::{Topology, TopologyStore};
use kvlab_etcd::open_store;
use kvlab_process::{free_ports, Output, Probe, Process, Spawn};
use parking_lot::Mutex;

use crate::netns::{Net, PROXY_HOST};

mod coordinators;
mod durable;
mod etcd;
mod nodes;

pub use coordinators::COORDINATOR_TIMEOUT;
pub use durable::Durable;

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
    pub write_policy: kvlab_cluster::CopyWritePolicy,
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
                etcd::start_etcd(&dir, members, net.as_ref())?
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
            kvlab_ring::DEFAULT_VNODES,
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

/// A [`Spawn`] of `program`, inside host `host`'s namespace of `net` if it has one.
fn spawn_in(net: Option<&Net>, host: Option<u32>, program: &Path) -> Spawn {
    match (net, host) {
        (Some(net), Some(h)) => Spawn::new("ip")
            .args(net.exec_args(h))
            .arg(program.as_os_str()),
        _ => Spawn::new(program.as_os_str()),
    }
}
