//! The load generator over HTTP (kvlab's REST interface) against test servers and against
//! kvlab's own server.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::time::Duration;

use common::{closed, http_test_server, run, Faults};
use kvlab_bench::schedule::Arrival;
use kvlab_bench::workload::Mix;
use kvlab_bench::Protocol;

#[test]
fn closed_loop_over_http_pipelines_and_counts_every_request() {
    let addr = http_test_server(Faults::default());
    let mut cfg = closed(addr, 6000);
    cfg.protocol = Protocol::Http;
    cfg.depth = 16;
    cfg.load = true;
    // Keys that need percent-encoding: '/', '%', '?', '#' and non-ASCII bytes.
    cfg.workload.key_prefix = "a/b%c?d#é:".into();
    cfg.workload.key_size = kvlab_bench::dist::SizeDist::Fixed { n: 24 };
    cfg.workload.mix = Mix {
        get: 8,
        set: 1,
        delete: 1,
    };
    cfg.workload.multiget = 3;
    cfg.workload.verify = true;
    let r = run(&cfg);
    let c = r.counters;
    assert_eq!(
        r.load.map(|l| l.completed),
        Some(1000),
        "load PUTs every key"
    );
    assert_eq!(c.completed, 6000);
    assert_eq!(c.gets + c.sets + c.deletes, c.completed);
    assert_eq!(c.hits + c.misses, 3 * c.gets, "three GETs per multi-get");
    assert!(c.hits > 0 && c.misses > 0, "deletes make misses: {c:?}");
    assert_eq!(c.errors + c.timeouts, 0, "{:?} {:?}", r.notes, c);
    assert_eq!(r.latency.count, 6000);
}

#[test]
fn verify_over_http_catches_one_corrupted_value() {
    let addr = http_test_server(Faults {
        corrupt_hit: Some(700),
        ..Faults::default()
    });
    let mut cfg = closed(addr, 3000);
    cfg.protocol = Protocol::Http;
    cfg.load = true;
    cfg.workload.verify = true;
    cfg.workload.value_size = kvlab_bench::dist::SizeDist::Uniform { min: 10, max: 3000 };
    let r = run(&cfg);
    assert!(r.counters.hits > 2000, "{:?}", r.counters);
    assert_eq!(r.counters.verify_errors, 1, "{:?}", r.counters);
    assert_eq!(r.counters.errors, 1);
}

#[test]
fn open_loop_over_http_counts_planned_requests() {
    let addr = http_test_server(Faults::default());
    let mut cfg = closed(addr, 1);
    cfg.protocol = Protocol::Http;
    cfg.requests = None;
    cfg.depth = 64;
    cfg.open = Some(Arrival::Fixed);
    cfg.plan = kvlab_bench::schedule::RatePlan::fixed(2000.0, 1.0).unwrap();
    let r = run(&cfg);
    // Fixed arrivals: 2000 planned, at most one per connection off at the edges.
    assert!(
        (r.counters.planned as i64 - 2000).abs() <= 2,
        "{:?}",
        r.counters
    );
    // (Only a sanity bound: on a loaded machine the last requests may still be in flight.)
    assert!(r.counters.completed <= r.counters.planned && r.counters.completed > 1000);
    assert_eq!(r.counters.errors + r.counters.timeouts, 0);
}

#[test]
fn against_kvlab_server_rest_interface_with_verify() {
    let server = kvlab_server::Server::start(kvlab_server::ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        threads: 1,
        front_ends: vec![std::sync::Arc::new(kvlab_rest::Rest::on(
            "127.0.0.1:0".parse().unwrap(),
        ))],
        ..Default::default()
    })
    .unwrap();
    let http = kvlab_rest::rest_addr(&server).unwrap();
    let mut cfg = closed(http, 4000);
    cfg.protocol = Protocol::Http;
    cfg.depth = 8;
    cfg.load = true;
    cfg.workload.key_prefix = "k/%?é:".into();
    cfg.workload.key_size = kvlab_bench::dist::SizeDist::Fixed { n: 20 };
    cfg.workload.verify = true;
    cfg.workload.value_size = kvlab_bench::dist::SizeDist::Uniform { min: 10, max: 5000 };
    cfg.workload.mix = Mix {
        get: 7,
        set: 1,
        delete: 2,
    };
    // Single gets: multi-gets (pipelined GETs) currently meet the server's Nagle delay
    // (~40 ms per request) because its listener does not set TCP_NODELAY.
    let r = run(&cfg);
    let c = r.counters;
    assert_eq!(r.load.map(|l| l.completed), Some(1000));
    assert_eq!(c.completed, 4000);
    assert!(c.hits > 0 && c.misses > 0 && c.deletes > 0, "{c:?}");
    assert_eq!(c.hits + c.misses, c.gets);
    assert_eq!(c.errors + c.timeouts, 0, "{:?} {c:?}", r.notes);
    // What was PUT over HTTP reads back over the memcached port under the same key.
    let mut buf = [0u8; 256];
    let wl = &cfg.workload;
    let mut client = kvlab_client::Client::connect(server.addr(), Duration::from_secs(5)).unwrap();
    let found = (0..1000u64)
        .filter_map(|k| {
            let key = wl.key(k, &mut buf).to_vec();
            client.get(&key).unwrap().map(|v| (key, v))
        })
        .inspect(|(key, v)| assert!(wl.check_value(key, v)))
        .count();
    assert!(found > 0);
    drop(client);
    server.shutdown();
}
