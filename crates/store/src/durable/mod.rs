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
//!   [`PURGE_CHUNK`] records per turn, resuming after the last key scanned, still
//!   committing at once when kicked — as soon as a new flush generation is
//!   committed, and for expired records when one on disk may have expired (it
//!   tracks the earliest exptime written and seen; after opening it does not
//!   know), at most once per [`PURGE_EVERY`] flush intervals. `load` queues the deletion of a dead record
//!   it read. Deadness is judged by the *committed* flush generation only, so a
//!   crash cannot leave a `flush_all` half applied. A purge delete never removes
//!   a newer version: see [`Durable::purge_step`]. The engine (an LSM tree) frees
//!   the space of deleted records when it compacts, which may lag.
//! * **CAS** values after a restart start above the recorded high-water mark plus
//!   2^24 per shard, so a CAS handed out for a write that a crash lost is not
//!   handed out again for another version (unless a shard issued more than 2^24
//!   CAS values between the last commit and the crash).

pub(crate) mod backend;

use std::fmt;
use std::hash::BuildHasher;
use std::io;
use std::path::PathBuf;
use std::str::FromStr;
#[cfg(test)]
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use hashbrown::DefaultHashBuilder;

use crate::clock::Clock;
use crate::shard::{shard_of, Shards};
use crate::stats::DurableStats;
use crate::wb::{visible, Op, Rec, WbShared};
use backend::{Batch, Instrumented};

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

/// The record format of a queued op (`None` for a delete).
impl Op {
    fn encode(&self) -> Option<Vec<u8>> {
        match self {
            Op::Put(r) => Some(encode(
                r.block.flags(),
                r.exptime,
                r.cas,
                r.gen,
                r.block.value(),
            )),
            Op::Delete { .. } | Op::Purge => None,
        }
    }
}

/// An item as read back.
pub(crate) struct DiskRec {
    pub flags: u32,
    pub exptime: u64,
    pub cas: u64,
    pub gen: u64,
    pub value: Vec<u8>,
}

impl DiskRec {
    pub(crate) fn from_rec(r: &Rec) -> DiskRec {
        DiskRec {
            flags: r.block.flags(),
            exptime: r.exptime,
            cas: r.cas,
            gen: r.gen,
            value: r.block.value().to_vec(),
        }
    }

    /// Whether the record is live at `now_abs` in disk generation `gen`.
    pub(crate) fn visible(&self, now_abs: u64, gen: u64) -> bool {
        visible(self.exptime, self.gen, now_abs, gen)
    }
}

/// A record's header, as the purge reads it (without copying the value).
#[derive(Clone, Copy)]
struct Head {
    exptime: u64,
    cas: u64,
    gen: u64,
}

impl Head {
    fn decode(b: &[u8]) -> Option<Head> {
        if b.len() < REC_HEADER || b[0] != REC_V1 {
            return None;
        }
        Some(Head {
            exptime: u64_at(b, 5)?,
            cas: u64_at(b, 13)?,
            gen: u64_at(b, 21)?,
        })
    }

    fn visible(&self, now_abs: u64, gen: u64) -> bool {
        visible(self.exptime, self.gen, now_abs, gen)
    }
}

/// Record format version 1: `[1][flags u32][exptime u64][cas u64][gen u64][value]`,
/// little-endian; exptime is absolute unix seconds (0 = never).
const REC_V1: u8 = 1;
const REC_HEADER: usize = 1 + 4 + 8 + 8 + 8;

fn encode(flags: u32, exptime: u64, cas: u64, gen: u64, value: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(REC_HEADER + value.len());
    v.push(REC_V1);
    v.extend_from_slice(&flags.to_le_bytes());
    v.extend_from_slice(&exptime.to_le_bytes());
    v.extend_from_slice(&cas.to_le_bytes());
    v.extend_from_slice(&gen.to_le_bytes());
    v.extend_from_slice(value);
    v
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Decodes a record; `None` for an unknown format (treated as absent).
pub(crate) fn decode(mut b: Vec<u8>) -> Option<DiskRec> {
    if b.len() < REC_HEADER || b[0] != REC_V1 {
        return None;
    }
    let flags = u32::from_le_bytes(b.get(1..5)?.try_into().ok()?);
    let Head { exptime, cas, gen } = Head::decode(&b)?;
    b.drain(..REC_HEADER);
    Some(DiskRec {
        flags,
        exptime,
        cas,
        gen,
        value: b,
    })
}

/// Meta entry: disk flush generation and pending delayed flush (abs time, 0 none).
pub(crate) const META_GEN: &[u8] = b"flush_gen";
/// Meta entry: highest CAS value handed out when the batch was collected.
pub(crate) const META_CAS: &[u8] = b"cas_high";
/// CAS sequence numbers skipped per shard after a restart (see the module doc).
pub(crate) const CAS_GAP: u64 = 1 << 24;

pub(crate) fn decode_pair(v: &[u8]) -> Option<(u64, u64)> {
    Some((u64_at(v, 0)?, u64_at(v, 8)?))
}

pub(crate) fn encode_pair(a: u64, b: u64) -> Vec<u8> {
    let mut v = a.to_le_bytes().to_vec();
    v.extend_from_slice(&b.to_le_bytes());
    v
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

/// Records one purge step scans (holding no lock) before it yields to the
/// flusher's other work.
pub(crate) const PURGE_CHUNK: usize = 1024;
/// Dead records a purge step re-checks and deletes per turn as leader: bounds how
/// long a commit waits for the purge (at most this many point reads and one
/// unsynced batch).
const PURGE_BATCH: usize = 128;
/// The flusher starts a purge pass for expired records at most once per this many
/// flush intervals (and only when a record on disk may have expired since the
/// last pass). A pass for a new flush generation starts at once.
const PURGE_EVERY: u32 = 60;

/// Where a purge pass over the engine is.
pub(crate) struct PurgePass {
    /// The last key scanned; `None` at the start.
    after: Option<Box<[u8]>>,
    /// The committed flush generation the pass judges by.
    gen: u64,
    /// The earliest exptime among the live records scanned (`u64::MAX` if none).
    min_exp: u64,
}

impl PurgePass {
    pub(crate) fn new(gen: u64) -> PurgePass {
        PurgePass {
            after: None,
            gen,
            min_exp: u64::MAX,
        }
    }
}

/// The flusher's purge state.
struct Background {
    pass: Option<PurgePass>,
    /// Generation the last pass judged by (or the one at open).
    gen: u64,
    last_start: Instant,
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

    /// One step of a purge pass: scans up to [`PURGE_CHUNK`] records after the
    /// pass's cursor and deletes the dead ones that nothing newer is about to
    /// replace. Returns how many it deleted and whether the pass is complete. If
    /// the committed flush generation moved on, the pass starts over (what it
    /// scanned was judged by the older one).
    ///
    /// Never holds a shard lock during engine I/O. A delete must not remove a
    /// record that a round rewrote after the scan saw it dead, so the deletes are
    /// decided and written while holding the leader role (no round writes then),
    /// [`PURGE_BATCH`] at a time: if any other round or purge write ran since the
    /// scan started (or since the previous batch), each dead record is read again
    /// first. Then, under its shard's lock, a key is skipped if it has a
    /// queued op (a newer version or delete is coming) or a resident version other
    /// than the clean copy of that very record (which is then as dead as it is).
    /// A write after that check queues an op that a later round commits, after
    /// this delete.
    pub(crate) fn purge_step(&self, pass: &mut PurgePass) -> io::Result<(u64, bool)> {
        let now = self.clock.now();
        let gen = self.committed_gen(now);
        if gen > pass.gen {
            *pass = PurgePass::new(gen);
        }
        let (epoch, busy) = {
            let st = self.commit.lock();
            (st.epoch, st.leader)
        };
        let mut dead: Vec<(Box<[u8]>, u64)> = Vec::new();
        let mut last = Vec::new();
        let mut min_exp = pass.min_exp;
        let n = self
            .backend
            .scan(pass.after.as_deref(), PURGE_CHUNK, &mut |k, v| {
                last.clear();
                last.extend_from_slice(k);
                match Head::decode(v) {
                    Some(h) if !h.visible(now, gen) => dead.push((k.into(), h.cas)),
                    Some(h) if h.exptime != 0 => min_exp = min_exp.min(h.exptime),
                    // Live forever, or a format this version does not know: kept.
                    _ => {}
                }
            })?;
        self.purge_scanned.fetch_add(n as u64, Ordering::Relaxed);
        pass.min_exp = min_exp;
        let mut deleted = 0;
        if !dead.is_empty() {
            #[cfg(test)]
            {
                let hook = self.after_scan.lock().take();
                if let Some(f) = hook {
                    f();
                }
            }
            // In batches, so that a commit waits for at most one batch.
            let (mut idle, mut epoch) = (!busy, epoch);
            let mut dead = dead.into_iter();
            loop {
                let batch: Vec<_> = dead.by_ref().take(PURGE_BATCH).collect();
                if batch.is_empty() {
                    break;
                }
                self.acquire_leader();
                let res = self.purge_delete(batch, now, gen, idle, epoch, &mut pass.min_exp);
                // Only another leader between now and the next batch changes it.
                (idle, epoch) = (true, self.release_leader());
                deleted += res?;
            }
        }
        if n < PURGE_CHUNK {
            return Ok((deleted, true));
        }
        pass.after = Some(last.into_boxed_slice());
        Ok((deleted, false))
    }

    /// The write half of [`Durable::purge_step`]; the caller holds the leader role.
    /// `idle`: no leader was active when the scan started, which began at `epoch`.
    fn purge_delete(
        &self,
        dead: Vec<(Box<[u8]>, u64)>,
        now: u64,
        gen: u64,
        idle: bool,
        epoch: u64,
        min_exp: &mut u64,
    ) -> io::Result<u64> {
        let unchanged = idle && self.commit.lock().epoch == epoch;
        let mut batch = Batch::default();
        for (k, cas) in dead {
            let cas = if unchanged {
                cas
            } else {
                match self
                    .backend
                    .get_uncounted(&k)?
                    .as_deref()
                    .and_then(Head::decode)
                {
                    Some(h) if !h.visible(now, gen) => h.cas,
                    Some(h) => {
                        // Rewritten since the scan: live now.
                        if h.exptime != 0 {
                            *min_exp = (*min_exp).min(h.exptime);
                        }
                        continue;
                    }
                    None => continue,
                }
            };
            let hash = self.hasher.hash_one(&*k);
            let si = shard_of(hash, self.mask);
            if self.shards[si].0.lock().purge_allowed(hash, &k, cas) {
                batch.items.push((k, None));
            }
        }
        let n = batch.items.len() as u64;
        if n > 0 {
            // Not fsynced: a lost delete of a dead record is harmless, and the
            // journal keeps it behind the flush-generation entry it relies on.
            self.backend.write(batch, false)?;
            self.purged.fetch_add(n, Ordering::Relaxed);
        }
        Ok(n)
    }

    /// A whole purge pass on the calling thread (after a commit round, so that a
    /// preceding `flush_all` counts); returns the records it deleted.
    pub(crate) fn purge_all(&self) -> io::Result<u64> {
        self.commit(false)?;
        let mut pass = PurgePass::new(self.committed_gen(self.clock.now()));
        let mut deleted = 0;
        loop {
            let (n, done) = self.purge_step(&mut pass)?;
            deleted += n;
            if done {
                break;
            }
        }
        self.purge_passes.fetch_add(1, Ordering::Relaxed);
        Ok(deleted)
    }

    /// The flusher's share of the purge: starts a pass when the committed flush
    /// generation moved on, or (at an interval `tick`) when a record on disk may
    /// have expired and the last pass started [`PURGE_EVERY`] intervals ago; then
    /// runs one step of the pass in progress.
    fn purge_background(&self, bg: &mut Background, tick: bool) {
        #[cfg(test)]
        if self.no_background_purge.load(Ordering::Relaxed) {
            return;
        }
        let pass = match &mut bg.pass {
            Some(p) => p,
            None => {
                let now = self.clock.now();
                let gen = self.committed_gen(now);
                let expiry_due = tick
                    && self.next_expiry.load(Ordering::Relaxed) <= now
                    && bg.last_start.elapsed() >= self.interval * PURGE_EVERY;
                if gen <= bg.gen && !expiry_due {
                    return;
                }
                bg.last_start = Instant::now();
                // Writes during the pass lower it again; the pass adds what it saw.
                self.next_expiry.store(u64::MAX, Ordering::Relaxed);
                bg.pass.insert(PurgePass::new(gen))
            }
        };
        match self.purge_step(pass) {
            Ok((_, false)) => {}
            Ok((_, true)) => {
                self.next_expiry.fetch_min(pass.min_exp, Ordering::Relaxed);
                bg.gen = bg.gen.max(pass.gen);
                bg.pass = None;
                self.purge_passes.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                self.flush_errors.fetch_add(1, Ordering::Relaxed);
                bg.gen = bg.gen.max(pass.gen);
                // Retried by the next expiry pass.
                self.next_expiry.store(0, Ordering::Relaxed);
                bg.pass = None;
            }
        }
    }

    /// Asks the flusher to stop (the store is being dropped).
    pub(crate) fn stop(&self) {
        let mut s = self.shared.signal.lock();
        s.stop = true;
        self.shared.wake.notify_all();
        self.shared.drained.notify_all();
    }
}

/// The flusher thread: every `interval` (in `interval`/`sync` modes) queues the
/// dirty items, and on every wake-up (interval or kick) runs a commit round. While
/// a purge pass is in progress it runs one purge step per turn without waiting,
/// still committing at once when kicked.
pub(crate) fn flusher(d: Arc<Durable>) {
    let mut next = Instant::now() + d.interval;
    let mut bg = Background {
        pass: None,
        gen: d.committed_gen(d.clock.now()),
        last_start: Instant::now(),
    };
    loop {
        let kicked;
        {
            let mut s = d.shared.signal.lock();
            loop {
                if s.stop {
                    return;
                }
                if s.kicked || bg.pass.is_some() {
                    break;
                }
                let now = Instant::now();
                if now >= next {
                    break;
                }
                d.shared.wake.wait_for(&mut s, next - now);
            }
            kicked = s.kicked;
            s.kicked = false;
            d.shared.kicked.store(false, Ordering::Release);
        }
        let now = Instant::now();
        let tick = now >= next;
        if tick {
            if d.mode != Durability::None && d.collect_dirty().is_err() {
                d.flush_errors.fetch_add(1, Ordering::Relaxed);
            }
            next = now + d.interval;
        }
        if (kicked || tick) && d.commit(false).is_err() {
            d.flush_errors.fetch_add(1, Ordering::Relaxed);
        }
        d.purge_background(&mut bg, tick);
    }
}

#[cfg(test)]
mod tests;
