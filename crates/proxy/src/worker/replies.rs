//! Replies: what a backend sent, framed in the order its requests went and handed to their
//! parts (a coalesced `get`'s `VALUE` blocks by key); replies past their deadline and
//! connections that fail take their parts' requests down with them.

use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::backend::{frame, frame_values, split_by_key};

use super::{Class, Fail, State, Worker, NONE};

impl Worker {
    /// Fails the connections whose oldest owed reply is past its deadline.
    pub(super) fn expire(&mut self, now: Instant) {
        let timeout = self.timeout();
        for b in 0..self.conns.len() {
            if self.conns[b]
                .expect
                .front()
                .is_some_and(|e| e.sent + timeout <= now)
            {
                self.fail_conn(b, Fail::Timeout);
            }
        }
    }

    pub(super) fn read_replies(&mut self, b: usize) {
        let open = self.conns[b].fill();
        self.now = Instant::now();
        let now = self.now;
        let health = self.routing.backends[b].clone();
        while let Some(head) = self.conns[b].expect.front().copied() {
            // A coalesced `get`'s reply, or a part of a multi-get: framed noting where each
            // value lies, to be split by key (or merged in key order) without parsing it again.
            let coalesced = self.conns[b].expect.get(1).is_some_and(|e| e.joined);
            let noted = coalesced || head.part.is_some_and(|p| self.merged(p));
            let conn = &mut self.conns[b];
            let framed = if noted {
                frame_values(head.frame, conn.input(), &mut self.values_at)
            } else {
                frame(head.frame, conn.input())
            };
            match framed {
                Ok(None) => break,
                Ok(Some(f)) if coalesced => {
                    self.take_coalesced(b, f, now);
                }
                Ok(Some(f)) => {
                    conn.expect.pop_front();
                    health.outstanding.fetch_sub(1, Ordering::Relaxed);
                    health.succeeded();
                    // Ejected since it was sent: what it says may be stale (it missed
                    // writes); the request counts as failed (a read is retried elsewhere).
                    let stale = health.is_ejected()
                        || health.ejections.load(Ordering::Relaxed) != head.ejections;
                    if let Some(p) = head.part.filter(|&p| self.parts[p as usize].job == NONE) {
                        // Its request was decided without it: dropped.
                        conn.consume(f.len);
                        self.free_part(p);
                        continue;
                    }
                    if let Some(p) = head.part {
                        let ns = now.saturating_duration_since(head.sent).as_nanos() as u64;
                        let part = &mut self.parts[p as usize];
                        if stale {
                            self.events.push((b, None, false));
                            part.state = State::Failed(Fail::Stale);
                        } else {
                            self.events.push((b, Some(ns), false));
                            part.reply.extend_from_slice(&conn.input()[..f.body]);
                            if noted {
                                // Its reply starts its buffer: the positions hold there.
                                std::mem::swap(&mut part.blocks, &mut self.values_at);
                            }
                            part.values = f.values;
                            part.state = State::Replied {
                                error: f.error,
                                server_error: f.server_error,
                            };
                        }
                        part.done = now;
                        self.ready.push(p);
                    }
                    conn.consume(f.len);
                }
                Err(reason) => {
                    tracing::warn!(backend = %conn.name, %reason, "unreadable reply");
                    self.fail_conn(b, Fail::Garbled);
                    return;
                }
            }
        }
        match open {
            Ok(true) if self.conns[b].expect.is_empty() && !self.conns[b].input().is_empty() => {
                // Bytes nobody asked for: the connection is out of step.
                self.fail_conn(b, Fail::Garbled);
            }
            Ok(true) => {}
            Ok(false) | Err(_) => self.fail_conn(b, Fail::Closed),
        }
    }

    /// Hands out the reply `f` (at the front of connection `b`'s input, its values at
    /// `self.values_at`) of a coalesced `get k1 k2 …`: each part gets its key's `VALUE`
    /// (the backend answers hits in the order asked) and `END`, as if it had been sent
    /// alone; an error line goes to each.
    fn take_coalesced(&mut self, b: usize, f: crate::backend::Framed, now: Instant) {
        let health = self.routing.backends[b].clone();
        let conn = &self.conns[b];
        let group = 1 + conn.expect.iter().skip(1).take_while(|e| e.joined).count();
        let mut ranges = std::mem::take(&mut self.coalesced);
        let parts = &self.parts;
        let keys = conn
            .expect
            .iter()
            .take(group)
            .map(|e| e.part.map(|p| parts[p as usize].key.as_slice()));
        if f.error {
            // One error line answers every key.
            ranges.clear();
            ranges.extend(keys.map(|_| (0, 0)));
        } else {
            split_by_key(&conn.input()[..f.len], &self.values_at, keys, &mut ranges);
        }
        for &(start, end) in &ranges {
            let Some(head) = self.conns[b].expect.pop_front() else {
                break;
            };
            health.outstanding.fetch_sub(1, Ordering::Relaxed);
            health.succeeded();
            let Some(p) = head.part else {
                continue;
            };
            if self.parts[p as usize].job == NONE {
                // Its request was decided without it: dropped.
                self.orphans.push(p);
                continue;
            }
            let stale =
                health.is_ejected() || health.ejections.load(Ordering::Relaxed) != head.ejections;
            let part = &mut self.parts[p as usize];
            if stale {
                self.events.push((b, None, false));
                part.state = State::Failed(Fail::Stale);
            } else {
                let ns = now.saturating_duration_since(head.sent).as_nanos() as u64;
                self.events.push((b, Some(ns), false));
                let input = self.conns[b].input();
                if f.error {
                    part.reply.extend_from_slice(&input[..f.body]);
                } else {
                    part.reply.extend_from_slice(&input[start..end]);
                    part.reply.extend_from_slice(b"END\r\n");
                }
                part.values = u32::from(end > start);
                part.state = State::Replied {
                    error: f.error,
                    server_error: f.server_error,
                };
            }
            part.done = now;
            self.ready.push(p);
        }
        self.conns[b].consume(f.len);
        self.coalesced = ranges;
        while let Some(p) = self.orphans.pop() {
            self.free_part(p);
        }
    }

    /// Whether part `p` is one of a multi-get's parts, whose values are merged in key order.
    fn merged(&self, p: u32) -> bool {
        let job = self.parts[p as usize].job;
        job != NONE && {
            let job = &self.jobs[job as usize];
            job.class == Class::Get && job.key_part.len() > 1
        }
    }

    /// Closes connection `b` and fails every request in flight on it.
    pub(super) fn fail_conn(&mut self, b: usize, fail: Fail) {
        let health = self.routing.backends[b].clone();
        let owed = self.conns[b].reset();
        if owed.is_empty() && fail == Fail::Closed {
            // Closed while idle (e.g. the backend restarted): reconnect on next use.
            return;
        }
        health.failed(self.routing.config.failure_limit);
        for e in owed {
            health.outstanding.fetch_sub(1, Ordering::Relaxed);
            self.events.push((b, None, fail == Fail::Timeout));
            // It may have missed the write (the client may have been told it succeeded).
            match e.part {
                Some(p) if e.write => self.missed_write(p),
                None if e.write => health.eject(),
                _ => {}
            }
            match e.part {
                Some(p) if self.parts[p as usize].job == NONE => self.free_part(p),
                Some(p) => {
                    self.parts[p as usize].state = State::Failed(fail);
                    self.ready.push(p);
                }
                None => {}
            }
        }
    }
}
