//! Reads: `get`, `gat`, `touch`, meta get (`mg`, with its win tokens and access history)
//! and `peek`.

use crate::clock::{expiry_from_wire, Expiry, TimeBase};
use crate::item::{item_charge, Block, ItemView, MetaView, MAX_KEY_LEN};
use crate::request::MetaGetOpts;
use crate::shard::{Lookup, Now, Shard};
use crate::slab::{STALE, WIN_SENT};

use super::{Store, MAX_ATTEMPTS};

impl Store {
    /// `get`/`gets`: the live item, counted in `get_hits`/`get_misses` (and
    /// `get_expired`/`get_flushed`); a hit updates recency.
    pub fn get(&self, key: &[u8]) -> Option<ItemView> {
        let now = self.now();
        let hash = self.hash(key);
        let mut sh = self.lock(self.shard_index(hash));
        match sh.lookup(hash, key, &now, &self.budget) {
            Lookup::Live(idx) => {
                sh.bump(idx, &now, &self.budget);
                sh.stats.get_hits += 1;
                Some(sh.view(idx, self.time))
            }
            miss => {
                Self::count_dead(&mut sh, miss);
                sh.stats.get_misses += 1;
                None
            }
        }
    }

    /// Sets a live item's exptime; false if the new exptime is already past, in
    /// which case the caller unlinks the item.
    fn retime(sh: &mut Shard, idx: u32, e: Expiry, time: TimeBase) -> bool {
        match e {
            Expiry::Expired => false,
            e => {
                sh.entry_mut(idx).exptime = time.exptime(e);
                sh.mark_dirty(idx);
                true
            }
        }
    }

    /// `touch` and `gat`: [`Store::retime`], except that an exptime already past leaves
    /// the item linked, expired, as memcached does ([`Store::expired_exptime`]); false
    /// when it cannot be kept, in which case the caller unlinks the item.
    fn retime_or_expire(sh: &mut Shard, idx: u32, e: Expiry, now: &Now, time: TimeBase) -> bool {
        match (e, Self::expired_exptime(sh, now)) {
            (Expiry::Expired, Some(expired)) => {
                sh.entry_mut(idx).exptime = expired;
                true
            }
            (e, _) => Self::retime(sh, idx, e, time),
        }
    }

    /// `gat`/`gats`: like `get`, also setting a new exptime. Counted as memcached
    /// does: in `touch_hits`/`touch_misses` only (not in `get_hits`/`get_misses`).
    pub fn get_and_touch(&self, key: &[u8], exptime: i64) -> Option<ItemView> {
        let now = self.now();
        let e = expiry_from_wire(exptime, now.abs);
        let hash = self.hash(key);
        let mut sh = self.lock(self.shard_index(hash));
        match sh.lookup(hash, key, &now, &self.budget) {
            Lookup::Live(idx) => {
                sh.stats.touch_hits += 1;
                sh.bump(idx, &now, &self.budget);
                if Self::retime_or_expire(&mut sh, idx, e, &now, self.time) {
                    Some(sh.view(idx, self.time))
                } else {
                    let mut view = sh.view(idx, self.time);
                    view.exptime = now.abs;
                    sh.unlink(idx, hash, &self.budget);
                    sh.tombstone(key, false);
                    Some(view)
                }
            }
            miss => {
                Self::count_dead(&mut sh, miss);
                sh.stats.touch_misses += 1;
                None
            }
        }
    }

    /// `touch`: sets a new exptime; `touch_hits`/`touch_misses`.
    pub fn touch(&self, key: &[u8], exptime: i64) -> bool {
        self.throttle();
        let now = self.now();
        let e = expiry_from_wire(exptime, now.abs);
        let hash = self.hash(key);
        let mut sh = self.lock(self.shard_index(hash));
        match sh.lookup(hash, key, &now, &self.budget) {
            Lookup::Live(idx) => {
                sh.stats.touch_hits += 1;
                sh.bump(idx, &now, &self.budget);
                if !Self::retime_or_expire(&mut sh, idx, e, &now, self.time) {
                    sh.unlink(idx, hash, &self.budget);
                    sh.tombstone(key, false);
                }
                true
            }
            _ => {
                sh.stats.touch_misses += 1;
                false
            }
        }
    }

    /// Meta get (`mg`). `None` is a miss (also when vivifying fails for lack of
    /// memory). Counted in `get_hits`/`get_misses`, or `touch_hits`/`touch_misses`
    /// when `opts.touch` is set; a vivified item counts as a hit (memcached does).
    ///
    /// Win token (`won`): on a vivified miss; on a stale item when no token was handed
    /// out; with `recache` when the remaining TTL is below it and no token was handed
    /// out. Once handed out, later callers see `win_already_sent` until the item is
    /// replaced by a store (or re-invalidated by `meta_delete`). `hit_before` and
    /// `last_access_age` describe the item before this request; the access then
    /// updates them unless `no_bump`.
    pub fn meta_get(&self, key: &[u8], opts: &MetaGetOpts) -> Option<MetaView> {
        if opts.vivify.is_some() || opts.touch.is_some() {
            self.throttle();
        }
        let now = self.now();
        let hash = self.hash(key);
        let si = self.shard_index(hash);
        let touch = opts.touch.map(|t| expiry_from_wire(t, now.abs));
        let mut reserved = 0;
        let mut fresh: Option<Block> = None;
        for _ in 0..MAX_ATTEMPTS {
            let mut sh = self.lock(si);
            let miss = match sh.lookup(hash, key, &now, &self.budget) {
                Lookup::Live(idx) => {
                    self.budget.release(reserved);
                    return Some(self.meta_hit(&mut sh, idx, hash, opts, touch, &now));
                }
                miss => miss,
            };
            Self::count_dead(&mut sh, miss);
            let vivify = match opts.vivify {
                Some(v) if key.len() <= MAX_KEY_LEN && !self.vivify_too_large(key) => v,
                _ => {
                    self.budget.release(reserved);
                    Self::count_meta_miss(&mut sh, touch.is_some());
                    return None;
                }
            };
            let Some(exptime) = self.stored_exptime(expiry_from_wire(vivify, now.abs)) else {
                // Vivified already expired: the caller wins, nothing is stored.
                self.budget.release(reserved);
                let cas = sh.next_cas();
                Self::count_meta_hit(&mut sh, touch.is_some());
                let block = Block::new(key, &[], 0);
                block.set_cas(cas);
                return Some(MetaView {
                    item: ItemView {
                        value: crate::item::Value::new(block),
                        flags: 0,
                        cas,
                        exptime: now.abs,
                    },
                    hit_before: false,
                    last_access_age: 0,
                    ttl: 0,
                    won: true,
                    stale: false,
                    win_already_sent: false,
                });
            };
            let charge = fresh
                .get_or_insert_with(|| Block::new(key, &[], 0))
                .charge();
            match sh.reserve(charge, None, &mut reserved, &now, &self.budget) {
                Ok(()) => {
                    let Some(block) = fresh.take() else {
                        unreachable!("built above")
                    };
                    let cas = sh.next_cas();
                    block.set_cas(cas);
                    let idx = sh.install(
                        hash,
                        None,
                        block,
                        exptime,
                        WIN_SENT,
                        &now,
                        &mut reserved,
                        &self.budget,
                    );
                    if !opts.no_bump {
                        sh.bump(idx, &now, &self.budget);
                    }
                    Self::count_meta_hit(&mut sh, touch.is_some());
                    return Some(MetaView {
                        item: sh.view(idx, self.time),
                        hit_before: false,
                        last_access_age: 0,
                        ttl: Self::ttl(exptime, &now),
                        won: true,
                        stale: false,
                        win_already_sent: false,
                    });
                }
                Err(need) => {
                    drop(sh);
                    if !self.evict_elsewhere(si, (hash, key), need, &mut reserved, &now) {
                        break;
                    }
                }
            }
        }
        self.budget.release(reserved);
        Self::count_meta_miss(&mut self.lock(si), touch.is_some());
        None
    }

    fn count_meta_miss(sh: &mut Shard, touch: bool) {
        if touch {
            sh.stats.touch_misses += 1;
        } else {
            sh.stats.get_misses += 1;
        }
    }

    /// The item and its meta state without counting, bumping or handing out a win
    /// token (for `me`, debugging and tests). `won` is always false.
    pub fn peek(&self, key: &[u8]) -> Option<MetaView> {
        let now = self.now();
        let hash = self.hash(key);
        let mut sh = self.lock(self.shard_index(hash));
        let Lookup::Live(idx) = sh.lookup(hash, key, &now, &self.budget) else {
            return None;
        };
        let e = sh.entry(idx);
        Some(MetaView {
            hit_before: e.has(crate::slab::FETCHED),
            last_access_age: u64::from(now.rel.saturating_sub(e.atime)),
            ttl: Self::ttl(e.exptime, &now),
            won: false,
            stale: e.has(STALE),
            win_already_sent: e.has(WIN_SENT),
            item: sh.view(idx, self.time),
        })
    }

    fn vivify_too_large(&self, key: &[u8]) -> bool {
        let c = item_charge(key.len(), 0);
        c > self.config.item_size_max || c > self.budget.limit()
    }

    fn count_meta_hit(sh: &mut Shard, touch: bool) {
        if touch {
            sh.stats.touch_hits += 1;
        } else {
            sh.stats.get_hits += 1;
        }
    }

    fn meta_hit(
        &self,
        sh: &mut Shard,
        idx: u32,
        hash: u64,
        opts: &MetaGetOpts,
        touch: Option<Expiry>,
        now: &Now,
    ) -> MetaView {
        let (hit_before, last_access_age, win_sent, stale) = {
            let e = sh.entry(idx);
            (
                e.has(crate::slab::FETCHED),
                u64::from(now.rel.saturating_sub(e.atime)),
                e.has(WIN_SENT),
                e.has(STALE),
            )
        };
        let mut expire_now = false;
        if let Some(t) = touch {
            expire_now = !Self::retime(sh, idx, t, self.time);
        }
        let exptime = sh.entry(idx).exptime;
        let mut won = false;
        if let Some(r) = opts.recache {
            let remaining = u64::from(exptime.saturating_sub(now.rel));
            if !win_sent && exptime != 0 && remaining < r {
                won = true;
            }
        }
        if stale && !win_sent {
            won = true;
        }
        if won {
            sh.entry_mut(idx).bits |= WIN_SENT;
        }
        if !opts.no_bump {
            sh.bump(idx, now, &self.budget);
        }
        Self::count_meta_hit(sh, touch.is_some());
        let mut item = sh.view(idx, self.time);
        let ttl = if expire_now {
            item.exptime = now.abs;
            let key: Box<[u8]> = sh.entry(idx).block().key().into();
            sh.unlink(idx, hash, &self.budget);
            sh.tombstone(&key, false);
            0
        } else {
            Self::ttl(exptime, now)
        };
        MetaView {
            item,
            hit_before,
            last_access_age,
            ttl,
            won,
            stale,
            win_already_sent: win_sent,
        }
    }
}
