//! Making room: evicting in other shards when the key's own shard cannot free enough, by the
//! store's policy (store-wide largest or coldest item), and a new memory limit.

use std::sync::atomic::{AtomicU32, AtomicU64};

use crate::shard::{scan_hints, scan_tails, Now, Shard, Short};
use crate::slab::NIL;

use super::Store;

/// Most items one shard visit of [`Store::evict_elsewhere`] evicts: bounds the time
/// one lock is held.
const PER_VISIT: usize = 64;
/// Rounds over the shards [`Store::evict_elsewhere`] makes before it gives up.
const PASSES: usize = 16;

impl Store {
    /// Unlinks whatever item `key` has (after a failed set, like memcached); a
    /// durable store also forgets the disk version.
    pub(super) fn unlink_key(&self, si: usize, hash: u64, key: &[u8]) {
        let mut sh = self.lock(si);
        if let Some(idx) = sh.find(hash, key) {
            sh.unlink(idx, hash, &self.budget);
        }
        sh.tombstone(key, false);
    }

    /// After a store in shard `own` (of the key `key`, hashing to `hash`) could not
    /// reserve its memory under the shard's lock: evicts elsewhere, without that
    /// lock, reserving what it frees until `need.bytes` more bytes are reserved and,
    /// when the entry bound was reached (`need.item`), at least one item went (the
    /// store takes the freed slot under its lock when it tries again). False if
    /// nothing could be freed (or, under contention that keeps taking the freed
    /// memory, after a bounded amount of work).
    ///
    /// `lfu`, `fifo`: the own shard ran out of evictable items, so this evicts
    /// from the other shards, one lock at a time. `largest`: see
    /// [`Store::evict_largest`]; `lru`: see [`Store::evict_oldest`].
    pub(super) fn evict_elsewhere(
        &self,
        own: usize,
        (hash, key): (u64, &[u8]),
        need: Short,
        reserved: &mut usize,
        now: &Now,
    ) -> bool {
        if let Some(hints) = &self.hints {
            return self.evict_largest(hints, own, (hash, key), need, reserved, now);
        }
        if let Some(tails) = &self.tails {
            return self.evict_oldest(tails, own, (hash, key), need, reserved, now);
        }
        let (mut need, mut item) = (need.bytes, need.item);
        for _ in 0..PASSES {
            if !item && self.budget.try_reserve(need) {
                *reserved += need;
                return true;
            }
            let mut progress = false;
            for k in 1..self.shards.len() {
                let si = (own + k) & self.mask;
                // At least one item when a slot is missing.
                let want = if item { need.max(1) } else { need };
                let freed = self.lock(si).evict_some(want, PER_VISIT, now, &self.budget);
                if freed == 0 {
                    continue;
                }
                progress = true;
                item = false;
                if self.take_freed(&mut need, reserved) {
                    return true;
                }
            }
            if !progress {
                return false;
            }
        }
        false
    }

    /// Reserves what is free now, up to `need` (others may be taking it too);
    /// true once `need` is reserved.
    fn take_freed(&self, need: &mut usize, reserved: &mut usize) -> bool {
        let free = self.budget.limit().saturating_sub(self.budget.used());
        let take = (*need).min(free);
        if take > 0 && self.budget.try_reserve(take) {
            *reserved += take;
            *need -= take;
        }
        *need == 0
    }

    /// `largest`: evicts the store-wide largest item until `need` bytes are
    /// reserved. Each round scans every shard's hint without locks, locks only the
    /// shard with the largest one, and evicts its largest items while they are at
    /// least as large as the runner-up's hint (at most [`PER_VISIT`] per visit). In
    /// the own shard the key being stored is never evicted: that shard counts with
    /// its largest other item.
    fn evict_largest(
        &self,
        hints: &[AtomicU64],
        own: usize,
        key: (u64, &[u8]),
        need: Short,
        reserved: &mut usize,
        now: &Now,
    ) -> bool {
        self.evict_store_wide(
            own,
            key,
            need,
            reserved,
            |own_cap| {
                let (si, top, floor) = scan_hints(hints, own, own_cap);
                (top != 0).then_some((si, floor))
            },
            |sh, need, floor, keep| {
                sh.evict_largest(need, PER_VISIT, floor, keep, now, &self.budget)
            },
        )
    }

    /// `lru`: evicts the store-wide least recently used item (within
    /// [`crate::shard::LRU_SLACK`]) until `need` bytes are reserved, as [`Store::evict_largest`]
    /// does by size: each round scans every shard's tail hint without locks, locks
    /// only the shard with the oldest one, and evicts its coldest items while they
    /// are (within the slack) at least as old as the runner-up's (at most
    /// [`PER_VISIT`] per visit). In the own shard the key being stored is never
    /// evicted.
    ///
    /// Why store-wide: the lists are per shard, and a shard holds few large items
    /// (under `-m 64`, about 5 of 200 KB in each of 64 shards), so the coldest item
    /// of the storing key's shard is often one of the newest of the store.
    fn evict_oldest(
        &self,
        tails: &[AtomicU32],
        own: usize,
        key: (u64, &[u8]),
        need: Short,
        reserved: &mut usize,
        now: &Now,
    ) -> bool {
        self.evict_store_wide(
            own,
            key,
            need,
            reserved,
            |own_cap| {
                let (best, _, floor) = scan_tails(tails, self.budget.stamp_now(), own, own_cap);
                best.map(|si| (si, floor))
            },
            |sh, need, floor, keep| {
                sh.evict_oldest(need, PER_VISIT, floor, keep, now, &self.budget)
            },
        )
    }

    /// The loop of [`Store::evict_largest`] and [`Store::evict_oldest`]: until `need` bytes
    /// are reserved, `pick` chooses a shard and a floor from the lock-free hints (given the
    /// own shard's cap as `evict` last saw it under its lock), and `evict` evicts from that
    /// shard down to the floor, never the key being stored (`keep`). Gives up when nothing
    /// is left to pick, when picked shards keep having changed since their hint, or after a
    /// bounded amount of work.
    fn evict_store_wide<Cap: Copy, Floor>(
        &self,
        own: usize,
        (hash, key): (u64, &[u8]),
        need: Short,
        reserved: &mut usize,
        mut pick: impl FnMut(Option<Cap>) -> Option<(usize, Floor)>,
        mut evict: impl FnMut(&mut Shard, usize, Floor, u32) -> (usize, Cap),
    ) -> bool {
        let (mut need, mut item) = (need.bytes, need.item);
        // The own shard's cap as last seen under its lock.
        let mut own_cap = None;
        let mut idle = 0;
        for _ in 0..PASSES * PER_VISIT * self.shards.len() {
            if !item && self.budget.try_reserve(need) {
                *reserved += need;
                return true;
            }
            let Some((si, floor)) = pick(own_cap) else {
                return false;
            };
            let mut sh = self.lock(si);
            let keep = if si == own {
                sh.find(hash, key).unwrap_or(NIL)
            } else {
                NIL
            };
            // At least one item when a slot is missing.
            let want = if item { need.max(1) } else { need };
            let (freed, next) = evict(&mut sh, want, floor, keep);
            drop(sh);
            if si == own {
                own_cap = Some(next);
            }
            if freed == 0 {
                // The shard changed since the scan (or holds only the own key):
                // rescan, but give up if that keeps happening.
                idle += 1;
                if idle > 2 * self.shards.len() {
                    return false;
                }
                continue;
            }
            idle = 0;
            item = false;
            if self.take_freed(&mut need, reserved) {
                return true;
            }
        }
        false
    }

    /// Changes the memory limit at run time (memcached's `cache_memlimit`). A higher
    /// limit takes effect at once. A lower one evicts by the policy, a share of the
    /// excess from every shard per round (at most [`PER_VISIT`] items per shard lock),
    /// until the charged bytes fit; meanwhile no store can reserve memory. Under the
    /// `none` policy only expired and flushed items go, and stores fail as out of
    /// memory until deletes bring the bytes under the new limit. Returns the charged
    /// bytes afterwards.
    pub fn set_memory_limit(&self, limit: usize) -> usize {
        self.budget.set_limit(limit);
        let now = self.now();
        let n = self.shards.len();
        // Each round frees something or ends: bounded by the number of items.
        loop {
            let over = self.budget.used().saturating_sub(self.budget.limit());
            if over == 0 {
                break;
            }
            let share = over.div_ceil(n);
            let mut freed = 0;
            for si in 0..n {
                if self.budget.used() <= self.budget.limit() {
                    break;
                }
                freed += self
                    .lock(si)
                    .evict_some(share, PER_VISIT, &now, &self.budget);
            }
            if freed == 0 {
                break;
            }
        }
        self.budget.used()
    }
}
