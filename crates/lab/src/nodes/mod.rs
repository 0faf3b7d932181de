//! The nodes of a cluster an experiment starts — the storage ring's parts and the scaling
//! kind's cluster: kvlab nodes (each a `kvlab server --cluster` process; durable ones with
//! their own `--data-dir`) or plain memcached servers (the storage ring's second system,
//! behind a fixed client ring); on loopback, each in a network namespace of its own, or on
//! the experiment's hosts (node i on `node_hosts[i % len]`, its data in its host's run
//! directory); started, added, removed, killed, stopped, and their CPU read. The ring's
//! topology is a file — on hosts each node has a copy of it, so the ring does not change
//! there — or a cluster of the experiment's etcd ([`etcd`]: `etcd://ADDR/NAME`), which
//! nodes on every host and the lab's coordinator share: a ring on hosts grows and shrinks
//! only so.

use std::ffi::OsStr;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvlab_client::cluster::fetch_ring;

use anyhow::{bail, Context};
use kvlab_cluster::coordinator::{self, MigrationReport};
use kvlab_cluster::{NodeCommand, TopologyStore};
use kvlab_etcd::open_store;
use kvlab_faults::netns::Net;
use kvlab_hosts::Started;
use kvlab_process::{free_ports, Output, Probe, Process, Spawn};

use crate::placement::{Placement, Roles};

pub(crate) mod etcd;

/// The port of a node in a namespace of its own (it has the address to itself).
const NETNS_PORT: u16 = 11211;
/// How long a node has to answer once started.
const READY: Duration = Duration::from_secs(30);

/// Which system the nodes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Durable kvlab cluster nodes.
    Kvlab,
    /// Plain memcached servers.
    Memcached,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Kvlab => "kvlab",
            Kind::Memcached => "memcached",
        }
    }
}

/// Where the nodes run: here (loopback), in namespaces, or on hosts; and what the ring
/// keeps.
#[derive(Clone, Default)]
pub(crate) struct Site {
    /// Copies of every key (kvlab nodes; 0 is taken as 1).
    pub replicas: u32,
    /// Each kvlab node with a `--data-dir` of its own.
    pub durable: bool,
    pub net: Option<Arc<Net>>,
    /// The placement and the nodes' hosts (node i on `hosts[i % len]`).
    pub hosts: Option<(Arc<Placement>, Vec<String>)>,
    /// The etcd (`ADDR:PORT`) the kvlab rings' topologies live in (a cluster each, named
    /// after its part), or none: a topology file each.
    pub etcd: Option<String>,
}

/// A node's process.
pub(crate) enum Proc {
    Local(Process),
    Remote(Started),
}

/// One node.
pub(crate) struct Node {
    pub name: String,
    pub addr: SocketAddr,
    pub process: Proc,
}

/// The nodes of one ring (stopped when dropped).
pub(crate) struct Nodes {
    kind: Kind,
    topology: String,
    store: Option<Box<dyn TopologyStore>>,
    pub nodes: Vec<Node>,
    args: Vec<String>,
    bin: PathBuf,
    dir: PathBuf,
    site: Site,
    /// Nodes placed so far (the next one's host).
    placed: usize,
}

impl Nodes {
    /// Creates a ring of `n` nodes of `kind` under `dir` (topology, logs, data; on a host,
    /// its run directory's `dir`'s last component) and starts them; returns once each
    /// serves (a kvlab node: the ring of `n`).
    pub fn start(
        kind: Kind,
        n: usize,
        args: &[String],
        bin: &Path,
        dir: &Path,
        site: Site,
    ) -> anyhow::Result<Nodes> {
        std::fs::create_dir_all(dir.join("logs"))
            .with_context(|| format!("creating {}", dir.display()))?;
        let topology = match (&site.etcd, kind) {
            (Some(etcd), Kind::Kvlab) => format!("etcd://{etcd}/{}", cluster_name(dir)),
            _ => dir.join("topology.json").display().to_string(),
        };
        let store = match kind {
            Kind::Kvlab => Some(open_store(&topology)?),
            Kind::Memcached => None,
        };
        let mut nodes = Nodes {
            kind,
            topology,
            store,
            nodes: Vec::new(),
            args: args.to_vec(),
            bin: bin.to_path_buf(),
            dir: dir.to_path_buf(),
            site,
            placed: 0,
        };
        let addrs = (0..n)
            .map(|_| nodes.next_addr())
            .collect::<anyhow::Result<Vec<_>>>()?;
        if let Some(store) = &nodes.store {
            coordinator::create(
                store.as_ref(),
                kvlab_ring::DEFAULT_VNODES,
                nodes.site.replicas.max(1),
                kvlab_cluster::CopyWritePolicy::All,
                addrs.iter().map(|(a, _)| a.to_string()).collect(),
            )?;
            nodes.copy_topology()?;
        }
        let me = &nodes;
        let started = start_all(&addrs, |a| me.spawn(a));
        for node in started {
            nodes.nodes.push(node?);
        }
        if kind == Kind::Kvlab {
            let plain: Vec<SocketAddr> = addrs.iter().map(|(a, _)| *a).collect();
            wait_for_ring(&plain, n)?;
        }
        Ok(nodes)
    }

    /// The part's directory on host `host` (made if missing).
    fn remote_dir(&self, pl: &Placement, host: &str) -> anyhow::Result<String> {
        let part = self
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "ring".into());
        let d = format!("{}/{part}", pl.run_dir(host)?);
        pl.run(
            host,
            "making the part's directory",
            &format!("mkdir -p {}", kvlab_hosts::quote(&d)),
        )?;
        Ok(d)
    }

    /// The topology file, copied to each node host's part directory (a ring on hosts
    /// over a file does not change: see [`super::RingSpec::etcd_at`]); nothing to copy with
    /// etcd.
    fn copy_topology(&self) -> anyhow::Result<()> {
        let Some((pl, hosts)) = &self.site.hosts else {
            return Ok(());
        };
        if self.site.etcd.is_some() {
            return Ok(());
        }
        let text = std::fs::read_to_string(&self.topology)
            .with_context(|| format!("reading {}", self.topology))?;
        let mut done: Vec<&String> = Vec::new();
        for h in hosts {
            if done.contains(&h) {
                continue;
            }
            done.push(h);
            let d = self.remote_dir(pl, h)?;
            pl.write(h, &format!("{d}/topology.json"), &text)?;
        }
        Ok(())
    }

    /// A new node's address (and its host, when placed): a free loopback port, a
    /// namespace of its own, or a free port on its host.
    fn next_addr(&mut self) -> anyhow::Result<(SocketAddr, Option<usize>)> {
        let i = self.placed;
        self.placed += 1;
        if let Some((pl, hosts)) = &self.site.hosts {
            let h = &hosts[i % hosts.len()];
            let port = pl.free_ports(h, 1)?[0];
            let addr: SocketAddr = format!("{}:{port}", pl.address(h)?)
                .parse()
                .with_context(|| format!("host {h}: its address is not an IP address"))?;
            return Ok((addr, Some(i % hosts.len())));
        }
        match &self.site.net {
            Some(net) => {
                let h = net.new_node_host().map_err(anyhow::Error::msg)?;
                Ok((SocketAddr::new(IpAddr::V4(net.ip(h)), NETNS_PORT), None))
            }
            None => Ok((
                SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), free_ports(1)?[0]),
                None,
            )),
        }
    }

    /// The arguments (after the program) of the node at `addr` whose topology and data
    /// live under `base`; and its program (kvlab, or memcached).
    fn argv(&self, addr: SocketAddr, base: &str, root: bool) -> Vec<String> {
        let name = addr.to_string();
        match self.kind {
            Kind::Kvlab => {
                let data = format!("{base}/data/node-{}", tag(addr));
                let topology = match self.site.etcd {
                    Some(_) => self.topology.clone(),
                    None => format!("{base}/topology.json"),
                };
                let data: &[&OsStr] = match self.site.durable {
                    true => &[OsStr::new("--data-dir"), OsStr::new(&data)],
                    false => &[],
                };
                NodeCommand::node(addr.ip(), addr.port(), &topology, &name)
                    .args(data)
                    .args(&self.args)
                    .to_args()
                    .into_iter()
                    .map(|a| a.to_string_lossy().into_owned())
                    .collect()
            }
            Kind::Memcached => {
                let mut v: Vec<String> = vec![
                    "-l".into(),
                    addr.ip().to_string(),
                    "-p".into(),
                    addr.port().to_string(),
                    "-U".into(),
                    "0".into(),
                ];
                v.extend(self.args.iter().cloned());
                if root {
                    v.extend(["-u".into(), "root".into()]);
                }
                v
            }
        }
    }

    /// Starts the node at `addr` (in its namespace or on its host, if it has one) and waits
    /// until it answers.
    fn spawn(&self, (addr, host): (SocketAddr, Option<usize>)) -> anyhow::Result<Node> {
        let name = addr.to_string();
        let tag = format!("{}-{}", self.kind.name(), name.replace([':', '.'], "-"));
        if let (Some((pl, hosts)), Some(h)) = (&self.site.hosts, host) {
            let h = &hosts[h];
            let base = self.remote_dir(pl, h)?;
            let mut argv = vec![match self.kind {
                Kind::Kvlab => pl.kvlab(h)?,
                Kind::Memcached => "memcached".into(),
            }];
            argv.extend(self.argv(addr, &base, pl.is_root(h)));
            let p = pl.start(h, &tag, &argv)?;
            if let Err(e) = kvlab_process::wait_ready(&Probe::Version(addr), READY) {
                // Its log's last lines say why, when it exited (a bad flag, a port taken).
                let tail = pl
                    .run(
                        h,
                        "reading the node's log",
                        &format!("tail -n 5 {}", kvlab_hosts::quote(&p.log)),
                    )
                    .unwrap_or_default();
                let tail = match tail.trim() {
                    "" => String::new(),
                    t => format!("; its log ({} there) ends: {t}", p.log),
                };
                return Err(e)
                    .with_context(|| format!("host {h}: node {name} does not answer{tail}"));
            }
            return Ok(Node {
                name,
                addr,
                process: Proc::Remote(p),
            });
        }
        let base = self.dir.display().to_string();
        let program: &OsStr = match self.kind {
            Kind::Kvlab => self.bin.as_os_str(),
            Kind::Memcached => OsStr::new("memcached"),
        };
        let mut cmd = match (&self.site.net, addr.ip()) {
            (Some(net), IpAddr::V4(ip)) => {
                let h = u32::from(ip.octets()[3]).saturating_sub(10);
                Spawn::new("ip").args(net.exec_args(h)).arg(program)
            }
            _ => Spawn::new(program),
        };
        cmd = cmd
            .output(Output::File(
                self.dir.join("logs").join(format!("node-{tag}.log")),
            ))
            .args(self.argv(addr, &base, crate::system::is_root()))
            .ready(Probe::Version(addr))
            .timeout(READY);
        let process = cmd
            .start()
            .with_context(|| format!("starting node {name}"))?;
        Ok(Node {
            name,
            addr,
            process: Proc::Local(process),
        })
    }

    /// The nodes' addresses.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(|n| n.addr).collect()
    }

    /// Which system they are.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    fn store(&self) -> anyhow::Result<&dyn TopologyStore> {
        match &self.store {
            Some(s) => Ok(s.as_ref()),
            None => bail!("{} nodes have no topology", self.kind.name()),
        }
    }

    /// The ring's nodes, sorted.
    pub fn ring(&self) -> Vec<String> {
        match &self.store {
            Some(s) => sorted_nodes(s.as_ref()),
            None => {
                let mut v: Vec<String> = self.nodes.iter().map(|n| n.name.clone()).collect();
                v.sort();
                v
            }
        }
    }

    /// Starts a node (timed: the seconds it took; on a host, the next of the node hosts
    /// in turn) and adds it (a migration).
    pub fn add(&mut self) -> anyhow::Result<(String, f64, MigrationReport, f64)> {
        self.store()?;
        if self.site.hosts.is_some() && self.site.etcd.is_none() {
            bail!("nodes on hosts join a running ring only with topology = \"etcd\"");
        }
        let t = std::time::Instant::now();
        let addr = self.next_addr()?;
        let node = self.spawn(addr)?;
        let name = node.name.clone();
        self.nodes.push(node);
        let start_s = t.elapsed().as_secs_f64();
        let t = std::time::Instant::now();
        let m = coordinator::add(self.store()?, &name, &mut |_| {})?;
        Ok((name, start_s, m, t.elapsed().as_secs_f64()))
    }

    /// Removes node `name` (a migration from it; timed), then stops it (on a host: its
    /// log brought back, its data removed there; an error if it still runs).
    pub fn remove(&mut self, name: &str) -> anyhow::Result<(MigrationReport, f64)> {
        let t = std::time::Instant::now();
        let m = coordinator::remove(self.store()?, name, &mut |_| {})?;
        let s = t.elapsed().as_secs_f64();
        let Some(i) = self.nodes.iter().position(|n| n.name == name) else {
            return Ok((m, s));
        };
        let node = self.nodes.remove(i);
        if let (Proc::Remote(p), Some((pl, _))) = (&node.process, &self.site.hosts) {
            pl.stop(p, &self.dir.join("logs").join(format!("{}.log", p.name)));
            if pl.remote(&p.host)?.running(p)? {
                bail!("node {name} still runs on host {} after its stop", p.host);
            }
            let data = format!(
                "{}/data/node-{}",
                self.remote_dir(pl, &p.host)?,
                tag(node.addr)
            );
            pl.run(
                &p.host,
                "removing the node's data",
                &format!("rm -rf {}", kvlab_hosts::quote(&data)),
            )?;
        }
        Ok((m, s))
    }

    /// The host of node `name`, when it runs on one.
    pub fn host_of(&self, name: &str) -> Option<String> {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .and_then(|n| match &n.process {
                Proc::Remote(p) => Some(p.host.clone()),
                Proc::Local(_) => None,
            })
    }

    /// `kill -9` of node `name` (a crash): here, its process; on a host, through the
    /// placement (SIGKILL to the placed process there). It stays among the nodes: its log
    /// comes back when they stop.
    pub fn kill(&mut self, name: &str) -> anyhow::Result<()> {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.name == name)
            .with_context(|| format!("no node {name} was started"))?;
        match &mut node.process {
            Proc::Local(p) => {
                p.kill();
                Ok(())
            }
            Proc::Remote(p) => match &self.site.hosts {
                Some((pl, _)) => pl.kill(p),
                None => bail!("node {name} runs on host {} with no placement", p.host),
            },
        }
    }

    /// The nodes placed on hosts, as a raw run names them (host, pid, namespace).
    pub fn placed(&self) -> Vec<crate::placement::PlacedProcess> {
        let Some((pl, _)) = &self.site.hosts else {
            return Vec::new();
        };
        self.remote().iter().map(|p| pl.described(p)).collect()
    }

    /// Node `name`'s process, as a raw run names it, when it runs on a host.
    pub fn placed_node(&self, name: &str) -> Option<crate::placement::PlacedProcess> {
        let (pl, _) = self.site.hosts.as_ref()?;
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .and_then(|n| match &n.process {
                Proc::Remote(p) => Some(pl.described(p)),
                Proc::Local(_) => None,
            })
    }

    /// The processes placed on hosts.
    pub fn remote(&self) -> Vec<Started> {
        self.nodes
            .iter()
            .filter_map(|n| match &n.process {
                Proc::Remote(p) => Some(p.clone()),
                Proc::Local(_) => None,
            })
            .collect()
    }

    /// Every local node's CPU time so far, seconds (`None` for a node on a host: read
    /// through the placement).
    pub fn local_cpu_s(&self) -> Vec<Option<f64>> {
        let hz = kvlab_procfs::clock_ticks_per_second().max(1) as f64;
        self.nodes
            .iter()
            .map(|n| match &n.process {
                Proc::Local(p) => Some(
                    kvlab_procfs::read_proc_stat(p.pid())
                        .map_or(0.0, |s| s.cpu_ticks() as f64 / hz),
                ),
                Proc::Remote(_) => None,
            })
            .collect()
    }
}

impl Drop for Nodes {
    /// Local nodes stop as their processes drop; nodes on hosts are stopped here, their
    /// logs brought back to `logs/` and their data removed from the host.
    fn drop(&mut self) {
        let Some((pl, _)) = &self.site.hosts else {
            return;
        };
        for n in &self.nodes {
            if let Proc::Remote(p) = &n.process {
                pl.stop(p, &self.dir.join("logs").join(format!("{}.log", p.name)));
            }
        }
        if self.kind == Kind::Kvlab {
            let mut done: Vec<String> = Vec::new();
            for p in self.remote() {
                if done.contains(&p.host) {
                    continue;
                }
                if let Ok(d) = self.remote_dir(pl, &p.host) {
                    let _ = pl.run(
                        &p.host,
                        "removing the nodes' data",
                        &format!("rm -rf {}", kvlab_hosts::quote(&format!("{d}/data"))),
                    );
                }
                done.push(p.host);
            }
        }
    }
}

/// Starts one node per address at once (one after the other, many nodes — durable ones
/// above all — take a while to start): each's outcome, in order.
pub(crate) fn start_all<A: Copy + Send, T: Send>(
    addrs: &[A],
    start: impl Fn(A) -> anyhow::Result<T> + Sync,
) -> Vec<anyhow::Result<T>> {
    std::thread::scope(|s| {
        let start = &start;
        let handles: Vec<_> = addrs.iter().map(|&a| s.spawn(move || start(a))).collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("starting a node panicked")))
            })
            .collect()
    })
}

/// The nodes of the ring `store` holds, sorted (none if it holds none or cannot be read).
pub(crate) fn sorted_nodes(store: &dyn TopologyStore) -> Vec<String> {
    store
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

/// Waits (up to 20 s) until every node serves a ring of `nodes` nodes: each has taken up
/// the topology just created.
pub(crate) fn wait_for_ring(seeds: &[SocketAddr], nodes: usize) -> anyhow::Result<()> {
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

/// An experiment's hosts connected and prepared (none when no role names one): kvlab
/// shipped, the run directories made, and each host checked for the programs `needs` says
/// its roles run there (etcd on its host, memcached on the node hosts) before anything
/// starts.
pub(crate) fn open_placement(
    hosts: &[kvlab_hosts::Host],
    ssh: &crate::spec::SshSpec,
    bin: &Path,
    out: &Path,
    logs: &Path,
    needs: &[(&str, Vec<&str>)],
) -> anyhow::Result<Option<Arc<Placement>>> {
    std::fs::create_dir_all(logs)?;
    let roles = Roles {
        hosts,
        pools: &[],
        ssh,
        systems: &[],
        exit_on_interrupt: true,
    };
    let pl = Placement::open_hosts(&roles, Some(bin), &crate::placement::run_name(out), logs)?;
    let Some(pl) = pl else { return Ok(None) };
    if !needs.is_empty() {
        pl.check_tools(needs)
            .context("before any run: the hosts' tools")?;
    }
    Ok(Some(pl))
}

/// A node's address as its files name it (`10-0-0-5-21000`).
fn tag(addr: SocketAddr) -> String {
    addr.to_string().replace([':', '.'], "-")
}

/// The etcd cluster a part's ring lives in: the part's directory's name (`scale`,
/// `throughput-2`), one etcd serving every ring of the run.
fn cluster_name(dir: &Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "ring".into())
}

/// A network of namespaces for this run, named after this process, on the first of a few
/// subnets that is free here.
pub(crate) fn make_net(dir: &Path) -> anyhow::Result<Net> {
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
