//! Per-class figures, `stats items` and `stats slabs`, with memcached's size classes
//! ([`SizeClasses`]): each item is counted in the class memcached would store it in.
//!
//! kvlab allocates one block per item, so the figures are derived: `number`,
//! `mem_requested` and `age` come from a walk over the store when asked (bounded steps,
//! one shard lock at a time, like the crawler: `stats items` costs O(items)); `evicted`,
//! `evicted_nonzero`, `evicted_time`, `evicted_unfetched`, `reclaimed`,
//! `expired_unfetched` and `crawler_reclaimed` are counted per class as the store evicts
//! and reclaims ([`ClassEvictions`], the store's eviction observer, which also feeds
//! `watch evictions`); the commands' hits, sets and out-of-memory refusals are counted
//! per class by each worker ([`ClassCounters`]: `stats slabs`' `get_hits` … `touch_hits`,
//! `stats items`' `outofmemory` and `hits_to_cold`). `stats slabs` gives each class's
//! chunk size and chunks per page, and the pages and chunks memcached would need for the
//! items counted (kvlab keeps no free chunks); `total_malloced` is those pages' bytes, as
//! memcached counts the slab pages it has allocated (t/issue_14), not the bytes kvlab
//! charges for items.
//!
//! kvlab keeps one LRU, no hot/warm/cold segments, so `stats items` reports every item
//! cold (as memcached does without its LRU maintainer: "only COLD in compat-mode"), its
//! hits as `hits_to_cold`; the fields of mechanisms kvlab does not have (segment moves,
//! tail repairs, locked tails, reclaims by a worker short of a free chunk) stay 0, as an
//! idle memcached shows them. docs/server.md (stats items) lists them.

use std::sync::atomic::Ordering::Relaxed;

use kvlab_protocol::response as r;
use kvlab_store::{ScanCursor, SizeClasses, Store, MAX_CLASSES};

pub use crate::class_counts::{ClassCounters, ClassEvictions, ClassOp};
use crate::stats::WorkerStats;

/// `stats slabs`' per-class command counters in memcached's order.
const SLAB_COUNTERS: [(&str, ClassOp); 8] = [
    ("get_hits", ClassOp::GetHit),
    ("cmd_set", ClassOp::Set),
    ("delete_hits", ClassOp::DeleteHit),
    ("incr_hits", ClassOp::IncrHit),
    ("decr_hits", ClassOp::DecrHit),
    ("cas_hits", ClassOp::CasHit),
    ("cas_badval", ClassOp::CasBadval),
    ("touch_hits", ClassOp::TouchHit),
];

/// The workers' per-class counters, summed when `stats items`/`stats slabs` is asked.
#[derive(Clone, Copy)]
pub struct Workers<'w>(pub &'w [&'w WorkerStats]);

impl Workers<'_> {
    fn sum(&self, op: ClassOp, class: usize) -> u64 {
        self.0.iter().map(|w| w.classes.get(op, class)).sum()
    }
}

/// What a walk over the store finds per class.
#[derive(Clone, Copy, Default)]
struct Found {
    number: u64,
    mem_requested: u64,
    /// Seconds since the least recent access among the class's items.
    age: u64,
}

fn walk(store: &Store, classes: &SizeClasses, now: u64) -> Vec<Found> {
    let mut found = vec![Found::default(); MAX_CLASSES as usize];
    let mut cursor = ScanCursor::default();
    let mut batch = Vec::new();
    loop {
        batch.clear();
        let step = store.scan(&mut cursor, 1024, &mut batch);
        for item in &batch {
            let size = SizeClasses::item_size(item.key().len(), item.value().len(), item.flags());
            let f = &mut found[classes.class_of(size) as usize];
            f.number += 1;
            f.mem_requested += size as u64;
            f.age = f.age.max(now.saturating_sub(item.last_access()));
        }
        if step.done {
            return found;
        }
    }
}

/// `stats items`: for each class holding items (as memcached, which skips a class whose
/// LRUs are empty), memcached 1.6's `items:<class>:<name>` lines in its order: 28 a
/// class with the LRU maintainer (`lru_maintainer`, memcached's default), 14 without
/// (its segment counts and moves, `evicted_active` and `hits_to_*` are then not listed).
pub fn stats_items(
    store: &Store,
    ev: &ClassEvictions,
    workers: Workers<'_>,
    lru_maintainer: bool,
    now: u64,
    out: &mut Vec<u8>,
) {
    let found = walk(store, &ev.classes, now);
    for class in 1..=ev.classes.largest() {
        let i = class as usize;
        let f = found[i];
        if f.number == 0 {
            continue;
        }
        let mut line = |name: &str, v: u64| {
            r::stat(out, &format!("items:{class}:{name}"), v);
        };
        line("number", f.number);
        if lru_maintainer {
            // One LRU, reported as memcached's cold one.
            line("number_hot", 0);
            line("number_warm", 0);
            line("number_cold", f.number);
            line("age_hot", 0);
            line("age_warm", 0);
        }
        line("age", f.age);
        line("mem_requested", f.mem_requested);
        line("evicted", ev.evicted[i].load(Relaxed));
        line("evicted_nonzero", ev.nonzero[i].load(Relaxed));
        line("evicted_time", ev.time[i].load(Relaxed));
        line("outofmemory", workers.sum(ClassOp::OutOfMemory, i));
        // memcached repairs an item whose reference leaked at its LRU's tail; kvlab
        // counts no references at a tail.
        line("tailrepairs", 0);
        line("reclaimed", ev.reclaimed[i].load(Relaxed));
        line("expired_unfetched", ev.expired_unfetched[i].load(Relaxed));
        line("evicted_unfetched", ev.unfetched[i].load(Relaxed));
        if lru_maintainer {
            // Evicted although active (would have moved to warm): no segments.
            line("evicted_active", 0);
        }
        line("crawler_reclaimed", ev.crawler_reclaimed[i].load(Relaxed));
        // The store's crawl step counts the items it checks server-wide (`stats`'
        // `crawler_items_checked`), not by class.
        line("crawler_items_checked", 0);
        // No item is locked at a tail: the store evicts under its shard lock.
        line("lrutail_reflocked", 0);
        if lru_maintainer {
            line("moves_to_cold", 0);
            line("moves_to_warm", 0);
            line("moves_within_lru", 0);
            // Reported server-wide in `stats` as 0 too: a store makes room as part of
            // the write, never as a worker's fallback after a failed chunk allocation.
            line("direct_reclaims", 0);
            line("hits_to_hot", 0);
            line("hits_to_warm", 0);
            line("hits_to_cold", workers.sum(ClassOp::GetHit, i));
            line("hits_to_temp", 0);
        }
    }
    out.extend_from_slice(r::END);
}

/// `stats slabs`: each class memcached would hold a page for — one with items, or one
/// given an item before (memcached keeps a class's pages when its items are gone) —
/// its chunk size and chunks per page, the pages and chunks memcached would need for
/// the items it holds (one page at least), and memcached's per-class command counters;
/// then `active_slabs` and `total_malloced`: those pages in bytes (memcached's
/// allocated slab pages).
pub fn stats_slabs(
    store: &Store,
    ev: &ClassEvictions,
    workers: Workers<'_>,
    now: u64,
    out: &mut Vec<u8>,
) {
    let classes = &ev.classes;
    let found = walk(store, classes, now);
    let mut active = 0;
    let mut total_pages = 0;
    for class in 1..=classes.largest() {
        let i = class as usize;
        let f = found[i];
        if f.number == 0 && !ev.held[i].load(Relaxed) {
            continue;
        }
        active += 1;
        let per_page = u64::from(classes.per_page(class)).max(1);
        let pages = f.number.div_ceil(per_page).max(1);
        total_pages += pages;
        let mut line = |name: &str, v: u64| {
            r::stat(out, &format!("{class}:{name}"), v);
        };
        line("chunk_size", u64::from(classes.size(class)));
        line("chunks_per_page", per_page);
        line("total_pages", pages);
        line("total_chunks", pages * per_page);
        line("used_chunks", f.number);
        line("free_chunks", pages * per_page - f.number);
        line("free_chunks_end", 0);
        for (name, op) in SLAB_COUNTERS {
            line(name, workers.sum(op, i));
        }
    }
    r::stat(out, "active_slabs", active);
    r::stat(
        out,
        "total_malloced",
        total_pages * classes.page_size() as u64,
    );
    out.extend_from_slice(r::END);
}
