//! The cache engine: applies parsed requests to the [`Store`] and composes the replies.
//!
//! One `Engine` belongs to one worker thread (it holds that worker's counters), so nothing
//! here takes a lock except the store's own shard locks.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use kvlab_protocol::response::{self as r, push_i64, push_u64};
use kvlab_protocol::{Admin, MetaCommand, MetaFlags, MetaKey, Request, StoreCommand, Watch};
use kvlab_store::{
    ArithRequest, ArithStatus, DeleteStatus, MetaDeleteOpts, MetaGetOpts, SetMode, SetRequest,
    SetStatus, Store,
};

use crate::admin::{self, Next};
use crate::auth::AuthFile;
use crate::cache::DiskRules;
pub use crate::cache::{Blocking, Helper};
use crate::slabs;
use crate::stats::{ServerStats, WorkerStats, VERSION};
use kvlab_cluster::{Gate, Import, Node, Verdict};

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
    /// The connection whose request runs speaks TLS.
    over_tls: bool,
    /// This worker's gate into the cluster, when the server is a cluster node.
    cluster: Option<Gate>,
    /// What deferred work runs with (the store, the cluster node).
    helper: Helper,
    /// `cluster import ID`: the connection is handed to a thread of its own, which serves
    /// it as that stream.
    import_handoff: Option<Import>,
    /// This engine serves one such stream (set on its connection when it opens).
    importing: Option<Import>,
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
            over_tls: false,
            cluster: None,
            helper: Helper::new(store_for_helper, None),
            import_handoff: None,
            importing: None,
        }
    }

    /// The same engine as a worker of cluster node `node`: every keyed request is checked
    /// against the node's ring first.
    pub fn in_cluster(mut self, node: &Arc<Node>) -> Self {
        self.cluster = Some(node.gate());
        self.helper.node = Some(node.clone());
        self
    }

    /// Serves the stream a `cluster import ID` connection was handed off as, on a thread
    /// of its own: its requests never wait behind a client's, and a client's write waiting
    /// for its copies never waits on a thread that serves such a stream.
    fn serve_import(
        &self,
        stream: Import,
        socket: std::os::fd::OwnedFd,
        unsent: &[u8],
        unread: &[u8],
    ) {
        let Some(node) = &self.helper.node else {
            return;
        };
        let mut engine = Engine::new(self.store.clone(), self.server.clone(), self.worker.clone())
            .in_cluster(node);
        engine.importing = Some(stream);
        let limits = kvlab_protocol::Limits {
            item_size_max: self.server.item_size_max,
            ..kvlab_protocol::Limits::default()
        };
        let (unsent, unread) = (unsent.to_vec(), unread.to_vec());
        let spawned = std::thread::Builder::new()
            .name("kvlab-import".into())
            .spawn(move || {
                kvlab_net::threaded::serve_taken_over(socket, &unsent, &unread, engine, limits)
            });
        if let Err(e) = spawned {
            tracing::warn!(%e, "cannot start a thread for a cluster stream");
        }
    }

    /// A cluster node's request: the ownership check around [`Engine::apply`], and the
    /// node's own `cluster` commands.
    fn call_in_cluster(
        &mut self,
        gate: &mut Gate,
        conn: &mut Loaded,
        req: &Request<'_>,
        out: &mut Vec<u8>,
    ) -> Flow {
        if let Request::Cluster { args } = *req {
            if let Some(id) = cluster_command(gate.node(), conn, args, out) {
                // A copy or migration stream is served by a thread of its own from now on.
                self.import_handoff = Some(id);
                return Flow::HandOff;
            }
            return Flow::Done;
        }
        if let Some(stream) = &conn.import {
            // A migration stream from the key's previous owner: no ownership check, but
            // only while that migration may still be under way here; a stream of one rolled
            // back or ended would leave keys behind the cleanup that follows it.
            gate.begin();
            if let Err(refusal) = gate.imports(stream) {
                gate.end();
                if !req.noreply() {
                    out.extend_from_slice(refusal);
                }
                return Flow::Done;
            }
            if stream.id == 0 {
                // A copy never overwrites the owner's own item: a node that owns the key
                // now (its view is ahead of the sender's, which still took itself for the
                // owner) holds the newer state.
                let mut owned = false;
                for_each_key(req, |key| {
                    owned |= matches!(gate.check(key), Verdict::Serve { .. });
                });
                if owned {
                    gate.end();
                    if !req.noreply() {
                        out.extend_from_slice(b"SERVER_ERROR this node owns the key\r\n");
                    }
                    return Flow::Done;
                }
            }
            let flow = self.apply(req, out, &conn.keys);
            gate.end();
            return flow;
        }
        gate.begin();
        let mut leaving = false;
        let mut redirect = None;
        for_each_key(req, |key| match gate.check(key) {
            Verdict::Serve { leaving: l } => leaving |= l,
            Verdict::Redirect(r) => {
                redirect.get_or_insert(r);
            }
        });
        if redirect.is_none() && !gate.may_write() && changes_data(req) {
            // Cut off from the topology store for longer than its lease: the others may
            // have taken this node's keys over; a write here could be lost.
            redirect = Some(kvlab_cluster::Redirect::TryAgain {
                epoch: gate.epoch(),
            });
        }
        if let Some(r) = redirect {
            gate.end();
            WorkerStats::add(&self.worker.cluster_redirects, 1);
            r.write(out);
            return Flow::Done;
        }
        let replicated = gate.replicated();
        let writes = changes_data(req);
        if replicated && writes {
            // Unconfirmed from before it is applied: a read meanwhile waits for its copies.
            let unconfirmed = gate.node().unconfirmed();
            for_each_key(req, |key| unconfirmed.write_begins(key));
        }
        let flow = self.apply(req, out, &conn.keys);
        if leaving && writes {
            for_each_key(req, |key| gate.changed(key));
        }
        gate.end();
        if !replicated {
            return flow;
        }
        let unconfirmed = gate.node().unconfirmed();
        let mut keys = Vec::new();
        if writes {
            if !matches!(flow, Flow::Done) {
                for_each_key(req, |key| unconfirmed.settle(key, true, None));
                return flow;
            }
            // The reply leaves once every copy holder confirmed the write (a batch of the
            // loop's writes at a time), or as `SERVER_ERROR` if one did not.
            for_each_key(req, |key| keys.push(key.to_vec()));
            return defer(Blocking::Replicate(keys));
        }
        // A read of a key whose copies are unconfirmed: its reply leaves once the holders
        // have what it read.
        for_each_key(req, |key| {
            if unconfirmed.contains(key) {
                keys.push(key.to_vec());
            }
        });
        if !keys.is_empty() && matches!(flow, Flow::Done) {
            return defer(Blocking::Reconfirm(keys));
        }
        flow
    }

    /// Applies one request and appends its reply (if any) to `out`. `loaded` lists the keys
    /// already read through for this request. Disk work comes back as [`Flow::Defer`]: the
    /// driver runs it inline or on a helper thread.
    pub fn execute(&mut self, req: &Request<'_>, out: &mut Vec<u8>, loaded: &[Vec<u8>]) -> Flow {
        self.apply(req, out, loaded)
    }

    /// Whether `key` must be read through before a command that depends on its current state.
    fn must_load(&self, key: &[u8], loaded: &[Vec<u8>]) -> bool {
        self.disk.must_load(&self.store, key, loaded)
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

    fn apply(&mut self, req: &Request<'_>, out: &mut Vec<u8>, loaded: &[Vec<u8>]) -> Flow {
        // Read through every key whose current state the command depends on.
        if self.disk.read_through {
            if let Some(key) = self.needs_load(req, loaded) {
                return defer(Blocking::Load(key));
            }
        }
        match *req {
            Request::Get { keys, cas } => {
                let mut n = 0;
                let detail = self.server.admin.detail.enabled();
                for key in keys.iter() {
                    n += 1;
                    let item = self.store.get(key);
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
            Request::Meta {
                command,
                key,
                flags,
                data,
            } => {
                WorkerStats::add(&self.worker.cmd_meta, 1);
                if self.meta(command, key, &flags, data, out) {
                    return key.with(|k| self.persisted(k));
                }
            }
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
            Some(b"latency") => {
                for (name, value) in self.server.latency() {
                    r::stat(out, &name, value);
                }
            }
            Some(b"conns") => {
                r::stat(
                    out,
                    "curr_connections",
                    self.server.curr_connections.load(Relaxed),
                );
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

    /// Runs a meta command; returns whether it changed the key (to persist under `sync`).
    fn meta(
        &mut self,
        command: MetaCommand,
        key: MetaKey<'_>,
        flags: &MetaFlags<'_>,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> bool {
        match command {
            MetaCommand::Noop => out.extend_from_slice(r::MN),
            MetaCommand::Get => return self.meta_get(key, flags, out),
            MetaCommand::Set => return self.meta_set(key, flags, data, out),
            MetaCommand::Delete => return self.meta_delete(key, flags, out),
            MetaCommand::Arith => return self.meta_arith(key, flags, out),
            MetaCommand::Debug => self.meta_debug(key, out),
        }
        false
    }

    /// The first key of `req` that must be read through from disk first, if any.
    fn needs_load(&self, req: &Request<'_>, loaded: &[Vec<u8>]) -> Option<Vec<u8>> {
        let first = |keys: &mut dyn Iterator<Item = &[u8]>| {
            for k in keys {
                if self.must_load(k, loaded) {
                    return Some(k.to_vec());
                }
            }
            None
        };
        match *req {
            Request::Get { keys, .. } | Request::Gat { keys, .. } => first(&mut keys.iter()),
            // A plain set overwrites whatever is on disk: no need to read it first.
            Request::Store {
                command: StoreCommand::Set,
                ..
            } => None,
            Request::Store { key, .. }
            | Request::Arith { key, .. }
            | Request::Delete { key, .. }
            | Request::Touch { key, .. } => first(&mut std::iter::once(key)),
            Request::Meta {
                command: MetaCommand::Noop,
                ..
            } => None,
            Request::Meta {
                command: MetaCommand::Set,
                ref flags,
                ..
            } if matches!(flags.mode, None | Some(b'S'))
                && flags.compare_cas.is_none()
                && !flags.invalidate =>
            {
                None
            }
            Request::Meta { key, .. } => key.with(|k| first(&mut std::iter::once(k))),
            _ => None,
        }
    }

    /// Returns whether it changed the key: a new TTL (`T`) on a hit. (An item created
    /// by `N` is a placeholder, and win tokens are not kept on disk.)
    fn meta_get(&mut self, key: MetaKey<'_>, flags: &MetaFlags<'_>, out: &mut Vec<u8>) -> bool {
        WorkerStats::add(&self.worker.cmd_get, 1);
        if flags.ttl.is_some() {
            WorkerStats::add(&self.worker.cmd_touch, 1);
        }
        let opts = MetaGetOpts {
            touch: flags.ttl,
            vivify: flags.vivify,
            recache: flags.recache,
            no_bump: flags.no_bump,
        };
        let hit = key.with(|k| self.store.meta_get(k, &opts));
        key.with(|k| self.log_fetch(k, hit.as_ref().map(|h| (h.item.value.len(), h.item.flags))));
        let Some(hit) = hit else {
            if !flags.quiet {
                out.extend_from_slice(b"EN");
                echo_flags(out, key, flags, 0);
                out.extend_from_slice(b"\r\n");
            }
            return false;
        };
        let value = &hit.item.value;
        if flags.has(b'v') {
            out.extend_from_slice(b"VA ");
            push_u64(out, value.len() as u64);
        } else {
            out.extend_from_slice(b"HD");
        }
        for letter in flags.letters() {
            match letter {
                b'c' => meta_num(out, b'c', self.shown(hit.item.cas)),
                b'f' => meta_num(out, b'f', u64::from(hit.item.flags)),
                b'h' => meta_num(out, b'h', u64::from(hit.hit_before)),
                b'l' => meta_num(out, b'l', hit.last_access_age),
                b's' => meta_num(out, b's', value.len() as u64),
                b't' => {
                    out.extend_from_slice(b" t");
                    push_i64(out, hit.ttl);
                }
                b'k' | b'O' => echo_one(out, letter, key, flags),
                _ => {}
            }
        }
        if key.is_base64() && flags.has(b'k') {
            out.extend_from_slice(b" b");
        }
        if hit.win_already_sent {
            out.extend_from_slice(b" Z");
        }
        if hit.stale {
            out.extend_from_slice(b" X");
        }
        if hit.won {
            out.extend_from_slice(b" W");
        }
        out.extend_from_slice(b"\r\n");
        if flags.has(b'v') {
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
        flags.ttl.is_some()
    }

    fn meta_set(
        &mut self,
        key: MetaKey<'_>,
        flags: &MetaFlags<'_>,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> bool {
        WorkerStats::add(&self.worker.cmd_set, 1);
        let mode = match flags.mode {
            None | Some(b'S') => SetMode::Set,
            Some(b'E') => SetMode::Add,
            Some(b'A') => SetMode::Append,
            Some(b'P') => SetMode::Prepend,
            _ => SetMode::Replace,
        };
        let status = key.with(|k| {
            let mut req = SetRequest {
                mode,
                key: k,
                value: data,
                flags: flags.client_flags.unwrap_or(0),
                exptime: flags.ttl.unwrap_or(0),
                compare_cas: flags.compare_cas.map(|c| self.compared(c)),
                new_cas: flags.new_cas,
                invalidate: flags.invalidate,
            };
            let status = self.store.set(&req);
            let cmd: &[u8] = match (mode, req.compare_cas) {
                (SetMode::Set, Some(_)) => b"cas",
                (SetMode::Set, None) => b"set",
                (SetMode::Add, _) => b"add",
                (SetMode::Replace, _) => b"replace",
                (SetMode::Append, _) => b"append",
                (SetMode::Prepend, _) => b"prepend",
            };
            self.log_store(k, status, cmd, req.exptime, data.len(), req.flags);
            // `N` with append/prepend: create the item when it is missing (autovivify).
            if status == SetStatus::NotStored
                && matches!(mode, SetMode::Append | SetMode::Prepend)
                && flags.vivify.is_some()
            {
                req.mode = SetMode::Add;
                req.exptime = flags.vivify.unwrap_or(0);
                return self.store.set(&req);
            }
            status
        });
        let (code, cas): (&[u8], u64) = match status {
            SetStatus::Stored { cas } => (b"HD", cas),
            SetStatus::NotStored => (b"NS", 0),
            SetStatus::Exists => (b"EX", 0),
            SetStatus::NotFound => (b"NF", 0),
            SetStatus::TooLarge => {
                out.extend_from_slice(r::TOO_LARGE);
                return false;
            }
            SetStatus::OutOfMemory => {
                out.extend_from_slice(r::OUT_OF_MEMORY);
                return false;
            }
        };
        let stored = code == b"HD";
        if !(flags.quiet && stored) {
            out.extend_from_slice(code);
            echo_flags(out, key, flags, cas);
            out.extend_from_slice(b"\r\n");
        }
        stored
    }

    fn meta_delete(&mut self, key: MetaKey<'_>, flags: &MetaFlags<'_>, out: &mut Vec<u8>) -> bool {
        let opts = MetaDeleteOpts {
            compare_cas: flags.compare_cas.map(|c| self.compared(c)),
            invalidate: flags.invalidate,
            ttl: flags.ttl,
        };
        let code: &[u8] = match key.with(|k| self.store.meta_delete(k, &opts)) {
            DeleteStatus::Deleted if flags.quiet => return true,
            DeleteStatus::Deleted => b"HD",
            DeleteStatus::NotFound => b"NF",
            DeleteStatus::Exists => b"EX",
        };
        out.extend_from_slice(code);
        echo_flags(out, key, flags, 0);
        out.extend_from_slice(b"\r\n");
        code == b"HD"
    }

    fn meta_arith(&mut self, key: MetaKey<'_>, flags: &MetaFlags<'_>, out: &mut Vec<u8>) -> bool {
        let req = ArithRequest {
            incr: !matches!(flags.mode, Some(b'D' | b'-')),
            delta: flags.delta.unwrap_or(1),
            compare_cas: flags.compare_cas.map(|c| self.compared(c)),
            new_cas: flags.new_cas,
            vivify: flags.vivify.map(|ttl| (flags.initial.unwrap_or(0), ttl)),
            touch: flags.ttl,
        };
        let (value, cas, ttl) = match key.with(|k| self.store.arith(k, &req)) {
            ArithStatus::Ok { value, cas, ttl } => (value, cas, ttl),
            status @ (ArithStatus::NotFound | ArithStatus::Exists) => {
                let code: &[u8] = if status == ArithStatus::Exists {
                    b"EX"
                } else {
                    b"NF"
                };
                out.extend_from_slice(code);
                echo_flags(out, key, flags, 0);
                out.extend_from_slice(b"\r\n");
                return false;
            }
            ArithStatus::NonNumeric => {
                out.extend_from_slice(r::NON_NUMERIC);
                return false;
            }
            ArithStatus::OutOfMemory => {
                out.extend_from_slice(r::ARITH_OUT_OF_MEMORY);
                return false;
            }
        };
        let mut digits = itoa::Buffer::new();
        let digits = digits.format(value).as_bytes();
        if flags.has(b'v') {
            out.extend_from_slice(b"VA ");
            push_u64(out, digits.len() as u64);
        } else if flags.quiet {
            return true;
        } else {
            out.extend_from_slice(b"HD");
        }
        for letter in flags.letters() {
            match letter {
                b'c' => meta_num(out, b'c', self.shown(cas)),
                b't' => {
                    out.extend_from_slice(b" t");
                    push_i64(out, ttl);
                }
                b'k' | b'O' => echo_one(out, letter, key, flags),
                _ => {}
            }
        }
        out.extend_from_slice(b"\r\n");
        if flags.has(b'v') {
            out.extend_from_slice(digits);
            out.extend_from_slice(b"\r\n");
        }
        true
    }

    fn meta_debug(&mut self, key: MetaKey<'_>, out: &mut Vec<u8>) {
        let Some(hit) = key.with(|k| self.store.peek(k)) else {
            return out.extend_from_slice(b"EN\r\n");
        };
        out.extend_from_slice(b"ME ");
        out.extend_from_slice(key.raw());
        out.extend_from_slice(b" exp=");
        push_i64(out, hit.ttl);
        out.extend_from_slice(b" la=");
        push_u64(out, hit.last_access_age);
        out.extend_from_slice(b" cas=");
        push_u64(out, hit.item.cas);
        out.extend_from_slice(if hit.hit_before {
            b" fetch=yes"
        } else {
            b" fetch=no"
        });
        out.extend_from_slice(b" cls=1 size=");
        push_u64(out, (key.raw().len() + hit.item.value.len()) as u64);
        out.extend_from_slice(b"\r\n");
    }
}

fn meta_num(out: &mut Vec<u8>, letter: u8, n: u64) {
    out.push(b' ');
    out.push(letter);
    push_u64(out, n);
}

/// Echoes `k` (key) or `O` (opaque) as memcached does.
fn echo_one(out: &mut Vec<u8>, letter: u8, key: MetaKey<'_>, flags: &MetaFlags<'_>) {
    match letter {
        b'k' => {
            out.extend_from_slice(b" k");
            out.extend_from_slice(key.raw());
        }
        b'O' => {
            out.extend_from_slice(b" O");
            out.extend_from_slice(flags.opaque.unwrap_or_default());
        }
        _ => {}
    }
}

/// The flags every meta reply echoes in request order: `O`, `k` (then `b` for a base64
/// key), and `c` with the item's CAS where the reply has one.
fn echo_flags(out: &mut Vec<u8>, key: MetaKey<'_>, flags: &MetaFlags<'_>, cas: u64) {
    for letter in flags.letters() {
        match letter {
            b'k' | b'O' => echo_one(out, letter, key, flags),
            b'c' if cas != 0 => meta_num(out, b'c', cas),
            _ => {}
        }
    }
    if key.is_base64() && flags.has(b'k') {
        out.extend_from_slice(b" b");
    }
}

const UNAUTHENTICATED: &[u8] = b"CLIENT_ERROR unauthenticated\r\n";

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
/// re-runs), whether it is a cluster migration stream, its socket, whether it has
/// authenticated (`-Y`) and whether it speaks TLS (`-Z`).
#[derive(Default)]
pub struct Loaded {
    keys: Vec<Vec<u8>>,
    /// Said `cluster import ID`: items from their previous owner in migration `ID` (0:
    /// copies of an owner's keys), stored without the ownership check.
    import: Option<Import>,
    /// Its socket (for `watch` lines' `cfd=`).
    fd: i32,
    /// It has authenticated (`-Y`).
    authenticated: bool,
    /// It speaks TLS (`-Z`).
    tls: bool,
}

/// Calls `f` with every key `req` names.
fn for_each_key(req: &Request<'_>, mut f: impl FnMut(&[u8])) {
    match *req {
        Request::Get { keys, .. } | Request::Gat { keys, .. } => keys.iter().for_each(f),
        Request::Store { key, .. }
        | Request::Arith { key, .. }
        | Request::Delete { key, .. }
        | Request::Touch { key, .. } => f(key),
        Request::Meta { command, key, .. } if command != MetaCommand::Noop => key.with(f),
        _ => {}
    }
}

/// Whether `req` may change the item of a key it names (a touch counts: it changes the
/// expiry that a migration must carry).
fn changes_data(req: &Request<'_>) -> bool {
    match *req {
        Request::Get { .. } => false,
        Request::Meta { command, flags, .. } => match command {
            MetaCommand::Get => flags.has(b'T') || flags.has(b'N') || flags.has(b'E'),
            MetaCommand::Debug | MetaCommand::Noop => false,
            _ => true,
        },
        _ => true,
    }
}

/// `cluster ring|status|import ID NODE [GEN]|drained ID NODE`. `Some(stream)`: the
/// connection is an import stream from now on (to be handed to a thread of its own).
fn cluster_command(
    node: &Arc<Node>,
    conn: &mut Loaded,
    args: &[u8],
    out: &mut Vec<u8>,
) -> Option<Import> {
    let text = String::from_utf8_lossy(args);
    let words: Vec<&str> = text.split_ascii_whitespace().collect();
    let value = |out: &mut Vec<u8>, name: &[u8], data: &[u8]| {
        r::value(out, name, 0, data, None);
        out.extend_from_slice(r::END);
    };
    match words.as_slice() {
        ["ring"] => value(out, b"ring", node.view().serving.describe().as_bytes()),
        ["status"] => value(out, b"status", node.status_json().as_bytes()),
        ["import", id, from, gen @ ..]
            if gen.len() <= 1
                && id.parse::<u64>().is_ok()
                && gen.iter().all(|g| g.parse::<u64>().is_ok()) =>
        {
            let gen = gen.first().map_or(0, |g| g.parse().unwrap_or(0));
            let stream = node.open_import(id.parse().unwrap_or(0), from, gen);
            out.extend_from_slice(b"OK\r\n");
            // A migration stream is served by a thread of its own; copies (ID 0) are
            // served here, in the worker's loop, as they arrive: applying one never waits.
            if conn.import.is_none() && stream.id != 0 {
                return Some(stream);
            }
            conn.import = Some(stream);
        }
        ["resync", peer, what @ ("held" | "strays")] => {
            node.resync_to(peer, *what == "strays");
            out.extend_from_slice(b"OK\r\n");
        }
        ["resynced", peer] => {
            node.resynced_from(peer);
            out.extend_from_slice(b"OK\r\n");
        }
        ["drained", id, from] => match id.parse::<u64>() {
            Ok(id) => {
                node.drained_from(id, from);
                out.extend_from_slice(b"OK\r\n");
            }
            Err(_) => out.extend_from_slice(b"CLIENT_ERROR bad command line format\r\n"),
        },
        _ => out.extend_from_slice(b"CLIENT_ERROR bad command line format\r\n"),
    }
    None
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
        if !rerun {
            loaded.keys.clear();
        }
        self.cfd = loaded.fd;
        self.over_tls = loaded.tls;
        if !loaded.authenticated {
            if let Some(auth) = &self.server.admin.auth {
                loaded.authenticated = authenticate(auth, &self.worker, req, out);
                return Flow::Done;
            }
        }
        let flow = match self.cluster.take() {
            Some(mut gate) => {
                let flow = self.call_in_cluster(&mut gate, loaded, req, out);
                self.cluster = Some(gate);
                flow
            }
            None => self.apply(req, out, &loaded.keys),
        };
        if let Flow::Defer(Blocking::Load(key), _) = &flow {
            // Runs again once `key` is in the cache: don't defer for it a second time.
            loaded.keys.push(key.clone());
        }
        flow
    }

    fn opened(&mut self, conn: &mut Loaded, fd: std::os::fd::RawFd, tls: bool) {
        conn.fd = fd;
        conn.tls = tls;
        if let Some(stream) = &self.importing {
            // A stream handed over after its `cluster import` (and its authentication).
            conn.import = Some(stream.clone());
            conn.authenticated = true;
        }
    }

    fn take_over(&mut self, socket: std::os::fd::OwnedFd, unsent: &[u8], unread: &[u8]) {
        if let Some(stream) = self.import_handoff.take() {
            self.serve_import(stream, socket, unsent, unread);
            return;
        }
        let streams = std::mem::take(&mut self.watch);
        if let Err(e) = self.server.admin.watchers.add(socket, streams, unsent) {
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
        assert_eq!(work, Blocking::Load(b"k".to_vec()));
        assert!(s.take_work().is_none());
        s.complete(id, work.run(&mut e.helper.clone()));
        s.process(&mut e);
        assert_eq!(take(&mut s), "VALUE k 0 1\r\nv\r\nEND\r\n".repeat(2));
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
