//! One shard: a hash table of slab indices, the slab of item entries, the eviction
//! order and the shard's counters. Everything here runs under the shard's mutex;
//! the command semantics built from these primitives live in `store.rs`.
//!
//! This file holds the shard's types, its index and order and the linking of items;
//! `evict` its evictions, reclaims, crawls and scans; `write_back` a durable store's
//! dirty marks, tombstones and write-backs.

mod evict;
mod write_back;

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use hashbrown::{DefaultHashBuilder, HashTable};
use parking_lot::Mutex;

use crate::clock::TimeBase;
use crate::item::{Block, ItemView, ITEM_OVERHEAD};
use crate::memory::{stamp_age, Budget};
use crate::policy::{Order, Policy};
use crate::slab::{Entry, Slab, DIRTY, FETCHED, NIL};
use crate::stats::ShardStats;
use crate::wb::Wb;

/// Coldest items an eviction examines for an expired or flushed one before it
/// evicts a live item (memcached's tail search also looks at 5).
const RECLAIM_SCAN: usize = 5;
/// `lru`: a shard evicts its own coldest item while that is at most this many
/// stamp units (16 of the limit's 4096, i.e. 1/256 of the limit in bytes stored)
/// younger than every other shard's coldest; otherwise it evicts in the shard
/// holding the store-wide coldest item. The slack keeps evictions of small items
/// under the lock already held (with 64 shards the shards' coldest items of 100
/// bytes lie within about 270 items, 3 units under `-m 64`), while a shard holding
/// few large items defers to the store-wide order.
pub(crate) const LRU_SLACK: u16 = 16;
/// A tail hint of a shard with no items.
pub(crate) const NO_TAIL: u32 = u32::MAX;
/// With `Policy::None` reclaiming is the only way to free memory, so look further.
const RECLAIM_SCAN_NONE: usize = 50;

/// The time of one request, read once.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Now {
    /// Unix seconds.
    pub abs: u64,
    /// Seconds since the store's epoch.
    pub rel: u32,
    /// Current flush generation.
    pub gen: u32,
}

/// Result of looking a key up. Expired and flushed items are unlinked on the way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lookup {
    Live(u32),
    Miss,
    Expired,
    Flushed,
}

/// What one [`Shard::crawl`] step did.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Crawled {
    /// Slab slots looked at (occupied or free).
    pub examined: usize,
    /// Occupied slots among them.
    pub checked: usize,
    /// Dead items unlinked.
    pub reclaimed: usize,
    /// Where the next step resumes; `None` once the slab's end was reached.
    pub next: Option<u32>,
}

/// What one [`Shard::scan`] step did.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scanned {
    /// Slab slots looked at (occupied or free).
    pub examined: usize,
    /// Where the next step resumes; `None` once the slab's end was reached.
    pub next: Option<u32>,
}

/// What a [`Shard::reserve`] that failed still misses: bytes, and an item slot under the
/// entry bound. Room is then made in other shards (`Store::evict_elsewhere`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Short {
    /// Bytes not yet reserved.
    pub bytes: usize,
    /// The new key's item slot was not taken (the entry bound is reached).
    pub item: bool,
}

/// Most items one shard can hold: slab indices have 24 bits (see [`Slot`]).
pub(crate) const MAX_SHARD_ITEMS: usize = 1 << 24;

/// A hash-table slot: the item's slab index (24 bits) and 8 more bits of its key
/// hash (bits 48..56) in the top byte.
///
/// hashbrown's own 7-bit tags alone let ~12% of lookups of absent keys compare a key,
/// which means loading the slab entry and the item block: two likely cache misses.
/// The extra 8 bits cut that to ~0.05% at the same 4 bytes per slot. (Bits 48..56
/// are independent of hashbrown's bucket bits (low), its tag (top 7) and the shard
/// index (bits 32..48).)
#[derive(Clone, Copy)]
struct Slot(u32);

impl Slot {
    #[inline]
    fn new(idx: u32, hash: u64) -> Slot {
        // Invariant: `Shard::reserve` keeps a shard below MAX_SHARD_ITEMS items, and
        // the slab only grows when every slot is occupied, so `idx < 2^24`.
        debug_assert!((idx as usize) < MAX_SHARD_ITEMS);
        Slot(idx | (u32::from(Self::tag(hash)) << 24))
    }

    #[inline]
    fn tag(hash: u64) -> u8 {
        (hash >> 48) as u8
    }

    #[inline]
    fn idx(self) -> u32 {
        self.0 & 0x00ff_ffff
    }

    #[inline]
    fn matches(self, tag: u8) -> bool {
        (self.0 >> 24) as u8 == tag
    }
}

pub(crate) struct Shard {
    table: HashTable<Slot>,
    slab: Slab,
    order: Order,
    hasher: DefaultHashBuilder,
    policy: Policy,
    len: usize,
    /// CAS values are `seq << cas_shift | shard index`: unique across shards without
    /// a shared atomic counter.
    cas_seq: u64,
    cas_shift: u32,
    cas_tag: u64,
    pub(crate) stats: ShardStats,
    /// Write-behind state; `None` for a memory-only store.
    pub(crate) wb: Option<Box<Wb>>,
    /// `largest` policy only: every shard's [largest-charge hint](LargestHints),
    /// and this shard's index in it.
    hints: Option<(LargestHints, usize)>,
    /// `lru` only: every shard's [coldest stamp](TailHints), this shard's index in
    /// it, and the value this shard last published there.
    tails: Option<(TailHints, usize, u32)>,
    /// Hears of each eviction ([`crate::Store::observe_evictions`]).
    pub(crate) observer: Option<std::sync::Arc<dyn crate::EvictionObserver>>,
}

/// Keeps each shard's mutex on its own cache lines.
#[repr(align(128))]
pub(crate) struct Padded<T>(pub(crate) T);

/// The shard for a hash. hashbrown uses the low bits (bucket) and the top 7 bits
/// (tag) of the same hash inside the shard, so the shard comes from the middle.
#[inline]
pub(crate) fn shard_of(hash: u64, mask: usize) -> usize {
    (hash >> 32) as usize & mask
}

/// A store's shards, each behind its own mutex; shared with the durable
/// layer's flusher thread.
pub(crate) type Shards = Arc<[Padded<Mutex<Shard>>]>;

/// `largest` policy: per shard, the charge of its largest linked item (0 if it has
/// none). A shard writes its own entry under its lock whenever its largest size
/// changes, so the entry is exact whenever nobody holds that lock; readers load the
/// entries without locks to find the shard holding the store-wide largest item.
pub(crate) type LargestHints = Arc<[AtomicU64]>;

/// `lru` policy: per shard, the stamp of its coldest item (its list's tail), or
/// [`NO_TAIL`]. Written by the shard under its lock whenever its tail changes, read
/// without locks to find the shard holding the store-wide least recently used item.
pub(crate) type TailHints = Arc<[AtomicU32]>;

/// A lock-free scan of `tails` at stamp `now`: the shard with the oldest tail and
/// its age, and the oldest age among the others (0 if none). Shard `own` counts
/// with `own_cap` instead if known (its oldest item other than the key being
/// stored; `None` if it has none).
pub(crate) fn scan_tails(
    tails: &[AtomicU32],
    now: u16,
    own: usize,
    own_cap: Option<Option<u16>>,
) -> (Option<usize>, u16, u16) {
    let (mut best, mut best_age, mut second) = (None, 0, 0);
    for (i, h) in tails.iter().enumerate() {
        let age = if i == own && own_cap.is_some() {
            match own_cap.flatten() {
                Some(a) => a,
                None => continue,
            }
        } else {
            match h.load(Ordering::Relaxed) {
                NO_TAIL => continue,
                v => stamp_age(now, v as u16),
            }
        };
        if best.is_none() || age > best_age {
            if best.is_some() {
                second = second.max(best_age);
            }
            (best, best_age) = (Some(i), age);
        } else {
            second = second.max(age);
        }
    }
    (best, best_age, second)
}

/// A lock-free scan of `hints`: the index and hint of the shard with the largest
/// one, and the largest hint among the others. Shard `own` counts with at most
/// `own_cap` (its largest item other than the key being stored, if known).
pub(crate) fn scan_hints(
    hints: &[AtomicU64],
    own: usize,
    own_cap: Option<u64>,
) -> (usize, u64, u64) {
    let (mut best, mut best_v, mut second_v) = (0, 0, 0);
    for (i, h) in hints.iter().enumerate() {
        let mut v = h.load(Ordering::Relaxed);
        if i == own {
            v = own_cap.map_or(v, |c| c.min(v));
        }
        if v > best_v {
            (best, best_v, second_v) = (i, v, best_v);
        } else if v > second_v {
            second_v = v;
        }
    }
    (best, best_v, second_v)
}

impl Shard {
    pub(crate) fn new(
        policy: Policy,
        hasher: DefaultHashBuilder,
        index: usize,
        shard_bits: u32,
        hints: Option<LargestHints>,
        tails: Option<TailHints>,
    ) -> Shard {
        Shard {
            table: HashTable::new(),
            slab: Slab::new(),
            order: Order::new(policy),
            hasher,
            policy,
            len: 0,
            cas_seq: 0,
            cas_shift: shard_bits,
            cas_tag: index as u64,
            stats: ShardStats::default(),
            wb: None,
            hints: hints.map(|h| (h, index)),
            tails: tails.map(|t| (t, index, NO_TAIL)),
            observer: None,
        }
    }

    /// `largest` policy: writes this shard's largest charge to its hint if it
    /// changed. Called after every change of the order, under the lock.
    #[inline]
    fn publish_largest(&self) {
        if let Some((hints, i)) = &self.hints {
            let v = self
                .order
                .largest_size()
                .map_or(0, |n| n + ITEM_OVERHEAD as u64);
            if hints[*i].load(Ordering::Relaxed) != v {
                hints[*i].store(v, Ordering::Relaxed);
            }
        }
    }

    /// `lru` policy: writes the stamp of this shard's coldest item to its tail hint
    /// if it changed. Called after every change of the order's tail, under the lock.
    #[inline]
    fn publish_tail(&mut self) {
        if let Some((tails, i, published)) = &mut self.tails {
            let v = match self.order.tail() {
                NIL => NO_TAIL,
                t => u32::from(self.slab.get(t).stamp()),
            };
            if *published != v {
                *published = v;
                tails[*i].store(v, Ordering::Relaxed);
            }
        }
    }

    /// Starts CAS values above `max_cas` plus a gap of `gap` sequence numbers.
    pub(crate) fn set_cas_floor(&mut self, max_cas: u64, gap: u64) {
        let seq = (max_cas >> self.cas_shift)
            .saturating_add(1)
            .saturating_add(gap);
        self.cas_seq = self.cas_seq.max(seq);
    }

    /// Makes sure later CAS values exceed `cas` (an item loaded from disk).
    pub(crate) fn observe_cas(&mut self, cas: u64) {
        self.set_cas_floor(cas, 0);
    }

    /// The highest CAS this shard has handed out (0 if none).
    pub(crate) fn last_cas(&self) -> u64 {
        (self.cas_seq << self.cas_shift) | self.cas_tag
    }

    /// Items linked (live or not yet reclaimed).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub(crate) fn find(&self, hash: u64, key: &[u8]) -> Option<u32> {
        let slab = &self.slab;
        let tag = Slot::tag(hash);
        self.table
            .find(hash, |s| {
                s.matches(tag) && slab.get(s.idx()).block().key() == key
            })
            .map(|s| s.idx())
    }

    #[inline]
    fn is_dead(e: &Entry, now: &Now) -> bool {
        e.gen != now.gen || (e.exptime != 0 && e.exptime <= now.rel)
    }

    /// Finds the live item for `key`, unlinking it first if it expired or was flushed.
    #[inline]
    pub(crate) fn lookup(&mut self, hash: u64, key: &[u8], now: &Now, budget: &Budget) -> Lookup {
        let Some(idx) = self.find(hash, key) else {
            return Lookup::Miss;
        };
        let e = self.slab.get(idx);
        let dead = if e.gen != now.gen {
            Lookup::Flushed
        } else if e.exptime != 0 && e.exptime <= now.rel {
            Lookup::Expired
        } else {
            return Lookup::Live(idx);
        };
        self.unlink(idx, hash, budget);
        dead
    }

    /// [`Shard::lookup`] for a store, which takes the key's place: an expired or flushed
    /// item found is reclaimed (`reclaimed`, and `expired_unfetched` if it was never
    /// fetched), as memcached counts the dead item whose memory its allocation reuses.
    #[inline]
    pub(crate) fn lookup_for_store(
        &mut self,
        hash: u64,
        key: &[u8],
        now: &Now,
        budget: &Budget,
    ) -> Option<u32> {
        let idx = self.find(hash, key)?;
        if Self::is_dead(self.slab.get(idx), now) {
            self.reclaim(idx, now, budget, false);
            return None;
        }
        Some(idx)
    }

    #[inline]
    pub(crate) fn entry(&self, idx: u32) -> &Entry {
        self.slab.get(idx)
    }

    #[inline]
    pub(crate) fn entry_mut(&mut self, idx: u32) -> &mut Entry {
        self.slab.get_mut(idx)
    }

    /// Removes item `idx` (whose key hashes to `hash`) and releases its charge.
    /// On a durable store a dirty item is queued for writing first (write-behind);
    /// a dead (expired or flushed) one too — the disk filters it, and it replaces an
    /// older disk version that would otherwise come back.
    pub(crate) fn unlink(&mut self, idx: u32, hash: u64, budget: &Budget) {
        if self.wb.is_some() {
            self.write_back(idx);
        }
        let Shard {
            table, slab, order, ..
        } = self;
        order.remove(slab, idx);
        if let Ok(found) = table.find_entry(hash, |s| s.idx() == idx) {
            found.remove();
        }
        if let Some(block) = slab.remove(idx) {
            budget.release(block.charge());
        }
        budget.release_item();
        self.len -= 1;
        self.publish_largest();
        self.publish_tail();
    }

    fn unlink_unhashed(&mut self, idx: u32, budget: &Budget) {
        let hash = self.hasher.hash_one(self.slab.get(idx).block().key());
        self.unlink(idx, hash, budget);
    }

    /// Records a hit: fetched bit, last access time, eviction order.
    #[inline]
    pub(crate) fn bump(&mut self, idx: u32, now: &Now, budget: &Budget) {
        let e = self.slab.get_mut(idx);
        e.bits |= FETCHED;
        e.atime = now.rel;
        self.touch_order(idx, budget);
    }

    /// Records an access that is not a fetch (memcached's `add` of a live key).
    #[inline]
    pub(crate) fn touch_order(&mut self, idx: u32, budget: &Budget) {
        if self.tails.is_some() {
            let was_tail = self.order.tail() == idx;
            self.slab.get_mut(idx).set_stamp(budget.stamp_now());
            self.order.touch(&mut self.slab, idx);
            if was_tail {
                self.publish_tail();
            }
        } else {
            self.order.touch(&mut self.slab, idx);
        }
    }

    #[inline]
    pub(crate) fn view(&self, idx: u32, time: TimeBase) -> ItemView {
        let e = self.slab.get(idx);
        let b = e.block();
        ItemView {
            value: crate::item::Value::new(b.clone()),
            flags: b.flags(),
            cas: b.cas(),
            exptime: if e.exptime == 0 {
                0
            } else {
                time.abs(e.exptime)
            },
        }
    }

    /// A fresh CAS value, unique across the store.
    #[inline]
    pub(crate) fn next_cas(&mut self) -> u64 {
        self.cas_seq += 1;
        (self.cas_seq << self.cas_shift) | self.cas_tag
    }

    /// Links `block` as the item for its key — in place of `existing` if given —
    /// after [`Shard::reserve`] succeeded for its charge (and, for a new key, took its
    /// item slot), under the same lock hold. Returns surplus reservation
    /// to the budget and leaves `reserved` at 0. Returns the item's index.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn install(
        &mut self,
        hash: u64,
        existing: Option<u32>,
        block: Block,
        exptime: u32,
        bits: u32,
        now: &Now,
        reserved: &mut usize,
        budget: &Budget,
    ) -> u32 {
        let new_charge = block.charge();
        self.stats.total_items += 1;
        let stamp = if self.tails.is_some() {
            budget.advance(new_charge)
        } else {
            0
        };
        let Shard {
            table,
            slab,
            order,
            hasher,
            ..
        } = self;
        let idx = match existing {
            Some(idx) => {
                let old_charge = slab.get(idx).block().charge();
                debug_assert!(*reserved + old_charge >= new_charge);
                budget.release((*reserved + old_charge).saturating_sub(new_charge));
                order.remove(slab, idx);
                let e = slab.get_mut(idx);
                // An overwrite keeps the key's LFU count and counts as an access.
                let freq = e.freq().saturating_add(1);
                let was_dirty = e.has(DIRTY);
                let old_block = e.block.replace(block);
                e.exptime = exptime;
                e.atime = now.rel;
                e.gen = now.gen;
                e.bits = bits & !DIRTY;
                if was_dirty {
                    e.bits |= DIRTY;
                }
                e.set_freq(freq);
                e.set_stamp(stamp);
                order.insert(slab, idx);
                drop(old_block);
                idx
            }
            None => {
                debug_assert!(*reserved >= new_charge);
                budget.release(reserved.saturating_sub(new_charge));
                let mut e = Entry::vacant(NIL);
                e.block = Some(block);
                e.exptime = exptime;
                e.atime = now.rel;
                e.gen = now.gen;
                e.bits = bits & !DIRTY;
                e.set_freq(0);
                e.set_stamp(stamp);
                let idx = slab.insert(e);
                table.insert_unique(hash, Slot::new(idx, hash), |s| {
                    hasher.hash_one(slab.get(s.idx()).block().key())
                });
                order.insert(slab, idx);
                self.len += 1;
                idx
            }
        };
        *reserved = 0;
        self.publish_largest();
        self.publish_tail();
        // Every store on a durable store leaves the item dirty.
        self.mark_dirty(idx);
        idx
    }

    /// Heap bytes of the shard's index structures (slab chunks and hash table).
    #[cfg(test)]
    pub(crate) fn index_bytes(&self) -> usize {
        self.slab.allocated_bytes() + self.table.allocation_size()
    }
}
