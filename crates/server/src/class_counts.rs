//! The per-class counters behind `stats items` and `stats slabs`: evictions and reclaims
//! counted by the store's eviction observer ([`ClassEvictions`]), and the commands counted
//! per class by each worker ([`ClassCounters`], by [`ClassOp`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use kvlab_store::{Evicted, EvictionObserver, SizeClasses, MAX_CLASSES};

use crate::watch::Watchers;

/// Evictions and reclaims counted by the class of the item.
pub struct ClassEvictions {
    pub(crate) classes: SizeClasses,
    pub(crate) evicted: [AtomicU64; MAX_CLASSES as usize],
    pub(crate) nonzero: [AtomicU64; MAX_CLASSES as usize],
    pub(crate) unfetched: [AtomicU64; MAX_CLASSES as usize],
    /// Seconds since the last access of the last item evicted in the class.
    pub(crate) time: [AtomicU64; MAX_CLASSES as usize],
    pub(crate) reclaimed: [AtomicU64; MAX_CLASSES as usize],
    pub(crate) expired_unfetched: [AtomicU64; MAX_CLASSES as usize],
    pub(crate) crawler_reclaimed: [AtomicU64; MAX_CLASSES as usize],
    /// The class was given an item (`cmd_set`): memcached would have allocated it a
    /// slab page, and keeps it (`stats slabs` lists the class, a page at least) when
    /// its items are gone. Not zeroed by `stats reset`, as memcached's pages stay.
    pub(crate) held: [AtomicBool; MAX_CLASSES as usize],
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
            held: std::array::from_fn(|_| AtomicBool::new(false)),
            watchers,
        }
    }
}

impl ClassEvictions {
    /// The class was given an item: memcached would hold a page for it from now on.
    /// (A load first: the line is written once, then only read by the workers.)
    #[inline]
    pub fn mark_held(&self, class: u32) {
        if let Some(h) = self.held.get(class as usize) {
            if class != 0 && !h.load(Relaxed) {
                h.store(true, Relaxed);
            }
        }
    }

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

/// What memcached counts per class for the commands (its `slab_stats` and
/// `lru_hits`, and `itemstats`' `outofmemory`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClassOp {
    /// A `get`/`gets`/`mg` (without `T`)/binary get hit: `get_hits`, `hits_to_cold`.
    GetHit,
    /// A storage command whose item was made (not refused as too large or for want of
    /// memory), counted in the class of the item the request carries: `cmd_set`.
    Set,
    /// `delete`/`md` removed the item: `delete_hits`.
    DeleteHit,
    /// `incr`/`ma` hit: `incr_hits`.
    IncrHit,
    /// `decr`/`ma MD` hit: `decr_hits`.
    DecrHit,
    /// A `cas`/`ms C` compare matched: `cas_hits` (the class of the item replaced).
    CasHit,
    /// A `cas`/`ms C` compare did not match: `cas_badval` (the class of the item kept).
    CasBadval,
    /// `touch`/`gat`/`gats`/`mg T` hit: `touch_hits`.
    TouchHit,
    /// A store refused for want of memory: `stats items`' `outofmemory`.
    OutOfMemory,
}

const OPS: usize = 9;

/// One worker's per-class command counters (written by its thread only, relaxed; summed
/// over the workers by `stats items` and `stats slabs`, zeroed by `stats reset` as
/// memcached zeroes its threads' `slab_stats`).
pub struct ClassCounters {
    counts: [[AtomicU64; MAX_CLASSES as usize]; OPS],
}

impl Default for ClassCounters {
    fn default() -> Self {
        ClassCounters {
            counts: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
        }
    }
}

impl ClassCounters {
    /// Counts one `op` in `class` (class 0, an item over `-I`, is no class: not counted).
    #[inline]
    pub fn add(&self, op: ClassOp, class: u32) {
        if class == 0 {
            return;
        }
        if let Some(c) = self.counts[op as usize].get(class as usize) {
            c.fetch_add(1, Relaxed);
        }
    }

    /// Zeroes every counter.
    pub fn reset(&self) {
        for op in &self.counts {
            for c in op {
                c.store(0, Relaxed);
            }
        }
    }

    pub(crate) fn get(&self, op: ClassOp, class: usize) -> u64 {
        self.counts[op as usize][class].load(Relaxed)
    }
}
