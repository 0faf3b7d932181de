//! Test support: start Debian's `memcached` on a free 127.0.0.1 port and wait until it
//! answers (through [`crate::process`]). Used by this workspace's integration tests and
//! benchmarks; not for production.

pub mod wire;

use std::io;
use std::net::SocketAddr;

use crate::process::{self, Output, Probe, Process, Spawn, SpawnError};

/// A memcached child process, stopped on drop.
pub struct Memcached {
    /// The process (its pid, its stop).
    pub process: Process,
    /// Where it listens.
    pub addr: SocketAddr,
}

impl Memcached {
    /// The memcached program: `$MEMCACHED`, else `/usr/bin/memcached`.
    pub fn program() -> String {
        std::env::var("MEMCACHED").unwrap_or_else(|_| "/usr/bin/memcached".into())
    }

    /// Starts memcached with `threads` worker threads, 256 MB and 4096 connections on a free
    /// 127.0.0.1 port, and returns once a `version` request is answered (at most 10 s).
    pub fn start(threads: usize) -> io::Result<Self> {
        let threads = threads.to_string();
        Self::start_with(&["-m", "256", "-c", "4096", "-t", &threads]).map_err(io::Error::other)
    }

    /// Starts memcached with `args` (after `-U 0 -l 127.0.0.1 -p PORT -u root`) on a free
    /// 127.0.0.1 port, and returns once a `version` request is answered (at most 10 s).
    pub fn start_with(args: &[&str]) -> Result<Self, SpawnError> {
        let port = process::free_port().map_err(|source| SpawnError::Io {
            what: "finding a free port".into(),
            source,
        })?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let process = Spawn::new(Self::program())
            .args(["-U", "0", "-l", "127.0.0.1", "-p", &port.to_string()])
            // `-u` matters only when run as root (as in CI), where memcached insists on it.
            .args(["-u", "root"])
            .args(args)
            .output(Output::Inherit)
            // With `-Y` it answers only `CLIENT_ERROR unauthenticated` until a login.
            .ready(
                if args.contains(&"-Z") || args.windows(2).any(|a| a == ["-B", "binary"]) {
                    // TLS: a plaintext `version` gets no reply; `-B binary`: neither.
                    Probe::Connects(addr)
                } else if args.contains(&"-Y") {
                    Probe::Answers(addr)
                } else {
                    Probe::Version(addr)
                },
            )
            .start()?;
        Ok(Memcached { process, addr })
    }
}

/// Debian's `etcd` (v3) on free 127.0.0.1 ports with a data directory of its own, stopped
/// on drop (the directory is the caller's to remove).
pub struct Etcd {
    /// The process.
    pub process: Process,
    /// Its client address.
    pub addr: SocketAddr,
}

impl Etcd {
    /// The etcd program: `$ETCD`, else `/usr/bin/etcd`.
    pub fn program() -> String {
        std::env::var("ETCD").unwrap_or_else(|_| "/usr/bin/etcd".into())
    }

    /// Starts a one-member etcd keeping its data in `dir`, and returns once `GET /health`
    /// answers `200` (at most 15 s).
    pub fn start(dir: &std::path::Path) -> Result<Self, SpawnError> {
        let ports = process::free_ports(2).map_err(|source| SpawnError::Io {
            what: "finding free ports".into(),
            source,
        })?;
        let addr = SocketAddr::from(([127, 0, 0, 1], ports[0]));
        let client = format!("http://{addr}");
        let peer = format!("http://127.0.0.1:{}", ports[1]);
        let process = Spawn::new(Self::program())
            .arg("--data-dir")
            .arg(dir.as_os_str())
            .args(["--name", "kvlab"])
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &format!("kvlab={peer}")])
            .timeout(std::time::Duration::from_secs(15))
            .ready(Probe::HttpGetPath(addr, "/health"))
            .start()?;
        Ok(Etcd { process, addr })
    }

    /// The `--cluster`/`--topology` spelling of a cluster `name` in this etcd.
    pub fn spec(&self, name: &str) -> String {
        format!("etcd://{}/{name}", self.addr)
    }
}
