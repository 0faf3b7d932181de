//! Sending: a planned request comes due (open loop) or a reply frees a place in the
//! pipeline (closed loop); compose it, route it (`--cluster`), queue it on its connection,
//! and flush every connection that got requests with one write.

use std::cmp::Reverse;

use kvlab_client::ConnError;
use mio::Token;
use rand::Rng;

use super::router::request_key;
use super::{connect, note, GeneratorThread, Meta, Phase, BACKLOG_MAX, STRIDE};

/// `--cluster`: how often a ring is fetched again, or a node that refused a connection
/// tried again, ns.
const RETRY_NS: u64 = 100_000_000;
use crate::clock::mono_ns;
use crate::workload::Op;

impl GeneratorThread<'_> {
    /// Open loop / think time: planned time `t` of connection `c` has come.
    pub(super) fn fire(&mut self, c: usize, t: u64, now: u64) {
        if !self.open_loop() {
            // Think time elapsed: one request, timed from when it was due.
            self.issue(c, t, now);
            return;
        }
        if self.slots[c].budget == 0 {
            return;
        }
        let (qps, seg_end) = self.rate_at(t);
        if qps > 0.0 {
            self.cur.counters.planned += 1;
            let slot = &mut self.slots[c];
            let full = slot.dead() || slot.in_flight() >= self.cfg.depth;
            if full || !slot.backlog.is_empty() {
                if slot.backlog.len() < BACKLOG_MAX {
                    slot.backlog.push_back(t);
                } else {
                    self.cur.counters.timeouts += 1;
                }
            } else {
                self.issue(c, t, now);
            }
        }
        let rate = qps * self.conn_share;
        let Some(a) = self.slots[c].arrivals.as_mut() else {
            return;
        };
        let next = if qps > 0.0 {
            a.advance(rate, seg_end)
        } else {
            // A zero-rate segment: resume at its end with the next segment's rate.
            let (q2, _) = self.rate_at(seg_end);
            let a = self.slots[c].arrivals.as_mut();
            match a {
                Some(a) => {
                    a.reset_to(seg_end, q2 * self.conn_share);
                    a.next_ns()
                }
                None => return,
            }
        };
        if next < self.end {
            self.heap.push(Reverse((next, c as u32)));
        }
    }

    /// Open loop: sends held-back planned requests of connection `c` while its pipeline has
    /// room.
    pub(super) fn drain_backlog(&mut self, c: usize, now: u64) {
        loop {
            let slot = &mut self.slots[c];
            if slot.dead()
                || slot.in_flight() >= self.cfg.depth
                || slot.budget == 0
                || now >= self.end
            {
                return;
            }
            let Some(t) = slot.backlog.pop_front() else {
                return;
            };
            self.issue(c, t, now);
        }
    }

    /// Composes one request on connection `c`, planned at `planned`.
    pub(super) fn issue(&mut self, c: usize, planned: u64, now: u64) {
        let cut = self.cut();
        let slot = &mut self.slots[c];
        if slot.dead() || slot.budget == 0 {
            return;
        }
        let gen = &mut self.gen;
        let rng = &mut self.rng;
        let (op, key) = match self.phase {
            Phase::Load => {
                let k = slot.load_next;
                slot.load_next += 1;
                (Op::Set, Some(k))
            }
            Phase::Run => (gen.op(rng), None),
        };
        let r = match &self.router {
            None => match slot.conns[0].as_mut() {
                Some(conn) => conn.request(|out| {
                    let (kind, k) = match key {
                        Some(k) => gen.compose_key(op, k, rng, out)?,
                        None => gen.compose(op, rng, out)?,
                    };
                    Ok((
                        kind,
                        Meta {
                            planned,
                            sent: now,
                            key: k,
                            op,
                        },
                    ))
                }),
                None => return,
            },
            Some(_) => {
                self.scratch.clear();
                match key {
                    Some(k) => gen.compose_key(op, k, rng, &mut self.scratch),
                    None => gen.compose(op, rng, &mut self.scratch),
                }
                .map(|(kind, k)| {
                    let meta = Meta {
                        planned,
                        sent: now,
                        key: k,
                        op,
                    };
                    self.send_routed(c, kind, meta);
                })
            }
        };
        let slot = &mut self.slots[c];
        if let Err(e) = r {
            // Workload::validate makes every generated key valid; count it if not.
            self.cur.counters.errors += 1;
            note(&mut self.notes, format!("compose: {e}"));
            slot.budget = 0;
            return;
        }
        slot.budget -= 1;
        // A warm-up request sent late, after the warm-up, is not part of the measurement.
        if !cut.left_out(planned) {
            self.cur.counters.sent += 1;
        }
        if slot.load_next >= slot.load_end && self.phase == Phase::Load {
            slot.budget = 0;
        }
        if self.cfg.open.is_some() && self.phase == Phase::Run {
            if slot.last_sent > 0 {
                let (i, _) = self.cfg.plan.at(planned.saturating_sub(self.warmup_end));
                let qps = self.cfg.plan.segments[i].qps;
                let x = (now - slot.last_sent) as f64 * qps * self.conn_share / 1e9;
                self.gaps.add(x, self.rng.gen::<f64>());
            }
            slot.last_sent = now;
        }
        if !slot.dirty {
            slot.dirty = true;
            self.dirty.push(c as u32);
        }
    }

    /// `--cluster`: sends the request in `scratch` to its key's node on slot `c`,
    /// connecting to the node first if this slot has no connection to it yet.
    pub(super) fn send_routed(&mut self, c: usize, kind: kvlab_client::ReqKind, meta: Meta) {
        let Some(router) = self.router.as_mut() else {
            return;
        };
        let mut n = router.node_of(request_key(&self.scratch));
        let mut now = 0;
        if self.slots[c].conns.get(n).is_none_or(Option::is_none) {
            // About to connect: to a node that may have left the ring since; a refresh at
            // most every 100 ms keeps a dead node from costing one per request.
            now = mono_ns();
            if now.saturating_sub(router.refreshed_ns) > RETRY_NS {
                router.refreshed_ns = now;
                let first = router.addrs[n];
                if router.refresh_any(first).is_ok() {
                    n = router.node_of(request_key(&self.scratch));
                }
            }
        }
        let addr = router.addrs[n];
        let slot = &mut self.slots[c];
        if slot.conns.len() <= n {
            slot.conns.resize_with(n + 1, || None);
        }
        // A node that refused a connection (killed, still in the ring) is not tried again
        // for RETRY_NS: its requests fail at once instead of each waiting on a connect.
        if slot.conns[n].is_none() && router.reachable(n, now) {
            match connect(addr, self.cfg.protocol.wire()) {
                Ok(mut conn) => {
                    if conn
                        .register(self.poll.registry(), Token(c * STRIDE + n))
                        .is_ok()
                    {
                        slot.conns[n] = Some(conn);
                    }
                }
                Err(e) => {
                    router.unreachable(n, mono_ns() + RETRY_NS);
                    note(&mut self.notes, format!("connect {addr}: {e}"));
                }
            }
        }
        let Some(conn) = slot.conns[n].as_mut() else {
            self.cur.counters.errors += 1;
            return;
        };
        let scratch = &self.scratch;
        let _ = conn.request(|out| {
            out.extend_from_slice(scratch);
            Ok((kind, meta))
        });
    }

    /// `--cluster`: sends redirected requests of slot `c` again, by the (refreshed) ring;
    /// each keeps its planned time, so the detour is part of its latency.
    pub(super) fn resend(&mut self, c: usize) {
        let mut resend = std::mem::take(&mut self.resend);
        for meta in resend.drain(..) {
            self.scratch.clear();
            match self
                .gen
                .compose_key(meta.op, meta.key, &mut self.rng, &mut self.scratch)
            {
                Ok((kind, _)) => self.send_routed(c, kind, meta),
                Err(_) => self.cur.counters.errors += 1,
            }
        }
        self.resend = resend;
        if !self.slots[c].dirty {
            self.slots[c].dirty = true;
            self.dirty.push(c as u32);
        }
    }

    /// Closed loop: fill connection `c` up to `depth` in flight.
    pub(super) fn top_up(&mut self, c: usize, now: u64) {
        if self.cfg.think_us > 0 && self.phase == Phase::Run {
            // With think time, each finished slot waits before its next request.
            if self.slots[c].dead() {
                return;
            }
            let waiting = self
                .heap
                .iter()
                .filter(|Reverse((_, i))| *i as usize == c)
                .count();
            let free = self
                .cfg
                .depth
                .saturating_sub(self.slots[c].in_flight() + waiting);
            for _ in 0..free {
                self.heap
                    .push(Reverse((now + self.cfg.think_us * 1000, c as u32)));
            }
            return;
        }
        let depth = match self.phase {
            Phase::Run => self.cfg.depth,
            Phase::Load => self.cfg.depth.max(32),
        };
        loop {
            let slot = &self.slots[c];
            if slot.dead() || slot.in_flight() >= depth || slot.budget == 0 || now >= self.end {
                break;
            }
            self.issue(c, now, now);
        }
    }

    pub(super) fn flush_dirty(&mut self) {
        while let Some(c) = self.dirty.pop() {
            let c = c as usize;
            self.slots[c].dirty = false;
            for n in 0..self.slots[c].conns.len() {
                let r = match self.slots[c].conns[n].as_mut() {
                    Some(conn) if conn.has_output() => conn.flush(),
                    _ => continue,
                };
                if let Err(e) = r {
                    self.reset(c, n, Some(ConnError::Io(e)));
                }
            }
        }
    }
}
