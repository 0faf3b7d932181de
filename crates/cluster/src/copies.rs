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

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use kvlab_store::Store;
use parking_lot::{Condvar, Mutex};

use crate::pipe::{encode_delete, encode_store, is_refusal, memchr_nl, Pipe};

/// How long a write's copy may take to be confirmed by its holder before the write fails
/// (`SERVER_ERROR`).
pub const REPLICA_TIMEOUT: Duration = Duration::from_millis(1000);

/// How long a copy holder that failed is not tried again (its writes fail at once).
pub const REPLICA_BACKOFF: Duration = Duration::from_millis(500);

/// Tickets from this one up are writes already acknowledged (write policy `owner`): their
/// copies need not go out at once. A batch of only such tickets is held in its link's
/// queue for up to [`COPY_LINGER`] (or until [`HOLD_BYTES`] are queued, or a batch a reply
/// waits for goes out), and goes with every batch queued behind it — one message for many
/// writes.
pub const BEHIND: usize = 1 << 48;

/// How long the copies of acknowledged writes ([`BEHIND`]) may be held to go out together.
/// A write acknowledged less than this (plus a round trip) before its owner dies may be
/// lost; a read of such a key sends its state at once and waits for it to be confirmed.
pub const COPY_LINGER: Duration = Duration::from_millis(1);

/// Held copies go out once this many bytes are queued on their link.
pub const HOLD_BYTES: usize = 32 * 1024;

/// One ticket's outcome at one holder: `None` when the holder confirmed every key of the
/// ticket, else why not (`copy to NODE not written: …`).
#[derive(Debug)]
pub struct Confirm {
    /// The ticket the batch was queued with.
    pub ticket: usize,
    /// Why the copy is not there, if it is not.
    pub failure: Option<Arc<str>>,
    /// When (on the node's copy clock) the batch's keys were read from the store to be
    /// sent, or the failure was seen.
    pub seq: u64,
}

/// A ticket's outcome over all its holders, gathered from their [`Confirm`]s.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Confirmations still owed.
    pub left: u32,
    /// The first failure, if any.
    pub failure: Option<String>,
    /// Success: the earliest copy clock at which a holder's copy was read (every holder
    /// has the keys' state of at least then). Failure: the latest failure's.
    pub seq: u64,
}

impl Outcome {
    /// A ticket sent to `holders` holders, with `failure` already known (a holder backing
    /// off) at copy clock `seq`.
    pub fn new(holders: u32, failure: Option<String>, seq: u64) -> Outcome {
        Outcome {
            left: holders,
            seq: if failure.is_some() { seq } else { u64::MAX },
            failure,
        }
    }

    /// Takes one holder's confirmation; true once none is owed.
    pub fn add(&mut self, c: Confirm) -> bool {
        match (c.failure, &self.failure) {
            (Some(why), None) => {
                self.failure = Some(why.to_string());
                self.seq = c.seq;
            }
            (Some(_), Some(_)) => self.seq = self.seq.max(c.seq),
            (None, None) => self.seq = self.seq.min(c.seq),
            (None, Some(_)) => {}
        }
        self.left = self.left.saturating_sub(1);
        self.left == 0
    }
}

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

/// Where a batch's confirmations go: a channel, and (for an event loop) a socket whose
/// other end the loop watches, written one byte to wake it.
#[derive(Clone)]
pub struct Reply {
    tx: mpsc::Sender<Confirm>,
    wake: Option<Arc<UnixStream>>,
}

impl Reply {
    /// Confirmations to `tx`; `wake`, if any, is written a byte after each batch's.
    pub fn new(tx: mpsc::Sender<Confirm>, wake: Option<Arc<UnixStream>>) -> Reply {
        Reply { tx, wake }
    }

    /// Whether `self` and `other` answer to the same place.
    pub fn same(&self, other: &Reply) -> bool {
        match (&self.wake, &other.wake) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    fn send(&self, tickets: &[usize], failure: Option<Arc<str>>, seq: u64) {
        self.send_quietly(tickets, failure, seq);
        if let Some(wake) = &self.wake {
            // A full socket already holds a wake-up the loop has not read yet.
            let _ = (&**wake).write(&[1]);
        }
    }

    /// [`Reply::send`] without the wake-up (the loop reads its confirmations next).
    fn send_quietly(&self, tickets: &[usize], failure: Option<Arc<str>>, seq: u64) {
        for &ticket in tickets {
            let _ = self.tx.send(Confirm {
                ticket,
                failure: failure.clone(),
                seq,
            });
        }
    }
}

/// The keys of some writes to be copied to one holder, and the tickets of those writes.
pub struct Batch {
    /// The keys (their state is read from the store when the batch is sent).
    pub keys: Vec<Vec<u8>>,
    /// The writes' tickets, each once.
    pub tickets: Vec<usize>,
    /// Where the outcome goes.
    pub reply: Reply,
    /// Every ticket is [`BEHIND`]: the batch may be held ([`COPY_LINGER`]).
    pub behind: bool,
}

/// Registers a socket in an event loop's epoll under an id; the loop then calls
/// [`Copies::ready`] with that id when the socket is ready.
pub type Register = Box<dyn Fn(RawFd, usize) -> std::io::Result<()> + Send + Sync>;

/// Answers owed to batches' replies: (reply, tickets, failure, copy clock).
type Answers = Vec<(Reply, Vec<usize>, Option<Arc<str>>, u64)>;

/// What a node's links share.
struct LinkCommon {
    me: String,
    store: Arc<Store>,
    /// Holders that failed lately: when, and why.
    down: Mutex<HashMap<String, (Instant, String)>>,
    /// Holder failures (each failure of a stream with copies in flight, or a refusal).
    errors: AtomicU64,
    /// The copy clock: ticks each time keys are read to be sent, or a failure is seen.
    clock: AtomicU64,
    /// The event loops that offered to read links' replies.
    loops: Mutex<Vec<Arc<Register>>>,
    /// Links holding copies of acknowledged writes ([`COPY_LINGER`]).
    held: AtomicUsize,
    /// Connected links by the id their socket is watched as (never reused; 0 is none).
    by_id: Mutex<HashMap<usize, Arc<Link>>>,
    next_id: AtomicUsize,
}

impl LinkCommon {
    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::SeqCst)
    }

    fn backing_off(&self, holder: &str) -> Option<(String, Duration)> {
        let down = self.down.lock();
        let (since, why) = down.get(holder)?;
        let left = REPLICA_BACKOFF.checked_sub(since.elapsed())?;
        Some((why.clone(), left))
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

/// Hands each answered batch its confirmations.
fn answer(answers: Answers) {
    for (reply, tickets, failure, seq) in answers {
        reply.send(&tickets, failure, seq);
    }
}

/// One holder's link: a `cluster import 0` stream that any thread writes copies to (under
/// the link's lock, reading each key's state as it writes it, so the stream carries a
/// key's states in the order they were read), and whose replies an event loop reads (or,
/// with no loop, the link's own thread). The link's thread connects it, times it out and
/// stops it.
struct Link {
    holder: String,
    state: Mutex<LinkState>,
    /// Wakes the link's thread (a batch waits for the stream to open; the link stops).
    wake: Condvar,
}

#[derive(Default)]
struct LinkState {
    /// The open stream (non-blocking).
    stream: Option<TcpStream>,
    /// The id the stream is watched as (0: none yet, or not by a loop).
    id: usize,
    /// A loop reads the stream's replies.
    watched: bool,
    /// Bytes the socket has not taken yet.
    out: Vec<u8>,
    /// Since when `out` holds copies of acknowledged writes on purpose ([`COPY_LINGER`]);
    /// `None`: whatever `out` holds waits only for the socket.
    held_since: Option<Instant>,
    /// Replies not read to their end yet.
    inb: Vec<u8>,
    /// Batches written, in order, with their replies owed.
    sent: VecDeque<Sent>,
    stopped: bool,
}

/// A batch written to a stream.
struct Sent {
    /// Replies still owed (one per key written).
    lines: usize,
    /// Refusals among those read.
    refused: u64,
    tickets: Vec<usize>,
    reply: Reply,
    /// When its keys were read.
    seq: u64,
    at: Instant,
}

impl LinkState {
    /// Writes what the socket takes of the queued bytes.
    fn flush(&mut self) -> Result<(), String> {
        let Some(stream) = &self.stream else {
            return Ok(());
        };
        let mut done = 0;
        while done < self.out.len() {
            match (&*stream).write(&self.out[done..]) {
                Ok(0) => return Err("the holder closed the stream".into()),
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("stream: {e}")),
            }
        }
        self.out.drain(..done);
        Ok(())
    }

    /// Starts holding `out` (it was empty, or holds already).
    fn hold(&mut self, sh: &LinkCommon) {
        if self.held_since.is_none() {
            self.held_since = Some(Instant::now());
            sh.held.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// When what `out` holds on purpose must go out, if it holds any.
    fn due(&self) -> Option<Instant> {
        self.held_since.map(|since| since + COPY_LINGER)
    }

    /// `out` holds nothing on purpose any more (flushed, or cleared).
    fn unhold(&mut self, sh: &LinkCommon) {
        if self.held_since.take().is_some() {
            sh.held.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Reads every reply the socket holds and answers the batches they complete.
    fn read(&mut self, sh: &LinkCommon, holder: &str, answers: &mut Answers) -> Result<(), String> {
        let Some(stream) = &self.stream else {
            return Ok(());
        };
        let mut chunk = [0u8; 16 * 1024];
        loop {
            match (&*stream).read(&mut chunk) {
                Ok(0) => return Err("the holder closed the stream".into()),
                Ok(n) => {
                    self.inb.extend_from_slice(&chunk[..n]);
                    if n < chunk.len() {
                        // Nothing more for now (what comes later is a new edge): no read
                        // just to hear WouldBlock.
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("stream: {e}")),
            }
        }
        let mut at = 0;
        while let Some(nl) = memchr_nl(&self.inb[at..]) {
            let line = &self.inb[at..at + nl];
            at += nl + 1;
            let Some(front) = self.sent.front_mut() else {
                return Err("a reply to nothing sent".into());
            };
            if is_refusal(line) {
                front.refused += 1;
                tracing::warn!(
                    "copy to {holder}: {}",
                    String::from_utf8_lossy(line).trim_end()
                );
            }
            front.lines -= 1;
            if front.lines > 0 {
                continue;
            }
            let Some(s) = self.sent.pop_front() else {
                break;
            };
            if s.refused == 0 {
                answers.push((s.reply, s.tickets, None, s.seq));
            } else {
                // The holder took the stream but refused items (out of memory, or a view
                // that no longer makes it a holder): those copies are not there.
                sh.errors.fetch_add(1, Ordering::Relaxed);
                let why = format!("copy to {holder} not written: {} copies refused", s.refused);
                answers.push((s.reply, s.tickets, Some(why.into()), sh.tick()));
            }
        }
        self.inb.drain(..at);
        Ok(())
    }
}

impl Link {
    fn stop(&self) {
        self.state.lock().stopped = true;
        self.wake.notify_one();
    }

    /// Writes `batch`'s keys, each as the store holds it now, to the stream (or queues
    /// them for the stream being opened).
    fn send(&self, sh: &LinkCommon, batch: Batch, answers: &mut Answers) {
        let mut st = self.state.lock();
        let refused = if st.stopped {
            Some("it left the ring".to_string())
        } else if st.stream.is_none() {
            sh.backing_off(&self.holder).map(|(why, _)| why)
        } else {
            None
        };
        if let Some(why) = refused {
            answers.push((
                batch.reply,
                batch.tickets,
                Some(self.not_written(&why)),
                sh.tick(),
            ));
            return;
        }
        let seq = sh.tick();
        let mut lines = 0;
        let start = st.out.len();
        for key in &batch.keys {
            // A durable node's key evicted since its write is read from the write-behind
            // queue or, rarely (committed meanwhile), from disk: absent from memory is not
            // deleted.
            match sh.store.peek_through(key) {
                Ok(Some(i)) => {
                    lines +=
                        encode_store(&mut st.out, b"set ", key, i.flags(), i.exptime(), i.value())
                            as usize;
                }
                Ok(None) => {
                    encode_delete(&mut st.out, key);
                    lines += 1;
                }
                Err(e) => {
                    st.out.truncate(start);
                    let why = self.not_written(&format!("reading the data directory: {e}"));
                    answers.push((batch.reply, batch.tickets, Some(why), seq));
                    return;
                }
            }
        }
        if lines == 0 {
            answers.push((batch.reply, batch.tickets, None, seq));
            return;
        }
        // An acknowledged write's copies are held in `out` for more to join them
        // ([`COPY_LINGER`]): the loops watching the stream send them when they are due.
        // Bytes left over from a full socket are not held: they go when it is writable.
        let hold = batch.behind
            && st.watched
            && (st.held_since.is_some() || start == 0)
            && st.out.len() < HOLD_BYTES;
        st.sent.push_back(Sent {
            lines,
            refused: 0,
            tickets: batch.tickets,
            reply: batch.reply,
            seq,
            at: Instant::now(),
        });
        if st.stream.is_none() {
            drop(st);
            self.wake.notify_one();
            return;
        }
        if hold {
            st.hold(sh);
        } else {
            self.release(sh, &mut st, answers);
        }
    }

    /// Sends what `st` holds (and whatever else is queued); a failure fails the stream.
    fn release(&self, sh: &LinkCommon, st: &mut LinkState, answers: &mut Answers) {
        st.unhold(sh);
        if let Err(why) = st.flush() {
            self.failed(sh, st, &why, answers);
        }
    }

    /// The stream watched as `id` is ready.
    fn serve(&self, sh: &LinkCommon, id: usize, answers: &mut Answers) {
        let mut st = self.state.lock();
        if st.id != id || st.stream.is_none() {
            return;
        }
        // Held copies wait for their time ([`Copies::release_held`]), not for readiness.
        let flushed = match st.held_since {
            Some(_) => Ok(()),
            None => st.flush(),
        };
        let served = flushed.and_then(|_| st.read(sh, &self.holder, answers));
        if let Err(why) = served {
            self.failed(sh, &mut st, &why, answers);
        }
    }

    /// The stream failed: it closes, its batches fail, and the holder is not tried again
    /// for [`REPLICA_BACKOFF`].
    fn failed(&self, sh: &LinkCommon, st: &mut LinkState, why: &str, answers: &mut Answers) {
        st.unhold(sh);
        st.stream = None;
        if st.id != 0 {
            sh.by_id.lock().remove(&st.id);
        }
        st.id = 0;
        st.watched = false;
        st.out.clear();
        st.inb.clear();
        if !st.sent.is_empty() {
            tracing::warn!("copy to {}: {why}", self.holder);
            sh.errors.fetch_add(1, Ordering::Relaxed);
        }
        sh.down
            .lock()
            .insert(self.holder.clone(), (Instant::now(), why.to_string()));
        self.fail_sent(sh, st, why, answers);
        self.wake.notify_one();
    }

    /// A copy's failure as its write's reply says it.
    fn not_written(&self, why: &str) -> Arc<str> {
        format!("copy to {} not written: {why}", self.holder).into()
    }

    /// Every batch written to the stream fails, for `why`.
    fn fail_sent(&self, sh: &LinkCommon, st: &mut LinkState, why: &str, answers: &mut Answers) {
        let why = self.not_written(why);
        let seq = sh.tick();
        for s in st.sent.drain(..) {
            answers.push((s.reply, s.tickets, Some(why.clone()), seq));
        }
    }

    /// The link's thread: opens the stream (ahead of any write, and again after a failure
    /// once the back-off is over), fails it when its oldest batch waits longer than
    /// [`REPLICA_TIMEOUT`], reads its replies while no loop does, and closes it when the
    /// link stops.
    fn run(self: Arc<Link>, sh: &LinkCommon) {
        loop {
            let mut answers = Vec::new();
            let mut st = self.state.lock();
            if st.stopped {
                self.failed(sh, &mut st, "it left the ring", &mut answers);
                sh.down.lock().remove(&self.holder);
                drop(st);
                answer(answers);
                return;
            }
            if st.stream.is_some() {
                let late = st
                    .sent
                    .front()
                    .is_some_and(|s| s.at.elapsed() > REPLICA_TIMEOUT);
                if late {
                    let why = "no reply in time (the node is paused, overloaded or cut off)";
                    self.failed(sh, &mut st, why, &mut answers);
                } else if !st.watched && !self.watch(sh, &mut st) {
                    // No loop reads it: this thread does, polling.
                    let fd = st.stream.as_ref().map_or(-1, |s| s.as_raw_fd());
                    let id = st.id;
                    let out = !st.out.is_empty();
                    drop(st);
                    poll(fd, out, Duration::from_millis(100));
                    self.serve(sh, id, &mut answers);
                    answer(answers);
                    continue;
                } else {
                    self.wake.wait_for(&mut st, Duration::from_millis(100));
                }
                drop(st);
                answer(answers);
                continue;
            }
            if let Some((why, left)) = sh.backing_off(&self.holder) {
                // Queued as the stream failed: they fail too (the back-off is not renewed).
                st.out.clear();
                self.fail_sent(sh, &mut st, &why, &mut answers);
                drop(st);
                answer(answers);
                std::thread::sleep(left.min(REPLICA_BACKOFF / 5));
                continue;
            }
            let waiting = !st.sent.is_empty();
            drop(st);
            let opened = open(&self.holder, &sh.me);
            let mut st = self.state.lock();
            match opened {
                Ok(stream) => {
                    st.id = sh.next_id.fetch_add(1, Ordering::Relaxed);
                    st.stream = Some(stream);
                    sh.by_id.lock().insert(st.id, self.clone());
                    self.watch(sh, &mut st);
                    if let Err(why) = st.flush() {
                        self.failed(sh, &mut st, &why, &mut answers);
                    }
                }
                Err(why) if !waiting && st.sent.is_empty() => {
                    // Opening ahead of any write (the holder may not be up yet): no write
                    // waits for it, so nothing backs off; try again shortly.
                    tracing::debug!("copy stream to {}: {why}", self.holder);
                    if !st.stopped {
                        self.wake.wait_for(&mut st, REPLICA_BACKOFF / 5);
                    }
                }
                Err(why) => self.failed(sh, &mut st, &why, &mut answers),
            }
            drop(st);
            answer(answers);
        }
    }

    /// Gives the open stream to an event loop to read, if one offered: whether one took it.
    fn watch(&self, sh: &LinkCommon, st: &mut LinkState) -> bool {
        let Some(fd) = st.stream.as_ref().map(|s| s.as_raw_fd()) else {
            return false;
        };
        let register = {
            let loops = sh.loops.lock();
            if loops.is_empty() {
                return false;
            }
            let h = kvlab_ring::key_hash(self.holder.as_bytes()) as usize;
            loops[h % loops.len()].clone()
        };
        match register(fd, st.id) {
            Ok(()) => st.watched = true,
            Err(e) => tracing::warn!("cannot watch the copy stream to {}: {e}", self.holder),
        }
        st.watched
    }
}

/// Opens a copy stream to `holder` and waits for its `cluster import 0` to be taken: the
/// stream, non-blocking.
fn open(holder: &str, me: &str) -> Result<TcpStream, String> {
    let mut pipe = Pipe::connect(holder, REPLICA_TIMEOUT)
        .and_then(|p| p.import(0, me))
        .map_err(reason)?;
    match pipe.flush().map_err(reason)? {
        0 => {}
        _ => return Err("it refused the copy stream (not a node of this cluster?)".into()),
    }
    let stream = pipe.into_stream();
    stream
        .set_nonblocking(true)
        .map_err(|e| format!("stream: {e}"))?;
    Ok(stream)
}

/// Waits at most `d` for `fd` to be readable (or writable, with `out`).
fn poll(fd: RawFd, out: bool, d: Duration) {
    let mut events = libc::POLLIN;
    if out {
        events |= libc::POLLOUT;
    }
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the call's duration; a stale fd only makes it return.
    unsafe { libc::poll(&mut p, 1, d.as_millis() as libc::c_int) };
}

/// A stream's failure as a copy's reason (the stream's errors speak of migrations).
fn reason(e: crate::ClusterError) -> String {
    match e {
        crate::ClusterError::Migration(why) => why,
        e => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
