//! Measures what an item really costs, to keep `ITEM_OVERHEAD` honest.
//!
//! A counting global allocator records every live allocation, both as requested and
//! as glibc malloc lays it out (8-byte chunk header, 16-byte granularity, 32-byte
//! minimum; page-rounded `mmap` above 128 KiB). `per_item_overhead_is_honest` runs in
//! every `cargo test`; `rss_per_item_one_million` is the figure for the notes:
//!
//! ```text
//! cargo test -p kvlab-store --release --test memory -- --ignored --nocapture
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use kvlab_store::{ManualClock, Policy, SetMode, SetRequest, Store, StoreConfig, ITEM_OVERHEAD};

struct Counting;

static REQUESTED: AtomicUsize = AtomicUsize::new(0);
static CHUNKS: AtomicUsize = AtomicUsize::new(0);

/// Bytes glibc malloc uses for a request of `size` bytes.
fn glibc_chunk(size: usize) -> usize {
    if size >= 128 * 1024 {
        (size + 16 + 4095) & !4095
    } else {
        ((size + 8 + 15) & !15).max(32)
    }
}

// SAFETY: forwards to `System` unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        REQUESTED.fetch_add(layout.size(), Ordering::Relaxed);
        CHUNKS.fetch_add(glibc_chunk(layout.size()), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        REQUESTED.fetch_sub(layout.size(), Ordering::Relaxed);
        CHUNKS.fetch_sub(glibc_chunk(layout.size()), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const KEY_LEN: usize = 10;
const VALUE_LEN: usize = 100;

fn fill(n: usize, shards: usize) -> Store {
    let config = StoreConfig {
        memory_limit: 4 << 30,
        item_size_max: 1 << 20,
        policy: Policy::Lru,
        shards,
        max_items: 0,
    };
    let s = Store::new(config, Arc::new(ManualClock::new(1_700_000_000)));
    let value = [b'v'; VALUE_LEN];
    for i in 0..n {
        let key = format!("k{i:09}");
        assert_eq!(key.len(), KEY_LEN);
        s.set(&SetRequest::new(SetMode::Set, key.as_bytes(), &value));
    }
    s
}

#[test]
fn per_item_overhead_is_honest() {
    let n = 200_000;
    let (req0, chunks0) = (
        REQUESTED.load(Ordering::Relaxed),
        CHUNKS.load(Ordering::Relaxed),
    );
    let s = fill(n, 64);
    let requested = (REQUESTED.load(Ordering::Relaxed) - req0) as f64 / n as f64;
    let chunks = (CHUNKS.load(Ordering::Relaxed) - chunks0) as f64 / n as f64;
    let data = (KEY_LEN + VALUE_LEN) as f64;
    println!(
        "per item: requested {requested:.1} B, glibc chunks {chunks:.1} B, \
         overhead beyond key+value {:.1} B (ITEM_OVERHEAD = {ITEM_OVERHEAD})",
        chunks - data
    );
    assert_eq!(
        s.stats().bytes as usize,
        n * (KEY_LEN + VALUE_LEN + ITEM_OVERHEAD)
    );
    let measured = chunks - data;
    assert!(
        (measured - ITEM_OVERHEAD as f64).abs() <= 15.0,
        "measured overhead {measured:.1} B vs ITEM_OVERHEAD {ITEM_OVERHEAD}"
    );
}

fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc");
    let rss = statm
        .split_whitespace()
        .nth(1)
        .expect("statm has a resident field");
    let pages: usize = rss.parse().expect("a page count");
    pages * 4096
}

#[test]
#[ignore = "slow in debug; run in release for the memory figure"]
fn rss_per_item_one_million() {
    let n = 1_000_000;
    let rss0 = rss_bytes();
    let chunks0 = CHUNKS.load(Ordering::Relaxed);
    let s = fill(n, 0);
    let rss = (rss_bytes() - rss0) as f64 / n as f64;
    let chunks = (CHUNKS.load(Ordering::Relaxed) - chunks0) as f64 / n as f64;
    let st = s.stats();
    println!(
        "1M items, {KEY_LEN} B keys, {VALUE_LEN} B values, {} shards: RSS {rss:.1} B/item, \
         glibc-model {chunks:.1} B/item, stats.bytes {:.1} B/item",
        s.config().shards,
        st.bytes as f64 / n as f64
    );
}
