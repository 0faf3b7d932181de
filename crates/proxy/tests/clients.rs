//! Real clients through the proxy in front of three kvlab backends: pymemcache (PyPI) and
//! memccapable (Debian libmemcached-tools), sharded and fully replicated, under both thread
//! models. `.ci/run` installs both clients; a missing one fails the test with a clear message.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::process::Command;

use kvlab_proxy::config::parse_backend;
use kvlab_proxy::{Proxy, ProxyConfig, ProxyIo, ProxyOptions};
use kvlab_server::{Server, ServerConfig};

fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Three kvlab backends and, for each setup, a proxy in front of them.
fn setups(mut f: impl FnMut(&str, SocketAddr)) {
    let backends: Vec<Server> = (0..3)
        .map(|_| {
            Server::start(ServerConfig {
                listen: SocketAddr::from(([127, 0, 0, 1], 0)),
                threads: 2,
                crawler: None,
                ..ServerConfig::default()
            })
            .expect("kvlab server starts")
        })
        .collect();
    for (name, replicas, io) in [
        ("sharded, reactor", 1, ProxyIo::Reactor),
        ("sharded, epoll", 1, ProxyIo::Epoll),
        ("replicated R=3, reactor", 3, ProxyIo::Reactor),
    ] {
        let mut config = ProxyConfig::new(
            backends
                .iter()
                .map(|s| parse_backend(&s.addr().to_string()).unwrap())
                .collect(),
        );
        config.workers = 2;
        config.pools[0].replicas = replicas;
        let mut options = ProxyOptions::new(SocketAddr::from(([127, 0, 0, 1], 0)));
        options.io = io;
        let proxy = Proxy::start(config, options).expect("proxy starts");
        f(name, proxy.addr());
    }
}

#[test]
fn pymemcache_round_trips_every_command_through_the_proxy() {
    setups(|name, addr| {
        let out = Command::new("python3")
            .arg(repo_root().join("tests/python/pymemcache_roundtrip.py"))
            .arg(addr.port().to_string())
            .arg("--proxy")
            .output()
            .expect("python3 runs");
        assert!(
            out.status.success(),
            "{name}: pymemcache round trip failed (is pymemcache installed? .ci/run does it)\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    });
}

#[test]
fn memccapable_passes_every_ascii_test_through_the_proxy() {
    setups(|name, addr| {
        let out = Command::new("memccapable")
            .args(["-a", "-h", "127.0.0.1", "-p", &addr.port().to_string()])
            .output()
            .expect("memccapable runs (Debian libmemcached-tools; .ci/run installs it)");
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && text.contains("All tests passed") && !text.contains("[FAIL]"),
            "{name}:\n{text}"
        );
    });
}
