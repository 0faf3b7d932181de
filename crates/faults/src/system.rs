//! The system under test, started by shelling out to the kvlab binary: cluster nodes
//! (`kvlab server --cluster`, a process each), the topology store (a file, or an etcd of
//! one or more members on free 127.0.0.1 ports), optionally `kvlab proxy --cluster` in
//! front, and coordinators (`kvlab cluster add|remove|resume|abort`, a process each, so one
//! can be killed mid-migration). Everything it starts is stopped by [`System::shutdown`]
//! (also on drop), whatever state it was left in: paused nodes are continued first.
//!
//! ```text
//!  System ── nodes: name → slot (port, process, Up │ Paused │ Down │ Stopped, busy)
//!         ├─ etcd members (process, ports, data dir)      ┐ the nemesis's lanes act on
//!         ├─ coordinators running (id → child process)    │ these through &System; every
//!         └─ proxy                                        ┘ map is behind its own lock
//! ```

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kvlab_client::process::{free_port, free_ports, wait_ready, Output, Probe, Process, Spawn};
use kvlab_client::Client;
use kvlab_cluster::coordinator::node_status;
use kvlab_cluster::{open_store, Topology, TopologyStore};
use parking_lot::Mutex;

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
    /// Where the topology lives.
    pub topology: TopologyKind,
    /// Start `kvlab proxy --cluster` in front.
    pub proxy: bool,
    /// Flags for every node's `kvlab server`.
    pub server_args: Vec<String>,
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
    port: u16,
    process: Option<Process>,
    state: NodeState,
    /// A fault or a membership change is acting on it.
    busy: bool,
    /// Times started (names its log files).
    starts: u32,
}

struct Member {
    name: String,
    client: SocketAddr,
    args: Vec<String>,
    process: Option<Process>,
    starts: u32,
}

/// How long a coordinator may run before it is killed and reported stuck (a migration
/// that makes no progress for 60 s fails by itself).
pub const COORDINATOR_TIMEOUT: Duration = Duration::from_secs(90);

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
}

fn addr_of(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn name_of(port: u16) -> String {
    format!("127.0.0.1:{port}")
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
        let ports = free_ports(cfg.nodes + 1).map_err(|e| format!("free ports: {e}"))?;
        let (etcd, spec) = match cfg.topology {
            TopologyKind::File => (
                Vec::new(),
                cfg.dir.join("topology.json").display().to_string(),
            ),
            TopologyKind::Etcd { members } => {
                let dir = cfg.dir.join("etcd");
                std::fs::create_dir_all(&dir)
                    .map_err(|e| format!("creating {}: {e}", dir.display()))?;
                start_etcd(&dir, members)?
            }
        };
        let mut sys = System {
            store: open_store(&spec).map_err(|e| e.to_string())?,
            spec,
            nodes: Mutex::new(BTreeMap::new()),
            etcd: Mutex::new(etcd),
            proxy: Mutex::new(None),
            proxy_addr: cfg.proxy.then(|| addr_of(ports[cfg.nodes])),
            coordinators: Mutex::new(HashMap::new()),
            next_coordinator: AtomicU64::new(0),
            migrations: Mutex::new(()),
            cfg,
        };
        let names: Vec<String> = ports[..sys.cfg.nodes].iter().map(|&p| name_of(p)).collect();
        // The topology first: a node reads it when it starts.
        kvlab_cluster::coordinator::create(
            sys.store.as_ref(),
            kvlab_client::cluster::DEFAULT_VNODES,
            sys.cfg.replicas,
            names,
        )
        .map_err(|e| format!("creating the cluster: {e}"))?;
        for &port in &ports[..sys.cfg.nodes] {
            sys.launch(port)?;
        }
        if let Some(addr) = sys.proxy_addr {
            let p = Spawn::new(&sys.cfg.exe)
                .args(["proxy", "-l", "127.0.0.1", "-t", "2"])
                .args(["-p".to_string(), addr.port().to_string()])
                .args(["--cluster".to_string(), name_of(ports[0])])
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
        self.nodes
            .lock()
            .values()
            .map(|s| addr_of(s.port))
            .collect()
    }

    /// Nodes started and not stopped for good.
    pub fn live_nodes(&self) -> usize {
        self.nodes
            .lock()
            .values()
            .filter(|s| s.state != NodeState::Stopped)
            .count()
    }

    /// Starts the node of `port` (first start, or restart) and records it `Up`.
    fn launch(&self, port: u16) -> Result<(), String> {
        let name = name_of(port);
        let starts = {
            let mut nodes = self.nodes.lock();
            let slot = nodes.entry(name.clone()).or_insert(NodeSlot {
                port,
                process: None,
                state: NodeState::Down,
                busy: false,
                starts: 0,
            });
            slot.starts += 1;
            slot.starts
        };
        let p = Spawn::new(&self.cfg.exe)
            .args(["server", "-l", "127.0.0.1"])
            .args(["-p".to_string(), port.to_string()])
            .args(["--cluster", &self.spec, "--cluster-node", &name])
            .args(&self.cfg.server_args)
            .output(Output::File(
                self.cfg
                    .dir
                    .join("nodes")
                    .join(format!("node-{port}.{starts}.log")),
            ))
            .grace(Duration::from_secs(2))
            .timeout(START_TIMEOUT)
            .ready(Probe::Version(addr_of(port)))
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
                return Err(format!("starting {name}: {e}"));
            }
        };
        let mut nodes = self.nodes.lock();
        if let Some(slot) = nodes.get_mut(&name) {
            slot.process = Some(p);
            slot.state = NodeState::Up;
        }
        Ok(())
    }

    /// Starts a new node on a free port (not in the ring yet); returns its name.
    pub fn start_node(&self) -> Result<String, String> {
        let port = free_port().map_err(|e| format!("a free port: {e}"))?;
        self.launch(port)?;
        Ok(name_of(port))
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

    /// Starts a killed node again on its port.
    pub fn restart(&self, name: &str) -> Result<(), String> {
        let port = {
            let nodes = self.nodes.lock();
            let slot = nodes.get(name).ok_or_else(|| format!("no node {name}"))?;
            if slot.state != NodeState::Down {
                return Err(format!("{name} is {:?}", slot.state));
            }
            slot.port
        };
        self.launch(port)
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
        let port = self
            .nodes
            .lock()
            .get(name)
            .map(|s| s.port)
            .ok_or_else(|| format!("no node {name}"))?;
        let mut c =
            Client::connect(addr_of(port), Duration::from_secs(2)).map_err(|e| e.to_string())?;
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
            m.process = Some(spawn_member(&dir, m)?);
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
        for m in self.etcd.lock().iter_mut() {
            if let Some(p) = m.process.take() {
                p.stop();
            }
        }
    }
}

impl Drop for System {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Starts an etcd of `members` members on free ports with data under `dir`; returns them
/// and the `etcd://…/faults` topology spec once every member answers `/health`.
fn start_etcd(dir: &Path, members: usize) -> Result<(Vec<Member>, String), String> {
    let members = members.max(1);
    let ports = free_ports(members * 2).map_err(|e| format!("free ports: {e}"))?;
    let peers: Vec<String> = (0..members)
        .map(|i| format!("m{i}=http://127.0.0.1:{}", ports[2 * i + 1]))
        .collect();
    let mut out = Vec::new();
    for i in 0..members {
        let client = addr_of(ports[2 * i]);
        let peer = format!("http://127.0.0.1:{}", ports[2 * i + 1]);
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
            args,
            process: None,
            starts: 1,
        };
        // Members start together: one alone has no quorum and never becomes healthy.
        m.process = Some(spawn_member(dir, &m)?);
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

fn spawn_member(dir: &Path, m: &Member) -> Result<Process, String> {
    let program = std::env::var("ETCD").unwrap_or_else(|_| "etcd".into());
    Spawn::new(program)
        .args(&m.args)
        .output(Output::File(
            dir.join(format!("{}.{}.log", m.name, m.starts)),
        ))
        .grace(Duration::from_secs(2))
        .start()
        .map_err(|e| format!("starting etcd {}: {e}", m.name))
}
