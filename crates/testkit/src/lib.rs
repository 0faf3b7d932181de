//! kvlab's test scaffolding, a dev-dependency only: Debian's `memcached` started on a free
//! 127.0.0.1 port (through `kvlab-process`) as the reference, the [`wire`] table, and
//! [`hosts`]: network namespaces with an sshd each, the multi-host tests' machines.

#![deny(missing_docs)]

pub mod hosts;
pub mod wire;

use std::io;
use std::net::SocketAddr;

use kvlab_process::{Output, Probe, Process, Spawn, SpawnError};

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
        let port = kvlab_process::free_port().map_err(|source| SpawnError::Io {
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
