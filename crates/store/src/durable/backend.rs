//! The storage engine behind a durable store, reached through a small trait so
//! tests can wrap it (injected delay, counters).
//!
//! The engine is [`fjall`] (an LSM tree with a write-ahead journal). It was chosen
//! over `redb` by measuring on the project machine (2 cores, virtual disk; see the
//! crate docs, "Durable stores"): a single put with a durable commit — the
//! `--durability sync` path — took 0.23–0.84 ms with fjall against 1.1–1.6 ms with
//! redb, and a 100-item batch 1.6–2.1 ms against 2.3–2.8 ms; redb's point reads were
//! faster (0.6 vs 2–3 µs for a hit) but reads only serve cache misses.
//!
//! Two keyspaces: `items` (key → encoded record, see `record`) and `meta` (the flush
//! generation and the CAS high-water mark). A [`Batch`] is committed atomically
//! across both.

use std::io;
use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};

/// An item write: the encoded record, or `None` for a delete.
pub(crate) type ItemWrite = (Box<[u8]>, Option<Vec<u8>>);

/// One atomic write: item puts and deletes, plus meta entries.
#[derive(Default)]
pub(crate) struct Batch {
    pub items: Vec<ItemWrite>,
    pub meta: Vec<(&'static [u8], Vec<u8>)>,
}

impl Batch {
    pub(crate) fn is_empty(&self) -> bool {
        self.items.is_empty() && self.meta.is_empty()
    }
}

/// What the durable store needs from an engine.
pub(crate) trait Backend: Send + Sync + 'static {
    /// The record stored for an item key.
    fn get(&self, key: &[u8]) -> io::Result<Option<Vec<u8>>>;
    /// A meta entry.
    fn get_meta(&self, key: &[u8]) -> io::Result<Option<Vec<u8>>>;
    /// Writes `batch` atomically; with `sync`, fsyncs (fdatasync) the engine's
    /// journal before returning, else hands it to the OS (survives a process crash,
    /// not a power loss).
    fn write(&self, batch: Batch, sync: bool) -> io::Result<()>;
    /// fdatasync of everything written so far.
    fn sync(&self) -> io::Result<()>;
    /// Calls `f` with up to `limit` item records in key order, starting after the
    /// key `after` (from the first key if `None`); returns how many it visited.
    /// Sees every write committed before the call (no snapshot isolation is needed:
    /// the purge re-checks what it found, see `Durable::purge_step`).
    fn scan(
        &self,
        after: Option<&[u8]>,
        limit: usize,
        f: &mut dyn FnMut(&[u8], &[u8]),
    ) -> io::Result<usize>;
    /// Item records in the engine (a full scan: for tests and tools).
    fn count(&self) -> io::Result<u64>;
}

fn io_err(e: fjall::Error) -> io::Error {
    io::Error::other(e)
}

/// fjall with the journal persisted by us (`manual_journal_persist`): a commit is
/// either handed to the OS (`PersistMode::Buffer`) or fdatasynced
/// (`PersistMode::SyncData`) as part of the commit.
pub(crate) struct Fjall {
    db: Database,
    items: Keyspace,
    meta: Keyspace,
}

impl Fjall {
    pub(crate) fn open(dir: &Path) -> io::Result<Fjall> {
        std::fs::create_dir_all(dir)?;
        let db = Database::builder(dir)
            .manual_journal_persist(true)
            // The engine's block cache is outside `-m`; keep it modest.
            .cache_size(16 << 20)
            .open()
            .map_err(io_err)?;
        let items = db
            .keyspace("items", KeyspaceCreateOptions::default)
            .map_err(io_err)?;
        let meta = db
            .keyspace("meta", KeyspaceCreateOptions::default)
            .map_err(io_err)?;
        Ok(Fjall { db, items, meta })
    }
}

impl Backend for Fjall {
    fn get(&self, key: &[u8]) -> io::Result<Option<Vec<u8>>> {
        Ok(self.items.get(key).map_err(io_err)?.map(|v| v.to_vec()))
    }

    fn get_meta(&self, key: &[u8]) -> io::Result<Option<Vec<u8>>> {
        Ok(self.meta.get(key).map_err(io_err)?.map(|v| v.to_vec()))
    }

    fn write(&self, batch: Batch, sync: bool) -> io::Result<()> {
        let mode = if sync {
            PersistMode::SyncData
        } else {
            PersistMode::Buffer
        };
        let mut b = self.db.batch().durability(Some(mode));
        for (k, v) in batch.items {
            match v {
                Some(v) => b.insert(&self.items, &*k, v),
                None => b.remove(&self.items, &*k),
            }
        }
        for (k, v) in batch.meta {
            b.insert(&self.meta, k, v);
        }
        b.commit().map_err(io_err)
    }

    fn sync(&self) -> io::Result<()> {
        self.db.persist(PersistMode::SyncData).map_err(io_err)
    }

    fn scan(
        &self,
        after: Option<&[u8]>,
        limit: usize,
        f: &mut dyn FnMut(&[u8], &[u8]),
    ) -> io::Result<usize> {
        let iter = match after {
            Some(a) => self
                .items
                .range::<&[u8], _>((Bound::Excluded(a), Bound::Unbounded)),
            None => self.items.iter(),
        };
        let mut n = 0;
        for guard in iter.take(limit) {
            let (k, v) = guard.into_inner().map_err(io_err)?;
            f(&k, &v);
            n += 1;
        }
        Ok(n)
    }

    fn count(&self) -> io::Result<u64> {
        Ok(self.items.len().map_err(io_err)? as u64)
    }
}

/// Counters of backend calls (see [`crate::DurableStats`]).
#[derive(Default)]
pub(crate) struct Counters {
    pub reads: AtomicU64,
    pub commits: AtomicU64,
    pub fsyncs: AtomicU64,
    pub items_written: AtomicU64,
}

/// Wraps a backend with counters and the injected delay of
/// [`crate::Store::set_backend_delay`]: each call (read, write, sync) first sleeps
/// the delay.
pub(crate) struct Instrumented {
    inner: Box<dyn Backend>,
    delay_ns: AtomicU64,
    pub counters: Counters,
}

impl Instrumented {
    pub(crate) fn new(inner: Box<dyn Backend>) -> Instrumented {
        Instrumented {
            inner,
            delay_ns: AtomicU64::new(0),
            counters: Counters::default(),
        }
    }

    pub(crate) fn set_delay(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.delay_ns.store(ns, Ordering::Relaxed);
    }

    fn delay(&self) {
        let ns = self.delay_ns.load(Ordering::Relaxed);
        if ns != 0 {
            std::thread::sleep(Duration::from_nanos(ns));
        }
    }

    pub(crate) fn get(&self, key: &[u8]) -> io::Result<Option<Vec<u8>>> {
        self.delay();
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        self.inner.get(key)
    }

    pub(crate) fn get_meta(&self, key: &[u8]) -> io::Result<Option<Vec<u8>>> {
        self.inner.get_meta(key)
    }

    pub(crate) fn write(&self, batch: Batch, sync: bool) -> io::Result<()> {
        self.delay();
        self.counters.commits.fetch_add(1, Ordering::Relaxed);
        self.counters
            .items_written
            .fetch_add(batch.items.len() as u64, Ordering::Relaxed);
        if sync {
            self.counters.fsyncs.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.write(batch, sync)
    }

    pub(crate) fn sync(&self) -> io::Result<()> {
        self.delay();
        self.counters.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.inner.sync()
    }

    /// A point read by the purge (not a read-through: not counted in `reads`).
    pub(crate) fn get_uncounted(&self, key: &[u8]) -> io::Result<Option<Vec<u8>>> {
        self.delay();
        self.inner.get(key)
    }

    pub(crate) fn scan(
        &self,
        after: Option<&[u8]>,
        limit: usize,
        f: &mut dyn FnMut(&[u8], &[u8]),
    ) -> io::Result<usize> {
        self.delay();
        self.inner.scan(after, limit, f)
    }

    pub(crate) fn count(&self) -> io::Result<u64> {
        self.inner.count()
    }
}
