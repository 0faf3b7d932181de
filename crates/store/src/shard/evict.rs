//! A shard's evictions and reclaims (the coldest, the largest, the oldest), the
//! crawler's pass over its items, the scans of its items, and the room reserved for a
//! new item.

use std::ops::ControlFlow;

use crate::clock::TimeBase;
use crate::item::ExportedItem;
use crate::memory::{stamp_age, Budget};
use crate::policy::Policy;
use crate::slab::{Entry, DIRTY, FETCHED, NIL};

use super::{
    scan_hints, scan_tails, Crawled, Now, Scanned, Shard, Short, LRU_SLACK, MAX_SHARD_ITEMS,
    RECLAIM_SCAN, RECLAIM_SCAN_NONE,
};

impl Shard {
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

    pub(super) fn reclaim(
        &mut self,
        idx: u32,
        now: &Now,
        budget: &Budget,
        by_crawler: bool,
    ) -> usize {
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
}
