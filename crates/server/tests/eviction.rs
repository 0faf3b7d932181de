//! Eviction order against memcached 1.6 (issue 25, item 12): overfill a server under
//! `-m 64` and measure the *newest intact run* — the longest run of the newest keys all
//! still present. A least-recently-used cache keeps every newest key until memory runs
//! out; memcached, whose LRU is per slab class, keeps 256 of 200 KB values. kvlab's
//! lists are per shard, and a shard holds only a few large items, so it must evict
//! store-wide by recency to do as well.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;

use common::*;
use kvlab_server::IoModel;
use kvlab_testkit::Memcached;

/// Stores `sizes.len()` keys `k0, k1, …` (oldest first) with values of those sizes,
/// pipelined a few at a time.
fn fill(addr: SocketAddr, sizes: &[usize]) {
    let mut s = connect(addr);
    let max = sizes.iter().copied().max().unwrap_or(0);
    let value = vec![b'v'; max];
    for (batch, chunk) in sizes.chunks(8).enumerate() {
        let mut req = Vec::new();
        for (j, &len) in chunk.iter().enumerate() {
            let i = batch * 8 + j;
            req.extend_from_slice(format!("set k{i} 0 0 {len}\r\n").as_bytes());
            req.extend_from_slice(&value[..len]);
            req.extend_from_slice(b"\r\n");
        }
        s.write_all(&req).expect("write sets");
        let want = b"STORED\r\n".repeat(chunk.len());
        let mut got = vec![0; want.len()];
        s.read_exact(&mut got).expect("read STORED replies");
        assert_eq!(got, want, "{}", String::from_utf8_lossy(&got));
    }
}

/// The longest run of the newest of `n` keys all present (`mg` answers `HD` or `EN`).
fn newest_intact(addr: SocketAddr, n: usize) -> usize {
    let mut s = connect(addr);
    let mut run = 0;
    for i in (0..n).rev() {
        let reply = exchange(&mut s, format!("mg k{i}\r\n").as_bytes(), b"\r\n");
        match &reply[..] {
            b"HD\r\n" => run += 1,
            b"EN\r\n" => break,
            other => panic!("mg k{i}: {}", String::from_utf8_lossy(other)),
        }
    }
    run
}

/// (kvlab's run, memcached's run) for the same keys and sizes under `-m 64`.
fn compare(sizes: &[usize]) -> (usize, usize) {
    let (server, _clock) = start(IoModel::Reactor, |c| c.memory_limit = 64 << 20);
    fill(server.addr(), sizes);
    let kvlab = newest_intact(server.addr(), sizes.len());
    drop(server);
    let mc = Memcached::start_with(&["-m", "64"])
        .unwrap_or_else(|e| panic!("{e} (.ci/run installs Debian's memcached)"));
    fill(mc.addr, sizes);
    let memcached = newest_intact(mc.addr, sizes.len());
    (kvlab, memcached)
}

#[test]
fn newest_large_values_survive_as_in_memcached() {
    // 1,200 values of 200 KB: 229 MiB into 64 MiB.
    let sizes = vec![200_000; 1200];
    let (kvlab, memcached) = compare(&sizes);
    eprintln!("200 KB values: newest intact run kvlab {kvlab}, memcached {memcached}");
    assert!(
        kvlab >= memcached,
        "newest intact run: kvlab {kvlab}, memcached {memcached}"
    );
}

#[test]
fn newest_mixed_values_survive_as_in_memcached() {
    // 4,000 values from 100 B to 200 KB, log-uniform (a fixed sequence): 190 MiB.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let sizes: Vec<usize> = (0..4000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let u = (x >> 11) as f64 / (1u64 << 53) as f64;
            (100.0 * 2000f64.powf(u)) as usize
        })
        .collect();
    let (kvlab, memcached) = compare(&sizes);
    eprintln!("mixed values: newest intact run kvlab {kvlab}, memcached {memcached}");
    assert!(
        kvlab >= memcached,
        "newest intact run: kvlab {kvlab}, memcached {memcached}"
    );
}
