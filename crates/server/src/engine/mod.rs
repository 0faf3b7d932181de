//! The cache engine: applies parsed requests to the [`Store`] and composes the replies.
//!
//! One `Engine` belongs to one worker thread (it holds that worker's counters), so nothing
//! here takes a lock except the store's own shard locks.
//!
//! Here: the engine, `Engine::apply` dispatching each request to its family (retrieval,
//! storage, one key's update, meta commands, administration and stats), the connection's
//! state and the [`kvlab_net::Service`] over it; `meta` (the meta commands). A cluster
//! node's service (`kvlab_cluster::NodeEngine`) wraps this one: its ownership check runs
//! between [`Engine::begin`] and [`Engine::apply`], its copies as work of its own.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use kvlab_protocol::response as r;
use kvlab_protocol::{Admin, Family, Request, StoreCommand, Watch};
use kvlab_store::{ArithRequest, ArithStatus, SetMode, SetRequest, SetStatus, Store};

use crate::admin::{self, Next};
use crate::auth::AuthFile;
use crate::cache::DiskRules;
pub use crate::cache::{Blocking, Helper, Need, ReadThrough};
use crate::conns::Registration;
use crate::slabs;
use crate::stats::{ServerStats, WorkerStats, VERSION};

mod meta;

/// Defers disk work the way the session must wait for it.
fn defer(work: Blocking) -> Flow {
    let order = work.order();
    Flow::Defer(work, order)
}

/// What the engine does after a request: a [`kvlab_net::Flow`] whose deferred work is disk
/// work.
pub type Flow = kvlab_net::Flow<Blocking>;

/// Applies requests for one worker thread.
pub struct Engine {
    /// The cache.
    pub store: Arc<Store>,
    /// Server-wide figures (read by `stats`).
    pub server: Arc<ServerStats>,
    /// This worker's own counters.
    pub worker: Arc<WorkerStats>,
    /// When the store's disk is touched (read-through, persist before the reply).
    disk: DiskRules,
    /// The socket of the connection whose request runs (for `watch` lines' `cfd=`).
    cfd: i32,
    /// The streams a `watch` asked for, until its socket is handed over.
    watch: u16,
    /// The place among the open connections of a connection being handed over (`watch`).
    handed_off: Option<Registration>,
    /// The connection whose request runs speaks TLS.
    over_tls: bool,
    /// What deferred work runs with (the store).
    helper: Helper,
}

impl Engine {
    /// An engine over `store` that counts into `worker`.
    pub fn new(store: Arc<Store>, server: Arc<ServerStats>, worker: Arc<WorkerStats>) -> Self {
        let store_for_helper = store.clone();
        Engine {
            disk: DiskRules::of(&store),
            store,
            server,
            worker,
            cfd: -1,
            watch: 0,
            handed_off: None,
            over_tls: false,
            helper: Helper::new(store_for_helper),
        }
    }

    /// What a command that depends on `key`'s current state needs first (`again`: a
    /// read-through once more if it was found but left memory since, [`DiskRules::need`]).
    fn need(&self, key: &[u8], loaded: &[ReadThrough], again: bool) -> Need {
        self.disk.need(&self.store, key, loaded, again)
    }

    /// After a successful write: persist first under `sync`.
    fn persisted(&self, key: &[u8]) -> Flow {
        match self.disk.persist(key) {
            Some(work) => defer(work),
            None => Flow::Done,
        }
    }

    /// A CAS value as shown to clients: 0 under `-C`, as memcached shows it.
    fn shown(&self, cas: u64) -> u64 {
        if self.server.admin.cas_enabled {
            cas
        } else {
            0
        }
    }

    /// A client's compare value as the store sees it: under `-C`, 0, which no item's CAS
    /// is (the store numbers from 1), so a compare never matches — memcached's answers.
    fn compared(&self, cas: u64) -> u64 {
        if self.server.admin.cas_enabled {
            cas
        } else {
            0
        }
    }

    /// Applies one request and appends its reply (if any) to `out`: read-through first where
    /// needed, then the request's family. `loaded` lists the keys already read through for it
    /// ([`Loaded::keys`]). Disk work comes back as [`Flow::Defer`]: the driver runs it inline
    /// or on a helper thread.
    pub fn apply(&mut self, req: &Request<'_>, out: &mut Vec<u8>, loaded: &[ReadThrough]) -> Flow {
        // Read through every key whose current state the command depends on.
        if self.disk.read_through {
            match self.needs_load(req, loaded) {
                Some((key, Need::Load)) => {
                    return defer(Blocking::Load(ReadThrough::new(&key)));
                }
                Some((_, _)) => return unloadable(req, out),
                None => {}
            }
        }
        match *req {
            Request::Get { .. } | Request::Gat { .. } => self.retrieval(req, out, loaded),
            Request::Store { .. } => self.storage(req, out),
            Request::Arith { .. } | Request::Delete { .. } | Request::Touch { .. } => {
                self.key_update(req, out)
            }
            Request::Meta { .. } => self.meta_request(req, out),
            Request::FlushAll { .. }
            | Request::Verbosity { .. }
            | Request::SlabsAutomove { .. }
            | Request::Admin(_)
            | Request::Version
            | Request::Cluster { .. }
            | Request::Quit
            | Request::Stats { .. } => self.administration(req, out),
        }
    }

    /// `get`, `gets`, `gat`, `gats`: the values of the keys found.
    #[inline]
    fn retrieval(&mut self, req: &Request<'_>, out: &mut Vec<u8>, loaded: &[ReadThrough]) -> Flow {
        match *req {
            Request::Get { keys, cas } => {
                let start = out.len();
                let mut n = 0;
                let detail = self.server.admin.detail.enabled();
                for key in keys.iter() {
                    n += 1;
                    // A key read through for this get: what was found, should it have left
                    // memory again before this re-run.
                    let read = loaded.iter().rev().find(|r| r.key == key);
                    let item = match read.and_then(ReadThrough::found) {
                        Some(found) => self.store.get_loaded(key, found),
                        None => self.store.get(key),
                    };
                    if item.is_none() && read.is_none() && self.disk.read_through {
                        // In memory when `needs_load` looked, evicted since: read through.
                        out.truncate(start);
                        return defer(Blocking::Load(ReadThrough::new(key)));
                    }
                    if detail {
                        self.server.admin.detail.get(key, item.is_some());
                    }
                    self.log_fetch(key, item.as_ref().map(|i| (i.value.len(), i.flags)));
                    if let Some(item) = item {
                        r::value(
                            out,
                            key,
                            item.flags,
                            &item.value,
                            cas.then(|| self.shown(item.cas)),
                        );
                    }
                }
                WorkerStats::add(&self.worker.cmd_get, n);
                out.extend_from_slice(r::END);
            }
            Request::Gat { exptime, keys, cas } => {
                let mut n = 0;
                // Under `sync` a new TTL is a write: the touched keys are persisted.
                let mut touched = Vec::new();
                let detail = self.server.admin.detail.enabled();
                for key in keys.iter() {
                    n += 1;
                    let item = self.store.get_and_touch(key, exptime);
                    if detail {
                        self.server.admin.detail.get(key, item.is_some());
                    }
                    self.log_fetch(key, item.as_ref().map(|i| (i.value.len(), i.flags)));
                    if let Some(item) = item {
                        r::value(
                            out,
                            key,
                            item.flags,
                            &item.value,
                            cas.then(|| self.shown(item.cas)),
                        );
                        if self.disk.sync {
                            touched.push(key.to_vec());
                        }
                    }
                }
                WorkerStats::add(&self.worker.cmd_get, n);
                WorkerStats::add(&self.worker.cmd_touch, n);
                out.extend_from_slice(r::END);
                if !touched.is_empty() {
                    return defer(Blocking::PersistKeys(touched));
                }
            }
            _ => unreachable!("Engine::apply sends only this family's requests here"),
        }
        Flow::Done
    }

    /// `set`, `add`, `replace`, `append`, `prepend`, `cas`.
    #[inline]
    fn storage(&mut self, req: &Request<'_>, out: &mut Vec<u8>) -> Flow {
        match *req {
            Request::Store {
                command,
                key,
                flags,
                exptime,
                data,
                cas_unique,
                noreply,
            } => {
                WorkerStats::add(&self.worker.cmd_set, 1);
                if self.server.admin.detail.enabled() {
                    self.server.admin.detail.set(key);
                }
                let (mode, compare_cas) = match command {
                    StoreCommand::Set => (SetMode::Set, None),
                    StoreCommand::Add => (SetMode::Add, None),
                    StoreCommand::Replace => (SetMode::Replace, None),
                    StoreCommand::Append => (SetMode::Append, None),
                    StoreCommand::Prepend => (SetMode::Prepend, None),
                    StoreCommand::Cas => (SetMode::Set, Some(self.compared(cas_unique))),
                };
                if self.server.admin.watchers.watching(Watch::FETCHERS) {
                    // memcached's store looks the key up first, and logs that lookup.
                    let old = self.store.peek(key);
                    self.log_fetch(key, old.map(|m| (m.item.value.len(), m.item.flags)));
                }
                let status = self.store.set(&SetRequest {
                    mode,
                    key,
                    value: data,
                    flags,
                    exptime,
                    compare_cas,
                    new_cas: None,
                    invalidate: false,
                });
                self.log_store(key, status, command.name(), exptime, data.len(), flags);
                let reply = match status {
                    SetStatus::Stored { .. } => r::STORED,
                    SetStatus::NotStored => r::NOT_STORED,
                    SetStatus::Exists => r::EXISTS,
                    SetStatus::NotFound => r::NOT_FOUND,
                    SetStatus::TooLarge => r::TOO_LARGE,
                    SetStatus::OutOfMemory => r::OUT_OF_MEMORY,
                };
                // memcached's `noreply` silences every reply of a text storage command,
                // its errors included.
                if !noreply {
                    out.extend_from_slice(reply);
                }
                if let SetStatus::Stored { .. } = status {
                    return self.persisted(key);
                }
            }
            _ => unreachable!("Engine::apply sends only this family's requests here"),
        }
        Flow::Done
    }

    /// `incr`, `decr`, `delete`, `touch`: a change to one existing key.
    #[inline]
    fn key_update(&mut self, req: &Request<'_>, out: &mut Vec<u8>) -> Flow {
        match *req {
            Request::Arith {
                incr,
                key,
                delta,
                noreply,
            } => {
                let req = ArithRequest {
                    incr,
                    delta,
                    compare_cas: None,
                    new_cas: None,
                    vivify: None,
                    touch: None,
                };
                match self.store.arith(key, &req) {
                    ArithStatus::Ok { value, .. } => {
                        if !noreply {
                            r::number(out, value);
                        }
                        return self.persisted(key);
                    }
                    // As memcached: `noreply` silences the errors too (a client that
                    // asked for no reply would read one as the reply to its next call).
                    _ if noreply => {}
                    ArithStatus::NotFound | ArithStatus::Exists => {
                        out.extend_from_slice(r::NOT_FOUND)
                    }
                    ArithStatus::NonNumeric => out.extend_from_slice(r::NON_NUMERIC),
                    ArithStatus::OutOfMemory => out.extend_from_slice(r::ARITH_OUT_OF_MEMORY),
                }
            }
            Request::Delete { key, noreply } => {
                if self.server.admin.detail.enabled() {
                    self.server.admin.detail.delete(key);
                }
                let deleted = self.store.delete(key);
                if !noreply {
                    out.extend_from_slice(if deleted { r::DELETED } else { r::NOT_FOUND });
                }
                if deleted {
                    return self.persisted(key);
                }
            }
            Request::Touch {
                key,
                exptime,
                noreply,
            } => {
                WorkerStats::add(&self.worker.cmd_touch, 1);
                let touched = self.store.touch(key, exptime);
                if !noreply {
                    out.extend_from_slice(if touched { r::TOUCHED } else { r::NOT_FOUND });
                }
                if touched {
                    return self.persisted(key);
                }
            }
            _ => unreachable!("Engine::apply sends only this family's requests here"),
        }
        Flow::Done
    }

    /// `flush_all`, `verbosity`, `slabs automove`, `watch` and the other administration
    /// commands, `version`, `cluster` (outside a cluster), `quit`, `stats`.
    #[inline]
    fn administration(&mut self, req: &Request<'_>, out: &mut Vec<u8>) -> Flow {
        match *req {
            Request::FlushAll { delay, noreply } => {
                WorkerStats::add(&self.worker.cmd_flush, 1);
                if !self.server.admin.flush_enabled {
                    // `-F`: counted, refused, as memcached does.
                    if !noreply {
                        out.extend_from_slice(b"CLIENT_ERROR flush_all not allowed\r\n");
                    }
                    return Flow::Done;
                }
                self.store.flush_all(delay);
                if !noreply {
                    out.extend_from_slice(r::OK);
                }
                if self.disk.sync {
                    return defer(Blocking::SyncAll);
                }
            }
            Request::Verbosity { level, noreply } => {
                self.server.verbosity.store(u64::from(level), Relaxed);
                if !noreply {
                    out.extend_from_slice(r::OK);
                }
            }
            Request::SlabsAutomove { mode } => {
                self.server.slab_automove.store(u64::from(mode), Relaxed);
                out.extend_from_slice(r::OK);
            }
            Request::Admin(Admin::Watch { streams }) => {
                let Some(streams) = streams else {
                    out.extend_from_slice(r::ERROR);
                    return Flow::Done;
                };
                // Replies composed before it leave first (memcached refuses a `watch`
                // behind unsent replies); input after it is not read.
                // A TLS connection's bytes are rustls's: the log thread cannot write to
                // its socket.
                if self.over_tls {
                    out.extend_from_slice(b"WATCHER_FAILED failed to add log watcher\r\n");
                    return Flow::Done;
                }
                if self.server.admin.watchers.check_room().is_err() {
                    out.extend_from_slice(b"WATCHER_TOO_MANY log watcher limit reached\r\n");
                    return Flow::Done;
                }
                out.extend_from_slice(r::OK);
                self.watch = streams;
                return Flow::HandOff;
            }
            Request::Admin(cmd) => {
                if admin::execute(&self.server.admin, &self.store, cmd, out) == Next::Close {
                    return Flow::Close;
                }
            }
            Request::Version => r::version(out, VERSION),
            // Only a cluster node knows `cluster` (see `call`); memcached's answer otherwise.
            Request::Cluster { .. } => out.extend_from_slice(r::ERROR),
            Request::Quit => return Flow::Close,
            Request::Stats { group } => self.stats(group, out),
            _ => unreachable!("Engine::apply sends only this family's requests here"),
        }
        Flow::Done
    }

    fn stats(&mut self, group: Option<&[u8]>, out: &mut Vec<u8>) {
        match group {
            None => {
                for stat in self.server.snapshot(&self.store).fields {
                    r::stat(out, stat.name, stat.value);
                }
            }
            Some(b"settings") => {
                for (name, value) in self.server.settings(&self.store) {
                    r::stat(out, name, value);
                }
            }
            // memcached's per-size histogram is off unless `stats sizes_enable`; kvlab has none.
            Some(b"sizes") => r::stat(out, "sizes_status", "disabled"),
            Some(b"items") => {
                let now = self.store.now_unix();
                return slabs::stats_items(&self.store, &self.server.admin.evictions, now, out);
            }
            Some(b"slabs") => {
                let now = self.store.now_unix();
                let classes = &self.server.admin.classes;
                return slabs::stats_slabs(&self.store, classes, now, out);
            }
            Some(b"kvlab") => {
                for stat in self.server.snapshot(&self.store).kvlab {
                    r::stat(out, stat.name, stat.value);
                }
            }
            Some(b"latency") => {
                for (name, value) in self.server.latency() {
                    r::stat(out, &name, value);
                }
            }
            Some(b"conns") => {
                let uptime = self.server.started.elapsed().as_secs();
                let listener = self.server.listen_fd.map(|fd| (fd, uptime));
                let lines = self.server.admin.conns.lines(listener, self.cfd);
                for (name, value) in lines {
                    r::stat(out, &name, value);
                }
            }
            Some(b"reset") => {
                self.server.reset(&self.store);
                self.server.admin.detail.clear();
                out.extend_from_slice(r::RESET);
                return;
            }
            Some(_) => {
                out.extend_from_slice(r::ERROR);
                return;
            }
        }
        out.extend_from_slice(r::END);
    }

    /// `watch fetchers`: a lookup of `key` found an item of `(value bytes, flags)` or none.
    fn log_fetch(&self, key: &[u8], found: Option<(usize, u32)>) {
        let watchers = &self.server.admin.watchers;
        if !watchers.watching(Watch::FETCHERS) {
            return;
        }
        let (class, size) = match found {
            Some((len, flags)) => (
                self.server
                    .admin
                    .classes
                    .class_of_item(key.len(), len, flags),
                len,
            ),
            None => (0, 0),
        };
        watchers.fetch(key, found.is_some(), class, size, self.cfd);
    }

    /// `watch mutations`: a store command's outcome.
    fn log_store(
        &self,
        key: &[u8],
        status: SetStatus,
        cmd: &[u8],
        exptime: i64,
        len: usize,
        flags: u32,
    ) {
        let watchers = &self.server.admin.watchers;
        if !watchers.watching(Watch::MUTATIONS) {
            return;
        }
        let status = match status {
            SetStatus::Stored { .. } => "stored",
            SetStatus::NotStored => "not_stored",
            SetStatus::Exists => "exists",
            SetStatus::NotFound => "not_found",
            SetStatus::TooLarge => "too_large",
            SetStatus::OutOfMemory => "no_memory",
        };
        // Seconds from now, as memcached prints the item's expiry (0: none).
        let ttl = match exptime {
            t if t <= 0 => 0,
            t if t <= kvlab_store::REALTIME_MAXDELTA => t,
            t => t.saturating_sub(self.store.now_unix() as i64).max(0),
        };
        let class = self
            .server
            .admin
            .classes
            .class_of_item(key.len(), len, flags);
        let cmd = std::str::from_utf8(cmd).unwrap_or("na");
        watchers.store(key, status, cmd, ttl as u32, class, len, self.cfd);
    }

    /// The first key of `req` that must be read through from disk first, or that cannot be
    /// ([`Need::Unloadable`]), if any. A `get` reads each key through once: it serves what
    /// was found even if the item has left memory again ([`Store::get_loaded`]); other
    /// commands need the item in memory, and read it through again if it went
    /// ([`DiskRules::need`]).
    fn needs_load(&self, req: &Request<'_>, loaded: &[ReadThrough]) -> Option<(Vec<u8>, Need)> {
        // An overwrite (a plain `set`) replaces whatever is on disk: no need to read it first.
        if !req.effect().reads_current() {
            return None;
        }
        let again = !matches!(req, Request::Get { .. });
        req.keys().find_map(|k| match self.need(k, loaded, again) {
            Need::Ready => None,
            need => Some((k.to_vec(), need)),
        })
    }
}

const UNAUTHENTICATED: &[u8] = b"CLIENT_ERROR unauthenticated\r\n";

/// The reply of a command whose key the cache could not hold long enough to run it on
/// ([`Need::Unloadable`]): memcached's out-of-memory errors — a storage command's, else
/// `SERVER_ERROR out of memory` — silenced by `noreply` as the command's other replies are.
fn unloadable(req: &Request<'_>, out: &mut Vec<u8>) -> Flow {
    if !req.noreply() {
        out.extend_from_slice(match req.family() {
            Family::Storage => r::OUT_OF_MEMORY,
            Family::Retrieval
            | Family::Arithmetic
            | Family::KeyUpdate
            | Family::Meta
            | Family::Admin => r::ARITH_OUT_OF_MEMORY,
        });
    }
    Flow::Done
}

/// A request on a connection that has not authenticated (`-Y`): only a `set` whose data is
/// `user password` is taken, as memcached's ASCII auth; returns whether it authenticated.
fn authenticate(
    auth: &AuthFile,
    worker: &WorkerStats,
    req: &Request<'_>,
    out: &mut Vec<u8>,
) -> bool {
    let Request::Store {
        command: StoreCommand::Set,
        data,
        ..
    } = *req
    else {
        out.extend_from_slice(UNAUTHENTICATED);
        return false;
    };
    let Some((user, password)) = AuthFile::credentials(data) else {
        out.extend_from_slice(b"CLIENT_ERROR bad authentication token format\r\n");
        return false;
    };
    // As memcached counts: attempts whose data held a user and a password.
    WorkerStats::add(&worker.auth_cmds, 1);
    if auth.check(user, password) {
        out.extend_from_slice(r::STORED);
        true
    } else {
        WorkerStats::add(&worker.auth_errors, 1);
        out.extend_from_slice(b"CLIENT_ERROR authentication failure\r\n");
        false
    }
}

/// A connection's state: the keys one request has read through so far (kept across its
/// re-runs), its socket, whether it has authenticated (`-Y`) and whether it speaks TLS
/// (`-Z`).
#[derive(Default)]
pub struct Loaded {
    keys: Vec<ReadThrough>,
    /// Its socket (for `watch` lines' `cfd=`).
    fd: i32,
    /// It has authenticated (`-Y`).
    authenticated: bool,
    /// It speaks TLS (`-Z`).
    tls: bool,
    /// Its place among the open connections (`stats conns`).
    registered: Option<Registration>,
}

impl Loaded {
    /// The keys the running request has read through so far ([`Engine::apply`]'s `loaded`).
    pub fn keys(&self) -> &[ReadThrough] {
        &self.keys
    }

    /// Counts the connection as authenticated (`-Y`): a stream handed over after it
    /// authenticated on another connection state (a cluster node's import streams).
    pub fn trust(&mut self) {
        self.authenticated = true;
    }
}

impl Engine {
    /// What every request does before it is applied: the connection's bookkeeping, and
    /// under `-Y` the authentication of a connection that has not authenticated yet
    /// (`Some`: its reply is composed, the request is not applied). A service that wraps the
    /// engine calls this, then [`Engine::apply`], then [`Engine::end`].
    pub fn begin(
        &mut self,
        loaded: &mut Loaded,
        req: &Request<'_>,
        out: &mut Vec<u8>,
        rerun: bool,
    ) -> Option<Flow> {
        if !rerun {
            loaded.keys.clear();
        }
        self.cfd = loaded.fd;
        self.over_tls = loaded.tls;
        if let Some(r) = &loaded.registered {
            r.command();
        }
        if !loaded.authenticated {
            if let Some(auth) = &self.server.admin.auth {
                loaded.authenticated = authenticate(auth, &self.worker, req, out);
                return Some(Flow::Done);
            }
        }
        None
    }

    /// What every applied request does afterwards, given its flow: a `watch` stays listed
    /// as its connection's; a read-through is remembered for the request's re-run.
    pub fn end(&mut self, loaded: &mut Loaded, flow: &Flow) {
        if matches!(flow, Flow::HandOff) {
            // The connection lives on as a watcher, still listed (`take_over`).
            self.handed_off = loaded.registered.take();
        }
        if let Flow::Defer(Blocking::Load(read), _) = flow {
            // Runs again once the key is read through, with what was found: not deferred
            // for it a second time unless the item left memory again (`needs_load`).
            loaded.keys.push(read.clone());
        }
    }
}

impl kvlab_net::Service for Engine {
    type Conn = Loaded;
    type Work = Blocking;

    fn call(
        &mut self,
        loaded: &mut Loaded,
        req: &Request<'_>,
        out: &mut Vec<u8>,
        rerun: bool,
    ) -> Flow {
        if let Some(flow) = self.begin(loaded, req, out, rerun) {
            return flow;
        }
        let flow = self.apply(req, out, &loaded.keys);
        self.end(loaded, &flow);
        flow
    }

    fn opened(&mut self, conn: &mut Loaded, fd: std::os::fd::RawFd, tls: bool) {
        conn.fd = fd;
        conn.tls = tls;
        conn.registered = Some(self.server.admin.conns.register(fd));
    }

    fn take_over(&mut self, socket: std::os::fd::OwnedFd, unsent: &[u8], _unread: &[u8]) {
        let streams = std::mem::take(&mut self.watch);
        let conn = self.handed_off.take();
        if let Some(c) = &conn {
            c.handed_over(std::os::fd::AsRawFd::as_raw_fd(&socket));
        }
        if let Err(e) = self
            .server
            .admin
            .watchers
            .add(socket, streams, unsent, conn)
        {
            tracing::warn!(?e, "cannot add a watcher");
        }
    }

    fn worker(&mut self) -> &mut Helper {
        &mut self.helper
    }

    fn protocol_error(&mut self, error: kvlab_protocol::ProtocolError) {
        WorkerStats::add(&self.worker.protocol_errors, 1);
        if error == kvlab_protocol::ProtocolError::TooLarge {
            self.store.count_too_large();
        }
    }

    fn error_reply(
        &mut self,
        conn: &mut Loaded,
        _: kvlab_protocol::ProtocolError,
    ) -> Option<&'static [u8]> {
        (self.server.admin.auth.is_some() && !conn.authenticated).then_some(UNAUTHENTICATED)
    }

    fn drop_stale(
        &mut self,
        conn: &mut Loaded,
        key: kvlab_protocol::MetaKey<'_>,
    ) -> Option<Blocking> {
        if self.server.admin.auth.is_some() && !conn.authenticated {
            // Nothing changes for a connection that has not authenticated.
            return None;
        }
        // The old value goes, as in memcached; under `--durability sync` the removal is on
        // disk before the error reply leaves.
        key.with(|key| {
            if self.store.delete(key) {
                self.disk.persist(key)
            } else {
                None
            }
        })
    }

    fn record_service(&mut self, samples: &[u64]) {
        self.worker.record_service(samples);
    }

    fn timed(&self, req: &Request<'_>) -> bool {
        !matches!(req, Request::Stats { .. })
    }

    fn record_wait(&mut self, polled: std::time::Instant) {
        let waited_ns = polled.elapsed().as_nanos() as u64;
        self.worker.wait_buckets.record(waited_ns);
    }

    fn bytes_read(&mut self, n: usize) {
        WorkerStats::add(&self.worker.bytes_read, n as u64);
    }

    fn yielded(&mut self) {
        WorkerStats::add(&self.worker.conn_yields, 1);
    }

    fn bytes_written(&mut self, n: usize) {
        WorkerStats::add(&self.worker.bytes_written, n as u64);
    }
}

#[cfg(test)]
mod session_tests {
    //! The cache engine under the sans-IO session.

    use kvlab_net::Work;
    use kvlab_protocol::Limits;
    use kvlab_store::{Config, ManualClock};

    use super::*;
    use crate::cache::MAX_LOADS;
    use crate::Session;

    fn engine() -> Engine {
        let store = Arc::new(Store::new(
            Config::default(),
            Arc::new(ManualClock::new(1_800_000_000)),
        ));
        engine_over(store)
    }

    fn engine_over(store: Arc<Store>) -> Engine {
        let worker = Arc::new(WorkerStats::default());
        let server = Arc::new(ServerStats::for_tests(vec![worker.clone()]));
        Engine::new(store, server, worker)
    }

    fn feed(s: &mut Session, e: &mut Engine, bytes: &[u8], chunk: usize) {
        let mut at = 0;
        while at < bytes.len() && s.wants_read() {
            let space = s.read_space();
            let n = space.len().min(chunk).min(bytes.len() - at);
            space[..n].copy_from_slice(&bytes[at..at + n]);
            s.filled(n);
            at += n;
            s.process_inline(e);
        }
    }

    #[test]
    fn pipelined_replies_keep_request_order() {
        let (mut s, mut e) = (Session::new(Limits::default()), engine());
        let req = b"set a 0 0 1\r\n1\r\nget a\r\ndelete a\r\nget a\r\nbogus\r\nversion\r\n";
        // Byte by byte: every split point of a pipeline gives the same replies.
        feed(&mut s, &mut e, req, 1);
        let out = s.output().to_vec();
        s.wrote(out.len());
        let want = format!(
            "STORED\r\nVALUE a 0 1\r\n1\r\nEND\r\nDELETED\r\nEND\r\nERROR\r\nVERSION {VERSION}\r\n"
        );
        assert_eq!(String::from_utf8_lossy(&out), want);
    }

    fn sync_store(dir: &std::path::Path) -> Arc<Store> {
        let mut durable = kvlab_store::DurableConfig::new(dir);
        durable.durability = kvlab_store::Durability::Sync;
        let clock = Arc::new(ManualClock::new(1_800_000_000));
        Arc::new(Store::open(Config::default(), clock, durable).expect("store opens"))
    }

    fn take(s: &mut Session) -> String {
        let out = s.output().to_vec();
        s.wrote(out.len());
        String::from_utf8_lossy(&out).into_owned()
    }

    /// On a loop with helper threads, the durable cache's disk work is a barrier: a persist
    /// holds its reply back, a read-through re-runs its request, and nothing after either
    /// runs until it completes.
    #[test]
    fn disk_work_is_a_barrier_on_a_loop_with_helpers() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut e = engine_over(sync_store(dir.path()));
        let mut s = Session::new(Limits::default());
        let req = b"set k 0 0 1\r\nv\r\nversion\r\n";
        s.read_space()[..req.len()].copy_from_slice(req);
        s.filled(req.len());
        s.process(&mut e);
        assert_eq!(take(&mut s), "", "STORED waits for the persist");
        let (id, work) = s.take_work().expect("a persist");
        assert_eq!(work, Blocking::Persist(b"k".to_vec()));
        assert!(s.take_work().is_none(), "version waits behind the barrier");
        s.complete(id, work.run(&mut e.helper.clone()));
        s.process(&mut e);
        assert_eq!(take(&mut s), format!("STORED\r\nVERSION {VERSION}\r\n"));

        // Reopened, the key is on disk only: a get reads it through, then runs again.
        drop((s, e));
        let mut e = engine_over(sync_store(dir.path()));
        let mut s = Session::new(Limits::default());
        let req = b"get k\r\nget k\r\n";
        s.read_space()[..req.len()].copy_from_slice(req);
        s.filled(req.len());
        s.process(&mut e);
        assert_eq!(take(&mut s), "");
        let (id, work) = s.take_work().expect("a read-through");
        assert_eq!(work, Blocking::Load(ReadThrough::new(b"k")));
        assert!(s.take_work().is_none());
        s.complete(id, work.run(&mut e.helper.clone()));
        s.process(&mut e);
        assert_eq!(take(&mut s), "VALUE k 0 1\r\nv\r\nEND\r\n".repeat(2));
    }

    /// A durable store whose cache holds 64 items (one shard), over `dir`.
    fn small_cache(dir: &std::path::Path) -> Arc<Store> {
        let config = Config {
            max_items: 64,
            ..Config::default()
        };
        let clock = Arc::new(ManualClock::new(1_800_000_000));
        let mut durable = kvlab_store::DurableConfig::new(dir);
        // What is queued stays queued: the test commits with `sync_all`.
        durable.flush_interval = std::time::Duration::from_secs(3600);
        Arc::new(Store::open(config, clock, durable).expect("store opens"))
    }

    /// Stores keys `other:FROM..TO` straight into the store, as other connections would:
    /// in a 64-item cache they evict whatever was there.
    fn fill(store: &Store, from: usize, to: usize) {
        for i in from..to {
            let key = format!("other:{i}");
            let req = SetRequest::new(SetMode::Set, key.as_bytes(), b"x");
            assert!(matches!(store.set(&req), SetStatus::Stored { .. }));
        }
    }

    /// Runs `req` on `e`: each read-through it defers runs, then `between` (other
    /// connections' stores before the request re-runs). Returns the reply and the number
    /// of read-throughs.
    fn run_through(e: &mut Engine, req: &[u8], between: &dyn Fn(&Store)) -> (String, usize) {
        let mut s = Session::new(Limits::default());
        s.read_space()[..req.len()].copy_from_slice(req);
        s.filled(req.len());
        s.process(e);
        let mut loads = 0;
        while let Some((id, work)) = s.take_work() {
            assert!(matches!(work, Blocking::Load(_)), "{work:?}");
            loads += 1;
            let done = work.run(&mut e.helper.clone());
            between(&e.store);
            s.complete(id, done);
            s.process(e);
        }
        (take(&mut s), loads)
    }

    /// Under a small cache, the item a read-through brought in can be evicted again by other
    /// stores before its request re-runs: a `get` still answers with it (what the disk held
    /// during the request), never a miss; a command that needs the item in memory (`append`)
    /// reads it through again.
    #[test]
    fn an_item_evicted_again_before_the_rerun_is_still_served() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = small_cache(dir.path());
        let mut e = engine_over(store.clone());
        let req = SetRequest::new(SetMode::Set, b"k", b"v");
        assert!(matches!(store.set(&req), SetStatus::Stored { .. }));
        fill(&store, 0, 200);
        store.sync_all().expect("sync");
        assert!(store.peek(b"k").is_none(), "k is on disk only");

        let evict = |store: &Store| {
            fill(store, 1000, 1200);
            assert!(store.peek(b"k").is_none(), "k left memory again");
        };
        let hits = store.stats().get_hits;
        let (reply, loads) = run_through(&mut e, b"get k\r\n", &evict);
        assert_eq!((reply.as_str(), loads), ("VALUE k 0 1\r\nv\r\nEND\r\n", 1));
        assert_eq!(store.stats().get_hits, hits + 1);
        let (reply, _) = run_through(&mut e, b"gets k nothing\r\n", &evict);
        assert!(reply.starts_with("VALUE k 0 1 "), "{reply}");
        assert!(reply.ends_with("\r\nv\r\nEND\r\n"), "{reply}");

        // Evicted once, then left in memory: the append reads k through a second time.
        let once = std::sync::atomic::AtomicBool::new(true);
        let evict_once = |store: &Store| {
            if once.swap(false, Relaxed) {
                evict(store);
            }
        };
        let (reply, loads) = run_through(&mut e, b"append k 0 0 1\r\nw\r\n", &evict_once);
        assert_eq!((reply.as_str(), loads), ("STORED\r\n", 2));
        evict(&store);
        let (reply, _) = run_through(&mut e, b"get k\r\n", &evict);
        assert_eq!(reply, "VALUE k 0 2\r\nvw\r\nEND\r\n");

        // Written and evicted again between the read-through and the re-run: the newer
        // version, queued for the disk, is served; deleted, the key reads as deleted.
        evict(&store);
        let (reply, _) = run_through(&mut e, b"get k\r\n", &|store: &Store| {
            let req = SetRequest::new(SetMode::Set, b"k", b"new");
            assert!(matches!(store.set(&req), SetStatus::Stored { .. }));
            evict(store);
        });
        assert_eq!(reply, "VALUE k 0 3\r\nnew\r\nEND\r\n");
        evict(&store);
        let (reply, _) = run_through(&mut e, b"get k\r\n", &|store: &Store| {
            assert!(store.delete(b"k"));
            evict(store);
        });
        assert_eq!(reply, "END\r\n");
    }

    /// A command that needs its item in memory, whose item other stores evict after every
    /// read-through, fails with memcached's out-of-memory error after the last allowed one
    /// rather than run on a key it cannot see: an `add` must not overwrite the stored value,
    /// an `incr` or a `delete` must not answer `NOT_FOUND` for a key that exists.
    #[test]
    fn a_command_whose_item_never_stays_in_memory_fails_and_changes_nothing() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = small_cache(dir.path());
        let mut e = engine_over(store.clone());
        let req = SetRequest::new(SetMode::Set, b"k", b"7");
        assert!(matches!(store.set(&req), SetStatus::Stored { .. }));
        fill(&store, 0, 200);
        store.sync_all().expect("sync");
        let evict = |store: &Store| {
            fill(store, 1000, 1200);
            assert!(store.peek(b"k").is_none(), "k left memory again");
        };
        let cases: [(&[u8], &str); 6] = [
            (
                b"add k 0 0 1\r\nz\r\n",
                "SERVER_ERROR out of memory storing object\r\n",
            ),
            (
                b"append k 0 0 1\r\nz\r\n",
                "SERVER_ERROR out of memory storing object\r\n",
            ),
            (b"incr k 1\r\n", "SERVER_ERROR out of memory\r\n"),
            (b"delete k\r\n", "SERVER_ERROR out of memory\r\n"),
            (b"touch k 100\r\n", "SERVER_ERROR out of memory\r\n"),
            (b"add k 0 0 1 noreply\r\nz\r\n", ""),
        ];
        for (req, want) in cases {
            let (reply, loads) = run_through(&mut e, req, &evict);
            let cmd = String::from_utf8_lossy(req);
            assert_eq!((reply.as_str(), loads), (want, MAX_LOADS), "{cmd}");
            // The stored value is untouched.
            let (reply, _) = run_through(&mut e, b"get k\r\n", &|_: &Store| {});
            assert_eq!(reply, "VALUE k 0 1\r\n7\r\nEND\r\n", "after {cmd}");
            evict(&store);
        }
        // Given room, the same commands run.
        let (reply, _) = run_through(&mut e, b"incr k 1\r\n", &|_: &Store| {});
        assert_eq!(reply, "8\r\n");
    }

    #[test]
    fn protocol_errors_and_too_large_values_are_counted() {
        let (mut s, mut e) = (Session::new(Limits::default()), engine());
        let mut req = b"bogus\r\nset k 0 0 5000000\r\n".to_vec();
        req.extend(std::iter::repeat_n(b'x', 5_000_000));
        req.extend_from_slice(b"\r\n");
        feed(&mut s, &mut e, &req, 64 * 1024);
        assert_eq!(e.worker.protocol_errors.load(Relaxed), 2);
        assert_eq!(e.store.stats().store_too_large, 1);
    }
}
