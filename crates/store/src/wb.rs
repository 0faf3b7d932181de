//! The write-behind queue: what a durable store's shards hand to the durable
//! layer (`durable/mod.rs`). Each shard keeps a [`Wb`] under its lock — queued
//! [`Op`]s per key (puts of [`Rec`]s, tombstones) and the dirty list — and all
//! shards share one [`WbShared`] with the flusher (queued bytes, kick,
//! back-pressure). This module sits below `shard/`, which fills the queue, and
//! knows nothing of the engine; the durable layer above drains it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::clock::TimeBase;
use crate::item::Block;
use crate::slab::Entry;

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
    /// A delete of a dead disk record that `load` read (the key is known absent).
    Purge,
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
        visible(self.exptime, self.gen, now_abs, gen)
    }
}

/// Bytes a queued op counts against the write-behind bound.
const OP_OVERHEAD: usize = 64;

impl Op {
    pub(crate) fn weight(&self, key_len: usize) -> usize {
        match self {
            Op::Put(r) => key_len + r.block.value().len() + OP_OVERHEAD,
            Op::Delete { .. } | Op::Purge => key_len + OP_OVERHEAD,
        }
    }
}

/// Whether a version with `exptime` (absolute, 0 = never) written in disk
/// generation `rec_gen` is live at `now_abs` in disk generation `gen`.
pub(crate) fn visible(exptime: u64, rec_gen: u64, now_abs: u64, gen: u64) -> bool {
    rec_gen >= gen && (exptime == 0 || exptime > now_abs)
}

/// The flusher's wake-up state, under [`WbShared::signal`].
#[derive(Default)]
pub(crate) struct Signal {
    pub(crate) kicked: bool,
    pub(crate) stop: bool,
}

/// What the shards share with the flusher: the queued-bytes count, the kick and
/// the back-pressure wait.
pub(crate) struct WbShared {
    pending: AtomicUsize,
    soft: usize,
    hard: usize,
    /// Writes that had to wait for the queue to drain (`durable_write_waits`).
    pub(crate) write_waits: AtomicU64,
    pub(crate) kicked: AtomicBool,
    pub(crate) signal: Mutex<Signal>,
    /// The flusher waits here for a kick, a stop or its interval.
    pub(crate) wake: Condvar,
    /// Throttled writers wait here for a commit round to drain the queue.
    pub(crate) drained: Condvar,
}

impl WbShared {
    pub(crate) fn new(memory_limit: usize) -> WbShared {
        let hard = (memory_limit / 4).max(4 << 20);
        WbShared {
            pending: AtomicUsize::new(0),
            soft: hard / 4,
            hard,
            write_waits: AtomicU64::new(0),
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

    pub(crate) fn sub_pending(&self, n: usize) {
        self.pending.fetch_sub(n, Ordering::Relaxed);
        let _g = self.signal.lock();
        self.drained.notify_all();
    }

    pub(crate) fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// Whether the queue holds more than a quarter of its bound (when a round is due).
    pub(crate) fn over_soft(&self) -> bool {
        self.pending() > self.soft
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
        self.write_waits.fetch_add(1, Ordering::Relaxed);
        self.kick();
        let mut s = self.signal.lock();
        while self.pending() > self.hard && !s.stop {
            // The timeout only guards against a missed notification; progress is
            // signalled by `sub_pending`.
            self.drained.wait_for(&mut s, Duration::from_millis(50));
        }
    }
}

/// A durable store's per-shard write-behind state (see `durable/mod.rs`). Lives
/// under the shard lock, so recording a dirty item or a tombstone takes no other
/// lock.
pub(crate) struct Wb {
    /// Ops waiting for the next commit round, newest per key (a put of an evicted
    /// dirty item, a put `persist` took, or a tombstone).
    pub pending: hashbrown::HashMap<Box<[u8]>, Op>,
    /// Ops of the commit round in progress: not yet in the engine, so `load` must
    /// see them. Only the committer (one at a time) fills and clears this.
    pub inflight: hashbrown::HashMap<Box<[u8]>, Op>,
    /// Slab indices that turned dirty since the last interval flush (may hold stale
    /// or repeated indices; the flusher rechecks the DIRTY bit). Only kept when
    /// `track_dirty`.
    pub dirty: Vec<u32>,
    pub track_dirty: bool,
    /// Incremented by every push: `load` compares it across its unlocked disk read.
    pub pushes: u64,
    /// Disk generation = `gen_base` + the entry's flush generation.
    pub gen_base: u64,
    pub time: TimeBase,
    pub shared: Arc<WbShared>,
}

impl Wb {
    /// Queues `op` for `key`, replacing an older pending op of the key.
    pub(crate) fn push(&mut self, key: &[u8], op: Op) {
        self.pushes += 1;
        let add = op.weight(key.len());
        let old = self.pending.insert(key.into(), op);
        let sub = old.map_or(0, |o| o.weight(key.len()));
        self.shared.add_pending(add, sub);
    }

    /// The record of an entry as it would be written to disk.
    pub(crate) fn rec(&self, e: &Entry) -> Rec {
        let b = e.block();
        Rec {
            block: b.clone(),
            cas: b.cas(),
            exptime: if e.exptime == 0 {
                0
            } else {
                self.time.abs(e.exptime)
            },
            gen: self.gen_base + u64::from(e.gen),
        }
    }

    /// The newest queued op for `key` (pending, else in flight).
    pub(crate) fn queued(&mut self, key: &[u8]) -> Option<&mut Op> {
        if self.pending.contains_key(key) {
            return self.pending.get_mut(key);
        }
        self.inflight.get_mut(key)
    }
}
