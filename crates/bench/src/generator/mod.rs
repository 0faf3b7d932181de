//! One generator thread: a mio event loop driving many connections.
//!
//! ```text
//!  collector (run.rs) ◄──── mpsc: Ready, Interval(report)…, Done ──── generator thread ×T
//!                                                                      │ one Poll, one timerfd
//!                                                                      │ C connections (Conn)
//!   loop:                                                              ▼
//!     roll the interval over at its boundary (hand its histograms to the collector)
//!     open loop / think time: pop due (planned time, conn) from the timer heap, compose
//!     flush every connection that got requests        (one write per batch)
//!     poll until the next deadline (timerfd, ns precision) or socket readiness
//!     read replies → record latency now−planned and now−sent → closed loop: top up to depth
//! ```
//!
//! Closed loop keeps `depth` requests in flight per connection (planned = actual send).
//! Open loop gives each connection its own arrival schedule; a request whose planned time
//! has passed is sent at once and its latency still counts from the planned time. When a
//! connection already has `depth` in flight, its planned requests wait in the connection's
//! backlog (the schedule keeps moving, so every planned request is counted as `planned` in
//! the interval it was planned in) and go out, oldest first, as replies free the pipeline —
//! the wait is part of their latency, as it would be for a real client.
//!
//! Here: the thread, its connections and the loop; `send.rs` composes and sends requests,
//! `replies.rs` reads replies, times out and resets connections, `router.rs` routes keys to
//! a cluster's nodes (`--cluster`).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::net::{SocketAddr, TcpStream as StdStream};
use std::sync::mpsc::{Receiver, Sender};
use std::time::Duration;

use kvlab_client::{Conn, ConnError};
use kvlab_protocol::client::MetaKeyMode;
use mio::net::TcpStream;
use mio::{Events, Poll, Token};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::clock::{mono_ns, thread_cpu_ns, Timer};
use crate::config::{BenchConfig, Protocol};
use crate::dist::mix64;
use crate::stats::{GapStats, IntervalReport};
use crate::workload::{Generator, Op};
use crate::BenchError;

mod replies;
mod router;
mod send;

use router::Router;

const TIMER: Token = Token(usize::MAX);
/// Tokens: connection slot × STRIDE + node (a cluster's nodes; 0 for a single target).
const STRIDE: usize = 64;
/// Deadlines closer than this are waited for by polling without sleeping, ns.
const SPIN_NS: u64 = 5_000;
/// Open loop: planned requests one connection may hold back while its pipeline is full; past
/// this (a server that stopped answering), further planned requests count as timeouts.
const BACKLOG_MAX: usize = 1 << 16;
/// The longest a generator thread waits in one poll, ns: how late it may see a raised stop.
const STOP_CHECK_NS: u64 = 100_000_000;

/// Who a generator thread is among all threads of all participants.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct ThreadCtx {
    /// 0 = the master, 1.. = agents.
    pub participant: u32,
    /// Index within the participant.
    pub thread: u32,
    /// Unique index over all participants.
    pub global_thread: u64,
    /// Threads over all participants.
    pub total_threads: u64,
    /// Global index of this thread's first connection.
    pub conn_offset: u64,
    /// Connections over all participants.
    pub total_conns: u64,
}

/// What a thread reports at the end.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ThreadDone {
    /// Which thread.
    pub ctx: ThreadCtx,
    /// CPU time the thread used from start to end, ns.
    pub cpu_ns: u64,
    /// Wall time from start to end, ns.
    pub wall_ns: u64,
    /// Normalised inter-arrival gaps of actual sends (open loop).
    pub gaps: GapStats,
    /// Connection problems seen (first few).
    pub notes: Vec<String>,
}

/// Messages from generator threads (and, relayed, from agents) to the collector.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Msg {
    /// Connected; waiting for the start time.
    Ready,
    /// One finished interval of one thread.
    Interval(Box<IntervalReport>),
    /// The thread finished.
    Done(Box<ThreadDone>),
    /// The thread could not run.
    Failed(String),
}

#[derive(Clone, Copy)]
struct Meta {
    planned: u64,
    sent: u64,
    key: u64,
    op: Op,
}

struct Slot {
    /// One connection per node (one for a single target), opened when first needed.
    conns: Vec<Option<Conn<Meta>>>,
    /// `--cluster`: connections are opened when a key first goes to their node.
    lazy: bool,
    arrivals: Option<crate::schedule::Arrivals>,
    /// Open loop: planned times of requests waiting for in-flight < depth, oldest first.
    backlog: VecDeque<u64>,
    /// Requests this connection may still send.
    budget: u64,
    /// Load phase: next key and end of this connection's range.
    load_next: u64,
    load_end: u64,
    last_sent: u64,
    dirty: bool,
}

impl Slot {
    fn in_flight(&self) -> usize {
        self.conns.iter().flatten().map(|c| c.in_flight()).sum()
    }

    /// No connection left (every one failed and could not be reopened).
    fn dead(&self) -> bool {
        !self.lazy && self.conns.iter().all(Option::is_none)
    }
}

/// What a thread runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The configured load model.
    Run,
    /// Set every key of the thread's share once, closed loop.
    Load,
}

fn connect(addr: SocketAddr, wire: kvlab_client::Wire) -> Result<Conn<Meta>, ConnError> {
    // A blocking connect with a timeout surfaces "refused" before the start; the socket is
    // then switched to non-blocking for the event loop.
    let s = StdStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_nonblocking(true)?;
    s.set_nodelay(true)?;
    Ok(Conn::with_wire(TcpStream::from_std(s), wire))
}

/// Runs one generator thread: connects, reports `Ready`, waits for the start time (monotonic
/// ns; `None` aborts), runs, and reports its intervals and `Done` on `tx`.
pub fn thread_main(
    cfg: &BenchConfig,
    ctx: ThreadCtx,
    phase: Phase,
    start_rx: Receiver<Option<u64>>,
    tx: Sender<Msg>,
) {
    let mut generator = match GeneratorThread::new(cfg, ctx, phase, tx.clone()) {
        Ok(e) => e,
        Err(e) => {
            let _ = tx.send(Msg::Failed(e.to_string()));
            return;
        }
    };
    if tx.send(Msg::Ready).is_err() {
        return;
    }
    let Ok(Some(start)) = start_rx.recv() else {
        return;
    };
    match generator.run(start) {
        Ok(done) => {
            let _ = tx.send(Msg::Done(Box::new(done)));
        }
        Err(e) => {
            let _ = tx.send(Msg::Failed(e.to_string()));
        }
    }
}

struct GeneratorThread<'c> {
    cfg: &'c BenchConfig,
    ctx: ThreadCtx,
    phase: Phase,
    tx: Sender<Msg>,
    poll: Poll,
    events: Events,
    timer: Timer,
    slots: Vec<Slot>,
    heap: BinaryHeap<Reverse<(u64, u32)>>,
    dirty: Vec<u32>,
    gen: Generator,
    rng: ChaCha8Rng,
    cur: IntervalReport,
    start: u64,
    end: u64,
    warmup_end: u64,
    timeout_ns: u64,
    next_timeout_check: u64,
    gaps: GapStats,
    notes: Vec<String>,
    /// Per-connection rate factor: a connection's share of the total rate.
    conn_share: f64,
    /// `--cluster`: the ring's routing.
    router: Option<Router>,
    /// A request composed before its node is known (`--cluster`).
    scratch: Vec<u8>,
    /// Redirected requests to send again (`--cluster`), reused.
    resend: Vec<Meta>,
}

impl<'c> GeneratorThread<'c> {
    fn new(
        cfg: &'c BenchConfig,
        ctx: ThreadCtx,
        phase: Phase,
        tx: Sender<Msg>,
    ) -> Result<Self, BenchError> {
        let poll = Poll::new()?;
        let timer = Timer::new(poll.registry(), TIMER)?;
        let n = cfg.connections;
        let total_requests = cfg.requests.unwrap_or(u64::MAX);
        let mut slots = Vec::with_capacity(n);
        let router = if cfg.cluster {
            if cfg.protocol == Protocol::Http || cfg.workload.multiget > 1 {
                return Err(BenchError::Spec(
                    "--cluster loads single-key requests over the memcached or meta protocol"
                        .into(),
                ));
            }
            Some(Router::new(cfg.target)?)
        } else {
            None
        };
        for i in 0..n {
            let global = ctx.conn_offset + i as u64;
            let mut conns = Vec::new();
            match &router {
                // Cluster nodes are connected to when a key first goes there.
                Some(r) => conns.resize_with(r.addrs.len(), || None),
                None => {
                    let mut conn = connect(cfg.target, cfg.protocol.wire())
                        .map_err(|e| BenchError::Connect(cfg.target.to_string(), e.to_string()))?;
                    conn.register(poll.registry(), Token(i * STRIDE))?;
                    conns.push(Some(conn));
                }
            }
            let budget = if total_requests == u64::MAX {
                u64::MAX
            } else {
                total_requests / ctx.total_conns
                    + u64::from(global < total_requests % ctx.total_conns)
            };
            // Load: this connection's contiguous share of the key space.
            let keys = cfg.workload.keys;
            let (lo, hi) = (
                (keys as u128 * global as u128 / ctx.total_conns as u128) as u64,
                (keys as u128 * (global + 1) as u128 / ctx.total_conns as u128) as u64,
            );
            slots.push(Slot {
                conns,
                lazy: router.is_some(),
                arrivals: None,
                backlog: VecDeque::new(),
                budget: if phase == Phase::Load {
                    hi - lo
                } else {
                    budget
                },
                load_next: lo,
                load_end: hi,
                last_sent: 0,
                dirty: false,
            });
        }
        let mut gen = Generator::new(&cfg.workload, ctx.global_thread, ctx.total_threads)?;
        match cfg.protocol {
            Protocol::Http => gen = gen.http(&cfg.target.to_string()),
            Protocol::Meta => {
                gen = gen.meta(if cfg.meta_base64 {
                    MetaKeyMode::Base64
                } else {
                    MetaKeyMode::Plain
                })
            }
            Protocol::Memcached => {}
        }
        Ok(GeneratorThread {
            cfg,
            ctx,
            phase,
            tx,
            poll,
            events: Events::with_capacity(1024),
            timer,
            slots,
            heap: BinaryHeap::with_capacity(n),
            dirty: Vec::with_capacity(n),
            gen,
            rng: ChaCha8Rng::seed_from_u64(mix64(cfg.seed ^ mix64(ctx.global_thread + 1))),
            cur: IntervalReport::new(0, 0, 0),
            start: 0,
            end: 0,
            warmup_end: 0,
            timeout_ns: cfg.timeout_ms * 1_000_000,
            next_timeout_check: 0,
            gaps: GapStats::default(),
            notes: Vec::new(),
            conn_share: 1.0 / ctx.total_conns as f64,
            router,
            scratch: Vec::with_capacity(4096),
            resend: Vec::new(),
        })
    }

    fn open_loop(&self) -> bool {
        self.phase == Phase::Run && self.cfg.open.is_some()
    }

    /// Total rate at absolute time `t` and the absolute end of its segment.
    fn rate_at(&self, t: u64) -> (f64, u64) {
        let rel = t.saturating_sub(self.warmup_end);
        let (i, seg_start) = self.cfg.plan.at(rel);
        let s = self.cfg.plan.segments[i];
        (s.qps, self.warmup_end + seg_start + s.duration_ns)
    }

    fn run(&mut self, start: u64) -> Result<ThreadDone, BenchError> {
        self.start = start;
        self.warmup_end = start
            + if self.phase == Phase::Run {
                self.cfg.warmup_ns()
            } else {
                0
            };
        self.end = match self.phase {
            Phase::Run => start.saturating_add(self.cfg.end_ns()),
            Phase::Load => u64::MAX,
        };
        let first_end = match self.phase {
            Phase::Run => start + self.cfg.next_cut(0),
            Phase::Load => u64::MAX,
        };
        self.cur = IntervalReport::new(0, 0, first_end - start);
        // Wait for the common start (a short spin-free wait on the timer).
        while mono_ns() < start {
            self.timer.arm(start, mono_ns())?;
            self.poll
                .poll(&mut self.events, Some(Duration::from_millis(100)))?;
            self.timer.fired();
        }
        let cpu0 = thread_cpu_ns();
        let mut now = mono_ns();
        self.next_timeout_check = now + self.timeout_ns;
        if self.open_loop() {
            let arrival = self.cfg.open.unwrap_or(crate::schedule::Arrival::Poisson);
            for i in 0..self.slots.len() {
                let (qps, _) = self.rate_at(start);
                let seed = mix64(self.cfg.seed ^ 0x0a11 ^ mix64(self.ctx.conn_offset + i as u64));
                let a = crate::schedule::Arrivals::new(arrival, seed, start, qps * self.conn_share);
                let t = if qps > 0.0 {
                    a.next_ns()
                } else {
                    self.rate_at(start).1
                };
                self.slots[i].arrivals = Some(a);
                self.heap.push(Reverse((t, i as u32)));
            }
        } else {
            for i in 0..self.slots.len() {
                self.top_up(i, now);
            }
        }
        let mut ended = false;
        let mut stopped = false;
        loop {
            // Fresh time for the sends: handling the last batch of events took a while.
            now = mono_ns();
            // Due sends and interval boundaries in plan order: a send planned before a
            // boundary is counted in the interval that boundary closes, however late the
            // loop got to it. A held-up generator sends late (timed from the plan); it
            // never skips a planned request.
            loop {
                let boundary = self.start + self.cur.end_ns;
                match self.heap.peek() {
                    Some(&Reverse((t, c))) if t <= now && t < boundary => {
                        self.heap.pop();
                        self.fire(c as usize, t, now);
                    }
                    _ if now >= boundary => {
                        if boundary >= self.end {
                            ended = true;
                            break;
                        }
                        self.roll_over();
                    }
                    _ => break,
                }
            }
            if ended || self.all_done() {
                break;
            }
            if self.cfg.stop.raised() {
                // Nothing new is sent from here on.
                self.end = now;
                stopped = true;
                break;
            }
            self.flush_dirty();
            if now >= self.next_timeout_check {
                self.check_timeouts(now);
            }
            // Woken at least every STOP_CHECK_NS to see a raised stop.
            let mut deadline = (self.start + self.cur.end_ns)
                .min(self.end)
                .min(self.next_timeout_check)
                .min(now + STOP_CHECK_NS);
            if let Some(&Reverse((t, _))) = self.heap.peek() {
                deadline = deadline.min(t);
            }
            self.poll_once(deadline, now)?;
        }
        if ended {
            self.drain()?;
            self.roll_over();
        } else if stopped {
            // Told to end early: the replies in flight are waited for as at the end, and
            // what was measured so far is reported.
            self.drain()?;
            let at = mono_ns().saturating_sub(self.start);
            note(
                &mut self.notes,
                format!("stopped early, {:.2} s after the start", at as f64 / 1e9),
            );
            if self.cur.end_ns > at {
                self.cur.end_ns = at.max(self.cur.start_ns + 1);
            }
            self.roll_over();
        } else if self.phase == Phase::Load
            || self.cur.counters.completed > 0
            || self.cur.counters.sent > 0
        {
            // A partial last interval (request-count runs end between boundaries).
            let now_rel = mono_ns().saturating_sub(self.start);
            if self.cur.end_ns > now_rel {
                self.cur.end_ns = now_rel.max(self.cur.start_ns + 1);
                self.roll_over();
            }
        }
        Ok(ThreadDone {
            ctx: self.ctx,
            cpu_ns: thread_cpu_ns().saturating_sub(cpu0),
            wall_ns: mono_ns().saturating_sub(start),
            gaps: std::mem::take(&mut self.gaps),
            notes: std::mem::take(&mut self.notes),
        })
    }

    /// Waits for socket readiness or `deadline` (absolute, ns), handles what is ready,
    /// and flushes the connections that got requests.
    fn poll_once(&mut self, deadline: u64, now: u64) -> Result<(), BenchError> {
        // Closer than SPIN_NS, arming a timer and sleeping costs more than the wait.
        let timeout = if deadline <= now + SPIN_NS {
            Some(Duration::ZERO)
        } else {
            self.timer.arm(deadline, now)?;
            None
        };
        match self.poll.poll(&mut self.events, timeout) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
        let now = mono_ns();
        // Collect tokens first: handling an event needs `&mut self`.
        let mut ready: [usize; 64] = [0; 64];
        let mut batches = Vec::new();
        let mut n = 0;
        for ev in self.events.iter() {
            if ev.token() == TIMER {
                self.timer.fired();
                continue;
            }
            if n == ready.len() {
                batches.extend_from_slice(&ready);
                n = 0;
            }
            ready[n] = ev.token().0;
            n += 1;
        }
        for &t in batches.iter().chain(ready[..n].iter()) {
            self.on_ready(t / STRIDE, t % STRIDE, now);
        }
        self.flush_dirty();
        Ok(())
    }

    /// After the end nothing new is sent, but replies to requests already sent are still
    /// waited for — up to the timeout or one interval, whichever is shorter — and recorded
    /// in the last interval, so a run's slowest requests are measured rather than dropped.
    /// Requests still unanswered then are left out (`sent` − `completed` shows them);
    /// open-loop requests still held back in a backlog stay unsent (`planned` − `sent`).
    /// Both are said in the run's notes, with their numbers.
    fn drain(&mut self) -> Result<(), BenchError> {
        let unsent: usize = self.slots.iter().map(|s| s.backlog.len()).sum();
        if unsent > 0 {
            note(
                &mut self.notes,
                format!(
                    "{unsent} planned requests were still held back at the end (their \
                     connections had every request of their depth in flight) and were never sent"
                ),
            );
        }
        let grace = self.timeout_ns.min(self.cfg.interval_ns());
        let limit = mono_ns().saturating_add(grace);
        loop {
            let unanswered: usize = self.slots.iter().map(Slot::in_flight).sum();
            let now = mono_ns();
            if unanswered == 0 {
                return Ok(());
            }
            if now >= limit {
                note(
                    &mut self.notes,
                    format!(
                        "{unanswered} requests were still unanswered {:.2} s after the end and are left out",
                        grace as f64 / 1e9
                    ),
                );
                return Ok(());
            }
            if now >= self.next_timeout_check {
                self.check_timeouts(now);
            }
            self.poll_once(limit.min(self.next_timeout_check), now)?;
        }
    }

    /// Which requests the current interval leaves out (see [`WarmupCut`]).
    fn cut(&self) -> WarmupCut {
        WarmupCut {
            warmup_end: self.warmup_end,
            measured: self.cur.start_ns >= self.cfg.warmup_ns(),
        }
    }

    fn all_done(&self) -> bool {
        self.slots
            .iter()
            .all(|s| s.budget == 0 && s.in_flight() == 0 || s.dead())
    }

    fn roll_over(&mut self) {
        let start = self.cur.end_ns;
        let next_end = match self.phase {
            Phase::Run => self.cfg.next_cut(start),
            Phase::Load => u64::MAX - self.start,
        };
        let next = IntervalReport::new(self.cur.index + 1, start, next_end.max(start + 1));
        let mut done = std::mem::replace(&mut self.cur, next);
        done.participant = self.ctx.participant;
        let _ = self.tx.send(Msg::Interval(Box::new(done)));
    }
}

/// A measured interval counts only requests planned (closed loop: sent) after the
/// warm-up: a warm-up request sent or answered late is left out, so nothing is counted
/// twice or measured from the warm-up.
#[derive(Clone, Copy)]
struct WarmupCut {
    warmup_end: u64,
    /// The current interval is measured (not warm-up).
    measured: bool,
}

impl WarmupCut {
    fn left_out(self, planned: u64) -> bool {
        self.measured && planned < self.warmup_end
    }
}

fn note(notes: &mut Vec<String>, s: String) {
    if notes.len() < 10 {
        notes.push(s);
    }
}
