//! Dispatch: a request routed to its backends. Each backend request is a part of its job,
//! composed into that backend connection's output (written once per round): writes and
//! `flush_all` to every replica, a one-key read to one replica (a retry to the next),
//! multi-gets split into one part per backend, a replicated compare-and-set's follow-up
//! to the other replicas.

use std::sync::atomic::Ordering;

use kvlab_protocol::{parse, MetaCommand, Parsed, Request, StoreCommand};

use crate::backend::{Change, Frame};
use crate::config::{MultiGet, ReplicaWritePolicy};
use crate::forward::{Kind, Shape};

use super::{Class, Fail, Part, ProxyWork, State, Worker, NONE};

impl Worker {
    /// Routes job `i`'s request (its work `work`) by its shape: parts opened, their requests
    /// composed into their backends' output.
    pub(super) fn route(&mut self, i: usize, work: &ProxyWork) {
        let shape = work.shape;
        let buf = &work.buf[..];
        match shape.kind {
            Kind::Get { .. } => {
                self.put_job(i, Class::Get);
                self.jobs[i].key_part.resize(shape.keys as usize, NONE);
                self.send_keys(i, buf, shape, None, false);
            }
            Kind::Write { cas: true } if self.replicated(shape.raw_key(buf)) => {
                let key = shape.raw_key(buf);
                let pool = self.routing.pool_of(key);
                self.put_job(i, Class::Cas).pool = pool;
                self.routing.replicas(pool, key, &mut self.replicas);
                self.replicas.truncate(1);
                self.send_all(i, buf, Frame::Line, false, Change::Key(key));
            }
            Kind::Write { .. } => {
                let key = shape.raw_key(buf);
                let pool = self.routing.pool_of(key);
                let policy = self.routing.pools[pool].pool.write_policy;
                self.put_job(i, Class::Write { policy });
                self.routing.replicas(pool, key, &mut self.replicas);
                self.send_all(i, buf, Frame::Line, false, Change::Key(key));
            }
            Kind::Meta(meta) => {
                let quiet = meta.quiet;
                shape.with_key(buf, |key| {
                    let pool = self.routing.pool_of(key);
                    self.routing.replicas(pool, key, &mut self.replicas);
                    let frame = match (meta.command, quiet) {
                        (MetaCommand::Debug, _) => Frame::Line,
                        (_, true) => Frame::MetaQuiet,
                        (_, false) => Frame::Meta,
                    };
                    let touches = meta.touches;
                    let compare = meta.compare && self.replicated(key);
                    match meta.command {
                        MetaCommand::Set | MetaCommand::Delete | MetaCommand::Arith if compare => {
                            self.put_job(i, Class::Cas).pool = pool;
                            self.replicas.truncate(1);
                            self.send_all(i, buf, frame, quiet, Change::Key(key));
                        }
                        MetaCommand::Get if meta.returns_cas && !touches => {
                            // CAS values are the primary's: read them there.
                            self.put_job(i, Class::ReadAsIs { frame }).pool = pool;
                            self.replicas.truncate(1);
                            self.send_read_as_is(i, buf, None, false);
                        }
                        MetaCommand::Get if touches => {
                            self.put_job(i, Class::ReadAll);
                            self.send_all(i, buf, frame, quiet, Change::Key(key));
                        }
                        MetaCommand::Get | MetaCommand::Debug | MetaCommand::Noop => {
                            self.put_job(i, Class::ReadAsIs { frame }).pool = pool;
                            self.send_read_as_is(i, buf, None, false);
                        }
                        MetaCommand::Set | MetaCommand::Delete | MetaCommand::Arith => {
                            let policy = self.routing.pools[pool].pool.write_policy;
                            self.put_job(i, Class::Write { policy });
                            self.send_all(i, buf, frame, quiet, Change::Key(key));
                        }
                    }
                });
            }
            // Settings every backend takes: `OK` when all took it.
            Kind::FlushAll | Kind::Setting => {
                let change = match shape.kind {
                    Kind::FlushAll => Change::Everything,
                    _ => Change::Nothing,
                };
                self.put_job(
                    i,
                    Class::Write {
                        policy: ReplicaWritePolicy::All,
                    },
                );
                self.replicas.clear();
                self.replicas.extend(0..self.routing.backends.len());
                self.send_all(i, buf, Frame::Line, false, change);
            }
            // Answered by the network thread; never queued.
            Kind::Other => {
                self.put_job(
                    i,
                    Class::Write {
                        policy: ReplicaWritePolicy::All,
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
        let (key, mut blocks) = match self.parts.get_mut(p as usize) {
            Some(old) => (
                std::mem::take(&mut old.key),
                std::mem::take(&mut old.blocks),
            ),
            None => (Vec::new(), Vec::new()),
        };
        blocks.clear();
        let mut part = Part {
            key,
            blocks,
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
    pub(super) fn missed_write(&self, p: u32) {
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
    pub(super) fn send_read_as_is(
        &mut self,
        i: usize,
        bytes: &[u8],
        except: Option<usize>,
        retry: bool,
    ) {
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

    /// Sends the keys of get-family request `buf` (of `shape`; job `i`) — those whose part is
    /// `only`, or all — grouped by the backend that serves each, one request per backend.
    pub(super) fn send_keys(
        &mut self,
        i: usize,
        buf: &[u8],
        shape: Shape,
        only: Option<u32>,
        retry: bool,
    ) {
        let Kind::Get { cas, exptime } = shape.kind else {
            return;
        };
        let except = only.map(|p| self.parts[p as usize].backend as usize);
        self.turn = self.turn.wrapping_add(1);
        self.key_backend.clear();
        let multi = self.jobs[i].key_part.len() > 1;
        for (k, key) in shape.keys(buf).enumerate() {
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
        let verb = match (cas, exptime) {
            (false, None) => "get",
            (true, None) => "gets",
            (false, Some(_)) => "gat",
            (true, Some(_)) => "gats",
        };
        if let (None, [b], Some(key)) = (exptime, &self.key_backend[..], shape.keys(buf).next()) {
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
            for (j, key) in shape.keys(buf).enumerate().skip(k) {
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
    pub(super) fn read_candidates(&mut self, pool: usize, key: &[u8], multi: bool, cas: bool) {
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
    /// the compare to the other replicas (their replies are read and dropped). Rare enough
    /// (a successful `cas` in a replicated pool) to parse the request again for its fields.
    pub(super) fn cas_follow_up(&mut self, i: usize, work: &ProxyWork) {
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
                meta_without_compare(&work.buf, command, data, &mut follow);
                meta_key.with(|k| {
                    self.routing
                        .replicas(self.jobs[i].pool, k, &mut self.replicas);
                    meta_key_bytes.extend_from_slice(k);
                });
                (&[][..], Frame::Meta)
            }
            // Only a storage or meta command compares; no other is followed up.
            Request::Get { .. }
            | Request::Gat { .. }
            | Request::Arith { .. }
            | Request::Delete { .. }
            | Request::Touch { .. }
            | Request::FlushAll { .. }
            | Request::Verbosity { .. }
            | Request::SlabsAutomove { .. }
            | Request::Cluster { .. }
            | Request::Version
            | Request::Quit
            | Request::Stats { .. }
            | Request::Admin(_) => {
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
}

/// A replicated meta command's follow-up: its request line again without its compare (`C`)
/// and quiet (`q`) tokens, and an `ms`'s data block, appended to `follow`.
fn meta_without_compare(buf: &[u8], command: MetaCommand, data: &[u8], follow: &mut Vec<u8>) {
    let line_end = memchr::memchr(b'\n', buf).unwrap_or(buf.len());
    let line = buf[..line_end].trim_ascii_end();
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
}
