//! A key's state read and removed *through* to a durable store's disk, without going
//! through the cache: [`Store::peek_through`] (memory, then the write-behind queue, then
//! the disk), [`Store::delete_through`] (a delete if unchanged, wherever the version
//! lives) and [`Store::scan_disk`] (the disk's keys, a chunk at a time, each exported as
//! it is now). A cluster node's migration, copies and clean-up use them: on a durable
//! node most keys may live on disk only (cold), and must neither be missed nor pulled
//! into the cache by a scan.
//!
//! A disk read runs without the shard lock. As [`Store::load`] does, the read is kept
//! only if the shard queued nothing meanwhile (its push count is unchanged when the lock
//! is taken again): a write-behind of the key committed between the read and the check
//! would otherwise go unseen, and an older version be taken for the current one.

use std::io;

use crate::durable::{decode, DiskRec};
use crate::item::{Block, ExportedItem};
use crate::shard::{Lookup, Now, Shard};
use crate::wb::{Op, Rec};

use super::{ScanStep, Store};

/// Rounds a read-through tries before it gives up (each one follows a write-behind to the
/// key's shard during its disk read): only reached under a storm of evictions there.
const MAX_ROUNDS: usize = 1000;

/// Where a pass over a durable store's disk ([`Store::scan_disk`]) resumes: after the
/// last key it read. Start a pass with `DiskCursor::default()`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiskCursor {
    after: Option<Box<[u8]>>,
    /// The write-behind queue was looked at (the pass's first step).
    queue_seen: bool,
    done: bool,
}

/// A key's current version as a read-through finds it, under its shard lock.
enum Current {
    /// In memory (live), at this slab index.
    Resident(u32),
    /// Queued to be written (evicted dirty, or taken by a persist): newer than the disk.
    Queued(Rec),
    /// Deleted (a queued tombstone), or absent from memory on a memory-only store.
    Gone,
    /// Neither in memory nor queued: the disk's record, if any.
    Disk(Option<DiskRec>),
}

impl Store {
    /// Finds `key`'s current version (see [`Current`]) and calls `decide` with it under
    /// the key's shard lock. Blocks on disk when the key is neither resident nor queued.
    fn through<R>(
        &self,
        key: &[u8],
        mut decide: impl FnMut(&mut Shard, &Now, u64, Current) -> R,
    ) -> io::Result<R> {
        let hash = self.hash(key);
        let si = self.shard_index(hash);
        let Some(d) = &self.durable else {
            let now = self.now();
            let mut sh = self.lock(si);
            let current = match sh.lookup(hash, key, &now, &self.budget) {
                Lookup::Live(idx) => Current::Resident(idx),
                _ => Current::Gone,
            };
            return Ok(decide(&mut sh, &now, hash, current));
        };
        // The disk read and the shard's push count it is valid for.
        let mut disk: Option<(u64, Option<DiskRec>)> = None;
        for _ in 0..MAX_ROUNDS {
            let now = self.now();
            let mut sh = self.lock(si);
            if let Lookup::Live(idx) = sh.lookup(hash, key, &now, &self.budget) {
                return Ok(decide(&mut sh, &now, hash, Current::Resident(idx)));
            }
            let Some(wb) = sh.wb.as_mut() else {
                unreachable!("durable stores have write-behind state in every shard")
            };
            let pushes = wb.pushes;
            let current = match wb.queued(key) {
                Some(Op::Put(r)) => Current::Queued(r.clone()),
                Some(Op::Delete { .. } | Op::Purge) => Current::Gone,
                None => match disk.take() {
                    Some((p, rec)) if p == pushes => Current::Disk(rec),
                    _ => {
                        drop(sh);
                        disk = Some((pushes, d.backend.get(key)?.and_then(decode)));
                        continue;
                    }
                },
            };
            return Ok(decide(&mut sh, &now, hash, current));
        }
        Err(io::Error::other(
            "the key's shard kept changing during its disk read",
        ))
    }

    /// The disk generation a version must have to be live now.
    fn disk_gen(&self, now: &Now) -> u64 {
        self.durable
            .as_ref()
            .map_or(0, |d| d.gen_base + u64::from(now.gen))
    }

    /// `key`'s current live version wherever it is — memory, the write-behind queue, or
    /// a durable store's disk — without loading it into the cache or touching its
    /// eviction order or any counter; `None` if it has none (deleted, expired, flushed,
    /// never stored). Blocks on disk when the key is neither in memory nor queued. On a
    /// memory-only store it is what [`Store::peek`] sees.
    pub fn peek_through(&self, key: &[u8]) -> io::Result<Option<ExportedItem>> {
        self.through(key, |sh, now, _, current| match current {
            Current::Resident(idx) => {
                let e = sh.entry(idx);
                let b = e.block();
                let exptime = if e.exptime == 0 {
                    0
                } else {
                    self.time.abs(e.exptime)
                };
                Some(ExportedItem::from_block(b.clone(), exptime, b.cas()))
            }
            Current::Queued(r) => r
                .visible(now.abs, self.disk_gen(now))
                .then(|| ExportedItem::from_block(r.block.clone(), r.exptime, r.cas)),
            Current::Gone => None,
            Current::Disk(rec) => rec
                .filter(|r| r.visible(now.abs, self.disk_gen(now)))
                .map(|r| {
                    ExportedItem::from_block(
                        Block::new(key, &[&r.value], r.flags),
                        r.exptime,
                        r.cas,
                    )
                }),
        })
    }

    /// Deletes `key` if its current version — in memory, queued, or on a durable store's
    /// disk — still has CAS `cas` (as [`Store::peek_through`] or [`Store::scan_disk`]
    /// exported it); returns whether it did. The deletion reaches the disk as any delete
    /// does (a tombstone, written with the next commit round). Counts nothing. Blocks on
    /// disk when the key is neither in memory nor queued.
    pub fn delete_through(&self, key: &[u8], cas: u64) -> io::Result<bool> {
        self.through(key, |sh, _, hash, current| {
            let matches = match &current {
                Current::Resident(idx) => sh.entry(*idx).block().cas() == cas,
                Current::Queued(r) => r.cas == cas,
                Current::Gone => false,
                Current::Disk(rec) => rec.as_ref().is_some_and(|r| r.cas == cas),
            };
            if matches {
                if let Current::Resident(idx) = current {
                    sh.unlink(idx, hash, &self.budget);
                }
                sh.tombstone(key, false);
            }
            matches
        })
    }

    /// One step of a pass over a durable store's disk: its first step takes the keys of
    /// the write-behind queue's puts (evicted, not yet written: in neither memory nor the
    /// engine), each later one reads up to `max_records` records after `cursor` (holding
    /// no lock); for each key `filter(hash, key)` accepts it
    /// (`hash` is [`Store::key_hash`]) appends the key's *current* live version to `out`, as
    /// [`Store::peek_through`] finds it (a newer one in memory or queued wins over the
    /// record; a key deleted since is skipped). `done` once the disk's last key was read;
    /// a memory-only store is done at once.
    ///
    /// After a [`Store::scan`] or [`Store::scan_unwritten`] pass it covers every key: an
    /// item only moves from memory to the queue to the engine (a load leaves it on disk
    /// too), and an item memory passes over as written is queued or on disk already, so a
    /// key live for the whole of both passes is exported by at least one of them — a key
    /// exported by both each time as it is then, so a later export is never older than an
    /// earlier one.
    pub fn scan_disk(
        &self,
        cursor: &mut DiskCursor,
        max_records: usize,
        out: &mut Vec<ExportedItem>,
        mut filter: impl FnMut(u64, &[u8]) -> bool,
    ) -> io::Result<ScanStep> {
        let Some(d) = self.durable.as_ref().filter(|_| !cursor.done) else {
            cursor.done = true;
            return Ok(ScanStep {
                done: true,
                ..ScanStep::default()
            });
        };
        let max = max_records.max(1);
        let mut keys: Vec<Box<[u8]>> = Vec::new();
        let before = out.len();
        if !cursor.queue_seen {
            // Keys evicted and not yet written: in neither memory nor the engine. Looked
            // at before the engine, as items move from memory to the queue to the disk.
            cursor.queue_seen = true;
            for si in 0..self.shards.len() {
                let sh = self.lock(si);
                let Some(wb) = sh.wb.as_ref() else { continue };
                for (k, op) in wb.pending.iter().chain(wb.inflight.iter()) {
                    if matches!(op, Op::Put(_)) && filter(self.hash(k), k) {
                        keys.push(k.clone());
                    }
                }
            }
            for key in &keys {
                if let Some(item) = self.peek_through(key)? {
                    out.push(item);
                }
            }
            return Ok(ScanStep {
                examined: keys.len(),
                exported: out.len() - before,
                done: false,
            });
        }
        let mut last: Option<Box<[u8]>> = None;
        let n = d.backend.scan(cursor.after.as_deref(), max, &mut |k, _| {
            if filter(self.hash(k), k) {
                keys.push(k.into());
            }
            last = Some(k.into());
        })?;
        for key in &keys {
            if let Some(item) = self.peek_through(key)? {
                out.push(item);
            }
        }
        if last.is_some() {
            cursor.after = last;
        }
        cursor.done = n < max;
        Ok(ScanStep {
            examined: n,
            exported: out.len() - before,
            done: cursor.done,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;
    use std::time::Duration;

    use crate::{
        Durability, DurableConfig, ExportedItem, ManualClock, Policy, ScanCursor, SetMode,
        SetRequest, SetStatus, Store, StoreConfig,
    };

    use super::DiskCursor;

    const T0: u64 = 1_700_000_000;

    /// A durable store whose cache holds at most `items` items.
    fn open(dir: &std::path::Path, items: usize) -> Store {
        let config = StoreConfig {
            shards: 4,
            max_items: items,
            policy: Policy::Lru,
            ..StoreConfig::default()
        };
        let durable = DurableConfig {
            dir: dir.to_path_buf(),
            durability: Durability::Sync,
            flush_interval: Duration::from_secs(3600),
        };
        Store::open(config, Arc::new(ManualClock::new(T0)), durable).unwrap()
    }

    fn set(s: &Store, key: &str, value: &str) -> u64 {
        match s.set(&SetRequest::new(
            SetMode::Set,
            key.as_bytes(),
            value.as_bytes(),
        )) {
            SetStatus::Stored { cas } => cas,
            other => panic!("set {key}: {other:?}"),
        }
    }

    fn value(item: Option<ExportedItem>) -> Option<String> {
        item.map(|i| String::from_utf8(i.value().to_vec()).unwrap())
    }

    /// Every live key, as a memory scan and a disk pass export it (the last export wins).
    fn export_all(s: &Store) -> HashMap<String, String> {
        let mut all = HashMap::new();
        let mut items = Vec::new();
        let mut cursor = ScanCursor::default();
        while !s.scan(&mut cursor, 7, &mut items).done {}
        let mut disk = DiskCursor::default();
        while !s
            .scan_disk(&mut disk, 7, &mut items, |_, _| true)
            .unwrap()
            .done
        {}
        for i in items {
            let k = String::from_utf8(i.key().to_vec()).unwrap();
            all.insert(k, String::from_utf8(i.value().to_vec()).unwrap());
        }
        all
    }

    #[test]
    fn peek_through_finds_cold_keys_without_loading_them() {
        let dir = tempfile::tempdir().unwrap();
        let s = open(dir.path(), 10);
        for i in 0..100 {
            set(&s, &format!("k{i}"), &format!("v{i}"));
        }
        assert!(s.stats().curr_items <= 10);
        // Evicted dirty: queued or already written; both read through.
        s.sync_all().unwrap();
        assert!(s.peek(b"k0").is_none(), "k0 is cold");
        assert_eq!(value(s.peek_through(b"k0").unwrap()).as_deref(), Some("v0"));
        assert!(
            s.peek(b"k0").is_none(),
            "peek_through loaded k0 into the cache"
        );
        assert_eq!(
            value(s.peek_through(b"k99").unwrap()).as_deref(),
            Some("v99")
        );
        assert_eq!(s.peek_through(b"never").unwrap().map(|_| ()), None);
        // A delete of a cold key hides the disk version at once (a queued tombstone).
        assert!(!s.delete(b"k1"), "a blind delete answers as a miss");
        assert_eq!(s.peek_through(b"k1").unwrap().map(|_| ()), None);
        // A newer version in memory wins over the disk's.
        set(&s, "k2", "new");
        assert_eq!(
            value(s.peek_through(b"k2").unwrap()).as_deref(),
            Some("new")
        );
    }

    #[test]
    fn a_memory_scan_and_a_disk_pass_export_every_key_as_it_is_now() {
        let dir = tempfile::tempdir().unwrap();
        let s = open(dir.path(), 16);
        for i in 0..300 {
            set(&s, &format!("k{i}"), &format!("v{i}"));
        }
        s.sync_all().unwrap();
        set(&s, "k5", "newer"); // resident now, older on disk
        assert!(!s.delete(b"k6"));
        for i in 300..310 {
            set(&s, &format!("k{i}"), &format!("v{i}")); // some never written to disk
        }
        let all = export_all(&s);
        assert_eq!(all.len(), 309, "every live key once");
        assert_eq!(all["k5"], "newer");
        assert!(!all.contains_key("k6"), "a deleted key exported");
        for i in (0..310).filter(|&i| i != 5 && i != 6) {
            assert_eq!(all[&format!("k{i}")], format!("v{i}"));
        }
        assert!(s.stats().curr_items <= 16, "the scans filled the cache");
        // The filter sees every key once.
        let mut seen = 0;
        let mut out = Vec::new();
        let mut disk = DiskCursor::default();
        while !s
            .scan_disk(&mut disk, 50, &mut out, |_, k| {
                seen += 1;
                k.starts_with(b"k1")
            })
            .unwrap()
            .done
        {}
        assert!(seen >= 290, "only {seen} records seen");
        assert!(out.iter().all(|i| i.key().starts_with(b"k1")));
    }

    #[test]
    fn keys_evicted_and_not_yet_written_are_exported_from_the_queue() {
        let dir = tempfile::tempdir().unwrap();
        let s = open(dir.path(), 4);
        for i in 0..50 {
            set(&s, &format!("q{i}"), &format!("v{i}"));
        }
        assert_eq!(s.disk_records().unwrap(), 0, "nothing committed yet");
        let all = export_all(&s);
        assert_eq!(all.len(), 50, "evicted keys in the queue missed");
        assert!((0..50).all(|i| all[&format!("q{i}")] == format!("v{i}")));
    }

    #[test]
    fn delete_through_removes_a_cold_key_from_disk_only_if_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = open(dir.path(), 4);
            let cas0 = set(&s, "k0", "v0");
            let cas1 = set(&s, "k1", "v1");
            for i in 2..50 {
                set(&s, &format!("k{i}"), "x");
            }
            s.sync_all().unwrap();
            assert!(s.peek(b"k0").is_none() && s.peek(b"k1").is_none());
            assert!(s.delete_through(b"k0", cas0).unwrap());
            assert!(!s.delete_through(b"k1", cas1 + 1).unwrap(), "CAS differs");
            assert!(!s.delete_through(b"k0", cas0).unwrap(), "already gone");
            let cas2 = s.peek_through(b"k2").unwrap().unwrap().cas();
            assert!(s.delete_through(b"k2", cas2).unwrap());
            // Resident: as a meta delete with a CAS.
            let cas49 = s.peek(b"k49").unwrap().item.cas;
            assert!(s.delete_through(b"k49", cas49).unwrap());
            s.sync_all().unwrap();
        }
        let s = open(dir.path(), 4);
        assert!(!s.load(b"k0").unwrap(), "k0 came back from disk");
        assert!(!s.load(b"k2").unwrap(), "k2 came back from disk");
        assert!(!s.load(b"k49").unwrap(), "k49 came back from disk");
        assert!(s.load(b"k1").unwrap(), "k1 lost");
    }

    #[test]
    fn a_memory_only_store_reads_memory_and_has_no_disk() {
        let s = Store::new(StoreConfig::default(), Arc::new(ManualClock::new(T0)));
        let cas = set(&s, "k", "v");
        assert_eq!(value(s.peek_through(b"k").unwrap()).as_deref(), Some("v"));
        let mut out = Vec::new();
        let step = s
            .scan_disk(&mut DiskCursor::default(), 10, &mut out, |_, _| true)
            .unwrap();
        assert!(step.done && out.is_empty());
        assert!(!s.delete_through(b"k", cas + 1).unwrap());
        assert!(s.delete_through(b"k", cas).unwrap());
        assert!(s.peek(b"k").is_none());
    }
}
