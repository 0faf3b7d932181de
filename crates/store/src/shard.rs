//! One shard: a hash table of slab indices, the slab of item entries, the eviction
//! order and the shard's counters. Everything here runs under the shard's mutex;
//! the command semantics built from these primitives live in `store.rs`.

use std::hash::BuildHasher;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use hashbrown::{DefaultHashBuilder, HashTable};
use parking_lot::Mutex;

use crate::clock::TimeBase;
use crate::item::{Block, ExportedItem, ItemView, ITEM_OVERHEAD};
use crate::memory::{stamp_age, Budget};
use crate::policy::{Order, Policy};
use crate::slab::{Entry, Slab, DIRTY, FETCHED, NIL};
use crate::stats::ShardStats;
use crate::wb::{Op, Wb};

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

    /// `lru` policy: the age at `now` of the next victim other than `keep` (`None`
    /// if there is none).
    pub(crate) fn oldest_age_except(&self, keep: u32, now: u16) -> Option<u16> {
        let slab = &self.slab;
        match self.order.walk_cold(slab, |i| {
            if i == keep {
                ControlFlow::Continue(())
            } else {
                ControlFlow::Break(i)
            }
        }) {
            ControlFlow::Break(i) => Some(stamp_age(now, slab.get(i).stamp())),
            ControlFlow::Continue(()) => None,
        }
    }

    /// `lru` policy: whether this shard's next victim (never `keep`) is within
    /// [`LRU_SLACK`] of the store-wide least recently used item, by the other
    /// shards' tail hints: then the eviction can stay under this lock.
    fn holds_store_oldest(&self, keep: u32, budget: &Budget) -> bool {
        let Some((tails, own, _)) = &self.tails else {
            return true;
        };
        let now = budget.stamp_now();
        let Some(age) = self.oldest_age_except(keep, now) else {
            return false;
        };
        let (_, top, _) = scan_tails(tails, now, *own, Some(Some(age)));
        age.saturating_add(LRU_SLACK) >= top
    }

    /// Charge of the next victim other than `keep` by the eviction order, dead or
    /// not (0 if none). Used by the `largest` policy, where that is the
    /// largest item of the shard other than `keep`.
    pub(crate) fn largest_except(&self, keep: u32) -> u64 {
        let slab = &self.slab;
        match self.order.walk_cold(slab, |i| {
            if i == keep {
                ControlFlow::Continue(())
            } else {
                ControlFlow::Break(i)
            }
        }) {
            ControlFlow::Break(i) => slab.get(i).block().charge() as u64,
            ControlFlow::Continue(()) => 0,
        }
    }

    /// Whether the item `largest` evicts next in this shard (never `keep`) is at
    /// least as large as every other shard's largest (by their hints): then the
    /// store-wide largest item is here and the eviction can stay under this lock.
    fn holds_store_largest(&self, keep: u32) -> bool {
        let Some((hints, own)) = &self.hints else {
            return true;
        };
        let c = self.largest_except(keep);
        c != 0 && c >= scan_hints(hints, *own, Some(0)).1
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

    /// Marks a live item as changed since it was last written (durable stores).
    #[inline]
    pub(crate) fn mark_dirty(&mut self, idx: u32) {
        let Some(wb) = &mut self.wb else { return };
        let e = self.slab.get_mut(idx);
        if e.bits & DIRTY == 0 {
            e.bits |= DIRTY;
            if wb.track_dirty {
                wb.dirty.push(idx);
            }
        }
    }

    /// Marks an item as identical to its disk (or queued) version.
    pub(crate) fn mark_clean(&mut self, idx: u32) {
        self.slab.get_mut(idx).bits &= !DIRTY;
    }

    /// Records a deletion of `key` (durable stores): a tombstone that supersedes
    /// the disk version. `blind`: the key was not resident, so whether it existed
    /// is unknown until `load` reads the disk.
    pub(crate) fn tombstone(&mut self, key: &[u8], blind: bool) {
        if let Some(wb) = &mut self.wb {
            wb.push(
                key,
                Op::Delete {
                    blind,
                    existed: None,
                },
            );
        }
    }

    /// A delete of a key that is not resident (durable stores): if `load` found
    /// out that a queued blind tombstone removed a live disk version, consumes that
    /// and returns true (the delete hit); if the key's newest version is a queued
    /// put (written behind on eviction or expiry), replaces it with a tombstone and
    /// returns whether that version was live at `now`; otherwise queues a blind
    /// tombstone.
    pub(crate) fn blind_delete(&mut self, key: &[u8], now: &Now) -> bool {
        let Some(wb) = &mut self.wb else { return false };
        if let Some(Op::Purge) = wb.queued(key) {
            // `load` found only a dead record: known absent.
            return false;
        }
        let gen = wb.gen_base + u64::from(now.gen);
        if let Some(Op::Put(r)) = wb.queued(key) {
            // Newer than anything on disk, so the disk version does not matter.
            let live = r.visible(now.abs, gen);
            self.tombstone(key, false);
            return live;
        }
        if let Some(Op::Delete { blind, existed }) = wb.queued(key) {
            if !*blind {
                // A resident delete already queued this tombstone: the key is
                // known absent, and the disk version (not yet overwritten) must
                // not be reported as a fresh hit.
                return false;
            }
            if *existed == Some(true) {
                *existed = Some(false);
                return true;
            }
            if existed.is_some() {
                // Already resolved as absent: nothing new to record.
                return false;
            }
        }
        self.tombstone(key, true);
        false
    }

    /// Whether the purge may delete `key`'s disk record, which it found dead with
    /// CAS `cas`: no op of the key is queued or in flight (a newer version or a
    /// delete is coming), and no version of it is resident other than the clean copy
    /// of that same record (which is then as dead as the record).
    pub(crate) fn purge_allowed(&mut self, hash: u64, key: &[u8], cas: u64) -> bool {
        let Some(wb) = &mut self.wb else { return false };
        if wb.queued(key).is_some() {
            return false;
        }
        match self.find(hash, key) {
            None => true,
            Some(idx) => {
                let e = self.slab.get(idx);
                !e.has(DIRTY) && e.block().cas() == cas
            }
        }
    }

    /// Queues a put of a live dirty item and marks it clean.
    pub(crate) fn write_back(&mut self, idx: u32) -> bool {
        let Some(wb) = &mut self.wb else { return false };
        let e = self.slab.get_mut(idx);
        if e.bits & DIRTY == 0 {
            return false;
        }
        e.bits &= !DIRTY;
        let e = self.slab.get(idx);
        let rec = wb.rec(e);
        let key: Box<[u8]> = e.block().key().into();
        wb.push(&key, Op::Put(rec));
        true
    }

    /// Write-back of every dirty item whose index is in the dirty list (at most
    /// `max` indices); returns whether the list is now empty.
    pub(crate) fn write_back_listed(&mut self, max: usize) -> bool {
        let Some(wb) = &mut self.wb else { return true };
        let n = wb.dirty.len().min(max);
        let start = wb.dirty.len() - n;
        let idxs: Vec<u32> = wb.dirty.drain(start..).collect();
        for idx in idxs {
            if self.slab.is_occupied(idx) {
                self.write_back(idx);
            }
        }
        match &self.wb {
            Some(wb) => wb.dirty.is_empty(),
            None => true,
        }
    }

    /// Write-back of every dirty item of the shard.
    pub(crate) fn write_back_all(&mut self) {
        let idxs: Vec<u32> = self.slab.occupied().collect();
        for idx in idxs {
            self.write_back(idx);
        }
        if let Some(wb) = &mut self.wb {
            wb.dirty.clear();
        }
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

    /// Frees one item's memory: an expired or flushed item among the coldest few if
    /// there is one (counted in `reclaimed`), else — unless the policy is `none` —
    /// the coldest item other than `keep` (counted in `evictions`). Returns the bytes
    /// freed, 0 if nothing could be.
    pub(crate) fn evict_one(&mut self, now: &Now, budget: &Budget, keep: u32) -> usize {
        let scan = if self.policy == Policy::None {
            RECLAIM_SCAN_NONE
        } else {
            RECLAIM_SCAN
        };
        let slab = &self.slab;
        let mut victim = NIL;
        let mut seen = 0;
        let dead = self.order.walk_cold(slab, |i| {
            if i == keep {
                return ControlFlow::Continue(());
            }
            if Self::is_dead(slab.get(i), now) {
                return ControlFlow::Break(i);
            }
            if victim == NIL {
                victim = i;
            }
            seen += 1;
            if seen >= scan {
                ControlFlow::Break(NIL)
            } else {
                ControlFlow::Continue(())
            }
        });
        if let ControlFlow::Break(i) = dead {
            if i != NIL {
                return self.reclaim(i, now, budget, false);
            }
        }
        if self.policy == Policy::None || victim == NIL {
            return 0;
        }
        self.stats.evictions += 1;
        let e = self.slab.get(victim);
        if !e.has(FETCHED) {
            self.stats.evicted_unfetched += 1;
        }
        if let Some(observer) = &self.observer {
            observer.evicted(&Self::seen(e, now));
        }
        let freed = e.block().charge();
        self.unlink_unhashed(victim, budget);
        freed
    }

    /// Evicts (as [`Shard::evict_one`]) until `want` bytes are freed or `max_items`
    /// items went; returns the bytes freed.
    pub(crate) fn evict_some(
        &mut self,
        want: usize,
        max_items: usize,
        now: &Now,
        budget: &Budget,
    ) -> usize {
        let mut freed = 0;
        for _ in 0..max_items {
            if freed >= want {
                break;
            }
            match self.evict_one(now, budget, NIL) {
                0 => break,
                n => freed += n,
            }
        }
        freed
    }

    /// An item as the eviction observer hears of it.
    fn seen<'e>(e: &'e Entry, now: &Now) -> crate::Evicted<'e> {
        let b = e.block();
        crate::Evicted {
            key: b.key(),
            value_len: b.value().len(),
            flags: b.flags(),
            fetched: e.has(FETCHED),
            ttl: if e.exptime == 0 {
                -1
            } else {
                i64::from(e.exptime) - i64::from(now.rel)
            },
            idle: u64::from(now.rel.saturating_sub(e.atime)),
        }
    }

    fn reclaim(&mut self, idx: u32, now: &Now, budget: &Budget, by_crawler: bool) -> usize {
        self.stats.reclaimed += 1;
        if !self.slab.get(idx).has(FETCHED) {
            self.stats.expired_unfetched += 1;
        }
        if let Some(observer) = &self.observer {
            observer.reclaimed(&Self::seen(self.slab.get(idx), now), by_crawler);
        }
        let freed = self.slab.get(idx).block().charge();
        self.unlink_unhashed(idx, budget);
        freed
    }

    /// One crawler step: examines slab slots `from..` — at most `max` of them —
    /// and reclaims (as an eviction scan does, see [`Shard::unlink`] for a durable
    /// store's dirty items) every expired or flushed item among them. Walks the slab
    /// by index, not the eviction order, so reclaiming never disturbs where the
    /// walk is; a slot freed and reused behind the cursor waits for the next pass.
    /// Allocates nothing (except the queued write-behind op of a dirty item).
    pub(crate) fn crawl(&mut self, from: u32, max: usize, now: &Now, budget: &Budget) -> Crawled {
        let slots = self.slab.slots();
        let max = u32::try_from(max).unwrap_or(u32::MAX);
        let end = from.saturating_add(max).min(slots);
        let mut out = Crawled {
            examined: end.saturating_sub(from) as usize,
            checked: 0,
            reclaimed: 0,
            next: (end < slots).then_some(end),
        };
        for idx in from..end {
            let e = self.slab.get(idx);
            if e.block.is_none() {
                continue;
            }
            out.checked += 1;
            if Self::is_dead(e, now) {
                self.reclaim(idx, now, budget, true);
                out.reclaimed += 1;
            }
        }
        self.stats.crawler_items_checked += out.checked as u64;
        self.stats.crawler_reclaimed += out.reclaimed as u64;
        out
    }

    /// One export step: examines slab slots `from..` — at most `max` of them — and
    /// appends every live item among them whose key `keep` accepts to `out`. Walks
    /// the slab by index like [`Shard::crawl`], and changes nothing: dead items
    /// stay (for the crawler), and no fetched bit, access time, eviction order or
    /// counter moves. Allocates nothing beyond `out`'s growth. `dirty_only`: only items
    /// changed since they were last written (a durable store's; the rest are on its disk
    /// or queued for it).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn scan(
        &self,
        from: u32,
        max: usize,
        now: &Now,
        time: TimeBase,
        dirty_only: bool,
        mut keep: impl FnMut(&[u8]) -> bool,
        out: &mut Vec<ExportedItem>,
    ) -> Scanned {
        let slots = self.slab.slots();
        let max = u32::try_from(max).unwrap_or(u32::MAX);
        let end = from.saturating_add(max).min(slots);
        for idx in from..end {
            let e = self.slab.get(idx);
            let Some(b) = &e.block else { continue };
            if Self::is_dead(e, now) || (dirty_only && !e.has(DIRTY)) || !keep(b.key()) {
                continue;
            }
            let exptime = if e.exptime == 0 {
                0
            } else {
                time.abs(e.exptime)
            };
            out.push(
                ExportedItem::from_block(b.clone(), exptime, b.cas())
                    .with_access(time.abs(e.atime), e.has(FETCHED)),
            );
        }
        Scanned {
            examined: end.saturating_sub(from) as usize,
            next: (end < slots).then_some(end),
        }
    }

    /// Makes sure `reserved` plus the charge of `existing` (the item the new one will
    /// replace, if any) covers `new_charge`, reserving from the budget and evicting
    /// from this shard (never `existing`) as needed; a new key (`existing` `None`) also
    /// takes an item slot under the entry bound, which [`Shard::install`] then uses —
    /// the caller installs under this same lock hold. On failure returns what is still
    /// missing (no slot is kept); `reserved` keeps the bytes obtained.
    pub(crate) fn reserve(
        &mut self,
        new_charge: usize,
        existing: Option<u32>,
        reserved: &mut usize,
        now: &Now,
        budget: &Budget,
    ) -> Result<(), Short> {
        let old = existing.map_or(0, |i| self.slab.get(i).block().charge());
        let keep = existing.unwrap_or(NIL);
        // A new item needs a slab index below 2^24. `Store::new` picks enough shards
        // that the memory limit runs out first; this guards against skew.
        while existing.is_none() && self.len >= MAX_SHARD_ITEMS {
            if self.evict_one(now, budget, keep) == 0 {
                return Err(Short {
                    bytes: new_charge.saturating_sub(*reserved),
                    item: false,
                });
            }
        }
        // A replacement keeps its key's slot.
        let mut slot = existing.is_some();
        loop {
            slot = slot || budget.try_take_item();
            let need = new_charge.saturating_sub(old + *reserved);
            if budget.try_reserve(need) {
                *reserved += need;
                if slot {
                    return Ok(());
                }
            }
            let short = Short {
                bytes: new_charge.saturating_sub(old + *reserved),
                item: !slot,
            };
            // `largest` evicts here only while this shard holds the store-wide
            // largest item; otherwise the caller releases the lock and evicts
            // elsewhere (`Store::evict_elsewhere`). `lru` likewise evicts here only
            // while this shard's coldest item is (within the slack) the store-wide
            // coldest.
            let elsewhere = (self.policy == Policy::Largest && !self.holds_store_largest(keep))
                || (self.tails.is_some() && !self.holds_store_oldest(keep, budget));
            if elsewhere || self.evict_one(now, budget, keep) == 0 {
                if slot && existing.is_none() {
                    budget.release_item();
                }
                return Err(short);
            }
        }
    }

    /// `largest` policy: evicts (as [`Shard::evict_one`], never `keep`) while the
    /// next victim's charge is at least `floor` (the largest of the other shards),
    /// until `want` bytes are freed or `max_items` items went. Returns the bytes
    /// freed and the charge of the next victim afterwards (0 if none).
    pub(crate) fn evict_largest(
        &mut self,
        want: usize,
        max_items: usize,
        floor: u64,
        keep: u32,
        now: &Now,
        budget: &Budget,
    ) -> (usize, u64) {
        let mut freed = 0;
        for _ in 0..max_items {
            let c = self.largest_except(keep);
            if freed >= want || c == 0 || c < floor {
                return (freed, c);
            }
            match self.evict_one(now, budget, keep) {
                0 => return (freed, 0),
                n => freed += n,
            }
        }
        (freed, self.largest_except(keep))
    }

    /// `lru` policy: evicts (as [`Shard::evict_one`], never `keep`) while the next
    /// victim's age is within [`LRU_SLACK`] of `floor` (the oldest age of the other
    /// shards) or above, until `want` bytes are freed or `max_items` items went.
    /// Returns the bytes freed and the next victim's age afterwards.
    pub(crate) fn evict_oldest(
        &mut self,
        want: usize,
        max_items: usize,
        floor: u16,
        keep: u32,
        now: &Now,
        budget: &Budget,
    ) -> (usize, Option<u16>) {
        let mut freed = 0;
        for _ in 0..max_items {
            let age = self.oldest_age_except(keep, budget.stamp_now());
            match age {
                Some(a) if freed < want && a.saturating_add(LRU_SLACK) >= floor => {}
                _ => return (freed, age),
            }
            match self.evict_one(now, budget, keep) {
                0 => return (freed, None),
                n => freed += n,
            }
        }
        (freed, self.oldest_age_except(keep, budget.stamp_now()))
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
