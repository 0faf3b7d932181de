//! The durable cache's semantics, written once for every front end: when a command reads a
//! key through from disk first (a miss on a durable store), when a write is made durable
//! before it is acknowledged (`--durability sync`), and the disk work itself.
//!
//! The memcached engine defers this work to its I/O driver ([`kvlab_net::Work`]: inline, or
//! on a helper thread); the REST handlers run it in place, on a runtime thread marked as
//! blocking. Both decide with the same [`DiskRules`] and do the same [`Blocking`] work.

use std::collections::HashMap;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{mpsc, Arc};

use kvlab_cluster::copies::{Confirm, Outcome, Reply, BEHIND};
use kvlab_cluster::Node;
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
    /// The same, but the reply leaves at once (write policy `owner`): the copies follow on
    /// an event loop that runs deferred work itself (the reactor:
    /// [`kvlab_cluster::copies::BEHIND`]); a helper thread, or a connection's own thread,
    /// still waits for them.
    Behind(Vec<Vec<u8>>),
    /// A read of keys whose copies are not all confirmed (a write's copies in flight, or
    /// failed): their state goes to the copy holders again, and the read's reply leaves
    /// only once they confirm — a value read is on every holder.
    Reconfirm(Vec<Vec<u8>>),
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
            Blocking::Replicate(_) | Blocking::Behind(_) | Blocking::Reconfirm(_) => {
                Order::Pipelined
            }
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
            Blocking::Replicate(_) | Blocking::Behind(_) | Blocking::Reconfirm(_) => Ok(()),
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
    /// Per ticket: its outcome so far, its keys, and whether it is a write's.
    owed: Vec<Option<Owed>>,
    /// The same for writes already acknowledged, by their [`BEHIND`] tickets.
    behind: HashMap<usize, Owed>,
    /// The next such ticket.
    next_behind: usize,
}

struct Owed {
    outcome: Outcome,
    keys: Vec<Vec<u8>>,
    write: bool,
}

impl InFlight {
    /// Ticket `ticket` was sent ([`kvlab_cluster::Node::send_copies`]); its completion if
    /// it owes no confirmation.
    fn expect(&mut self, node: &Node, ticket: usize, owed: Owed) -> Option<Completion> {
        if owed.outcome.left == 0 {
            let completion = settle(node, owed);
            return (ticket < BEHIND).then_some(completion);
        }
        if ticket >= BEHIND {
            self.behind.insert(ticket, owed);
            return None;
        }
        if self.owed.len() <= ticket {
            self.owed.resize_with(ticket + 1, || None);
        }
        self.owed[ticket] = Some(owed);
        None
    }

    fn confirmed(&mut self, node: &Node, c: Confirm) -> Option<Completion> {
        if c.ticket >= BEHIND {
            // An acknowledged write's copies: they settle its keys, nothing waits.
            let ticket = c.ticket;
            if self.behind.get_mut(&ticket)?.outcome.add(c) {
                let owed = self.behind.remove(&ticket)?;
                settle(node, owed);
            }
            return None;
        }
        let slot = self.owed.get_mut(c.ticket)?;
        let done = slot.as_mut()?.outcome.add(c);
        if !done {
            return None;
        }
        slot.take().map(|owed| settle(node, owed))
    }
}

/// Records a ticket's outcome for its keys and says how its request goes on.
fn settle(node: &Node, owed: Owed) -> Completion {
    for key in &owed.keys {
        node.unconfirmed()
            .settle(key, owed.write, Some(&owed.outcome));
    }
    match owed.outcome.failure {
        None => Completion::Release,
        Some(reason) => Completion::Failed(reason),
    }
}

/// The copies a round's works ask for: (ticket, keys, write?).
fn copies_of(
    works: &mut Vec<(usize, Blocking)>,
    store: &Store,
    done: &mut dyn FnMut(usize, Completion),
) -> Vec<(usize, Vec<Vec<u8>>, bool)> {
    let mut copies = Vec::new();
    for (ticket, work) in works.drain(..) {
        match work {
            Blocking::Replicate(keys) | Blocking::Behind(keys) => copies.push((ticket, keys, true)),
            Blocking::Reconfirm(keys) => copies.push((ticket, keys, false)),
            work => done(ticket, work.complete_on(store)),
        }
    }
    copies
}

/// The id the loop's watch knows the copies' wake-up socket by (copy streams' ids are
/// above it).
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
                // The copy streams' replies are read here too, as they arrive.
                if let Some(node) = &helper.node {
                    node.attach_copies(Box::new(move |fd, id| watch.add(fd, id)));
                }
                let (confirms_tx, confirms) = mpsc::channel();
                helper.in_flight = Some(InFlight {
                    reply: Reply::new(confirms_tx, Some(Arc::new(tx))),
                    confirms,
                    wake: rx,
                    owed: Vec::new(),
                    behind: HashMap::new(),
                    next_behind: BEHIND,
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
        // A write acknowledged before its copies: its reply leaves now, and its copies go
        // on under a ticket of their own.
        for (ticket, work) in works.iter_mut() {
            if matches!(work, Blocking::Behind(_)) {
                done(*ticket, Completion::Release);
                *ticket = in_flight.next_behind;
                in_flight.next_behind += 1;
            }
        }
        let copies = copies_of(works, &helper.store, done);
        if copies.is_empty() {
            return;
        }
        let sends: Vec<(usize, Vec<Vec<u8>>)> = copies
            .iter()
            .map(|(t, keys, _)| (*t, keys.clone()))
            .collect();
        let mut owed: Vec<Option<Owed>> = copies
            .into_iter()
            .map(|(_, keys, write)| {
                Some(Owed {
                    outcome: Outcome::default(),
                    keys,
                    write,
                })
            })
            .collect();
        let reply = in_flight.reply.clone();
        let mut i = 0;
        node.send_copies(&node.view(), &sends, &reply, &mut |t, outcome| {
            if let Some(mut o) = owed.get_mut(i).and_then(Option::take) {
                o.outcome = outcome;
                if let Some(c) = in_flight.expect(node, t, o) {
                    done(t, c);
                }
            }
            i += 1;
        });
    }

    fn ready(
        helper: &mut Helper,
        id: usize,
        _readable: bool,
        _writable: bool,
        done: &mut dyn FnMut(usize, Completion),
    ) {
        let Some(in_flight) = helper.in_flight.as_mut() else {
            return;
        };
        let Some(node) = &helper.node else { return };
        if id == WAKE {
            // Edge-triggered: drain the wake-ups, then every confirmation sent before them.
            let mut sink = [0u8; 256];
            while matches!((&in_flight.wake).read(&mut sink), Ok(n) if n > 0) {}
        } else {
            // A copy stream this loop reads: the batches it answers confirm at once (those
            // of this loop's writes among them, without waiting for their wake-up).
            node.copies_ready(id, &in_flight.reply);
        }
        while let Ok(c) = in_flight.confirms.try_recv() {
            let ticket = c.ticket;
            if let Some(completion) = in_flight.confirmed(node, c) {
                done(ticket, completion);
            }
        }
    }

    fn run_batch(
        works: &mut Vec<Self>,
        helper: &mut Helper,
        done: &mut dyn FnMut(usize, Completion),
    ) {
        let mut indexed: Vec<(usize, Blocking)> = works.drain(..).enumerate().collect();
        let copies = copies_of(&mut indexed, &helper.store, done);
        if copies.is_empty() {
            return;
        }
        let Some(node) = &helper.node else {
            copies
                .into_iter()
                .for_each(|(i, _, _)| done(i, Completion::Release));
            return;
        };
        let sends: Vec<(usize, Vec<Vec<u8>>)> = copies
            .iter()
            .map(|(i, keys, _)| (*i, keys.clone()))
            .collect();
        let outcomes = node.replicate_and_wait(&node.view(), &sends);
        for ((i, keys, write), outcome) in copies.into_iter().zip(outcomes) {
            done(
                i,
                settle(
                    node,
                    Owed {
                        outcome,
                        keys,
                        write,
                    },
                ),
            );
        }
    }
}
