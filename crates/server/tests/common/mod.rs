//! Helpers shared by the server's integration tests: start a kvlab server on 127.0.0.1:0,
//! talk raw bytes. (A reference memcached: `kvlab_client::testing::Memcached`.)

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use kvlab_server::{IoModel, Server, ServerConfig};
use kvlab_store::ManualClock;

/// The manual clock's start: a fixed, realistic Unix time.
pub const T0: u64 = 1_800_000_000;

pub fn start(io: IoModel, tweak: impl FnOnce(&mut ServerConfig)) -> (Server, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(T0));
    let mut config = ServerConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        threads: 2,
        io,
        clock: clock.clone(),
        // Off unless a test turns it on: the crawler would race the tests that
        // watch a get find an expired item (`get_expired`, `mg` stale/win).
        crawler: None,
        ..ServerConfig::default()
    };
    tweak(&mut config);
    (Server::start(config).expect("server starts"), clock)
}

pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    s.set_nodelay(true).expect("nodelay");
    s
}

/// Sends `req`, then reads until the reply ends with `until` (or EOF, or 5 s).
pub fn exchange(s: &mut TcpStream, req: &[u8], until: &[u8]) -> Vec<u8> {
    s.write_all(req).expect("write");
    read_until(s, until)
}

pub fn read_until(s: &mut TcpStream, until: &[u8]) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    while !got.ends_with(until) {
        match s.read(&mut buf) {
            Ok(0) => {
                got.extend_from_slice(b"<EOF>");
                break;
            }
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                got.extend_from_slice(b"<RESET>");
                break;
            }
            Err(_) => {
                got.extend_from_slice(b"<TIMEOUT>");
                break;
            }
        }
    }
    got
}
