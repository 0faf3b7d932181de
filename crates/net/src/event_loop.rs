//! One epoll event loop over many connections: the building block of the `reactor` (one
//! loop per worker thread, fed by an acceptor) and `epoll` (one loop that also accepts)
//! drivers.
//!
//! ```text
//!  waker (new connections, shutdown, helper completions) ─┐
//!  listener (epoll driver) ───────────────────────────────┤
//!  connections 0..n (edge-triggered) ─────────────────────┴─► one thread: poll → pump each
//!                                                               ready connection
//! ```
//!
//! Edge-triggered: on readiness a connection is pumped until its input is drained or its
//! output blocks; a blocked connection arms writable interest and reads nothing more until
//! the client has taken its replies.
//!
//! Deferred work runs on the loop's own thread or, with [`EventLoop::with_helpers`], on a
//! [`crate::pool::HelperPool`] whose completions come back through the loop's waker (the
//! epoll driver). On its own thread it runs in one of two ways, chosen by the work's
//! [`Work::BATCH`]: each request's work at once, within the request
//! ([`crate::session::Session::process_inline`]; a durable cache's disk read), or — for work
//! that batches, a proxy's backend requests — collected over a whole round of readiness
//! events and run together at its end ([`Work::run_batch`]: one write per backend for
//! everything the round read), then completed in the sessions, whose replies leave at once.
//!
//! Work whose worker has sockets of its own ([`Work::IN_LOOP`], a proxy's backend
//! connections) does not block the loop at all: the loop watches those sockets in its own
//! epoll ([`crate::service::Watch`]), starts a round's works together at its end
//! ([`Work::start`]: one write per backend), and completes each as the worker's sockets
//! become ready ([`Work::ready`]), in whichever later round that is, while it goes on reading
//! and answering its clients. A ticket names each work in flight (its connection and reply
//! slot).

use std::io;
use std::sync::mpsc;
use std::sync::Arc;

use kvlab_protocol::Limits;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

use crate::driver::{self, Pump, LISTENER};
use crate::pool::{ConnId, Done, HelperPool};
use crate::service::{App, Completion, Service, Watch, Work, WorkOf, WATCH_BASE};
use crate::session::Session;
use crate::session::SlotId;

/// The token of the loop's waker (new connections, shutdown).
pub const WAKER: Token = Token(usize::MAX);

struct Conn<A: App> {
    stream: TcpStream,
    session: Session<A::Service>,
    /// Whether writable interest is armed (a write was partial).
    writable: bool,
    /// Distinguishes this connection from later ones in the same slot.
    generation: u64,
    /// The helper running this connection's work while any is in flight.
    helper: Option<usize>,
    /// Listed in `touched` (a completion arrived since it was last served).
    touched: bool,
    /// What the socket may hold unread (see [`driver::pump`]).
    input: driver::Input,
    /// When it was last ready (with an idle timeout; see [`driver::Idle`]).
    last_active: std::time::Instant,
    /// Its TLS state, when the server serves TLS.
    tls: Option<Box<rustls::ServerConnection>>,
}

/// Helper threads and the channel their results come back on.
struct Helpers<A: App> {
    pool: HelperPool<WorkOf<A>>,
    done: mpsc::Receiver<Done>,
}

/// An event loop and the connections it owns.
pub struct EventLoop<A: App> {
    poll: Poll,
    incoming: Option<mpsc::Receiver<TcpStream>>,
    listener: Option<TcpListener>,
    service: A::Service,
    app: Arc<A>,
    limits: Limits,
    conns: Vec<Option<Conn<A>>>,
    free: Vec<usize>,
    /// Without helpers, deferred work runs inline on the loop's thread.
    helpers: Option<Helpers<A>>,
    generation: u64,
    /// Connections with completions to act on (reused).
    touched: Vec<usize>,
    /// Batched mode: work collected this round, and whose slot each completes.
    batch: Vec<WorkOf<A>>,
    batch_slots: Vec<(usize, u64, SlotId)>,
    batch_done: Vec<(usize, Completion)>,
    /// In-loop mode ([`Work::IN_LOOP`]): works to start at the end of this round, each with
    /// its ticket; what each ticket completes; free tickets; completions to hand back.
    started: Vec<(usize, WorkOf<A>)>,
    tickets: Vec<(usize, u64, SlotId)>,
    free_tickets: Vec<usize>,
    work_done: Vec<(usize, Completion)>,
    /// The clock of idle connections (buffers given back, the idle timeout).
    idle: driver::Idle,
    /// Most requests a connection answers per turn (`None`: all it has read).
    reqs_per_event: Option<u32>,
    /// Serve TLS with this configuration.
    tls: Option<Arc<rustls::ServerConfig>>,
    /// Where sessions charge their buffers.
    buffers: Option<Arc<crate::BufferBudget>>,
}

impl<A: App> EventLoop<A> {
    /// A loop on `poll` running `service` for its connections.
    pub fn new(poll: Poll, service: A::Service, app: Arc<A>, limits: Limits) -> Self {
        EventLoop {
            poll,
            incoming: None,
            listener: None,
            service,
            app,
            limits,
            conns: Vec::new(),
            free: Vec::new(),
            helpers: None,
            generation: 0,
            touched: Vec::new(),
            batch: Vec::new(),
            batch_slots: Vec::new(),
            batch_done: Vec::new(),
            started: Vec::new(),
            tickets: Vec::new(),
            free_tickets: Vec::new(),
            work_done: Vec::new(),
            idle: driver::Idle::new(None),
            reqs_per_event: None,
            tls: None,
            buffers: None,
        }
    }

    /// Sessions charge their buffers to `buffers` ([`crate::buffers`]).
    pub fn with_buffers(mut self, buffers: Option<Arc<crate::BufferBudget>>) -> Self {
        self.buffers = buffers;
        self
    }

    /// Every connection speaks TLS with `config` (see [`crate::tls`]).
    pub fn with_tls(mut self, config: Option<Arc<rustls::ServerConfig>>) -> Self {
        self.tls = config;
        self
    }

    /// A connection answers at most `n` requests per turn (memcached's `-R`; see
    /// [`crate::DriverConfig::reqs_per_event`]): one that has more buffered is served again at
    /// the end of the round, after the other ready connections, or in the next round.
    pub fn with_reqs_per_event(mut self, n: Option<u32>) -> Self {
        self.reqs_per_event = n;
        self
    }

    /// Connections idle longer than `timeout` are closed (see [`driver::Idle`]).
    pub fn with_idle_timeout(mut self, timeout: Option<std::time::Duration>) -> Self {
        self.idle = driver::Idle::new(timeout);
        self
    }

    /// Deferred work goes to `threads` helper threads, whose results wake the loop through
    /// its waker; the loop itself never blocks on it.
    pub fn with_helpers(mut self, threads: usize, waker: Arc<mio::Waker>) -> io::Result<Self> {
        let (tx, rx) = mpsc::channel();
        let wake: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
            let _ = waker.wake();
        });
        let workers = (0..threads.max(1)).map(|i| self.app.helper(i)).collect();
        let pool = HelperPool::start("kvlab-helper", workers, tx, wake)?;
        self.helpers = Some(Helpers { pool, done: rx });
        Ok(self)
    }

    /// Connections arrive on `rx` (the waker is woken after each send).
    pub fn with_incoming(mut self, rx: mpsc::Receiver<TcpStream>) -> Self {
        self.incoming = Some(rx);
        self
    }

    /// The loop accepts connections from `listener` itself.
    pub fn with_listener(mut self, mut listener: TcpListener) -> io::Result<Self> {
        self.poll
            .registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        self.listener = Some(listener);
        Ok(self)
    }

    /// Serves until the server's shutdown flag is set (and the waker woken).
    pub fn run(mut self) {
        let mut events = Events::with_capacity(1024);
        if self.in_loop() {
            match self.poll.registry().try_clone() {
                Ok(registry) => {
                    <WorkOf<A> as Work>::attach(self.service.worker(), Watch::new(registry))
                }
                Err(e) => {
                    tracing::error!(%e, "cannot share the loop's poll with its worker");
                    return;
                }
            }
        }
        while !self.app.stopping() {
            // Work collected while serving the last batch's replies runs without waiting.
            // So do connections that gave their turn up (`touched`).
            let timeout =
                if !self.batch.is_empty() || !self.started.is_empty() || !self.touched.is_empty() {
                    Some(std::time::Duration::ZERO)
                } else {
                    let due = if self.in_loop() {
                        <WorkOf<A> as Work>::deadline(self.service.worker())
                    } else {
                        None
                    };
                    let now = std::time::Instant::now();
                    Some(due.map_or(driver::Idle::EVERY, |due| {
                        due.saturating_duration_since(now).min(driver::Idle::EVERY)
                    }))
                };
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                tracing::error!(%e, "worker poll failed");
                break;
            }
            self.idle.tick();
            for event in events.iter() {
                match event.token() {
                    WAKER => {
                        self.adopt_new();
                        self.complete_work();
                    }
                    LISTENER => self.accept(),
                    Token(t) if t >= WATCH_BASE => {
                        let readable =
                            event.is_readable() || event.is_read_closed() || event.is_error();
                        let writable = event.is_writable() || event.is_write_closed();
                        let done = &mut self.work_done;
                        <WorkOf<A> as Work>::ready(
                            self.service.worker(),
                            t - WATCH_BASE,
                            readable,
                            writable,
                            &mut |ticket, c| done.push((ticket, c)),
                        );
                    }
                    Token(i) => {
                        if let Some(conn) = self.conns.get_mut(i).and_then(Option::as_mut) {
                            conn.input = conn.input.on_event(event.is_read_closed());
                            conn.last_active = self.idle.now();
                            self.service.record_wait(self.idle.now());
                        }
                        self.serve(i);
                    }
                }
            }
            self.run_batch();
            if self.in_loop() {
                self.run_in_loop();
            }
            // Connections that gave their turn up, after every other ready one.
            self.serve_touched();
            self.close_idle();
        }
        self.close_all();
    }

    /// Once a second: connections idle a while give their buffers back; those idle past
    /// the idle timeout are closed.
    fn close_idle(&mut self) {
        if !self.idle.sweep_due() {
            return;
        }
        for slot in 0..self.conns.len() {
            let Some(c) = self.conns[slot].as_mut() else {
                continue;
            };
            if self.idle.expired(c.last_active, &c.session) {
                self.app.idle_kick();
                self.drop_conn(slot);
            } else if self.idle.stale(c.last_active) {
                c.session.shrink();
            }
        }
    }

    /// Runs the work collected this round as one batch, completes it in its sessions, and
    /// serves each session touched once (their next requests join the next batch).
    fn run_batch(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let mut done = std::mem::take(&mut self.batch_done);
        let worker = self.service.worker();
        <WorkOf<A> as Work>::run_batch(&mut self.batch, worker, &mut |i, c| done.push((i, c)));
        self.batch.clear();
        let mut slots = std::mem::take(&mut self.batch_slots);
        for (i, completion) in done.drain(..) {
            let (slot, generation, id) = slots[i];
            self.complete((slot, generation), id, completion);
        }
        self.batch_done = done;
        slots.clear();
        self.batch_slots = slots;
        self.serve_touched();
    }

    /// Whether deferred work runs in the loop, its worker's sockets watched by it.
    fn in_loop(&self) -> bool {
        self.helpers.is_none() && <WorkOf<A> as Work>::IN_LOOP
    }

    /// In-loop mode, at the end of a round: starts the round's works (their requests leave
    /// in one write per socket of the worker), lets the worker act on its deadlines, then
    /// completes what finished in the sessions and serves each session touched once.
    fn run_in_loop(&mut self) {
        let done = &mut self.work_done;
        let worker = self.service.worker();
        if !self.started.is_empty() {
            <WorkOf<A> as Work>::start(&mut self.started, worker, &mut |t, c| done.push((t, c)));
            self.started.clear();
        }
        <WorkOf<A> as Work>::tick(worker, self.idle.now(), &mut |t, c| done.push((t, c)));
        <WorkOf<A> as Work>::end_round(worker);
        let mut done = std::mem::take(&mut self.work_done);
        for (ticket, completion) in done.drain(..) {
            let Some(&(slot, generation, id)) = self.tickets.get(ticket) else {
                continue;
            };
            self.free_tickets.push(ticket);
            self.complete((slot, generation), id, completion);
        }
        self.work_done = done;
        self.serve_touched();
    }

    /// Completes reply slot `id` of connection `conn` (if it is still that connection) and
    /// lists the connection for [`EventLoop::serve_touched`].
    fn complete(&mut self, conn: ConnId, id: SlotId, completion: Completion) {
        let (slot, generation) = conn;
        let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        if conn.generation != generation {
            return;
        }
        if let Some(buf) = conn.session.complete(id, completion) {
            self.service.recycle(buf);
        }
        if !conn.session.is_waiting() {
            conn.helper = None;
        }
        if !conn.touched {
            conn.touched = true;
            self.touched.push(slot);
        }
    }

    /// Serves each connection with completions once (its replies leave in one write), and
    /// each that gave its turn up (`-R`) once more.
    fn serve_touched(&mut self) {
        let mut touched = std::mem::take(&mut self.touched);
        for &slot in &touched {
            if let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) {
                conn.touched = false;
                self.serve(slot);
            }
        }
        touched.clear();
        // Those that gave their turn up again wait for the next round.
        touched.append(&mut self.touched);
        self.touched = touched;
    }

    fn accept(&mut self) {
        while let Some(listener) = self.listener.as_ref() {
            match driver::accept_one(listener, &*self.app) {
                Some((stream, _peer)) => self.adopt(stream),
                None => break,
            }
        }
    }

    fn adopt_new(&mut self) {
        while let Some(stream) = self.incoming.as_ref().and_then(|rx| rx.try_recv().ok()) {
            self.adopt(stream);
        }
    }

    fn adopt(&mut self, mut stream: TcpStream) {
        let tls = match &self.tls {
            Some(config) => match rustls::ServerConnection::new(config.clone()) {
                Ok(c) => Some(Box::new(c)),
                Err(e) => {
                    tracing::warn!(%e, "cannot start TLS on a connection");
                    self.app.release();
                    return;
                }
            },
            None => None,
        };
        let slot = self.free.pop().unwrap_or_else(|| {
            self.conns.push(None);
            self.conns.len() - 1
        });
        let registry = self.poll.registry();
        if let Err(e) = registry.register(&mut stream, Token(slot), Interest::READABLE) {
            tracing::warn!(%e, "cannot register connection");
            self.app.release();
            self.free.push(slot);
            return;
        }
        self.generation += 1;
        let mut session = Session::with_budget(self.limits, self.buffers.as_ref());
        if let Some(n) = self.reqs_per_event {
            session.per_turn(n);
        }
        self.conns[slot] = Some(Conn {
            stream,
            session,
            writable: false,
            generation: self.generation,
            helper: None,
            touched: false,
            // Registering raises an event for whatever came before (a FIN included).
            input: driver::Input::Ready,
            last_active: self.idle.now(),
            tls,
        });
        if let Some(conn) = self.conns[slot].as_mut() {
            use std::os::fd::AsRawFd;
            let fd = conn.stream.as_raw_fd();
            conn.session
                .opened(&mut self.service, fd, conn.tls.is_some());
        }
        // Edge-triggered: data may already be waiting.
        self.serve(slot);
    }

    fn serve(&mut self, slot: usize) {
        let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        let in_loop = self.helpers.is_none() && <WorkOf<A> as Work>::IN_LOOP;
        let batched = self.helpers.is_none() && !in_loop && <WorkOf<A> as Work>::BATCH > 1;
        let inline = self.helpers.is_none() && !batched && !in_loop;
        let pumped = match conn.tls.as_deref_mut() {
            Some(tls) => {
                // Ciphertext left over from the last write goes first.
                let flushed = match crate::tls::flush(tls, &mut conn.stream) {
                    Ok(()) => true,
                    Err(e) => e.kind() == io::ErrorKind::WouldBlock,
                };
                let pumped = if flushed {
                    let mut stream = crate::tls::TlsStream::new(&mut conn.stream, tls);
                    driver::pump(
                        &mut stream,
                        &mut conn.session,
                        &mut self.service,
                        inline,
                        &mut conn.input,
                    )
                } else {
                    Pump::Closed
                };
                match pumped {
                    // Ciphertext still queued: wait until the socket takes it.
                    Pump::Idle if crate::tls::pending(tls) => Pump::Blocked,
                    p => p,
                }
            }
            None => driver::pump(
                &mut conn.stream,
                &mut conn.session,
                &mut self.service,
                inline,
                &mut conn.input,
            ),
        };
        let keep = match pumped {
            Pump::Closed => false,
            Pump::Idle => arm_writable(conn, &self.poll, Token(slot), false),
            Pump::Blocked => arm_writable(conn, &self.poll, Token(slot), true),
            Pump::Yielded => {
                let keep = arm_writable(conn, &self.poll, Token(slot), false);
                if keep && !conn.touched {
                    conn.touched = true;
                    self.touched.push(slot);
                }
                keep
            }
        };
        if !keep {
            self.drop_conn(slot);
            return;
        }
        if let Some(helpers) = &self.helpers {
            while let Some((id, work)) = conn.session.take_work() {
                let helper = *conn.helper.get_or_insert_with(|| helpers.pool.pick());
                helpers
                    .pool
                    .submit(helper, (slot, conn.generation), id, work);
            }
        } else if batched {
            while let Some((id, work)) = conn.session.take_work() {
                self.batch.push(work);
                self.batch_slots.push((slot, conn.generation, id));
            }
        } else if in_loop {
            while let Some((id, work)) = conn.session.take_work() {
                let entry = (slot, conn.generation, id);
                let ticket = match self.free_tickets.pop() {
                    Some(t) => {
                        self.tickets[t] = entry;
                        t
                    }
                    None => {
                        self.tickets.push(entry);
                        self.tickets.len() - 1
                    }
                };
                self.started.push((ticket, work));
            }
        }
    }

    /// Hands finished work back to its sessions, then lets each session touched carry on
    /// once: the replies of a connection's many completions leave in one write.
    fn complete_work(&mut self) {
        while let Some(done) = self.helpers.as_ref().and_then(|h| h.done.try_recv().ok()) {
            self.complete(done.conn, done.slot, done.completion);
        }
        self.serve_touched();
    }

    fn drop_conn(&mut self, slot: usize) {
        if let Some(mut conn) = self.conns[slot].take() {
            let _ = self.poll.registry().deregister(&mut conn.stream);
            self.app.release();
            self.free.push(slot);
        }
    }

    fn close_all(&mut self) {
        for slot in 0..self.conns.len() {
            if let Some(conn) = self.conns[slot].as_mut() {
                match conn.tls.as_deref_mut() {
                    Some(tls) => {
                        let mut stream = crate::tls::TlsStream::new(&mut conn.stream, tls);
                        driver::flush_on_close(&mut stream, &conn.session);
                    }
                    None => driver::flush_on_close(&mut conn.stream, &conn.session),
                }
            }
            self.drop_conn(slot);
        }
    }
}

fn arm_writable<A: App>(conn: &mut Conn<A>, poll: &Poll, token: Token, want: bool) -> bool {
    if conn.writable != want {
        let interest = if want {
            Interest::READABLE | Interest::WRITABLE
        } else {
            Interest::READABLE
        };
        if poll
            .registry()
            .reregister(&mut conn.stream, token, interest)
            .is_err()
        {
            return false;
        }
        conn.writable = want;
    }
    true
}
