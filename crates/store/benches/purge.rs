//! Does the data directory stay bounded? Two workloads on a durable store, with the
//! flusher purging in the background (not a timed benchmark: it prints figures):
//!
//! * `flush`: 20 rounds of (write 2000 new keys, `sync_all`, `flush_all`);
//! * `ttl`: 20 rounds of (write 2000 new keys with a 5 s TTL, `sync_all`, let them
//!   expire) — on a [`ManualClock`], with a 10 ms flush interval so that the
//!   expiry purge (at most every 60 intervals) comes round quickly.
//!
//! After each round it waits for a purge pass, then prints the records in the
//! engine and the size of the data directory (file lengths; the engine's journal
//! files are preallocated, and it only writes tables once a 64 MiB memtable fills:
//! use large values to see tables and compaction). At the end it closes the store
//! and prints the size again, per top-level entry.
//! `PURGE_BENCH_VALUE=4000 cargo bench -p kvlab-store --bench purge` (value bytes,
//! default 100).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvlab_store::{
    Clock, Durability, DurableConfig, ManualClock, SetMode, SetRequest, Store, StoreConfig,
    SystemClock,
};

const ROUNDS: usize = 20;
const KEYS: usize = 2000;

fn dir_bytes(p: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(p) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

fn wait_for_pass(s: &Store, before: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while s.durable_stats().map_or(0, |st| st.purge_passes) <= before {
        assert!(Instant::now() < deadline, "no purge pass within 60 s");
        // A benchmark, not a test: polling with a short sleep is fine here.
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn run(
    name: &str,
    value_len: usize,
    clock: Arc<dyn Clock>,
    manual: Option<&ManualClock>,
    ttl: i64,
) {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = DurableConfig {
        dir: dir.path().to_path_buf(),
        durability: Durability::Interval,
        flush_interval: Duration::from_millis(10),
    };
    let s = Store::open(StoreConfig::default(), clock, config).expect("open");
    // Incompressible values (the engine compresses its tables).
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let value: Vec<u8> = (0..value_len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    println!("{name}: round, records before purge, records after, data dir KiB after");
    for round in 0..ROUNDS {
        for i in 0..KEYS {
            let k = format!("{name}:{round}:{i:05}");
            let mut r = SetRequest::new(SetMode::Set, k.as_bytes(), &value);
            r.exptime = ttl;
            s.set(&r);
        }
        s.sync_all().expect("sync");
        let before = s.disk_records().expect("count");
        let passes = s.durable_stats().map_or(0, |st| st.purge_passes);
        match manual {
            Some(c) => c.advance(ttl as u64),
            None => s.flush_all(0),
        }
        wait_for_pass(&s, passes);
        let after = s.disk_records().expect("count");
        println!(
            "{name}: {round:2} {before:6} {after:6} {:8}",
            dir_bytes(dir.path()) / 1024
        );
    }
    let st = s.durable_stats().expect("durable");
    println!(
        "{name}: purged {} records in {} passes ({} scanned)",
        st.purged, st.purge_passes, st.purge_scanned
    );
    drop(s);
    println!(
        "{name}: data dir after close: {} KiB (written: {} keys x {} B values)",
        dir_bytes(dir.path()) / 1024,
        ROUNDS * KEYS,
        value.len()
    );
    let mut top: Vec<_> = std::fs::read_dir(dir.path())
        .expect("data dir")
        .flatten()
        .map(|e| {
            let bytes = if e.path().is_dir() {
                dir_bytes(&e.path())
            } else {
                e.metadata().map_or(0, |m| m.len())
            };
            (e.file_name().to_string_lossy().into_owned(), bytes)
        })
        .collect();
    top.sort();
    for (entry, bytes) in top {
        println!("{name}:   {entry}: {} KiB", bytes / 1024);
    }
}

fn main() {
    // `cargo bench` passes `--bench`; nothing to parse.
    let value_len = std::env::var("PURGE_BENCH_VALUE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    run("flush", value_len, Arc::new(SystemClock), None, 0);
    let clock = Arc::new(ManualClock::new(1_700_000_000));
    run("ttl", value_len, clock.clone(), Some(&clock), 5);
}
