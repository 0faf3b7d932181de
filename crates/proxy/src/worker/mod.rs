//! A proxy worker: takes a batch of queued requests, routes each to its backends, sends them
//! pipelined over its own connection to each backend (one write per backend per batch),
//! and answers each request as soon as its replies decide it.
//!
//! ```text
//!  queue ──batch (≤ 64)──► route: key → pool → replicas → part(s)
//!                                │  reads: one replica (retried once on the next)
//!                                │  multi-gets: one part per backend (sharded) or one
//!                                │  writes, flush_all: every replica / every backend
//!                                ▼
//!          conns[backend].out ──write──► backend ──replies──► frame in order ──► parts
//!                                                                             │
//!  done(i, reply) ◄── decide: read reply / merge in key order / write policy ◄┘
//! ```
//!
//! Two ways to drive it, one state machine: on a helper thread (`--io epoll`) a batch runs to
//! its end (`Worker::batch`: start, then `poll` the backends until every request is
//! decided); on an event loop (`--io reactor`, [`Work::IN_LOOP`]) the backend connections
//! are watched by the loop's own epoll: a round's requests are started together (one write
//! per backend) and each is decided when its replies arrive, in whichever later round, while
//! the loop goes on reading and answering its clients. Requests in flight live in slabs
//! (jobs, parts) whose slots and buffers are reused.
//!
//! A request's stage times come out of it: arrival (network stage) → dequeued (started by
//! the worker) → decided. Replies a decided request no longer needs (a majority write's slow
//! replica) are read and dropped when they come, in order, so a connection never falls out
//! of step; every reply owed has a deadline, and a connection that misses one is closed and
//! its requests failed. A reload waits until nothing is in flight (backends are renumbered),
//! holding new requests meanwhile.
//!
//! Here: the requests in flight (works, jobs, parts) and the worker's state; `rounds` (how a
//! helper thread's batch or an event loop's round drives the worker), `dispatch` (a request
//! routed and written to its backends), `replies` (backend replies framed in order and
//! handed to their parts, deadlines, failed connections), `decide` (finished parts applied
//! to their jobs, each job's reply composed and handed back).

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvlab_net::{Completion, Watch, Work};

use crate::backend::{Conn, Frame, ValueAt};
use crate::config::ReplicaWritePolicy;
use crate::forward::Shape;
use crate::route::Routing;
use crate::stats::Sample;
use crate::ProxyState;

mod decide;
mod dispatch;
mod replies;
mod rounds;

/// Most requests a worker takes from the queue at once.
pub const BATCH: usize = 64;
/// The first pause before a request a cluster node redirected twice is sent again; it
/// doubles with each further redirect, up to `REDO_PAUSE_MAX`.
const REDO_PAUSE: Duration = Duration::from_micros(200);
const REDO_PAUSE_MAX: Duration = Duration::from_millis(20);
const NONE: u32 = u32::MAX;

/// One client request on its way through the proxy.
pub struct ProxyWork {
    /// The request as forwarded (without `noreply`); becomes the reply.
    pub(crate) buf: Vec<u8>,
    /// What it is and where its keys lie in `buf` (it is not parsed again).
    pub(crate) shape: Shape,
    /// The client asked for no reply.
    pub(crate) noreply: bool,
    /// When the network thread queued it.
    pub(crate) arrival: Instant,
    /// Requests queued when it arrived.
    pub(crate) queue_len: u32,
    /// Following a kvlab cluster: when a node first redirected it.
    pub(crate) redirected: Option<Instant>,
    /// Following a kvlab cluster: how many times nodes redirected it.
    pub(crate) redirects: u32,
    /// When a worker first took it up (kept when it goes again after a redirect or waits
    /// for a reload: its queue stage ended then).
    pub(crate) dequeued: Instant,
    /// The client connection it came on (a number its serving thread gave it): a
    /// connection's requests to a backend keep their order.
    pub(crate) client: u32,
}

impl ProxyWork {
    /// An empty work (a free slot of the worker's slab).
    fn vacant(now: Instant) -> ProxyWork {
        ProxyWork {
            buf: Vec::new(),
            shape: Shape::OTHER,
            noreply: true,
            arrival: now,
            queue_len: 0,
            redirected: None,
            redirects: 0,
            dequeued: now,
            client: 0,
        }
    }
}

impl Work for ProxyWork {
    type Worker = Worker;
    const BATCH: usize = BATCH;

    fn run(self, worker: &mut Worker) -> Completion {
        let mut works = vec![self];
        let mut reply = Completion::Failed("proxy: no reply".into());
        worker.batch(&mut works, &mut |_, c| reply = c);
        reply
    }

    fn run_batch(
        works: &mut Vec<Self>,
        worker: &mut Worker,
        done: &mut dyn FnMut(usize, Completion),
    ) {
        worker.batch(works, done);
        works.clear();
    }

    const IN_LOOP: bool = true;

    fn attach(worker: &mut Worker, watch: Watch) {
        worker.watch = Some(watch);
    }

    fn start(
        works: &mut Vec<(usize, Self)>,
        worker: &mut Worker,
        done: &mut dyn FnMut(usize, Completion),
    ) {
        worker.start(works, done);
    }

    fn ready(
        worker: &mut Worker,
        id: usize,
        readable: bool,
        writable: bool,
        done: &mut dyn FnMut(usize, Completion),
    ) {
        worker.ready(id, readable, writable);
        worker.settle_all(done);
        worker.flush_all(done);
    }

    fn tick(worker: &mut Worker, now: Instant, done: &mut dyn FnMut(usize, Completion)) {
        worker.tick(now, done);
    }

    fn end_round(worker: &mut Worker) {
        worker.record();
    }

    fn deadline(worker: &Worker) -> Option<Instant> {
        worker.deadline()
    }
}

/// Why a backend request failed without a reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fail {
    Ejected,
    /// A reply that came after the backend was ejected (it may have missed writes since).
    Stale,
    Connect(io::ErrorKind),
    Closed,
    Timeout,
    Garbled,
}

impl Fail {
    fn reason(self) -> String {
        match self {
            Fail::Ejected | Fail::Stale => "is ejected (failing)".into(),
            Fail::Connect(kind) => format!("connect failed: {kind}"),
            Fail::Closed => "closed the connection".into(),
            Fail::Timeout => "timed out".into(),
            Fail::Garbled => "sent an unreadable reply".into(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Waiting,
    Replied { error: bool, server_error: bool },
    Failed(Fail),
}

/// One backend request of a job.
struct Part {
    job: u32,
    backend: u32,
    /// Next part of the same job (`NONE` at the end).
    next: u32,
    reply: Vec<u8>,
    state: State,
    values: u32,
    sent: Instant,
    done: Instant,
    /// It is the retry of a failed read.
    retry: bool,
    /// Where the `VALUE` blocks of its reply lie (a part of a multi-get, merged in key order
    /// by them); the buffer stays with the slot.
    blocks: Vec<ValueAt>,
    /// Merge position: the next of `blocks`.
    cursor: usize,
    /// The key of a one-key `get`/`gets` (its `VALUE` is found by it when the request
    /// was sent coalesced with others), or of a write to a backend of a replicated pool
    /// (recorded as missed if the write fails); the buffer stays with the slot.
    key: Vec<u8>,
    /// A write to a backend of a replicated pool that is a `flush_all` (missing it leaves
    /// every key there stale).
    flush: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// `get`-family: each key's part in `key_part`.
    Get,
    /// A one-key read sent as is (`mg`, `me`).
    ReadAsIs { frame: Frame },
    /// Every replica; answered under the policy.
    Write { policy: ReplicaWritePolicy },
    /// A read that changes the item or reports its access history (`mg` with `N T R h l`):
    /// every replica, so that they stay alike; answered with the first replica's reply.
    ReadAll,
    /// A compare-and-set (`cas`, meta `C`) with replicas: decided by the primary (whose CAS
    /// values `gets` returned); when it succeeds the other replicas get the write without
    /// the compare.
    Cas,
}

impl Class {
    /// Whether its requests change data on the backends (a failure there means a missed
    /// write).
    fn writes(self) -> bool {
        matches!(self, Class::Write { .. } | Class::Cas | Class::ReadAll)
    }
}

/// One request of the batch.
struct Job {
    class: Class,
    first: u32,
    last: u32,
    waiting: u32,
    ok: u32,
    failed: u32,
    parts: u32,
    decided: bool,
    retried: bool,
    /// The part of each of its keys (`get`-family).
    key_part: Vec<u32>,
    /// The pool of a one-key request.
    pool: usize,
    /// In use (a slot of the slab).
    active: bool,
    /// Its driver's name for it ([`Work::start`]'s ticket, or its index in a batch).
    ticket: usize,
    /// Its work's client connection.
    client: u32,
    /// A write that a backend of a replicated pool missed: decided only once every replica
    /// has answered, then recorded again (see [`Worker::missed_write`]).
    missed: bool,
}

impl Job {
    fn new(class: Class) -> Job {
        Job {
            class,
            first: NONE,
            last: NONE,
            waiting: 0,
            ok: 0,
            failed: 0,
            parts: 0,
            decided: false,
            retried: false,
            key_part: Vec::new(),
            pool: 0,
            active: true,
            ticket: 0,
            client: 0,
            missed: false,
        }
    }
}

/// A worker's state: its connections (one per backend), the requests in flight (slabs of
/// jobs, their works and their parts) and scratch space, all reused.
pub struct Worker {
    shared: Arc<ProxyState>,
    index: usize,
    routing: Arc<Routing>,
    version: u64,
    conns: Vec<Conn>,
    /// The event loop that watches the connections (`--io reactor`).
    watch: Option<Watch>,
    turn: usize,
    parts: Vec<Part>,
    free_parts: Vec<u32>,
    jobs: Vec<Job>,
    /// Job `i`'s work is `works[i]`.
    works: Vec<ProxyWork>,
    free_jobs: Vec<u32>,
    /// Jobs in use.
    live: usize,
    /// Jobs decided and not yet freed (freed once nothing refers to them).
    finished: Vec<u32>,
    /// Works waiting for a reload to take effect (nothing in flight).
    held: Vec<(usize, ProxyWork)>,
    key_backend: Vec<u32>,
    replicas: Vec<usize>,
    spare: Vec<Vec<u8>>,
    assembled: Vec<u8>,
    ready: Vec<u32>,
    pollfds: Vec<libc::pollfd>,
    polled: Vec<usize>,
    samples: Vec<Sample>,
    events: Vec<(usize, Option<u64>, bool)>,
    /// The clock as last read (once per round of I/O, not per request).
    now: Instant,
    /// Following a kvlab cluster: works a node redirected (the key moved, or its data is
    /// still arriving), to send again by the new ring, each with the time it may go again;
    /// in the order they were redirected, which [`Worker::redo_due`] keeps (a connection's
    /// requests stay in order), so the first one's time is when any may go.
    redo: Vec<(usize, ProxyWork, Instant)>,
    /// Scratch: redirected works going again now.
    redo_go: Vec<(usize, ProxyWork)>,
    /// When this worker last asked the cluster for its ring, and how long it waits before
    /// asking again (doubling while the ring stays the same).
    followed: Option<Instant>,
    follow_pause: Duration,
    /// Scratch for a batch's tickets.
    tagged: Vec<(usize, ProxyWork)>,
    /// Scratch for a coalesced reply: where its `VALUE` blocks lie, each part's block;
    /// parts to free.
    values_at: Vec<ValueAt>,
    coalesced: Vec<(usize, usize)>,
    orphans: Vec<u32>,
    /// Scratch: the key of a compare-and-set's follow-up (meta keys may travel in base64).
    follow_key: Vec<u8>,
}

impl Worker {
    pub(crate) fn new(shared: Arc<ProxyState>, index: usize) -> Worker {
        let (routing, version) = shared.routing();
        let conns = routing
            .backends
            .iter()
            .map(|h| Conn::new(h.name.clone()))
            .collect();
        Worker {
            shared,
            index,
            routing,
            version,
            conns,
            watch: None,
            turn: index,
            parts: Vec::with_capacity(BATCH * 2),
            free_parts: Vec::new(),
            jobs: Vec::with_capacity(BATCH),
            works: Vec::with_capacity(BATCH),
            free_jobs: Vec::new(),
            live: 0,
            finished: Vec::new(),
            held: Vec::new(),
            key_backend: Vec::new(),
            replicas: Vec::new(),
            spare: Vec::new(),
            assembled: Vec::new(),
            ready: Vec::new(),
            pollfds: Vec::new(),
            polled: Vec::new(),
            samples: Vec::with_capacity(BATCH),
            events: Vec::new(),
            now: Instant::now(),
            redo: Vec::new(),
            redo_go: Vec::new(),
            followed: None,
            follow_pause: REDO_PAUSE,
            tagged: Vec::new(),
            values_at: Vec::new(),
            coalesced: Vec::new(),
            orphans: Vec::new(),
            follow_key: Vec::new(),
        }
    }

    /// Takes up a reload: connections to backends that stay are kept (and watched under
    /// their new numbers). Only with nothing in flight: parts name backends by number.
    fn refresh(&mut self) {
        if !self.reload_pending() {
            return;
        }
        let (routing, version) = self.shared.routing();
        let mut old = std::mem::take(&mut self.conns);
        self.conns = routing
            .backends
            .iter()
            .map(|h| match old.iter().position(|c| c.name == h.name) {
                Some(i) => old.swap_remove(i),
                None => Conn::new(h.name.clone()),
            })
            .collect();
        // Replies still owed on connections that go: nobody reads them now.
        for mut conn in old {
            for e in conn.reset() {
                if let Some(p) = e.part {
                    self.free_part(p);
                }
            }
        }
        if let Some(watch) = &self.watch {
            for (b, conn) in self.conns.iter().enumerate() {
                if let Some(fd) = conn.fd() {
                    if let Err(e) = watch.update(fd, b) {
                        tracing::warn!(backend = %conn.name, %e, "cannot watch a backend connection");
                    }
                }
            }
        }
        self.routing = routing;
        self.version = version;
    }

    /// Whether a reload has not been taken up yet.
    fn reload_pending(&self) -> bool {
        self.shared.version.load(Ordering::Acquire) != self.version
    }

    fn timeout(&self) -> Duration {
        self.routing.config.timeout
    }

    /// Frees the jobs decided: their parts still owed a reply stay until it comes (it is
    /// then read and dropped), the others go back to the slab.
    fn free_finished(&mut self) {
        while let Some(i) = self.finished.pop() {
            let i = i as usize;
            let mut p = self.jobs[i].first;
            while p != NONE {
                let next = self.parts[p as usize].next;
                if self.parts[p as usize].state == State::Waiting {
                    self.parts[p as usize].job = NONE;
                } else {
                    self.free_part(p);
                }
                p = next;
            }
            let job = &mut self.jobs[i];
            job.active = false;
            job.first = NONE;
            job.last = NONE;
            self.live -= 1;
            self.free_jobs.push(i as u32);
        }
    }

    /// Gives part `p` (and its reply buffer) back.
    fn free_part(&mut self, p: u32) {
        let part = &mut self.parts[p as usize];
        part.job = NONE;
        part.next = NONE;
        let mut buf = std::mem::take(&mut part.reply);
        buf.clear();
        if self.spare.len() < 4 * BATCH && buf.capacity() <= 64 * 1024 {
            self.spare.push(buf);
        }
        self.free_parts.push(p);
    }

    /// Records the figures of the requests decided since the last call.
    fn record(&mut self) {
        if !self.shared.record {
            self.samples.clear();
            self.events.clear();
            return;
        }
        if self.samples.is_empty() && self.events.is_empty() {
            return;
        }
        let recorder = &self.shared.recorders[self.index];
        let mut r = recorder.lock();
        for s in self.samples.drain(..) {
            r.record(&s, self.shared.epoch);
        }
        for (b, ns, timeout) in self.events.drain(..) {
            r.backend(b, ns, timeout);
        }
    }

    /// Makes slot `i` (in use, its ticket set) a new job of `class`, keeping
    /// the slot's buffers.
    fn put_job(&mut self, i: usize, class: Class) -> &mut Job {
        let job = &mut self.jobs[i];
        job.class = class;
        job.first = NONE;
        job.last = NONE;
        job.waiting = 0;
        job.ok = 0;
        job.failed = 0;
        job.parts = 0;
        job.decided = false;
        job.retried = false;
        job.key_part.clear();
        job.pool = 0;
        job.missed = false;
        job
    }
}
