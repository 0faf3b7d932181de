//! kvlab's test scaffolding, a dev-dependency only: Debian's `memcached` started on a free
//! 127.0.0.1 port (through `kvlab-process`) as the reference, the [`wire`] table, and
//! [`hosts`]: network namespaces with an sshd each, the multi-host tests' machines.

#![deny(missing_docs)]

pub mod hosts;
pub mod wire;

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

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

/// The kvlab executable for a test that runs it: `$KVLAB_BIN`, else `target/<profile>/kvlab`,
/// built by cargo (a no-op when it is fresh). The calling test binary runs as
/// `target/<profile>/deps/NAME-HASH`; the executable is built beside `deps/`, in the same
/// profile.
pub fn kvlab_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("KVLAB_BIN").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("the test's own path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("a test binary under target/<profile>/deps")
        .to_path_buf();
    let mut build = Command::new(env!("CARGO"));
    build
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["build", "--quiet", "-p", "kvlab", "--bin", "kvlab"]);
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        build.arg("--release");
    }
    let status = build.status().expect("running cargo build");
    assert!(status.success(), "cargo build -p kvlab failed: {status}");
    let bin = profile_dir.join("kvlab");
    assert!(bin.is_file(), "no kvlab at {}", bin.display());
    bin
}
