//! Helpers shared by the server's integration tests: start a kvlab server on 127.0.0.1:0,
//! talk raw bytes. (A reference memcached: `kvlab_testkit::Memcached`.)

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use kvlab_server::{IoModel, Server, ServerConfig};
use kvlab_store::ManualClock;

/// A kvlab server of every I/O model, each started with `tweak`, with its model's name.
pub type EveryModel = Vec<(&'static str, (Server, Arc<ManualClock>))>;

/// Starts [`EveryModel`].
pub fn every_model(tweak: impl Fn(&mut ServerConfig)) -> EveryModel {
    IoModel::ALL
        .iter()
        .map(|&io| (io.name(), start(io, &tweak)))
        .collect()
}

/// `("memcached", memcached)` and each of `servers` by name: the servers a comparison asks
/// in turn.
pub fn beside_memcached(
    memcached: SocketAddr,
    servers: &EveryModel,
) -> Vec<(&'static str, SocketAddr)> {
    let mut addrs = vec![("memcached", memcached)];
    addrs.extend(servers.iter().map(|(n, (s, _))| (*n, s.addr())));
    addrs
}

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

#[allow(unused_imports)]
pub use kvlab_testkit::wire::{connect, exchange, read_until};
