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

/// Work that may block — disk, or a cluster node's copies of a write — run inline, on a
/// helper thread, or (the reactor) with the rest of the loop's round as one batch.
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
    /// Write these keys' new state through to the other nodes that hold their copies (a
    /// cluster node with `replicas` > 1); the write's reply leaves only afterwards.
    Replicate(Vec<Vec<u8>>),
}

impl Blocking {
    /// Whether the request runs again after the work (a read-through) rather than
    /// releasing a reply already composed (a persist).
    pub fn reruns_request(&self) -> bool {
        matches!(self, Blocking::Load(_))
    }

    /// How the session waits for it: a read-through re-runs the request; a persist holds its
    /// reply back. Either way later requests of the connection wait (a barrier), so they see
    /// the key loaded and the write durable. A write's copies hold back only its own reply:
    /// the connection's later requests run meanwhile (the write is already applied here),
    /// so a pipelining client's writes reach the copy holders together.
    pub fn order(&self) -> Order {
        match self {
            Blocking::Load(_) => Order::Rerun,
            Blocking::Replicate(_) => Order::Pipelined,
            _ => Order::Barrier,
        }
    }

    /// Does the work. Blocks on disk.
    pub fn run_on(&self, store: &Store) -> std::io::Result<()> {
        match self {
            Blocking::Load(key) => store.load(key).map(|_| ()),
            Blocking::Persist(key) => store.persist(key),
            Blocking::PersistKeys(keys) => store.persist_keys(keys.iter().map(Vec::as_slice)),
            Blocking::SyncAll => store.sync_all(),
            // Only a cluster node defers copies, and it runs them with its node.
            Blocking::Replicate(_) => Ok(()),
        }
    }
}

/// What deferred work runs with: the store, and the cluster node whose copies a write
/// waits for (if the server is one).
#[derive(Clone)]
pub struct Helper {
    /// The cache.
    pub store: Arc<Store>,
    /// The cluster node, if any.
    pub node: Option<Arc<kvlab_cluster::Node>>,
}

impl Work for Blocking {
    type Worker = Helper;

    /// A round's works run together: every write's copies go out in one batch per copy
    /// holder (one round trip for the lot), disk work in turn.
    const BATCH: usize = 64;

    fn run(self, helper: &mut Helper) -> Completion {
        let mut batch = vec![self];
        let mut completion = Completion::Release;
        Self::run_batch(&mut batch, helper, &mut |_, c| completion = c);
        completion
    }

    fn run_batch(
        works: &mut Vec<Self>,
        helper: &mut Helper,
        done: &mut dyn FnMut(usize, Completion),
    ) {
        let mut copies: Vec<(usize, Vec<Vec<u8>>)> = Vec::new();
        for (i, work) in works.drain(..).enumerate() {
            match work {
                Blocking::Replicate(keys) => copies.push((i, keys)),
                work => done(
                    i,
                    match work.run_on(&helper.store) {
                        Ok(()) if work.reruns_request() => Completion::Rerun,
                        Ok(()) => Completion::Release,
                        // The session logs the failure and replies with it.
                        Err(e) => Completion::Failed(e.to_string()),
                    },
                ),
            }
        }
        if copies.is_empty() {
            return;
        }
        let Some(node) = &helper.node else {
            copies
                .into_iter()
                .for_each(|(i, _)| done(i, Completion::Release));
            return;
        };
        let keys: Vec<&[u8]> = copies
            .iter()
            .flat_map(|(_, keys)| keys.iter().map(Vec::as_slice))
            .collect();
        let view = node.view();
        let failed = node.replicate_keys(&view, &keys);
        for (i, keys) in copies {
            match keys
                .iter()
                .find_map(|k| node.copy_failure(&view, k, &failed))
            {
                None => done(i, Completion::Release),
                Some(reason) => done(i, Completion::Failed(reason)),
            }
        }
    }
}
