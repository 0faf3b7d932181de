//! The sustained-throughput search against test servers whose latency jumps past a known
//! request rate, over both protocols. A test binary of its own, so that no sibling test
//! competes for the CPU while it measures.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{closed, http_test_server, test_server, Faults};
use kvlab_bench::schedule::Arrival;
use kvlab_bench::sustained::{find_sustained_with, Bound, SearchSpec, Verdict};
use kvlab_bench::Protocol;

/// A quick search: fixed arrivals, 0.5 s steps.
fn spec() -> SearchSpec {
    // The bound (5 ms) and the fault (20 ms per reply) are far above the scheduling jitter of
    // a loaded 2-core machine, so only the fault decides a step.
    let mut s = SearchSpec::new(Bound::Mean, 5000.0);
    s.start = 700.0;
    s.step_s = 0.5;
    s.warmup_s = 0.2;
    s.arrival = Arrival::Fixed;
    s.max_time_s = 60.0;
    s
}

fn search(protocol: Protocol, addr: std::net::SocketAddr, threshold: f64, offered: &AtomicU64) {
    let mut cfg = closed(addr, 1);
    cfg.protocol = protocol;
    cfg.requests = None;
    cfg.connections = 4;
    cfg.depth = 256;
    let mut seen = 0;
    let mut step = |c: &kvlab_bench::BenchConfig| {
        offered.store(c.plan.segments[0].qps.to_bits(), Ordering::SeqCst);
        kvlab_bench::run(c, &[], &mut |_| {})
    };
    let r = find_sustained_with(&cfg, &spec(), &mut step, &mut |_| seen += 1).unwrap();
    assert_eq!(seen, r.steps.len());
    let s = r.sustained_qps.expect("a rate passed");
    let b = r.first_bad_qps.expect("a rate failed");
    // Above the threshold every reply is 20 ms late: the search must bracket the threshold.
    assert!(
        (0.75 * threshold..=threshold).contains(&s),
        "sustained {s} req/s for a {threshold} req/s threshold\n{}",
        kvlab_bench::sustained::table(&r)
    );
    assert!(b > s && (b - s) / s <= 0.05 + 1e-9, "{s} .. {b}");
    let chosen = r.sustained.as_ref().unwrap();
    assert_eq!(chosen.verdict, Verdict::Ok);
    assert!(chosen.mean_us < 5000.0 && chosen.success_rate == 1.0);
}

#[test]
fn find_sustained_lands_at_the_latency_threshold() {
    let threshold = 3000.0;
    let offered = Arc::new(AtomicU64::new(0));
    let faults = Faults {
        slow_above: Some((threshold, Duration::from_millis(20), offered.clone())),
        ..Faults::default()
    };
    search(
        Protocol::Memcached,
        test_server(faults.clone()),
        threshold,
        &offered,
    );
    search(
        Protocol::Http,
        http_test_server(faults),
        threshold,
        &offered,
    );
}
