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
//!   under — a worker blocks only when the disk cannot keep up with write-behind.
//!   Nothing is ever dropped.
//! * **Group commit.** `persist` queues its key's op and waits for a commit round
//!   that *started* after that (an fsynced one). Rounds run one at a time; whoever
//!   arrives while none runs leads the next, taking every op queued meanwhile, so one
//!   fsync covers all the persists that arrived during the previous one.
//! * **Recovery** is lazy: opening reads two meta entries (flush generation and
//!   pending delayed flush, CAS high-water mark); items come back through `load`.
//!   Records carry flags, absolute exptime, CAS and the disk flush generation;
//!   `load` treats expired records and records of an older generation as absent,
//!   so `flush_all` needs no scan of the disk.
//! * **CAS** values after a restart start above the recorded high-water mark plus
//!   2^24 per shard, so a CAS handed out for a write that a crash lost is not
//!   handed out again for another version (unless a shard issued more than 2^24
//!   CAS values between the last commit and the crash).

pub(crate) mod backend;

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::item::Block;
use crate::shard::Shard;
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

/// Counters of a durable store's engine traffic.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DurableStats {
    /// Engine point reads (read-through misses).
    pub reads: u64,
    /// Engine batches committed.
    pub commits: u64,
    /// fdatasyncs (as part of a commit or alone).
    pub fsyncs: u64,
    /// Item puts and deletes written.
    pub items_written: u64,
    /// `persist` calls.
    pub persists: u64,
    /// Bytes of queued ops not yet in the engine (write-behind buffer and tombstones).
    pub pending_bytes: u64,
    /// Commit rounds of the flusher that failed (their ops stay queued).
    pub flush_errors: u64,
}

/// A queued change of one key.
#[derive(Clone)]
pub(crate) enum Op {
    Put(Rec),
    /// `existed`: for a blind tombstone, whether the key had a live version on disk
    /// (found out by `load`, consumed by the delete command that re-executes).
    Delete {
        blind: bool,
        existed: Option<bool>,
    },
}

/// An item version to write.
#[derive(Clone)]
pub(crate) struct Rec {
    pub block: Block,
    pub cas: u64,
    /// Absolute unix seconds, 0 = never.
    pub exptime: u64,
    /// Disk flush generation.
    pub gen: u64,
}

impl Rec {
    /// Whether the version is live at `now_abs` in disk generation `gen`.
    pub(crate) fn visible(&self, now_abs: u64, gen: u64) -> bool {
        self.gen >= gen && (self.exptime == 0 || self.exptime > now_abs)
    }
}

/// Bytes a queued op counts against the write-behind bound.
const OP_OVERHEAD: usize = 64;

impl Op {
    pub(crate) fn weight(&self, key_len: usize) -> usize {
        match self {
            Op::Put(r) => key_len + r.block.value().len() + OP_OVERHEAD,
            Op::Delete { .. } => key_len + OP_OVERHEAD,
        }
    }

    fn encode(&self) -> Option<Vec<u8>> {
        match self {
            Op::Put(r) => Some(encode(
                r.block.flags(),
                r.exptime,
                r.cas,
                r.gen,
                r.block.value(),
            )),
            Op::Delete { .. } => None,
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
        self.gen >= gen && (self.exptime == 0 || self.exptime > now_abs)
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
    let exptime = u64_at(&b, 5)?;
    let cas = u64_at(&b, 13)?;
    let gen = u64_at(&b, 21)?;
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
struct Signal {
    kicked: bool,
    stop: bool,
}

/// What the shards share with the flusher: the queued-bytes count, the kick and
/// the back-pressure wait.
pub(crate) struct WbShared {
    pending: AtomicUsize,
    soft: usize,
    hard: usize,
    kicked: AtomicBool,
    signal: Mutex<Signal>,
    /// The flusher waits here for a kick, a stop or its interval.
    wake: Condvar,
    /// Throttled writers wait here for a commit round to drain the queue.
    drained: Condvar,
}

impl WbShared {
    pub(crate) fn new(memory_limit: usize) -> WbShared {
        let hard = (memory_limit / 4).max(4 << 20);
        WbShared {
            pending: AtomicUsize::new(0),
            soft: hard / 4,
            hard,
            kicked: AtomicBool::new(false),
            signal: Mutex::new(Signal::default()),
            wake: Condvar::new(),
            drained: Condvar::new(),
        }
    }

    pub(crate) fn add_pending(&self, add: usize, sub: usize) {
        let before = self.pending.fetch_add(add, Ordering::Relaxed);
        self.pending.fetch_sub(sub, Ordering::Relaxed);
        if (before + add).saturating_sub(sub) > self.soft {
            self.kick();
        }
    }

    fn sub_pending(&self, n: usize) {
        self.pending.fetch_sub(n, Ordering::Relaxed);
        let _g = self.signal.lock();
        self.drained.notify_all();
    }

    pub(crate) fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// Wakes the flusher (cheap when it is already woken).
    pub(crate) fn kick(&self) {
        if !self.kicked.swap(true, Ordering::AcqRel) {
            let mut s = self.signal.lock();
            s.kicked = true;
            self.wake.notify_one();
        }
    }

    /// Waits while the queued ops exceed the bound. Call holding no shard lock.
    #[inline]
    pub(crate) fn throttle(&self) {
        if self.pending() <= self.hard {
            return;
        }
        self.throttle_slow();
    }

    #[cold]
    fn throttle_slow(&self) {
        self.kick();
        let mut s = self.signal.lock();
        while self.pending() > self.hard && !s.stop {
            // The timeout only guards against a missed notification; progress is
            // signalled by `sub_pending`.
            self.drained.wait_for(&mut s, Duration::from_millis(50));
        }
    }
}

/// The shards, shared with the flusher thread.
pub(crate) type Shards = Arc<[crate::store::Padded<Mutex<Shard>>]>;

#[derive(Default)]
struct CommitState {
    /// Rounds started, completed, and the last completed one that fsynced.
    started: u64,
    done: u64,
    synced: u64,
    leader: bool,
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
    commit: Mutex<CommitState>,
    commit_cv: Condvar,
    pub persists: AtomicU64,
    pub flush_errors: AtomicU64,
}

impl Durable {
    pub(crate) fn new(
        shards: Shards,
        backend: Instrumented,
        config: &DurableConfig,
        shared: Arc<WbShared>,
        gen_base: u64,
    ) -> Durable {
        Durable {
            shards,
            backend,
            mode: config.durability,
            interval: config.flush_interval.max(Duration::from_millis(1)),
            shared,
            gen_base,
            flush_meta: Mutex::new(None),
            commit: Mutex::new(CommitState::default()),
            commit_cv: Condvar::new(),
            persists: AtomicU64::new(0),
            flush_errors: AtomicU64::new(0),
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
            pending_bytes: self.shared.pending() as u64,
            flush_errors: self.flush_errors.load(Ordering::Relaxed),
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
    /// indices per lock hold.
    fn collect_dirty(&self) {
        const CHUNK: usize = 512;
        for shard in self.shards.iter() {
            while !shard.0.lock().write_back_listed(CHUNK) {}
        }
    }

    /// Queues a put of every dirty item (sync_all).
    pub(crate) fn collect_all(&self) {
        for shard in self.shards.iter() {
            shard.0.lock().write_back_all();
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
/// dirty items, and on every wake-up (interval or kick) runs a commit round.
pub(crate) fn flusher(d: Arc<Durable>) {
    let mut next = Instant::now() + d.interval;
    loop {
        {
            let mut s = d.shared.signal.lock();
            loop {
                if s.stop {
                    return;
                }
                if s.kicked {
                    break;
                }
                let now = Instant::now();
                if now >= next {
                    break;
                }
                d.shared.wake.wait_for(&mut s, next - now);
            }
            s.kicked = false;
            d.shared.kicked.store(false, Ordering::Release);
        }
        let now = Instant::now();
        if now >= next {
            if d.mode != Durability::None {
                d.collect_dirty();
            }
            next = now + d.interval;
        }
        if d.commit(false).is_err() {
            d.flush_errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests;
