//! Durable stores: the in-memory store as a write-back cache over an embedded
//! engine ([`fjall`], see `backend.rs` for why).
//!
//! ```text
//!  worker threads (never touch the disk)           helper threads (may block)
//!  set/arith/...: item installed DIRTY              load(key): shard → queued op → disk
//!  delete: tombstone queued                         persist(key): queue key, group commit
//!  eviction of a DIRTY item: put queued             sync_all: queue every DIRTY item, commit
//!        │ (per-shard `pending` map, under the shard lock)
//!        ▼
//!  commit round (one at a time: the flusher thread or a persist/sync_all leader)
//!    per shard: pending → inflight (still visible to load)
//!    one engine batch (+ flush generation, CAS high-water mark), fsync unless `none`
//!    per shard: inflight cleared
//!
//!  purge step (the flusher between rounds, or `purge_disk`)
//!    scan ≤ PURGE_CHUNK records after the cursor (no lock held)
//!    per PURGE_BATCH dead records, as leader (no round runs meanwhile):
//!      re-read them if a round ran since the scan; per key, under its shard lock:
//!      skip if an op is queued or a newer version is resident
//!      one engine batch of deletes (no fsync)
//! ```
//!
//! * **Dirty tracking.** Every store on a durable store leaves the item with the
//!   slab entry's `DIRTY` bit (a touch and an invalidation too). In `interval` and
//!   `sync` modes the shard also lists newly dirty indices, which the flusher walks
//!   every `flush_interval`, queueing a put of each still-dirty item.
//! * **Write-behind.** Unlinking a dirty item (eviction, expiry, replacement by a
//!   failed store) queues a put of it in the shard's `pending` map (newest op per
//!   key); the block is shared, not copied. Deletes queue a tombstone, also for keys
//!   that are not resident (a *blind* tombstone). `load` answers from these queued
//!   ops before the disk, so nothing stale is read back.
//! * **Bound.** Queued ops weigh key + value + 64 bytes. Above a quarter of the bound
//!   (`max(memory_limit / 4, 4 MiB)`) the flusher is kicked; above the bound, a
//!   write command waits (before taking any lock) until the flusher brought it back
//!   under — a worker blocks only when the disk cannot keep up with write-behind
//!   (counted in `durable_write_waits`). The interval flush queues dirty items in
//!   chunks and commits whenever the queue passes a quarter of the bound, so a large
//!   dirty backlog alone never makes writers wait.
//!   Nothing is ever dropped.
//! * **Group commit.** `persist` queues its key's op and waits for a commit round
//!   that *started* after that (an fsynced one). Rounds run one at a time; whoever
//!   arrives while none runs leads the next, taking every op queued meanwhile, so one
//!   fsync covers all the persists that arrived during the previous one.
//! * **Recovery** is lazy: opening reads two meta entries (flush generation and
//!   pending delayed flush, CAS high-water mark); items come back through `load`.
//!   Records carry flags, absolute exptime, CAS and the disk flush generation;
//!   `load` treats expired records and records of an older generation as absent,
//!   so `flush_all` needs no scan of the disk before it takes effect.
//! * **Purge.** Those dead records are then deleted from the disk in the
//!   background, so the data directory stays bounded (like memcached's LRU
//!   crawler, over the disk). The flusher runs a pass — one step of
//!   [`background::PURGE_CHUNK`] records per turn, resuming after the last key scanned, still
//!   committing at once when kicked — as soon as a new flush generation is
//!   committed, and for expired records when one on disk may have expired (it
//!   tracks the earliest exptime written and seen; after opening it does not
//!   know), at most once per [`background::PURGE_EVERY`] flush intervals. `load` queues the deletion of a dead record
//!   it read. Deadness is judged by the *committed* flush generation only, so a
//!   crash cannot leave a `flush_all` half applied. A purge delete never removes
//!   a newer version: see [`Durable::purge_step`]. The engine (an LSM tree) frees
//!   the space of deleted records when it compacts, which may lag.
//! * **CAS** values after a restart start above the recorded high-water mark plus
//!   2^24 per shard, so a CAS handed out for a write that a crash lost is not
//!   handed out again for another version (unless a shard issued more than 2^24
//!   CAS values between the last commit and the crash).

pub(crate) mod backend;
pub(crate) mod background;
mod record;

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::str::FromStr;
#[cfg(test)]
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use hashbrown::DefaultHashBuilder;

use crate::clock::Clock;
use crate::shard::Shards;
use crate::stats::DurableStats;
use crate::wb::{Op, WbShared};
use backend::{Batch, Instrumented};
pub(crate) use record::{decode, decode_pair, encode_pair, DiskRec, CAS_GAP, META_CAS, META_GEN};

/// How a durable store's writes reach the disk (`--durability`). "Crash" below
/// means the process dies (`kill -9`, panic, OOM kill); "power loss" includes a
/// kernel crash. "On disk" means in the engine's journal, fdatasynced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Changes reach the engine only when their item is evicted or expires while
    /// dirty, or is deleted (queued, then written by the flusher without fsync —
    /// handed to the OS — within one `flush_interval`, or sooner when the queue
    /// passes a quarter of its bound), and at [`crate::Store::sync_all`] or drop
    /// (fsynced). Resident dirty items are not written periodically. A crash can
    /// lose every change not yet written that way; a power loss also loses
    /// everything since the last fsync. `persist`, if called, still fsyncs.
    None,
    /// Every `flush_interval` the flusher queues all dirty items and writes them,
    /// with every queued eviction and delete, in one engine batch that it
    /// fdatasyncs before the next round. A crash or a power loss loses at most the
    /// changes made since the start of the last completed round: about one
    /// interval plus the time a round takes (longer only if the disk is slower
    /// than the write rate). `flush_all` is written by the next round; the flusher
    /// is woken at once.
    Interval,
    /// As `interval`, and the server calls [`crate::Store::persist`] after each
    /// successful write or delete and replies only after it returned: the change
    /// is then in an engine batch that was fdatasynced, so nothing acknowledged is
    /// lost by a crash or a power loss (as far as the disk honours fdatasync).
    /// Concurrent persists share fsyncs (group commit). `flush_all` is not itself
    /// fsynced before its reply: it is written with the next persist or round
    /// (the flusher is woken at once); a crash before that can undo it.
    Sync,
}

impl Durability {
    /// The name `FromStr` accepts.
    pub fn as_str(self) -> &'static str {
        match self {
            Durability::None => "none",
            Durability::Interval => "interval",
            Durability::Sync => "sync",
        }
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A durability name that is not one of `none`, `interval`, `sync`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown durability {0:?}: expected one of none, interval, sync")]
pub struct ParseDurabilityError(pub String);

impl FromStr for Durability {
    type Err = ParseDurabilityError;

    fn from_str(s: &str) -> Result<Durability, ParseDurabilityError> {
        match s {
            "none" => Ok(Durability::None),
            "interval" => Ok(Durability::Interval),
            "sync" => Ok(Durability::Sync),
            _ => Err(ParseDurabilityError(s.to_owned())),
        }
    }
}

/// Where and how a durable store keeps its items.
#[derive(Clone, Debug)]
pub struct DurableConfig {
    /// Data directory (created if missing).
    pub dir: PathBuf,
    /// See [`Durability`].
    pub durability: Durability,
    /// How often the flusher writes dirty items (`interval` and `sync`); default 1 s.
    pub flush_interval: Duration,
}

impl DurableConfig {
    /// `dir` with `Durability::Interval` and a 1 s flush interval.
    pub fn new(dir: impl Into<PathBuf>) -> DurableConfig {
        DurableConfig {
            dir: dir.into(),
            durability: Durability::Interval,
            flush_interval: Duration::from_secs(1),
        }
    }
}

#[derive(Default)]
struct CommitState {
    /// Rounds started, completed, and the last completed one that fsynced.
    started: u64,
    done: u64,
    synced: u64,
    /// A commit round or a purge write runs: only the leader writes to the engine.
    leader: bool,
    /// Leaderships ended (rounds and purge writes): the purge compares it across
    /// its unlocked scan to know whether the engine may have changed.
    epoch: u64,
}

pub(crate) struct Durable {
    pub shards: Shards,
    pub backend: Instrumented,
    pub mode: Durability,
    pub interval: Duration,
    pub shared: Arc<WbShared>,
    /// Disk flush generation at open: disk gen = `gen_base` + memory generation.
    pub gen_base: u64,
    /// Flush-generation meta entry to write with the next round.
    flush_meta: Mutex<Option<(u64, u64)>>,
    /// The flush-generation meta entry last committed (generation, pending delayed
    /// flush as absolute time or 0). The purge judges by this, never by a flush not
    /// yet on disk: a crash must not leave a flush half applied.
    committed_flush: Mutex<(u64, u64)>,
    /// The earliest exptime a live record on disk may have (0: unknown or a dead
    /// record was written; `u64::MAX`: none): when the next expiry purge is due.
    next_expiry: AtomicU64,
    commit: Mutex<CommitState>,
    commit_cv: Condvar,
    clock: Arc<dyn Clock>,
    /// The store's key hasher and shard mask (to find a key's shard).
    hasher: DefaultHashBuilder,
    mask: usize,
    pub persists: AtomicU64,
    pub flush_errors: AtomicU64,
    purged: AtomicU64,
    purge_scanned: AtomicU64,
    purge_passes: AtomicU64,
    /// Test hook: runs once, in the next purge step that found dead records,
    /// between its scan and its deletes.
    #[cfg(test)]
    pub after_scan: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// Test hook: the flusher does not purge (so a test's own purge is the only one).
    #[cfg(test)]
    pub no_background_purge: AtomicBool,
}

/// What [`Durable::new`] needs from the store besides the engine.
pub(crate) struct Parts {
    pub shards: Shards,
    pub clock: Arc<dyn Clock>,
    pub hasher: DefaultHashBuilder,
    pub mask: usize,
    pub shared: Arc<WbShared>,
    /// Disk flush generation at open.
    pub gen_base: u64,
    /// The flush meta entry as found on disk.
    pub committed_flush: (u64, u64),
}

impl Durable {
    pub(crate) fn new(parts: Parts, backend: Instrumented, config: &DurableConfig) -> Durable {
        Durable {
            shards: parts.shards,
            backend,
            mode: config.durability,
            interval: config.flush_interval.max(Duration::from_millis(1)),
            shared: parts.shared,
            gen_base: parts.gen_base,
            flush_meta: Mutex::new(None),
            committed_flush: Mutex::new(parts.committed_flush),
            // Unknown until a pass has looked.
            next_expiry: AtomicU64::new(0),
            commit: Mutex::new(CommitState::default()),
            commit_cv: Condvar::new(),
            clock: parts.clock,
            hasher: parts.hasher,
            mask: parts.mask,
            persists: AtomicU64::new(0),
            flush_errors: AtomicU64::new(0),
            purged: AtomicU64::new(0),
            purge_scanned: AtomicU64::new(0),
            purge_passes: AtomicU64::new(0),
            #[cfg(test)]
            after_scan: Mutex::new(None),
            #[cfg(test)]
            no_background_purge: AtomicBool::new(false),
        }
    }

    /// The flush generation the disk is committed to at `now_abs`: records of an
    /// older one are dead, and stay dead whatever happens.
    pub(crate) fn committed_gen(&self, now_abs: u64) -> u64 {
        let (gen, due) = *self.committed_flush.lock();
        if due != 0 && due <= now_abs {
            gen + 1
        } else {
            gen
        }
    }

    /// Records the flush state to write with the next round, and wakes the flusher.
    pub(crate) fn set_flush_meta(&self, gen: u64, due_abs: u64) {
        *self.flush_meta.lock() = Some((gen, due_abs));
        self.shared.kick();
    }

    pub(crate) fn stats(&self) -> DurableStats {
        let c = &self.backend.counters;
        DurableStats {
            reads: c.reads.load(Ordering::Relaxed),
            commits: c.commits.load(Ordering::Relaxed),
            fsyncs: c.fsyncs.load(Ordering::Relaxed),
            items_written: c.items_written.load(Ordering::Relaxed),
            persists: self.persists.load(Ordering::Relaxed),
            queued_bytes: self.shared.pending() as u64,
            write_waits: self.shared.write_waits.load(Ordering::Relaxed),
            flush_errors: self.flush_errors.load(Ordering::Relaxed),
            purged: self.purged.load(Ordering::Relaxed),
            purge_scanned: self.purge_scanned.load(Ordering::Relaxed),
            purge_passes: self.purge_passes.load(Ordering::Relaxed),
        }
    }

    /// Returns once every op queued before the call is in the engine — fsynced if
    /// `want_sync` (or the mode is not `none`). Group commit: see the module doc.
    pub(crate) fn commit(&self, want_sync: bool) -> io::Result<()> {
        let sync = want_sync || self.mode != Durability::None;
        let mut st = self.commit.lock();
        let target = st.started + 1;
        loop {
            if st.done >= target && (!want_sync || st.synced >= target) {
                return Ok(());
            }
            if st.leader {
                self.commit_cv.wait(&mut st);
                continue;
            }
            st.leader = true;
            st.started += 1;
            let round = st.started;
            // An empty round still fsyncs if an earlier round was not fsynced.
            let force_sync = sync && st.synced < st.done;
            drop(st);
            let res = self.run_round(sync, force_sync);
            st = self.commit.lock();
            st.leader = false;
            st.epoch += 1;
            if res.is_ok() {
                st.done = round;
                if sync {
                    st.synced = round;
                }
            }
            self.commit_cv.notify_all();
            res?;
        }
    }

    /// One commit round: collects every shard's pending ops, writes them (and the
    /// meta entries) in one batch.
    fn run_round(&self, sync: bool, force_sync: bool) -> io::Result<()> {
        let mut batch = Batch::default();
        let mut weight = 0;
        let mut touched = Vec::new();
        let mut max_cas = 0;
        // For the purge: the earliest exptime and generation of the puts, and the
        // dead-record deletes `load` queued.
        let (mut min_exp, mut min_gen, mut purges) = (u64::MAX, u64::MAX, 0);
        for (si, shard) in self.shards.iter().enumerate() {
            let mut sh = shard.0.lock();
            max_cas = max_cas.max(sh.last_cas());
            let Some(wb) = sh.wb.as_mut() else { continue };
            if wb.pending.is_empty() {
                continue;
            }
            debug_assert!(wb.inflight.is_empty());
            std::mem::swap(&mut wb.pending, &mut wb.inflight);
            for (k, op) in &wb.inflight {
                weight += op.weight(k.len());
                match op {
                    Op::Put(r) => {
                        if r.exptime != 0 {
                            min_exp = min_exp.min(r.exptime);
                        }
                        min_gen = min_gen.min(r.gen);
                    }
                    Op::Purge => purges += 1,
                    Op::Delete { .. } => {}
                }
                batch.items.push((k.clone(), op.encode()));
            }
            touched.push(si);
        }
        let meta = self.flush_meta.lock().take();
        if let Some((gen, due)) = meta {
            batch.meta.push((META_GEN, encode_pair(gen, due)));
        }
        if !batch.items.is_empty() {
            batch.meta.push((META_CAS, max_cas.to_le_bytes().to_vec()));
        }
        let res = if !batch.is_empty() {
            self.backend.write(batch, sync)
        } else if force_sync {
            self.backend.sync()
        } else {
            Ok(())
        };
        if res.is_ok() {
            if let Some(m) = meta {
                *self.committed_flush.lock() = m;
            }
            if min_gen < self.committed_gen(self.clock.now()) {
                // A flushed item was written back: due for a purge.
                min_exp = 0;
            }
            self.next_expiry.fetch_min(min_exp, Ordering::Relaxed);
            self.purged.fetch_add(purges, Ordering::Relaxed);
        }
        let mut dropped = 0;
        for si in touched {
            let mut sh = self.shards[si].0.lock();
            let Some(wb) = sh.wb.as_mut() else { continue };
            if res.is_ok() {
                wb.inflight.clear();
            } else {
                // Keep the ops queued (behind any newer op of the same key).
                let inflight = std::mem::take(&mut wb.inflight);
                for (k, op) in inflight {
                    if wb.pending.contains_key(&k) {
                        dropped += op.weight(k.len());
                    } else {
                        wb.pending.insert(k, op);
                    }
                }
            }
        }
        if res.is_ok() {
            self.shared.sub_pending(weight);
        } else {
            if let Some(m) = meta {
                self.flush_meta.lock().get_or_insert(m);
            }
            self.shared.sub_pending(dropped);
        }
        res
    }

    /// Queues a put of every item listed dirty (interval flush), a chunk of
    /// indices per lock hold, and commits a round whenever the queue passes a quarter
    /// of its bound: a large dirty backlog (a fill just before the tick) goes to disk
    /// in rounds instead of being queued at once, which would push the queue over the
    /// bound and make every write wait for the whole backlog.
    fn collect_dirty(&self) -> io::Result<()> {
        const CHUNK: usize = 64;
        for shard in self.shards.iter() {
            loop {
                let done = shard.0.lock().write_back_listed(CHUNK);
                if self.shared.over_soft() {
                    self.commit(false)?;
                }
                if done {
                    break;
                }
            }
        }
        Ok(())
    }

    /// Queues a put of every dirty item (sync_all).
    pub(crate) fn collect_all(&self) {
        for shard in self.shards.iter() {
            shard.0.lock().write_back_all();
        }
    }

    /// Takes the leader role (waiting for a round or purge write in progress): no
    /// one else writes to the engine until [`Durable::release_leader`].
    fn acquire_leader(&self) {
        let mut st = self.commit.lock();
        while st.leader {
            self.commit_cv.wait(&mut st);
        }
        st.leader = true;
    }

    /// Gives the leader role up; returns the epoch it ended.
    fn release_leader(&self) -> u64 {
        let mut st = self.commit.lock();
        st.leader = false;
        st.epoch += 1;
        self.commit_cv.notify_all();
        st.epoch
    }

    /// Asks the flusher to stop (the store is being dropped).
    pub(crate) fn stop(&self) {
        let mut s = self.shared.signal.lock();
        s.stop = true;
        self.shared.wake.notify_all();
        self.shared.drained.notify_all();
    }
}

#[cfg(test)]
mod tests;
