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

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvlab_net::{Completion, Watch, Work};
use kvlab_protocol::client::{parse_reply, ParsedReply, Reply};
use kvlab_protocol::{parse, Keys, MetaCommand, Parsed, Request, StoreCommand};

use crate::backend::{frame, Change, Conn, Frame};
use crate::config::{MultiGet, WritePolicy};
use crate::route::Routing;
use crate::stats::Sample;
use crate::Shared;

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
    /// Merge position in `reply`.
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
    Write { policy: WritePolicy },
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
    shared: Arc<Shared>,
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
    /// Scratch for a coalesced reply: each part's `VALUE` block; parts to free.
    coalesced: Vec<(usize, usize)>,
    orphans: Vec<u32>,
    /// Scratch: the key of a compare-and-set's follow-up (meta keys may travel in base64).
    follow_key: Vec<u8>,
}

impl Worker {
    /// Worker number `index` of `shared`.
    pub(crate) fn new(shared: Arc<Shared>, index: usize) -> Worker {
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

    /// Runs one batch to its end (a helper thread): every work gets its completion through
    /// `done`, with its index in `works`, which it leaves empty.
    pub(crate) fn batch(
        &mut self,
        works: &mut Vec<ProxyWork>,
        done: &mut dyn FnMut(usize, Completion),
    ) {
        let mut tagged = std::mem::take(&mut self.tagged);
        tagged.extend(works.drain(..).enumerate());
        // Replies owed from earlier batches (a majority write's slow replica): read what
        // has arrived, then fail the connections whose oldest reply is past its deadline.
        for b in 0..self.conns.len() {
            if !self.conns[b].expect.is_empty() && self.conns[b].is_connected() {
                self.read_replies(b);
            }
        }
        self.expire(Instant::now());
        self.start(&mut tagged, done);
        self.tagged = tagged;
        while self.live > 0 || !self.redo.is_empty() || !self.held.is_empty() {
            self.wait(done);
        }
        self.record();
    }

    /// Starts `works` (each with its ticket): routed, their requests composed and written,
    /// one write per backend. Each is decided when its replies arrive.
    pub(crate) fn start(
        &mut self,
        works: &mut Vec<(usize, ProxyWork)>,
        done: &mut dyn FnMut(usize, Completion),
    ) {
        self.now = Instant::now();
        if self.shared.record {
            self.shared.queue.leave(self.now, works.len() as u64);
        }
        for (_, work) in works.iter_mut() {
            work.dequeued = self.now;
        }
        if self.reload_pending() || !self.held.is_empty() {
            self.held.append(works);
            self.take_up_reload(done);
            return;
        }
        self.route_all(works, done);
    }

    /// Routes and sends `works`, then decides what can be at once.
    fn route_all(
        &mut self,
        works: &mut Vec<(usize, ProxyWork)>,
        done: &mut dyn FnMut(usize, Completion),
    ) {
        let now = self.now;
        for (ticket, work) in works.drain(..) {
            let i = match self.free_jobs.pop() {
                Some(i) => i as usize,
                None => {
                    self.jobs.push(Job::new(Class::Get));
                    self.works.push(ProxyWork::vacant(now));
                    self.jobs.len() - 1
                }
            };
            self.live += 1;
            let job = &mut self.jobs[i];
            job.active = true;
            job.ticket = ticket;
            job.client = work.client;
            self.works[i] = work;
            let work = std::mem::replace(&mut self.works[i], ProxyWork::vacant(now));
            self.route(i, &work);
            self.works[i] = work;
            if self.jobs[i].parts == 0 {
                // Nothing could be sent (not a forwarded request): fail it now.
                let mut works = std::mem::take(&mut self.works);
                self.jobs[i].failed += 1;
                self.decide(i, &mut works, done);
                self.works = works;
            }
        }
        self.settle_all(done);
        self.flush_all(done);
    }

    /// With nothing in flight, takes up a pending reload and starts the works held for it.
    fn take_up_reload(&mut self, done: &mut dyn FnMut(usize, Completion)) {
        if self.live > 0 {
            return;
        }
        self.refresh();
        if !self.held.is_empty() {
            let mut held = std::mem::take(&mut self.held);
            self.route_all(&mut held, done);
            if self.held.is_empty() {
                self.held = held;
            }
        }
    }

    /// The socket of backend `b` is ready: writes what waits, reads what arrived.
    fn ready(&mut self, b: usize, readable: bool, writable: bool) {
        if b >= self.conns.len() {
            return;
        }
        self.now = Instant::now();
        if writable && self.conns[b].wants_write() && self.conns[b].flush().is_err() {
            self.fail_conn(b, Fail::Closed);
            return;
        }
        if readable && self.conns[b].is_connected() {
            self.read_replies(b);
        }
    }

    /// The clock moved on: replies past their deadline fail their connections, redirected
    /// works due go again, a pending reload is taken up when nothing is in flight.
    fn tick(&mut self, now: Instant, done: &mut dyn FnMut(usize, Completion)) {
        self.now = now.max(self.now);
        self.expire(self.now);
        self.settle_all(done);
        if self.redo_at().is_some_and(|at| self.now >= at) {
            self.redo_due(done);
        }
        if !self.held.is_empty() || self.reload_pending() {
            self.take_up_reload(done);
        }
        // Retries of reads that timed out go out now.
        self.flush_all(done);
    }

    /// When [`Worker::tick`] must run next: the earliest reply deadline, or redirected
    /// works' next try.
    fn deadline(&self) -> Option<Instant> {
        let timeout = self.timeout();
        let mut due = self.redo_at();
        for conn in &self.conns {
            if let Some(head) = conn.expect.front() {
                let d = head.sent + timeout;
                due = Some(due.map_or(d, |x| x.min(d)));
            }
        }
        if !self.held.is_empty() {
            // A reload waits for the last reply in flight; look again soon.
            let soon = self.now + Duration::from_millis(1);
            due = Some(due.map_or(soon, |x| x.min(soon)));
        }
        due
    }

    /// A helper thread's wait: `poll` the backends with replies owed until something is
    /// ready or a deadline passes, then act on it.
    fn wait(&mut self, done: &mut dyn FnMut(usize, Completion)) {
        self.pollfds.clear();
        self.polled.clear();
        for (b, conn) in self.conns.iter().enumerate() {
            let Some(fd) = conn.fd() else {
                continue;
            };
            if conn.expect.is_empty() && !conn.wants_write() {
                continue;
            }
            let mut events = libc::POLLIN;
            if conn.wants_write() {
                events |= libc::POLLOUT;
            }
            self.pollfds.push(libc::pollfd {
                fd,
                events,
                revents: 0,
            });
            self.polled.push(b);
        }
        let Some(deadline) = self.deadline() else {
            // Undecided jobs with nothing in flight cannot happen; fail them rather than
            // hang.
            self.fail_undecided(done);
            return;
        };
        let wait = deadline.saturating_duration_since(Instant::now());
        let ms = wait.as_millis().min(i32::MAX as u128) as i32 + 1;
        // SAFETY: `pollfds` is a valid, initialised array of `len` pollfd structs.
        let n = unsafe {
            libc::poll(
                self.pollfds.as_mut_ptr(),
                self.pollfds.len() as libc::nfds_t,
                ms,
            )
        };
        if n < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            self.fail_undecided(done);
            return;
        }
        for k in 0..self.pollfds.len() {
            let revents = self.pollfds[k].revents;
            if revents == 0 {
                continue;
            }
            let readable = revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0;
            self.ready(self.polled[k], readable, revents & libc::POLLOUT != 0);
        }
        self.settle_all(done);
        self.flush_all(done);
        self.tick(Instant::now(), done);
    }

    /// When the first redirected work may go again (those behind it wait for it).
    fn redo_at(&self) -> Option<Instant> {
        self.redo.first().map(|&(_, _, at)| at)
    }

    /// Redirected works whose pause is over, in the order they were redirected (the first
    /// not yet due holds back those behind it, so a connection's requests keep their
    /// order): those redirected for too long are answered with an error; the rest go again
    /// by the cluster's newest ring. The ring is asked for first (unless a reload is already
    /// pending here, and no more often than a pause that doubles while the ring stays the
    /// same): if it moved on (here, or through another worker) they wait for this worker to
    /// take it up; if not (a hand-off under way: the node's data is still arriving) they go
    /// again by the same ring. A redirect never reaches the client: a node redirects before
    /// it applies anything, so sending again is safe.
    fn redo_due(&mut self, done: &mut dyn FnMut(usize, Completion)) {
        let now = self.now;
        let due = self.redo.iter().take_while(|(_, _, at)| *at <= now).count();
        let mut go = std::mem::take(&mut self.redo_go);
        for (ticket, mut work, _) in self.redo.drain(..due) {
            let first = *work.redirected.get_or_insert(now);
            if now.saturating_duration_since(first) <= kvlab_client::cluster::REDIRECT_PATIENCE {
                go.push((ticket, work));
                continue;
            }
            let mut reply = std::mem::take(&mut work.buf);
            reply.clear();
            if !work.noreply {
                reply.extend_from_slice(b"SERVER_ERROR proxy: the cluster still redirects\r\n");
            }
            done(ticket, Completion::Reply(reply));
        }
        if !go.is_empty() {
            let ask = self
                .followed
                .is_none_or(|t| now.saturating_duration_since(t) >= self.follow_pause);
            if ask && !self.reload_pending() {
                self.followed = Some(now);
                self.follow_pause = if self.shared.follow_cluster() {
                    REDO_PAUSE
                } else {
                    (self.follow_pause * 2).min(REDO_PAUSE_MAX)
                };
            }
            if self.reload_pending() || !self.held.is_empty() {
                self.held.append(&mut go);
                self.take_up_reload(done);
            } else {
                self.route_all(&mut go, done);
            }
        }
        self.redo_go = go;
    }

    /// Decides what the replies read so far allow, then frees the jobs decided.
    pub(crate) fn settle_all(&mut self, done: &mut dyn FnMut(usize, Completion)) {
        if !self.ready.is_empty() {
            let mut works = std::mem::take(&mut self.works);
            self.settle(&mut works, done);
            self.works = works;
        }
        self.free_finished();
    }

    /// Writes every backend's waiting requests (one write each); a connection that fails
    /// fails its requests, and what that decides is decided.
    pub(crate) fn flush_all(&mut self, done: &mut dyn FnMut(usize, Completion)) {
        loop {
            for b in 0..self.conns.len() {
                if self.conns[b].wants_write() && self.conns[b].flush().is_err() {
                    self.fail_conn(b, Fail::Closed);
                }
            }
            if self.ready.is_empty() {
                return;
            }
            self.settle_all(done);
        }
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

    fn route(&mut self, i: usize, work: &ProxyWork) {
        let request = match parse(&work.buf, &self.shared.limits) {
            Parsed::Request { request, .. } => request,
            _ => {
                self.put_job(
                    i,
                    Class::Write {
                        policy: WritePolicy::All,
                    },
                );
                return;
            }
        };
        match request {
            Request::Get { keys, .. } | Request::Gat { keys, .. } => {
                self.put_job(i, Class::Get);
                let n = keys.iter().count();
                self.jobs[i].key_part.resize(n, NONE);
                self.send_keys(i, &request, keys, None, false);
            }
            Request::Store {
                command: StoreCommand::Cas,
                key,
                ..
            } if self.replicated(key) => {
                let pool = self.routing.pool_of(key);
                self.put_job(i, Class::Cas).pool = pool;
                self.routing.replicas(pool, key, &mut self.replicas);
                self.replicas.truncate(1);
                self.send_all(i, &work.buf, Frame::Line, false, Change::Key(key));
            }
            Request::Store { key, .. }
            | Request::Arith { key, .. }
            | Request::Delete { key, .. }
            | Request::Touch { key, .. } => {
                let pool = self.routing.pool_of(key);
                let policy = self.routing.pools[pool].pool.write_policy;
                self.put_job(i, Class::Write { policy });
                self.routing.replicas(pool, key, &mut self.replicas);
                self.send_all(i, &work.buf, Frame::Line, false, Change::Key(key));
            }
            Request::Meta {
                command,
                key,
                flags,
                ..
            } => {
                let quiet = flags.quiet;
                key.with(|key| {
                    let pool = self.routing.pool_of(key);
                    self.routing.replicas(pool, key, &mut self.replicas);
                    let frame = match (command, quiet) {
                        (MetaCommand::Debug, _) => Frame::Line,
                        (_, true) => Frame::MetaQuiet,
                        (_, false) => Frame::Meta,
                    };
                    let touches = flags.vivify.is_some()
                        || flags.ttl.is_some()
                        || flags.recache.is_some()
                        || flags.has(b'h')
                        || flags.has(b'l');
                    let compare = flags.compare_cas.is_some() && self.replicated(key);
                    match command {
                        MetaCommand::Set | MetaCommand::Delete | MetaCommand::Arith if compare => {
                            self.put_job(i, Class::Cas).pool = pool;
                            self.replicas.truncate(1);
                            self.send_all(i, &work.buf, frame, quiet, Change::Key(key));
                        }
                        MetaCommand::Get if flags.has(b'c') && !touches => {
                            // CAS values are the primary's: read them there.
                            self.put_job(i, Class::ReadAsIs { frame }).pool = pool;
                            self.replicas.truncate(1);
                            self.send_read_as_is(i, &work.buf, None, false);
                        }
                        MetaCommand::Get if touches => {
                            self.put_job(i, Class::ReadAll);
                            self.send_all(i, &work.buf, frame, quiet, Change::Key(key));
                        }
                        MetaCommand::Get | MetaCommand::Debug | MetaCommand::Noop => {
                            self.put_job(i, Class::ReadAsIs { frame }).pool = pool;
                            self.send_read_as_is(i, &work.buf, None, false);
                        }
                        MetaCommand::Set | MetaCommand::Delete | MetaCommand::Arith => {
                            let policy = self.routing.pools[pool].pool.write_policy;
                            self.put_job(i, Class::Write { policy });
                            self.send_all(i, &work.buf, frame, quiet, Change::Key(key));
                        }
                    }
                });
            }
            // Settings every backend takes: `OK` when all took it.
            Request::FlushAll { .. } | Request::SlabsAutomove { .. } => {
                let change = match request {
                    Request::FlushAll { .. } => Change::Everything,
                    _ => Change::Nothing,
                };
                self.put_job(
                    i,
                    Class::Write {
                        policy: WritePolicy::All,
                    },
                );
                self.replicas.clear();
                self.replicas.extend(0..self.routing.backends.len());
                self.send_all(i, &work.buf, Frame::Line, false, change);
            }
            // Answered by the network thread; never queued.
            _ => {
                self.put_job(
                    i,
                    Class::Write {
                        policy: WritePolicy::All,
                    },
                );
            }
        }
    }

    /// Starts a part of job `i` to `backend`: connects if needed, or fails it at once.
    /// Returns the part and whether its request may be written to `conns[backend].out`.
    fn open_part(&mut self, i: usize, backend: usize, retry: bool) -> (u32, bool) {
        let now = self.now;
        let p = self.free_parts.pop().unwrap_or(self.parts.len() as u32);
        let key = match self.parts.get_mut(p as usize) {
            Some(old) => std::mem::take(&mut old.key),
            None => Vec::new(),
        };
        let mut part = Part {
            key,
            job: i as u32,
            backend: backend as u32,
            next: NONE,
            reply: self.spare.pop().unwrap_or_default(),
            state: State::Waiting,
            values: 0,
            sent: now,
            done: now,
            retry,
            cursor: 0,
            flush: false,
        };
        let health = &self.routing.backends[backend];
        let fail = if health.is_ejected() {
            Some(Fail::Ejected)
        } else {
            let timeout = self.timeout();
            let epoch = health.rejoins.load(Ordering::Relaxed);
            let connected = self.conns[backend]
                .ensure_connected(timeout, epoch)
                .and_then(|new| match (&self.watch, self.conns[backend].fd()) {
                    // A new connection: the event loop watches it from now on.
                    (Some(watch), Some(fd)) if new => watch.add(fd, backend),
                    _ => Ok(()),
                });
            match connected {
                Ok(()) => None,
                Err(e) => {
                    // A write it misses is recorded by the caller ([`Worker::wrote`]).
                    health.failed(self.routing.config.failure_limit);
                    Some(Fail::Connect(e.kind()))
                }
            }
        };
        if let Some(f) = fail {
            part.state = State::Failed(f);
            self.ready.push(p);
            self.events.push((backend, None, false));
        }
        if p as usize == self.parts.len() {
            self.parts.push(part);
        } else {
            self.parts[p as usize] = part;
        }
        let job = &mut self.jobs[i];
        if job.last == NONE {
            job.first = p;
        } else {
            self.parts[job.last as usize].next = p;
        }
        job.last = p;
        job.waiting += 1;
        job.parts += 1;
        (p, fail.is_none())
    }

    /// Owes the reply for part `p` (its request just composed) on its backend.
    fn expect(&mut self, p: u32, frame: Frame) {
        let e = self.owed(p, frame);
        self.conns[self.parts[p as usize].backend as usize].owe(e);
    }

    /// The reply owed for part `p`, counted as outstanding on its backend.
    fn owed(&mut self, p: u32, frame: Frame) -> crate::backend::Expect {
        let b = self.parts[p as usize].backend as usize;
        let health = &self.routing.backends[b];
        health.outstanding.fetch_add(1, Ordering::Relaxed);
        let ejections = health.ejections.load(Ordering::Relaxed);
        let job = self.parts[p as usize].job as usize;
        let write = self.jobs[job].class.writes();
        crate::backend::Expect {
            frame,
            part: Some(p),
            sent: self.parts[p as usize].sent,
            ejections,
            write,
            joined: false,
        }
    }

    /// Sends `bytes` to every backend in `self.replicas` (a write, a flush); `change` is
    /// what it changes there.
    fn send_all(&mut self, i: usize, bytes: &[u8], frame: Frame, quiet: bool, change: Change<'_>) {
        for r in 0..self.replicas.len() {
            let b = self.replicas[r];
            let (p, ok) = self.open_part(i, b, false);
            if self.jobs[i].class.writes() {
                self.wrote(p, ok, change);
            }
            if ok {
                let out = self.conns[b].out_for(self.jobs[i].client);
                out.extend_from_slice(bytes);
                if quiet {
                    out.extend_from_slice(b"mn\r\n");
                }
                self.expect(p, frame);
            }
        }
    }

    /// Part `p` (just opened; `ok`: it may be sent) is a write of `change`. To a backend
    /// of a replicated pool it keeps what it changes, to be recorded if it fails; one that
    /// failed already (its backend is ejected or would not connect) has missed it.
    fn wrote(&mut self, p: u32, ok: bool, change: Change<'_>) {
        let part = &mut self.parts[p as usize];
        if self.routing.repair[part.backend as usize] {
            part.key.clear();
            if let Change::Key(key) = change {
                part.key.extend_from_slice(key);
            }
            part.flush = change == Change::Everything;
        }
        if !ok {
            self.missed_write(p);
        }
    }

    /// Write part `p` failed: its backend missed the write. In a replicated pool the key is
    /// recorded (a copy is taken from a peer replica before the backend serves again) and
    /// the backend ejected, under one lock; elsewhere it is ejected (it comes back as it is:
    /// the write failed for the client too).
    fn missed_write(&self, p: u32) {
        let part = &self.parts[p as usize];
        let b = part.backend as usize;
        let health = &self.routing.backends[b];
        if !self.routing.repair[b] {
            health.eject();
            return;
        }
        let change = if part.flush {
            Change::Everything
        } else if part.key.is_empty() {
            Change::Nothing
        } else {
            Change::Key(&part.key)
        };
        health.missed_write(change);
    }

    /// Sends a one-key read as is to one replica in `self.replicas` (not `except`).
    fn send_read_as_is(&mut self, i: usize, bytes: &[u8], except: Option<usize>, retry: bool) {
        let Class::ReadAsIs { frame } = self.jobs[i].class else {
            return;
        };
        let policy = self.routing.pools[self.jobs[i].pool].pool.read_policy;
        self.turn = self.turn.wrapping_add(1);
        let Some(b) = self
            .routing
            .choose_read(&self.replicas, except, policy, self.turn)
        else {
            // Every replica is ejected: fail on the first one, saying so.
            let b = self.replicas.first().copied().unwrap_or(0);
            self.open_part(i, b, retry);
            return;
        };
        let (p, ok) = self.open_part(i, b, retry);
        if ok {
            let out = self.conns[b].out_for(self.jobs[i].client);
            out.extend_from_slice(bytes);
            if frame == Frame::MetaQuiet {
                out.extend_from_slice(b"mn\r\n");
            }
            self.expect(p, frame);
        }
    }

    /// Sends the keys of get-family `request` (job `i`) — those whose part is `only`, or all
    /// — grouped by the backend that serves each, one request per backend.
    fn send_keys(
        &mut self,
        i: usize,
        request: &Request<'_>,
        keys: Keys<'_>,
        only: Option<u32>,
        retry: bool,
    ) {
        let except = only.map(|p| self.parts[p as usize].backend as usize);
        self.turn = self.turn.wrapping_add(1);
        self.key_backend.clear();
        let multi = self.jobs[i].key_part.len() > 1;
        let cas = matches!(
            *request,
            Request::Get { cas: true, .. } | Request::Gat { cas: true, .. }
        );
        for (k, key) in keys.iter().enumerate() {
            if only.is_some_and(|p| self.jobs[i].key_part[k] != p) {
                self.key_backend.push(NONE);
                continue;
            }
            let pool = self.routing.pool_of(key);
            self.read_candidates(pool, key, multi, cas);
            let policy = self.routing.pools[pool].pool.read_policy;
            let b = self
                .routing
                .choose_read(&self.replicas, except, policy, self.turn)
                // Nothing usable: the part fails on the primary, saying why.
                .unwrap_or(self.replicas[0]);
            self.key_backend.push(b as u32);
        }
        let (verb, exptime) = match *request {
            Request::Get { cas: false, .. } => ("get", None),
            Request::Get { cas: true, .. } => ("gets", None),
            Request::Gat {
                cas: false,
                exptime,
                ..
            } => ("gat", Some(exptime)),
            Request::Gat { exptime, .. } => ("gats", Some(exptime)),
            _ => return,
        };
        if let (None, [b], Some(key)) = (exptime, &self.key_backend[..], keys.iter().next()) {
            // One key: its `get` may join the one before it on the same backend connection
            // (one line, one reply for the backend to compose and send).
            let backend = *b as usize;
            if *b != NONE {
                let (p, ok) = self.open_part(i, backend, retry);
                self.jobs[i].key_part[0] = p;
                if ok {
                    let part = &mut self.parts[p as usize];
                    part.key.clear();
                    part.key.extend_from_slice(key);
                    let cas = verb == "gets";
                    // Not in front of a kvlab cluster: a node redirects a whole line
                    // for one moved key.
                    let join = self.routing.config.cluster.is_none();
                    let owed = self.owed(p, Frame::Retrieval);
                    let client = self.jobs[i].client;
                    self.conns[backend].push_get(cas, key, client, join, owed);
                }
            }
            return;
        }
        let mut k = 0;
        while k < self.key_backend.len() {
            let b = self.key_backend[k];
            if b == NONE {
                k += 1;
                continue;
            }
            let backend = b as usize;
            let (p, ok) = self.open_part(i, backend, retry);
            if ok {
                let out = self.conns[backend].out_for(self.jobs[i].client);
                out.extend_from_slice(verb.as_bytes());
                if let Some(e) = exptime {
                    out.push(b' ');
                    out.extend_from_slice(itoa::Buffer::new().format(e).as_bytes());
                }
            }
            for (j, key) in keys.iter().enumerate().skip(k) {
                if self.key_backend[j] == b {
                    self.key_backend[j] = NONE;
                    self.jobs[i].key_part[j] = p;
                    if ok {
                        let out = self.conns[backend].out_for(self.jobs[i].client);
                        out.push(b' ');
                        out.extend_from_slice(key);
                    }
                }
            }
            if ok {
                self.conns[backend]
                    .out_for(self.jobs[i].client)
                    .extend_from_slice(b"\r\n");
                self.expect(p, Frame::Retrieval);
            }
            k += 1;
        }
    }

    /// The backends that may serve `key` of `pool` in `self.replicas`: its replicas, or for
    /// a multi-get in `single` mode every backend of the pool; for `gets` (`cas`) only its
    /// primary, whose CAS values a later `cas` is decided by.
    fn read_candidates(&mut self, pool: usize, key: &[u8], multi: bool, cas: bool) {
        if cas {
            self.routing.replicas(pool, key, &mut self.replicas);
            self.replicas.truncate(1);
        } else if multi && self.routing.pools[pool].pool.multiget == MultiGet::Single {
            self.routing.pool_backends(pool, &mut self.replicas);
        } else {
            self.routing.replicas(pool, key, &mut self.replicas);
        }
    }

    /// Whether `key` has more than one copy.
    fn replicated(&self, key: &[u8]) -> bool {
        self.routing.pools[self.routing.pool_of(key)].pool.replicas > 1
    }

    /// After a replicated compare-and-set succeeded on the primary: the same write without
    /// the compare to the other replicas (their replies are read and dropped).
    fn cas_follow_up(&mut self, i: usize, work: &ProxyWork) {
        let Parsed::Request { request, .. } = parse(&work.buf, &self.shared.limits) else {
            return;
        };
        let mut follow = std::mem::take(&mut self.assembled);
        follow.clear();
        let mut meta_key_bytes = std::mem::take(&mut self.follow_key);
        meta_key_bytes.clear();
        let (key, frame) = match request {
            Request::Store {
                key,
                flags,
                exptime,
                data,
                ..
            } => {
                let set = Request::Store {
                    command: StoreCommand::Set,
                    key,
                    flags,
                    exptime,
                    data,
                    cas_unique: 0,
                    noreply: false,
                };
                crate::forward::compose(&set, &mut follow);
                (key, Frame::Line)
            }
            Request::Meta {
                command,
                key: meta_key,
                data,
                ..
            } => {
                // The request line again, without its compare (`C`) and quiet (`q`) tokens.
                let line_end = memchr::memchr(b'\n', &work.buf).unwrap_or(work.buf.len());
                let line = work.buf[..line_end].trim_ascii_end();
                let fixed = if command == MetaCommand::Set { 3 } else { 2 };
                let words = line.split(|&b| b == b' ').filter(|t| !t.is_empty());
                for (n, w) in words.enumerate() {
                    if n >= fixed && (w[0] == b'C' || w[0] == b'q') {
                        continue;
                    }
                    if n > 0 {
                        follow.push(b' ');
                    }
                    follow.extend_from_slice(w);
                }
                follow.extend_from_slice(b"\r\n");
                if command == MetaCommand::Set {
                    follow.extend_from_slice(data);
                    follow.extend_from_slice(b"\r\n");
                }
                meta_key.with(|k| {
                    self.routing
                        .replicas(self.jobs[i].pool, k, &mut self.replicas);
                    meta_key_bytes.extend_from_slice(k);
                });
                (&[][..], Frame::Meta)
            }
            _ => {
                self.assembled = follow;
                self.follow_key = meta_key_bytes;
                return;
            }
        };
        if !key.is_empty() {
            self.routing
                .replicas(self.jobs[i].pool, key, &mut self.replicas);
        }
        let changed = if key.is_empty() {
            &meta_key_bytes[..]
        } else {
            key
        };
        for r in 1..self.replicas.len() {
            let b = self.replicas[r];
            let (p, ok) = self.open_part(i, b, false);
            self.wrote(p, ok, Change::Key(changed));
            if ok {
                self.conns[b]
                    .out_for(self.jobs[i].client)
                    .extend_from_slice(&follow);
                self.expect(p, frame);
            }
            // The job is decided by the primary: this part only keeps the replica current.
            self.jobs[i].waiting -= 1;
        }
        follow.clear();
        self.assembled = follow;
        self.follow_key = meta_key_bytes;
    }

    /// Fails the connections whose oldest owed reply is past its deadline.
    fn expire(&mut self, now: Instant) {
        let timeout = self.timeout();
        for b in 0..self.conns.len() {
            if self.conns[b]
                .expect
                .front()
                .is_some_and(|e| e.sent + timeout <= now)
            {
                self.fail_conn(b, Fail::Timeout);
            }
        }
    }

    fn read_replies(&mut self, b: usize) {
        let open = self.conns[b].fill();
        self.now = Instant::now();
        let now = self.now;
        let health = self.routing.backends[b].clone();
        loop {
            let conn = &mut self.conns[b];
            let Some(head) = conn.expect.front().copied() else {
                break;
            };
            match frame(head.frame, conn.input()) {
                Ok(None) => break,
                Ok(Some(f)) if conn.expect.get(1).is_some_and(|e| e.joined) => {
                    self.take_coalesced(b, f, now);
                }
                Ok(Some(f)) => {
                    conn.expect.pop_front();
                    health.outstanding.fetch_sub(1, Ordering::Relaxed);
                    health.succeeded();
                    // Ejected since it was sent: what it says may be stale (it missed
                    // writes); the request counts as failed (a read is retried elsewhere).
                    let stale = health.is_ejected()
                        || health.ejections.load(Ordering::Relaxed) != head.ejections;
                    if let Some(p) = head.part.filter(|&p| self.parts[p as usize].job == NONE) {
                        // Its request was decided without it: dropped.
                        conn.consume(f.len);
                        self.free_part(p);
                        continue;
                    }
                    if let Some(p) = head.part {
                        let ns = now.saturating_duration_since(head.sent).as_nanos() as u64;
                        let part = &mut self.parts[p as usize];
                        if stale {
                            self.events.push((b, None, false));
                            part.state = State::Failed(Fail::Stale);
                        } else {
                            self.events.push((b, Some(ns), false));
                            part.reply.extend_from_slice(&conn.input()[..f.body]);
                            part.values = f.values;
                            part.state = State::Replied {
                                error: f.error,
                                server_error: f.server_error,
                            };
                        }
                        part.done = now;
                        self.ready.push(p);
                    }
                    conn.consume(f.len);
                }
                Err(reason) => {
                    tracing::warn!(backend = %conn.name, %reason, "unreadable reply");
                    self.fail_conn(b, Fail::Garbled);
                    return;
                }
            }
        }
        match open {
            Ok(true) if self.conns[b].expect.is_empty() && !self.conns[b].input().is_empty() => {
                // Bytes nobody asked for: the connection is out of step.
                self.fail_conn(b, Fail::Garbled);
            }
            Ok(true) => {}
            Ok(false) | Err(_) => self.fail_conn(b, Fail::Closed),
        }
    }

    /// Hands out the reply `f` (at the front of connection `b`'s input) of a coalesced
    /// `get k1 k2 …`: each part gets its key's `VALUE` (the backend answers hits in the
    /// order asked) and `END`, as if it had been sent alone; an error line goes to each.
    fn take_coalesced(&mut self, b: usize, f: crate::backend::Framed, now: Instant) {
        let health = self.routing.backends[b].clone();
        let conn = &self.conns[b];
        let group = 1 + conn.expect.iter().skip(1).take_while(|e| e.joined).count();
        let mut ranges = std::mem::take(&mut self.coalesced);
        ranges.clear();
        let reply = &conn.input()[..f.len];
        let mut at = 0;
        for e in conn.expect.iter().take(group) {
            let mut range = (0, 0);
            if let (false, Some(p)) = (f.error, e.part) {
                if let Ok(ParsedReply::Complete {
                    reply: Reply::Value { key, .. },
                    len,
                }) = parse_reply(&reply[at..])
                {
                    if key == self.parts[p as usize].key.as_slice() {
                        range = (at, at + len);
                        at += len;
                    }
                }
            }
            ranges.push(range);
        }
        for &(start, end) in &ranges {
            let Some(head) = self.conns[b].expect.pop_front() else {
                break;
            };
            health.outstanding.fetch_sub(1, Ordering::Relaxed);
            health.succeeded();
            let Some(p) = head.part else {
                continue;
            };
            if self.parts[p as usize].job == NONE {
                // Its request was decided without it: dropped.
                self.orphans.push(p);
                continue;
            }
            let stale =
                health.is_ejected() || health.ejections.load(Ordering::Relaxed) != head.ejections;
            let part = &mut self.parts[p as usize];
            if stale {
                self.events.push((b, None, false));
                part.state = State::Failed(Fail::Stale);
            } else {
                let ns = now.saturating_duration_since(head.sent).as_nanos() as u64;
                self.events.push((b, Some(ns), false));
                let input = self.conns[b].input();
                if f.error {
                    part.reply.extend_from_slice(&input[..f.body]);
                } else {
                    part.reply.extend_from_slice(&input[start..end]);
                    part.reply.extend_from_slice(b"END\r\n");
                }
                part.values = u32::from(end > start);
                part.state = State::Replied {
                    error: f.error,
                    server_error: f.server_error,
                };
            }
            part.done = now;
            self.ready.push(p);
        }
        self.conns[b].consume(f.len);
        self.coalesced = ranges;
        while let Some(p) = self.orphans.pop() {
            self.free_part(p);
        }
    }

    /// Closes connection `b` and fails every request in flight on it.
    fn fail_conn(&mut self, b: usize, fail: Fail) {
        let health = self.routing.backends[b].clone();
        let owed = self.conns[b].reset();
        if owed.is_empty() && fail == Fail::Closed {
            // Closed while idle (e.g. the backend restarted): reconnect on next use.
            return;
        }
        health.failed(self.routing.config.failure_limit);
        for e in owed {
            health.outstanding.fetch_sub(1, Ordering::Relaxed);
            self.events.push((b, None, fail == Fail::Timeout));
            // It may have missed the write (the client may have been told it succeeded).
            match e.part {
                Some(p) if e.write => self.missed_write(p),
                None if e.write => health.eject(),
                _ => {}
            }
            match e.part {
                Some(p) if self.parts[p as usize].job == NONE => self.free_part(p),
                Some(p) => {
                    self.parts[p as usize].state = State::Failed(fail);
                    self.ready.push(p);
                }
                None => {}
            }
        }
    }

    /// Applies finished parts to their jobs: retries failed reads, decides what can be.
    fn settle(&mut self, works: &mut [ProxyWork], done: &mut dyn FnMut(usize, Completion)) {
        while let Some(p) = self.ready.pop() {
            let part = &self.parts[p as usize];
            let (i, state, retry) = (part.job as usize, part.state, part.retry);
            if self.jobs[i].decided {
                continue;
            }
            self.jobs[i].waiting -= 1;
            if self.jobs[i].class.writes() && self.missed(p) {
                self.jobs[i].missed = true;
            }
            match self.jobs[i].class {
                Class::Get | Class::ReadAsIs { .. } => {
                    if failed(state) {
                        if !retry && self.retry_read(i, p, &works[i]) {
                            self.jobs[i].retried = true;
                        } else {
                            self.jobs[i].failed += 1;
                        }
                    }
                    if self.jobs[i].waiting == 0 {
                        self.decide(i, works, done);
                    }
                }
                Class::Cas => {
                    if self.jobs[i].parts == 1 && success(&self.parts[p as usize]) {
                        self.cas_follow_up(i, &works[i]);
                    }
                    self.decide(i, works, done);
                }
                Class::ReadAll => {
                    if failed(state) {
                        self.jobs[i].failed += 1;
                    } else {
                        self.jobs[i].ok += 1;
                    }
                    if self.jobs[i].waiting == 0 {
                        self.decide(i, works, done);
                    }
                }
                Class::Write { policy } => {
                    let job = &mut self.jobs[i];
                    if success(&self.parts[p as usize]) {
                        job.ok += 1;
                    } else {
                        job.failed += 1;
                    }
                    let need = match policy {
                        WritePolicy::All => job.parts,
                        WritePolicy::Majority => job.parts / 2 + 1,
                    };
                    // A write a replica missed waits for the others: it is recorded again once
                    // they have applied it (see `decide`).
                    let early = !job.missed && (job.ok >= need || job.failed > job.parts - need);
                    if job.waiting == 0 || early {
                        self.decide(i, works, done);
                    }
                }
            }
        }
    }

    /// Whether write part `p` failed on a backend of a replicated pool: it missed the write
    /// (a reply that came after its backend's ejection did reach it).
    fn missed(&self, p: u32) -> bool {
        let part = &self.parts[p as usize];
        matches!(part.state, State::Failed(f) if f != Fail::Stale)
            && self.routing.repair[part.backend as usize]
    }

    /// Sends failed read part `p` of job `i` again, to the next replica; false when there
    /// is none to try.
    fn retry_read(&mut self, i: usize, p: u32, work: &ProxyWork) -> bool {
        let before = self.jobs[i].parts;
        let Parsed::Request { request, .. } = parse(&work.buf, &self.shared.limits) else {
            return false;
        };
        let failed_backend = self.parts[p as usize].backend as usize;
        match (&request, self.jobs[i].class) {
            (Request::Get { keys, .. } | Request::Gat { keys, .. }, _) => {
                // Only if every key of the part has another usable replica.
                let keys = *keys;
                let multi = self.jobs[i].key_part.len() > 1;
                let cas = matches!(
                    request,
                    Request::Get { cas: true, .. } | Request::Gat { cas: true, .. }
                );
                for (k, key) in keys.iter().enumerate() {
                    if self.jobs[i].key_part[k] != p {
                        continue;
                    }
                    let pool = self.routing.pool_of(key);
                    self.read_candidates(pool, key, multi, cas);
                    if !self.another_replica(pool, failed_backend) {
                        return false;
                    }
                }
                self.send_keys(i, &request, keys, Some(p), true);
            }
            (Request::Meta { key, .. }, Class::ReadAsIs { .. }) => {
                let pool = self.jobs[i].pool;
                key.with(|k| self.routing.replicas(pool, k, &mut self.replicas));
                if !self.another_replica(pool, failed_backend) {
                    return false;
                }
                self.send_read_as_is(i, &work.buf, Some(failed_backend), true);
            }
            _ => return false,
        }
        self.jobs[i].parts > before
    }

    /// Whether a backend of `self.replicas` other than `failed` can serve a read of `pool`.
    fn another_replica(&self, pool: usize, failed: usize) -> bool {
        let policy = self.routing.pools[pool].pool.read_policy;
        self.routing
            .choose_read(&self.replicas, Some(failed), policy, 0)
            .is_some()
    }

    /// Composes job `i`'s reply and hands it back.
    fn decide(
        &mut self,
        i: usize,
        works: &mut [ProxyWork],
        done: &mut dyn FnMut(usize, Completion),
    ) {
        let now = self.now;
        self.jobs[i].decided = true;
        if self.jobs[i].missed {
            // Recorded when it failed, and again now that the other replicas have answered:
            // a repair that read a peer before the write reached it is done again.
            let mut p = self.jobs[i].first;
            while p != NONE {
                if self.missed(p) {
                    self.missed_write(p);
                }
                p = self.parts[p as usize].next;
            }
        }
        let job = &self.jobs[i];
        self.assembled.clear();
        let mut error = false;
        let mut hits = 0;
        let mut keys = 0;
        match job.class {
            Class::Get | Class::ReadAsIs { .. } => {
                keys = job.key_part.len() as u32;
                if job.failed > 0 {
                    error = true;
                    let p = self
                        .last_where(i, |part| failed(part.state))
                        .unwrap_or(job.last);
                    self.failure_reply(p);
                } else if let Some(p) = self.first_where(i, |part| {
                    matches!(
                        part.state,
                        State::Replied {
                            error: true,
                            server_error: false
                        }
                    )
                }) {
                    // A backend's own error line (e.g. CLIENT_ERROR) goes back as is.
                    error = true;
                    let reply = &self.parts[p as usize].reply;
                    self.assembled.extend_from_slice(reply);
                } else if job.class == Class::Get && keys > 1 {
                    hits = self.merge(i, &works[i]);
                } else if let Some(p) = self.last_where(i, |part| !failed(part.state)) {
                    let part = &self.parts[p as usize];
                    hits = part.values;
                    keys = keys.max(1);
                    self.assembled.extend_from_slice(&part.reply);
                } else {
                    error = true;
                    self.failure_reply(job.last);
                }
            }
            Class::Cas => {
                let p = job.first;
                if failed(self.parts[p as usize].state) {
                    error = true;
                }
                match self.parts[p as usize].state {
                    State::Failed(_) => self.failure_reply(p),
                    _ => {
                        let reply = &self.parts[p as usize].reply;
                        self.assembled.extend_from_slice(reply);
                    }
                }
            }
            Class::ReadAll => {
                keys = 1;
                match self.first_where(i, |part| !failed(part.state)) {
                    Some(p) => {
                        let part = &self.parts[p as usize];
                        hits = part.values;
                        error = matches!(part.state, State::Replied { error: true, .. });
                        self.assembled.extend_from_slice(&part.reply);
                    }
                    None => {
                        error = true;
                        self.failure_reply(job.first);
                    }
                }
            }
            Class::Write { policy } => {
                let need = match policy {
                    WritePolicy::All => job.parts,
                    WritePolicy::Majority => job.parts / 2 + 1,
                };
                let p = if job.ok >= need {
                    self.first_where(i, success)
                } else {
                    error = true;
                    self.first_where(i, |part| part.state != State::Waiting && !success(part))
                };
                match p {
                    Some(p) if matches!(self.parts[p as usize].state, State::Failed(_)) => {
                        self.failure_reply(p)
                    }
                    Some(p) => {
                        let part = &self.parts[p as usize];
                        self.assembled.extend_from_slice(&part.reply);
                    }
                    None => self
                        .assembled
                        .extend_from_slice(b"SERVER_ERROR proxy: no reply\r\n"),
                }
            }
        }
        self.finished.push(i as u32);
        if self.routing.config.cluster.is_some() && is_redirect(&self.assembled) {
            // Not an answer for the client: sent again by the new ring (see `redo_due`).
            let ticket = self.jobs[i].ticket;
            let mut work = std::mem::replace(&mut works[i], ProxyWork::vacant(now));
            // The first redirect goes again at once (the ring moved), later ones after a
            // pause that doubles each time (a hand-off under way).
            let due = match work.redirects {
                0 => now,
                n => now + (REDO_PAUSE * (1 << (n - 1).min(7))).min(REDO_PAUSE_MAX),
            };
            work.redirects = work.redirects.saturating_add(1);
            self.redo.push((ticket, work, due));
            return;
        }
        let work = &mut works[i];
        let job = &self.jobs[i];
        let mut backend_ns = 0;
        let mut p = job.first;
        while p != NONE {
            let part = &self.parts[p as usize];
            if part.state != State::Waiting {
                backend_ns = backend_ns
                    .max(part.done.saturating_duration_since(part.sent).as_nanos() as u64);
            }
            p = part.next;
        }
        self.samples.push(Sample {
            read: !matches!(job.class, Class::Write { .. }),
            keys,
            hits,
            error,
            retried: job.retried,
            parts: job.parts,
            arrival: work.arrival,
            queue_len: work.queue_len,
            queue_ns: work
                .dequeued
                .saturating_duration_since(work.arrival)
                .as_nanos() as u64,
            worker_ns: now.saturating_duration_since(work.dequeued).as_nanos() as u64,
            backend_ns,
        });
        let mut reply = std::mem::take(&mut work.buf);
        reply.clear();
        if !work.noreply {
            std::mem::swap(&mut reply, &mut self.assembled);
        }
        done(job.ticket, Completion::Reply(reply));
    }

    fn first_where(&self, i: usize, mut f: impl FnMut(&Part) -> bool) -> Option<u32> {
        let mut p = self.jobs[i].first;
        while p != NONE {
            if f(&self.parts[p as usize]) {
                return Some(p);
            }
            p = self.parts[p as usize].next;
        }
        None
    }

    fn last_where(&self, i: usize, mut f: impl FnMut(&Part) -> bool) -> Option<u32> {
        let mut found = None;
        let mut p = self.jobs[i].first;
        while p != NONE {
            if f(&self.parts[p as usize]) {
                found = Some(p);
            }
            p = self.parts[p as usize].next;
        }
        found
    }

    /// `SERVER_ERROR backend <name> <why>` for failed part `p` (or the backend's own
    /// `SERVER_ERROR` line).
    fn failure_reply(&mut self, p: u32) {
        let Some(part) = self.parts.get(p as usize) else {
            self.assembled
                .extend_from_slice(b"SERVER_ERROR proxy: request could not be sent\r\n");
            return;
        };
        match part.state {
            State::Failed(fail) => {
                let name = &self.routing.backends[part.backend as usize].name;
                self.assembled.extend_from_slice(b"SERVER_ERROR backend ");
                self.assembled.extend_from_slice(name.as_bytes());
                self.assembled.push(b' ');
                self.assembled.extend_from_slice(fail.reason().as_bytes());
                self.assembled.extend_from_slice(b"\r\n");
            }
            _ => self.assembled.extend_from_slice(&part.reply),
        }
    }

    /// Merges the `VALUE` blocks of a multi-part get in the order the keys were asked for;
    /// returns the values.
    fn merge(&mut self, i: usize, work: &ProxyWork) -> u32 {
        let Parsed::Request {
            request: Request::Get { keys, .. } | Request::Gat { keys, .. },
            ..
        } = parse(&work.buf, &self.shared.limits)
        else {
            return 0;
        };
        let mut hits = 0;
        for (k, key) in keys.iter().enumerate() {
            let p = self.jobs[i].key_part[k] as usize;
            let part = &mut self.parts[p];
            if let Ok(ParsedReply::Complete {
                reply: Reply::Value { key: got, .. },
                len,
            }) = parse_reply(&part.reply[part.cursor..])
            {
                if got == key {
                    self.assembled
                        .extend_from_slice(&part.reply[part.cursor..part.cursor + len]);
                    part.cursor += len;
                    hits += 1;
                }
            }
        }
        self.assembled.extend_from_slice(b"END\r\n");
        hits
    }

    fn fail_undecided(&mut self, done: &mut dyn FnMut(usize, Completion)) {
        let mut works = std::mem::take(&mut self.works);
        for i in 0..self.jobs.len() {
            if self.jobs[i].active && !self.jobs[i].decided {
                self.jobs[i].failed += 1;
                self.jobs[i].waiting = 0;
                self.decide(i, &mut works, done);
            }
        }
        self.works = works;
        self.free_finished();
    }
}

/// Whether `reply` is a kvlab cluster node's redirect (`SERVER_ERROR MOVED|TRYAGAIN …`).
fn is_redirect(reply: &[u8]) -> bool {
    reply
        .strip_prefix(b"SERVER_ERROR ")
        .is_some_and(|r| r.starts_with(b"MOVED ") || r.starts_with(b"TRYAGAIN "))
}

/// Whether a read part failed (and is worth a retry elsewhere).
fn failed(state: State) -> bool {
    matches!(
        state,
        State::Failed(_)
            | State::Replied {
                server_error: true,
                ..
            }
    )
}

/// Whether a write's reply says it was applied.
fn success(part: &Part) -> bool {
    let State::Replied { error: false, .. } = part.state else {
        return false;
    };
    let r = &part.reply;
    r.is_empty() // a quiet meta write that succeeded
        || r.starts_with(b"STORED")
        || r.starts_with(b"DELETED")
        || r.starts_with(b"TOUCHED")
        || r.starts_with(b"OK")
        || r.starts_with(b"HD")
        || r.starts_with(b"VA")
        || r.first().is_some_and(u8::is_ascii_digit)
}
