//! The topology's etcd: its members started together (on free ports, or each in a
//! namespace of its own), killed and restarted by the nemesis.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kvlab_process::{free_ports, wait_ready, Output, Probe, Process};

use super::{addr_in, addr_of, spawn_in, Member, System, NETNS_ETCD_PORTS, START_TIMEOUT};
use crate::netns::{Net, ETCD_HOST};

impl System {
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
}

/// Starts an etcd of `members` members (on free ports, or each in a namespace of its own
/// with `net`) with data under `dir`; returns them and the `etcd://…/faults` topology spec
/// once every member answers `/health`.
pub(super) fn start_etcd(
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
