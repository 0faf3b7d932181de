//! A node's deferred work: the cache's disk work, and a write's copies (or a read's
//! reconfirmation) — sent to the holders in one batch per holder, and completed as their
//! confirmations come back ([`crate::copies`]).

use std::collections::HashMap;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{mpsc, Arc};
use std::time::Instant;

use kvlab_net::{Completion, Watch, Work};
use kvlab_server::engine::{Blocking, Helper};
use kvlab_store::Store;

use crate::copies::{Confirm, Outcome, Reply, BEHIND};
use crate::node::Node;

/// Work a node's request waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeWork {
    /// The cache's own disk work (read-through, persist).
    Cache(Blocking),
    /// A write's persist (`--durability sync`), then its copies as [`NodeWork::Replicate`]:
    /// its reply leaves once it is on this node's disk and every holder confirmed it — or,
    /// with `behind` (write policy `owner`), once it is on this node's disk, its copies
    /// following as [`NodeWork::Behind`].
    Durable(Blocking, Vec<Vec<u8>>, bool),
    /// Write these keys' new state through to the other nodes that hold their copies
    /// (`replicas` > 1); the write's reply leaves only afterwards.
    Replicate(Vec<Vec<u8>>),
    /// The same, but the reply leaves at once (write policy `owner`): the copies follow on
    /// an event loop that runs deferred work itself (the reactor: [`BEHIND`]); a helper
    /// thread, or a connection's own thread, still waits for them.
    Behind(Vec<Vec<u8>>),
    /// A read of keys whose copies are not all confirmed (a write's copies in flight, or
    /// failed): their state goes to the copy holders again, and the read's reply leaves
    /// only once they confirm — a value read is on every holder.
    Reconfirm(Vec<Vec<u8>>),
}

/// What a node's deferred work runs with: the cache's disk worker and the node.
pub struct NodeWorker {
    cache: Helper,
    node: Arc<Node>,
    /// On an event loop ([`Work::IN_LOOP`]): the writes whose copies are in flight.
    in_flight: Option<InFlight>,
}

impl NodeWorker {
    /// A worker of `node` over the cache's disk worker `cache`.
    pub fn new(cache: Helper, node: Arc<Node>) -> NodeWorker {
        NodeWorker {
            cache,
            node,
            in_flight: None,
        }
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
    /// Ticket `ticket` was sent ([`Node::send_copies`]); its completion if it owes no
    /// confirmation.
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

/// The copies a round's works ask for: (ticket, keys, write?); disk work runs at once (a
/// write's persist before its copies: one that fails fails the write, uncopied).
fn copies_of(
    works: &mut Vec<(usize, NodeWork)>,
    node: &Node,
    store: &Store,
    done: &mut dyn FnMut(usize, Completion),
) -> Vec<(usize, Vec<Vec<u8>>, bool)> {
    let mut copies = Vec::new();
    for (ticket, work) in works.drain(..) {
        match work {
            NodeWork::Replicate(keys) | NodeWork::Behind(keys) => copies.push((ticket, keys, true)),
            NodeWork::Reconfirm(keys) => copies.push((ticket, keys, false)),
            NodeWork::Cache(work) => done(ticket, work.complete_on(store)),
            NodeWork::Durable(work, keys, _) => match work.complete_on(store) {
                Completion::Release => copies.push((ticket, keys, true)),
                failed => {
                    for key in &keys {
                        node.unconfirmed().settle(key, true, None);
                    }
                    done(ticket, failed);
                }
            },
        }
    }
    copies
}

/// The id the loop's watch knows the copies' wake-up socket by (copy streams' ids are
/// above it).
const WAKE: usize = 0;

impl Work for NodeWork {
    type Worker = NodeWorker;

    /// A helper thread takes a round's works together: every write's copies go out in one
    /// batch per copy holder (one round trip for the lot), disk work in turn.
    const BATCH: usize = 64;

    /// On an event loop, a write's copies go to the copy senders and its reply leaves
    /// when they confirm, while the loop goes on serving (disk work runs at once).
    const IN_LOOP: bool = true;

    fn run(self, worker: &mut NodeWorker) -> Completion {
        let mut batch = vec![self];
        let mut completion = Completion::Release;
        Self::run_batch(&mut batch, worker, &mut |_, c| completion = c);
        completion
    }

    fn attach(worker: &mut NodeWorker, watch: Watch) {
        let pair = UnixStream::pair().and_then(|(tx, rx)| {
            tx.set_nonblocking(true)?;
            rx.set_nonblocking(true)?;
            watch.add(rx.as_raw_fd(), WAKE)?;
            Ok((tx, rx))
        });
        match pair {
            Ok((tx, rx)) => {
                // The copy streams' replies are read here too, as they arrive.
                worker
                    .node
                    .attach_copies(Box::new(move |fd, id| watch.add(fd, id)));
                let (confirms_tx, confirms) = mpsc::channel();
                worker.in_flight = Some(InFlight {
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
        worker: &mut NodeWorker,
        done: &mut dyn FnMut(usize, Completion),
    ) {
        let node = &worker.node;
        let Some(in_flight) = worker.in_flight.as_mut() else {
            let tickets: Vec<usize> = works.iter().map(|(t, _)| *t).collect();
            let mut batch: Vec<Self> = works.drain(..).map(|(_, w)| w).collect();
            Self::run_batch(&mut batch, worker, &mut |i, c| done(tickets[i], c));
            return;
        };
        // A durable write acknowledged before its copies: persisted first (one that fails
        // fails the write, uncopied), then as below.
        works.retain_mut(|(ticket, work)| {
            let NodeWork::Durable(persist, keys, true) = work else {
                return true;
            };
            match persist.complete_on(&worker.cache.store) {
                Completion::Release => {
                    *work = NodeWork::Behind(std::mem::take(keys));
                    true
                }
                failed => {
                    for key in keys.iter() {
                        node.unconfirmed().settle(key, true, None);
                    }
                    done(*ticket, failed);
                    false
                }
            }
        });
        // A write acknowledged before its copies: its reply leaves now, and its copies go
        // on under a ticket of their own.
        for (ticket, work) in works.iter_mut() {
            if matches!(work, NodeWork::Behind(_)) {
                done(*ticket, Completion::Release);
                *ticket = in_flight.next_behind;
                in_flight.next_behind += 1;
            }
        }
        let copies = copies_of(works, node, &worker.cache.store, done);
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
        worker: &mut NodeWorker,
        id: usize,
        _readable: bool,
        _writable: bool,
        done: &mut dyn FnMut(usize, Completion),
    ) {
        let node = &worker.node;
        let Some(in_flight) = worker.in_flight.as_mut() else {
            return;
        };
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

    /// Copies held to go out together ([`crate::copies::COPY_LINGER`]) leave when due.
    fn tick(worker: &mut NodeWorker, now: Instant, _done: &mut dyn FnMut(usize, Completion)) {
        if worker.in_flight.is_some() {
            worker.node.release_held_copies(now);
        }
    }

    fn deadline(worker: &NodeWorker) -> Option<Instant> {
        worker.in_flight.as_ref()?;
        worker.node.held_copies_due()
    }

    fn run_batch(
        works: &mut Vec<Self>,
        worker: &mut NodeWorker,
        done: &mut dyn FnMut(usize, Completion),
    ) {
        let mut indexed: Vec<(usize, NodeWork)> = works.drain(..).enumerate().collect();
        let node = &worker.node;
        let copies = copies_of(&mut indexed, node, &worker.cache.store, done);
        if copies.is_empty() {
            return;
        }
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
