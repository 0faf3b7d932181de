//! A cluster node's write-through copies (`replicas` > 1): one sender thread per copy
//! holder, each with its one `cluster import 0` stream to that holder.
//!
//! ```text
//!  worker loops: a round's writes ──► per holder: Batch(keys, tickets) ──► Sender queue
//!                                                                          │
//!  sender thread (one per holder): take every queued batch, read each key's current
//!  state from the store, write them in one go, read the holder's replies (one round
//!  trip for the lot) ──► Confirm(ticket, failure?) per ticket ──► the batch's Reply
//!                                                                  (channel + wake byte
//!                                                                   in the loop's epoll)
//! ```
//!
//! A worker never waits on a holder: its loop goes on serving while the copies are in
//! flight, and each write's reply leaves when its last holder confirmed. Copies of one
//! holder leave in the order their batches were queued, and each carries the key's state
//! *at the time it is sent* (read from the store then, not when the write was applied):
//! whichever copy of a key reaches a holder last carries a state at least as new as every
//! write confirmed before it, so two workers writing the same key cannot leave a holder
//! with the older value.
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
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use kvlab_store::Store;
use parking_lot::{Condvar, Mutex};

use crate::pipe::Pipe;

/// How long a write's copy may take to be confirmed by its holder before the write fails
/// (`SERVER_ERROR`).
pub const REPLICA_TIMEOUT: Duration = Duration::from_millis(1000);

/// How long a copy holder that failed is not tried again (its writes fail at once).
pub const REPLICA_BACKOFF: Duration = Duration::from_millis(500);

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
        let h = kvlab_client::cluster::key_hash(key) as usize;
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

    fn send(&self, tickets: &[usize], failure: Option<Arc<str>>, seq: u64) {
        for &ticket in tickets {
            let _ = self.tx.send(Confirm {
                ticket,
                failure: failure.clone(),
                seq,
            });
        }
        if let Some(wake) = &self.wake {
            // A full socket already holds a wake-up the loop has not read yet.
            let _ = (&**wake).write(&[1]);
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
}

#[derive(Default)]
struct Queue {
    batches: VecDeque<Batch>,
    stopped: bool,
}

/// One holder's sender: its queue and the thread that empties it.
struct Sender {
    holder: String,
    queue: Mutex<Queue>,
    ready: Condvar,
}

/// The copy senders of a node, one per holder.
pub struct Copies {
    me: String,
    store: Arc<Store>,
    senders: Mutex<HashMap<String, Arc<Sender>>>,
    /// Holders that failed lately: when, and why.
    down: Arc<Mutex<HashMap<String, (Instant, String)>>>,
    /// Holder failures (each failure of a batch).
    errors: Arc<AtomicU64>,
    /// The copy clock: ticks each time keys are read to be sent, or a failure is seen.
    clock: Arc<AtomicU64>,
    /// Keys whose copies are not all confirmed.
    pub unconfirmed: Unconfirmed,
}

impl Copies {
    /// No senders yet; `me` is the node's name as its holders know it.
    pub fn new(me: String, store: Arc<Store>) -> Copies {
        Copies {
            me,
            store,
            senders: Mutex::new(HashMap::new()),
            down: Arc::new(Mutex::new(HashMap::new())),
            errors: Arc::new(AtomicU64::new(0)),
            clock: Arc::new(AtomicU64::new(1)),
            unconfirmed: Unconfirmed::default(),
        }
    }

    /// The copy clock's next tick.
    pub fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::SeqCst)
    }

    /// How many times a holder failed a batch of copies.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// Why `holder` is not tried now (it failed less than [`REPLICA_BACKOFF`] ago).
    pub fn down(&self, holder: &str) -> Option<String> {
        let down = self.down.lock();
        let (since, why) = down.get(holder)?;
        (since.elapsed() < REPLICA_BACKOFF).then(|| why.clone())
    }

    /// Queues `batch` for `holder` (its sender starts, and connects, if it has none).
    pub fn send(&self, holder: &str, batch: Batch) {
        let sender = self.sender(holder);
        let mut q = sender.queue.lock();
        if q.stopped {
            drop(q);
            let why = format!("copy to {holder} not written: it left the ring");
            batch
                .reply
                .send(&batch.tickets, Some(why.into()), self.tick());
            return;
        }
        q.batches.push_back(batch);
        drop(q);
        sender.ready.notify_one();
    }

    /// Starts a sender (which opens its stream at once) for every node of `ring` but this
    /// one that has none, and stops those of nodes no longer in it.
    pub fn follow(&self, ring: &[String]) {
        for node in ring {
            if *node != self.me {
                self.sender(node);
            }
        }
        let mut senders = self.senders.lock();
        senders.retain(|holder, sender| {
            let keep = ring.contains(holder);
            if !keep {
                sender.stop();
            }
            keep
        });
    }

    /// Stops every sender (the node is shutting down).
    pub fn stop(&self) {
        for (_, sender) in self.senders.lock().drain() {
            sender.stop();
        }
    }

    fn sender(&self, holder: &str) -> Arc<Sender> {
        let mut senders = self.senders.lock();
        if let Some(s) = senders.get(holder) {
            return s.clone();
        }
        let sender = Arc::new(Sender {
            holder: holder.to_string(),
            queue: Mutex::new(Queue::default()),
            ready: Condvar::new(),
        });
        let run = Run {
            sender: sender.clone(),
            me: self.me.clone(),
            store: self.store.clone(),
            down: self.down.clone(),
            errors: self.errors.clone(),
            clock: self.clock.clone(),
        };
        let spawned = std::thread::Builder::new()
            .name("kvlab-copies".into())
            .spawn(move || run.run());
        if let Err(e) = spawned {
            // Without its thread nothing would ever answer the holder's batches.
            tracing::error!("cannot start the copy sender for {holder}: {e}");
            sender.queue.lock().stopped = true;
        }
        senders.insert(holder.to_string(), sender.clone());
        sender
    }
}

impl Sender {
    fn stop(&self) {
        self.queue.lock().stopped = true;
        self.ready.notify_one();
    }
}

/// A sender thread's state.
struct Run {
    sender: Arc<Sender>,
    me: String,
    store: Arc<Store>,
    down: Arc<Mutex<HashMap<String, (Instant, String)>>>,
    errors: Arc<AtomicU64>,
    clock: Arc<AtomicU64>,
}

impl Run {
    fn run(self) {
        let holder = self.sender.holder.clone();
        let mut pipe: Option<Pipe> = None;
        let mut batches: Vec<Batch> = Vec::new();
        loop {
            {
                let mut q = self.sender.queue.lock();
                while q.batches.is_empty() && !q.stopped && pipe.is_some() {
                    self.sender.ready.wait_for(&mut q, Duration::from_secs(1));
                }
                if q.stopped {
                    let why: Arc<str> = format!("copy to {holder} not written: it left the ring")
                        .as_str()
                        .into();
                    let seq = self.tick();
                    for b in q.batches.drain(..) {
                        b.reply.send(&b.tickets, Some(why.clone()), seq);
                    }
                    return;
                }
                batches.extend(q.batches.drain(..));
            }
            if let Some(why) = self.backing_off(&holder) {
                let why = format!("copy to {holder} not written: {why}");
                fail(&mut batches, why.into(), self.tick());
                if pipe.is_none() {
                    // Nothing to send and no stream: wait out the back-off, then connect.
                    self.sleep_unless_stopped(REPLICA_BACKOFF / 5);
                }
                continue;
            }
            if pipe.is_none() {
                match Pipe::connect(&holder, REPLICA_TIMEOUT)
                    .and_then(|p| p.import(0, &self.me))
                    .and_then(|mut p| p.flush().map(|_| p))
                {
                    Ok(p) => pipe = Some(p),
                    Err(e) if batches.is_empty() => {
                        // Opening ahead of any write (the holder may not be up yet): no
                        // write waits for it, so nothing backs off; try again shortly.
                        tracing::debug!("copy stream to {holder}: {e}");
                        self.sleep_unless_stopped(REPLICA_BACKOFF / 5);
                        continue;
                    }
                    Err(e) => {
                        self.failed(&holder, &reason(e), &mut batches);
                        continue;
                    }
                }
            }
            if batches.is_empty() {
                continue;
            }
            let Some(p) = pipe.as_mut() else { continue };
            let seq = self.tick();
            match self.write(p, &batches) {
                Ok(0) => {
                    for b in batches.drain(..) {
                        b.reply.send(&b.tickets, None, seq);
                    }
                }
                Ok(refused) => {
                    // The holder took the stream but refused items (out of memory, or a
                    // view that no longer makes it a holder): those copies are not there.
                    self.errors.fetch_add(1, Ordering::Relaxed);
                    let why = format!("copy to {holder} not written: {refused} copies refused");
                    fail(&mut batches, why.into(), self.tick());
                }
                Err(e) => {
                    pipe = None;
                    self.failed(&holder, &reason(e), &mut batches);
                }
            }
        }
    }

    /// Sends every key's current state, then reads the replies; how many were refusals.
    fn write(&self, pipe: &mut Pipe, batches: &[Batch]) -> Result<u64, crate::ClusterError> {
        for key in batches.iter().flat_map(|b| b.keys.iter()) {
            match self.store.peek(key) {
                Some(m) => pipe.set(key, m.item.flags, m.item.exptime, &m.item.value)?,
                None => pipe.delete(key)?,
            }
        }
        pipe.flush()
    }

    /// Waits `d`, or less if a batch is queued or the sender stopped meanwhile.
    fn sleep_unless_stopped(&self, d: Duration) {
        let mut q = self.sender.queue.lock();
        if q.batches.is_empty() && !q.stopped {
            self.sender.ready.wait_for(&mut q, d);
        }
    }

    fn backing_off(&self, holder: &str) -> Option<String> {
        let down = self.down.lock();
        let (since, why) = down.get(holder)?;
        (since.elapsed() < REPLICA_BACKOFF).then(|| why.clone())
    }

    fn failed(&self, holder: &str, why: &str, batches: &mut Vec<Batch>) {
        if !batches.is_empty() {
            tracing::warn!("copy to {holder}: {why}");
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        self.down
            .lock()
            .insert(holder.to_string(), (Instant::now(), why.to_string()));
        let why = format!("copy to {holder} not written: {why}");
        fail(batches, why.into(), self.tick());
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::SeqCst)
    }
}

/// A stream's failure as a copy's reason (the stream's errors speak of migrations).
fn reason(e: crate::ClusterError) -> String {
    match e {
        crate::ClusterError::Migration(why) => why,
        e => e.to_string(),
    }
}

fn fail(batches: &mut Vec<Batch>, why: Arc<str>, seq: u64) {
    for b in batches.drain(..) {
        b.reply.send(&b.tickets, Some(why.clone()), seq);
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
