//! `stats detail`: per key-prefix counts of gets, hits, sets and deletes, as memcached
//! keeps them when detail is on (`stats detail on`, or `-D <delimiter>` at start).
//!
//! A key's prefix is what comes before its first delimiter (`:` by default); keys
//! without one are not counted. The counts live in one table under one mutex, taken
//! only while detail is on (a relaxed load of a flag otherwise) — memcached takes its
//! global stats lock for the same. `stats detail dump` lists the prefixes in
//! memcached's order (its 256 hash buckets by murmur3 of the prefix, newest first in a
//! bucket), so the dump is byte for byte memcached's.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use parking_lot::Mutex;

/// memcached's `PREFIX_HASH_SIZE`.
const BUCKETS: u32 = 256;

/// One prefix's counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Counts {
    prefix: Vec<u8>,
    bucket: u32,
    /// Order of creation: later ones come first within a bucket.
    born: u64,
    gets: u64,
    hits: u64,
    sets: u64,
    deletes: u64,
}

/// The per-prefix table and whether it is being filled.
pub struct Detail {
    enabled: AtomicBool,
    delimiter: u8,
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    prefixes: std::collections::HashMap<Vec<u8>, Counts>,
    born: u64,
}

enum Op {
    Get(bool),
    Set,
    Delete,
}

impl Detail {
    /// A table counting prefixes ended by `delimiter`, on or off at first.
    pub fn new(delimiter: u8, enabled: bool) -> Detail {
        Detail {
            enabled: AtomicBool::new(enabled),
            delimiter,
            table: Mutex::default(),
        }
    }

    /// Whether detail is on.
    #[inline]
    pub fn enabled(&self) -> bool {
        self.enabled.load(Relaxed)
    }

    /// `stats detail on|off`.
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Relaxed);
    }

    /// The delimiter (`-D`).
    pub fn delimiter(&self) -> u8 {
        self.delimiter
    }

    /// A get of `key` (`hit`: it was found). Call only when [`Detail::enabled`].
    pub fn get(&self, key: &[u8], hit: bool) {
        self.record(key, Op::Get(hit));
    }

    /// A store command for `key`.
    pub fn set(&self, key: &[u8]) {
        self.record(key, Op::Set);
    }

    /// A delete of `key`.
    pub fn delete(&self, key: &[u8]) {
        self.record(key, Op::Delete);
    }

    fn record(&self, key: &[u8], op: Op) {
        let Some(end) = key.iter().position(|&b| b == self.delimiter) else {
            return;
        };
        let prefix = &key[..end];
        let mut table = self.table.lock();
        let table = &mut *table;
        let counts = match table.prefixes.get_mut(prefix) {
            Some(c) => c,
            None => {
                table.born += 1;
                table.prefixes.entry(prefix.to_vec()).or_insert(Counts {
                    prefix: prefix.to_vec(),
                    bucket: murmur3_32(prefix) % BUCKETS,
                    born: table.born,
                    ..Counts::default()
                })
            }
        };
        match op {
            Op::Get(hit) => {
                counts.gets += 1;
                counts.hits += u64::from(hit);
            }
            Op::Set => counts.sets += 1,
            Op::Delete => counts.deletes += 1,
        }
    }

    /// `stats reset` forgets every prefix.
    pub fn clear(&self) {
        let mut table = self.table.lock();
        table.prefixes.clear();
        table.born = 0;
    }

    /// `stats detail dump`: `PREFIX <p> get N hit N set N del N` lines, then `END`.
    pub fn dump(&self, out: &mut Vec<u8>) {
        let mut rows: Vec<Counts> = self.table.lock().prefixes.values().cloned().collect();
        rows.sort_by_key(|c| (c.bucket, std::cmp::Reverse(c.born)));
        let mut n = itoa::Buffer::new();
        for c in rows {
            out.extend_from_slice(b"PREFIX ");
            out.extend_from_slice(&c.prefix);
            for (name, v) in [
                (&b" get "[..], c.gets),
                (b" hit ", c.hits),
                (b" set ", c.sets),
                (b" del ", c.deletes),
            ] {
                out.extend_from_slice(name);
                out.extend_from_slice(n.format(v).as_bytes());
            }
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"END\r\n");
    }
}

/// MurmurHash3 x86 32-bit with seed 0: memcached 1.6's default hash, which orders its
/// prefix table.
fn murmur3_32(data: &[u8]) -> u32 {
    const C1: u32 = 0xcc9e_2d51;
    const C2: u32 = 0x1b87_3593;
    let mut h: u32 = 0;
    let mut blocks = data.chunks_exact(4);
    for b in &mut blocks {
        let mut k = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        k = k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
        h ^= k;
        h = h.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64);
    }
    let tail = blocks.remainder();
    let mut k: u32 = 0;
    for (i, &b) in tail.iter().enumerate() {
        k ^= u32::from(b) << (8 * i);
    }
    if !tail.is_empty() {
        k = k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
        h ^= k;
    }
    h ^= data.len() as u32;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur3_matches_the_reference_vectors() {
        assert_eq!(murmur3_32(b""), 0);
        assert_eq!(murmur3_32(b"hello"), 0x248b_fa47);
        assert_eq!(
            murmur3_32(b"The quick brown fox jumps over the lazy dog"),
            0x2e4f_f723
        );
    }

    #[test]
    fn counts_by_prefix_and_skips_keys_without_one() {
        let d = Detail::new(b':', true);
        d.set(b"a:1");
        d.get(b"a:1", true);
        d.get(b"a:2", false);
        d.delete(b"a:1");
        d.get(b"plain", true);
        let mut out = Vec::new();
        d.dump(&mut out);
        assert_eq!(out, b"PREFIX a get 2 hit 1 set 1 del 1\r\nEND\r\n");
        d.clear();
        out.clear();
        d.dump(&mut out);
        assert_eq!(out, b"END\r\n");
    }
}
