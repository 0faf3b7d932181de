//! After a migration: what this node no longer holds goes, in small steps; with copies,
//! each item first handed over to the nodes that hold its key now, and each key it owns
//! copied again to its holders.

use super::*;

impl Node {
    /// A node out of the ring that still holds items (its clean-up hands each to the nodes
    /// that hold its key now): waits at most `patience` for that hand-over to end before it
    /// stops. With copies, such an item may be the last one of its key (the new owner
    /// killed before it copied the key to the ring's other holders): stopping the node
    /// right after it left — even before `cluster remove` returned, or while its own view
    /// still shows the hand-off of the migration that takes it out — must not take it
    /// along.
    pub(super) fn finish_hand_over(&self, patience: Duration) {
        let deadline = Instant::now() + patience;
        loop {
            let v = self.view();
            let me = &self.me;
            let (leaving, left) = match &v.migration {
                Some(m) => (
                    m.phase == Phase::Handoff
                        && !v.serving.nodes().contains(me)
                        && m.other.nodes().contains(me),
                    false,
                ),
                None => (false, !v.serving.nodes().contains(me)),
            };
            if !(leaving || left) || v.replicas < 2 {
                return;
            }
            if left && self.progress.lock().handover_epoch >= v.epoch {
                return;
            }
            let items = self.store.stats().curr_items;
            if items == 0 {
                return;
            }
            if Instant::now() >= deadline {
                tracing::warn!(
                    items,
                    "stopping before this node handed over what it held since it left the ring"
                );
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends each of `items` (of keys this node no longer holds under `view`) to the
    /// nodes that hold the key under `view` with `add` (a node that has the key keeps its
    /// own) on a `cluster import HANDOVER` stream per node; returns the keys some of whose
    /// nodes did not confirm (unreachable, or refused): those items stay here for now.
    /// A node that failed is in `failed` and not tried again in this pass (each try of
    /// an unanswering node costs [`REPLICA_TIMEOUT`]), so one paused holder does not hold
    /// up the hand-over to the others.
    pub(super) fn hand_over(
        &self,
        view: &View,
        items: &[kvlab_store::ExportedItem],
        pipes: &mut HashMap<String, Pipe>,
        failed: &mut HashSet<String>,
    ) -> HashSet<Vec<u8>> {
        let r = view.replicas as usize;
        let mut owners = Vec::with_capacity(r);
        let mut sent: HashMap<String, Vec<&[u8]>> = HashMap::new();
        let mut kept: HashSet<Vec<u8>> = HashSet::new();
        for item in items {
            view.serving
                .owners_of_hash(kvlab_ring::key_hash(item.key()), r, &mut owners);
            for &i in owners.iter() {
                let node = &view.serving.nodes()[i];
                if failed.contains(node) {
                    kept.insert(item.key().to_vec());
                    continue;
                }
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
                        failed.insert(node.clone());
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
                failed.insert(node);
            }
        }
        kept
    }

    /// After a migration: removes the items this node no longer owns, in small steps, as
    /// long as the ring stays that of `epoch` (an item is removed only if unchanged since
    /// it was looked at).
    pub(super) fn start_cleanup(self: &Arc<Node>, epoch: u64) {
        let node = self.clone();
        let spawned = std::thread::Builder::new()
            .name("kvlab-cleanup".into())
            .spawn(move || {
                // Requests begun under an older view (a migration stream's last items)
                // are applied before the scan starts, so it sees them.
                node.grace(epoch);
                let mut pass = Pass::default();
                let mut items = Vec::with_capacity(256);
                let mut handover: HashMap<String, Pipe> = HashMap::new();
                let mut failed: HashSet<String> = HashSet::new();
                // Items a key's node did not take in this pass (it is down, or catching up
                // and refusing strays): the scan starts over for them until none is left.
                let mut kept_in_pass = 0u64;
                // Keys this node owns whose copy to a holder of this ring failed (it was
                // paused, cut off, restarting): sent again after each pass until they are
                // confirmed. The node that held such a copy before may have left for good.
                let mut recopy: Vec<Vec<u8>> = Vec::new();
                let mut first_pass = true;
                let mut retry = Duration::from_millis(50);
                loop {
                    let view = node.view();
                    if view.epoch != epoch || node.stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let t0 = Instant::now();
                    // Time spent waiting on other nodes (copies, hand-over): not work.
                    let mut waited = Duration::ZERO;
                    items.clear();
                    let me = node.me.as_str();
                    let r = view.replicas as usize;
                    let mut owners = Vec::with_capacity(r);
                    let mut mine = Vec::new();
                    // Memory, then a durable node's disk: a moved key evicted to disk
                    // must go from there too, or it would come back. The keys this node
                    // owns come too (with copies) and are set apart from the exported
                    // items, which are live: a dead record on disk (flushed, or dropped
                    // at the start) must not be copied as a delete to the key's holders.
                    let held = |k: &[u8], owners: &mut Vec<usize>| {
                        let h = kvlab_ring::key_hash(k);
                        view.serving.owners_of_hash(h, r, owners);
                        let nodes = view.serving.nodes();
                        let owned = owners.first().is_some_and(|&i| nodes[i] == me);
                        (owned, owners.iter().any(|&i| nodes[i] == me))
                    };
                    let step = pass.step(&node.store, 256, &mut items, |k| {
                        let (owned, held) = held(k, &mut owners);
                        !held || (r > 1 && owned)
                    });
                    items.retain(|item| {
                        let (owned, held) = held(item.key(), &mut owners);
                        if owned && r > 1 {
                            mine.push(item.key().to_vec());
                        }
                        !held
                    });
                    let done = match step {
                        Ok(done) => done,
                        Err(e) => {
                            tracing::warn!("clean-up after epoch {epoch}: {e}");
                            node.progress.lock().error = Some(e.to_string());
                            return;
                        }
                    };
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
                        let t = Instant::now();
                        let copied = node.replicate_all(&view, &mine);
                        waited += t.elapsed();
                        if let Err(e) = copied {
                            node.progress.lock().replica_errors += 1;
                            tracing::warn!("copying keys to their holders: {e} (tried again)");
                            recopy.append(&mut mine);
                        }
                    }
                    if r > 1 {
                        // With copies, an item this node no longer holds may be the last
                        // one left (its owner died before it copied the key to the holders
                        // of the new ring): it goes only once the key's nodes under this
                        // ring confirm they have it, each sent the item as `add`.
                        let t = Instant::now();
                        let kept = node.hand_over(&view, &items, &mut handover, &mut failed);
                        waited += t.elapsed();
                        kept_in_pass += kept.len() as u64;
                        items.retain(|item| !kept.contains(item.key()));
                    }
                    for item in &items {
                        // Only if unchanged since looked at, in memory or on disk.
                        if matches!(node.store.delete_through(item.key(), item.cas()), Ok(true)) {
                            node.progress.lock().cleaned += 1;
                        }
                    }
                    if done {
                        if !recopy.is_empty() {
                            match node.replicate_all(&view, &recopy) {
                                Ok(()) => recopy.clear(),
                                Err(e) => {
                                    tracing::debug!("copying keys to their holders again: {e}")
                                }
                            }
                        }
                        let mut p = node.progress.lock();
                        p.handover_pending = kept_in_pass + recopy.len() as u64;
                        if kept_in_pass == 0 && recopy.is_empty() {
                            p.handover_epoch = p.handover_epoch.max(epoch);
                            drop(p);
                            // A durable node's deletions reach the disk now, not with the
                            // next flush: a moved key must not come back after a crash.
                            if let Err(e) = node.store.sync_all() {
                                tracing::warn!("clean-up after epoch {epoch}: {e}");
                            }
                            return;
                        }
                        drop(p);
                        handover.clear();
                        failed.clear();
                        std::thread::sleep(retry);
                        retry = (retry * 2).min(Duration::from_secs(1));
                        pass = Pass::default();
                        kept_in_pass = 0;
                        first_pass = false;
                        continue;
                    }
                    // Nothing waits for the clean-up: it takes at most a fifth of a core
                    // from the requests (as the crawler does). Waiting on a node that does
                    // not answer is not work: it does not stretch the pause (a leaver that
                    // is stopping has 2 s for its whole hand-over).
                    let busy = t0.elapsed().saturating_sub(waited);
                    std::thread::sleep((busy * 4).max(Duration::from_micros(50)));
                }
            });
        match spawned {
            Ok(h) => self.threads.lock().push(h),
            Err(e) => self.progress.lock().error = Some(e.to_string()),
        }
    }
}
