//! The store over a data directory ([`Store::open`]): recovery, reading a key in from disk
//! ([`Store::load`]), write-behind, persisting and syncing, and the durable figures.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, Expiry};
use crate::durable::backend::{Fjall, Instrumented};
use crate::durable::{
    self, decode, decode_pair, DiskRec, Durability, Durable, DurableConfig, CAS_GAP, META_CAS,
    META_GEN,
};
use crate::item::{Block, ItemView, Value, MAX_KEY_LEN};
use crate::shard::Lookup;
use crate::stats::DurableStats;
use crate::wb::{Op, Wb, WbShared};

use super::{pack, Store, StoreConfig, MAX_ATTEMPTS};

impl Store {
    /// Opens (creating if needed) the data directory `durable.dir` and returns a
    /// store whose memory is a write-back cache over it (see the crate docs,
    /// "Durable stores", and [`Durability`] for what a crash can lose). Existing
    /// items come back lazily, through [`Store::load`]; the flush generation and the
    /// CAS high-water mark are read now. Starts the flusher thread.
    pub fn open(
        config: StoreConfig,
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
                .spawn(move || durable::background::flusher(d2))?,
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
    pub(super) fn throttle(&self) {
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
        self.load_item(key).map(|item| item.is_some())
    }

    /// [`Store::load`], returning the item the key has now (read through, or already
    /// resident) rather than whether it exists. The request that asked for the read-through
    /// keeps it: if the item leaves memory again before the request runs (other stores
    /// evicted it meanwhile), [`Store::get_loaded`] answers with it rather than a miss.
    pub fn load_item(&self, key: &[u8]) -> io::Result<Option<ItemView>> {
        let Some(d) = &self.durable else {
            return Ok(self.peek(key).map(|m| m.item));
        };
        if key.len() > MAX_KEY_LEN {
            return Ok(None);
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
            if let Lookup::Live(idx) = sh.lookup(hash, key, &now, &self.budget) {
                self.budget.release(reserved);
                return Ok(Some(sh.view(idx, self.time)));
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
                    return Ok(None);
                }
                Some(Op::Delete { .. } | Op::Purge) => {
                    self.budget.release(reserved);
                    return Ok(None);
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
                        return Ok(None);
                    }
                    rec
                }
            };
            let gen = d.gen_base + u64::from(now.gen);
            let Some(rec) = rec.filter(|r| r.visible(now.abs, gen)) else {
                self.budget.release(reserved);
                return Ok(None);
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
                return Ok(None);
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
                    return Ok(Some(sh.view(idx, self.time)));
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
        Ok(None)
    }

    /// `get` of a key read through for this request: `loaded` is what [`Store::load_item`]
    /// returned for it. The same as [`Store::get`] while the item is in memory; once it has
    /// left memory again (under a small cache, other stores may evict it between the
    /// read-through and the request's re-run), the key's state is its queued write-behind
    /// op if it has one (a newer version, or its deletion), else `loaded`, what the disk
    /// held during the request — a key that exists never reads as a miss for want of room.
    /// No disk access; counted as `get` counts.
    pub fn get_loaded(&self, key: &[u8], loaded: &ItemView) -> Option<ItemView> {
        let now = self.now();
        let hash = self.hash(key);
        let mut sh = self.lock(self.shard_index(hash));
        let item = match sh.lookup(hash, key, &now, &self.budget) {
            Lookup::Live(idx) => {
                sh.bump(idx, &now, &self.budget);
                Some(sh.view(idx, self.time))
            }
            Lookup::Miss => match (&self.durable, sh.wb.as_mut().and_then(|wb| wb.queued(key))) {
                (Some(d), Some(Op::Put(r))) => r
                    .visible(now.abs, d.gen_base + u64::from(now.gen))
                    .then(|| ItemView {
                        value: Value::new(r.block.clone()),
                        flags: r.block.flags(),
                        cas: r.cas,
                        exptime: r.exptime,
                    }),
                (Some(_), None) => {
                    (loaded.exptime == 0 || loaded.exptime > now.abs).then(|| loaded.clone())
                }
                _ => None,
            },
            dead => {
                Self::count_dead(&mut sh, dead);
                None
            }
        };
        if item.is_some() {
            sh.stats.get_hits += 1;
        } else {
            sh.stats.get_misses += 1;
        }
        item
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
}
