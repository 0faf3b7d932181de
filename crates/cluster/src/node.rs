//! A cluster node: what a server started with `--cluster` consults for every request, the
//! thread that follows the topology, and the node's side of a migration.
//!
//! ```text
//!  topology store ──poll 20 ms──► watcher thread ──► View (epoch, serving ring, migration)
//!                                     │                  │ ArcSwap, read per request
//!                                     │                  ▼
//!                                     │      engine workers: Gate::check(key) ─► serve │ MOVED │ TRYAGAIN
//!                                     │                  │ a write to a key that is leaving ─► change log
//!                                     ▼                  ▼
//!                                copier thread: snapshot of the leaving keys ─► new owners
//!                                               (`cluster import` connections), then the
//!                                               change log, until the hand-off: grace, last
//!                                               drain, `cluster drained` to every new owner
//! ```
//!
//! The hand-off needs no write lock: when the watcher installs the hand-off ring, every
//! worker that may still be running a request under the copy ring finishes it first (each
//! worker publishes the epoch of the request it is running; the watcher waits until none
//! runs an older one), so every write to a leaving key is either in the change log before
//! the last drain or redirected. A new owner serves a moved key only after the node it came
//! from said `drained` on the same connection that carried the key's data.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use kvlab_client::{Redirect, Ring};
use kvlab_store::{DeleteStatus, MetaDeleteOpts, ScanCursor, Store};
use parking_lot::Mutex;
use serde::Serialize;

use crate::clock::now_ms;
use crate::copies::{Batch, Copies, Outcome, Reply, Unconfirmed};
pub use crate::copies::{REPLICA_BACKOFF, REPLICA_TIMEOUT};
use crate::pipe::Pipe;
use crate::topology::{Phase, Topology, TopologyStore};
use crate::ClusterError;

/// How often a node says it is alive (a store with leases, etcd).
pub const HEARTBEAT: Duration = Duration::from_secs(1);

/// The stream id of a resync (`cluster import RESYNC NODE`): items a peer holds for a node
/// catching up, taken only while it is.
pub const RESYNC: u64 = u64::MAX;

/// The stream id of a hand-over (`cluster import HANDOVER NODE`): items a node no longer
/// holds, sent as `add` to the nodes that hold their keys now before they go; taken any
/// time (a node that has the key keeps its own).
pub const HANDOVER: u64 = u64::MAX - 1;

/// How long a node catching up keeps asking a node out of the ring that does not answer
/// (a node that refuses the connection is not asked again).
const LEFT_PATIENCE: Duration = Duration::from_secs(5);

/// How long a migration stream waits for its new owner's replies.
const STREAM_TIMEOUT: Duration = Duration::from_secs(10);

/// What a node serves by in one epoch.
#[derive(Debug)]
pub struct View {
    /// The topology's epoch.
    pub epoch: u64,
    /// Who owns which key now.
    pub serving: Ring,
    /// Copies of every key (the topology's `replicas`).
    pub replicas: u32,
    /// The migration under way.
    pub migration: Option<MigrationView>,
}

/// A node's view of a migration.
#[derive(Debug)]
pub struct MigrationView {
    /// Its id.
    pub id: u64,
    /// Its phase.
    pub phase: Phase,
    /// Copy: the ring after it; hand-off: the ring before it.
    pub other: Ring,
    /// Hand-off: the nodes that finished sending this node its keys.
    pub drained: Vec<String>,
}

/// The answer for one key of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Serve it; `log`: a write to it must go to the change log (the key is leaving).
    Serve {
        /// The key is leaving this node in the migration under way.
        leaving: bool,
    },
    /// Answer with this redirect instead.
    Redirect(Redirect),
}

/// A migration's progress on this node (as `cluster status` shows it).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Progress {
    /// The migration this node last copied for (0: none).
    pub migration: u64,
    /// Its snapshot pass is complete.
    pub snapshot_done: bool,
    /// The migration whose hand-off this node finished (sent `drained` to every new
    /// owner).
    pub handed_off: u64,
    /// Items sent by the snapshot pass.
    pub keys_copied: u64,
    /// Changes sent from the change log (stores and deletes).
    pub changes_sent: u64,
    /// Value bytes sent.
    pub bytes_sent: u64,
    /// Replies other than success from new owners (items they refused).
    pub refused: u64,
    /// Milliseconds from the copy's start to the end of its snapshot.
    pub snapshot_ms: u64,
    /// Milliseconds the hand-off's grace period waited for older requests.
    pub grace_ms: u64,
    /// Items removed after a migration because this node no longer owns them.
    pub cleaned: u64,
    /// Writes whose copy could not be written to another node.
    pub replica_errors: u64,
    /// The newest epoch whose clean-up has handed every item this node no longer holds to
    /// the key's nodes (with copies; without, once it removed them).
    pub handover_epoch: u64,
    /// Items the clean-up under way still holds for nodes that did not take them yet.
    pub handover_pending: u64,
    /// A new owner the hand-off waits for (its stream failed; it is asked again), and why.
    pub waiting_for: Option<String>,
    /// Last error, if any.
    pub error: Option<String>,
}

/// An import stream (`cluster import ID FROM [GEN]`) as the receiving node knows it: a
/// source that reconnects after a failure opens a newer generation, which replaces the
/// older stream (see [`Gate::imports`]).
#[derive(Debug, Clone)]
pub struct Import {
    /// The migration (or [`RESYNC`], [`HANDOVER`], 0 for copies).
    pub id: u64,
    from: Arc<str>,
    gen: u64,
    newest: Arc<AtomicU64>,
}

/// A generation for a migration stream this process opens: larger than any an earlier run
/// of this node opened (it starts from the clock) and than any it opened before.
fn next_generation() -> u64 {
    static GENERATION: AtomicU64 = AtomicU64::new(0);
    GENERATION.fetch_max(now_ms() << 12, Ordering::Relaxed);
    GENERATION.fetch_add(1, Ordering::Relaxed) + 1
}

/// A cluster node's shared state: one per server, shared by its workers.
pub struct Node {
    me: String,
    store: Arc<Store>,
    topology: Box<dyn TopologyStore>,
    view: ArcSwap<View>,
    /// Serialises view replacements (the watcher, `drained` messages).
    view_write: Mutex<()>,
    /// Per worker: the epoch of the request it is running, 0 between requests.
    running: Mutex<Vec<Arc<AtomicU64>>>,
    /// Keys written while leaving, not yet sent to their new owners.
    changes: Mutex<HashSet<Vec<u8>>>,
    /// Per migration id, the nodes that said `drained` to this node.
    drained: Mutex<(u64, Vec<String>)>,
    progress: Mutex<Progress>,
    /// The copier's order to finish (the hand-off's grace period is over), by migration id.
    finish: AtomicU64,
    stop: AtomicBool,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// The write-through copies to the nodes that hold this node's keys' copies: a sender
    /// thread and stream per holder.
    copies: Copies,
    /// Ring nodes whose liveness has lapsed, since when (the healer's memory).
    missing: Mutex<HashMap<String, Instant>>,
    /// Restarted without its data while the ring still names it, with copies elsewhere:
    /// it serves no key until it has left the ring and been added back (see
    /// [`Node::rejoin`]).
    recovering: AtomicBool,
    /// The peers that finished a resync stream to this node.
    resynced: Mutex<Vec<String>>,
    /// The newest migration whose stream this node has taken items from. A new owner may
    /// take a migration's items before it has seen the migration begin (its view lags the
    /// source's); a cleanup of an older epoch, which would take those items for strays,
    /// stops when it sees one.
    newest_import: AtomicU64,
    /// Per source and migration, the newest generation of its import streams.
    streams: Mutex<HashMap<(String, u64), Arc<AtomicU64>>>,
    /// With leases: until when (unix ms) this node may accept writes — its liveness key
    /// outlives its last heartbeat by the lease's TTL; a node cut off from the store
    /// stops taking writes when others may take it for dead. `u64::MAX` without leases.
    writable_until: AtomicU64,
}

impl Node {
    /// Joins the cluster whose topology `topology` holds as node `me` (its address as the
    /// topology names it), serving `store`. Reads the topology once (it must exist) and
    /// starts the watcher thread.
    pub fn start(
        me: String,
        store: Arc<Store>,
        topology: Box<dyn TopologyStore>,
    ) -> Result<Arc<Node>, ClusterError> {
        let topo = topology
            .load()?
            .ok_or_else(|| ClusterError::Store(format!("no cluster in {}", topology.describe())))?;
        let node = Arc::new(Node {
            copies: Copies::new(me.clone(), store.clone()),
            me,
            store,
            topology,
            view: ArcSwap::from_pointee(View {
                epoch: 0,
                serving: Ring::new(0, 1, &[]),
                replicas: 1,
                migration: None,
            }),
            missing: Mutex::new(HashMap::new()),
            view_write: Mutex::new(()),
            running: Mutex::new(Vec::new()),
            changes: Mutex::new(HashSet::new()),
            drained: Mutex::new((0, Vec::new())),
            progress: Mutex::new(Progress::default()),
            finish: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            threads: Mutex::new(Vec::new()),
            writable_until: AtomicU64::new(u64::MAX),
            recovering: AtomicBool::new(false),
            resynced: Mutex::new(Vec::new()),
            newest_import: AtomicU64::new(0),
            streams: Mutex::new(HashMap::new()),
        });
        let named = topo.nodes.iter().any(|n| *n == node.me)
            || topo
                .migration
                .as_ref()
                .is_some_and(|m| m.to.iter().any(|n| *n == node.me));
        if named && topo.replicas > 1 && node.store.stats().curr_items == 0 {
            // Its keys' copies may live on other nodes: serving from an empty store would
            // answer misses for acknowledged writes.
            node.recovering.store(true, Ordering::Release);
            tracing::info!(
                "{} starts with an empty store while the ring names it: it serves once its \
                 peers have sent it their copies of its keys",
                node.me
            );
        }
        if node.topology.lease_ttl().is_some() {
            node.topology.heartbeat(&node.me)?;
            let ttl = node.topology.lease_ttl().unwrap_or_default();
            node.writable_until
                .store(now_ms() + ttl.as_millis() as u64, Ordering::Release);
        }
        node.apply(&topo);
        let n = node.clone();
        let h = std::thread::Builder::new()
            .name("kvlab-cluster".into())
            .spawn(move || n.watch())
            .map_err(|e| ClusterError::Store(e.to_string()))?;
        node.threads.lock().push(h);
        if node.recovering.load(Ordering::Acquire) {
            let n = node.clone();
            let h = std::thread::Builder::new()
                .name("kvlab-rejoin".into())
                .spawn(move || n.rejoin())
                .map_err(|e| ClusterError::Store(e.to_string()))?;
            node.threads.lock().push(h);
        }
        Ok(node)
    }

    /// This node's name.
    pub fn me(&self) -> &str {
        &self.me
    }

    /// The view in force.
    pub fn view(&self) -> Arc<View> {
        self.view.load_full()
    }

    /// A worker's handle (one per serving thread).
    pub fn gate(self: &Arc<Node>) -> Gate {
        let running = Arc::new(AtomicU64::new(0));
        self.running.lock().push(running.clone());
        Gate {
            node: self.clone(),
            running,
            view: self.view(),
        }
    }

    /// A node that starts with an empty store while the ring names it, with copies kept
    /// elsewhere (restarted after `kill -9`, or new in a cluster just created): before it
    /// serves any key it asks every other ring node to send it what they hold of the keys
    /// it owns or holds copies of (`cluster resync ME held`, then `… strays`: the peer
    /// streams those items with `add` — never over one already here — then `cluster
    /// resynced PEER`). A migration
    /// still copying is rolled back first (this node cannot send what it had); one in its
    /// hand-off goes on (see `hand_off_empty`). Meanwhile it answers `TRYAGAIN` for every
    /// key; peers that are down are asked again until they answer or leave the ring.
    fn rejoin(self: Arc<Node>) {
        let mut last_error = String::new();
        let mut note = |e: String| {
            if e != last_error {
                tracing::warn!("catching up: {e}");
                last_error = e;
            }
        };
        // First the copies the key's holders keep; then, for keys still missing, items
        // kept by nodes that no longer hold them (`add` never replaces the first) — the
        // ring's and those recent migrations took out of it, which may still hold items
        // they could not hand to this node while it was down.
        let mut left = HashSet::new();
        for strays in [false, true] {
            self.resynced.lock().clear();
            if !self.resync_round(strays, &mut left, &mut note) {
                return;
            }
        }
        self.recovering.store(false, Ordering::Release);
        tracing::warn!("{} caught up from its peers: it serves again", self.me);
    }

    /// One round of [`Node::rejoin`]: asks every other ring node for its items for this
    /// node (`strays`: those it no longer holds itself; then also the nodes migrations
    /// took out of the ring, gathered in `left`) until each has sent them. A node out of
    /// the ring that refuses the connection is gone (what it held went with it); one that
    /// does not answer at all is given up after [`LEFT_PATIENCE`]. False when the node
    /// stops first.
    fn resync_round(
        &self,
        strays: bool,
        left: &mut HashSet<String>,
        note: &mut dyn FnMut(String),
    ) -> bool {
        let what = if strays { "strays" } else { "held" };
        let mut given_up: HashSet<String> = HashSet::new();
        let mut failing: HashMap<String, Instant> = HashMap::new();
        while !self.stop.load(Ordering::Relaxed) {
            let v = self.view();
            if let Some(m) = &v.migration {
                left.extend(m.other.nodes().iter().cloned());
                left.extend(v.serving.nodes().iter().cloned());
                if m.phase == Phase::Copy {
                    if let Err(e) = crate::coordinator::abort(&*self.topology) {
                        note(format!("rolling back migration {}: {e}", m.id));
                    }
                }
                self.topology.wait(HEARTBEAT / 4);
                continue;
            }
            let ring = v.serving.nodes();
            let mut peers: Vec<String> = ring.iter().filter(|n| **n != self.me).cloned().collect();
            if strays {
                if let Ok(Some(t)) = self.topology.load() {
                    left.extend(t.leaving);
                }
                peers.extend(
                    left.iter()
                        .filter(|n| **n != self.me && !ring.contains(n) && !given_up.contains(*n))
                        .cloned(),
                );
            }
            let missing: Vec<String> = {
                let done = self.resynced.lock();
                peers.into_iter().filter(|n| !done.contains(n)).collect()
            };
            if missing.is_empty() {
                return true;
            }
            for peer in &missing {
                let asked = Pipe::connect(peer, STREAM_TIMEOUT).and_then(|mut p| {
                    p.line(format!("cluster resync {} {what}\r\n", self.me).as_bytes())?;
                    p.flush()
                });
                match asked {
                    Ok(_) => {
                        failing.remove(peer);
                    }
                    Err(e) if !ring.contains(peer) => {
                        let since = *failing.entry(peer.clone()).or_insert_with(Instant::now);
                        let gone = e.to_string().contains("refused");
                        if gone || since.elapsed() >= LEFT_PATIENCE {
                            note(format!("{peer} (out of the ring) is not asked: {e}"));
                            given_up.insert(peer.clone());
                        }
                    }
                    Err(e) => note(format!("{peer}: {e}")),
                }
            }
            // The peers' streams end with `cluster resynced`; wait for them a little.
            let t0 = Instant::now();
            while t0.elapsed() < HEARTBEAT / 5 && !self.stop.load(Ordering::Relaxed) {
                let done = self.resynced.lock();
                if missing
                    .iter()
                    .all(|p| done.contains(p) || given_up.contains(p))
                {
                    break;
                }
                drop(done);
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        false
    }

    /// Whether this node is catching up from its peers (see [`Node::rejoin`]).
    pub fn recovering(&self) -> bool {
        self.recovering.load(Ordering::Acquire)
    }

    /// `cluster resync NODE`: streams to `node` every item here of a key that `node` owns
    /// or holds a copy of under this node's view, on a thread of its own.
    pub fn resync_to(self: &Arc<Node>, node: &str, strays: bool) {
        let me = self.clone();
        let target = node.to_string();
        let spawned = std::thread::Builder::new()
            .name("kvlab-resync".into())
            .spawn(move || {
                if let Err(e) = me.send_resync(&target, strays) {
                    tracing::warn!("resync of {target}: {e}");
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("resync of {node}: {e}");
        }
    }

    fn send_resync(&self, target: &str, strays: bool) -> Result<(), ClusterError> {
        let view = self.view();
        let r = view.replicas as usize;
        let mut pipe = Pipe::connect(target, STREAM_TIMEOUT)?.import(RESYNC, &self.me)?;
        let mut cursor = ScanCursor::default();
        let mut items = Vec::with_capacity(512);
        let mut owners = Vec::with_capacity(r);
        loop {
            items.clear();
            let step = self
                .store
                .scan_matching(&mut cursor, 512, &mut items, |h, key| {
                    let _ = h;
                    view.serving.owners_of_hash(
                        kvlab_client::cluster::key_hash(key),
                        r,
                        &mut owners,
                    );
                    // Only what this node holds itself: a stray item (a key it no longer
                    // holds, kept until its nodes confirm they have it) may be older than
                    // the copy the key's holder sends, and `add` keeps whichever is first.
                    let nodes = view.serving.nodes();
                    owners.iter().any(|&i| nodes[i] == target)
                        && owners.iter().any(|&i| nodes[i] == self.me) != strays
                });
            for item in &items {
                pipe.add(item.key(), item.flags(), item.exptime(), item.value())?;
            }
            pipe.flush()?;
            if step.done || self.stop.load(Ordering::Relaxed) {
                break;
            }
        }
        pipe.line(format!("cluster resynced {}\r\n", self.me).as_bytes())?;
        pipe.flush()?;
        Ok(())
    }

    /// `cluster resynced PEER`: `peer` has sent this node everything it had for it.
    pub fn resynced_from(&self, peer: &str) {
        let mut done = self.resynced.lock();
        if !done.iter().any(|p| p == peer) {
            done.push(peer.to_string());
        }
    }

    /// The migration progress.
    pub fn progress(&self) -> Progress {
        let mut p = self.progress.lock().clone();
        p.replica_errors += self.copies.errors();
        p
    }

    /// `cluster status`: this node's view and progress, as JSON.
    pub fn status_json(&self) -> String {
        let v = self.view();
        let p = self.progress();
        let mig = v.migration.as_ref();
        let until = self.writable_until.load(Ordering::Relaxed);
        serde_json::json!({
            "node": self.me,
            "pid": std::process::id(),
            "writable": until == u64::MAX || now_ms() < until,
            "epoch": v.epoch,
            "nodes": v.serving.nodes(),
            "migration": mig.map(|m| m.id),
            "phase": mig.map(|m| m.phase),
            "drained_from": mig.map(|m| m.drained.clone()),
            "pending_changes": self.changes.lock().len(),
            "recovering": self.recovering.load(Ordering::Acquire),
            "progress": p,
            "items": self.store.stats().curr_items,
        })
        .to_string()
    }

    /// `cluster import ID FROM [GEN]`: the stream that connection now carries.
    pub fn open_import(&self, id: u64, from: &str, gen: u64) -> Import {
        let newest = if (1..HANDOVER).contains(&id) {
            let mut streams = self.streams.lock();
            streams.retain(|(_, m), _| *m + 64 > id); // older migrations' entries go
            let newest = streams.entry((from.to_string(), id)).or_default().clone();
            newest.fetch_max(gen, Ordering::AcqRel);
            newest
        } else {
            Arc::new(AtomicU64::new(0))
        };
        Import {
            id,
            from: from.into(),
            gen,
            newest,
        }
    }

    /// A new owner hears that `source` sent it everything for migration `id`.
    pub fn drained_from(&self, id: u64, source: &str) {
        {
            let mut d = self.drained.lock();
            if d.0 != id {
                *d = (id, Vec::new());
            }
            if !d.1.iter().any(|s| s == source) {
                d.1.push(source.to_string());
            }
        }
        let _g = self.view_write.lock();
        let v = self.view();
        if let Some(m) = &v.migration {
            if m.id == id {
                let view = self.view_of(v.epoch, &v.serving, v.replicas, m.phase, &m.other, id);
                self.view.store(Arc::new(view));
            }
        }
    }

    fn view_of(
        &self,
        epoch: u64,
        serving: &Ring,
        replicas: u32,
        phase: Phase,
        other: &Ring,
        id: u64,
    ) -> View {
        let d = self.drained.lock();
        View {
            epoch,
            serving: serving.clone(),
            replicas,
            migration: Some(MigrationView {
                id,
                phase,
                other: other.clone(),
                drained: if d.0 == id { d.1.clone() } else { Vec::new() },
            }),
        }
    }

    /// Stops the node's threads (the server is shutting down).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        self.copies.stop();
        let threads: Vec<_> = self.threads.lock().drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
    }

    fn watch(self: Arc<Node>) {
        let mut last_error = None;
        let mut beat = Instant::now() - Duration::from_secs(60);
        while !self.stop.load(Ordering::Relaxed) {
            if beat.elapsed() >= HEARTBEAT {
                beat = Instant::now();
                match self.topology.heartbeat(&self.me) {
                    Ok(()) => {
                        if let Some(ttl) = self.topology.lease_ttl() {
                            let until = now_ms() + ttl.as_millis() as u64;
                            self.writable_until.store(until, Ordering::Release);
                        }
                    }
                    Err(e) => tracing::warn!("heartbeat: {e}"),
                }
            }
            if beat.elapsed() < HEARTBEAT / 8 {
                self.heal();
                self.follow_holders();
            }
            self.topology.wait(HEARTBEAT / 2);
            match self.topology.load() {
                Ok(Some(t)) if t.epoch != self.view().epoch => self.apply(&t),
                Ok(_) => {}
                Err(e) => {
                    let e = e.to_string();
                    if last_error.as_ref() != Some(&e) {
                        tracing::warn!("topology: {e}");
                        last_error = Some(e);
                    }
                }
            }
        }
    }

    /// Installs the view of `t` and does what the change asks of this node.
    fn apply(self: &Arc<Node>, t: &Topology) {
        let serving = t.serving();
        let previous = self.view();
        let view = match (&t.migration, t.other()) {
            (Some(m), Some(other)) => {
                self.view_of(t.epoch, &serving, t.replicas, m.phase, &other, m.id)
            }
            _ => View {
                epoch: t.epoch,
                serving,
                replicas: t.replicas,
                migration: None,
            },
        };
        {
            let _g = self.view_write.lock();
            self.view.store(Arc::new(view));
        }
        let source = t.nodes.iter().any(|n| *n == self.me);
        match &t.migration {
            // A restarted node has nothing to copy: the migration is rolled back instead.
            Some(m)
                if m.phase == Phase::Copy && source && !self.recovering.load(Ordering::Acquire) =>
            {
                let started = previous.migration.as_ref().is_some_and(|p| p.id == m.id);
                if !started {
                    self.start_copier(m.id, t);
                }
            }
            Some(m) if m.phase == Phase::Handoff && source => {
                // Every request checked under an older ring finishes before the last drain.
                let t0 = Instant::now();
                self.grace(t.epoch);
                self.progress.lock().grace_ms = t0.elapsed().as_millis() as u64;
                self.finish.store(m.id, Ordering::Release);
                let (copying, failed) = {
                    let mut p = self.progress.lock();
                    let copying = p.migration == m.id;
                    (copying, copying && p.error.take().is_some())
                };
                if !copying {
                    // Restarted since the copy began: it has nothing left to send, and the
                    // hand-off must not wait for it (what it held moved with its process).
                    self.hand_off_empty(m.id, &t.serving());
                } else if failed {
                    // Its copier stopped on a failed stream while copying, but the
                    // migration went on to its hand-off: it copies again (see
                    // `run_copier`).
                    tracing::warn!("migration {}: in its hand-off: copying again", m.id);
                    if let Some(old) = t.other() {
                        let node = self.clone();
                        let (id, new) = (m.id, t.serving());
                        let started_ms = m.started_ms;
                        let spawned = std::thread::Builder::new()
                            .name("kvlab-migrate".into())
                            .spawn(move || node.run_copier(id, &old, &new, started_ms));
                        match spawned {
                            Ok(h) => self.threads.lock().push(h),
                            Err(e) => self.progress.lock().error = Some(e.to_string()),
                        }
                    }
                }
            }
            Some(_) => {}
            None => {
                // A migration ended (or was rolled back), or the ring healed: what this node
                // no longer holds goes, and with copies, each key it owns is copied again to
                // the nodes that should hold its copies now.
                self.finish.store(u64::MAX, Ordering::Release);
                self.changes.lock().clear();
                self.follow_holders();
                self.start_cleanup(t.epoch);
            }
        }
    }

    /// Sends each of `items` (of keys this node no longer holds under `view`) to the
    /// nodes that hold the key under `view` with `add` (a node that has the key keeps its
    /// own) on a `cluster import HANDOVER` stream per node; returns the keys some of whose
    /// nodes did not confirm (unreachable, or refused): those items stay here for now.
    fn hand_over(
        &self,
        view: &View,
        items: &[kvlab_store::ExportedItem],
        pipes: &mut HashMap<String, Pipe>,
    ) -> HashSet<Vec<u8>> {
        let r = view.replicas as usize;
        let mut owners = Vec::with_capacity(r);
        let mut sent: HashMap<String, Vec<&[u8]>> = HashMap::new();
        let mut kept: HashSet<Vec<u8>> = HashSet::new();
        for item in items {
            view.serving.owners_of_hash(
                kvlab_client::cluster::key_hash(item.key()),
                r,
                &mut owners,
            );
            for &i in owners.iter() {
                let node = &view.serving.nodes()[i];
                let pipe = match pipes.entry(node.clone()) {
                    std::collections::hash_map::Entry::Occupied(e) => Ok(e.into_mut()),
                    std::collections::hash_map::Entry::Vacant(e) => {
                        Pipe::connect(node, REPLICA_TIMEOUT)
                            .and_then(|p| p.import(HANDOVER, &self.me))
                            .map(|p| e.insert(p))
                    }
                };
                let queued = pipe
                    .and_then(|p| p.add(item.key(), item.flags(), item.exptime(), item.value()));
                match queued {
                    Ok(()) => sent.entry(node.clone()).or_default().push(item.key()),
                    Err(_) => {
                        pipes.remove(node);
                        kept.insert(item.key().to_vec());
                    }
                }
            }
        }
        for (node, keys) in sent {
            let confirmed = pipes
                .get_mut(&node)
                .is_some_and(|p| matches!(p.flush(), Ok(0)));
            if !confirmed {
                pipes.remove(&node);
                kept.extend(keys.into_iter().map(<[u8]>::to_vec));
            }
        }
        kept
    }

    /// Says `drained` for migration `id` to every new owner in `serving` (a source with
    /// nothing to send), on a thread of its own that asks a node that does not answer
    /// again until it does, then reports the hand-off done.
    fn hand_off_empty(self: &Arc<Node>, id: u64, serving: &Ring) {
        tracing::warn!("migration {id}: this node restarted during it; its keys were not copied");
        let node = self.clone();
        let mut owed: Vec<String> = serving
            .nodes()
            .iter()
            .filter(|n| **n != self.me)
            .cloned()
            .collect();
        let spawned = std::thread::Builder::new()
            .name("kvlab-drained".into())
            .spawn(move || {
                let me = node.me.as_str();
                let mut pause = Duration::from_millis(20);
                while !owed.is_empty() {
                    if node.abandoned(id) {
                        return;
                    }
                    owed.retain(|n| {
                        let said = Pipe::connect(n, STREAM_TIMEOUT).and_then(|mut p| {
                            p.line(format!("cluster drained {id} {me}\r\n").as_bytes())?;
                            p.flush()
                        });
                        if let Err(e) = &said {
                            node.progress.lock().waiting_for = Some(format!("{n}: {e}"));
                        }
                        said.is_err()
                    });
                    if !owed.is_empty() {
                        std::thread::sleep(pause);
                        pause = (pause * 2).min(Duration::from_secs(1));
                    }
                }
                *node.progress.lock() = Progress {
                    migration: id,
                    snapshot_done: true,
                    handed_off: id,
                    ..Progress::default()
                };
            });
        match spawned {
            Ok(h) => self.threads.lock().push(h),
            Err(e) => self.progress.lock().error = Some(e.to_string()),
        }
    }

    /// With copies and leases: a ring node whose liveness has lapsed for a lease's TTL is
    /// taken out of the ring by the first live node (by name), in one epoch — its keys then
    /// belong to the nodes that hold their copies. Not during a migration.
    fn heal(&self) {
        let v = self.view();
        let Some(ttl) = self.topology.lease_ttl() else {
            return;
        };
        if v.replicas < 2 || v.migration.is_some() {
            return;
        }
        let Ok(Some(alive)) = self.topology.alive() else {
            return;
        };
        let mut missing = self.missing.lock();
        missing.retain(|n, _| !alive.contains(n) && v.serving.nodes().contains(n));
        for n in v.serving.nodes() {
            if !alive.contains(n) {
                missing.entry(n.clone()).or_insert_with(Instant::now);
            }
        }
        let dead: Vec<String> = missing
            .iter()
            .filter(|(_, since)| since.elapsed() >= ttl)
            .map(|(n, _)| n.clone())
            .collect();
        let leader = v.serving.nodes().iter().find(|n| alive.contains(n));
        if dead.is_empty() || leader.map(String::as_str) != Some(self.me.as_str()) {
            return;
        }
        let Ok(Some(t)) = self.topology.load() else {
            return;
        };
        if t.epoch != v.epoch || t.migration.is_some() {
            return;
        }
        let mut next = t.next();
        next.nodes.retain(|n| !dead.contains(n));
        if next.nodes.is_empty() {
            return;
        }
        match self.topology.swap(Some(t.epoch), &next) {
            Ok(true) => {
                tracing::warn!(
                    ?dead,
                    epoch = next.epoch,
                    "nodes out of the ring: leases lapsed"
                )
            }
            Ok(false) => {}
            Err(e) => tracing::warn!("healing the ring: {e}"),
        }
    }

    /// Writes the current state of `keys` (each item, or its absence) through to the other
    /// nodes that hold their copies under `view`, and waits for every holder's answer. The
    /// first failure, if any.
    pub fn replicate_all<K: AsRef<[u8]>>(
        &self,
        view: &View,
        keys: &[K],
    ) -> Result<(), ClusterError> {
        let keys: Vec<Vec<u8>> = keys.iter().map(|k| k.as_ref().to_vec()).collect();
        match self.replicate_and_wait(view, &[(0, keys)]).pop() {
            Some(Outcome {
                failure: Some(reason),
                ..
            }) => Err(ClusterError::Migration(reason)),
            _ => Ok(()),
        }
    }

    /// Queues the copies of `writes` (each a ticket and the keys it changed, or a read's
    /// keys whose copies are unconfirmed) to the other nodes that hold those keys' copies
    /// under `view`, one batch per holder; each holder's sender reads the keys' state when
    /// it sends them and answers each ticket to `reply` ([`crate::copies`]). Says through
    /// `expect(ticket, outcome)` how many confirmations each ticket will get, and why its
    /// copies already failed (a holder backing off after a failure): a ticket whose
    /// outcome owes none is settled.
    pub fn send_copies(
        &self,
        view: &View,
        writes: &[(usize, Vec<Vec<u8>>)],
        reply: &Reply,
        expect: &mut dyn FnMut(usize, Outcome),
    ) {
        let r = view.replicas as usize;
        let nodes = view.serving.nodes();
        let mut batches: Vec<Option<Batch>> = (0..nodes.len()).map(|_| None).collect();
        let mut owners = Vec::with_capacity(r);
        let mut holders: Vec<usize> = Vec::with_capacity(r);
        for (ticket, keys) in writes {
            let ticket = *ticket;
            holders.clear();
            let mut failure = None;
            for key in keys {
                if r < 2 {
                    break;
                }
                view.serving
                    .owners_of_hash(kvlab_client::cluster::key_hash(key), r, &mut owners);
                for &i in owners.iter().skip(1) {
                    let holder = &nodes[i];
                    if *holder == self.me {
                        continue;
                    }
                    if let Some(why) = self.copies.down(holder) {
                        failure
                            .get_or_insert_with(|| format!("copy to {holder} not written: {why}"));
                        continue;
                    }
                    let batch = batches[i].get_or_insert_with(|| Batch {
                        keys: Vec::new(),
                        tickets: Vec::new(),
                        reply: reply.clone(),
                    });
                    batch.keys.push(key.clone());
                    if batch.tickets.last() != Some(&ticket) {
                        batch.tickets.push(ticket);
                    }
                    if !holders.contains(&i) {
                        holders.push(i);
                    }
                }
            }
            let seq = self.copies.tick();
            expect(ticket, Outcome::new(holders.len() as u32, failure, seq));
        }
        for (i, batch) in batches.into_iter().enumerate() {
            if let Some(batch) = batch {
                self.copies.send(&nodes[i], batch);
            }
        }
    }

    /// [`Node::send_copies`], waiting for every confirmation (a helper thread's batch, the
    /// cleanup's re-copy): each ticket's outcome, in the order of `writes`.
    pub fn replicate_and_wait(
        &self,
        view: &View,
        writes: &[(usize, Vec<Vec<u8>>)],
    ) -> Vec<Outcome> {
        let (tx, rx) = std::sync::mpsc::channel();
        let reply = Reply::new(tx, None);
        let mut outcomes: Vec<Outcome> = Vec::with_capacity(writes.len());
        let mut index: HashMap<usize, usize> = HashMap::new();
        self.send_copies(view, writes, &reply, &mut |ticket, outcome| {
            index.insert(ticket, outcomes.len());
            outcomes.push(outcome);
        });
        drop(reply);
        let mut owed: u32 = outcomes.iter().map(|o| o.left).sum();
        // Every queued batch is answered (confirmed, failed, or failed as its holder
        // left); the bound only guards against a sender that died.
        let deadline = Instant::now() + REPLICA_TIMEOUT * 4 + REPLICA_BACKOFF;
        while owed > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(c) => {
                    owed -= 1;
                    if let Some(&at) = index.get(&c.ticket) {
                        outcomes[at].add(c);
                    }
                }
                Err(_) => {
                    let seq = self.copies.tick();
                    for o in outcomes.iter_mut().filter(|o| o.left > 0) {
                        o.failure
                            .get_or_insert_with(|| "copies not confirmed in time".into());
                        o.seq = seq;
                    }
                    break;
                }
            }
        }
        outcomes
    }

    /// An event loop offers to read the copy streams' replies ([`Copies::attach`]).
    pub fn attach_copies(&self, register: crate::copies::Register) {
        self.copies.attach(register);
    }

    /// The copy stream an event loop watches as `id` is ready ([`Copies::ready`]); the
    /// loop's confirmations go to `local`.
    pub fn copies_ready(&self, id: usize, local: &Reply) {
        self.copies.ready(id, local);
    }

    /// The keys whose copies are not all confirmed ([`crate::copies::Unconfirmed`]).
    pub fn unconfirmed(&self) -> &Unconfirmed {
        &self.copies.unconfirmed
    }

    /// With copies: keeps a copy sender (and its open stream) for every other ring node,
    /// so that a write's first copy finds its stream open, and stops those of nodes that
    /// left.
    fn follow_holders(&self) {
        let v = self.view();
        if v.replicas < 2 {
            return;
        }
        self.copies.follow(v.serving.nodes());
    }

    /// Waits until no worker runs a request checked under an epoch before `epoch`.
    fn grace(&self, epoch: u64) {
        // The view of `epoch` was stored before: see `Gate::begin` for the other side.
        std::sync::atomic::fence(Ordering::SeqCst);
        let running: Vec<_> = self.running.lock().clone();
        for r in running {
            loop {
                let e = r.load(Ordering::SeqCst);
                if e == 0 || e >= epoch || self.stop.load(Ordering::Relaxed) {
                    break;
                }
                std::thread::yield_now();
            }
        }
    }

    fn start_copier(self: &Arc<Node>, id: u64, t: &Topology) {
        let Some(future) = t.other() else { return };
        let serving = t.serving();
        self.changes.lock().clear();
        self.finish.store(0, Ordering::Release);
        *self.progress.lock() = Progress {
            migration: id,
            ..Progress::default()
        };
        let node = self.clone();
        let started_ms = t.migration.as_ref().map_or(0, |m| m.started_ms);
        let spawned = std::thread::Builder::new()
            .name("kvlab-migrate".into())
            .spawn(move || node.run_copier(id, &serving, &future, started_ms));
        match spawned {
            Ok(h) => self.threads.lock().push(h),
            Err(e) => self.progress.lock().error = Some(e.to_string()),
        }
    }

    /// Runs [`Node::copy`]; a failure is the migration's error (the coordinator rolls back
    /// a migration still copying) — unless the migration went on to its hand-off meanwhile
    /// (the coordinator saw every snapshot done before the failure), which cannot go back:
    /// then the copy starts again, as a hand-off's (a failed stream is then asked again).
    /// Whichever of this thread and the hand-off's [`Node::apply`] takes the error back
    /// starts it again.
    fn run_copier(self: &Arc<Node>, id: u64, serving: &Ring, future: &Ring, started_ms: u64) {
        loop {
            let Err(e) = self.copy(id, serving, future, started_ms) else {
                return;
            };
            tracing::warn!("migration {id}: {e}");
            self.progress.lock().error = Some(e.to_string());
            let handoff = self
                .view()
                .migration
                .as_ref()
                .is_some_and(|m| m.id == id && m.phase == Phase::Handoff);
            if !handoff || self.progress.lock().error.take().is_none() {
                return;
            }
            tracing::warn!("migration {id}: in its hand-off: copying again");
        }
    }

    /// The source's side of migration `id`: snapshot, stream changes, and after the grace
    /// period a last drain and `drained` to every new owner.
    fn copy(
        &self,
        id: u64,
        serving: &Ring,
        future: &Ring,
        started_ms: u64,
    ) -> Result<(), ClusterError> {
        let mut pipes: HashMap<usize, Pipe> = HashMap::new();
        let me = self.me.as_str();
        // Only what this node serves now leaves it: an item of a key it no longer owns (left
        // behind by an earlier migration whose cleanup has not reached it yet) is older
        // than the owner's, and must not race the owner's copy to the new owner.
        let target_of = |key: &[u8]| {
            let hash = kvlab_client::cluster::key_hash(key);
            if serving.owner_of_hash(hash) != Some(me) {
                return None;
            }
            future
                .index_of_hash(hash)
                .filter(|&i| future.nodes()[i] != me)
        };
        // Every write begun before this node took the copy view (and so not logged as a
        // change) is applied before the snapshot starts, so the snapshot sees it.
        self.grace(id);
        // Snapshot: every key that leaves, as it is now. Per new owner, the changes sent
        // since its last confirmed batch (sent again if its stream fails).
        let mut unconfirmed: HashMap<usize, Vec<Vec<u8>>> = HashMap::new();
        let mut cursor = ScanCursor::default();
        let mut items = Vec::with_capacity(512);
        loop {
            if self.abandoned(id) {
                return Ok(());
            }
            items.clear();
            let step = self
                .store
                .scan_matching(&mut cursor, 512, &mut items, |_, key| {
                    target_of(key).is_some()
                });
            for item in &items {
                let Some(i) = target_of(item.key()) else {
                    continue;
                };
                let sent = self.pipe(&mut pipes, i, future, id).and_then(|pipe| {
                    pipe.set(item.key(), item.flags(), item.exptime(), item.value())
                });
                match sent {
                    Ok(()) => {
                        let mut p = self.progress.lock();
                        p.keys_copied += 1;
                        p.bytes_sent += item.value().len() as u64;
                    }
                    Err(e) => self.lost_stream(
                        id,
                        i,
                        e,
                        &mut pipes,
                        &mut unconfirmed,
                        future,
                        &target_of,
                    )?,
                }
            }
            self.flush_streams(id, &mut pipes, &mut unconfirmed, future, &target_of)?;
            if step.done {
                break;
            }
        }
        {
            let mut p = self.progress.lock();
            p.snapshot_done = true;
            p.snapshot_ms = now_ms().saturating_sub(started_ms);
        }
        // Stream changes until the hand-off's grace period is over, then drain once more
        // and say `drained` to every new owner.
        loop {
            let finishing = self.finish.load(Ordering::Acquire);
            if finishing == u64::MAX || self.abandoned(id) {
                return Ok(()); // rolled back, ended or stopping
            }
            let last = finishing == id;
            let keys: Vec<Vec<u8>> = self.changes.lock().drain().collect();
            let idle = keys.is_empty();
            for key in keys {
                let Some(i) = target_of(&key) else { continue };
                let sent = self.pipe(&mut pipes, i, future, id).and_then(|pipe| {
                    match self.store.peek(&key) {
                        Some(m) => {
                            pipe.set(&key, m.item.flags, m.item.exptime, &m.item.value)?;
                            Ok(m.item.value.len() as u64)
                        }
                        None => pipe.delete(&key).map(|()| 0),
                    }
                });
                match sent {
                    Ok(bytes) => {
                        let mut p = self.progress.lock();
                        p.bytes_sent += bytes;
                        p.changes_sent += 1;
                        drop(p);
                        unconfirmed.entry(i).or_default().push(key);
                    }
                    Err(e) => {
                        self.changes.lock().insert(key);
                        self.lost_stream(
                            id,
                            i,
                            e,
                            &mut pipes,
                            &mut unconfirmed,
                            future,
                            &target_of,
                        )?;
                    }
                }
            }
            self.flush_streams(id, &mut pipes, &mut unconfirmed, future, &target_of)?;
            if last && self.changes.lock().is_empty() {
                let mut told = true;
                for i in (0..future.nodes().len()).filter(|&i| future.nodes()[i] != me) {
                    let said = self.pipe(&mut pipes, i, future, id).and_then(|pipe| {
                        pipe.line(format!("cluster drained {id} {me}\r\n").as_bytes())?;
                        pipe.flush()
                    });
                    if let Err(e) = said {
                        told = false;
                        self.lost_stream(
                            id,
                            i,
                            e,
                            &mut pipes,
                            &mut unconfirmed,
                            future,
                            &target_of,
                        )?;
                    }
                }
                if told {
                    break;
                }
                continue; // what a failed stream carried goes again first
            }
            if idle {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        self.progress.lock().handed_off = id;
        Ok(())
    }

    /// Writes what every stream has queued and reads its replies; a stream that fails goes
    /// to [`Node::lost_stream`].
    fn flush_streams(
        &self,
        id: u64,
        pipes: &mut HashMap<usize, Pipe>,
        unconfirmed: &mut HashMap<usize, Vec<Vec<u8>>>,
        future: &Ring,
        target_of: &dyn Fn(&[u8]) -> Option<usize>,
    ) -> Result<(), ClusterError> {
        let open: Vec<usize> = pipes.keys().copied().collect();
        for i in open {
            let Some(pipe) = pipes.get_mut(&i) else {
                continue;
            };
            match pipe.flush() {
                Ok(refused) => {
                    unconfirmed.remove(&i);
                    if refused > 0 {
                        self.progress.lock().refused += refused;
                    }
                }
                Err(e) => self.lost_stream(id, i, e, pipes, unconfirmed, future, target_of)?,
            }
        }
        Ok(())
    }

    /// A new owner's stream failed during migration `id` (its node was killed, paused or
    /// cut off). While copying, the migration fails (the coordinator rolls it back). In the
    /// hand-off it can only go forward: the changes the stream may not have delivered go
    /// back to the change log, and once the node answers again it is sent all its keys
    /// again on a new stream, which replaces the old one there. A node that restarted
    /// empty refuses them while it catches up, and takes them from this node afterwards.
    #[allow(clippy::too_many_arguments)]
    fn lost_stream(
        &self,
        id: u64,
        i: usize,
        error: ClusterError,
        pipes: &mut HashMap<usize, Pipe>,
        unconfirmed: &mut HashMap<usize, Vec<Vec<u8>>>,
        future: &Ring,
        target_of: &dyn Fn(&[u8]) -> Option<usize>,
    ) -> Result<(), ClusterError> {
        pipes.remove(&i);
        let copying = self
            .view()
            .migration
            .as_ref()
            .is_some_and(|m| m.id == id && m.phase == Phase::Copy);
        if copying {
            return Err(error);
        }
        self.changes
            .lock()
            .extend(unconfirmed.remove(&i).unwrap_or_default());
        let node = &future.nodes()[i];
        tracing::warn!("migration {id}: the stream to {node} failed ({error}); its keys go again once it answers");
        let mut reason = error.to_string();
        let mut pause = Duration::from_millis(50);
        while !self.abandoned(id) {
            self.progress.lock().waiting_for = Some(format!("{node}: {reason}"));
            match self.resend(id, i, future, target_of) {
                Ok(pipe) => {
                    pipes.insert(i, pipe);
                    self.progress.lock().waiting_for = None;
                    return Ok(());
                }
                Err(e) => reason = e.to_string(),
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_secs(1));
        }
        Ok(())
    }

    /// A new stream to new owner `i` of migration `id` that carries every key of it this
    /// node serves, as it is now.
    fn resend(
        &self,
        id: u64,
        i: usize,
        future: &Ring,
        target_of: &dyn Fn(&[u8]) -> Option<usize>,
    ) -> Result<Pipe, ClusterError> {
        let mut pipe = Pipe::connect(&future.nodes()[i], STREAM_TIMEOUT)?.import_generation(
            id,
            &self.me,
            next_generation(),
        )?;
        let mut cursor = ScanCursor::default();
        let mut items = Vec::with_capacity(512);
        loop {
            items.clear();
            let step = self
                .store
                .scan_matching(&mut cursor, 512, &mut items, |_, key| {
                    target_of(key) == Some(i)
                });
            for item in &items {
                pipe.set(item.key(), item.flags(), item.exptime(), item.value())?;
            }
            let refused = pipe.flush()?;
            if refused > 0 {
                self.progress.lock().refused += refused;
            }
            if step.done {
                return Ok(pipe);
            }
        }
    }

    fn abandoned(&self, id: u64) -> bool {
        self.stop.load(Ordering::Relaxed)
            || self.finish.load(Ordering::Acquire) == u64::MAX
            || self.view().migration.as_ref().is_none_or(|m| m.id != id)
    }

    fn pipe<'p>(
        &self,
        pipes: &'p mut HashMap<usize, Pipe>,
        i: usize,
        future: &Ring,
        id: u64,
    ) -> Result<&'p mut Pipe, ClusterError> {
        match pipes.entry(i) {
            std::collections::hash_map::Entry::Occupied(e) => Ok(e.into_mut()),
            std::collections::hash_map::Entry::Vacant(e) => {
                let p = Pipe::connect(&future.nodes()[i], STREAM_TIMEOUT)?.import_generation(
                    id,
                    &self.me,
                    next_generation(),
                )?;
                Ok(e.insert(p))
            }
        }
    }

    /// After a migration: removes the items this node no longer owns, in small steps, as
    /// long as the ring stays that of `epoch` (an item is removed only if unchanged since
    /// it was looked at).
    fn start_cleanup(self: &Arc<Node>, epoch: u64) {
        let node = self.clone();
        let spawned = std::thread::Builder::new()
            .name("kvlab-cleanup".into())
            .spawn(move || {
                // Requests begun under an older view (a migration stream's last items)
                // are applied before the scan starts, so it sees them.
                node.grace(epoch);
                let mut cursor = ScanCursor::default();
                let mut items = Vec::with_capacity(256);
                let mut handover: HashMap<String, Pipe> = HashMap::new();
                // Items a key's node did not take in this pass (it is down, or catching up
                // and refusing strays): the scan starts over for them until none is left.
                let mut kept_in_pass = 0u64;
                let mut first_pass = true;
                let mut retry = Duration::from_millis(50);
                loop {
                    let view = node.view();
                    if view.epoch != epoch || node.stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let t0 = Instant::now();
                    items.clear();
                    let me = node.me.as_str();
                    let r = view.replicas as usize;
                    let mut owners = Vec::with_capacity(r);
                    let mut mine = Vec::new();
                    let step = node
                        .store
                        .scan_matching(&mut cursor, 256, &mut items, |_, k| {
                            let h = kvlab_client::cluster::key_hash(k);
                            view.serving.owners_of_hash(h, r, &mut owners);
                            let nodes = view.serving.nodes();
                            if r > 1 && owners.first().is_some_and(|&i| nodes[i] == me) {
                                mine.push(k.to_vec());
                            }
                            !owners.iter().any(|&i| nodes[i] == me)
                        });
                    // Nothing goes, and no copy is sent, under a view already replaced (keys
                    // may have moved meanwhile), nor once a newer migration's items arrive
                    // here: the scan may have found some, which this epoch's ring does not
                    // give this node.
                    if node.newest_import.load(Ordering::SeqCst) > epoch
                        || node.view().epoch != epoch
                    {
                        return;
                    }
                    if first_pass {
                        if let Err(e) = node.replicate_all(&view, &mine) {
                            node.progress.lock().replica_errors += 1;
                            tracing::warn!("copying keys to their holders: {e}");
                        }
                    }
                    if r > 1 {
                        // With copies, an item this node no longer holds may be the last
                        // one left (its owner died before it copied the key to the holders
                        // of the new ring): it goes only once the key's nodes under this
                        // ring confirm they have it, each sent the item as `add`.
                        let kept = node.hand_over(&view, &items, &mut handover);
                        kept_in_pass += kept.len() as u64;
                        items.retain(|item| !kept.contains(item.key()));
                    }
                    for item in &items {
                        let opts = MetaDeleteOpts {
                            compare_cas: Some(item.cas()),
                            ..MetaDeleteOpts::default()
                        };
                        if node.store.meta_delete(item.key(), &opts) == DeleteStatus::Deleted {
                            node.progress.lock().cleaned += 1;
                        }
                    }
                    if step.done {
                        let mut p = node.progress.lock();
                        p.handover_pending = kept_in_pass;
                        if kept_in_pass == 0 {
                            p.handover_epoch = p.handover_epoch.max(epoch);
                            return;
                        }
                        drop(p);
                        handover.clear();
                        std::thread::sleep(retry);
                        retry = (retry * 2).min(Duration::from_secs(1));
                        cursor = ScanCursor::default();
                        kept_in_pass = 0;
                        first_pass = false;
                        continue;
                    }
                    // Nothing waits for the clean-up: it takes at most a fifth of a core
                    // from the requests (as the crawler does).
                    std::thread::sleep((t0.elapsed() * 4).max(Duration::from_micros(50)));
                }
            });
        match spawned {
            Ok(h) => self.threads.lock().push(h),
            Err(e) => self.progress.lock().error = Some(e.to_string()),
        }
    }
}

/// One worker's handle on the node: the view it checks requests against, and the epoch it
/// publishes while a request runs.
pub struct Gate {
    node: Arc<Node>,
    running: Arc<AtomicU64>,
    view: Arc<View>,
}

impl Gate {
    /// Before a request: takes the view in force and publishes its epoch.
    pub fn begin(&mut self) {
        loop {
            let current = self.node.view.load();
            if !Arc::ptr_eq(&current, &self.view) {
                self.view = Arc::clone(&current);
            }
            // Published before the view is looked at again: a watcher that installs a newer
            // view and then finds this worker idle (its grace period) has installed it
            // before this load, which then sees it (both sides order store before load).
            self.running.store(self.view.epoch, Ordering::SeqCst);
            if Arc::ptr_eq(&self.node.view.load(), &self.view) {
                return;
            }
        }
    }

    /// After the request (and its change-log entries).
    pub fn end(&self) {
        self.running.store(0, Ordering::Release);
    }

    /// Whether the items of import stream `stream` are still taken under the view taken
    /// by [`Gate::begin`]; `Err`: the reply that refuses them.
    ///
    /// A migration's items are refused once this node has seen that migration end or be
    /// rolled back (its epoch is past the migration's start and it is no longer under way:
    /// the cleanup after it may already have passed them); from a stream its source has
    /// since replaced (it reconnected after a failure: the older stream's last items may
    /// arrive after the newer one's); once that source said `drained` (this node may have
    /// served writes to those keys since); and while this node catches up after a restart
    /// (it asks the source for those items itself, after the newer copies their holders
    /// keep: see [`Node::rejoin`]).
    pub fn imports(&self, stream: &Import) -> Result<(), &'static [u8]> {
        const ENDED: &[u8] = b"SERVER_ERROR migration no longer under way\r\n";
        let v = &self.view;
        let id = stream.id;
        if id == RESYNC {
            return if self.node.recovering() {
                Ok(())
            } else {
                Err(ENDED)
            };
        }
        if id == HANDOVER {
            // Not while catching up: a stray may be older than the copy a holder resyncs.
            return if self.node.recovering() {
                Err(b"SERVER_ERROR this node is catching up\r\n")
            } else {
                Ok(())
            };
        }
        if id == 0 {
            return Ok(());
        }
        if self.node.recovering() {
            return Err(b"SERVER_ERROR this node is catching up\r\n");
        }
        if stream.gen < stream.newest.load(Ordering::Acquire) {
            return Err(b"SERVER_ERROR stream replaced by a newer one\r\n");
        }
        let migration = v.migration.as_ref().filter(|m| m.id == id);
        if migration.is_some_and(|m| m.drained.iter().any(|d| **d == *stream.from)) {
            return Err(b"SERVER_ERROR source already drained\r\n");
        }
        if v.epoch >= id && migration.is_none() {
            return Err(ENDED);
        }
        // Published before the item is stored: a cleanup that finds the item in its scan
        // then sees this and stops (see `start_cleanup`).
        self.node.newest_import.fetch_max(id, Ordering::SeqCst);
        Ok(())
    }

    /// The node.
    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// Whether this node serves `key` under the view taken by [`Gate::begin`].
    pub fn check(&self, key: &[u8]) -> Verdict {
        let v = &self.view;
        if self.node.recovering.load(Ordering::Relaxed) {
            return Verdict::Redirect(Redirect::TryAgain { epoch: v.epoch });
        }
        let me = self.node.me.as_str();
        let hash = kvlab_client::cluster::key_hash(key);
        match v.serving.owner_of_hash(hash) {
            Some(owner) if owner == me => {}
            Some(owner) => {
                return Verdict::Redirect(Redirect::Moved {
                    epoch: v.epoch,
                    node: owner.to_string(),
                })
            }
            None => {
                return Verdict::Redirect(Redirect::TryAgain { epoch: v.epoch });
            }
        }
        match &v.migration {
            Some(m) => match m.phase {
                Phase::Copy => Verdict::Serve {
                    leaving: m.other.owner_of_hash(hash) != Some(me),
                },
                Phase::Handoff => match m.other.owner_of_hash(hash) {
                    Some(prev) if prev != me && !m.drained.iter().any(|d| d == prev) => {
                        Verdict::Redirect(Redirect::TryAgain { epoch: v.epoch })
                    }
                    _ => Verdict::Serve { leaving: false },
                },
            },
            None => Verdict::Serve { leaving: false },
        }
    }

    /// Whether writes are copied to other nodes (the topology's `replicas` > 1).
    pub fn replicated(&self) -> bool {
        self.view.replicas > 1
    }

    /// Whether this node may take writes now (its liveness in the store has not lapsed).
    pub fn may_write(&self) -> bool {
        let until = self.node.writable_until.load(Ordering::Acquire);
        until == u64::MAX || now_ms() < until
    }

    /// The epoch of the view taken by [`Gate::begin`].
    pub fn epoch(&self) -> u64 {
        self.view.epoch
    }

    /// Records a write to a leaving key (call before [`Gate::end`]).
    pub fn changed(&self, key: &[u8]) {
        self.node.changes.lock().insert(key.to_vec());
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        // A connection's engine (thread-per-connection) goes with its connection.
        self.node
            .running
            .lock()
            .retain(|r| !Arc::ptr_eq(r, &self.running));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::FileStore;
    use kvlab_store::{Config, SetMode, SetRequest, SystemClock};

    /// A node the ring does not name yet takes items of a migration to it before its own
    /// view shows the migration (the source saw it first). The cleanup of its older epoch,
    /// which takes every item for a stray, must not remove them.
    #[test]
    fn a_cleanup_of_an_older_epoch_keeps_items_of_a_newer_migration() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("topology.json");
        let topology = FileStore::new(&path);
        let t = Topology::new(16, vec!["127.0.0.1:1".into()]);
        assert!(topology.swap(None, &t).unwrap());
        let store = Arc::new(Store::new(Config::default(), Arc::new(SystemClock)));
        let node = Node::start(
            "127.0.0.1:2".into(),
            store.clone(),
            Box::new(FileStore::new(&path)),
        )
        .unwrap();
        let epoch = node.view().epoch;
        // The stream of migration `epoch + 1` (the view here is still `epoch`).
        let mut gate = node.gate();
        gate.begin();
        assert!(gate
            .imports(&node.open_import(epoch + 1, "127.0.0.1:3", 1))
            .is_ok());
        for i in 0..500 {
            let key = format!("k{i}");
            store.set(&SetRequest::new(SetMode::Set, key.as_bytes(), b"v"));
        }
        gate.end();
        node.start_cleanup(epoch);
        let cleanup = node.threads.lock().pop().unwrap();
        cleanup.join().unwrap();
        node.stop();
        assert_eq!(
            store.stats().curr_items,
            500,
            "items of the migration removed"
        );
    }

    /// A new owner that takes a migration stream and notes every key it is sent.
    fn new_owner() -> (String, std::thread::JoinHandle<Vec<String>>) {
        use std::io::{BufRead, Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let name = listener.local_addr().unwrap().to_string();
        let h = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut out = stream.try_clone().unwrap();
            let mut input = std::io::BufReader::new(stream);
            let mut keys = Vec::new();
            let mut line = String::new();
            while input.read_line(&mut line).unwrap_or(0) > 0 {
                let words: Vec<&str> = line.split_whitespace().collect();
                match words.as_slice() {
                    ["set", key, _, _, len] => {
                        let mut data = vec![0; len.parse::<usize>().unwrap() + 2];
                        input.read_exact(&mut data).unwrap();
                        keys.push(key.to_string());
                        out.write_all(b"STORED\r\n").unwrap();
                    }
                    _ => out.write_all(b"OK\r\n").unwrap(),
                }
                line.clear();
            }
            keys
        });
        (name, h)
    }

    /// A source sends a new owner only the keys it serves: an item of a key that an
    /// earlier migration moved away (not yet removed by its cleanup) is older than the
    /// owner's, and would race the owner's copy.
    #[test]
    fn a_migration_sends_only_what_its_source_serves() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("topology.json");
        let topology = FileStore::new(&path);
        let (me, other) = ("127.0.0.1:2".to_string(), "127.0.0.1:3".to_string());
        let t = Topology::new(16, vec![me.clone(), other.clone()]);
        assert!(topology.swap(None, &t).unwrap());
        let store = Arc::new(Store::new(Config::default(), Arc::new(SystemClock)));
        for i in 0..400 {
            let key = format!("k{i}");
            store.set(&SetRequest::new(SetMode::Set, key.as_bytes(), b"v"));
        }
        let (new, received) = new_owner();
        let mut copy = t.next();
        copy.migration = Some(crate::topology::Migration {
            id: copy.epoch,
            to: vec![me.clone(), other, new],
            phase: Phase::Copy,
            started_ms: 0,
        });
        assert!(topology.swap(Some(t.epoch), &copy).unwrap());
        // The node comes up copying, with the other node's keys still in its store.
        let node = Node::start(me.clone(), store, Box::new(FileStore::new(&path))).unwrap();
        let start = Instant::now();
        while !node.progress().snapshot_done {
            assert!(start.elapsed() < Duration::from_secs(10), "no snapshot");
            std::thread::sleep(Duration::from_millis(5));
        }
        node.stop();
        let keys = received.join().unwrap();
        let serving = t.serving();
        assert!(!keys.is_empty(), "the new owner got nothing");
        let strays: Vec<_> = keys
            .iter()
            .filter(|k| serving.owner(k.as_bytes()) != Some(me.as_str()))
            .collect();
        assert!(strays.is_empty(), "sent keys it does not serve: {strays:?}");
    }
}
