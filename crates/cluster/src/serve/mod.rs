//! A cluster node's service: the cache server's [`Engine`] wrapped by the node's ownership
//! gate, its `cluster` commands, its import streams and its write-through copies — a
//! decorator of the cache's [`kvlab_net::Service`], so the cache server knows nothing of the
//! cluster.
//!
//! ```text
//!  request ──► Engine::begin (bookkeeping, -Y) ──► cluster command? ──► the node's answer
//!                                               ──► import stream? ──► Engine::apply
//!                                               ──► Gate: serve / MOVED / TRYAGAIN
//!                                                      └─► Engine::apply ──► a write's copies
//!                                                          (NodeWork::Replicate / Behind), a
//!                                                          read of an unconfirmed key's
//!                                                          (NodeWork::Reconfirm)
//! ```
//!
//! [`serve`] starts a `kvlab server` as a node: the server's state with a [`Node`] started
//! over its store, served by [`NodeApp`].

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use kvlab_net::{Flow, Order, Service};
use kvlab_protocol::response as r;
use kvlab_protocol::Request;
use kvlab_server::engine::{Blocking, Engine, Loaded};
use kvlab_server::stats::WorkerStats;
use kvlab_server::{Server, ServerConfig, ServerState};

use crate::node::{Gate, Import, Node, Verdict};
use crate::OpenStore;

mod work;

pub use work::{NodeWork, NodeWorker};

/// How a server joins a cluster.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// The topology store (`file:PATH` or a path; `etcd://…` where `open` knows etcd).
    pub topology: String,
    /// What opens `topology`: [`crate::open_store`] (files), or the binary's
    /// `kvlab_etcd::open_store` (files and etcd).
    pub open: OpenStore,
    /// This node's name in the topology (`--cluster-node`); `None`: the listen address.
    pub node: Option<String>,
}

/// Starts `kvlab server` as a node of the cluster `cluster` names: the server of `config`,
/// whose engines serve through the node's gate ([`NodeApp`]). The node stops first when the
/// server stops.
pub fn serve(config: ServerConfig, cluster: ClusterConfig) -> io::Result<Server> {
    let mut node = None;
    let mut server = Server::start_with(config, |shared, addr| {
        let me = cluster.node.clone().unwrap_or_else(|| addr.to_string());
        let topology = (cluster.open)(&cluster.topology)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let started = Node::start(me, shared.store.clone(), topology)
            .map_err(|e| io::Error::other(e.to_string()))?;
        node = Some(started.clone());
        Ok(Arc::new(NodeApp {
            shared: shared.clone(),
            node: started,
        }))
    })?;
    if let Some(node) = node {
        server.on_stop(move || node.stop());
    }
    Ok(server)
}

/// What a cluster node's driver serves: the cache server's state, each engine wrapped in
/// the node's gate.
pub struct NodeApp {
    shared: Arc<ServerState>,
    node: Arc<Node>,
}

impl kvlab_net::App for NodeApp {
    type Service = NodeEngine;

    fn service(&self, index: usize) -> NodeEngine {
        NodeEngine::new(self.shared.service(index), &self.node)
    }

    fn helper(&self, index: usize) -> NodeWorker {
        NodeWorker::new(self.shared.helper(index), self.node.clone())
    }

    fn admit(&self, peer: SocketAddr) -> bool {
        self.shared.admit(peer)
    }

    fn release(&self) {
        self.shared.release();
    }

    fn idle_kick(&self) {
        self.shared.idle_kick();
    }

    fn stopping(&self) -> bool {
        self.shared.stopping()
    }
}

/// A connection to a node: the cache's connection state, and whether it is an import
/// stream.
#[derive(Default)]
pub struct NodeConn {
    cache: Loaded,
    /// Said `cluster import ID`: items from their previous owner in migration `ID` (0:
    /// copies of an owner's keys), stored without the ownership check.
    import: Option<Import>,
}

/// A node's service for one worker: the cache engine behind the node's gate.
pub struct NodeEngine {
    engine: Engine,
    gate: Gate,
    worker: NodeWorker,
    /// `cluster import ID`: the connection is handed to a thread of its own, which serves
    /// it as that stream.
    import_handoff: Option<Import>,
    /// This engine serves one such stream (set on its connection when it opens).
    importing: Option<Import>,
}

/// What a node's request does after [`Service::call`].
type NodeFlow = Flow<NodeWork>;

/// The engine's flow, its disk work wrapped as the node's.
fn wrap(flow: Flow<Blocking>) -> NodeFlow {
    match flow {
        Flow::Done => Flow::Done,
        Flow::Close => Flow::Close,
        Flow::HandOff => Flow::HandOff,
        Flow::Defer(work, order) => Flow::Defer(NodeWork::Cache(work), order),
    }
}

/// Defers a write's or a read's copies: later requests of the connection run meanwhile
/// (the write is already applied here), so a pipelining client's writes reach the copy
/// holders together.
fn defer(work: NodeWork) -> NodeFlow {
    Flow::Defer(work, Order::Pipelined)
}

impl NodeEngine {
    /// `engine` as a worker of `node`: every keyed request is checked against the node's
    /// ring first.
    pub fn new(engine: Engine, node: &Arc<Node>) -> NodeEngine {
        let worker = NodeWorker::new(
            kvlab_server::engine::Helper::new(engine.store.clone()),
            node.clone(),
        );
        NodeEngine {
            engine,
            gate: node.gate(),
            worker,
            import_handoff: None,
            importing: None,
        }
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
        let e = &self.engine;
        let engine = Engine::new(e.store.clone(), e.server.clone(), e.worker.clone());
        let mut engine = NodeEngine::new(engine, self.gate.node());
        engine.importing = Some(stream);
        let limits = kvlab_protocol::Limits {
            item_size_max: e.server.item_size_max,
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

    /// A request from a migration or copy stream: no ownership check, but only while that
    /// migration may still be under way here; a stream of one rolled back or ended would
    /// leave keys behind the cleanup that follows it.
    fn imported(
        &mut self,
        cache: &mut Loaded,
        stream: &Import,
        req: &Request<'_>,
        out: &mut Vec<u8>,
    ) -> NodeFlow {
        let gate = &mut self.gate;
        gate.begin();
        if let Err(refusal) = gate.imports(stream) {
            gate.end();
            if !req.noreply() {
                out.extend_from_slice(refusal);
            }
            return Flow::Done;
        }
        if stream.id == 0 {
            // A copy never overwrites the owner's own item: a node that owns the key now
            // (its view is ahead of the sender's, which still took itself for the owner)
            // holds the newer state.
            let mut owned = false;
            req.keys().for_each(|key| {
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
        let flow = match self.engine.apply(req, out, cache.keys()) {
            // A migration's items are made durable together when its source says
            // `drained` (before that is acknowledged: see `cluster_command`), not one
            // fsync each: until then the source keeps them, and a stream lost in the
            // hand-off is sent again whole.
            Flow::Defer(Blocking::Persist(_), _)
                if (1..crate::node::HANDOVER).contains(&stream.id) =>
            {
                Flow::Done
            }
            flow => flow,
        };
        self.gate.end();
        flow_after(&mut self.engine, cache, flow)
    }

    /// A client's request: the ownership check around [`Engine::apply`], and the copies a
    /// write (or a read of an unconfirmed key) needs.
    fn owned(&mut self, cache: &mut Loaded, req: &Request<'_>, out: &mut Vec<u8>) -> NodeFlow {
        let writes = req.effect().may_change_items();
        let gate = &mut self.gate;
        gate.begin();
        let mut leaving = false;
        let mut redirect = None;
        req.keys().for_each(|key| match gate.check(key) {
            Verdict::Serve { leaving: l } => leaving |= l,
            Verdict::Redirect(r) => {
                redirect.get_or_insert(r);
            }
        });
        if redirect.is_none() && !gate.may_write() && writes {
            // Cut off from the topology store for longer than its lease: the others may
            // have taken this node's keys over; a write here could be lost.
            redirect = Some(crate::Redirect::TryAgain {
                epoch: gate.epoch(),
            });
        }
        if let Some(r) = redirect {
            gate.end();
            WorkerStats::add(&self.engine.worker.cluster_redirects, 1);
            r.write(out);
            return Flow::Done;
        }
        let replicated = gate.replicated();
        if replicated && writes {
            // Unconfirmed from before it is applied: a read meanwhile waits for its copies.
            let unconfirmed = gate.node().unconfirmed();
            req.keys().for_each(|key| unconfirmed.write_begins(key));
        }
        let flow = self.engine.apply(req, out, cache.keys());
        let gate = &mut self.gate;
        if leaving && writes {
            req.keys().for_each(|key| gate.changed(key));
        }
        gate.end();
        let flow = flow_after(&mut self.engine, cache, flow);
        if !replicated {
            return flow;
        }
        let unconfirmed = gate.node().unconfirmed();
        let mut keys = Vec::new();
        if writes {
            if let Flow::Defer(NodeWork::Cache(persist), order) = &flow {
                if !persist.reruns_request() {
                    // Applied, and persisted before its reply (`--durability sync`): its
                    // copies follow the persist (and the reply, under write policy `owner`).
                    req.keys().for_each(|key| keys.push(key.to_vec()));
                    let behind = gate.copies_behind();
                    return Flow::Defer(NodeWork::Durable(persist.clone(), keys, behind), *order);
                }
            }
            if !matches!(flow, Flow::Done) {
                req.keys()
                    .for_each(|key| unconfirmed.settle(key, true, None));
                return flow;
            }
            // The reply leaves once every copy holder confirmed the write (a batch of the
            // loop's writes at a time), or as `SERVER_ERROR` if one did not; under write
            // policy `owner` at once, its copies following.
            req.keys().for_each(|key| keys.push(key.to_vec()));
            return defer(if gate.copies_behind() {
                NodeWork::Behind(keys)
            } else {
                NodeWork::Replicate(keys)
            });
        }
        // A read of a key whose copies are unconfirmed: its reply leaves once the holders
        // have what it read.
        req.keys().for_each(|key| {
            if unconfirmed.contains(key) {
                keys.push(key.to_vec());
            }
        });
        if !keys.is_empty() && matches!(flow, Flow::Done) {
            return defer(NodeWork::Reconfirm(keys));
        }
        flow
    }
}

/// The engine's bookkeeping after an applied request, and its flow as the node's.
fn flow_after(engine: &mut Engine, conn: &mut Loaded, flow: Flow<Blocking>) -> NodeFlow {
    engine.end(conn, &flow);
    wrap(flow)
}

impl Service for NodeEngine {
    type Conn = NodeConn;
    type Work = NodeWork;

    fn call(
        &mut self,
        conn: &mut NodeConn,
        req: &Request<'_>,
        out: &mut Vec<u8>,
        rerun: bool,
    ) -> NodeFlow {
        if let Some(flow) = self.engine.begin(&mut conn.cache, req, out, rerun) {
            return wrap(flow);
        }
        if let Request::Cluster { args } = *req {
            if let Some(id) = cluster_command(self.gate.node(), conn, args, out) {
                // A copy or migration stream is served by a thread of its own from now on.
                self.import_handoff = Some(id);
                return Flow::HandOff;
            }
            return Flow::Done;
        }
        match &conn.import {
            Some(stream) => self.imported(&mut conn.cache, stream, req, out),
            None => self.owned(&mut conn.cache, req, out),
        }
    }

    fn worker(&mut self) -> &mut NodeWorker {
        &mut self.worker
    }

    fn protocol_error(&mut self, error: kvlab_protocol::ProtocolError) {
        self.engine.protocol_error(error);
    }

    fn error_reply(
        &mut self,
        conn: &mut NodeConn,
        error: kvlab_protocol::ProtocolError,
    ) -> Option<&'static [u8]> {
        self.engine.error_reply(&mut conn.cache, error)
    }

    fn drop_stale(
        &mut self,
        conn: &mut NodeConn,
        key: kvlab_protocol::MetaKey<'_>,
    ) -> Option<NodeWork> {
        self.engine
            .drop_stale(&mut conn.cache, key)
            .map(NodeWork::Cache)
    }

    fn record_service(&mut self, samples: &[u64]) {
        self.engine.record_service(samples);
    }

    fn timed(&self, req: &Request<'_>) -> bool {
        self.engine.timed(req)
    }

    fn record_wait(&mut self, polled: std::time::Instant) {
        self.engine.record_wait(polled);
    }

    fn opened(&mut self, conn: &mut NodeConn, fd: std::os::fd::RawFd, tls: bool) {
        self.engine.opened(&mut conn.cache, fd, tls);
        if let Some(stream) = &self.importing {
            // A stream handed over after its `cluster import` (and its authentication).
            conn.import = Some(stream.clone());
            conn.cache.trust();
        }
    }

    fn take_over(&mut self, socket: std::os::fd::OwnedFd, unsent: &[u8], unread: &[u8]) {
        match self.import_handoff.take() {
            Some(stream) => self.serve_import(stream, socket, unsent, unread),
            None => self.engine.take_over(socket, unsent, unread),
        }
    }

    fn yielded(&mut self) {
        self.engine.yielded();
    }

    fn bytes_read(&mut self, n: usize) {
        self.engine.bytes_read(n);
    }

    fn bytes_written(&mut self, n: usize) {
        self.engine.bytes_written(n);
    }
}

/// `cluster ring|status|import ID NODE [GEN]|drained ID NODE`. `Some(stream)`: the
/// connection is an import stream from now on (to be handed to a thread of its own).
fn cluster_command(
    node: &Arc<Node>,
    conn: &mut NodeConn,
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
                // Everything the stream carried is on disk before its end is known: the
                // source cleans its copies up only after the migration ends.
                if let Err(e) = node.sync_store() {
                    let e = e.to_string().replace(['\r', '\n'], " ");
                    out.extend_from_slice(format!("SERVER_ERROR sync: {e}\r\n").as_bytes());
                    return None;
                }
                node.drained_from(id, from);
                out.extend_from_slice(b"OK\r\n");
            }
            Err(_) => out.extend_from_slice(b"CLIENT_ERROR bad command line format\r\n"),
        },
        _ => out.extend_from_slice(b"CLIENT_ERROR bad command line format\r\n"),
    }
    None
}

#[cfg(test)]
mod gate_tests;
