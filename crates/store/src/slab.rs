//! A shard's item metadata: a slab of fixed 32-byte entries addressed by `u32`
//! index, with a free list.
//!
//! Indices stay stable while an item lives, so the hash table stores a 4-byte index
//! and the eviction lists link entries by index (an intrusive doubly-linked list
//! costs 8 bytes per item). The slab grows in chunks of [`CHUNK`] entries instead of
//! doubling one vector, so it never holds more than one partly used chunk of slack
//! and never copies entries when it grows.

use crate::item::Block;

/// "No entry" in links and the free list.
pub(crate) const NIL: u32 = u32::MAX;

/// Entry bit: fetched since stored (memcached `ITEM_FETCHED`).
pub(crate) const FETCHED: u32 = 1;
/// Entry bit: marked stale by an invalidation (memcached `ITEM_STALE`).
pub(crate) const STALE: u32 = 1 << 1;
/// Entry bit: a win token was handed out (memcached `ITEM_TOKEN_SENT`).
pub(crate) const WIN_SENT: u32 = 1 << 2;
/// Entry bit (durable stores): changed since last written to the engine or queued.
pub(crate) const DIRTY: u32 = 1 << 3;
const FREQ_SHIFT: u32 = 8;
const FREQ_MASK: u32 = 0xff << FREQ_SHIFT;
const STAMP_SHIFT: u32 = 16;
const STAMP_MASK: u32 = 0xffff << STAMP_SHIFT;

const CHUNK_BITS: u32 = 10;
/// Entries per slab chunk (32 KiB).
pub(crate) const CHUNK: usize = 1 << CHUNK_BITS;
const CHUNK_MASK: u32 = (1 << CHUNK_BITS) - 1;

/// One item's metadata (32 bytes). A free slot has `block == None` and uses `next`
/// as the free-list link.
pub(crate) struct Entry {
    /// The item's key, value, flags and CAS.
    pub block: Option<Block>,
    /// Eviction-list neighbours (towards the hot end / towards the cold end).
    pub prev: u32,
    pub next: u32,
    /// Relative expiry time; 0 = never.
    pub exptime: u32,
    /// Relative time of the last access (or store).
    pub atime: u32,
    /// Flush generation the item was stored in; a different current generation
    /// means `flush_all` has hidden it.
    pub gen: u32,
    /// `FETCHED | STALE | WIN_SENT | DIRTY`, the LFU access count in bits 8..16,
    /// and the `lru` stamp of the last store or access in bits 16..32 (see
    /// `Budget::advance`).
    pub bits: u32,
}

const _: () = assert!(std::mem::size_of::<Entry>() == 32);

impl Entry {
    pub(crate) fn vacant(next_free: u32) -> Entry {
        Entry {
            block: None,
            prev: NIL,
            next: next_free,
            exptime: 0,
            atime: 0,
            gen: 0,
            bits: 0,
        }
    }

    #[inline]
    pub(crate) fn has(&self, bit: u32) -> bool {
        self.bits & bit != 0
    }

    #[inline]
    pub(crate) fn freq(&self) -> u8 {
        ((self.bits & FREQ_MASK) >> FREQ_SHIFT) as u8
    }

    #[inline]
    pub(crate) fn stamp(&self) -> u16 {
        (self.bits >> STAMP_SHIFT) as u16
    }

    #[inline]
    pub(crate) fn set_stamp(&mut self, s: u16) {
        self.bits = (self.bits & !STAMP_MASK) | (u32::from(s) << STAMP_SHIFT);
    }

    #[inline]
    pub(crate) fn set_freq(&mut self, f: u8) {
        self.bits = (self.bits & !FREQ_MASK) | (u32::from(f) << FREQ_SHIFT);
    }

    /// The item block of an occupied entry.
    #[inline]
    pub(crate) fn block(&self) -> &Block {
        match &self.block {
            Some(b) => b,
            // Invariant: only occupied entries are reachable from the hash table and
            // the eviction lists, which are the only places indices come from.
            None => unreachable!("slab index refers to a vacant entry"),
        }
    }
}

/// Chunked slab of entries with a free list.
pub(crate) struct Slab {
    chunks: Vec<Vec<Entry>>,
    free: u32,
}

impl Slab {
    pub(crate) fn new() -> Slab {
        Slab {
            chunks: Vec::new(),
            free: NIL,
        }
    }

    /// Stores `e` in a free slot and returns its index.
    pub(crate) fn insert(&mut self, e: Entry) -> u32 {
        if self.free != NIL {
            let idx = self.free;
            let slot = self.get_mut(idx);
            let next_free = slot.next;
            *slot = e;
            self.free = next_free;
            return idx;
        }
        let full = !matches!(self.chunks.last(), Some(c) if c.len() < CHUNK);
        if full {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        let n = self.chunks.len() - 1;
        let chunk = &mut self.chunks[n];
        let idx = (n << CHUNK_BITS) + chunk.len();
        // More than 2^32 - 1 entries in one shard would need > 128 GiB of entries.
        let idx = u32::try_from(idx)
            .ok()
            .filter(|&i| i != NIL)
            .unwrap_or_else(|| {
                panic!("shard slab is full (2^32 entries)");
            });
        chunk.push(e);
        idx
    }

    /// Frees slot `idx`, returning its block.
    pub(crate) fn remove(&mut self, idx: u32) -> Option<Block> {
        let free = self.free;
        let slot = self.get_mut(idx);
        let block = slot.block.take();
        *slot = Entry::vacant(free);
        self.free = idx;
        block
    }

    #[inline]
    pub(crate) fn get(&self, idx: u32) -> &Entry {
        &self.chunks[(idx >> CHUNK_BITS) as usize][(idx & CHUNK_MASK) as usize]
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, idx: u32) -> &mut Entry {
        &mut self.chunks[(idx >> CHUNK_BITS) as usize][(idx & CHUNK_MASK) as usize]
    }

    /// Whether `idx` is a slot of the slab holding an item.
    pub(crate) fn is_occupied(&self, idx: u32) -> bool {
        self.chunks
            .get((idx >> CHUNK_BITS) as usize)
            .and_then(|c| c.get((idx & CHUNK_MASK) as usize))
            .is_some_and(|e| e.block.is_some())
    }

    /// Slots ever allocated (occupied or free): valid indices are `0..slots()`.
    pub(crate) fn slots(&self) -> u32 {
        match self.chunks.last() {
            // Invariant: `insert` never hands out an index >= u32::MAX, so the
            // count of slots fits in a u32.
            Some(last) => (((self.chunks.len() - 1) << CHUNK_BITS) + last.len()) as u32,
            None => 0,
        }
    }

    /// Indices of all occupied slots.
    pub(crate) fn occupied(&self) -> impl Iterator<Item = u32> + '_ {
        self.chunks.iter().enumerate().flat_map(|(c, chunk)| {
            chunk
                .iter()
                .enumerate()
                .filter(|(_, e)| e.block.is_some())
                .map(move |(i, _)| ((c << CHUNK_BITS) + i) as u32)
        })
    }

    /// Bytes of entry storage allocated.
    #[cfg(test)]
    pub(crate) fn allocated_bytes(&self) -> usize {
        self.chunks.len() * CHUNK * std::mem::size_of::<Entry>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused() {
        let mut s = Slab::new();
        let a = s.insert(Entry::vacant(NIL));
        let b = s.insert(Entry::vacant(NIL));
        assert_eq!((a, b), (0, 1));
        s.remove(a);
        assert_eq!(s.insert(Entry::vacant(NIL)), a);
        for _ in 0..CHUNK {
            s.insert(Entry::vacant(NIL));
        }
        assert_eq!(s.chunks.len(), 2);
        s.get_mut(5).set_freq(200);
        s.get_mut(5).bits |= FETCHED;
        assert_eq!(s.get(5).freq(), 200);
        assert!(s.get(5).has(FETCHED));
    }
}
