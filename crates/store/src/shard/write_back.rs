//! A durable store's side of a shard: items marked dirty and clean, tombstones of
//! deleted keys, and the write-backs of dirty items.

use crate::slab::DIRTY;
use crate::wb::Op;

use super::{Now, Shard};

impl Shard {
    /// Marks a live item as changed since it was last written (durable stores).
    #[inline]
    pub(crate) fn mark_dirty(&mut self, idx: u32) {
        let Some(wb) = &mut self.wb else { return };
        let e = self.slab.get_mut(idx);
        if e.bits & DIRTY == 0 {
            e.bits |= DIRTY;
            if wb.track_dirty {
                wb.dirty.push(idx);
            }
        }
    }

    /// Marks an item as identical to its disk (or queued) version.
    pub(crate) fn mark_clean(&mut self, idx: u32) {
        self.slab.get_mut(idx).bits &= !DIRTY;
    }

    /// Records a deletion of `key` (durable stores): a tombstone that supersedes
    /// the disk version. `blind`: the key was not resident, so whether it existed
    /// is unknown until `load` reads the disk.
    pub(crate) fn tombstone(&mut self, key: &[u8], blind: bool) {
        if let Some(wb) = &mut self.wb {
            wb.push(
                key,
                Op::Delete {
                    blind,
                    existed: None,
                },
            );
        }
    }

    /// A delete of a key that is not resident (durable stores): if `load` found
    /// out that a queued blind tombstone removed a live disk version, consumes that
    /// and returns true (the delete hit); if the key's newest version is a queued
    /// put (written behind on eviction or expiry), replaces it with a tombstone and
    /// returns whether that version was live at `now`; otherwise queues a blind
    /// tombstone.
    pub(crate) fn blind_delete(&mut self, key: &[u8], now: &Now) -> bool {
        let Some(wb) = &mut self.wb else { return false };
        if let Some(Op::Purge) = wb.queued(key) {
            // `load` found only a dead record: known absent.
            return false;
        }
        let gen = wb.gen_base + u64::from(now.gen);
        if let Some(Op::Put(r)) = wb.queued(key) {
            // Newer than anything on disk, so the disk version does not matter.
            let live = r.visible(now.abs, gen);
            self.tombstone(key, false);
            return live;
        }
        if let Some(Op::Delete { blind, existed }) = wb.queued(key) {
            if !*blind {
                // A resident delete already queued this tombstone: the key is
                // known absent, and the disk version (not yet overwritten) must
                // not be reported as a fresh hit.
                return false;
            }
            if *existed == Some(true) {
                *existed = Some(false);
                return true;
            }
            if existed.is_some() {
                // Already resolved as absent: nothing new to record.
                return false;
            }
        }
        self.tombstone(key, true);
        false
    }

    /// Whether the purge may delete `key`'s disk record, which it found dead with
    /// CAS `cas`: no op of the key is queued or in flight (a newer version or a
    /// delete is coming), and no version of it is resident other than the clean copy
    /// of that same record (which is then as dead as the record).
    pub(crate) fn purge_allowed(&mut self, hash: u64, key: &[u8], cas: u64) -> bool {
        let Some(wb) = &mut self.wb else { return false };
        if wb.queued(key).is_some() {
            return false;
        }
        match self.find(hash, key) {
            None => true,
            Some(idx) => {
                let e = self.slab.get(idx);
                !e.has(DIRTY) && e.block().cas() == cas
            }
        }
    }

    /// Queues a put of a live dirty item and marks it clean.
    pub(crate) fn write_back(&mut self, idx: u32) -> bool {
        let Some(wb) = &mut self.wb else { return false };
        let e = self.slab.get_mut(idx);
        if e.bits & DIRTY == 0 {
            return false;
        }
        e.bits &= !DIRTY;
        let e = self.slab.get(idx);
        let rec = wb.rec(e);
        let key: Box<[u8]> = e.block().key().into();
        wb.push(&key, Op::Put(rec));
        true
    }

    /// Write-back of every dirty item whose index is in the dirty list (at most
    /// `max` indices); returns whether the list is now empty.
    pub(crate) fn write_back_listed(&mut self, max: usize) -> bool {
        let Some(wb) = &mut self.wb else { return true };
        let n = wb.dirty.len().min(max);
        let start = wb.dirty.len() - n;
        let idxs: Vec<u32> = wb.dirty.drain(start..).collect();
        for idx in idxs {
            if self.slab.is_occupied(idx) {
                self.write_back(idx);
            }
        }
        match &self.wb {
            Some(wb) => wb.dirty.is_empty(),
            None => true,
        }
    }

    /// Write-back of every dirty item of the shard.
    pub(crate) fn write_back_all(&mut self) {
        let idxs: Vec<u32> = self.slab.occupied().collect();
        for idx in idxs {
            self.write_back(idx);
        }
        if let Some(wb) = &mut self.wb {
            wb.dirty.clear();
        }
    }
}
