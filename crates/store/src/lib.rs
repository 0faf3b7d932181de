//! kvlab's item store: items (key, value, flags, exptime, CAS) with memcached 1.6
//! semantics, memory accounting, eviction policies and TTLs driven by a [`Clock`].
//!
//! # Sharding and concurrency
//!
//! ```text
//!  worker threads ──► Store (shared via Arc)
//!                       │ key ──hash──► shard = bits 32.. of the hash
//!        ┌──────────────┼──────────────┬─────────── … ──┐
//!        ▼              ▼              ▼                ▼
//!    Mutex<Shard>   Mutex<Shard>   Mutex<Shard>     Mutex<Shard>
//!    │  (a power of two of them; 0 = auto, at least 64)
//!    ├ HashTable<Slot> 4-byte slots: slab index (24 bits) + 8 more hash bits
//!    ├ Slab<Entry>     32-byte entries: block ptr, links, times, bits
//!    ├ Order           eviction lists for the policy
//!    └ ShardStats      plain counters, summed by stats()
//!
//!    Budget: one AtomicUsize of charged bytes, shared by all shards
//! ```
//!
//! A request hashes its key once, locks one shard (`parking_lot::Mutex`), works,
//! and unlocks; no global lock is on any path. A thread never holds two shard locks
//! at once. Besides the shard mutex, the shared atomics a request touches are: a
//! load of the flush state, the reference-count increment of a returned [`Value`],
//! and — for stores that need more memory than the item they replace — the memory
//! reservation. CAS values come from a per-shard counter tagged with the shard index
//! (unique store-wide, increasing per key), so stores share no CAS counter.
//!
//! # Items and memory accounting
//!
//! An item version is one heap block: header (refcount, lengths, CAS, flags), key,
//! value — one allocation per store. [`Value`] points into it, so a get clones a
//! pointer and bumps a refcount, it never allocates or copies. Mutable metadata
//! (exptime, last access, eviction links, fetched/stale/win bits, LFU count) lives
//! in the shard's slab entry.
//!
//! Each item is charged `key + value +` [`ITEM_OVERHEAD`] (77) bytes, which is its
//! real footprint (block header, malloc overhead, slab entry, hash-table slot;
//! measured by RSS, see [`ITEM_OVERHEAD`]; memcached's real cost for the same items
//! is 87). Charges go to one atomic budget. A store first reserves its bytes with a
//! compare-and-swap that never passes `StoreConfig::memory_limit`, evicting until the
//! reservation fits, and only then links the item; so [`StoreStats::bytes`] never
//! exceeds the limit under any interleaving. An item that cannot fit in an empty
//! store is `OutOfMemory`.
//!
//! An optional entry bound ([`StoreConfig::max_items`], `--cache-items`) is kept the same
//! way: a store of a new key takes an item slot from one atomic count with a
//! compare-and-swap that never passes the bound — under the key's shard lock, where it
//! is known whether the key already has an item (a replacement takes none) — and
//! evicts by the policy until it gets one; unlinking an item returns its slot. So
//! `curr_items` never exceeds the bound either.
//!
//! # Eviction
//!
//! A store that needs memory first evicts in its own shard (under the lock it
//! holds): among the few coldest items it reclaims an expired or flushed one if
//! there is one (`reclaimed`), else evicts the policy's victim (`evictions`). If its
//! shard has nothing left, it releases its lock and evicts from the other shards one
//! lock at a time. The eviction order of `lfu` and `fifo` is therefore per shard —
//! like memcached's per-slab-class LRUs — and exact with `shards = 1`.
//!
//! `lru` orders store-wide: a shard of 64 holds only a few large items (five of
//! 200 KB under `-m 64`), so its coldest is often one of the store's newest. Each
//! store and each access stamps its item from a *charge clock* (bytes ever stored;
//! a 16-bit stamp in units of the limit / 4096, in the entry's spare bits), and each
//! shard publishes the stamp of its coldest item in an atomic hint when that item
//! changes. A store evicts in its own shard while its coldest item is within 1/256
//! of the limit (in bytes stored since) of the oldest hint; otherwise it releases
//! its lock and evicts in the shard with the oldest hint, as `largest` does below.
//! Guarantee, without concurrent writers: every eviction takes an item at most
//! 1/256 of the limit younger than the store-wide least recently used one (stamps
//! wrap after 8 limits of stores: an item untouched that long may look young).
//! Cost: one relaxed add on the budget's cache line per store, one relaxed load per
//! hit, and a scan of one atomic per shard per eviction.
//! Policies ([`Policy`]): `lru` (intrusive list, O(1)), `lfu` (a list per access
//! count, ties by recency), `fifo`, `largest`, and `none` (never evict live items;
//! stores fail with `OutOfMemory`, like memcached `-M`).
//!
//! `largest` orders store-wide instead: each shard publishes the charge of its
//! largest item in an atomic hint, written under its lock whenever that changes. A
//! store evicts in its own shard only while the item it would evict there (never the
//! key being stored) is at least as large as every other shard's hint; otherwise it
//! releases its lock and repeatedly scans the hints (no locks), locks only the shard
//! with the largest one and evicts there while that shard's largest item is at least
//! the runner-up's hint, until its reservation fits. Guarantee: without concurrent
//! writers, every eviction takes a largest item of the whole store (ties across
//! shards in no particular order; within a shard the oldest store first), except
//! that an expired or flushed item among the chosen shard's 5 largest is reclaimed
//! instead. With concurrent writers the victim is the largest of a shard whose hint
//! was the maximum when scanned, so an item stored or resized meanwhile elsewhere
//! can be passed over by that one eviction. The cost is a scan of one atomic per
//! shard per eviction and, when the largest item is in another shard, one more lock
//! round trip per store.
//!
//! # Time, expiry and flush
//!
//! Time comes only from the [`Clock`] (tests use [`ManualClock`]). Wire exptimes
//! follow memcached: 0 never, negative already expired, up to 30 days relative,
//! above that absolute unix time. Expired items are unlinked lazily when found, by
//! eviction scans, or by the crawler: [`Store::crawl_step`] examines a bounded
//! run of one shard's slab slots under its lock and resumes where it stopped (the
//! server runs it on a thread, like memcached's LRU crawler), and
//! [`Store::reclaim_expired`] is one whole pass of such steps. `flush_all` bumps a flush
//! generation (see [`Store::flush_all`]), so it is exact even within one second.
//!
//! # Export and import (what migration streams)
//!
//! [`Store::scan`] exports live items as [`ExportedItem`]s (key, value shared not
//! copied, flags, absolute exptime, CAS) in bounded steps that resume at a
//! [`ScanCursor`], one shard lock at a time, like the crawler, and without touching
//! eviction order or counters; [`Store::scan_matching`] exports a subset (by
//! [`Store::key_hash`] or key). [`Store::import`] stores one as it was, expiring at
//! the same moment, either keeping or replacing a live item ([`ImportMode`]).
//! On a durable store, where most keys may live on disk only, [`Store::scan_disk`]
//! exports the disk's keys as they are now (a chunk of records per step, no lock held
//! while reading them), [`Store::peek_through`] reads one key wherever its current
//! version is (memory, write-behind queue, disk) without caching it, and
//! [`Store::delete_through`] deletes a key if unchanged, on disk too.
//!
//! # Durable stores
//!
//! [`Store::open`] makes the memory a write-back cache over an embedded engine in a
//! data directory: every store leaves its item dirty, a dirty item that leaves
//! memory (eviction) and every delete are queued per shard (write-behind,
//! tombstones) and written by a flusher thread or by [`Store::persist`] /
//! [`Store::sync_all`] in group-committed batches; a miss reads through with
//! [`Store::load`]. Records that `flush_all` or expiry killed are deleted from the
//! disk in the background ([`Store::purge_disk`] does it at once). The memory
//! calls never touch the disk; only `load`, `persist`, `sync_all` and
//! `purge_disk` block (and a write when the write-behind queue is over its bound:
//! see `durable/mod.rs`). What a crash can lose: [`Durability`].
//! `-m` bounds the cache only; the engine's block cache (16 MiB) and the queue are
//! extra.
//!
//! Layers, bottom up (a module never imports one above it): `item`, `slab`,
//! `policy`, `memory`, `clock`, `stats` → `wb` (the write-behind queue a shard fills
//! and the durable layer drains) → `shard` (one shard, and the padded shard array)
//! → `durable` (engine, commit rounds, purge, over the shards) → `store` (composes).
//!
//! The engine is `fjall` 3.1 (LSM tree + journal), chosen over `redb` 4.4 by
//! measuring on the project machine (2 cores, virtual disk; ad-hoc release-build
//! bench, two runs each, 100-byte values, 20-byte keys):
//!
//! | operation                                   | fjall         | redb          |
//! |---------------------------------------------|---------------|---------------|
//! | 100 puts, one commit + fdatasync             | 1.6–2.1 ms    | 2.3–2.8 ms    |
//! | 1 put, one commit + fdatasync (`sync` path)  | 0.23–0.84 ms  | 1.1–1.6 ms    |
//! | point read, hit                             | 2.2–3.4 µs    | 0.6–1.4 µs    |
//! | point read, miss                            | 0.9–1.0 µs    | 0.3–1.0 µs    |
//!
//! The durable commit, which every acknowledged write waits for under `sync`,
//! is 2–5× faster with fjall; reads only serve cache misses, where both are far
//! below a network round trip. fjall costs more dependencies (~45 crates against
//! none) and background threads.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod classes;
mod clock;
mod durable;
mod evicted;
mod item;
mod memory;
mod policy;
mod request;
mod shard;
mod slab;
mod stats;
mod store;
mod wb;

pub use classes::{SizeClasses, ITEM_HEADER, MAX_CLASSES};
pub use clock::{Clock, ManualClock, SystemClock, REALTIME_MAXDELTA};
pub use durable::{Durability, DurableConfig, ParseDurabilityError};
pub use evicted::{Evicted, EvictionObserver};
pub use item::{ExportedItem, ItemView, MetaView, Value, ITEM_OVERHEAD, MAX_KEY_LEN};
pub use policy::{ParsePolicyError, Policy};
pub use request::{
    ArithRequest, ArithStatus, DeleteStatus, ImportMode, MetaDeleteOpts, MetaGetOpts, SetMode,
    SetRequest, SetStatus,
};
pub use stats::{DurableStats, Figure, Kind, StoreStats};
pub use store::{CrawlCursor, CrawlStep, DiskCursor, ScanCursor, ScanStep, Store, StoreConfig};
