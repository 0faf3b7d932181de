//! [`Store`]: the command semantics (memcached 1.6) over the sharded item storage.

use std::hash::BuildHasher;
use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use hashbrown::DefaultHashBuilder;
use parking_lot::{Mutex, MutexGuard};

use crate::clock::{expiry_from_abs, expiry_from_wire, Clock, Expiry, TimeBase};
use crate::durable::backend::{Fjall, Instrumented};
use crate::durable::{
    self, decode, decode_pair, DiskRec, Durability, Durable, DurableConfig, CAS_GAP, META_CAS,
    META_GEN,
};
use crate::item::{
    item_charge, Block, ExportedItem, ItemView, MetaView, ITEM_OVERHEAD, MAX_KEY_LEN,
};
use crate::memory::Budget;
use crate::policy::Policy;
use crate::request::{
    ArithRequest, ArithStatus, DeleteStatus, ImportMode, MetaDeleteOpts, MetaGetOpts, SetMode,
    SetRequest, SetStatus,
};
use crate::shard::{
    scan_hints, scan_tails, shard_of, LargestHints, Lookup, Now, Padded, Shard, Shards, TailHints,
    MAX_SHARD_ITEMS, NO_TAIL,
};
use crate::slab::{NIL, STALE, WIN_SENT};
use crate::stats::{DurableStats, StoreStats};
use crate::wb::{Op, Wb, WbShared};

/// Store configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// Memory limit in bytes (memcached `-m`, in bytes). See [`crate::ITEM_OVERHEAD`]
    /// for what counts.
    pub memory_limit: usize,
    /// Largest item in bytes, key + value + [`crate::ITEM_OVERHEAD`] (memcached `-I`).
    pub item_size_max: usize,
    /// Eviction policy.
    pub policy: Policy,
    /// Shard count; rounded up to a power of two. 0 = choose from the number of
    /// CPUs (at least 64). Raised if needed so that no shard must hold more than
    /// 2^23 items (one shard per ~0.6 GiB of limit). [`Store::config`] reports the
    /// count in use.
    pub shards: usize,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            memory_limit: 64 << 20,
            item_size_max: 1 << 20,
            policy: Policy::Lru,
            shards: 0,
        }
    }
}

/// Upper bound on lock-evict-retry rounds of one command before it reports
/// out of memory (only reachable under heavy contention on a nearly full store).
const MAX_ATTEMPTS: usize = 16;
const MAX_SHARDS: usize = 1 << 16;
/// Most items one shard visit of [`Store::evict_elsewhere`] evicts: bounds the time
/// one lock is held.
const PER_VISIT: usize = 64;
/// Rounds over the shards [`Store::evict_elsewhere`] makes before it gives up.
const PASSES: usize = 16;

/// Slab slots one step of [`Store::reclaim_expired`] examines.
const RECLAIM_STEP: usize = 1024;

/// Where a crawl resumes: a shard and a slab slot in it. Start a pass with
/// `CrawlCursor::default()` (the first slot of the first shard).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CrawlCursor {
    shard: usize,
    slot: u32,
}

/// What one [`Store::crawl_step`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CrawlStep {
    /// Slab slots looked at, occupied or free (at most the step's `max_items`).
    pub examined: usize,
    /// Items among them (occupied slots).
    pub checked: usize,
    /// Expired or flushed items reclaimed.
    pub reclaimed: usize,
    /// The step finished the last shard: the cursor is back at the start, a
    /// pass is complete.
    pub wrapped: bool,
}

/// Where an export pass ([`Store::scan`]) resumes: a shard and a slab slot in it.
/// Start a pass with `ScanCursor::default()`; a cursor belongs to the store it
/// scans. Once a step said `done`, further steps with it do nothing and say
/// `done` again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanCursor {
    shard: usize,
    slot: u32,
}

/// What one [`Store::scan`] step did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanStep {
    /// Slab slots looked at, occupied or free (at most the step's `max_items`).
    pub examined: usize,
    /// Items appended to `out` (at most `examined`).
    pub exported: usize,
    /// The step finished the last shard: the pass is complete.
    pub done: bool,
}

/// The cache: items sharded by key hash, each shard behind its own mutex.
/// `Send + Sync`; share it with `Arc<Store>`.
pub struct Store {
    shards: Shards,
    mask: usize,
    hasher: DefaultHashBuilder,
    clock: Arc<dyn Clock>,
    time: TimeBase,
    /// Flush state: generation in the high 32 bits, pending flush moment (relative
    /// time, 0 = none) in the low 32 bits. See [`Store::flush_all`].
    flush: AtomicU64,
    config: Config,
    budget: Budget,
    /// The engine and write-behind state of a durable store ([`Store::open`]).
    durable: Option<Arc<Durable>>,
    flusher: Option<JoinHandle<()>>,
    /// `largest` policy only: each shard's largest charge (see [`LargestHints`]).
    hints: Option<LargestHints>,
    /// `lru` policy only: each shard's coldest stamp (see [`TailHints`]).
    tails: Option<TailHints>,
    /// Stores refused because the item is over the size limit (`store_too_large`).
    too_large: AtomicU64,
    /// Stores refused for lack of memory (`store_no_memory`).
    no_memory: AtomicU64,
}

fn pack(gen: u32, due: u32) -> u64 {
    (u64::from(gen) << 32) | u64::from(due)
}

fn auto_shards() -> usize {
    let cpus = std::thread::available_parallelism().map_or(4, |n| n.get());
    (cpus * 16).next_power_of_two().clamp(64, 1024)
}

impl Store {
    /// A store with `config`, reading time from `clock`.
    pub fn new(config: Config, clock: Arc<dyn Clock>) -> Store {
        let mut config = config;
        let n = if config.shards == 0 {
            auto_shards()
        } else {
            config.shards
        };
        // Enough shards that the limit runs out before a shard's 2^24 slab indices
        // would (with 2x headroom for uneven hashing): only matters above ~0.6 GiB
        // per shard.
        let max_items = config.memory_limit / ITEM_OVERHEAD;
        let min_shards = (max_items / (MAX_SHARD_ITEMS / 2)).saturating_add(1);
        let n = n.max(min_shards).clamp(1, MAX_SHARDS).next_power_of_two();
        config.shards = n;
        let bits = n.trailing_zeros();
        let hasher = DefaultHashBuilder::default();
        let hints: Option<LargestHints> =
            (config.policy == Policy::Largest).then(|| (0..n).map(|_| AtomicU64::new(0)).collect());
        let tails: Option<TailHints> = (config.policy == Policy::Lru)
            .then(|| (0..n).map(|_| AtomicU32::new(NO_TAIL)).collect());
        let shards = (0..n)
            .map(|i| {
                let sh = Shard::new(config.policy, hasher, i, bits, hints.clone(), tails.clone());
                Padded(Mutex::new(sh))
            })
            .collect();
        let epoch = clock.now();
        Store {
            shards,
            mask: n - 1,
            hasher,
            clock,
            time: TimeBase::new(epoch),
            flush: AtomicU64::new(pack(0, 0)),
            budget: Budget::new(config.memory_limit),
            config,
            durable: None,
            flusher: None,
            hints,
            tails,
            too_large: AtomicU64::new(0),
            no_memory: AtomicU64::new(0),
        }
    }

    /// Opens (creating if needed) the data directory `durable.dir` and returns a
    /// store whose memory is a write-back cache over it (see the crate docs,
    /// "Durable stores", and [`Durability`] for what a crash can lose). Existing
    /// items come back lazily, through [`Store::load`]; the flush generation and the
    /// CAS high-water mark are read now. Starts the flusher thread.
    pub fn open(
        config: Config,
        clock: Arc<dyn Clock>,
        durable: DurableConfig,
    ) -> io::Result<Store> {
        let backend = Instrumented::new(Box::new(Fjall::open(&durable.dir)?));
        let mut store = Store::new(config, clock);
        let now = store.clock.now();
        let on_disk = backend
            .get_meta(META_GEN)?
            .and_then(|v| decode_pair(&v))
            .unwrap_or((0, 0));
        let (mut gen, mut due) = on_disk;
        let due_passed = due != 0 && due <= now;
        if due_passed {
            gen += 1;
            due = 0;
        }
        if due != 0 {
            store
                .flush
                .store(pack(0, store.time.rel(due).max(1)), Ordering::Release);
        }
        let max_cas = backend
            .get_meta(META_CAS)?
            .and_then(|v| v.get(..8).and_then(|b| b.try_into().ok()))
            .map_or(0, u64::from_le_bytes);
        let shared = Arc::new(WbShared::new(store.config.memory_limit));
        for shard in store.shards.iter() {
            let mut sh = shard.0.lock();
            sh.wb = Some(Box::new(Wb {
                pending: Default::default(),
                inflight: Default::default(),
                dirty: Vec::new(),
                track_dirty: durable.durability != Durability::None,
                pushes: 0,
                gen_base: gen,
                time: store.time,
                shared: Arc::clone(&shared),
            }));
            if max_cas != 0 {
                sh.set_cas_floor(max_cas, CAS_GAP);
            }
        }
        let parts = durable::Parts {
            shards: Arc::clone(&store.shards),
            clock: Arc::clone(&store.clock),
            hasher: store.hasher,
            mask: store.mask,
            shared,
            gen_base: gen,
            committed_flush: on_disk,
        };
        let d = Arc::new(Durable::new(parts, backend, &durable));
        if due_passed {
            d.set_flush_meta(gen, 0);
        }
        let d2 = Arc::clone(&d);
        store.flusher = Some(
            std::thread::Builder::new()
                .name("kvlab-flusher".into())
                .spawn(move || durable::flusher(d2))?,
        );
        store.durable = Some(d);
        Ok(store)
    }

    /// The durability of a store made by [`Store::open`]; `None` for a memory-only
    /// store.
    pub fn durability(&self) -> Option<Durability> {
        self.durable.as_ref().map(|d| d.mode)
    }

    /// Engine counters of a durable store.
    pub fn durable_stats(&self) -> Option<DurableStats> {
        self.durable.as_ref().map(|d| d.stats())
    }

    /// Deletes every dead record from a durable store's engine now — of a flush
    /// generation before the last `flush_all`, or expired by the clock — and returns
    /// how many. Blocking (a scan of the whole engine, in steps that each hold up
    /// commits for at most a chunk of records); the flusher does the same in the
    /// background after a `flush_all` and, for expired records, periodically (see
    /// `durable/mod.rs`). First commits what is queued, so a preceding `flush_all`
    /// counts. 0 on a memory-only store.
    pub fn purge_disk(&self) -> io::Result<u64> {
        match &self.durable {
            Some(d) => d.purge_all(),
            None => Ok(0),
        }
    }

    /// Item records in a durable store's engine, dead or alive (a full scan: for
    /// tests and tools). 0 on a memory-only store.
    pub fn disk_records(&self) -> io::Result<u64> {
        match &self.durable {
            Some(d) => d.backend.count(),
            None => Ok(0),
        }
    }

    /// Test hook: every engine read, write and fsync first sleeps `d` (a slow
    /// disk). `Duration::ZERO` removes it. No effect on a memory-only store.
    pub fn set_backend_delay(&self, d: Duration) {
        if let Some(dur) = &self.durable {
            dur.backend.set_delay(d);
        }
    }

    /// Waits while a durable store's write-behind queue is over its bound.
    #[inline]
    fn throttle(&self) {
        if let Some(d) = &self.durable {
            d.shared.throttle();
        }
    }

    /// Read-through: if `key` is neither resident nor queued (written-behind or
    /// deleted), reads it from the engine and inserts it, clean, unless a newer
    /// version became resident meanwhile. Returns whether the key now exists.
    /// Blocks on disk, except when the key is resident or has a queued op. A blind
    /// tombstone (a delete of a non-resident key) costs one disk read, the first
    /// time, to find out whether the delete removed something (the re-executed
    /// delete then answers `DELETED`). A memory-only store just reports residency.
    pub fn load(&self, key: &[u8]) -> io::Result<bool> {
        let Some(d) = &self.durable else {
            return Ok(self.peek(key).is_some());
        };
        if key.len() > MAX_KEY_LEN {
            return Ok(false);
        }
        d.shared.throttle();
        let hash = self.hash(key);
        let si = self.shard_index(hash);
        let mut reserved = 0;
        // The disk read and the shard's push count it is valid for.
        let mut disk: Option<(u64, Option<DiskRec>)> = None;
        for _ in 0..MAX_ATTEMPTS * 2 {
            let now = self.now();
            let mut sh = self.lock(si);
            if let Lookup::Live(_) = sh.lookup(hash, key, &now, &self.budget) {
                self.budget.release(reserved);
                return Ok(true);
            }
            let Some(wb) = sh.wb.as_mut() else {
                unreachable!("durable stores have write-behind state in every shard")
            };
            let pushes = wb.pushes;
            let valid = match &disk {
                Some((p, _)) => *p == pushes,
                None => false,
            };
            let rec = match wb.queued(key) {
                Some(Op::Put(r)) => Some(DiskRec::from_rec(r)),
                Some(Op::Delete {
                    blind: true,
                    existed,
                }) if existed.is_none() => {
                    if !valid {
                        drop(sh);
                        disk = Some((pushes, d.backend.get(key)?.and_then(decode)));
                        continue;
                    }
                    let gen = d.gen_base + u64::from(now.gen);
                    let live = disk
                        .as_ref()
                        .and_then(|(_, r)| r.as_ref())
                        .is_some_and(|r| r.visible(now.abs, gen));
                    *existed = Some(live);
                    self.budget.release(reserved);
                    return Ok(false);
                }
                Some(Op::Delete { .. } | Op::Purge) => {
                    self.budget.release(reserved);
                    return Ok(false);
                }
                None => {
                    if !valid {
                        drop(sh);
                        disk = Some((pushes, d.backend.get(key)?.and_then(decode)));
                        continue;
                    }
                    let rec = disk.take().and_then(|(_, r)| r);
                    if rec
                        .as_ref()
                        .is_some_and(|r| !r.visible(now.abs, d.committed_gen(now.abs)))
                    {
                        // Dead by what is on disk, and nothing was queued for the key
                        // since the read (the push count is unchanged): delete it with
                        // the next round, before any later op of the key.
                        wb.push(key, Op::Purge);
                        self.budget.release(reserved);
                        return Ok(false);
                    }
                    rec
                }
            };
            let gen = d.gen_base + u64::from(now.gen);
            let Some(rec) = rec.filter(|r| r.visible(now.abs, gen)) else {
                self.budget.release(reserved);
                return Ok(false);
            };
            let exptime = if rec.exptime == 0 {
                0
            } else {
                self.time.exptime(Expiry::At(rec.exptime))
            };
            let block = Block::new(key, &[&rec.value], rec.flags);
            if key.len() > MAX_KEY_LEN
                || block.charge() > self.config.item_size_max
                || u32::try_from(rec.value.len()).is_err()
            {
                self.budget.release(reserved);
                return Ok(false);
            }
            match sh.reserve(block.charge(), None, &mut reserved, &now, &self.budget) {
                Ok(()) => {
                    block.set_cas(rec.cas);
                    sh.observe_cas(rec.cas);
                    let idx = sh.install(
                        hash,
                        None,
                        block,
                        exptime,
                        0,
                        &now,
                        &mut reserved,
                        &self.budget,
                    );
                    sh.mark_clean(idx);
                    return Ok(true);
                }
                Err(need) => {
                    // Keep what was read: the push count tells whether it is still valid.
                    disk = Some((pushes, Some(rec)));
                    drop(sh);
                    if !self.evict_elsewhere(si, (hash, key), need, &mut reserved, &now) {
                        break;
                    }
                }
            }
        }
        self.budget.release(reserved);
        Ok(false)
    }

    /// Makes `key`'s current state durable — its value or its deletion — with an
    /// fsync before returning (in every mode). Blocking. Concurrent callers share
    /// commit rounds and fsyncs (group commit). No effect on a memory-only store.
    pub fn persist(&self, key: &[u8]) -> io::Result<()> {
        self.persist_keys(std::iter::once(key))
    }

    /// [`Store::persist`] for several keys with one commit round (a `gat` of many keys).
    pub fn persist_keys<'k>(&self, keys: impl IntoIterator<Item = &'k [u8]>) -> io::Result<()> {
        let Some(d) = &self.durable else {
            return Ok(());
        };
        d.persists.fetch_add(1, Ordering::Relaxed);
        let now = self.now();
        for key in keys {
            let hash = self.hash(key);
            let mut sh = self.lock(self.shard_index(hash));
            if let Lookup::Live(idx) = sh.lookup(hash, key, &now, &self.budget) {
                sh.write_back(idx);
            }
        }
        d.commit(true)
    }

    /// Writes every dirty item and queued deletion and the flush state, then
    /// fsyncs. Blocking. No effect on a memory-only store.
    pub fn sync_all(&self) -> io::Result<()> {
        let Some(d) = &self.durable else {
            return Ok(());
        };
        d.collect_all();
        d.commit(true)
    }

    /// The configuration in use (`shards` resolved to the actual count).
    pub fn config(&self) -> &Config {
        &self.config
    }

    #[inline]
    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    #[inline]
    fn shard_index(&self, hash: u64) -> usize {
        shard_of(hash, self.mask)
    }

    #[inline]
    fn lock(&self, si: usize) -> MutexGuard<'_, Shard> {
        self.shards[si].0.lock()
    }

    #[inline]
    fn now(&self) -> Now {
        let abs = self.clock.now();
        let rel = self.time.rel(abs);
        Now {
            abs,
            rel,
            gen: self.generation(rel),
        }
    }

    /// Current flush generation, first applying a delayed flush whose moment came.
    #[inline]
    fn generation(&self, rel: u32) -> u32 {
        let mut s = self.flush.load(Ordering::Acquire);
        loop {
            let (gen, due) = ((s >> 32) as u32, s as u32);
            if due == 0 || rel < due {
                return gen;
            }
            let next = pack(gen.wrapping_add(1), 0);
            match self
                .flush
                .compare_exchange(s, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return gen.wrapping_add(1),
                Err(actual) => s = actual,
            }
        }
    }

    /// Stored exptime for an expiry, `None` if the item would be invisible at once.
    fn stored_exptime(&self, e: Expiry) -> Option<u32> {
        match e {
            Expiry::Expired => None,
            e => Some(self.time.exptime(e)),
        }
    }

    fn ttl(exptime: u32, now: &Now) -> i64 {
        if exptime == 0 {
            -1
        } else {
            i64::from(exptime.saturating_sub(now.rel))
        }
    }

    fn count_dead(sh: &mut Shard, l: Lookup) {
        match l {
            Lookup::Expired => sh.stats.get_expired += 1,
            Lookup::Flushed => sh.stats.get_flushed += 1,
            Lookup::Live(_) | Lookup::Miss => {}
        }
    }

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
                if Self::retime(&mut sh, idx, e, self.time) {
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
                if !Self::retime(&mut sh, idx, e, self.time) {
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

    /// Unlinks whatever item `key` has (after a failed set, like memcached); a
    /// durable store also forgets the disk version.
    fn unlink_key(&self, si: usize, hash: u64, key: &[u8]) {
        let mut sh = self.lock(si);
        if let Some(idx) = sh.find(hash, key) {
            sh.unlink(idx, hash, &self.budget);
        }
        sh.tombstone(key, false);
    }

    /// After a store in shard `own` (of the key `key`, hashing to `hash`) could not
    /// reserve its memory under the shard's lock: evicts elsewhere, without that
    /// lock, reserving what it frees until `need` more bytes are reserved. False if
    /// nothing could be freed (or, under contention that keeps taking the freed
    /// memory, after a bounded amount of work).
    ///
    /// `lfu`, `fifo`: the own shard ran out of evictable items, so this evicts
    /// from the other shards, one lock at a time. `largest`: see
    /// [`Store::evict_largest`]; `lru`: see [`Store::evict_oldest`].
    fn evict_elsewhere(
        &self,
        own: usize,
        (hash, key): (u64, &[u8]),
        need: usize,
        reserved: &mut usize,
        now: &Now,
    ) -> bool {
        if let Some(hints) = &self.hints {
            return self.evict_largest(hints, own, (hash, key), need, reserved, now);
        }
        if let Some(tails) = &self.tails {
            return self.evict_oldest(tails, own, (hash, key), need, reserved, now);
        }
        let mut need = need;
        for _ in 0..PASSES {
            if self.budget.try_reserve(need) {
                *reserved += need;
                return true;
            }
            let mut progress = false;
            for k in 1..self.shards.len() {
                let si = (own + k) & self.mask;
                let freed = self.lock(si).evict_some(need, PER_VISIT, now, &self.budget);
                if freed == 0 {
                    continue;
                }
                progress = true;
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
        need: usize,
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
        need: usize,
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
        need: usize,
        reserved: &mut usize,
        mut pick: impl FnMut(Option<Cap>) -> Option<(usize, Floor)>,
        mut evict: impl FnMut(&mut Shard, usize, Floor, u32) -> (usize, Cap),
    ) -> bool {
        let mut need = need;
        // The own shard's cap as last seen under its lock.
        let mut own_cap = None;
        let mut idle = 0;
        for _ in 0..PASSES * PER_VISIT * self.shards.len() {
            if self.budget.try_reserve(need) {
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
            let (freed, next) = evict(&mut sh, need, floor, keep);
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
            if self.take_freed(&mut need, reserved) {
                return true;
            }
        }
        false
    }

    /// `set`/`add`/`replace`/`append`/`prepend`/`cas` and meta `ms`; see
    /// [`SetRequest`] for the CAS and invalidation rules.
    ///
    /// A `Set` without CAS that fails as `TooLarge` or `OutOfMemory` unlinks the
    /// key's existing item, so stale data does not persist (memcached does this). A
    /// store whose exptime is already past succeeds but leaves nothing visible (the
    /// old item is unlinked and no new one is linked).
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
        let charge = item_charge(key.len(), req.value.len());
        if key.len() > MAX_KEY_LEN
            || u32::try_from(req.value.len()).is_err()
            || charge > self.config.item_size_max
        {
            if unlink_on_fail {
                self.unlink_key(si, hash, key);
            }
            self.too_large.fetch_add(1, Ordering::Relaxed);
            return SetStatus::TooLarge;
        }
        if charge > self.budget.limit() {
            if unlink_on_fail {
                self.unlink_key(si, hash, key);
            }
            self.no_memory.fetch_add(1, Ordering::Relaxed);
            return SetStatus::OutOfMemory;
        }
        let now = self.now();
        let expiry = match import_exptime {
            None => expiry_from_wire(req.exptime, now.abs),
            Some(abs) => expiry_from_abs(abs, now.abs),
        };
        let appending = matches!(req.mode, SetMode::Append | SetMode::Prepend);
        // The value of set/add/replace doesn't depend on the old item, so its block
        // is built before taking the lock.
        let mut fresh = if appending {
            None
        } else {
            Some(Block::new(key, &[req.value], req.flags))
        };
        let cas_mode =
            req.compare_cas.is_some() && matches!(req.mode, SetMode::Set | SetMode::Replace);
        let mut reserved = 0;
        for _ in 0..MAX_ATTEMPTS {
            let mut sh = self.lock(si);
            let found = match sh.lookup(hash, key, &now, &self.budget) {
                Lookup::Live(idx) => Some(idx),
                _ => None,
            };
            let mut exptime = self.stored_exptime(expiry);
            let mut bits = 0;
            let mut built = None;
            if cas_mode {
                let Some(idx) = found else {
                    sh.stats.cas_misses += 1;
                    self.budget.release(reserved);
                    return SetStatus::NotFound;
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
                    self.budget.release(reserved);
                    return SetStatus::Exists;
                }
            } else {
                match (req.mode, found) {
                    (SetMode::Add, Some(idx)) => {
                        // memcached: add only adds, but promotes the live item
                        // (an import does not).
                        if import_exptime.is_none() {
                            sh.touch_order(idx, &self.budget);
                        }
                        self.budget.release(reserved);
                        return SetStatus::NotStored;
                    }
                    (SetMode::Replace | SetMode::Append | SetMode::Prepend, None) => {
                        self.budget.release(reserved);
                        return SetStatus::NotStored;
                    }
                    (SetMode::Append | SetMode::Prepend, Some(idx)) => {
                        let e = sh.entry(idx);
                        let old = e.block();
                        if req.compare_cas.is_some_and(|c| c != old.cas()) {
                            self.budget.release(reserved);
                            return SetStatus::Exists;
                        }
                        let len = old.value().len() + req.value.len();
                        if u32::try_from(len).is_err()
                            || item_charge(key.len(), len) > self.config.item_size_max
                        {
                            // memcached: the combined item can't be allocated.
                            self.budget.release(reserved);
                            return SetStatus::NotStored;
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
                self.budget.release(reserved);
                if cas_mode {
                    sh.stats.cas_hits += 1;
                }
                sh.stats.total_items += 1;
                let cas = req.new_cas.unwrap_or_else(|| sh.next_cas());
                return SetStatus::Stored { cas };
            };
            let block_charge = match (&built, &fresh) {
                (Some(b), _) | (None, Some(b)) => b.charge(),
                // Invariant: `fresh` is only consumed when returning Stored below, and
                // append/prepend set `built` before reaching here.
                (None, None) => unreachable!("no block to store"),
            };
            match sh.reserve(block_charge, found, &mut reserved, &now, &self.budget) {
                Ok(()) => {
                    let Some(block) = built.or_else(|| fresh.take()) else {
                        unreachable!("no block to store")
                    };
                    let cas = req.new_cas.unwrap_or_else(|| sh.next_cas());
                    block.set_cas(cas);
                    sh.install(
                        hash,
                        found,
                        block,
                        exptime,
                        bits,
                        &now,
                        &mut reserved,
                        &self.budget,
                    );
                    if cas_mode {
                        sh.stats.cas_hits += 1;
                    }
                    return SetStatus::Stored { cas };
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
        if unlink_on_fail {
            self.unlink_key(si, hash, key);
        }
        self.no_memory.fetch_add(1, Ordering::Relaxed);
        SetStatus::OutOfMemory
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
        let mut reserved = 0;
        for _ in 0..MAX_ATTEMPTS {
            let mut sh = self.lock(si);
            let found = match sh.lookup(hash, key, &now, &self.budget) {
                Lookup::Live(idx) => Some(idx),
                _ => None,
            };
            let mut digits = [0u8; 20];
            let (value, block, exptime, bits) = match found {
                Some(idx) => {
                    let e = sh.entry(idx);
                    let old = e.block();
                    if req.compare_cas.is_some_and(|c| c != old.cas()) {
                        self.budget.release(reserved);
                        return ArithStatus::Exists;
                    }
                    let Some(cur) = parse_counter(old.value()) else {
                        self.budget.release(reserved);
                        return ArithStatus::NonNumeric;
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
                        self.budget.release(reserved);
                        return ArithStatus::NotFound;
                    };
                    if key.len() > MAX_KEY_LEN {
                        self.budget.release(reserved);
                        return ArithStatus::NotFound;
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
                    self.count_arith_hit(&mut sh, req.incr);
                }
                self.budget.release(reserved);
                let cas = req.new_cas.unwrap_or_else(|| sh.next_cas());
                return ArithStatus::Ok { value, cas, ttl: 0 };
            };
            match sh.reserve(block.charge(), found, &mut reserved, &now, &self.budget) {
                Ok(()) => {
                    let cas = req.new_cas.unwrap_or_else(|| sh.next_cas());
                    block.set_cas(cas);
                    sh.install(
                        hash,
                        found,
                        block,
                        exptime,
                        bits,
                        &now,
                        &mut reserved,
                        &self.budget,
                    );
                    if found.is_some() {
                        self.count_arith_hit(&mut sh, req.incr);
                    }
                    return ArithStatus::Ok {
                        value,
                        cas,
                        ttl: Self::ttl(exptime, &now),
                    };
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
        self.no_memory.fetch_add(1, Ordering::Relaxed);
        ArithStatus::OutOfMemory
    }

    fn count_arith_hit(&self, sh: &mut Shard, incr: bool) {
        if incr {
            sh.stats.incr_hits += 1;
        } else {
            sh.stats.decr_hits += 1;
        }
    }

    /// `flush_all [delay]`: items stored before the flush moment become invisible
    /// when it comes. `delay` is a wire exptime: 0, negative or a past absolute time
    /// flush now; otherwise the moment is `now + delay` (or the absolute time). A
    /// later call replaces a pending delayed flush.
    ///
    /// Implemented as a generation number: every item records the generation it was
    /// stored in, and an item from an older generation is dead. Flushing now bumps
    /// the generation, so a store right after `flush_all(0)` — even within the same
    /// second — is visible. A delayed flush records its moment; the first request at
    /// or after it bumps the generation. Flushed items are unlinked lazily (on
    /// access, by eviction scans, or by [`Store::reclaim_expired`]), as memcached does.
    pub fn flush_all(&self, delay: i64) {
        let abs = self.clock.now();
        let due = match expiry_from_wire(delay, abs) {
            Expiry::Never | Expiry::Expired => 0,
            Expiry::At(t) => self.time.rel(t).max(1),
        };
        let mut s = self.flush.load(Ordering::Acquire);
        loop {
            let gen = (s >> 32) as u32;
            let next = if due == 0 {
                pack(gen.wrapping_add(1), 0)
            } else {
                pack(gen, due)
            };
            match self
                .flush
                .compare_exchange(s, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(actual) => s = actual,
            }
        }
        if let Some(d) = &self.durable {
            // The disk filters records of older generations (see durable/mod.rs);
            // a pending delayed flush is recorded as its absolute moment.
            let st = self.flush.load(Ordering::Acquire);
            let (gen, due) = ((st >> 32) as u32, st as u32);
            let disk_due = if due == 0 { 0 } else { self.time.abs(due) };
            d.set_flush_meta(d.gen_base + u64::from(gen), disk_due);
        }
    }

    /// One bounded step of the crawler (memcached's LRU crawler): locks the shard
    /// at `cursor`, examines at most `max_items` of its slab slots from where the
    /// last step stopped, and reclaims every expired or flushed item among them
    /// exactly as an eviction scan would (memory released, eviction order updated;
    /// on a durable store a dirty item's put is queued first, so an older disk
    /// version cannot come back). Counted in `crawler_items_checked` and
    /// `crawler_reclaimed` (and `reclaimed`, `expired_unfetched`).
    ///
    /// A step never crosses into another shard, so the lock is held for at most
    /// `max_items` slot visits (`max_items` 0 counts as 1). When it finishes the
    /// last shard the cursor returns to the first and the step says `wrapped`:
    /// one pass of steps from [`CrawlCursor::default`] to `wrapped` has examined
    /// every slot that existed when the pass began. On a durable store it first
    /// waits, holding no lock, while the write-behind queue is over its bound, as
    /// a write command does.
    pub fn crawl_step(&self, cursor: &mut CrawlCursor, max_items: usize) -> CrawlStep {
        self.throttle();
        let now = self.now();
        let si = cursor.shard.min(self.shards.len() - 1);
        let done = self
            .lock(si)
            .crawl(cursor.slot, max_items.max(1), &now, &self.budget);
        let mut wrapped = false;
        match done.next {
            Some(slot) => *cursor = CrawlCursor { shard: si, slot },
            None => {
                let next = si + 1;
                wrapped = next == self.shards.len();
                *cursor = CrawlCursor {
                    shard: if wrapped { 0 } else { next },
                    slot: 0,
                };
            }
        }
        CrawlStep {
            examined: done.examined,
            checked: done.checked,
            reclaimed: done.reclaimed,
            wrapped,
        }
    }

    /// Unlinks every expired or flushed item now (one whole crawler pass); returns
    /// how many. Runs as [`Store::crawl_step`]s of [`RECLAIM_STEP`] slots, so it
    /// holds one shard lock at a time, briefly.
    pub fn reclaim_expired(&self) -> u64 {
        let mut cursor = CrawlCursor::default();
        let mut reclaimed = 0;
        loop {
            let step = self.crawl_step(&mut cursor, RECLAIM_STEP);
            reclaimed += step.reclaimed as u64;
            if step.wrapped {
                return reclaimed;
            }
        }
    }

    /// The hash this store shards `key` by, as [`Store::scan_matching`] passes it
    /// to its filter. Seeded at random per store instance: it can partition one
    /// store's items (e.g. among parallel scans, by ranges of it), but means
    /// nothing to another store or process — a cluster ring hashes the key itself.
    pub fn key_hash(&self, key: &[u8]) -> u64 {
        self.hash(key)
    }

    /// One bounded step of an export pass (what migration streams): locks the
    /// shard at `cursor`, examines at most `max_items` of its slab slots from where
    /// the last step stopped (`max_items` 0 counts as 1), appends every live item
    /// among them to `out` and moves the cursor on. Expired and flushed items are
    /// skipped (and left for the crawler). Like [`Store::crawl_step`], a step never
    /// crosses into another shard, so one lock is held for at most `max_items` slot
    /// visits; a step may export nothing (free slots, dead items) while the pass
    /// goes on — loop until [`ScanStep::done`].
    ///
    /// A scan is read-only: it does not fetch-mark items, move them in the eviction
    /// order, or change any counter (`get_hits`, …); it does not wait for a durable
    /// store's write-behind queue. On a durable store it exports the items in memory
    /// only, not those that are only on disk.
    ///
    /// What a pass (steps from [`ScanCursor::default`] until `done`) guarantees:
    /// every key that has a live item for the whole pass is exported exactly once —
    /// with the version live when its slot was examined (an overwrite, touch or
    /// append keeps an item's slot, so such a key still counts as live throughout).
    /// A key stored, deleted, evicted, expired or flushed during the pass may be
    /// exported once, not at all, or — if it was removed after its slot was
    /// examined and stored again into a slot not yet examined — twice; exports of
    /// one key come in the order of its versions, so the last one is the newest
    /// seen (not necessarily the newest now).
    pub fn scan(
        &self,
        cursor: &mut ScanCursor,
        max_items: usize,
        out: &mut Vec<ExportedItem>,
    ) -> ScanStep {
        self.scan_step(cursor, max_items, out, |_| true)
    }

    /// [`Store::scan`], exporting only the live items for which `filter(hash, key)`
    /// is true (`hash` is [`Store::key_hash`]): e.g. a hash range of this store, or
    /// keys a cluster ring maps elsewhere. Filtered-out items still count as
    /// examined. The filter runs under the shard lock: keep it cheap, and never
    /// call the store from it (that could deadlock).
    pub fn scan_matching(
        &self,
        cursor: &mut ScanCursor,
        max_items: usize,
        out: &mut Vec<ExportedItem>,
        mut filter: impl FnMut(u64, &[u8]) -> bool,
    ) -> ScanStep {
        self.scan_step(cursor, max_items, out, |key| filter(self.hash(key), key))
    }

    fn scan_step(
        &self,
        cursor: &mut ScanCursor,
        max_items: usize,
        out: &mut Vec<ExportedItem>,
        keep: impl FnMut(&[u8]) -> bool,
    ) -> ScanStep {
        let si = cursor.shard;
        if si >= self.shards.len() {
            return ScanStep {
                done: true,
                ..ScanStep::default()
            };
        }
        let now = self.now();
        let before = out.len();
        let step = self
            .lock(si)
            .scan(cursor.slot, max_items.max(1), &now, self.time, keep, out);
        *cursor = match step.next {
            Some(slot) => ScanCursor { shard: si, slot },
            None => ScanCursor {
                shard: si + 1,
                slot: 0,
            },
        };
        ScanStep {
            examined: step.examined,
            exported: out.len() - before,
            done: cursor.shard == self.shards.len(),
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

    /// The store clock's time, unix seconds.
    pub fn now_unix(&self) -> u64 {
        self.clock.now()
    }

    /// From now on `observer` hears of every eviction (under the evicted item's shard
    /// lock; see [`crate::EvictionObserver`]).
    pub fn observe_evictions(&self, observer: Arc<dyn crate::EvictionObserver>) {
        for si in 0..self.shards.len() {
            self.lock(si).observer = Some(observer.clone());
        }
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

    /// Counts a store that a front end refused as over the item size limit before it
    /// reached the store (a data block longer than `-I`, an oversize HTTP body), so
    /// `store_too_large` counts every such refusal, as memcached's does.
    pub fn count_too_large(&self) {
        self.too_large.fetch_add(1, Ordering::Relaxed);
    }

    /// memcached's `stats reset`: zeroes every counter of [`Store::stats`] (hits, misses,
    /// `total_items`, evictions, reclaims, refusals); the gauges (`curr_items`, `bytes`,
    /// `limit_maxbytes`) are the store's state and stay.
    pub fn reset_stats(&self) {
        for si in 0..self.shards.len() {
            self.lock(si).stats.reset_counters();
        }
        self.too_large.store(0, Ordering::Relaxed);
        self.no_memory.store(0, Ordering::Relaxed);
    }

    /// A snapshot of the counters (each shard's counters are read under its lock,
    /// one shard at a time).
    pub fn stats(&self) -> StoreStats {
        let mut out = StoreStats {
            limit_maxbytes: self.budget.limit() as u64,
            ..StoreStats::default()
        };
        for si in 0..self.shards.len() {
            let sh = self.lock(si);
            out.curr_items += sh.len() as u64;
            sh.stats.add_to(&mut out);
        }
        out.bytes = self.budget.used() as u64;
        out.store_too_large = self.too_large.load(Ordering::Relaxed);
        out.store_no_memory = self.no_memory.load(Ordering::Relaxed);
        out
    }

    /// The durable state, for tests.
    #[cfg(test)]
    pub(crate) fn durable_state(&self) -> Option<&Arc<Durable>> {
        self.durable.as_ref()
    }

    /// Test helper: queues a put of `key`'s resident dirty item without committing
    /// it (what an eviction does, but the item stays); false if there is none.
    #[cfg(test)]
    pub(crate) fn write_behind(&self, key: &[u8]) -> bool {
        let now = self.now();
        let hash = self.hash(key);
        let mut sh = self.lock(self.shard_index(hash));
        match sh.lookup(hash, key, &now, &self.budget) {
            Lookup::Live(idx) => sh.write_back(idx),
            _ => false,
        }
    }

    /// Heap bytes of all shards' index structures (slab chunks, hash tables).
    #[cfg(test)]
    pub(crate) fn index_bytes(&self) -> usize {
        (0..self.shards.len())
            .map(|si| self.lock(si).index_bytes())
            .sum()
    }
}

impl Drop for Store {
    /// A durable store stops its flusher and writes and fsyncs everything dirty
    /// (errors are ignored here; call [`Store::sync_all`] to see them).
    fn drop(&mut self) {
        let Some(d) = self.durable.take() else {
            return;
        };
        d.stop();
        if let Some(t) = self.flusher.take() {
            let _ = t.join();
        }
        d.collect_all();
        let _ = d.commit(true);
    }
}

/// Parses 1 to 20 ASCII digits that fit a `u64`.
/// A counter's value as memcached reads it (`strtoull`, then its checks): leading
/// whitespace, an optional sign (`-` only for zero), 1 or more digits fitting a `u64`,
/// then the end or whitespace (anything after that whitespace is ignored).
pub(crate) fn parse_counter(v: &[u8]) -> Option<u64> {
    let space = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r');
    let start = v.iter().position(|&b| !space(b))?;
    let mut rest = &v[start..];
    let negative = match rest.first() {
        Some(b'-') => true,
        Some(b'+') => false,
        _ => {
            return digits_then_space(rest, space);
        }
    };
    rest = &rest[1..];
    let n = digits_then_space(rest, space)?;
    if negative && n != 0 {
        // strtoull negates it; memcached refuses a negative result with a `-` in it.
        return None;
    }
    Some(n)
}

fn digits_then_space(v: &[u8], space: impl Fn(u8) -> bool) -> Option<u64> {
    let end = v
        .iter()
        .position(|&b| !b.is_ascii_digit())
        .unwrap_or(v.len());
    // strtoull stops at the first non-digit; memcached accepts the number when that is
    // whitespace or a NUL (the end of a C string: `00\0abc` reads as 0).
    if end == 0 || !(end == v.len() || space(v[end]) || v[end] == 0) {
        return None;
    }
    // strtoull: any number of leading zeros; overflow is an error.
    v[..end].iter().try_fold(0u64, |acc, &b| {
        acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

/// Writes `v` in decimal into `buf`, returning the length.
fn format_u64(mut v: u64, buf: &mut [u8; 20]) -> usize {
    let mut tmp = [0u8; 20];
    let mut i = tmp.len();
    loop {
        i -= 1;
        tmp[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    let n = tmp.len() - i;
    buf[..n].copy_from_slice(&tmp[i..]);
    n
}

#[cfg(test)]
mod tests;
