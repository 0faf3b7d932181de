//! A migration at this node: the copier (snapshot of the leaving keys, then the change log,
//! then the hand-off's last drain and `drained`), streams that fail and are sent again, and
//! the receiving side's import streams.

use super::*;

/// Where a migration takes a key's item from this node. Nowhere unless this node serves
/// the key now: an item of a key it no longer owns (left by an earlier migration whose
/// clean-up has not reached it yet) is older than the owner's, and must not race the
/// owner's copy to the new owner. Else to the key's owner under the future ring, and
/// (with copies) to every node that holds the key's copies there but not now. Such a node
/// may still keep an item of the key from an earlier ring (a stray its clean-up had not
/// removed): without the item it would take that older one for its copy once the
/// migration ends, and an owner that restarts empty would take it back from there. A key
/// this node owns under both rings goes to its new holders down the copy links, not a
/// migration stream ([`Route::stays`]).
pub(super) struct Route<'r> {
    pub(super) me: &'r str,
    pub(super) serving: &'r Ring,
    pub(super) future: &'r Ring,
    pub(super) replicas: usize,
}

/// The lists [`Route::targets`] reuses from key to key.
#[derive(Default)]
pub(super) struct RouteScratch {
    now: Vec<usize>,
    next: Vec<usize>,
    out: Vec<usize>,
}

impl Route<'_> {
    /// The future ring's indexes of the nodes a key of hash `hash` goes to.
    pub(super) fn targets<'s>(&self, hash: u64, scratch: &'s mut RouteScratch) -> &'s [usize] {
        let RouteScratch { now, next, out } = scratch;
        out.clear();
        if self.serving.owner_of_hash(hash) != Some(self.me) {
            return out;
        }
        let r = self.replicas.max(1);
        self.serving.owners_of_hash(hash, r, now);
        self.future.owners_of_hash(hash, r, next);
        for (rank, &i) in next.iter().enumerate() {
            let node = self.future.nodes()[i].as_str();
            let holds_now = now.iter().any(|&j| self.serving.nodes()[j] == node);
            if node != self.me && (rank == 0 || !holds_now) {
                out.push(i);
            }
        }
        out
    }

    /// Whether this node owns a key of hash `hash` under the future ring too: its new
    /// holders then get it down the copy links, not a migration stream (see
    /// [`Node::copy`]).
    fn stays(&self, hash: u64) -> bool {
        self.future.owner_of_hash(hash) == Some(self.me)
    }

    /// Whether a migration stream takes a key of hash `hash` to future node `i`:
    /// `Some(true)` as the key's owner there, `Some(false)` as a holder of its copies only.
    fn goes_to(&self, hash: u64, i: usize, scratch: &mut RouteScratch) -> Option<bool> {
        let goes = !self.stays(hash) && self.targets(hash, scratch).contains(&i);
        goes.then(|| self.future.index_of_hash(hash) == Some(i))
    }
}

impl Node {
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

    /// Writes and fsyncs everything this node holds (what a migration's stream brought,
    /// before its `drained` is acknowledged).
    pub(crate) fn sync_store(&self) -> std::io::Result<()> {
        self.store.sync_all()
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
                let view = self.view_of(
                    v.epoch,
                    &v.serving,
                    (v.replicas, v.write_policy),
                    m.phase,
                    &m.other,
                    id,
                );
                self.view.store(Arc::new(view));
            }
        }
    }

    /// Says `drained` for migration `id` to every new owner in `serving` (a source with
    /// nothing to send), on a thread of its own that asks a node that does not answer
    /// again until it does, then reports the hand-off done.
    pub(super) fn hand_off_empty(self: &Arc<Node>, id: u64, serving: &Ring) {
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

    pub(super) fn start_copier(self: &Arc<Node>, id: u64, t: &Topology) {
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
    pub(super) fn run_copier(
        self: &Arc<Node>,
        id: u64,
        serving: &Ring,
        future: &Ring,
        started_ms: u64,
    ) {
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
    pub(super) fn copy(
        &self,
        id: u64,
        serving: &Ring,
        future: &Ring,
        started_ms: u64,
    ) -> Result<(), ClusterError> {
        let mut pipes: HashMap<usize, Pipe> = HashMap::new();
        let me = self.me.as_str();
        let now = self.view();
        let route = Route {
            me,
            serving,
            future,
            replicas: now.replicas as usize,
        };
        let mut scratch = RouteScratch::default();
        // A key this node owns under both rings goes to its new holders the way its
        // write-through copies do — down the one copy link to each, in order with the
        // copies of later writes (in the hand-off this node serves the key and copies it
        // there itself): the future ring as a view.
        let ahead = View {
            epoch: now.epoch,
            serving: future.clone(),
            replicas: now.replicas,
            write_policy: now.write_policy,
            migration: None,
        };
        let mut staying: Vec<Vec<u8>> = Vec::new();
        // Every write begun before this node took the copy view (and so not logged as a
        // change) is applied before the snapshot starts, so the snapshot sees it.
        self.grace(id);
        // Snapshot: every key that leaves, as it is now — in memory, then on disk (a
        // durable node's cold keys). Per new owner, the changes sent since its last
        // confirmed batch (sent again if its stream fails).
        let mut unconfirmed: HashMap<usize, Vec<Vec<u8>>> = HashMap::new();
        let mut pass = Pass::default();
        let mut items = Vec::with_capacity(512);
        loop {
            if self.abandoned(id) {
                return Ok(());
            }
            items.clear();
            let done = pass.step(&self.store, 512, &mut items, |key| {
                !route
                    .targets(kvlab_ring::key_hash(key), &mut scratch)
                    .is_empty()
            })?;
            for item in &items {
                let hash = kvlab_ring::key_hash(item.key());
                if route.stays(hash) {
                    staying.push(item.key().to_vec());
                    continue;
                }
                let owner = future.index_of_hash(hash);
                for &i in route.targets(hash, &mut scratch) {
                    let sent = self.pipe(&mut pipes, i, future, id).and_then(|pipe| {
                        pipe.set(item.key(), item.flags(), item.exptime(), item.value())
                    });
                    match sent {
                        Ok(()) => {
                            let mut p = self.progress.lock();
                            // Each key once, sent to its new owner (a new holder's
                            // copy counts in the bytes only).
                            p.keys_copied += u64::from(owner == Some(i));
                            p.bytes_sent += item.value().len() as u64;
                        }
                        Err(e) => {
                            self.lost_stream(id, i, e, &mut pipes, &mut unconfirmed, &route)?
                        }
                    }
                }
            }
            if !staying.is_empty() {
                self.replicate_all(&ahead, &staying)?;
                staying.clear();
            }
            self.flush_streams(id, &mut pipes, &mut unconfirmed, &route)?;
            if done {
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
                let hash = kvlab_ring::key_hash(&key);
                if route.targets(hash, &mut scratch).is_empty() {
                    continue;
                }
                if route.stays(hash) {
                    staying.push(key);
                    continue;
                }
                // The key's state wherever it is: a durable node may have evicted it to
                // disk since the write (absent from memory is not deleted).
                let now = match self.store.peek_through(&key) {
                    Ok(now) => now,
                    Err(e) => {
                        self.changes.lock().insert(key);
                        let e = format!("reading the data directory: {e}");
                        return Err(ClusterError::Migration(e));
                    }
                };
                self.progress.lock().changes_sent += 1;
                for &i in route.targets(hash, &mut scratch) {
                    let sent = self
                        .pipe(&mut pipes, i, future, id)
                        .and_then(|pipe| match &now {
                            Some(item) => {
                                pipe.set(&key, item.flags(), item.exptime(), item.value())?;
                                Ok(item.value().len() as u64)
                            }
                            None => pipe.delete(&key).map(|()| 0),
                        });
                    match sent {
                        Ok(bytes) => {
                            self.progress.lock().bytes_sent += bytes;
                            unconfirmed.entry(i).or_default().push(key.clone());
                        }
                        Err(e) => {
                            self.changes.lock().insert(key.clone());
                            self.lost_stream(id, i, e, &mut pipes, &mut unconfirmed, &route)?;
                        }
                    }
                }
            }
            if !staying.is_empty() {
                self.progress.lock().changes_sent += staying.len() as u64;
                if let Err(e) = self.replicate_all(&ahead, &staying) {
                    // As a stream that failed: while copying the migration fails; in the
                    // hand-off the keys go again (the holder may be paused or restarting).
                    self.changes.lock().extend(staying.drain(..));
                    if self.copying(id) {
                        return Err(e);
                    }
                    self.progress.lock().waiting_for = Some(e.to_string());
                    std::thread::sleep(Duration::from_millis(50));
                } else {
                    self.progress.lock().waiting_for = None;
                }
                staying.clear();
            }
            self.flush_streams(id, &mut pipes, &mut unconfirmed, &route)?;
            if last && self.changes.lock().is_empty() {
                // `drained` to every new owner first, then their answers: each syncs its
                // store before it answers, so they sync at the same time rather than one
                // after another.
                let owners = (0..future.nodes().len()).filter(|&i| future.nodes()[i] != me);
                let mut failed = Vec::new();
                for i in owners.clone() {
                    let said = self.pipe(&mut pipes, i, future, id).and_then(|pipe| {
                        pipe.line(format!("cluster drained {id} {me}\r\n").as_bytes())?;
                        pipe.send()
                    });
                    if let Err(e) = said {
                        failed.push((i, e));
                    }
                }
                for i in owners {
                    let Some(pipe) = pipes.get_mut(&i) else {
                        continue;
                    };
                    // Refused: the new owner could not make what it was sent durable; the
                    // stream goes again, as one that failed.
                    match pipe.flush() {
                        Ok(0) => {}
                        Ok(_) => failed.push((
                            i,
                            ClusterError::Migration(
                                "the new owner could not sync what it was sent".into(),
                            ),
                        )),
                        Err(e) => failed.push((i, e)),
                    }
                }
                if failed.is_empty() {
                    break;
                }
                for (i, e) in failed {
                    self.lost_stream(id, i, e, &mut pipes, &mut unconfirmed, &route)?;
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
    pub(super) fn flush_streams(
        &self,
        id: u64,
        pipes: &mut HashMap<usize, Pipe>,
        unconfirmed: &mut HashMap<usize, Vec<Vec<u8>>>,
        route: &Route<'_>,
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
                Err(e) => self.lost_stream(id, i, e, pipes, unconfirmed, route)?,
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
    pub(super) fn lost_stream(
        &self,
        id: u64,
        i: usize,
        error: ClusterError,
        pipes: &mut HashMap<usize, Pipe>,
        unconfirmed: &mut HashMap<usize, Vec<Vec<u8>>>,
        route: &Route<'_>,
    ) -> Result<(), ClusterError> {
        pipes.remove(&i);
        if self.copying(id) {
            return Err(error);
        }
        self.changes
            .lock()
            .extend(unconfirmed.remove(&i).unwrap_or_default());
        let node = &route.future.nodes()[i];
        tracing::warn!("migration {id}: the stream to {node} failed ({error}); its keys go again once it answers");
        let mut reason = error.to_string();
        let mut pause = Duration::from_millis(50);
        while !self.abandoned(id) {
            self.progress.lock().waiting_for = Some(format!("{node}: {reason}"));
            match self.resend(id, i, route) {
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

    /// A new stream to new node `i` of migration `id` that carries every key of it this
    /// node serves, as it is now: with `set` the keys `i` owns (it serves none of them
    /// before this node's `drained`), with `add` those it only holds copies of — their
    /// owner may be serving them already (it had this node's `drained`, the stream to `i`
    /// failed after), and its newer copies must stay.
    pub(super) fn resend(
        &self,
        id: u64,
        i: usize,
        route: &Route<'_>,
    ) -> Result<Pipe, ClusterError> {
        let mut pipe = Pipe::connect(&route.future.nodes()[i], STREAM_TIMEOUT)?.import_generation(
            id,
            &self.me,
            next_generation(),
        )?;
        let mut pass = Pass::default();
        let mut items = Vec::with_capacity(512);
        let mut scratch = RouteScratch::default();
        loop {
            items.clear();
            let done = pass.step(&self.store, 512, &mut items, |key| {
                route
                    .goes_to(kvlab_ring::key_hash(key), i, &mut scratch)
                    .is_some()
            })?;
            for item in &items {
                let (key, flags, exptime, value) =
                    (item.key(), item.flags(), item.exptime(), item.value());
                match route.goes_to(kvlab_ring::key_hash(key), i, &mut scratch) {
                    Some(true) => pipe.set(key, flags, exptime, value)?,
                    Some(false) => pipe.add(key, flags, exptime, value)?,
                    None => {}
                }
            }
            let refused = pipe.flush()?;
            if refused > 0 {
                self.progress.lock().refused += refused;
            }
            if done {
                return Ok(pipe);
            }
        }
    }

    /// Whether migration `id` is still in its copy (a failure then rolls it back).
    fn copying(&self, id: u64) -> bool {
        self.view()
            .migration
            .as_ref()
            .is_some_and(|m| m.id == id && m.phase == Phase::Copy)
    }

    pub(super) fn abandoned(&self, id: u64) -> bool {
        self.stop.load(Ordering::Relaxed)
            || self.finish.load(Ordering::Acquire) == u64::MAX
            || self.view().migration.as_ref().is_none_or(|m| m.id != id)
    }

    pub(super) fn pipe<'p>(
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
}
