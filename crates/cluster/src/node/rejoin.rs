//! A node that starts empty while the ring names it: it answers `TRYAGAIN` until every
//! ring peer (and every recent leaver) has streamed it what it holds of this node's keys
//! (`cluster resync`), and the peers' side of that stream.

use super::*;

impl Node {
    /// A node that starts with an empty store while the ring names it, with copies kept
    /// elsewhere (restarted after `kill -9`, or new in a cluster just created): before it
    /// serves any key it asks every other ring node to send it what they hold of the keys
    /// it owns or holds copies of (`cluster resync ME held`, then `… strays`: the peer
    /// streams those items with `add` — never over one already here — then `cluster
    /// resynced PEER`). A migration
    /// still copying is rolled back first (this node cannot send what it had); one in its
    /// hand-off goes on (see `hand_off_empty`). Meanwhile it answers `TRYAGAIN` for every
    /// key; peers that are down are asked again until they answer or leave the ring.
    pub(super) fn rejoin(self: Arc<Node>) {
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
    pub(super) fn resync_round(
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

    pub(super) fn send_resync(&self, target: &str, strays: bool) -> Result<(), ClusterError> {
        let view = self.view();
        let r = view.replicas as usize;
        let mut pipe = Pipe::connect(target, STREAM_TIMEOUT)?.import(RESYNC, &self.me)?;
        let mut pass = Pass::default();
        let mut items = Vec::with_capacity(512);
        let mut owners = Vec::with_capacity(r);
        loop {
            items.clear();
            let done = pass.step(&self.store, 512, &mut items, |key| {
                view.serving
                    .owners_of_hash(kvlab_ring::key_hash(key), r, &mut owners);
                // Only what this node holds itself: a stray item (a key it no longer
                // holds, kept until its nodes confirm they have it) may be older than
                // the copy the key's holder sends, and `add` keeps whichever is first.
                let nodes = view.serving.nodes();
                owners.iter().any(|&i| nodes[i] == target)
                    && owners.iter().any(|&i| nodes[i] == self.me) != strays
            })?;
            for item in &items {
                pipe.add(item.key(), item.flags(), item.exptime(), item.value())?;
            }
            pipe.flush()?;
            if done || self.stop.load(Ordering::Relaxed) {
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
}
