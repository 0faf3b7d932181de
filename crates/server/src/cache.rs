//! The durable cache's semantics, written once for every front end: when a command reads a
//! key through from disk first (a miss on a durable store), when a write is made durable
//! before it is acknowledged (`--durability sync`), and the disk work itself.
//!
//! The memcached engine defers this work to its I/O driver ([`kvlab_net::Work`]: inline, or
//! on a helper thread); the REST handlers run it in place, on a runtime thread marked as
//! blocking. Both decide with the same [`DiskRules`] and do the same [`Blocking`] work.

use std::sync::{Arc, OnceLock};

use kvlab_net::{Completion, Order, Work};
use kvlab_store::{Durability, ItemView, Store};

/// Most read-throughs of one key for one request (a command other than `get`/`gets` whose
/// key was found on disk but left memory again before the request re-ran reads it again).
/// Past it the command answers `SERVER_ERROR out of memory` ([`Need::Unloadable`]) rather
/// than run on a key it cannot see.
pub const MAX_LOADS: usize = 3;

/// What a command that depends on a key's current state needs before it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Nothing: the key is in memory, not durable, or read through already.
    Ready,
    /// A read-through of the key from disk.
    Load,
    /// The key exists on disk but other stores evicted it [`MAX_LOADS`] times before the
    /// command could run: the cache has no room to hold it for the command, which must fail
    /// (running it on a key it cannot see would answer wrongly: an `add` would overwrite
    /// the stored value).
    Unloadable,
}

/// When a store's disk is touched, decided once per store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiskRules {
    /// The store reads through from disk on a miss (any durable store).
    pub read_through: bool,
    /// Writes are persisted before their reply (`--durability sync`).
    pub sync: bool,
}

impl DiskRules {
    /// The rules of `store`.
    pub fn of(store: &Store) -> Self {
        let durability = store.durability();
        DiskRules {
            read_through: durability.is_some(),
            sync: durability == Some(Durability::Sync),
        }
    }

    /// What a command that depends on `key`'s current state needs: a read-through when the
    /// key is not in memory and not already loaded for this command (`loaded`) — or, when
    /// `again` (a command that needs the item in memory, not only its value), when the last
    /// read-through found it but it was evicted again before the command ran, fewer than
    /// [`MAX_LOADS`] times; after that the key is [`Need::Unloadable`].
    pub fn need(&self, store: &Store, key: &[u8], loaded: &[ReadThrough], again: bool) -> Need {
        if !self.read_through || store.peek(key).is_some() {
            return Need::Ready;
        }
        let mut reads = loaded.iter().filter(|r| r.key == key);
        match reads.next_back() {
            None => Need::Load,
            Some(last) if !again || last.found().is_none() => Need::Ready,
            Some(_) if reads.count() + 1 < MAX_LOADS => Need::Load,
            Some(_) => Need::Unloadable,
        }
    }

    /// The read-through a command that depends on `key`'s current state needs first, if any.
    pub fn load(&self, store: &Store, key: &[u8]) -> Option<Blocking> {
        (self.need(store, key, &[], false) == Need::Load)
            .then(|| Blocking::Load(ReadThrough::new(key)))
    }

    /// The persist a successful write of `key` needs before it is acknowledged, if any.
    pub fn persist(&self, key: &[u8]) -> Option<Blocking> {
        self.sync.then(|| Blocking::Persist(key.to_vec()))
    }
}

/// A read-through of one key for a request, and what it found: the work fills it in (on
/// whichever thread runs it), the request's re-run reads it. A `get` serves the item found
/// when it has left memory again meanwhile ([`Store::get_loaded`]).
#[derive(Clone)]
pub struct ReadThrough {
    /// The key read through.
    pub key: Vec<u8>,
    found: Arc<OnceLock<ItemView>>,
}

impl ReadThrough {
    /// A read-through of `key`, not yet run.
    pub fn new(key: &[u8]) -> ReadThrough {
        ReadThrough {
            key: key.to_vec(),
            found: Arc::default(),
        }
    }

    /// The item the read-through found; `None` before it ran, or if the key does not exist.
    pub fn found(&self) -> Option<&ItemView> {
        self.found.get()
    }

    /// Reads the key through (blocks on disk) and keeps what it found.
    pub fn run_on(&self, store: &Store) -> std::io::Result<()> {
        if let Some(item) = store.load_item(&self.key)? {
            let _ = self.found.set(item);
        }
        Ok(())
    }
}

impl PartialEq for ReadThrough {
    /// The same key (what was found is not compared).
    fn eq(&self, other: &ReadThrough) -> bool {
        self.key == other.key
    }
}

impl Eq for ReadThrough {}

impl std::fmt::Debug for ReadThrough {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadThrough")
            .field("key", &String::from_utf8_lossy(&self.key))
            .field("found", &self.found().is_some())
            .finish()
    }
}

/// Disk work a request waits for, run inline (within the request) or on a helper thread. A
/// cluster node's service wraps it in work of its own (its copies of a write).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Blocking {
    /// Read a key through from disk into the cache; the request then runs again.
    Load(ReadThrough),
    /// Make `key`'s new state durable; the request's reply leaves only afterwards.
    Persist(Vec<u8>),
    /// The same for several keys, in one commit round (`gat` of many keys).
    PersistKeys(Vec<Vec<u8>>),
    /// Make every change durable (`flush_all` under `--durability sync`).
    SyncAll,
}

impl Blocking {
    /// Whether the request runs again after the work (a read-through) rather than
    /// releasing a reply already composed (a persist).
    pub fn reruns_request(&self) -> bool {
        matches!(self, Blocking::Load(_))
    }

    /// How the session waits for it: a read-through re-runs the request; a persist holds its
    /// reply back. Either way later requests of the connection wait (a barrier), so they see
    /// the key loaded and the write durable.
    pub fn order(&self) -> Order {
        match self {
            Blocking::Load(_) => Order::Rerun,
            _ => Order::Barrier,
        }
    }

    /// Does the work and says how its request goes on. Blocks on disk.
    pub fn complete_on(&self, store: &Store) -> Completion {
        match self.run_on(store) {
            Ok(()) if self.reruns_request() => Completion::Rerun,
            Ok(()) => Completion::Release,
            // The session logs the failure and replies with it.
            Err(e) => Completion::Failed(e.to_string()),
        }
    }

    /// Does the work. Blocks on disk.
    pub fn run_on(&self, store: &Store) -> std::io::Result<()> {
        match self {
            Blocking::Load(read) => read.run_on(store),
            Blocking::Persist(key) => store.persist(key),
            Blocking::PersistKeys(keys) => store.persist_keys(keys.iter().map(Vec::as_slice)),
            Blocking::SyncAll => store.sync_all(),
        }
    }
}

/// What disk work runs with: the store.
#[derive(Clone)]
pub struct Helper {
    /// The cache.
    pub store: Arc<Store>,
}

impl Helper {
    /// A worker over `store`.
    pub fn new(store: Arc<Store>) -> Helper {
        Helper { store }
    }
}

impl Work for Blocking {
    type Worker = Helper;

    fn run(self, helper: &mut Helper) -> Completion {
        self.complete_on(&helper.store)
    }
}
