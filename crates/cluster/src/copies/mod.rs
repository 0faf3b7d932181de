//! A cluster node's write-through copies (`replicas` > 1): one link per copy holder, each
//! a `cluster import 0` stream to that holder.
//!
//! ```text
//!  worker loop: a round's writes ──► per holder: Batch(keys, tickets) ──► Link::send:
//!     under the link's lock, read each key's state from the store, append it to the
//!     stream, write what the socket takes (no thread in between); under write policy
//!     `owner` the copies of acknowledged writes are held instead, and a loop's tick
//!     writes them when due (COPY_LINGER) unless a copy a reply waits for went first
//!  holder: its worker loop serves the stream like a client's connection (one reply a key)
//!  event loop watching the stream (the link's home loop): reads the replies ──►
//!     Confirm(ticket, failure?) per ticket ──► the batch's Reply (its loop's channel; a
//!     wake byte in that loop's epoll unless it is the loop reading)
//!  link thread: opens the stream (again after a failure), fails it when a reply is late,
//!     reads the replies itself while no loop watches the stream
//! ```
//!
//! A worker never waits on a holder: its loop goes on serving while the copies are in
//! flight, and each write's reply leaves when its last holder confirmed. Every copy to one
//! holder goes down that holder's one stream, written under the link's lock, and each
//! carries the key's state *at the time it is written* (read from the store then, not when
//! the write was applied): whichever copy of a key reaches a holder last carries a state at
//! least as new as every write confirmed before it, so two workers writing the same key
//! cannot leave a holder with the older value.
//!
//! Until its copies are confirmed, a write is *unconfirmed* ([`Unconfirmed`]): a read of the
//! key then sends the key's state to the holders again and its reply waits for their
//! confirmation (or fails, `SERVER_ERROR copy … not written`, if they do not confirm). A
//! value a read returns is thus always on every holder: if the owner dies, the holder that
//! takes over serves it or a newer one — never a value seen and then undone. A write whose
//! copy failed leaves its key unconfirmed until a later copy of it succeeds (a later write,
//! or such a read).
//!
//! A holder that fails (no reply within [`REPLICA_TIMEOUT`], a refused connection, a
//! closed stream) is not tried again for [`REPLICA_BACKOFF`]: meanwhile writes that need it
//! fail at once instead of each waiting out a timeout.
//!
//! This file holds the node's [`Copies`] and its [`Unconfirmed`] keys; `batch` what a
//! batch, its reply and its outcome are; `link` one holder's link and its stream.

mod batch;
mod link;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use kvlab_store::Store;
use parking_lot::{Condvar, Mutex};

use batch::answer;
pub use batch::{
    Batch, Confirm, Outcome, Register, Reply, BEHIND, COPY_LINGER, HOLD_BYTES, REPLICA_BACKOFF,
    REPLICA_TIMEOUT,
};
use link::{Link, LinkCommon, LinkState};

/// Keys whose state may not be on every copy holder: written, with copies not yet
/// confirmed, or whose last copy failed.
pub struct Unconfirmed {
    shards: Vec<Mutex<HashMap<Vec<u8>, Pending>>>,
    /// Keys listed (the fast path of [`Unconfirmed::contains`]).
    len: AtomicUsize,
}

#[derive(Default)]
struct Pending {
    /// Writes applied whose copies are not yet answered.
    writes: u32,
    /// The copy clock of the latest failed copy (0: none since the last success).
    failed_at: u64,
}

impl Default for Unconfirmed {
    fn default() -> Self {
        Unconfirmed {
            shards: (0..16).map(|_| Mutex::new(HashMap::new())).collect(),
            len: AtomicUsize::new(0),
        }
    }
}

impl Unconfirmed {
    fn shard(&self, key: &[u8]) -> &Mutex<HashMap<Vec<u8>, Pending>> {
        let h = kvlab_ring::key_hash(key) as usize;
        &self.shards[h % self.shards.len()]
    }

    /// A write of `key` is about to be applied (before it is: no read may see it as
    /// confirmed in between).
    pub fn write_begins(&self, key: &[u8]) {
        let mut shard = self.shard(key).lock();
        match shard.get_mut(key) {
            Some(p) => p.writes += 1,
            None => {
                shard.insert(
                    key.to_vec(),
                    Pending {
                        writes: 1,
                        failed_at: 0,
                    },
                );
                self.len.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Whether `key`'s state may not be on every holder.
    pub fn contains(&self, key: &[u8]) -> bool {
        self.len.load(Ordering::Relaxed) > 0 && self.shard(key).lock().contains_key(key)
    }

    /// The copies of `key` sent for a write (`write`) or a read are answered with
    /// `outcome` (or, with `outcome` `None`, the write was not sent after all).
    pub fn settle(&self, key: &[u8], write: bool, outcome: Option<&Outcome>) {
        let mut shard = self.shard(key).lock();
        let Some(p) = shard.get_mut(key) else {
            if let Some(o) = outcome.filter(|o| o.failure.is_some()) {
                // A read's copy of a key confirmed meanwhile failed: the holders may have
                // missed the state it carried.
                shard.insert(
                    key.to_vec(),
                    Pending {
                        writes: 0,
                        failed_at: o.seq.max(1),
                    },
                );
                self.len.fetch_add(1, Ordering::Relaxed);
            }
            return;
        };
        if write {
            p.writes = p.writes.saturating_sub(1);
        }
        match outcome {
            Some(o) if o.failure.is_some() => p.failed_at = p.failed_at.max(o.seq.max(1)),
            // Every holder has the key's state as of `o.seq`, read after the failure.
            Some(o) if o.seq > p.failed_at => p.failed_at = 0,
            _ => {}
        }
        if p.writes == 0 && p.failed_at == 0 {
            shard.remove(key);
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// The copy links of a node, one per holder.
pub struct Copies {
    shared: Arc<LinkCommon>,
    links: Mutex<HashMap<String, Arc<Link>>>,
    /// Keys whose copies are not all confirmed.
    pub unconfirmed: Unconfirmed,
}

impl Copies {
    /// No links yet; `me` is the node's name as its holders know it.
    pub fn new(me: String, store: Arc<Store>) -> Copies {
        Copies {
            shared: Arc::new(LinkCommon {
                me,
                store,
                down: Mutex::new(HashMap::new()),
                errors: AtomicU64::new(0),
                clock: AtomicU64::new(1),
                loops: Mutex::new(Vec::new()),
                held: AtomicUsize::new(0),
                by_id: Mutex::new(HashMap::new()),
                next_id: AtomicUsize::new(1),
            }),
            links: Mutex::new(HashMap::new()),
            unconfirmed: Unconfirmed::default(),
        }
    }

    /// The copy clock's next tick.
    pub fn tick(&self) -> u64 {
        self.shared.tick()
    }

    /// How many times a holder failed a batch of copies.
    pub fn errors(&self) -> u64 {
        self.shared.errors.load(Ordering::Relaxed)
    }

    /// Why `holder` is not tried now (it failed less than [`REPLICA_BACKOFF`] ago).
    pub fn down(&self, holder: &str) -> Option<String> {
        self.shared.backing_off(holder).map(|(why, _)| why)
    }

    /// An event loop offers to read links' replies: links connected from now on may be
    /// watched by it through `register`, and it calls [`Copies::ready`] for their ids (ids
    /// are never 0).
    pub fn attach(&self, register: Register) {
        self.shared.loops.lock().push(Arc::new(register));
    }

    /// When held copies ([`COPY_LINGER`]) must go out, if any link holds some: an event
    /// loop waits no longer, and then calls [`Copies::release_held`].
    pub fn held_deadline(&self) -> Option<Instant> {
        if self.shared.held.load(Ordering::Relaxed) == 0 {
            return None;
        }
        // Lock order: the links' map, then a link's state (as `follow` and `stop` take them).
        let links = self.links.lock();
        links.values().filter_map(|l| l.state.lock().due()).min()
    }

    /// Sends the copies held since [`COPY_LINGER`] before `now` or longer.
    pub fn release_held(&self, now: Instant) {
        if self.shared.held.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut answers = Vec::new();
        for link in self.links.lock().values() {
            let mut st = link.state.lock();
            if st.due().is_some_and(|due| now >= due) {
                link.release(&self.shared, &mut st, &mut answers);
            }
        }
        // Failures are answered with no lock held (a reply's channel may wake a loop).
        answer(answers);
    }

    /// The link watched as `id` is ready: its queued copies go out and its replies are
    /// read; the batches answered get their confirmations — those that answer to `local`
    /// (the calling loop's, which reads them next) without a wake-up.
    pub fn ready(&self, id: usize, local: &Reply) {
        let link = self.shared.by_id.lock().get(&id).cloned();
        if let Some(link) = link {
            let mut answers = Vec::new();
            link.serve(&self.shared, id, &mut answers);
            for (reply, tickets, failure, seq) in answers {
                if reply.same(local) {
                    reply.send_quietly(&tickets, failure, seq);
                } else {
                    reply.send(&tickets, failure, seq);
                }
            }
        }
    }

    /// Sends `batch` to `holder`: each key's state is read from the store and written to
    /// the holder's stream now (it is opened if it is not); the batch is answered when the
    /// holder has answered every key, or the stream failed.
    pub fn send(&self, holder: &str, batch: Batch) {
        let link = self.link(holder);
        let mut answers = Vec::new();
        link.send(&self.shared, batch, &mut answers);
        answer(answers);
    }

    /// Opens a link (which connects at once) to every node of `ring` but this one that has
    /// none, and stops those to nodes no longer in it.
    pub fn follow(&self, ring: &[String]) {
        for node in ring {
            if *node != self.shared.me {
                self.link(node);
            }
        }
        let mut links = self.links.lock();
        links.retain(|holder, link| {
            let keep = ring.contains(holder);
            if !keep {
                link.stop();
            }
            keep
        });
    }

    /// Stops every link (the node is shutting down).
    pub fn stop(&self) {
        for (_, link) in self.links.lock().drain() {
            link.stop();
        }
    }

    fn link(&self, holder: &str) -> Arc<Link> {
        let mut links = self.links.lock();
        if let Some(l) = links.get(holder) {
            return l.clone();
        }
        let link = Arc::new(Link {
            holder: holder.to_string(),
            state: Mutex::new(LinkState::default()),
            wake: Condvar::new(),
        });
        let (l, shared) = (link.clone(), self.shared.clone());
        let spawned = std::thread::Builder::new()
            .name("kvlab-copies".into())
            .spawn(move || l.run(&shared));
        if let Err(e) = spawned {
            // Without its thread the link would never connect: its batches fail at once.
            tracing::error!("cannot start the copy link to {holder}: {e}");
            link.state.lock().stopped = true;
        }
        links.insert(holder.to_string(), link.clone());
        link
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::TcpStream;
    use std::sync::mpsc;
    use std::time::Duration;

    fn ok(ticket: usize, seq: u64) -> Confirm {
        Confirm {
            ticket,
            failure: None,
            seq,
        }
    }

    fn failed(ticket: usize, seq: u64) -> Confirm {
        Confirm {
            ticket,
            failure: Some("copy to h not written: down".into()),
            seq,
        }
    }

    /// Copies with a link to a stand-in holder (a listener that only reads), watched as by
    /// an event loop: the copies, the link, and the holder's end of the stream.
    fn watched_link() -> (Copies, Arc<Link>, TcpStream) {
        use kvlab_store::{SetMode, SetRequest, StoreConfig, SystemClock};
        let store = Arc::new(Store::new(StoreConfig::default(), Arc::new(SystemClock)));
        for key in ["a", "b"] {
            store.set(&SetRequest::new(SetMode::Set, key.as_bytes(), b"v"));
        }
        let copies = Copies::new("me".into(), store);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        stream.set_nonblocking(true).unwrap();
        let (holder, _) = listener.accept().unwrap();
        let link = Arc::new(Link {
            holder: "h".into(),
            state: Mutex::new(LinkState {
                stream: Some(stream),
                id: 1,
                watched: true,
                ..LinkState::default()
            }),
            wake: Condvar::new(),
        });
        copies.links.lock().insert("h".into(), link.clone());
        (copies, link, holder)
    }

    fn batch(key: &str, ticket: usize) -> Batch {
        let (tx, _) = mpsc::channel();
        Batch {
            keys: vec![key.as_bytes().to_vec()],
            tickets: vec![ticket],
            reply: Reply::new(tx, None),
            behind: ticket >= BEHIND,
        }
    }

    /// Bytes queued on the link and not yet written to its socket.
    fn queued(link: &Link) -> usize {
        link.state.lock().out.len()
    }

    /// Reads what the holder is sent until it has `want` bytes (bounded: 5 s).
    fn receive(holder: &mut TcpStream, want: usize) -> String {
        holder.set_nonblocking(false).unwrap();
        holder
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut got = vec![0u8; want];
        holder.read_exact(&mut got).unwrap();
        String::from_utf8(got).unwrap()
    }

    const TWO_COPIES: &str = "set a 0 0 1\r\nv\r\nset b 0 0 1\r\nv\r\n";

    /// An acknowledged write's copy (write policy `owner`) is held on an idle link until
    /// it is due, and then goes with every copy queued behind it, in one write.
    #[test]
    fn an_acknowledged_writes_copy_is_held_until_due() {
        let (copies, link, mut holder) = watched_link();
        let mut answers = Vec::new();
        link.send(&copies.shared, batch("a", BEHIND), &mut answers);
        link.send(&copies.shared, batch("b", BEHIND + 1), &mut answers);
        assert!(answers.is_empty());
        assert_eq!(queued(&link), TWO_COPIES.len(), "held, not written");
        let due = copies
            .held_deadline()
            .expect("a deadline while copies are held");
        copies.release_held(due - Duration::from_micros(1));
        assert_eq!(queued(&link), TWO_COPIES.len(), "not due yet");
        copies.release_held(due);
        assert_eq!(queued(&link), 0, "written once due");
        assert_eq!(receive(&mut holder, TWO_COPIES.len()), TWO_COPIES);
        assert_eq!(copies.held_deadline(), None, "nothing held any more");
    }

    /// A copy a reply waits for (write policy `all`, or a read of an unconfirmed key) goes
    /// at once, and takes the held copies ahead of it along, in write order.
    #[test]
    fn a_copy_a_reply_waits_for_takes_the_held_ones_along() {
        let (copies, link, mut holder) = watched_link();
        let mut answers = Vec::new();
        link.send(&copies.shared, batch("a", BEHIND), &mut answers);
        assert!(queued(&link) > 0, "held, not written");
        link.send(&copies.shared, batch("b", 7), &mut answers);
        assert_eq!(queued(&link), 0);
        assert_eq!(receive(&mut holder, TWO_COPIES.len()), TWO_COPIES);
        assert_eq!(copies.held_deadline(), None);
    }

    /// A write's key stays unconfirmed until its copies are answered; a failed copy keeps
    /// it so until a copy read after the failure succeeds — an older success does not.
    #[test]
    fn a_key_is_confirmed_only_by_a_copy_read_after_its_last_failure() {
        let u = Unconfirmed::default();
        u.write_begins(b"k");
        assert!(u.contains(b"k"));
        let mut w = Outcome::new(1, None, 0);
        assert!(w.add(failed(0, 10)));
        u.settle(b"k", true, Some(&w));
        assert!(u.contains(b"k"), "a failed copy confirms nothing");
        let mut older = Outcome::new(1, None, 0);
        assert!(older.add(ok(1, 9)));
        u.settle(b"k", false, Some(&older));
        assert!(u.contains(b"k"), "a copy read before the failure");
        let mut read = Outcome::new(1, None, 0);
        assert!(read.add(ok(2, 11)));
        u.settle(b"k", false, Some(&read));
        assert!(!u.contains(b"k"));
    }

    /// Two holders: the ticket is confirmed as of the earlier of their reads, and fails if
    /// either fails.
    #[test]
    fn an_outcome_over_two_holders() {
        let mut o = Outcome::new(2, None, 0);
        assert!(!o.add(ok(0, 7)));
        assert!(o.add(ok(0, 5)));
        assert_eq!((o.failure.is_none(), o.seq), (true, 5));
        let mut o = Outcome::new(2, None, 0);
        assert!(!o.add(ok(0, 7)));
        assert!(o.add(failed(0, 8)));
        assert_eq!((o.failure.is_some(), o.seq), (true, 8));
        // Two writes in flight: the key is confirmed once both are.
        let u = Unconfirmed::default();
        u.write_begins(b"k");
        u.write_begins(b"k");
        let mut a = Outcome::new(1, None, 0);
        a.add(ok(0, 3));
        u.settle(b"k", true, Some(&a));
        assert!(u.contains(b"k"));
        u.settle(b"k", true, Some(&a));
        assert!(!u.contains(b"k"));
    }
}
