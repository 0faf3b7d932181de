//! Randomized differential test through a real client: `pymemcache_differential.py` makes
//! one seeded stream of pymemcache calls (every storage and retrieval call, `noreply` or
//! not, binary values, multi-gets, counters, bad arguments) on kvlab and on memcached 1.6 in
//! lock step, and each call's return value or exception must be the same (CAS tokens
//! mapped one-to-one between the servers). The script's doc says what is drawn, what is
//! not and why, and holds the allow-list (empty).
//!
//! Each seed runs against a fresh kvlab server of another I/O model; memcached is flushed
//! between seeds. memcached runs as in `differential.rs` (`-o
//! no_lru_crawler,no_lru_maintainer`: its counters are padded in place every time), with
//! `-m 1024` so that no value drawn is ever evicted (it takes pages as it needs them).
//! A call unanswered for 5 s is an outcome (a timeout) and a seed stops at its 10th
//! difference, so a server that hangs fails the test in bounded time (about 20 s when all is
//! well). `.ci/run` installs memcached and pymemcache; a missing one fails the test.

mod common;

use std::process::Command;

use common::*;
use kvlab_server::IoModel;
use kvlab_testkit::Memcached;

/// Calls per seed.
const OPS: usize = 20_000;
/// Seeds, each with its I/O model.
const SEEDS: [(u64, IoModel); 4] = [
    (0x7079_6d63_0001, IoModel::Reactor),
    (0x7079_6d63_0002, IoModel::Epoll),
    (0x7079_6d63_0003, IoModel::Threaded),
    (0x7079_6d63_0004, IoModel::Signal),
];

#[test]
fn pymemcache_calls_match_memcached() {
    let mc = Memcached::start_with(&["-m", "1024", "-o", "no_lru_crawler,no_lru_maintainer"])
        .unwrap_or_else(|e| panic!("{e} (.ci/run installs Debian's memcached)"));
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pymemcache_differential.py");
    let mut failures = Vec::new();
    for (seed, io) in SEEDS {
        let (server, _clock) = start(io, |_| {});
        let out = Command::new("python3")
            .arg(&script)
            .arg(server.addr().port().to_string())
            .arg(mc.addr.port().to_string())
            .args(["--ops", &OPS.to_string(), "--seed", &seed.to_string()])
            .output()
            .expect("python3 runs");
        let report = format!(
            "io {}: {}{}",
            io.name(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        eprint!("{report}");
        if !out.status.success() {
            failures.push(report);
        }
    }
    assert!(
        failures.is_empty(),
        "pymemcache calls differ between kvlab and memcached (is pymemcache installed? \
         .ci/run does it):\n{}",
        failures.join("\n")
    );
}
