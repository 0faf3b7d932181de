//! The durable cache's semantics, written once for every front end: when a command reads a
//! key through from disk first (a miss on a durable store), when a write is made durable
//! before it is acknowledged (`--durability sync`), and the disk work itself.
//!
//! The memcached engine defers this work to its I/O driver ([`kvlab_net::Work`]: inline, or
//! on a helper thread); the REST handlers run it in place, on a runtime thread marked as
//! blocking. Both decide with the same [`DiskRules`] and do the same [`Blocking`] work.

use std::sync::Arc;

use kvlab_net::{Completion, Order, Work};
use kvlab_store::{Durability, Store};

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

    /// Whether `key` must be read through before a command that depends on its current
    /// state: it is not in memory, and not already loaded for this command (`loaded`).
    pub fn must_load(&self, store: &Store, key: &[u8], loaded: &[Vec<u8>]) -> bool {
        self.read_through && store.peek(key).is_none() && !loaded.iter().any(|k| k == key)
    }

    /// The read-through a command that depends on `key`'s current state needs first, if any.
    pub fn load(&self, store: &Store, key: &[u8]) -> Option<Blocking> {
        self.must_load(store, key, &[])
            .then(|| Blocking::Load(key.to_vec()))
    }

    /// The persist a successful write of `key` needs before it is acknowledged, if any.
    pub fn persist(&self, key: &[u8]) -> Option<Blocking> {
        self.sync.then(|| Blocking::Persist(key.to_vec()))
    }
}

/// Disk work a request waits for, run inline (within the request) or on a helper thread. A
/// cluster node's service wraps it in work of its own (its copies of a write).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Blocking {
    /// Read `key` through from disk into the cache; the request then runs again.
    Load(Vec<u8>),
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
            Blocking::Load(key) => store.load(key).map(|_| ()),
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
