//! The cache engine: applies parsed requests to the [`Store`] and composes the replies.
//!
//! One `Engine` belongs to one worker thread (it holds that worker's counters), so nothing
//! here takes a lock except the store's own shard locks.
//!
//! Here: the engine, [`Engine::apply`] in three steps, the connection's state and the
//! [`kvlab_net::Service`] over it. `apply` runs
//!
//! ```text
//! read_through (effect reads current items?) ─► the command (one arm, its family's file)
//!   ─► Done ─► persist (effect changed items? under --durability sync) ─► Flow
//! ```
//!
//! so that the disk — reading an item through before a command that depends on it, making
//! a change durable before its reply — is decided once from what the request is
//! ([`Request::keys`], [`Request::effect`]), not in each command: a command only says
//! whether it changed what the request names ([`Done`]). What stays in the commands is what
//! depends on their outcome or on memcached's per-command rules: the counters `stats`
//! shows (`cmd_get` counts `mg` but not `me`, `cmd_touch` counts `mg N T`), the per-class
//! hit counters, `stats detail` and what `watch` is told (`watch_log`).
//!
//! The families: `retrieval` (`get gets gat gats`), `storage` (`set add replace append
//! prepend cas`), `arithmetic` (`incr decr`), `key_update` (`delete touch`), `meta` (`mg ms
//! md ma mn me`), `admin` (`flush_all verbosity slabs automove stats version cluster quit`
//! and the administration commands); `watch_log` what they tell `watch`.
//! A cluster node's service (`kvlab_cluster::NodeEngine`) wraps this one: its ownership
//! check runs between [`Engine::begin`] and [`Engine::apply`], its copies as work of its own.

use std::sync::Arc;

use kvlab_protocol::response as r;
use kvlab_protocol::{Effect, Family, Request, StoreCommand};
use kvlab_store::{SetStatus, Store};

use crate::auth::AuthFile;
use crate::cache::DiskRules;
pub use crate::cache::{Blocking, Helper, Need, ReadThrough};
use crate::class_counts::ClassOp;
use crate::conns::Registration;
use crate::stats::{ServerStats, WorkerStats};

mod admin;
mod arithmetic;
mod key_update;
mod meta;
mod retrieval;
mod storage;
mod watch_log;

/// Defers disk work the way the session must wait for it.
fn defer(work: Blocking) -> Flow {
    let order = work.order();
    Flow::Defer(work, order)
}

/// What the engine does after a request: a [`kvlab_net::Flow`] whose deferred work is disk
/// work.
pub type Flow = kvlab_net::Flow<Blocking>;

/// What a command did, as [`Engine::apply`]'s last step needs it: whether it changed what
/// the request names (to be made durable under `--durability sync`), or a flow of its own.
pub(super) enum Done {
    /// Changed no item (its reply is composed).
    Unchanged,
    /// Changed the items of the request's keys, or (a server-wide command) items wholesale.
    Changed,
    /// Changed these of the request's keys only, collected under `sync` only (a `gat`'s
    /// hits).
    ChangedKeys(Vec<Vec<u8>>),
    /// A flow of its own: read through a key first (an item that left memory since the
    /// read-through step looked), close, hand the connection over.
    Flow(Flow),
}

impl Done {
    /// `Changed` if `changed`, else `Unchanged`.
    #[inline]
    fn changed_if(changed: bool) -> Done {
        if changed {
            Done::Changed
        } else {
            Done::Unchanged
        }
    }
}

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

    /// Counts `op` in the class memcached would store this item in (`stats slabs`'
    /// per-class counters, `stats items`' `outofmemory` and `hits_to_cold`).
    #[inline]
    fn count_class(&self, op: ClassOp, key_len: usize, value_len: usize, flags: u32) {
        let class = self
            .server
            .admin
            .classes
            .class_of_item(key_len, value_len, flags);
        self.worker.classes.add(op, class);
    }

    /// The class of the item `key` holds now (0 for none), for a command whose outcome
    /// does not carry the item (`delete`, `incr`, a `cas` compare): memcached counts
    /// those in the class of the item they find. One more lookup, taken only by these
    /// commands; a write racing between it and the command's own only moves the count
    /// to the class the item had a moment before.
    fn class_now(&self, key: &[u8]) -> u32 {
        self.store.peek(key).map_or(0, |m| {
            self.server
                .admin
                .classes
                .class_of_item(key.len(), m.item.value.len(), m.item.flags)
        })
    }

    /// After a storage command: `cmd_set` in the class of the item it carried (memcached
    /// counts every item it made, stored or not), or `outofmemory` when there was no
    /// room; a compare (`old_class`: the class of the item found) counts `cas_hits` or
    /// `cas_badval` in the class of the item it found.
    fn count_store(&self, status: SetStatus, key: &[u8], len: usize, flags: u32, old_class: u32) {
        match status {
            SetStatus::TooLarge => {}
            SetStatus::OutOfMemory => self.count_class(ClassOp::OutOfMemory, key.len(), len, flags),
            SetStatus::Stored { .. }
            | SetStatus::NotStored
            | SetStatus::Exists
            | SetStatus::NotFound => {
                let admin = &self.server.admin;
                let class = admin.classes.class_of_item(key.len(), len, flags);
                self.worker.classes.add(ClassOp::Set, class);
                admin.evictions.mark_held(class);
            }
        }
        match status {
            SetStatus::Stored { .. } => self.worker.classes.add(ClassOp::CasHit, old_class),
            SetStatus::Exists => self.worker.classes.add(ClassOp::CasBadval, old_class),
            _ => {}
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
    /// needed ([`Engine::read_through`]), then the command, in its family's file, then its
    /// change made durable where needed ([`Engine::persist`]). `loaded` lists the keys
    /// already read through for it ([`Loaded::keys`]). Disk work comes back as
    /// [`Flow::Defer`]: the driver runs it inline or on a helper thread.
    pub fn apply(&mut self, req: &Request<'_>, out: &mut Vec<u8>, loaded: &[ReadThrough]) -> Flow {
        if let Some(flow) = self.read_through(req, out, loaded) {
            return flow;
        }
        let done = self.command(req, out, loaded);
        self.persist(req, done)
    }

    /// The command itself: one arm per command, each a method in its family's file.
    // Always inlined into `apply`, as this match was written there before: a call between
    // the steps, and `Done` in memory, cost about 48 instructions a request
    // (scripts/instructions-ab.sh).
    #[inline(always)]
    fn command(&mut self, req: &Request<'_>, out: &mut Vec<u8>, loaded: &[ReadThrough]) -> Done {
        match *req {
            Request::Get { keys, cas } => self.get(keys, cas, out, loaded),
            Request::Gat { exptime, keys, cas } => self.gat(exptime, keys, cas, out),
            Request::Store {
                command,
                key,
                flags,
                exptime,
                data,
                cas_unique,
                noreply,
            } => self.storage(command, key, flags, exptime, data, cas_unique, noreply, out),
            Request::Arith {
                incr,
                key,
                delta,
                noreply,
            } => self.arith(incr, key, delta, noreply, out),
            Request::Delete { key, noreply } => self.delete(key, noreply, out),
            Request::Touch {
                key,
                exptime,
                noreply,
            } => self.touch(key, exptime, noreply, out),
            Request::Meta {
                command,
                key,
                ref flags,
                data,
            } => self.meta_request(command, key, flags, data, out),
            Request::FlushAll { delay, noreply } => self.flush_all(delay, noreply, out),
            Request::Verbosity { level, noreply } => self.verbosity(level, noreply, out),
            Request::SlabsAutomove { mode } => self.slabs_automove(mode, out),
            Request::Admin(cmd) => self.admin(cmd, out),
            Request::Version => self.version(out),
            Request::Cluster { .. } => self.not_a_cluster(out),
            Request::Quit => Done::Flow(Flow::Close),
            Request::Stats { group } => self.stats_command(group, out),
        }
    }

    /// The step after a command: under `--durability sync` what it changed is made durable
    /// before its reply leaves — the request's keys ([`Request::keys`]: `Persist` for one,
    /// `PersistKeys` for several), or everything for a server-wide command
    /// ([`Effect::Server`]: `flush_all`).
    #[inline(always)]
    fn persist(&self, req: &Request<'_>, done: Done) -> Flow {
        match done {
            Done::Unchanged => Flow::Done,
            Done::Changed | Done::ChangedKeys(_) if !self.disk.sync => Flow::Done,
            Done::ChangedKeys(keys) if keys.is_empty() => Flow::Done,
            Done::ChangedKeys(keys) => defer(Blocking::PersistKeys(keys)),
            Done::Changed => match req.effect() {
                Effect::Server => defer(Blocking::SyncAll),
                // A read or nothing changes no item; should a command say otherwise, its
                // keys are persisted as any change's.
                Effect::Read
                | Effect::Touch
                | Effect::Write
                | Effect::Overwrite
                | Effect::Nothing => {
                    let mut keys = Vec::new();
                    req.keys().for_each(|k| keys.push(k.to_vec()));
                    match keys.len() {
                        0 => Flow::Done,
                        1 => defer(Blocking::Persist(keys.remove(0))),
                        _ => defer(Blocking::PersistKeys(keys)),
                    }
                }
            },
            Done::Flow(flow) => flow,
        }
    }

    /// The step before a command on a durable cache: every key whose current item the
    /// command depends on ([`Request::effect`]) is read through from disk first (`Some`: the
    /// request waits for it, or fails if the cache cannot hold the item).
    #[inline]
    fn read_through(
        &self,
        req: &Request<'_>,
        out: &mut Vec<u8>,
        loaded: &[ReadThrough],
    ) -> Option<Flow> {
        if !self.disk.read_through {
            return None;
        }
        match self.needs_load(req, loaded)? {
            (key, Need::Load) => Some(defer(Blocking::Load(ReadThrough::new(&key)))),
            (_, _) => Some(unloadable(req, out)),
        }
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
        let mut conn = self.handed_off.take();
        if let Some(c) = &mut conn {
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
mod tests;
