//! The storage ring's etcd, when the rings' topologies live in one (`topology = "etcd"`):
//! here on 127.0.0.1 ([`kvlab_process::Etcd`]: every node runs here), or a one-member etcd
//! started through the placement on a host — `etcd_host`, or by default the lab's own
//! machine as the table's `local = true` host whose `address` the node hosts reach it at —
//! listening on that host's address. Every ring of the run is a cluster of its own in it
//! (`etcd://ADDR/PART`), shared by its nodes on every host and the lab's coordinator; it is
//! started before the first ring and stopped after the last, its data removed.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use kvlab_hosts::Started;
use kvlab_process::{Etcd, Probe};

use super::EtcdAt;
use crate::placement::{PlacedProcess, Placement};

/// How long etcd has to answer `GET /health` once started.
const READY: Duration = Duration::from_secs(15);

/// The run's etcd (stopped when dropped).
pub(super) enum RingEtcd {
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

impl RingEtcd {
    /// Starts the etcd `at` says (none for a topology file); returns once it answers.
    pub fn start(
        at: &EtcdAt,
        placement: Option<&Arc<Placement>>,
        out: &Path,
        logs: &Path,
    ) -> anyhow::Result<Option<RingEtcd>> {
        let host = match at {
            EtcdAt::None => return Ok(None),
            EtcdAt::Here => {
                let dir = out.join("etcd");
                let etcd =
                    Etcd::start(&dir).context("starting etcd (apt-get install etcd-server)")?;
                eprintln!("etcd: here at {}", etcd.addr);
                return Ok(Some(RingEtcd::Here {
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
        let etcd = RingEtcd::Placed {
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
            RingEtcd::Here { etcd, .. } => etcd
                .as_ref()
                .map_or(SocketAddr::from(([127, 0, 0, 1], 0)), |e| e.addr),
            RingEtcd::Placed { addr, .. } => *addr,
        }
    }

    /// What the report says of it: `etcd ADDR, here` or `etcd ADDR on host H`.
    pub fn describe(&self) -> String {
        match self {
            RingEtcd::Here { .. } => format!("etcd {}, here", self.addr()),
            RingEtcd::Placed { process, addr, .. } => {
                format!("etcd {addr} on host {}", process.host)
            }
        }
    }

    /// Where it ran, when on a host.
    pub fn placed(&self) -> Option<PlacedProcess> {
        match self {
            RingEtcd::Here { .. } => None,
            RingEtcd::Placed { pl, process, .. } => Some(pl.described(process)),
        }
    }
}

impl Drop for RingEtcd {
    /// Stops it (on a host, its log brought back) and removes its data.
    fn drop(&mut self) {
        match self {
            RingEtcd::Here { etcd, dir } => {
                drop(etcd.take()); // stops it
                let _ = std::fs::remove_dir_all(dir);
            }
            RingEtcd::Placed {
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
