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

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::net::{SocketAddr, TcpStream as StdStream};
use std::sync::mpsc::{Receiver, Sender};
use std::time::Duration;

use kvlab_client::{Conn, ConnError, Event, Ring, Status};
use kvlab_protocol::client::MetaKeyMode;
use mio::net::TcpStream;
use mio::{Events, Poll, Token};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::clock::{mono_ns, thread_cpu_ns, Timer};
use crate::config::{Config, Protocol};
use crate::dist::mix64;
use crate::stats::{record, GapStats, IntervalReport, OpKind};
use crate::workload::{Generator, Op};
use crate::BenchError;

const TIMER: Token = Token(usize::MAX);
/// Tokens: connection slot × STRIDE + node (a cluster's nodes; 0 for a single target).
const STRIDE: usize = 64;
/// Deadlines closer than this are waited for by polling without sleeping, ns.
const SPIN_NS: u64 = 5_000;
/// Open loop: planned requests one connection may hold back while its pipeline is full; past
/// this (a server that stopped answering), further planned requests count as timeouts.
const BACKLOG_MAX: usize = 1 << 16;

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

/// `--cluster`: which node each key goes to, by the ring the cluster publishes
/// (`kvlab_client::cluster`); nodes keep their index for the whole run.
struct Router {
    ring: Ring,
    /// Per ring node, its index in `addrs`.
    of_ring: Vec<usize>,
    addrs: Vec<SocketAddr>,
    names: Vec<String>,
    /// When the ring was last fetched because a node could not be reached (mono ns).
    refreshed_ns: u64,
}

impl Router {
    fn new(seed: SocketAddr) -> Result<Router, BenchError> {
        let mut r = Router {
            ring: Ring::new(0, 1, &[]),
            of_ring: Vec::new(),
            addrs: Vec::new(),
            names: Vec::new(),
            refreshed_ns: 0,
        };
        r.refresh(seed)?;
        if r.ring.nodes().is_empty() {
            return Err(BenchError::Connect(
                seed.to_string(),
                "the cluster has no nodes".into(),
            ));
        }
        Ok(r)
    }

    /// Fetches the ring from `from` and adopts it if it is newer.
    fn refresh(&mut self, from: SocketAddr) -> Result<(), BenchError> {
        let ring = kvlab_client::cluster::fetch_ring(from, Duration::from_secs(2))
            .map_err(|e| BenchError::Connect(from.to_string(), format!("cluster ring: {e}")))?;
        if ring.epoch() <= self.ring.epoch() && !self.of_ring.is_empty() {
            return Ok(());
        }
        let mut of_ring = Vec::with_capacity(ring.nodes().len());
        for name in ring.nodes() {
            let i = match self.names.iter().position(|n| n == name) {
                Some(i) => i,
                None => {
                    let addr = kvlab_client::cluster::resolve(name)
                        .map_err(|e| BenchError::Connect(name.clone(), e.to_string()))?;
                    if self.addrs.len() == STRIDE {
                        return Err(BenchError::Connect(
                            name.clone(),
                            format!("more than {STRIDE} cluster nodes"),
                        ));
                    }
                    self.addrs.push(addr);
                    self.names.push(name.clone());
                    self.addrs.len() - 1
                }
            };
            of_ring.push(i);
        }
        self.ring = ring;
        self.of_ring = of_ring;
        Ok(())
    }

    /// Fetches the ring from `first`, else from any other node it knows (the ring's first,
    /// then the rest, the seed among them): a node that left may be gone already.
    fn refresh_any(&mut self, first: SocketAddr) -> Result<(), BenchError> {
        let mut last = match self.refresh(first) {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        let others: Vec<SocketAddr> = self
            .of_ring
            .iter()
            .map(|&i| self.addrs[i])
            .chain(self.addrs.iter().copied())
            .filter(|&a| a != first)
            .collect();
        for a in others {
            match self.refresh(a) {
                Ok(()) => return Ok(()),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn node_of(&self, key: &[u8]) -> usize {
        self.ring.index_of(key).map_or(0, |i| self.of_ring[i])
    }
}

/// The key of a composed single-key request: its first line's second word.
fn request_key(req: &[u8]) -> &[u8] {
    let line = &req[..req.iter().position(|&b| b == b'\r').unwrap_or(req.len())];
    line.split(|&b| b == b' ').nth(1).unwrap_or_default()
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
    cfg: &Config,
    ctx: ThreadCtx,
    phase: Phase,
    start_rx: Receiver<Option<u64>>,
    tx: Sender<Msg>,
) {
    let mut engine = match Engine::new(cfg, ctx, phase, tx.clone()) {
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
    match engine.run(start) {
        Ok(done) => {
            let _ = tx.send(Msg::Done(Box::new(done)));
        }
        Err(e) => {
            let _ = tx.send(Msg::Failed(e.to_string()));
        }
    }
}

struct Engine<'c> {
    cfg: &'c Config,
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

impl<'c> Engine<'c> {
    fn new(
        cfg: &'c Config,
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
        Ok(Engine {
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
            self.flush_dirty();
            if now >= self.next_timeout_check {
                self.check_timeouts(now);
            }
            let mut deadline = (self.start + self.cur.end_ns)
                .min(self.end)
                .min(self.next_timeout_check);
            if let Some(&Reverse((t, _))) = self.heap.peek() {
                deadline = deadline.min(t);
            }
            self.poll_once(deadline, now)?;
        }
        if ended {
            self.drain()?;
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
    fn drain(&mut self) -> Result<(), BenchError> {
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
        let done = std::mem::replace(&mut self.cur, next);
        let _ = self.tx.send(Msg::Interval(Box::new(done)));
    }

    /// Open loop / think time: planned time `t` of connection `c` has come.
    fn fire(&mut self, c: usize, t: u64, now: u64) {
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
    fn drain_backlog(&mut self, c: usize, now: u64) {
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
    fn issue(&mut self, c: usize, planned: u64, now: u64) {
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
    fn send_routed(&mut self, c: usize, kind: kvlab_client::ReqKind, meta: Meta) {
        let Some(router) = self.router.as_mut() else {
            return;
        };
        let mut n = router.node_of(request_key(&self.scratch));
        if self.slots[c].conns.get(n).is_none_or(Option::is_none) {
            // About to connect: to a node that may have left the ring since; a refresh at
            // most every 100 ms keeps a dead node from costing one per request.
            let now = mono_ns();
            if now.saturating_sub(router.refreshed_ns) > 100_000_000 {
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
        if slot.conns[n].is_none() {
            match connect(addr, self.cfg.protocol.wire()) {
                Ok(mut conn) => {
                    if conn
                        .register(self.poll.registry(), Token(c * STRIDE + n))
                        .is_ok()
                    {
                        slot.conns[n] = Some(conn);
                    }
                }
                Err(e) => note(&mut self.notes, format!("connect {addr}: {e}")),
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
    fn resend(&mut self, c: usize) {
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
    fn top_up(&mut self, c: usize, now: u64) {
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

    fn flush_dirty(&mut self) {
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

    fn on_ready(&mut self, c: usize, n: usize, now: u64) {
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
            Ok(_) => {
                if self.open_loop() {
                    self.drain_backlog(c, now);
                } else {
                    self.top_up(c, now);
                }
            }
            Err(e) => self.reset(c, n, Some(e)),
        }
    }

    /// Times out connections whose oldest request is older than the timeout.
    fn check_timeouts(&mut self, now: u64) {
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
    }

    /// Drops connection `c` after an error (`None`: a timeout), counts its pending requests,
    /// and reconnects.
    fn reset(&mut self, c: usize, n: usize, err: Option<ConnError>) {
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
        if self.slots[c].conns[n].is_none() {
            return;
        }
        let now = mono_ns();
        if self.open_loop() {
            self.drain_backlog(c, now);
        } else {
            self.top_up(c, now);
        }
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
