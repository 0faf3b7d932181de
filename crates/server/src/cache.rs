//! The durable cache's semantics, written once for every front end: when a command reads a
//! key through from disk first (a miss on a durable store), when a write is made durable
//! before it is acknowledged (`--durability sync`), and the disk work itself.
//!
//! The memcached engine defers this work to its I/O driver ([`kvlab_net::Work`]: inline, or
//! on a helper thread); the REST handlers run it in place, on a runtime thread marked as
//! blocking. Both decide with the same [`DiskRules`] and do the same [`Blocking`] work.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{mpsc, Arc};

use kvlab_cluster::copies::{Confirm, Reply};
use kvlab_net::{Completion, Order, Watch, Work};
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

    /// Does the work and says how its request goes on. Blocks on disk.
    fn complete_on(&self, store: &Store) -> Completion {
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
            // Only a cluster node defers copies, and it runs them with its node.
            Blocking::Replicate(_) => Ok(()),
        }
    }
}

/// What deferred work runs with: the store, and the cluster node whose copies a write
/// waits for (if the server is one).
pub struct Helper {
    /// The cache.
    pub store: Arc<Store>,
    /// The cluster node, if any.
    pub node: Option<Arc<kvlab_cluster::Node>>,
    /// On an event loop ([`Work::IN_LOOP`]): the writes whose copies are in flight.
    in_flight: Option<InFlight>,
}

impl Helper {
    /// A worker over `store`, of cluster node `node` if the server is one.
    pub fn new(store: Arc<Store>, node: Option<Arc<kvlab_cluster::Node>>) -> Helper {
        Helper {
            store,
            node,
            in_flight: None,
        }
    }
}

impl Clone for Helper {
    /// The same store and node; copies in flight stay with their loop.
    fn clone(&self) -> Helper {
        Helper::new(self.store.clone(), self.node.clone())
    }
}

/// An event loop's writes whose copies are in flight: the copy senders confirm them
/// through a channel, and wake the loop through a socket pair it watches.
struct InFlight {
    reply: Reply,
    confirms: mpsc::Receiver<Confirm>,
    wake: UnixStream,
    /// Per ticket: the confirmations still owed, and the first failure.
    owed: Vec<(u32, Option<String>)>,
}

impl InFlight {
    fn expect(
        &mut self,
        ticket: usize,
        holders: u32,
        failure: Option<String>,
    ) -> Option<Completion> {
        if holders == 0 {
            return Some(completion(failure));
        }
        if self.owed.len() <= ticket {
            self.owed.resize(ticket + 1, (0, None));
        }
        self.owed[ticket] = (holders, failure);
        None
    }

    fn confirmed(&mut self, c: Confirm) -> Option<Completion> {
        let (left, failure) = self.owed.get_mut(c.ticket)?;
        if let Some(why) = c.failure {
            failure.get_or_insert_with(|| why.to_string());
        }
        *left = left.saturating_sub(1);
        (*left == 0).then(|| completion(failure.take()))
    }
}

fn completion(failure: Option<String>) -> Completion {
    match failure {
        None => Completion::Release,
        Some(reason) => Completion::Failed(reason),
    }
}

/// The id the loop's watch knows the copies' wake-up socket by.
const WAKE: usize = 0;

impl Work for Blocking {
    type Worker = Helper;

    /// A helper thread takes a round's works together: every write's copies go out in one
    /// batch per copy holder (one round trip for the lot), disk work in turn.
    const BATCH: usize = 64;

    /// On an event loop, a write's copies go to the copy senders and its reply leaves
    /// when they confirm, while the loop goes on serving (disk work runs at once).
    const IN_LOOP: bool = true;

    fn run(self, helper: &mut Helper) -> Completion {
        let mut batch = vec![self];
        let mut completion = Completion::Release;
        Self::run_batch(&mut batch, helper, &mut |_, c| completion = c);
        completion
    }

    fn attach(helper: &mut Helper, watch: Watch) {
        if helper.node.is_none() {
            return;
        }
        let pair = UnixStream::pair().and_then(|(tx, rx)| {
            tx.set_nonblocking(true)?;
            rx.set_nonblocking(true)?;
            watch.add(rx.as_raw_fd(), WAKE)?;
            Ok((tx, rx))
        });
        match pair {
            Ok((tx, rx)) => {
                let (confirms_tx, confirms) = mpsc::channel();
                helper.in_flight = Some(InFlight {
                    reply: Reply::new(confirms_tx, Some(Arc::new(tx))),
                    confirms,
                    wake: rx,
                    owed: Vec::new(),
                });
            }
            // Copies then wait in the loop, as on a helper thread.
            Err(e) => tracing::warn!(%e, "cannot watch the copies' confirmations"),
        }
    }

    fn start(
        works: &mut Vec<(usize, Self)>,
        helper: &mut Helper,
        done: &mut dyn FnMut(usize, Completion),
    ) {
        let (Some(node), Some(in_flight)) = (&helper.node, helper.in_flight.as_mut()) else {
            let tickets: Vec<usize> = works.iter().map(|(t, _)| *t).collect();
            let mut batch: Vec<Self> = works.drain(..).map(|(_, w)| w).collect();
            Self::run_batch(&mut batch, helper, &mut |i, c| done(tickets[i], c));
            return;
        };
        let mut copies = Vec::new();
        for (ticket, work) in works.drain(..) {
            match work {
                Blocking::Replicate(keys) => copies.push((ticket, keys)),
                work => done(ticket, work.complete_on(&helper.store)),
            }
        }
        if copies.is_empty() {
            return;
        }
        let reply = in_flight.reply.clone();
        node.send_copies(&node.view(), copies, &reply, &mut |t, holders, failure| {
            if let Some(c) = in_flight.expect(t, holders, failure) {
                done(t, c);
            }
        });
    }

    fn ready(
        helper: &mut Helper,
        _id: usize,
        _readable: bool,
        _writable: bool,
        done: &mut dyn FnMut(usize, Completion),
    ) {
        let Some(in_flight) = helper.in_flight.as_mut() else {
            return;
        };
        // Edge-triggered: drain the wake-ups, then every confirmation sent before them.
        let mut sink = [0u8; 256];
        while matches!((&in_flight.wake).read(&mut sink), Ok(n) if n > 0) {}
        while let Ok(c) = in_flight.confirms.try_recv() {
            let ticket = c.ticket;
            if let Some(completion) = in_flight.confirmed(c) {
                done(ticket, completion);
            }
        }
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
                work => done(i, work.complete_on(&helper.store)),
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
        for (i, failure) in node.replicate_and_wait(&node.view(), copies) {
            done(i, completion(failure));
        }
    }
}
