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
//! A request's stage times come out of it: arrival (network thread) → dequeued (batch
//! start) → decided. Replies a decided request no longer needs (a majority write's slow
//! replica) are read and dropped by later batches, in order, so a connection never falls
//! out of step; every reply owed has a deadline, and a connection that misses one is closed
//! and its requests failed.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvlab_net::{Completion, Work};
use kvlab_protocol::client::{parse_reply, ParsedReply, Reply};
use kvlab_protocol::{parse, Keys, MetaCommand, Parsed, Request, StoreCommand};

use crate::backend::{frame, Conn, Frame};
use crate::config::{MultiGet, WritePolicy};
use crate::route::Routing;
use crate::stats::Sample;
use crate::Shared;

/// Most requests a worker takes from the queue at once.
pub const BATCH: usize = 64;
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
}

/// Why a backend request failed without a reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fail {
    Ejected,
    Connect(io::ErrorKind),
    Closed,
    Timeout,
    Garbled,
}

impl Fail {
    fn reason(self) -> String {
        match self {
            Fail::Ejected => "is ejected (failing)".into(),
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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// `get`-family: keys in `key_part`.
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
    /// Its keys' parts: `key_part[keys.0..keys.1]`.
    keys: (u32, u32),
    /// The pool of a one-key request.
    pool: usize,
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
            keys: (0, 0),
            pool: 0,
        }
    }
}

/// A worker thread's state: its connections (one per backend) and its batch scratch space,
/// all reused from batch to batch.
pub struct Worker {
    shared: Arc<Shared>,
    index: usize,
    routing: Arc<Routing>,
    version: u64,
    conns: Vec<Conn>,
    turn: usize,
    parts: Vec<Part>,
    jobs: Vec<Job>,
    key_part: Vec<u32>,
    key_backend: Vec<u32>,
    replicas: Vec<usize>,
    spare: Vec<Vec<u8>>,
    assembled: Vec<u8>,
    ready: Vec<u32>,
    pollfds: Vec<libc::pollfd>,
    polled: Vec<usize>,
    samples: Vec<Sample>,
    events: Vec<(usize, Option<u64>, bool)>,
    dequeued: Instant,
    /// The clock as last read (once per round of I/O, not per request).
    now: Instant,
    /// Following a kvlab cluster: jobs of the batch a node redirected (the key moved, or
    /// its data is still arriving), to send again by the new ring.
    redo: Vec<usize>,
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
            turn: index,
            parts: Vec::with_capacity(BATCH * 2),
            jobs: Vec::with_capacity(BATCH),
            key_part: Vec::new(),
            key_backend: Vec::new(),
            replicas: Vec::new(),
            spare: Vec::new(),
            assembled: Vec::new(),
            ready: Vec::new(),
            pollfds: Vec::new(),
            polled: Vec::new(),
            samples: Vec::with_capacity(BATCH),
            events: Vec::new(),
            dequeued: Instant::now(),
            now: Instant::now(),
            redo: Vec::new(),
        }
    }

    /// Takes up a reload: connections to backends that stay are kept.
    fn refresh(&mut self) {
        if self.shared.version.load(Ordering::Acquire) == self.version {
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
        self.routing = routing;
        self.version = version;
    }

    fn timeout(&self) -> Duration {
        self.routing.config.timeout
    }

    /// Runs one batch: every work gets its completion through `done`.
    pub(crate) fn batch(
        &mut self,
        works: &mut [ProxyWork],
        done: &mut dyn FnMut(usize, Completion),
    ) {
        self.dequeued = Instant::now();
        self.now = self.dequeued;
        if self.shared.record {
            self.shared.queue.leave(self.dequeued, works.len() as u64);
        }
        self.refresh();
        // Replies owed from earlier batches (a majority write's slow replica): read what has
        // arrived, then fail the connections whose oldest reply is past its deadline.
        self.drain();
        self.expire(self.dequeued);
        self.run_jobs(works, done);
        if !self.redo.is_empty() {
            self.follow_redirects(works, done);
        }
        self.record();
    }

    /// Following a kvlab cluster: sends the redirected jobs again once the ring moved on
    /// (or, for a key whose data is still arriving, a moment later), for up to
    /// [`kvlab_client::cluster::REDIRECT_PATIENCE`]. A redirect never reaches the client:
    /// a node redirects before it applies anything, so sending again is safe.
    fn follow_redirects(
        &mut self,
        works: &mut [ProxyWork],
        done: &mut dyn FnMut(usize, Completion),
    ) {
        let start = Instant::now();
        let mut pause = Duration::from_micros(200);
        while !self.redo.is_empty() {
            let redo = std::mem::take(&mut self.redo);
            if start.elapsed() > kvlab_client::cluster::REDIRECT_PATIENCE {
                for i in redo {
                    let mut reply = std::mem::take(&mut works[i].buf);
                    reply.clear();
                    if !works[i].noreply {
                        reply.extend_from_slice(
                            b"SERVER_ERROR proxy: the cluster still redirects\r\n",
                        );
                    }
                    done(i, Completion::Reply(reply));
                }
                return;
            }
            if !self.shared.follow_cluster() {
                // The same ring: a hand-off under way. Wait a little.
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(20));
            }
            self.refresh();
            let mut again: Vec<ProxyWork> = redo
                .iter()
                .map(|&i| {
                    let w = &mut works[i];
                    ProxyWork {
                        buf: std::mem::take(&mut w.buf),
                        noreply: w.noreply,
                        arrival: w.arrival,
                        queue_len: w.queue_len,
                    }
                })
                .collect();
            self.run_jobs(&mut again, &mut |j, c| done(redo[j], c));
            // Jobs redirected again are indices into `again`: carry their works back.
            let next: Vec<usize> = std::mem::take(&mut self.redo);
            for j in next {
                works[redo[j]].buf = std::mem::take(&mut again[j].buf);
                self.redo.push(redo[j]);
            }
        }
    }

    /// Routes, sends and decides `works` (one batch, or the redirected part of one).
    fn run_jobs(&mut self, works: &mut [ProxyWork], done: &mut dyn FnMut(usize, Completion)) {
        for (i, work) in works.iter().enumerate() {
            self.route(i, work);
        }
        self.pump(works, done);
        self.drain();
        for conn in &mut self.conns {
            for e in conn.expect.iter_mut() {
                e.part = None;
            }
        }
        for part in self.parts.drain(..) {
            let mut buf = part.reply;
            buf.clear();
            if self.spare.len() < 4 * BATCH && buf.capacity() <= 64 * 1024 {
                self.spare.push(buf);
            }
        }
        self.jobs.clear();
        self.key_part.clear();
        self.ready.clear();
    }

    fn record(&mut self) {
        if !self.shared.record {
            self.samples.clear();
            self.events.clear();
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

    fn route(&mut self, i: usize, work: &ProxyWork) {
        let request = match parse(&work.buf, &self.shared.limits) {
            Parsed::Request { request, .. } => request,
            _ => {
                self.jobs.push(Job::new(Class::Write {
                    policy: WritePolicy::All,
                }));
                return;
            }
        };
        match request {
            Request::Get { keys, .. } | Request::Gat { keys, .. } => {
                self.jobs.push(Job::new(Class::Get));
                let start = self.key_part.len() as u32;
                let n = keys.iter().count() as u32;
                self.key_part.resize((start + n) as usize, NONE);
                self.jobs[i].keys = (start, start + n);
                self.send_keys(i, &request, keys, None, false);
            }
            Request::Store {
                command: StoreCommand::Cas,
                key,
                ..
            } if self.replicated(key) => {
                self.jobs.push(Job::new(Class::Cas));
                let pool = self.routing.pool_of(key);
                self.jobs[i].pool = pool;
                self.routing.replicas(pool, key, &mut self.replicas);
                self.replicas.truncate(1);
                self.send_all(i, &work.buf, Frame::Line, false);
            }
            Request::Store { key, .. }
            | Request::Arith { key, .. }
            | Request::Delete { key, .. }
            | Request::Touch { key, .. } => {
                let pool = self.routing.pool_of(key);
                let policy = self.routing.pools[pool].pool.write_policy;
                self.jobs.push(Job::new(Class::Write { policy }));
                self.routing.replicas(pool, key, &mut self.replicas);
                self.send_all(i, &work.buf, Frame::Line, false);
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
                            let mut job = Job::new(Class::Cas);
                            job.pool = pool;
                            self.jobs.push(job);
                            self.replicas.truncate(1);
                            self.send_all(i, &work.buf, frame, quiet);
                        }
                        MetaCommand::Get if flags.has(b'c') && !touches => {
                            // CAS values are the primary's: read them there.
                            let mut job = Job::new(Class::ReadAsIs { frame });
                            job.pool = pool;
                            self.jobs.push(job);
                            self.replicas.truncate(1);
                            self.send_read_as_is(i, &work.buf, None, false);
                        }
                        MetaCommand::Get if touches => {
                            self.jobs.push(Job::new(Class::ReadAll));
                            self.send_all(i, &work.buf, frame, quiet);
                        }
                        MetaCommand::Get | MetaCommand::Debug | MetaCommand::Noop => {
                            let mut job = Job::new(Class::ReadAsIs { frame });
                            job.pool = pool;
                            self.jobs.push(job);
                            self.send_read_as_is(i, &work.buf, None, false);
                        }
                        MetaCommand::Set | MetaCommand::Delete | MetaCommand::Arith => {
                            let policy = self.routing.pools[pool].pool.write_policy;
                            self.jobs.push(Job::new(Class::Write { policy }));
                            self.send_all(i, &work.buf, frame, quiet);
                        }
                    }
                });
            }
            // Settings every backend takes: `OK` when all took it.
            Request::FlushAll { .. } | Request::SlabsAutomove { .. } => {
                self.jobs.push(Job::new(Class::Write {
                    policy: WritePolicy::All,
                }));
                self.replicas.clear();
                self.replicas.extend(0..self.routing.backends.len());
                self.send_all(i, &work.buf, Frame::Line, false);
            }
            // Answered by the network thread; never queued.
            _ => self.jobs.push(Job::new(Class::Write {
                policy: WritePolicy::All,
            })),
        }
    }

    /// Starts a part of job `i` to `backend`: connects if needed, or fails it at once.
    /// Returns the part and whether its request may be written to `conns[backend].out`.
    fn open_part(&mut self, i: usize, backend: usize, retry: bool) -> (u32, bool) {
        let now = self.now;
        let p = self.parts.len() as u32;
        let mut part = Part {
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
        };
        let health = &self.routing.backends[backend];
        let fail = if health.is_ejected() {
            Some(Fail::Ejected)
        } else {
            let timeout = self.timeout();
            let epoch = health.rejoins.load(Ordering::Relaxed);
            match self.conns[backend].ensure_connected(timeout, epoch) {
                Ok(()) => None,
                Err(e) => {
                    health.failed(self.routing.config.failure_limit);
                    if self.jobs[i].class.writes() {
                        // It misses this write: out until flushed.
                        health.eject();
                    }
                    Some(Fail::Connect(e.kind()))
                }
            }
        };
        if let Some(f) = fail {
            part.state = State::Failed(f);
            self.ready.push(p);
            self.events.push((backend, None, false));
        }
        self.parts.push(part);
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

    /// Queues the reply owed for part `p` on its backend.
    fn expect(&mut self, p: u32, frame: Frame) {
        let b = self.parts[p as usize].backend as usize;
        let health = &self.routing.backends[b];
        health.outstanding.fetch_add(1, Ordering::Relaxed);
        let ejections = health.ejections.load(Ordering::Relaxed);
        let job = self.parts[p as usize].job as usize;
        let write = self.jobs[job].class.writes();
        self.conns[b].expect.push_back(crate::backend::Expect {
            frame,
            part: Some(p),
            sent: self.parts[p as usize].sent,
            ejections,
            write,
        });
    }

    /// Sends `bytes` to every backend in `self.replicas` (a write, a flush).
    fn send_all(&mut self, i: usize, bytes: &[u8], frame: Frame, quiet: bool) {
        for r in 0..self.replicas.len() {
            let b = self.replicas[r];
            let (p, ok) = self.open_part(i, b, false);
            if ok {
                let out = &mut self.conns[b].out;
                out.extend_from_slice(bytes);
                if quiet {
                    out.extend_from_slice(b"mn\r\n");
                }
                self.expect(p, frame);
            }
        }
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
            let out = &mut self.conns[b].out;
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
        let (start, _) = self.jobs[i].keys;
        let except = only.map(|p| self.parts[p as usize].backend as usize);
        self.turn = self.turn.wrapping_add(1);
        self.key_backend.clear();
        let multi = self.jobs[i].keys.1 - start > 1;
        let cas = matches!(
            *request,
            Request::Get { cas: true, .. } | Request::Gat { cas: true, .. }
        );
        for (k, key) in keys.iter().enumerate() {
            let slot = start as usize + k;
            if only.is_some_and(|p| self.key_part[slot] != p) {
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
                let out = &mut self.conns[backend].out;
                out.extend_from_slice(verb.as_bytes());
                if let Some(e) = exptime {
                    out.push(b' ');
                    out.extend_from_slice(itoa::Buffer::new().format(e).as_bytes());
                }
            }
            for (j, key) in keys.iter().enumerate().skip(k) {
                if self.key_backend[j] == b {
                    self.key_backend[j] = NONE;
                    self.key_part[start as usize + j] = p;
                    if ok {
                        let out = &mut self.conns[backend].out;
                        out.push(b' ');
                        out.extend_from_slice(key);
                    }
                }
            }
            if ok {
                self.conns[backend].out.extend_from_slice(b"\r\n");
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
                        .replicas(self.jobs[i].pool, k, &mut self.replicas)
                });
                (&[][..], Frame::Meta)
            }
            _ => {
                self.assembled = follow;
                return;
            }
        };
        if !key.is_empty() {
            self.routing
                .replicas(self.jobs[i].pool, key, &mut self.replicas);
        }
        for r in 1..self.replicas.len() {
            let b = self.replicas[r];
            let (p, ok) = self.open_part(i, b, false);
            if ok {
                self.conns[b].out.extend_from_slice(&follow);
                self.expect(p, frame);
            }
            // The job is decided by the primary: this part only keeps the replica current.
            self.jobs[i].waiting -= 1;
        }
        follow.clear();
        self.assembled = follow;
    }

    /// Writes, polls and reads until every job of the batch is decided.
    fn pump(&mut self, works: &mut [ProxyWork], done: &mut dyn FnMut(usize, Completion)) {
        loop {
            self.settle(works, done);
            if self.jobs.iter().all(|j| j.decided) {
                // Writes no job waits for (a cas's follow-ups) still go out now.
                for b in 0..self.conns.len() {
                    if self.conns[b].wants_write() && self.conns[b].flush().is_err() {
                        self.fail_conn(b, Fail::Closed);
                    }
                }
                return;
            }
            for b in 0..self.conns.len() {
                if self.conns[b].wants_write() && self.conns[b].flush().is_err() {
                    self.fail_conn(b, Fail::Closed);
                }
            }
            if !self.ready.is_empty() {
                continue;
            }
            self.pollfds.clear();
            self.polled.clear();
            let mut deadline: Option<Instant> = None;
            let timeout = self.timeout();
            for (b, conn) in self.conns.iter().enumerate() {
                let (Some(fd), Some(head)) = (conn.fd(), conn.expect.front()) else {
                    continue;
                };
                let due = head.sent + timeout;
                deadline = Some(deadline.map_or(due, |d| d.min(due)));
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
            let Some(deadline) = deadline else {
                // Undecided jobs with nothing in flight cannot happen; fail them rather
                // than hang.
                self.fail_undecided(works, done);
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
                self.fail_undecided(works, done);
                return;
            }
            for k in 0..self.pollfds.len() {
                let revents = self.pollfds[k].revents;
                if revents == 0 {
                    continue;
                }
                let b = self.polled[k];
                if revents & libc::POLLOUT != 0 && self.conns[b].flush().is_err() {
                    self.fail_conn(b, Fail::Closed);
                    continue;
                }
                if revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                    self.read_replies(b);
                }
            }
            self.now = Instant::now();
            self.expire(self.now);
        }
    }

    /// Reads, without waiting, the replies that have arrived for requests no job waits for.
    fn drain(&mut self) {
        for b in 0..self.conns.len() {
            if !self.conns[b].expect.is_empty() && self.conns[b].is_connected() {
                self.read_replies(b);
            }
        }
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
                Ok(Some(f)) => {
                    conn.expect.pop_front();
                    health.outstanding.fetch_sub(1, Ordering::Relaxed);
                    health.succeeded();
                    // Ejected since it was sent: what it says may be stale (it missed
                    // writes); the request counts as failed (a read is retried elsewhere).
                    let stale = health.is_ejected()
                        || health.ejections.load(Ordering::Relaxed) != head.ejections;
                    if let Some(p) = head.part {
                        let ns = now.saturating_duration_since(head.sent).as_nanos() as u64;
                        let part = &mut self.parts[p as usize];
                        if stale {
                            self.events.push((b, None, false));
                            part.state = State::Failed(Fail::Ejected);
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

    /// Closes connection `b` and fails every request in flight on it.
    fn fail_conn(&mut self, b: usize, fail: Fail) {
        let health = self.routing.backends[b].clone();
        let owed = self.conns[b].reset();
        if owed.is_empty() && fail == Fail::Closed {
            // Closed while idle (e.g. the backend restarted): reconnect on next use.
            return;
        }
        health.failed(self.routing.config.failure_limit);
        if owed.iter().any(|e| e.write) {
            health.eject();
        }
        for e in owed {
            health.outstanding.fetch_sub(1, Ordering::Relaxed);
            self.events.push((b, None, fail == Fail::Timeout));
            if let Some(p) = e.part {
                self.parts[p as usize].state = State::Failed(fail);
                self.ready.push(p);
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
                    if job.waiting == 0 || job.ok >= need || job.failed > job.parts - need {
                        self.decide(i, works, done);
                    }
                }
            }
        }
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
                let (start, end) = self.jobs[i].keys;
                let cas = matches!(
                    request,
                    Request::Get { cas: true, .. } | Request::Gat { cas: true, .. }
                );
                for (k, key) in keys.iter().enumerate() {
                    if self.key_part[start as usize + k] != p {
                        continue;
                    }
                    let pool = self.routing.pool_of(key);
                    self.read_candidates(pool, key, end - start > 1, cas);
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
        let job = &self.jobs[i];
        self.assembled.clear();
        let mut error = false;
        let mut hits = 0;
        let mut keys = 0;
        match job.class {
            Class::Get | Class::ReadAsIs { .. } => {
                keys = job.keys.1 - job.keys.0;
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
        if self.routing.config.cluster.is_some() && is_redirect(&self.assembled) {
            // Not an answer for the client: sent again by the new ring (see
            // `follow_redirects`); the request stays in its buffer.
            self.redo.push(i);
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
            queue_ns: self
                .dequeued
                .saturating_duration_since(work.arrival)
                .as_nanos() as u64,
            worker_ns: now.saturating_duration_since(self.dequeued).as_nanos() as u64,
            backend_ns,
        });
        let mut reply = std::mem::take(&mut work.buf);
        reply.clear();
        if !work.noreply {
            std::mem::swap(&mut reply, &mut self.assembled);
        }
        done(i, Completion::Reply(reply));
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
        let (start, _) = self.jobs[i].keys;
        let Parsed::Request {
            request: Request::Get { keys, .. } | Request::Gat { keys, .. },
            ..
        } = parse(&work.buf, &self.shared.limits)
        else {
            return 0;
        };
        let mut hits = 0;
        for (k, key) in keys.iter().enumerate() {
            let p = self.key_part[start as usize + k] as usize;
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

    fn fail_undecided(&mut self, works: &mut [ProxyWork], done: &mut dyn FnMut(usize, Completion)) {
        for i in 0..self.jobs.len() {
            if !self.jobs[i].decided {
                self.jobs[i].failed += 1;
                self.jobs[i].waiting = 0;
                self.decide(i, works, done);
            }
        }
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
