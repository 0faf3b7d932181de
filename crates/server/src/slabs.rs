//! Per-class figures, `stats items` and `stats slabs`, with memcached's size classes
//! ([`SizeClasses`]): each item is counted in the class memcached would store it in.
//!
//! kvlab allocates one block per item, so the figures are derived: `number`,
//! `mem_requested` and `age` come from a walk over the store when asked (bounded steps,
//! one shard lock at a time, like the crawler: `stats items` costs O(items)); `evicted`,
//! `evicted_nonzero`, `evicted_time`, `evicted_unfetched`, `reclaimed`,
//! `expired_unfetched` and `crawler_reclaimed` are counted per class as the store evicts
//! and reclaims ([`ClassEvictions`], the store's eviction observer, which also feeds
//! `watch evictions`). `stats slabs` gives each class's chunk size and chunks per page,
//! and the pages and chunks memcached would need for the items counted (kvlab keeps no
//! free chunks); `total_malloced` is those pages' bytes, as memcached counts the slab
//! pages it has allocated (t/issue_14), not the bytes kvlab charges for items. Figures
//! memcached keeps per class that kvlab keeps only server-wide (hits, reclaims, LRU
//! segment moves) are not listed per class: they are in `stats`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use kvlab_protocol::response as r;
use kvlab_store::{Evicted, EvictionObserver, ScanCursor, SizeClasses, Store, MAX_CLASSES};

use crate::watch::Watchers;

/// Evictions and reclaims counted by the class of the item.
pub struct ClassEvictions {
    classes: SizeClasses,
    evicted: [AtomicU64; MAX_CLASSES as usize],
    nonzero: [AtomicU64; MAX_CLASSES as usize],
    unfetched: [AtomicU64; MAX_CLASSES as usize],
    /// Seconds since the last access of the last item evicted in the class.
    time: [AtomicU64; MAX_CLASSES as usize],
    reclaimed: [AtomicU64; MAX_CLASSES as usize],
    expired_unfetched: [AtomicU64; MAX_CLASSES as usize],
    crawler_reclaimed: [AtomicU64; MAX_CLASSES as usize],
    watchers: Arc<Watchers>,
}

impl ClassEvictions {
    /// Counts for `classes`; each eviction is also logged to `watchers`.
    pub fn new(classes: SizeClasses, watchers: Arc<Watchers>) -> ClassEvictions {
        ClassEvictions {
            classes,
            evicted: std::array::from_fn(|_| AtomicU64::new(0)),
            nonzero: std::array::from_fn(|_| AtomicU64::new(0)),
            unfetched: std::array::from_fn(|_| AtomicU64::new(0)),
            time: std::array::from_fn(|_| AtomicU64::new(0)),
            reclaimed: std::array::from_fn(|_| AtomicU64::new(0)),
            expired_unfetched: std::array::from_fn(|_| AtomicU64::new(0)),
            crawler_reclaimed: std::array::from_fn(|_| AtomicU64::new(0)),
            watchers,
        }
    }
}

impl ClassEvictions {
    /// `stats reset`: memcached zeroes its per-class item counters.
    pub fn reset(&self) {
        for counters in [
            &self.evicted,
            &self.nonzero,
            &self.unfetched,
            &self.time,
            &self.reclaimed,
            &self.expired_unfetched,
            &self.crawler_reclaimed,
        ] {
            for c in counters {
                c.store(0, Relaxed);
            }
        }
    }
}

impl EvictionObserver for ClassEvictions {
    fn evicted(&self, item: &Evicted<'_>) {
        let class = self
            .classes
            .class_of_item(item.key.len(), item.value_len, item.flags);
        let i = class as usize;
        self.evicted[i].fetch_add(1, Relaxed);
        if item.ttl != -1 {
            self.nonzero[i].fetch_add(1, Relaxed);
        }
        if !item.fetched {
            self.unfetched[i].fetch_add(1, Relaxed);
        }
        self.time[i].store(item.idle, Relaxed);
        self.watchers.eviction(
            item.key,
            item.fetched,
            item.ttl,
            item.idle,
            class,
            item.value_len,
        );
    }

    fn reclaimed(&self, item: &Evicted<'_>, by_crawler: bool) {
        let class = self
            .classes
            .class_of_item(item.key.len(), item.value_len, item.flags);
        let i = class as usize;
        self.reclaimed[i].fetch_add(1, Relaxed);
        if !item.fetched {
            self.expired_unfetched[i].fetch_add(1, Relaxed);
        }
        if by_crawler {
            self.crawler_reclaimed[i].fetch_add(1, Relaxed);
        }
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

/// `stats items`: for each class holding items or having evicted some, memcached's
/// `items:<class>:<name>` lines that kvlab keeps per class.
pub fn stats_items(store: &Store, ev: &ClassEvictions, now: u64, out: &mut Vec<u8>) {
    let found = walk(store, &ev.classes, now);
    for class in 1..=ev.classes.largest() {
        let i = class as usize;
        let f = found[i];
        let evicted = ev.evicted[i].load(Relaxed);
        let reclaimed = ev.reclaimed[i].load(Relaxed);
        if f.number == 0 && evicted == 0 && reclaimed == 0 {
            continue;
        }
        let mut line = |name: &str, v: u64| {
            r::stat(out, &format!("items:{class}:{name}"), v);
        };
        line("number", f.number);
        line("number_hot", 0);
        line("number_warm", 0);
        line("number_cold", f.number);
        line("age_hot", 0);
        line("age_warm", 0);
        line("age", f.age);
        line("mem_requested", f.mem_requested);
        line("evicted", evicted);
        line("evicted_nonzero", ev.nonzero[i].load(Relaxed));
        line("evicted_time", ev.time[i].load(Relaxed));
        line("reclaimed", reclaimed);
        line("expired_unfetched", ev.expired_unfetched[i].load(Relaxed));
        line("evicted_unfetched", ev.unfetched[i].load(Relaxed));
        line("crawler_reclaimed", ev.crawler_reclaimed[i].load(Relaxed));
    }
    out.extend_from_slice(r::END);
}

/// `stats slabs`: each class with items, its chunk size and chunks per page, and the
/// pages and chunks memcached would hold for them; then `active_slabs` and
/// `total_malloced`: those pages in bytes (memcached's allocated slab pages).
pub fn stats_slabs(store: &Store, classes: &SizeClasses, now: u64, out: &mut Vec<u8>) {
    let found = walk(store, classes, now);
    let mut active = 0;
    let mut total_pages = 0;
    for class in 1..=classes.largest() {
        let f = found[class as usize];
        if f.number == 0 {
            continue;
        }
        active += 1;
        let per_page = u64::from(classes.per_page(class)).max(1);
        let pages = f.number.div_ceil(per_page);
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
        line("mem_requested", f.mem_requested);
    }
    r::stat(out, "active_slabs", active);
    r::stat(
        out,
        "total_malloced",
        total_pages * classes.page_size() as u64,
    );
    out.extend_from_slice(r::END);
}
