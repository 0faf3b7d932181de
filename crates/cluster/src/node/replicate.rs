//! A node's write-through copies ([`crate::copies`]) as the engine and the node's own
//! threads use them: a round's writes sent to their holders, and waited for where a
//! thread may wait.

use super::*;

impl Node {
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
                    .owners_of_hash(kvlab_ring::key_hash(key), r, &mut owners);
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
                        behind: true,
                    });
                    batch.behind &= ticket >= BEHIND;
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

    /// When the copies held to go out together are due, if any are held
    /// ([`crate::copies::COPY_LINGER`]).
    pub fn held_copies_due(&self) -> Option<Instant> {
        self.copies.held_deadline()
    }

    /// Sends the held copies that are due at `now`.
    pub fn release_held_copies(&self, now: Instant) {
        self.copies.release_held(now);
    }

    /// The keys whose copies are not all confirmed ([`crate::copies::Unconfirmed`]).
    pub fn unconfirmed(&self) -> &Unconfirmed {
        &self.copies.unconfirmed
    }

    /// With copies: keeps a copy sender (and its open stream) for every other ring node,
    /// so that a write's first copy finds its stream open, and stops those of nodes that
    /// left. During a migration, for the nodes of both rings: the copier sends the keys
    /// this node keeps owning to their new holders down these links ([`Node::copy`]).
    pub(super) fn follow_holders(&self) {
        let v = self.view();
        if v.replicas < 2 {
            return;
        }
        let mut nodes = v.serving.nodes().to_vec();
        if let Some(m) = &v.migration {
            for n in m.other.nodes() {
                if !nodes.contains(n) {
                    nodes.push(n.clone());
                }
            }
        }
        self.copies.follow(&nodes);
    }
}
