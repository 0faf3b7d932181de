//! Receiving: read a connection's replies, record each request's latency from its planned
//! and its sent time, follow redirects (`--cluster`), time out and reset connections.

use kvlab_client::{ConnError, Event, Status};
use mio::Token;

use super::{connect, note, GeneratorThread, STRIDE};
use crate::clock::mono_ns;
use crate::stats::{record, OpKind};

impl GeneratorThread<'_> {
    pub(super) fn on_ready(&mut self, c: usize, n: usize, now: u64) {
        // A warm-up request answered after the warm-up is left out of the measurement.
        let cut = self.cut();
        let Some(slot) = self.slots.get_mut(c) else {
            return;
        };
        let Some(Some(conn)) = slot.conns.get_mut(n) else {
            return;
        };
        if conn.has_output() {
            if let Err(e) = conn.flush() {
                self.reset(c, n, Some(ConnError::Io(e)));
                return;
            }
        }
        let cluster = self.router.is_some();
        let resend = &mut self.resend;
        let mut newest = 0u64;
        let counters = &mut self.cur.counters;
        let lat = &mut self.cur.latency;
        let lat_send = &mut self.cur.latency_send;
        let by_op = &mut self.cur.latency_by_op;
        let gen = &self.gen;
        let verify = gen.workload().verify;
        let single = gen.workload().multiget == 1;
        let mut bad_values = 0u32;
        let r = conn.on_readable(|ev| match ev {
            Event::Value {
                user, key, data, ..
            } => {
                if verify {
                    // A single get must be answered with its own key; every value must be the
                    // verifiable value of the key it is returned under. HTTP responses and meta
                    // `VA` replies do not name their key: a single get's value must be its
                    // key's, a multi-get's the valid value of the key it names.
                    let wl = gen.workload();
                    let ok = if key.is_empty() {
                        if single {
                            wl.check_value_of(user.key, data)
                        } else {
                            wl.check_value_any(data)
                        }
                    } else {
                        gen.check(key, data) && (!single || wl.key_index(key) == Some(user.key))
                    };
                    if !ok {
                        bad_values += 1;
                    }
                }
            }
            Event::Done { user, outcome, .. } if cluster && outcome.redirect.is_some() => {
                // Not an answer: the key lives elsewhere now, or its data is still on its
                // way there. Sent again below (values of a redirected get were none).
                newest = newest.max(outcome.redirect.unwrap_or(0));
                counters.redirects += 1;
                resend.push(user);
                bad_values = 0;
            }
            Event::Done { user, .. } if cut.left_out(user.planned) => {
                bad_values = 0;
            }
            Event::Done {
                user,
                kind,
                outcome,
            } => {
                counters.completed += 1;
                let op = match kind {
                    kvlab_client::ReqKind::Get { .. } => {
                        counters.gets += 1;
                        Some(OpKind::Get)
                    }
                    kvlab_client::ReqKind::Store => {
                        counters.sets += 1;
                        Some(OpKind::Set)
                    }
                    kvlab_client::ReqKind::Delete => {
                        counters.deletes += 1;
                        Some(OpKind::Delete)
                    }
                    kvlab_client::ReqKind::Line => None,
                };
                counters.hits += u64::from(outcome.hits);
                counters.misses += u64::from(outcome.misses);
                if outcome.status == Status::Error || bad_values > 0 {
                    counters.errors += 1;
                }
                if bad_values > 0 {
                    counters.verify_errors += u64::from(bad_values);
                    bad_values = 0;
                }
                record(lat, now.saturating_sub(user.planned));
                if let Some(op) = op {
                    record(by_op.of_mut(op), now.saturating_sub(user.planned));
                }
                record(lat_send, now.saturating_sub(user.sent));
            }
        });
        if !self.resend.is_empty() {
            if let Some(router) = self.router.as_mut() {
                if newest > router.ring.epoch() {
                    let from = router.addrs[n];
                    if let Err(e) = router.refresh_any(from) {
                        note(&mut self.notes, e.to_string());
                    }
                }
            }
            self.resend(c);
        }
        match r {
            Ok(0) => {}
            Ok(_) => self.resume(c, now),
            Err(e) => self.reset(c, n, Some(e)),
        }
    }

    /// Times out connections whose oldest request is older than the timeout.
    pub(super) fn check_timeouts(&mut self, now: u64) {
        let mut next = now + self.timeout_ns;
        for c in 0..self.slots.len() {
            for n in 0..self.slots[c].conns.len() {
                let oldest = self.slots[c].conns[n]
                    .as_ref()
                    .and_then(|k| k.oldest().map(|m| m.sent));
                if let Some(sent) = oldest {
                    if sent + self.timeout_ns <= now {
                        self.reset(c, n, None);
                    } else {
                        next = next.min(sent + self.timeout_ns);
                    }
                }
            }
        }
        self.next_timeout_check = next;
        // A slot with nothing in flight waits for no reply that would make it send again;
        // resumed here, a run's budget is always spent (a request-count run ends) even if
        // some path dropped a request without resuming its slot.
        for c in 0..self.slots.len() {
            if self.slots[c].in_flight() == 0 {
                self.resume(c, now);
            }
        }
    }

    /// Drops connection `c` after an error (`None`: a timeout), counts its pending requests,
    /// and reconnects.
    pub(super) fn reset(&mut self, c: usize, n: usize, err: Option<ConnError>) {
        let Some(mut conn) = self.slots[c].conns[n].take() else {
            return;
        };
        if self.router.is_some() && err.is_some() {
            // A cluster node that went away (removed and stopped, or dead): ask the others
            // for the ring and send what it had not answered again, by that ring.
            self.resend
                .extend(conn.drain_pending().map(|(_, meta)| meta));
            let _ = conn.deregister(self.poll.registry());
            drop(conn);
            if let Some(err) = &err {
                note(
                    &mut self.notes,
                    format!("cluster node {n} (slot {c}): {err}"),
                );
            }
            if let Some(router) = self.router.as_mut() {
                let from = router.addrs[n];
                if let Err(e) = router.refresh_any(from) {
                    note(&mut self.notes, e.to_string());
                }
            }
            self.resend(c);
            // What the node had not answered may all have failed again (its keys still
            // map to it): the slot must not be left with nothing in flight and nothing
            // to wake it.
            self.resume(c, mono_ns());
            return;
        }
        let lost = conn.drain_pending().count() as u64;
        let _ = conn.deregister(self.poll.registry());
        drop(conn);
        match &err {
            None => self.cur.counters.timeouts += lost,
            Some(e) => {
                self.cur.counters.errors += lost;
                note(&mut self.notes, format!("connection {c}: {e}"));
            }
        }
        let addr = match &self.router {
            Some(r) => r.addrs[n],
            None => self.cfg.target,
        };
        match connect(addr, self.cfg.protocol.wire()) {
            Ok(mut conn) => {
                if conn
                    .register(self.poll.registry(), Token(c * STRIDE + n))
                    .is_ok()
                {
                    self.slots[c].conns[n] = Some(conn);
                }
            }
            // A cluster node that left is simply not used again once the ring moves on.
            Err(e) if self.router.is_some() => {
                note(&mut self.notes, format!("reconnect {addr}: {e}"))
            }
            Err(e) => note(&mut self.notes, format!("reconnect {c}: {e}")),
        }
        // A cluster's other nodes still serve the slot; a single target's slot without its
        // connection is dead, and resuming it sends nothing.
        self.resume(c, mono_ns());
    }

    /// Sends what slot `c` may send now: held-back planned requests (open loop), else
    /// requests up to the pipeline's depth (closed loop).
    pub(super) fn resume(&mut self, c: usize, now: u64) {
        if self.open_loop() {
            self.drain_backlog(c, now);
        } else {
            self.top_up(c, now);
        }
    }
}
