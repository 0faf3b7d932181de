//! The seam between the network front end and what answers requests: a [`Service`] executes
//! parsed requests for one thread, an [`App`] makes services and helper workers for a
//! driver and admits connections, and deferred [`Work`] completes a reply later.
//!
//! A request's reply is either composed at once ([`Flow::Done`]) or completes later
//! ([`Flow::Defer`]): the session keeps a slot for it, and the [`Order`] says whether the
//! request runs again afterwards, and whether later requests of the same connection may be
//! processed meanwhile. The work then runs inline or on a helper thread and comes back as a
//! [`Completion`]. Replies always leave in request order.

use std::net::SocketAddr;

use kvlab_protocol::{MetaKey, ProtocolError, Request};

/// What the session does after [`Service::call`].
#[derive(Debug, PartialEq, Eq)]
pub enum Flow<W> {
    /// The reply (if any) is in `out`.
    Done,
    /// Flush what is composed, then close the connection (`quit`).
    Close,
    /// Hand the socket, with the replies composed and not yet sent, to the service
    /// ([`Service::take_over`]) instead of closing it, and read nothing more from it
    /// (`watch`: the connection becomes a log stream written by someone else, who must
    /// hear of every event after the request).
    HandOff,
    /// The reply completes later, once `W` has run; [`Order`] says how the session waits.
    Defer(W, Order),
}

/// How a deferred request holds up its connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// The request runs again once the work completes ([`Completion::Rerun`], e.g. after a
    /// read-through); nothing after it is processed meanwhile, and what it wrote to `out`
    /// is discarded.
    Rerun,
    /// What the request wrote to `out` is held back until the work completes; nothing after
    /// it is processed meanwhile (a persist before the reply).
    Barrier,
    /// What the request wrote to `out` is held back until the work completes, and later
    /// requests are processed meanwhile (their replies queue behind this one), up to
    /// [`crate::session::MAX_IN_FLIGHT`] pending replies per connection.
    Pipelined,
}

/// The outcome of deferred work, for the slot it belongs to.
#[derive(Debug, PartialEq, Eq)]
pub enum Completion {
    /// Run the request again ([`Order::Rerun`]); elsewhere the same as [`Completion::Release`].
    Rerun,
    /// Release the reply already composed and held back.
    Release,
    /// These bytes follow the reply already composed (a backend's answer).
    Reply(Vec<u8>),
    /// Replace the held-back reply with `SERVER_ERROR <reason>`; a request waiting to run
    /// again is dropped.
    Failed(String),
}

/// Work a request waits for. It runs inline on the thread that serves the connection, or on
/// a helper thread that owns a `Worker` (a store handle, a proxy's backend connections).
pub trait Work: Send + 'static {
    /// The per-thread state the work runs with.
    type Worker: Send + 'static;
    /// Most works a helper takes from the queue at once ([`Work::run_batch`]); 1 runs each
    /// alone.
    const BATCH: usize = 1;

    /// The work's worker has sockets of its own (a proxy's backend connections) that an
    /// event loop running it inline (the reactor) watches in its own epoll: a round's works
    /// are started together ([`Work::start`]) and complete as those sockets become ready
    /// ([`Work::ready`]), while the loop goes on serving its clients — no round waits for
    /// another's work. Helper threads still run it with [`Work::run_batch`].
    const IN_LOOP: bool = false;

    /// Does the work (may block).
    fn run(self, worker: &mut Self::Worker) -> Completion;

    /// [`Work::IN_LOOP`]: gives the worker the loop's [`Watch`], once, before any work.
    fn attach(worker: &mut Self::Worker, watch: Watch) {
        let _ = (worker, watch);
    }

    /// [`Work::IN_LOOP`]: starts `works` (each with its ticket), leaving the vector empty;
    /// each completes through `done(ticket, completion)`, now or from a later
    /// [`Work::ready`] or [`Work::tick`]. By default they run at once, as a batch.
    fn start(
        works: &mut Vec<(usize, Self)>,
        worker: &mut Self::Worker,
        done: &mut dyn FnMut(usize, Completion),
    ) where
        Self: Sized,
    {
        let tickets: Vec<usize> = works.iter().map(|(t, _)| *t).collect();
        let mut batch: Vec<Self> = works.drain(..).map(|(_, w)| w).collect();
        Self::run_batch(&mut batch, worker, &mut |i, c| done(tickets[i], c));
    }

    /// [`Work::IN_LOOP`]: the socket the worker watches as `id` is ready.
    fn ready(
        worker: &mut Self::Worker,
        id: usize,
        readable: bool,
        writable: bool,
        done: &mut dyn FnMut(usize, Completion),
    ) {
        let _ = (worker, id, readable, writable, done);
    }

    /// [`Work::IN_LOOP`]: the clock moved on (every round): deadlines past are acted on.
    fn tick(
        worker: &mut Self::Worker,
        now: std::time::Instant,
        done: &mut dyn FnMut(usize, Completion),
    ) {
        let _ = (worker, now, done);
    }

    /// [`Work::IN_LOOP`]: the end of a round of the loop (writes composed during it go out,
    /// figures are recorded).
    fn end_round(worker: &mut Self::Worker) {
        let _ = worker;
    }

    /// [`Work::IN_LOOP`]: the next time [`Work::tick`] must run, if any (the loop waits no
    /// longer).
    fn deadline(worker: &Self::Worker) -> Option<std::time::Instant> {
        let _ = worker;
        None
    }

    /// Does several works taken from the queue together (a proxy pipelines them to its
    /// backends), handing each outcome to `done` with the work's index in `works`, which it
    /// leaves empty. By default each runs in turn.
    fn run_batch(
        works: &mut Vec<Self>,
        worker: &mut Self::Worker,
        done: &mut dyn FnMut(usize, Completion),
    ) where
        Self: Sized,
    {
        for (i, work) in works.drain(..).enumerate() {
            done(i, work.run(worker));
        }
    }
}

/// Sockets of a worker that its event loop watches ([`Work::IN_LOOP`]): registered
/// edge-triggered for reading and writing in the loop's own epoll under an `id` of the
/// worker's choosing, which [`Work::ready`] gets back. A closed socket leaves the epoll by
/// itself.
pub struct Watch {
    registry: mio::Registry,
}

/// Tokens of watched sockets start here (clients' tokens are their slots, far below).
pub(crate) const WATCH_BASE: usize = usize::MAX / 2;

impl Watch {
    pub(crate) fn new(registry: mio::Registry) -> Watch {
        Watch { registry }
    }

    /// Watches socket `fd` as `id`.
    pub fn add(&self, fd: std::os::fd::RawFd, id: usize) -> std::io::Result<()> {
        self.registry.register(
            &mut mio::unix::SourceFd(&fd),
            mio::Token(WATCH_BASE + id),
            mio::Interest::READABLE | mio::Interest::WRITABLE,
        )
    }

    /// Watches socket `fd`, already watched, as `id` from now on.
    pub fn update(&self, fd: std::os::fd::RawFd, id: usize) -> std::io::Result<()> {
        self.registry.reregister(
            &mut mio::unix::SourceFd(&fd),
            mio::Token(WATCH_BASE + id),
            mio::Interest::READABLE | mio::Interest::WRITABLE,
        )
    }
}

/// Executes requests for one thread (one per event loop, or one per connection thread).
/// Drivers are generic over it, so its calls are monomorphised on the hot path.
pub trait Service: Send + 'static {
    /// Per-connection state the service keeps across calls (e.g. the keys a request has
    /// read through, so that a re-run does not defer for them again).
    type Conn: Default + Send;
    /// The deferred work of this service.
    type Work: Work;

    /// Executes `req`, appending its reply to `out`. `rerun` is true when the request runs
    /// again after [`Completion::Rerun`].
    fn call(
        &mut self,
        conn: &mut Self::Conn,
        req: &Request<'_>,
        out: &mut Vec<u8>,
        rerun: bool,
    ) -> Flow<Self::Work>;

    /// The worker that runs deferred work inline (drivers without helper threads).
    fn worker(&mut self) -> &mut <Self::Work as Work>::Worker;

    /// A request could not be parsed; the session has composed the error reply.
    fn protocol_error(&mut self, error: ProtocolError);

    /// The reply to a request that could not be parsed when it is not memcached's usual
    /// one for `error` (a connection that has not authenticated yet is told
    /// `CLIENT_ERROR unauthenticated`, `noreply` or not). By default, the usual one.
    fn error_reply(
        &mut self,
        conn: &mut Self::Conn,
        error: ProtocolError,
    ) -> Option<&'static [u8]> {
        let _ = (conn, error);
        None
    }

    /// A `set` (or `ms` setting) was refused as too large: `key`'s old value must go too,
    /// as in memcached, so that no stale value stays readable. The error reply is already
    /// composed; work returned here holds it back until it completes (its reply bytes, if
    /// any, follow it). By default nothing is dropped.
    fn drop_stale(&mut self, conn: &mut Self::Conn, key: MetaKey<'_>) -> Option<Self::Work> {
        let _ = (conn, key);
        None
    }

    /// Service times (ns) of the requests processed from one batch of input.
    fn record_service(&mut self, samples: &[u64]);

    /// Whether `req`'s service time is recorded. By default every request's is; a service
    /// leaves out what only observes it (a server's `stats`, which a monitor asks often
    /// and which would otherwise be most of an idle server's figures).
    fn timed(&self, req: &Request<'_>) -> bool {
        let _ = req;
        true
    }

    /// A ready connection waited for its event loop since `polled`, the poll's return that
    /// reported it, while the loop served the connections before it in that round (the
    /// time a ready client waits for a busy thread). By default not recorded (and the
    /// clock not read).
    fn record_wait(&mut self, polled: std::time::Instant) {
        let _ = polled;
    }

    /// A connection on socket `fd` begins (over TLS if `tls`), with `conn` its state (a
    /// log line names the client's socket, as memcached's `cfd=`; a TLS connection cannot
    /// be handed off as a plain socket).
    fn opened(&mut self, conn: &mut Self::Conn, fd: std::os::fd::RawFd, tls: bool) {
        let _ = (conn, fd, tls);
    }

    /// Takes a connection's socket after [`Flow::HandOff`], with the replies composed
    /// before it and not yet sent (`unsent`, to send first) and the input already read
    /// behind the request that handed it off (`unread`); the driver reads no more of it
    /// and forgets the connection. By default the socket is closed.
    fn take_over(&mut self, socket: std::os::fd::OwnedFd, unsent: &[u8], unread: &[u8]) {
        let _ = (unsent, unread);
        drop(socket);
    }

    /// A connection gave its turn up with requests still buffered
    /// ([`crate::DriverConfig::reqs_per_event`]; memcached's `conn_yields`).
    fn yielded(&mut self) {}

    /// `n` bytes were read from a connection.
    fn bytes_read(&mut self, n: usize);

    /// `n` bytes were written to a connection.
    fn bytes_written(&mut self, n: usize);

    /// The buffer of a [`Completion::Reply`] whose bytes the session has taken, for the
    /// service to reuse (a proxy recycles its request buffers this way, so that a forwarded
    /// request allocates nothing). By default it is dropped.
    fn recycle(&mut self, buf: Vec<u8>) {
        drop(buf);
    }
}

/// What a driver serves: it makes the services and helper workers, admits connections and
/// says when to stop.
pub trait App: Send + Sync + 'static {
    /// The service each serving thread runs.
    type Service: Service;

    /// The service for serving thread (or connection) number `index`.
    fn service(&self, index: usize) -> Self::Service;

    /// The state of helper thread number `index`.
    fn helper(&self, index: usize) -> WorkerOf<Self>;

    /// Counts a new connection from `peer` in, or refuses it (counting the refusal) when at
    /// the connection limit. The driver answers a refused connection and closes it.
    fn admit(&self, peer: SocketAddr) -> bool;

    /// Counts an admitted connection out.
    fn release(&self);

    /// A connection is being closed for idling past the idle timeout (memcached counts
    /// these as `idle_kicks`); [`App::release`] follows.
    fn idle_kick(&self) {}

    /// Whether the driver's threads must stop (checked after every wake-up).
    fn stopping(&self) -> bool;
}

/// The helper-thread state of an [`App`]'s work.
pub type WorkerOf<A> = <<<A as App>::Service as Service>::Work as Work>::Worker;

/// The work of an [`App`]'s service.
pub type WorkOf<A> = <<A as App>::Service as Service>::Work;
