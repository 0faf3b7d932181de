//! The nodes: started fresh or again over their data directory, claimed by one fault at a
//! time, paused, continued, killed, restarted, stopped for good, flushed.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use kvlab_client::Client;
use kvlab_cluster::NodeCommand;
use kvlab_process::{free_port, Output, Probe, Process};

use super::{
    addr_in, addr_of, NodeSlot, NodeState, System, ADDRESS_TAKEN, NETNS_PORT, START_TIMEOUT,
};

impl System {
    /// Starts the node of `addr` (a `fresh` start, or a restart; in host `host`'s namespace
    /// if it has one) and records it `Up`. A durable node started fresh gets a new data
    /// directory; restarted, it opens the one it had.
    pub(super) fn launch(
        &self,
        addr: SocketAddr,
        host: Option<u32>,
        fresh: bool,
    ) -> Result<(), String> {
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
}
