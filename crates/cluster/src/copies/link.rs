//! One holder's link: its `cluster import 0` stream, written under the link's lock, its
//! replies read by an event loop or the link's own thread, and what a node's links share.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvlab_store::Store;
use parking_lot::{Condvar, Mutex};

use crate::pipe::{encode_delete, encode_store, is_refusal, memchr_nl, Pipe};

use super::batch::{
    answer, Answers, Batch, Register, Reply, COPY_LINGER, HOLD_BYTES, REPLICA_BACKOFF,
    REPLICA_TIMEOUT,
};

/// What a node's links share.
pub(super) struct LinkCommon {
    pub(super) me: String,
    pub(super) store: Arc<Store>,
    /// Holders that failed lately: when, and why.
    pub(super) down: Mutex<HashMap<String, (Instant, String)>>,
    /// Holder failures (each failure of a stream with copies in flight, or a refusal).
    pub(super) errors: AtomicU64,
    /// The copy clock: ticks each time keys are read to be sent, or a failure is seen.
    pub(super) clock: AtomicU64,
    /// The event loops that offered to read links' replies.
    pub(super) loops: Mutex<Vec<Arc<Register>>>,
    /// Links holding copies of acknowledged writes ([`COPY_LINGER`]).
    pub(super) held: AtomicUsize,
    /// Connected links by the id their socket is watched as (never reused; 0 is none).
    pub(super) by_id: Mutex<HashMap<usize, Arc<Link>>>,
    pub(super) next_id: AtomicUsize,
}

impl LinkCommon {
    pub(super) fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::SeqCst)
    }

    pub(super) fn backing_off(&self, holder: &str) -> Option<(String, Duration)> {
        let down = self.down.lock();
        let (since, why) = down.get(holder)?;
        let left = REPLICA_BACKOFF.checked_sub(since.elapsed())?;
        Some((why.clone(), left))
    }
}

/// One holder's link: a `cluster import 0` stream that any thread writes copies to (under
/// the link's lock, reading each key's state as it writes it, so the stream carries a
/// key's states in the order they were read), and whose replies an event loop reads (or,
/// with no loop, the link's own thread). The link's thread connects it, times it out and
/// stops it.
pub(super) struct Link {
    pub(super) holder: String,
    pub(super) state: Mutex<LinkState>,
    /// Wakes the link's thread (a batch waits for the stream to open; the link stops).
    pub(super) wake: Condvar,
}

#[derive(Default)]
pub(super) struct LinkState {
    /// The open stream (non-blocking).
    pub(super) stream: Option<TcpStream>,
    /// The id the stream is watched as (0: none yet, or not by a loop).
    pub(super) id: usize,
    /// A loop reads the stream's replies.
    pub(super) watched: bool,
    /// Bytes the socket has not taken yet.
    pub(super) out: Vec<u8>,
    /// Since when `out` holds copies of acknowledged writes on purpose ([`COPY_LINGER`]);
    /// `None`: whatever `out` holds waits only for the socket.
    pub(super) held_since: Option<Instant>,
    /// Replies not read to their end yet.
    pub(super) inb: Vec<u8>,
    /// Batches written, in order, with their replies owed.
    pub(super) sent: VecDeque<Sent>,
    pub(super) stopped: bool,
}

/// A batch written to a stream.
pub(super) struct Sent {
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
    pub(super) fn due(&self) -> Option<Instant> {
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
    pub(super) fn stop(&self) {
        self.state.lock().stopped = true;
        self.wake.notify_one();
    }

    /// Writes `batch`'s keys, each as the store holds it now, to the stream (or queues
    /// them for the stream being opened).
    pub(super) fn send(&self, sh: &LinkCommon, batch: Batch, answers: &mut Answers) {
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
    pub(super) fn release(&self, sh: &LinkCommon, st: &mut LinkState, answers: &mut Answers) {
        st.unhold(sh);
        if let Err(why) = st.flush() {
            self.failed(sh, st, &why, answers);
        }
    }

    /// The stream watched as `id` is ready.
    pub(super) fn serve(&self, sh: &LinkCommon, id: usize, answers: &mut Answers) {
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
    pub(super) fn run(self: Arc<Link>, sh: &LinkCommon) {
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
