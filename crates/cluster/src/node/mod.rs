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
//!                                               (with copies, new holders of a key's copies
//!                                               get it too: see `migrate::Route`)
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
use kvlab_ring::{Redirect, Ring};
use kvlab_store::{ScanCursor, Store};
use parking_lot::Mutex;
use serde::Serialize;

use crate::clock::now_ms;
use crate::copies::{Batch, Copies, Outcome, Reply, Unconfirmed, BEHIND};
pub use crate::copies::{REPLICA_BACKOFF, REPLICA_TIMEOUT};
use crate::pipe::Pipe;
use crate::topology::{CopyWritePolicy, Phase, Topology, TopologyStore};
use crate::ClusterError;
use migrate::{Route, RouteScratch};

mod cleanup;
mod migrate;
mod pass;
mod rejoin;
mod replicate;

use pass::Pass;

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

/// How long a node that left the ring and still holds items, asked to stop, waits for its
/// clean-up to hand them over first (see [`Node::stop`]).
const STOP_PATIENCE: Duration = Duration::from_secs(2);

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
    /// When a write with copies is acknowledged (the topology's `write_policy`).
    pub write_policy: CopyWritePolicy,
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
    /// Serve it; `leaving`: a write to it must go to the change log.
    Serve {
        /// The migration under way sends the key on from this node: to its new owner, or
        /// to a node that holds its copies after the migration and not before.
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
    /// Keys the snapshot pass sent to their new owner (each once; an item also sent to a
    /// new holder of the key's copies counts in `bytes_sent` only).
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
    /// the key's nodes and copied every key it owns to their holders (with copies;
    /// without, once it removed what it no longer holds).
    pub handover_epoch: u64,
    /// Items the clean-up under way still holds for nodes that did not take them yet, and
    /// keys it owns whose copy a holder did not confirm yet.
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
        let named =
            topo.nodes.contains(&me) || topo.migration.as_ref().is_some_and(|m| m.to.contains(&me));
        if store.durability().is_some() && (!named || topo.replicas > 1) {
            // What a durable node kept is not trusted where it may be older than the
            // cluster's: out of the ring it may hold keys changed or deleted elsewhere
            // since (it takes its share again when added), and with copies the holders
            // of its keys have every acknowledged write (it re-copies them: `rejoin`).
            // Without copies, a node the ring names is the only one that had its keys:
            // it serves them from its disk.
            tracing::info!("{me}: drops what its data directory held (see docs/cluster.md)");
            store.flush_all(0);
            store
                .sync_all()
                .map_err(|e| ClusterError::Store(format!("the data directory: {e}")))?;
        }
        let node = Arc::new(Node {
            copies: Copies::new(me.clone(), store.clone()),
            me,
            store,
            topology,
            view: ArcSwap::from_pointee(View {
                epoch: 0,
                serving: Ring::new(0, 1, &[]),
                replicas: 1,
                write_policy: CopyWritePolicy::All,
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
            scratch: RouteScratch::default(),
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

    fn view_of(
        &self,
        epoch: u64,
        serving: &Ring,
        copies: (u32, CopyWritePolicy),
        phase: Phase,
        other: &Ring,
        id: u64,
    ) -> View {
        let d = self.drained.lock();
        View {
            epoch,
            serving: serving.clone(),
            replicas: copies.0,
            write_policy: copies.1,
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
        self.finish_hand_over(STOP_PATIENCE);
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
            (Some(m), Some(other)) => self.view_of(
                t.epoch,
                &serving,
                (t.replicas, t.write_policy),
                m.phase,
                &other,
                m.id,
            ),
            _ => View {
                epoch: t.epoch,
                serving,
                replicas: t.replicas,
                write_policy: t.write_policy,
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
                let durable = self.store.durability().is_some();
                if !copying && durable && !self.recovering.load(Ordering::Acquire) {
                    // Restarted since the copy began, with its keys on disk: it sends them
                    // all again (the new owners take the newer stream), then `drained`.
                    tracing::warn!(
                        "migration {}: restarted in its hand-off: copying again from disk",
                        m.id
                    );
                    self.progress.lock().migration = m.id;
                    self.copy_again(m, t);
                } else if !copying {
                    // Restarted since the copy began: it has nothing left to send, and the
                    // hand-off must not wait for it (what it held moved with its process).
                    self.hand_off_empty(m.id, &t.serving());
                } else if failed {
                    // Its copier stopped on a failed stream while copying, but the
                    // migration went on to its hand-off: it copies again (see
                    // `run_copier`).
                    tracing::warn!("migration {}: in its hand-off: copying again", m.id);
                    self.copy_again(m, t);
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

    /// In migration `m`'s hand-off (`t`): runs its copier again, from the old ring to the
    /// new one, on a thread of its own.
    fn copy_again(self: &Arc<Node>, m: &crate::topology::Migration, t: &Topology) {
        let Some(old) = t.other() else { return };
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
}

/// One worker's handle on the node: the view it checks requests against, and the epoch it
/// publishes while a request runs.
pub struct Gate {
    node: Arc<Node>,
    running: Arc<AtomicU64>,
    view: Arc<View>,
    /// Reused by [`Gate::check`] during a migration's copy (where a key goes).
    scratch: RouteScratch,
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
    pub fn check(&mut self, key: &[u8]) -> Verdict {
        let v = &self.view;
        if self.node.recovering.load(Ordering::Relaxed) {
            return Verdict::Redirect(Redirect::TryAgain { epoch: v.epoch });
        }
        let me = self.node.me.as_str();
        let hash = kvlab_ring::key_hash(key);
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
                Phase::Copy => {
                    // A write to a key the copy sends on (to its new owner, or to a new
                    // holder of its copies) goes to the change log.
                    let route = Route {
                        me,
                        serving: &v.serving,
                        future: &m.other,
                        replicas: v.replicas as usize,
                    };
                    Verdict::Serve {
                        leaving: !route.targets(hash, &mut self.scratch).is_empty(),
                    }
                }
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

    /// Whether a write is acknowledged before its copies are confirmed (write policy
    /// `owner`): they follow it ([`crate::copies::BEHIND`]).
    pub fn copies_behind(&self) -> bool {
        self.view.write_policy == CopyWritePolicy::Owner
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
    use kvlab_store::{SetMode, SetRequest, StoreConfig, SystemClock};

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
        let store = Arc::new(Store::new(StoreConfig::default(), Arc::new(SystemClock)));
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
        let store = Arc::new(Store::new(StoreConfig::default(), Arc::new(SystemClock)));
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
