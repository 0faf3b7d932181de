//! Writes: `set`/`add`/`replace`/`append`/`prepend`/`cas`, meta set, `incr`/`decr` and
//! meta arithmetic, `delete` and meta delete, and `import`. Every store of a new item goes
//! through one sequence ([`Store::write_item`]): look the key up under its shard's lock,
//! decide, reserve room (evicting as need be), give the item its CAS, install it.

use std::sync::atomic::Ordering;

use parking_lot::MutexGuard;

use crate::clock::{expiry_from_abs, expiry_from_wire, Expiry};
use crate::item::{item_charge, Block, ExportedItem, MAX_KEY_LEN};
use crate::request::{
    ArithRequest, ArithStatus, DeleteStatus, ImportMode, MetaDeleteOpts, SetMode, SetRequest,
    SetStatus,
};
use crate::shard::{Lookup, Now, Shard};
use crate::slab::{STALE, WIN_SENT};

use super::counter::{format_u64, parse_counter};
use super::{Store, MAX_ATTEMPTS};

/// What a write decided under its shard's lock, the key's live item in hand.
enum Plan<R> {
    /// Nothing to store: the answer.
    Answer(R),
    /// Store a new item in place of the live one: `block` (`None`: the block built before
    /// the lock), with `exptime` and item state `bits`.
    Store {
        block: Option<Block>,
        exptime: u32,
        bits: u32,
    },
}

/// How [`Store::write_item`] ended.
enum Written<'s, R> {
    /// The plan's answer; nothing was stored.
    Answer(R),
    /// Stored with `cas` and `exptime` in place of `found`; the shard is still locked
    /// (`sh`) for the caller's counting.
    Stored {
        sh: MutexGuard<'s, Shard>,
        found: Option<u32>,
        cas: u64,
        exptime: u32,
    },
    /// No room even after evicting elsewhere.
    OutOfMemory,
}

/// Whether a store compares CAS values and replaces (a `cas`, or a meta set with `C` in
/// set or replace mode): it misses without a live item.
#[inline]
fn compares_cas(req: &SetRequest<'_>) -> bool {
    req.compare_cas.is_some() && matches!(req.mode, SetMode::Set | SetMode::Replace)
}

impl Store {
    /// `set`/`add`/`replace`/`append`/`prepend`/`cas` and meta `ms`; see
    /// [`SetRequest`] for the CAS and invalidation rules.
    ///
    /// A `Set` without CAS that fails as `TooLarge` or `OutOfMemory` unlinks the
    /// key's existing item, so stale data does not persist (memcached does this). A
    /// store whose exptime is already past succeeds but leaves nothing visible: the item
    /// is linked already expired, as memcached links it, so that a later lookup counts
    /// it in `get_expired` (over a durable store the old item is unlinked and no new one
    /// is linked; see [`Store::expired_exptime`]).
    pub fn set(&self, req: &SetRequest<'_>) -> SetStatus {
        self.set_item(req, None)
    }

    /// [`Store::set`]; for [`Store::import`], `import_exptime` is the item's
    /// absolute exptime (0 = never), used instead of the wire one, and an `Add` of
    /// a live key leaves that item's eviction order alone.
    fn set_item(&self, req: &SetRequest<'_>, import_exptime: Option<u64>) -> SetStatus {
        self.throttle();
        let key = req.key;
        let hash = self.hash(key);
        let si = self.shard_index(hash);
        let unlink_on_fail = req.mode == SetMode::Set && req.compare_cas.is_none();
        if let Some(refused) = self.refuse_oversized(req, si, hash, unlink_on_fail) {
            return refused;
        }
        let now = self.now();
        let expiry = match import_exptime {
            None => expiry_from_wire(req.exptime, now.abs),
            Some(abs) => expiry_from_abs(abs, now.abs),
        };
        let appending = matches!(req.mode, SetMode::Append | SetMode::Prepend);
        // The value of set/add/replace doesn't depend on the old item, so its block
        // is built before taking the lock.
        let fresh = if appending {
            None
        } else {
            Some(Block::new(key, &[req.value], req.flags))
        };
        let import = import_exptime.is_some();
        let written = self.write_item(
            (si, hash, key, true),
            &now,
            req.new_cas,
            fresh,
            |sh, found| self.plan_set(sh, found, req, (hash, &now), expiry, import),
        );
        match written {
            Written::Answer(status) => status,
            Written::Stored { mut sh, cas, .. } => {
                if compares_cas(req) {
                    sh.stats.cas_hits += 1;
                }
                SetStatus::Stored { cas }
            }
            Written::OutOfMemory => {
                if unlink_on_fail {
                    self.unlink_key(si, hash, key);
                }
                self.no_memory.fetch_add(1, Ordering::Relaxed);
                SetStatus::OutOfMemory
            }
        }
    }

    /// Refuses a store whose item could never fit: over the key or item size limit
    /// (`TooLarge`) or over the whole memory limit (`OutOfMemory`); a refused `Set`
    /// without CAS unlinks the key's item (`unlink_on_fail`).
    fn refuse_oversized(
        &self,
        req: &SetRequest<'_>,
        si: usize,
        hash: u64,
        unlink_on_fail: bool,
    ) -> Option<SetStatus> {
        let key = req.key;
        let charge = item_charge(key.len(), req.value.len());
        if key.len() > MAX_KEY_LEN
            || u32::try_from(req.value.len()).is_err()
            || charge > self.config.item_size_max
        {
            if unlink_on_fail {
                self.unlink_key(si, hash, key);
            }
            self.too_large.fetch_add(1, Ordering::Relaxed);
            return Some(SetStatus::TooLarge);
        }
        if charge > self.budget.limit() {
            if unlink_on_fail {
                self.unlink_key(si, hash, key);
            }
            self.no_memory.fetch_add(1, Ordering::Relaxed);
            return Some(SetStatus::OutOfMemory);
        }
        None
    }

    /// What a store of `req` does, under the shard's lock, with the key's live item
    /// `found`: compares its CAS, applies the mode (add, replace, append, prepend), and
    /// answers at once when nothing is to be stored (also when the item would be
    /// expired already). An append or prepend builds its block here; the others store
    /// the block built before the lock. `import`: an `Add` of a live key leaves its
    /// eviction order alone.
    #[inline]
    fn plan_set(
        &self,
        sh: &mut Shard,
        found: Option<u32>,
        req: &SetRequest<'_>,
        (hash, now): (u64, &Now),
        expiry: Expiry,
        import: bool,
    ) -> Plan<SetStatus> {
        let key = req.key;
        let cas_mode = compares_cas(req);
        let mut exptime = self.stored_exptime(expiry);
        if exptime.is_none() && !import {
            // Kept, expired, as memcached keeps it (an import of a dead item stores nothing).
            exptime = Self::expired_exptime(sh, now);
        }
        let mut bits = 0;
        let mut built = None;
        if cas_mode {
            let Some(idx) = found else {
                sh.stats.cas_misses += 1;
                return Plan::Answer(SetStatus::NotFound);
            };
            let want = req.compare_cas.unwrap_or(0);
            let cur = sh.entry(idx).block().cas();
            if want == cur {
                // A plain CAS match.
            } else if req.invalidate && want < cur {
                // Stale store: keep TTL and win-token state, mark stale.
                let e = sh.entry(idx);
                exptime = Some(e.exptime);
                bits = STALE | (e.bits & WIN_SENT);
            } else {
                sh.stats.cas_badval += 1;
                return Plan::Answer(SetStatus::Exists);
            }
        } else {
            match (req.mode, found) {
                (SetMode::Add, Some(idx)) => {
                    // memcached: add only adds, but promotes the live item
                    // (an import does not).
                    if !import {
                        sh.touch_order(idx, &self.budget);
                    }
                    return Plan::Answer(SetStatus::NotStored);
                }
                (SetMode::Replace | SetMode::Append | SetMode::Prepend, None) => {
                    return Plan::Answer(SetStatus::NotStored);
                }
                (SetMode::Append | SetMode::Prepend, Some(idx)) => {
                    let e = sh.entry(idx);
                    let old = e.block();
                    if req.compare_cas.is_some_and(|c| c != old.cas()) {
                        return Plan::Answer(SetStatus::Exists);
                    }
                    let len = old.value().len() + req.value.len();
                    if u32::try_from(len).is_err()
                        || item_charge(key.len(), len) > self.config.item_size_max
                    {
                        // memcached: the combined item can't be allocated.
                        return Plan::Answer(SetStatus::NotStored);
                    }
                    let parts: [&[u8]; 2] = if req.mode == SetMode::Append {
                        [old.value(), req.value]
                    } else {
                        [req.value, old.value()]
                    };
                    built = Some(Block::new(key, &parts, old.flags()));
                    exptime = Some(e.exptime);
                }
                _ => {}
            }
        }
        let Some(exptime) = exptime else {
            // Stored already expired: nothing would be visible.
            if let Some(idx) = found {
                sh.unlink(idx, hash, &self.budget);
            }
            sh.tombstone(key, false);
            if cas_mode {
                sh.stats.cas_hits += 1;
            }
            sh.stats.total_items += 1;
            let cas = req.new_cas.unwrap_or_else(|| sh.next_cas());
            return Plan::Answer(SetStatus::Stored { cas });
        };
        Plan::Store {
            block: built,
            exptime,
            bits,
        }
    }

    /// The sequence every store of a new item goes through (`set_item`, `arith`). Up to
    /// [`MAX_ATTEMPTS`] times: locks the key's shard (`si`), looks the key up and lets
    /// `plan` decide with its live item in hand; then reserves room for the new block in
    /// place of that item (evicting in this shard as need be), gives it its CAS
    /// (`new_cas`, else the shard's next) and installs it. When the shard cannot free
    /// enough, the lock is dropped and room is made in other shards before the next
    /// attempt. `fresh` is a block built before the lock, stored when `plan` builds none;
    /// it is kept across attempts. Memory reserved and not used is released.
    /// `reclaim_dead` (the set family): a dead item of the key is counted as reclaimed
    /// ([`Shard::lookup_for_store`]); otherwise it is unlinked uncounted.
    #[inline]
    fn write_item<'s, R>(
        &'s self,
        (si, hash, key, reclaim_dead): (usize, u64, &[u8], bool),
        now: &Now,
        new_cas: Option<u64>,
        mut fresh: Option<Block>,
        mut plan: impl FnMut(&mut Shard, Option<u32>) -> Plan<R>,
    ) -> Written<'s, R> {
        let mut reserved = 0;
        for _ in 0..MAX_ATTEMPTS {
            let mut sh = self.lock(si);
            let found = if reclaim_dead {
                sh.lookup_for_store(hash, key, now, &self.budget)
            } else {
                match sh.lookup(hash, key, now, &self.budget) {
                    Lookup::Live(idx) => Some(idx),
                    _ => None,
                }
            };
            let (built, exptime, bits) = match plan(&mut sh, found) {
                Plan::Answer(answer) => {
                    self.budget.release(reserved);
                    return Written::Answer(answer);
                }
                Plan::Store {
                    block,
                    exptime,
                    bits,
                } => (block, exptime, bits),
            };
            let block_charge = match (&built, &fresh) {
                (Some(b), _) | (None, Some(b)) => b.charge(),
                // Invariant: `fresh` is only consumed when returning Stored below, and
                // a plan without it (append/prepend, arith) builds its block.
                (None, None) => unreachable!("no block to store"),
            };
            match sh.reserve(block_charge, found, &mut reserved, now, &self.budget) {
                Ok(()) => {
                    let Some(block) = built.or_else(|| fresh.take()) else {
                        unreachable!("no block to store")
                    };
                    let cas = new_cas.unwrap_or_else(|| sh.next_cas());
                    block.set_cas(cas);
                    sh.install(
                        hash,
                        found,
                        block,
                        exptime,
                        bits,
                        now,
                        &mut reserved,
                        &self.budget,
                    );
                    return Written::Stored {
                        sh,
                        found,
                        cas,
                        exptime,
                    };
                }
                Err(need) => {
                    drop(sh);
                    if !self.evict_elsewhere(si, (hash, key), need, &mut reserved, now) {
                        break;
                    }
                }
            }
        }
        self.budget.release(reserved);
        Written::OutOfMemory
    }

    /// `delete`: `delete_hits`/`delete_misses`.
    ///
    /// On a durable store a delete always queues a tombstone, also for a key that
    /// is not resident (a *blind* one). A blind delete answers false; after
    /// [`Store::load`] found out that the disk had the key, the same delete run
    /// again answers true (once).
    pub fn delete(&self, key: &[u8]) -> bool {
        self.throttle();
        let now = self.now();
        let hash = self.hash(key);
        let mut sh = self.lock(self.shard_index(hash));
        match sh.lookup(hash, key, &now, &self.budget) {
            Lookup::Live(idx) => {
                sh.unlink(idx, hash, &self.budget);
                sh.tombstone(key, false);
                sh.stats.delete_hits += 1;
                true
            }
            _ => {
                if sh.blind_delete(key, &now) {
                    sh.stats.delete_hits += 1;
                    return true;
                }
                sh.stats.delete_misses += 1;
                false
            }
        }
    }

    /// Meta delete (`md`). With `compare_cas`, a mismatch is `Exists`. With
    /// `invalidate` the item stays but is marked stale, gets a new CAS, has its win
    /// token reset and (with `ttl`) a new exptime; memcached counts that in neither
    /// `delete_hits` nor `delete_misses`.
    ///
    /// On a durable store a plain `md` of a non-resident key queues a blind
    /// tombstone, as [`Store::delete`] does; with a CAS or `I` it does not (it
    /// needs the item: load it first).
    pub fn meta_delete(&self, key: &[u8], opts: &MetaDeleteOpts) -> DeleteStatus {
        self.throttle();
        let now = self.now();
        let hash = self.hash(key);
        let mut sh = self.lock(self.shard_index(hash));
        let Lookup::Live(idx) = sh.lookup(hash, key, &now, &self.budget) else {
            if opts.compare_cas.is_none() && !opts.invalidate && sh.blind_delete(key, &now) {
                sh.stats.delete_hits += 1;
                return DeleteStatus::Deleted;
            }
            sh.stats.delete_misses += 1;
            return DeleteStatus::NotFound;
        };
        if opts
            .compare_cas
            .is_some_and(|c| c != sh.entry(idx).block().cas())
        {
            sh.stats.delete_misses += 1;
            return DeleteStatus::Exists;
        }
        if opts.invalidate {
            let new_exptime = opts
                .ttl
                .map(|t| self.stored_exptime(expiry_from_wire(t, now.abs)));
            if new_exptime == Some(None) {
                // Invalidated with a TTL already past: nothing would be visible.
                sh.unlink(idx, hash, &self.budget);
                sh.tombstone(key, false);
                return DeleteStatus::Deleted;
            }
            let cas = sh.next_cas();
            let e = sh.entry_mut(idx);
            if let Some(Some(x)) = new_exptime {
                e.exptime = x;
            }
            e.bits = (e.bits | STALE) & !WIN_SENT;
            e.block().set_cas(cas);
            sh.mark_dirty(idx);
        } else {
            sh.unlink(idx, hash, &self.budget);
            sh.tombstone(key, false);
            sh.stats.delete_hits += 1;
        }
        DeleteStatus::Deleted
    }

    /// `incr`/`decr` and meta `ma`. The value is read as memcached reads it
    /// ([`parse_counter`]); the result is stored as decimal digits, space-padded to the
    /// old value's length when shorter (memcached rewrites such a value in place: `100`
    /// decremented by 1 reads `99 `), keeping flags, exptime (unless `touch`) and item
    /// state, with a new CAS.
    pub fn arith(&self, key: &[u8], req: &ArithRequest) -> ArithStatus {
        self.throttle();
        let now = self.now();
        let hash = self.hash(key);
        let si = self.shard_index(hash);
        let touch = req.touch.map(|t| expiry_from_wire(t, now.abs));
        // The value of the last attempt's plan: what a stored result holds.
        let mut result = 0;
        let written = self.write_item(
            (si, hash, key, false),
            &now,
            req.new_cas,
            None,
            |sh, found| {
                let mut digits = [0u8; 20];
                let (value, block, exptime, bits) = match found {
                    Some(idx) => {
                        let e = sh.entry(idx);
                        let old = e.block();
                        if req.compare_cas.is_some_and(|c| c != old.cas()) {
                            return Plan::Answer(ArithStatus::Exists);
                        }
                        let Some(cur) = parse_counter(old.value()) else {
                            return Plan::Answer(ArithStatus::NonNumeric);
                        };
                        let value = if req.incr {
                            cur.wrapping_add(req.delta)
                        } else {
                            cur.saturating_sub(req.delta)
                        };
                        let n = format_u64(value, &mut digits);
                        let exptime = match touch {
                            Some(t) => self.stored_exptime(t),
                            None => Some(e.exptime),
                        };
                        // A shorter result keeps the old length, however long (memcached
                        // rewrites the value in place: 100 bytes stay 100 bytes).
                        let pad = old.value().len().saturating_sub(n);
                        (
                            value,
                            Block::new_padded(key, &[&digits[..n]], pad, old.flags()),
                            exptime,
                            e.bits,
                        )
                    }
                    None => {
                        let Some((initial, exp)) = req.vivify else {
                            if req.incr {
                                sh.stats.incr_misses += 1;
                            } else {
                                sh.stats.decr_misses += 1;
                            }
                            return Plan::Answer(ArithStatus::NotFound);
                        };
                        if key.len() > MAX_KEY_LEN {
                            return Plan::Answer(ArithStatus::NotFound);
                        }
                        let n = format_u64(initial, &mut digits);
                        let exptime = self.stored_exptime(expiry_from_wire(exp, now.abs));
                        (initial, Block::new(key, &[&digits[..n]], 0), exptime, 0)
                    }
                };
                let Some(exptime) = exptime else {
                    // The new TTL is already past: the result is never visible.
                    if let Some(idx) = found {
                        sh.unlink(idx, hash, &self.budget);
                        sh.tombstone(key, false);
                        self.count_arith_hit(sh, req.incr);
                    }
                    let cas = req.new_cas.unwrap_or_else(|| sh.next_cas());
                    return Plan::Answer(ArithStatus::Ok { value, cas, ttl: 0 });
                };
                result = value;
                Plan::Store {
                    block: Some(block),
                    exptime,
                    bits,
                }
            },
        );
        match written {
            Written::Answer(status) => status,
            Written::Stored {
                mut sh,
                found,
                cas,
                exptime,
            } => {
                if found.is_some() {
                    self.count_arith_hit(&mut sh, req.incr);
                }
                ArithStatus::Ok {
                    value: result,
                    cas,
                    ttl: Self::ttl(exptime, &now),
                }
            }
            Written::OutOfMemory => {
                self.no_memory.fetch_add(1, Ordering::Relaxed);
                ArithStatus::OutOfMemory
            }
        }
    }

    fn count_arith_hit(&self, sh: &mut Shard, incr: bool) {
        if incr {
            sh.stats.incr_hits += 1;
        } else {
            sh.stats.decr_hits += 1;
        }
    }

    /// Stores an exported item as it was: key, value, flags, and its absolute
    /// exptime, so it expires at the same moment as the original (an exptime
    /// already past stores nothing visible, as [`Store::set`] with one does).
    /// `mode` says whether a live item of the key is kept (`IfAbsent`, answering
    /// `NotStored`) or replaced (`Overwrite`); see [`ImportMode`]. The usual
    /// migration: copy with `IfAbsent` while the target already takes writes, or
    /// copy before the hand-off and replay later changes with `Overwrite`.
    ///
    /// Otherwise it is a store like `set`/`add`: `TooLarge` and `OutOfMemory` as
    /// they are, evicting to make room, counted in `total_items`, and on a durable
    /// store the item is dirty (written back like any store) and the call may wait
    /// while the write-behind queue is over its bound. Only resident items count as
    /// live there (as for `add`): [`Store::load`] a key first to keep a disk
    /// version. The item gets a fresh CAS from this store (answered in `Stored`):
    /// CAS values are unique per store, so the exported one is not reused. An
    /// `Overwrite` that fails as `TooLarge`/`OutOfMemory` unlinks the live item,
    /// as `set` does. An `IfAbsent` import of a live key leaves that item's
    /// eviction order alone (unlike `add`).
    pub fn import(&self, item: &ExportedItem, mode: ImportMode) -> SetStatus {
        let mode = match mode {
            ImportMode::IfAbsent => SetMode::Add,
            ImportMode::Overwrite => SetMode::Set,
        };
        let req = SetRequest {
            flags: item.flags(),
            ..SetRequest::new(mode, item.key(), item.value())
        };
        self.set_item(&req, Some(item.exptime()))
    }
}
