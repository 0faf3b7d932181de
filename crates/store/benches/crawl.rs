//! How long does one crawler step hold its shard's lock? (Not a timed test: it
//! prints figures.) A store of `CRAWL_BENCH_ITEMS` items (default 1,000,000; 20-byte
//! keys, 10-byte values, auto shard count) is crawled in whole passes of
//! [`Store::crawl_step`]s of several sizes, in three states:
//!
//! * `live`: nothing to reclaim, every step only examines slots;
//! * `half`: every other item has expired (the clock moved past its TTL);
//! * `dead`: everything was flushed, every step frees up to its size in items.
//!
//! Each step is timed from outside (`Instant` around the call), which bounds the
//! lock hold from above: it adds reading the clock and the flush state. For
//! comparison, `whole` is one step as large as a shard, what `reclaim_expired`
//! used to hold a lock for.
//! `cargo bench -p kvlab-store --bench crawl`

use std::sync::Arc;
use std::time::Instant;

use kvlab_store::{CrawlCursor, ManualClock, SetMode, SetRequest, Store, StoreConfig};

const T0: u64 = 1_700_000_000;

fn populate(items: usize, clock: &Arc<ManualClock>) -> Store {
    let config = StoreConfig {
        memory_limit: 1 << 30,
        ..StoreConfig::default()
    };
    let s = Store::new(config, clock.clone());
    let value = [b'v'; 10];
    for i in 0..items {
        let key = format!("key:{i:016}");
        let mut r = SetRequest::new(SetMode::Set, key.as_bytes(), &value);
        // Every other item expires after 10 s.
        r.exptime = if i % 2 == 0 { 10 } else { 0 };
        s.set(&r);
    }
    s
}

/// One whole pass in steps of `max`; returns every step's time in ns and the
/// items reclaimed.
fn pass(s: &Store, max: usize) -> (Vec<u64>, usize) {
    let mut cursor = CrawlCursor::default();
    let mut times = Vec::new();
    let mut reclaimed = 0;
    loop {
        let t = Instant::now();
        let step = s.crawl_step(&mut cursor, max);
        times.push(t.elapsed().as_nanos() as u64);
        reclaimed += step.reclaimed;
        if step.wrapped {
            return (times, reclaimed);
        }
    }
}

fn report(state: &str, max: usize, mut times: Vec<u64>, reclaimed: usize) {
    times.sort_unstable();
    let q = |p: f64| times[((times.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0;
    let total: u64 = times.iter().sum();
    println!(
        "{state:5} step {max:>8} slots: {:>6} steps, reclaimed {reclaimed:>8}, \
         step p50 {:>8.1} µs, p99 {:>8.1} µs, max {:>8.1} µs; pass {:>7.1} ms (steps only)",
        times.len(),
        q(0.5),
        q(0.99),
        q(1.0),
        total as f64 / 1e6,
    );
}

fn main() {
    let items: usize = std::env::var("CRAWL_BENCH_ITEMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let clock = Arc::new(ManualClock::new(T0));
    let t = Instant::now();
    let s = populate(items, &clock);
    let shards = s.config().shards;
    println!(
        "{items} items in {shards} shards (populated in {:.1} s)",
        t.elapsed().as_secs_f64()
    );
    let whole = items.div_ceil(shards) * 2;
    for max in [256, 512, 1024, 4096, whole] {
        let (times, reclaimed) = pass(&s, max);
        report("live", max, times, reclaimed);
    }
    for max in [256, 512, 1024, 4096, whole] {
        let clock = Arc::new(ManualClock::new(T0));
        let s = populate(items, &clock);
        clock.advance(10);
        let (times, reclaimed) = pass(&s, max);
        report("half", max, times, reclaimed);
        s.flush_all(0);
        let (times, reclaimed) = pass(&s, max);
        report("dead", max, times, reclaimed);
    }
}
