//! Test support: start Debian's `memcached` on a free 127.0.0.1 port and wait until it
//! answers. Used by this workspace's integration tests and benchmarks; not for production.

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::Client;

/// A memcached child process, killed on drop.
pub struct Memcached {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
}

impl Memcached {
    /// Starts `/usr/bin/memcached` (or `$MEMCACHED`) with `threads` worker threads on a free
    /// 127.0.0.1 port, and returns once a `version` request is answered (at most 10 s).
    pub fn start(threads: usize) -> io::Result<Self> {
        let bin = std::env::var("MEMCACHED").unwrap_or_else(|_| "/usr/bin/memcached".into());
        // Ask the kernel for a free port, then hand it to memcached. Another process could
        // take it in between; then the readiness probe fails with a clear error.
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new(&bin)
            .args(["-l", "127.0.0.1", "-U", "0", "-m", "256", "-c", "4096"])
            // `-u` matters only when run as root (as in CI), where memcached insists on it.
            .args(["-u", "nobody"])
            .args(["-p", &port.to_string(), "-t", &threads.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot start {bin}: {e}")))?;
        let mut m = Memcached {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        };
        m.wait_ready(Duration::from_secs(10))?;
        Ok(m)
    }

    /// Probes with `version` until it answers; fails if the process exits or time runs out.
    fn wait_ready(&mut self, limit: Duration) -> io::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Err(io::Error::other(format!("memcached exited: {status}")));
            }
            if let Ok(mut c) = Client::connect(self.addr, Duration::from_millis(200)) {
                if c.version().is_ok() {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "memcached not ready",
                ));
            }
            std::thread::yield_now();
        }
    }
}

impl Drop for Memcached {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
