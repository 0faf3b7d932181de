//! [`Store`]: the command semantics (memcached 1.6) over the sharded item storage.
//!
//! Here: the store itself (configuration, construction, time and flush generations, the
//! figures); `read` (get, touch, meta get), `write` (the stores, arithmetic, deletes, import,
//! and the one sequence a new item is stored by), `evict` (room made in other shards),
//! `scan` (crawl and scan steps), `disk` (the durable store's side), `through` (a key's
//! state read and removed through to the disk, and the disk's keys scanned), `counter` (a
//! counter's digits).

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use hashbrown::DefaultHashBuilder;
use parking_lot::{Mutex, MutexGuard};

use crate::clock::{expiry_from_wire, Clock, Expiry, TimeBase};
use crate::durable::Durable;
use crate::item::ITEM_OVERHEAD;
use crate::memory::Budget;
use crate::policy::Policy;
use crate::shard::{
    shard_of, LargestHints, Lookup, Now, Padded, Shard, Shards, TailHints, MAX_SHARD_ITEMS, NO_TAIL,
};
use crate::stats::StoreStats;

mod counter;
mod disk;
mod evict;
mod read;
mod scan;
mod through;
mod write;

pub use through::DiskCursor;

/// Store configuration.
#[derive(Clone, Debug)]
pub struct StoreConfig {
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
    /// Most items the store holds at once, whatever their size (`--cache-items`); 0 =
    /// no bound but `memory_limit`. A store of a new key beyond it evicts by the policy,
    /// as one beyond the memory limit does; [`StoreStats::curr_items`] never exceeds it.
    /// With `shards` 0, it caps the shard count so that each shard holds about 64 items
    /// or more.
    pub max_items: usize,
}

impl Default for StoreConfig {
    fn default() -> StoreConfig {
        StoreConfig {
            memory_limit: 64 << 20,
            item_size_max: 1 << 20,
            policy: Policy::Lru,
            shards: 0,
            max_items: 0,
        }
    }
}

/// Upper bound on lock-evict-retry rounds of one command before it reports
/// out of memory (only reachable under heavy contention on a nearly full store).
const MAX_ATTEMPTS: usize = 16;
const MAX_SHARDS: usize = 1 << 16;
/// The exptime of an item kept already expired ([`Store::expired_exptime`]): one second
/// after the store's epoch, as memcached gives it one second after its start.
const EXPIRED_EXPTIME: u32 = 1;

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
    config: StoreConfig,
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

/// The largest power of two not above `n` (`n` ≥ 1).
fn prev_power_of_two(n: usize) -> usize {
    1 << n.ilog2()
}

fn auto_shards() -> usize {
    let cpus = std::thread::available_parallelism().map_or(4, |n| n.get());
    (cpus * 16).next_power_of_two().clamp(64, 1024)
}

impl Store {
    /// A store with `config`, reading time from `clock`.
    pub fn new(config: StoreConfig, clock: Arc<dyn Clock>) -> Store {
        let mut config = config;
        let n = match (config.shards, config.max_items) {
            // Under a small entry bound, few enough shards that each holds at least 64
            // items: eviction orders items per shard (or within a slack of bytes far
            // above such a cache), and a shard of a handful would evict the item it just
            // loaded or stored before its request reads it.
            (0, 1..) => auto_shards().min(prev_power_of_two((config.max_items / 64).max(1))),
            (0, 0) => auto_shards(),
            (n, _) => n,
        };
        // Enough shards that the limit runs out before a shard's 2^24 slab indices
        // would (with 2x headroom for uneven hashing): only matters above ~0.6 GiB
        // per shard.
        let mut max_items = config.memory_limit / ITEM_OVERHEAD;
        if config.max_items > 0 {
            max_items = max_items.min(config.max_items);
        }
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
        // Two seconds before now, as memcached's `process_started`: any moment the store
        // sees has a relative time in the past ([`EXPIRED_EXPTIME`]).
        let epoch = clock.now().saturating_sub(2);
        Store {
            shards,
            mask: n - 1,
            hasher,
            clock,
            time: TimeBase::new(epoch),
            flush: AtomicU64::new(pack(0, 0)),
            budget: Budget::new(config.memory_limit, config.max_items),
            config,
            durable: None,
            flusher: None,
            hints,
            tails,
            too_large: AtomicU64::new(0),
            no_memory: AtomicU64::new(0),
        }
    }

    /// The configuration in use (`shards` resolved to the actual count).
    pub fn config(&self) -> &StoreConfig {
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

    /// The exptime an item gets when stored or touched with an exptime already past
    /// (negative, or an absolute time not after now). memcached keeps such an item,
    /// expired — its exptime one second after the start, long past —, until a lookup
    /// (counted in `get_expired`) or a reclaim removes it; so does kvlab. `None` where it
    /// is not kept: over a durable store (the key's disk version is deleted instead), and
    /// should the clock read the epoch itself (no past relative time to give).
    fn expired_exptime(sh: &Shard, now: &Now) -> Option<u32> {
        (sh.wb.is_none() && now.rel >= EXPIRED_EXPTIME).then_some(EXPIRED_EXPTIME)
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

// What the tests (`store/tests.rs`, which imports `super::*`) use besides the store.
#[cfg(test)]
use crate::item::{ExportedItem, ItemView, MetaView, MAX_KEY_LEN};
#[cfg(test)]
use crate::request::{
    ArithRequest, ArithStatus, DeleteStatus, ImportMode, MetaDeleteOpts, MetaGetOpts, SetMode,
    SetRequest, SetStatus,
};
#[cfg(test)]
use counter::{format_u64, parse_counter};

#[cfg(test)]
mod tests;
