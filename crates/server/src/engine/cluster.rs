//! A cluster node's side of the engine: the ownership check around each request, the
//! node's own `cluster` commands, and the import streams served on threads of their own.

use std::sync::Arc;

use kvlab_cluster::{Import, Node, Verdict};
use kvlab_protocol::response as r;
use kvlab_protocol::{MetaCommand, Request};

use kvlab_cluster::Gate;

use super::{defer, Blocking, Engine, Flow, Loaded, WorkerStats};

impl Engine {
    /// Serves the stream a `cluster import ID` connection was handed off as, on a thread
    /// of its own: its requests never wait behind a client's, and a client's write waiting
    /// for its copies never waits on a thread that serves such a stream.
    pub(super) fn serve_import(
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
    pub(super) fn call_in_cluster(
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
            // loop's writes at a time), or as `SERVER_ERROR` if one did not; under write
            // policy `owner` at once, its copies following.
            for_each_key(req, |key| keys.push(key.to_vec()));
            return defer(if gate.copies_behind() {
                Blocking::Behind(keys)
            } else {
                Blocking::Replicate(keys)
            });
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
