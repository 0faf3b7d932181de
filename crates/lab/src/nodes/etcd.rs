//! An experiment's etcd, when its clusters' topologies live in one (`topology = "etcd"`;
//! the storage ring's rings, the scaling kind's cluster):
//! here on 127.0.0.1 ([`kvlab_process::Etcd`]: every node runs here), or a one-member etcd
//! started through the placement on a host — `etcd_host`, or by default the lab's own
//! machine as the table's `local = true` host whose `address` the node hosts reach it at —
//! listening on that host's address. Every ring of the run is a cluster of its own in it
//! (`etcd://ADDR/PART`), shared by its nodes on every host and the lab's coordinator; it is
//! started before the first ring and stopped after the last, its data removed. Where it
//! runs is [`etcd_at`]'s choice.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use kvlab_hosts::Started;
use kvlab_process::{Etcd, Probe};

use crate::placement::{PlacedProcess, Placement};

/// How long etcd has to answer `GET /health` once started.
const READY: Duration = Duration::from_secs(15);

/// The run's etcd (stopped when dropped).
pub(crate) enum ClusterEtcd {
    /// Here, on loopback; its data in `dir`.
    Here { etcd: Option<Etcd>, dir: PathBuf },
    /// On a host.
    Placed {
        pl: Arc<Placement>,
        process: Started,
        addr: SocketAddr,
        /// Its data directory on the host.
        data: String,
        /// Where its log comes back to.
        log: PathBuf,
    },
}

impl ClusterEtcd {
    /// Starts the etcd `at` says (none for a topology file); returns once it answers.
    pub fn start(
        at: &EtcdAt,
        placement: Option<&Arc<Placement>>,
        out: &Path,
        logs: &Path,
    ) -> anyhow::Result<Option<ClusterEtcd>> {
        let host = match at {
            EtcdAt::None => return Ok(None),
            EtcdAt::Here => {
                let dir = out.join("etcd");
                let etcd =
                    Etcd::start(&dir).context("starting etcd (apt-get install etcd-server)")?;
                eprintln!("etcd: here at {}", etcd.addr);
                return Ok(Some(ClusterEtcd::Here {
                    etcd: Some(etcd),
                    dir,
                }));
            }
            EtcdAt::Host(h) => h,
        };
        let pl = placement
            .with_context(|| format!("etcd_host {host:?}: the hosts are not connected"))?;
        let ports = pl.free_ports(host, 2)?;
        let ip = pl.address(host)?;
        let at = |port: u16| -> anyhow::Result<SocketAddr> {
            format!("{ip}:{port}")
                .parse()
                .with_context(|| format!("host {host}: its address {ip:?} is not an IP address"))
        };
        let (addr, peer) = (at(ports[0])?, at(ports[1])?);
        let data = format!("{}/etcd", pl.run_dir(host)?);
        let mut argv = vec!["etcd".to_string()];
        argv.extend(Etcd::member_args(&data, addr, peer));
        let process = pl.start(host, "etcd", &argv)?;
        // Stopped (and its data removed) if it does not answer.
        let etcd = ClusterEtcd::Placed {
            pl: pl.clone(),
            process,
            addr,
            data,
            log: logs.join("etcd.log"),
        };
        kvlab_process::wait_ready(&Probe::HttpGetPath(addr, "/health"), READY)
            .with_context(|| format!("host {host}: etcd at {addr} does not answer"))?;
        eprintln!("etcd: on host {host} at {addr}");
        Ok(Some(etcd))
    }

    /// Its client address, as nodes and the coordinator reach it.
    pub fn addr(&self) -> SocketAddr {
        match self {
            ClusterEtcd::Here { etcd, .. } => etcd
                .as_ref()
                .map_or(SocketAddr::from(([127, 0, 0, 1], 0)), |e| e.addr),
            ClusterEtcd::Placed { addr, .. } => *addr,
        }
    }

    /// What the report says of it: `etcd ADDR, here` or `etcd ADDR on host H`.
    pub fn describe(&self) -> String {
        match self {
            ClusterEtcd::Here { .. } => format!("etcd {}, here", self.addr()),
            ClusterEtcd::Placed { process, addr, .. } => {
                format!("etcd {addr} on host {}", process.host)
            }
        }
    }

    /// Where it ran, when on a host.
    pub fn placed(&self) -> Option<PlacedProcess> {
        match self {
            ClusterEtcd::Here { .. } => None,
            ClusterEtcd::Placed { pl, process, .. } => Some(pl.described(process)),
        }
    }
}

impl Drop for ClusterEtcd {
    /// Stops it (on a host, its log brought back) and removes its data.
    fn drop(&mut self) {
        match self {
            ClusterEtcd::Here { etcd, dir } => {
                drop(etcd.take()); // stops it
                let _ = std::fs::remove_dir_all(dir);
            }
            ClusterEtcd::Placed {
                pl,
                process,
                data,
                log,
                ..
            } => {
                pl.stop(process, log);
                if let Err(e) = pl.run(
                    &process.host,
                    "removing etcd's data",
                    &format!("rm -rf {}", kvlab_hosts::quote(data)),
                ) {
                    eprintln!("note: {e:#}");
                }
            }
        }
    }
}

/// Where an experiment's etcd runs (see [`etcd_at`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EtcdAt {
    /// Nowhere: a topology file per ring.
    None,
    /// Here, on 127.0.0.1 (every node runs here).
    Here,
    /// On this host, through the placement, listening on its address.
    Host(String),
}

/// Whether `address` is this machine's loopback (nothing on another host reaches it).
fn loopback(address: &str) -> bool {
    address
        .parse::<std::net::IpAddr>()
        .map_or(address == "localhost", |ip| ip.is_loopback())
}

/// Where etcd runs when the topology lives in one: `etcd_host`; else, with nodes on hosts
/// (`node_hosts`), the table's first `local = true` host with an address other than
/// loopback (where the node hosts reach this machine); else here on 127.0.0.1. Refused: an
/// etcd the node hosts could not reach (on loopback while a node runs on another machine).
pub(crate) fn etcd_at(
    etcd_host: Option<&str>,
    node_hosts: &[String],
    hosts: &[kvlab_hosts::Host],
) -> anyhow::Result<EtcdAt> {
    let at = match etcd_host {
        Some(h) => {
            crate::spec::check_defined(hosts, "etcd_host", h)?;
            h.to_string()
        }
        None if node_hosts.is_empty() => return Ok(EtcdAt::Here),
        None => hosts
            .iter()
            .find(|h| h.is_local() && h.listen.as_deref().is_some_and(|a| !loopback(a)))
            .map(|h| h.name.clone())
            .context(
                "topology = \"etcd\" with node_hosts: etcd runs here unless etcd_host names \
                     a host, and the nodes on hosts must reach it — add a [[host]] with local = \
                     true and address = the address the node hosts reach this machine at (e.g. \
                     its address on their bridge), or set etcd_host = \"NAME\"",
            )?,
    };
    let host = hosts
        .iter()
        .find(|h| h.name == at)
        .with_context(|| format!("etcd_host: host {at:?} is not defined"))?;
    if loopback(host.address()) {
        let elsewhere = node_hosts.iter().find(|n| {
            hosts
                .iter()
                .find(|h| &h.name == *n)
                .is_some_and(|h| !h.is_local())
        });
        if let Some(n) = elsewhere {
            bail!(
                "etcd on host {at:?} would listen on {}, which node host {n:?} cannot reach: \
                     give host {at:?} the address the other hosts reach it at (address = \"…\")",
                host.address()
            );
        }
    }
    Ok(EtcdAt::Host(at))
}
