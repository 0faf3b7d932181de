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
//! A holder that fails (no reply within [`REPLICA_TIMEOUT`], a refused connection, a
//! closed stream) is not tried again for [`REPLICA_BACKOFF`]: meanwhile writes that need it
//! fail at once instead of each waiting out a timeout.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
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

    fn send(&self, tickets: &[usize], failure: Option<Arc<str>>) {
        for &ticket in tickets {
            let _ = self.tx.send(Confirm {
                ticket,
                failure: failure.clone(),
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
        }
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
            batch.reply.send(&batch.tickets, Some(why.into()));
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
                    for b in q.batches.drain(..) {
                        b.reply.send(&b.tickets, Some(why.clone()));
                    }
                    return;
                }
                batches.extend(q.batches.drain(..));
            }
            if let Some(why) = self.backing_off(&holder) {
                let why = format!("copy to {holder} not written: {why}");
                fail(&mut batches, why.into());
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
            match self.write(p, &batches) {
                Ok(0) => {
                    for b in batches.drain(..) {
                        b.reply.send(&b.tickets, None);
                    }
                }
                Ok(refused) => {
                    // The holder took the stream but refused items (out of memory, or a
                    // view that no longer makes it a holder): those copies are not there.
                    self.errors.fetch_add(1, Ordering::Relaxed);
                    let why = format!("copy to {holder} not written: {refused} copies refused");
                    fail(&mut batches, why.into());
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
        fail(
            batches,
            format!("copy to {holder} not written: {why}").into(),
        );
    }
}

/// A stream's failure as a copy's reason (the stream's errors speak of migrations).
fn reason(e: crate::ClusterError) -> String {
    match e {
        crate::ClusterError::Migration(why) => why,
        e => e.to_string(),
    }
}

fn fail(batches: &mut Vec<Batch>, why: Arc<str>) {
    for b in batches.drain(..) {
        b.reply.send(&b.tickets, Some(why.clone()));
    }
}
