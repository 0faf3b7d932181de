//! Decide: finished parts applied to their jobs (a failed read retried on another
//! replica), then a job's reply composed under its class — one read's reply, multi-get
//! values merged in key order, a write counted under its policy, a failure worded — and
//! handed back, or sent again when a cluster node redirected it.

use std::time::Instant;

use kvlab_net::Completion;

use crate::config::ReplicaWritePolicy;
use crate::forward::Kind;
use crate::stats::Sample;

use super::{Class, Fail, Part, ProxyWork, State, Worker, NONE, REDO_PAUSE, REDO_PAUSE_MAX};

/// What a decided job's reply says, for its figures.
#[derive(Clone, Copy)]
struct Composed {
    /// The reply is an error (a failure, or a backend's error line).
    error: bool,
    /// The values it carries.
    hits: u32,
    /// The keys it asked for (0 for a write).
    keys: u32,
}

impl Worker {
    /// Applies finished parts to their jobs: retries failed reads, decides what can be.
    pub(super) fn settle(
        &mut self,
        works: &mut [ProxyWork],
        done: &mut dyn FnMut(usize, Completion),
    ) {
        while let Some(p) = self.ready.pop() {
            let part = &self.parts[p as usize];
            let (i, state, retry) = (part.job as usize, part.state, part.retry);
            if self.jobs[i].decided {
                continue;
            }
            self.jobs[i].waiting -= 1;
            if self.jobs[i].class.writes() && self.missed(p) {
                self.jobs[i].missed = true;
            }
            match self.jobs[i].class {
                Class::Get | Class::ReadAsIs { .. } => {
                    if failed(state) {
                        if !retry && self.retry_read(i, p, &works[i]) {
                            self.jobs[i].retried = true;
                        } else {
                            self.jobs[i].failed += 1;
                        }
                    }
                    if self.jobs[i].waiting == 0 {
                        self.decide(i, works, done);
                    }
                }
                Class::Cas => {
                    if self.jobs[i].parts == 1 && success(&self.parts[p as usize]) {
                        self.cas_follow_up(i, &works[i]);
                    }
                    self.decide(i, works, done);
                }
                Class::ReadAll => {
                    if failed(state) {
                        self.jobs[i].failed += 1;
                    } else {
                        self.jobs[i].ok += 1;
                    }
                    if self.jobs[i].waiting == 0 {
                        self.decide(i, works, done);
                    }
                }
                Class::Write { policy } => {
                    let job = &mut self.jobs[i];
                    if success(&self.parts[p as usize]) {
                        job.ok += 1;
                    } else {
                        job.failed += 1;
                    }
                    let need = match policy {
                        ReplicaWritePolicy::All => job.parts,
                        ReplicaWritePolicy::Majority => job.parts / 2 + 1,
                    };
                    // A write a replica missed waits for the others: it is recorded again once
                    // they have applied it (see `decide`).
                    let early = !job.missed && (job.ok >= need || job.failed > job.parts - need);
                    if job.waiting == 0 || early {
                        self.decide(i, works, done);
                    }
                }
            }
        }
    }

    /// Whether write part `p` failed on a backend of a replicated pool: it missed the write
    /// (a reply that came after its backend's ejection did reach it).
    fn missed(&self, p: u32) -> bool {
        let part = &self.parts[p as usize];
        matches!(part.state, State::Failed(f) if f != Fail::Stale)
            && self.routing.repair[part.backend as usize]
    }

    /// Sends failed read part `p` of job `i` again, to the next replica; false when there
    /// is none to try.
    fn retry_read(&mut self, i: usize, p: u32, work: &ProxyWork) -> bool {
        let before = self.jobs[i].parts;
        let (buf, shape) = (&work.buf[..], work.shape);
        let failed_backend = self.parts[p as usize].backend as usize;
        match (shape.kind, self.jobs[i].class) {
            (Kind::Get { cas, .. }, _) => {
                // Only if every key of the part has another usable replica.
                let multi = self.jobs[i].key_part.len() > 1;
                for (k, key) in shape.keys(buf).enumerate() {
                    if self.jobs[i].key_part[k] != p {
                        continue;
                    }
                    let pool = self.routing.pool_of(key);
                    self.read_candidates(pool, key, multi, cas);
                    if !self.another_replica(pool, failed_backend) {
                        return false;
                    }
                }
                self.send_keys(i, buf, shape, Some(p), true);
            }
            (Kind::Meta(_), Class::ReadAsIs { .. }) => {
                let pool = self.jobs[i].pool;
                shape.with_key(buf, |k| self.routing.replicas(pool, k, &mut self.replicas));
                if !self.another_replica(pool, failed_backend) {
                    return false;
                }
                self.send_read_as_is(i, buf, Some(failed_backend), true);
            }
            _ => return false,
        }
        self.jobs[i].parts > before
    }

    /// Whether a backend of `self.replicas` other than `failed` can serve a read of `pool`.
    fn another_replica(&self, pool: usize, failed: usize) -> bool {
        let policy = self.routing.pools[pool].pool.read_policy;
        self.routing
            .choose_read(&self.replicas, Some(failed), policy, 0)
            .is_some()
    }

    /// Composes job `i`'s reply and hands it back.
    pub(super) fn decide(
        &mut self,
        i: usize,
        works: &mut [ProxyWork],
        done: &mut dyn FnMut(usize, Completion),
    ) {
        let now = self.now;
        self.jobs[i].decided = true;
        if self.jobs[i].missed {
            self.record_missed_again(i);
        }
        self.assembled.clear();
        let composed = self.compose(i, works);
        self.finished.push(i as u32);
        if self.routing.config.cluster.is_some() && is_redirect(&self.assembled) {
            // Not an answer for the client: sent again by the new ring (see `redo_due`).
            self.redirected(i, works, now);
            return;
        }
        let work = &mut works[i];
        self.push_sample(i, work, composed, now);
        let mut reply = std::mem::take(&mut work.buf);
        reply.clear();
        if !work.noreply {
            std::mem::swap(&mut reply, &mut self.assembled);
        }
        done(self.jobs[i].ticket, Completion::Reply(reply));
    }

    /// A write of job `i` that a backend missed: recorded when it failed, and again now that
    /// the other replicas have answered (a repair that read a peer before the write reached
    /// it is done again).
    fn record_missed_again(&self, i: usize) {
        let mut p = self.jobs[i].first;
        while p != NONE {
            if self.missed(p) {
                self.missed_write(p);
            }
            p = self.parts[p as usize].next;
        }
    }

    /// Composes job `i`'s reply into `self.assembled`, under its class.
    fn compose(&mut self, i: usize, works: &[ProxyWork]) -> Composed {
        match self.jobs[i].class {
            Class::Get | Class::ReadAsIs { .. } => self.compose_read(i, &works[i]),
            Class::Cas => self.compose_cas(i),
            Class::ReadAll => self.compose_read_all(i),
            Class::Write { policy } => self.compose_write(i, policy),
        }
    }

    /// A read (`get`-family, or one read sent as is): a failure, a backend's own error
    /// line, the values of a multi-part get merged, or the one reply.
    fn compose_read(&mut self, i: usize, work: &ProxyWork) -> Composed {
        let job = &self.jobs[i];
        let mut composed = Composed {
            error: false,
            hits: 0,
            keys: job.key_part.len() as u32,
        };
        if job.failed > 0 {
            composed.error = true;
            let p = self
                .last_where(i, |part| failed(part.state))
                .unwrap_or(job.last);
            self.failure_reply(p);
        } else if let Some(p) = self.first_where(i, |part| {
            matches!(
                part.state,
                State::Replied {
                    error: true,
                    server_error: false
                }
            )
        }) {
            // A backend's own error line (e.g. CLIENT_ERROR) goes back as is.
            composed.error = true;
            let reply = &self.parts[p as usize].reply;
            self.assembled.extend_from_slice(reply);
        } else if job.class == Class::Get && composed.keys > 1 {
            composed.hits = self.merge(i, work);
        } else if let Some(p) = self.last_where(i, |part| !failed(part.state)) {
            let part = &self.parts[p as usize];
            composed.hits = part.values;
            composed.keys = composed.keys.max(1);
            self.assembled.extend_from_slice(&part.reply);
        } else {
            composed.error = true;
            self.failure_reply(job.last);
        }
        composed
    }

    /// A replicated compare-and-set: the primary's reply (or its failure).
    fn compose_cas(&mut self, i: usize) -> Composed {
        let p = self.jobs[i].first;
        let error = failed(self.parts[p as usize].state);
        match self.parts[p as usize].state {
            State::Failed(_) => self.failure_reply(p),
            _ => {
                let reply = &self.parts[p as usize].reply;
                self.assembled.extend_from_slice(reply);
            }
        }
        Composed {
            error,
            hits: 0,
            keys: 0,
        }
    }

    /// A read sent to every replica: the first replica's reply that did not fail.
    fn compose_read_all(&mut self, i: usize) -> Composed {
        let mut composed = Composed {
            error: false,
            hits: 0,
            keys: 1,
        };
        match self.first_where(i, |part| !failed(part.state)) {
            Some(p) => {
                let part = &self.parts[p as usize];
                composed.hits = part.values;
                composed.error = matches!(part.state, State::Replied { error: true, .. });
                self.assembled.extend_from_slice(&part.reply);
            }
            None => {
                composed.error = true;
                self.failure_reply(self.jobs[i].first);
            }
        }
        composed
    }

    /// A write to every replica, answered under `policy`: a success once enough replicas
    /// applied it, otherwise the first reply that says why not.
    fn compose_write(&mut self, i: usize, policy: ReplicaWritePolicy) -> Composed {
        let job = &self.jobs[i];
        let need = match policy {
            ReplicaWritePolicy::All => job.parts,
            ReplicaWritePolicy::Majority => job.parts / 2 + 1,
        };
        let mut error = false;
        let p = if job.ok >= need {
            self.first_where(i, success)
        } else {
            error = true;
            self.first_where(i, |part| part.state != State::Waiting && !success(part))
        };
        match p {
            Some(p) if matches!(self.parts[p as usize].state, State::Failed(_)) => {
                self.failure_reply(p)
            }
            Some(p) => {
                let part = &self.parts[p as usize];
                self.assembled.extend_from_slice(&part.reply);
            }
            None => self
                .assembled
                .extend_from_slice(b"SERVER_ERROR proxy: no reply\r\n"),
        }
        Composed {
            error,
            hits: 0,
            keys: 0,
        }
    }

    /// Job `i`'s work was redirected by a cluster node: queued to go again by the new ring.
    fn redirected(&mut self, i: usize, works: &mut [ProxyWork], now: Instant) {
        let ticket = self.jobs[i].ticket;
        let mut work = std::mem::replace(&mut works[i], ProxyWork::vacant(now));
        // The first redirect goes again at once (the ring moved), later ones after a
        // pause that doubles each time (a hand-off under way).
        let due = match work.redirects {
            0 => now,
            n => now + (REDO_PAUSE * (1 << (n - 1).min(7))).min(REDO_PAUSE_MAX),
        };
        work.redirects = work.redirects.saturating_add(1);
        self.redo.push((ticket, work, due));
    }

    /// Records the figures of job `i` (its work `work`), decided at `now`.
    fn push_sample(&mut self, i: usize, work: &ProxyWork, composed: Composed, now: Instant) {
        let job = &self.jobs[i];
        let mut backend_ns = 0;
        let mut p = job.first;
        while p != NONE {
            let part = &self.parts[p as usize];
            if part.state != State::Waiting {
                backend_ns = backend_ns
                    .max(part.done.saturating_duration_since(part.sent).as_nanos() as u64);
            }
            p = part.next;
        }
        self.samples.push(Sample {
            read: !matches!(job.class, Class::Write { .. }),
            keys: composed.keys,
            hits: composed.hits,
            error: composed.error,
            retried: job.retried,
            parts: job.parts,
            arrival: work.arrival,
            queue_len: work.queue_len,
            queue_ns: work
                .dequeued
                .saturating_duration_since(work.arrival)
                .as_nanos() as u64,
            worker_ns: now.saturating_duration_since(work.dequeued).as_nanos() as u64,
            backend_ns,
        });
    }

    fn first_where(&self, i: usize, mut f: impl FnMut(&Part) -> bool) -> Option<u32> {
        let mut p = self.jobs[i].first;
        while p != NONE {
            if f(&self.parts[p as usize]) {
                return Some(p);
            }
            p = self.parts[p as usize].next;
        }
        None
    }

    fn last_where(&self, i: usize, mut f: impl FnMut(&Part) -> bool) -> Option<u32> {
        let mut found = None;
        let mut p = self.jobs[i].first;
        while p != NONE {
            if f(&self.parts[p as usize]) {
                found = Some(p);
            }
            p = self.parts[p as usize].next;
        }
        found
    }

    /// `SERVER_ERROR backend <name> <why>` for failed part `p` (or the backend's own
    /// `SERVER_ERROR` line).
    fn failure_reply(&mut self, p: u32) {
        let Some(part) = self.parts.get(p as usize) else {
            self.assembled
                .extend_from_slice(b"SERVER_ERROR proxy: request could not be sent\r\n");
            return;
        };
        match part.state {
            State::Failed(fail) => {
                let name = &self.routing.backends[part.backend as usize].name;
                self.assembled.extend_from_slice(b"SERVER_ERROR backend ");
                self.assembled.extend_from_slice(name.as_bytes());
                self.assembled.push(b' ');
                self.assembled.extend_from_slice(fail.reason().as_bytes());
                self.assembled.extend_from_slice(b"\r\n");
            }
            _ => self.assembled.extend_from_slice(&part.reply),
        }
    }

    /// Merges the `VALUE` blocks of a multi-part get in the order the keys were asked for,
    /// each part's by where framing found them; returns the values.
    fn merge(&mut self, i: usize, work: &ProxyWork) -> u32 {
        let mut hits = 0;
        for (k, key) in work.shape.keys(&work.buf).enumerate() {
            let p = self.jobs[i].key_part[k] as usize;
            let part = &mut self.parts[p];
            // A backend answers the hits in the order asked: the key's block is the part's
            // next one when it names the key.
            if let Some(v) = part.blocks.get(part.cursor) {
                if part.reply.get(v.key_at..v.key_end) == Some(key) {
                    self.assembled
                        .extend_from_slice(&part.reply[v.start..v.end]);
                    part.cursor += 1;
                    hits += 1;
                }
            }
        }
        self.assembled.extend_from_slice(b"END\r\n");
        hits
    }

    pub(super) fn fail_undecided(&mut self, done: &mut dyn FnMut(usize, Completion)) {
        let mut works = std::mem::take(&mut self.works);
        for i in 0..self.jobs.len() {
            if self.jobs[i].active && !self.jobs[i].decided {
                self.jobs[i].failed += 1;
                self.jobs[i].waiting = 0;
                self.decide(i, &mut works, done);
            }
        }
        self.works = works;
        self.free_finished();
    }
}

/// Whether `reply` is a kvlab cluster node's redirect (`SERVER_ERROR MOVED|TRYAGAIN …`).
fn is_redirect(reply: &[u8]) -> bool {
    reply
        .strip_prefix(b"SERVER_ERROR ")
        .is_some_and(|r| r.starts_with(b"MOVED ") || r.starts_with(b"TRYAGAIN "))
}

/// Whether a read part failed (and is worth a retry elsewhere).
fn failed(state: State) -> bool {
    matches!(
        state,
        State::Failed(_)
            | State::Replied {
                server_error: true,
                ..
            }
    )
}

/// Whether a write's reply says it was applied.
fn success(part: &Part) -> bool {
    let State::Replied { error: false, .. } = part.state else {
        return false;
    };
    let r = &part.reply;
    r.is_empty() // a quiet meta write that succeeded
        || r.starts_with(b"STORED")
        || r.starts_with(b"DELETED")
        || r.starts_with(b"TOUCHED")
        || r.starts_with(b"OK")
        || r.starts_with(b"HD")
        || r.starts_with(b"VA")
        || r.first().is_some_and(u8::is_ascii_digit)
}
