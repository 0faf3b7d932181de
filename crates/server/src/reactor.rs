//! The `reactor` I/O driver (the default): one epoll event loop per worker thread.
//!
//! ```text
//!             ┌──────────────┐  accept()  ┌───────────────┐
//!  clients ──►│ acceptor     │──────────► │ worker 0      │ mio::Poll, its connections,
//!             │ (1 thread,   │ round-robin│  Session+Engine│ one read → process → one write
//!             │  mio::Poll)  │ via channel├───────────────┤
//!             └──────────────┘ + Waker    │ worker 1..t-1 │ same, independent
//!                                         └───────────────┘
//!                      all workers share one Arc<Store> (sharded locks)
//! ```
//!
//! The acceptor enforces the connection limit (`-c`) and answers an extra connection with
//! memcached's `ERROR Too many open connections` before closing it. Workers are
//! edge-triggered: on readiness they read until the socket would block (or the session
//! stops wanting input because its replies are backed up), process, and write; a partial
//! write arms writable interest and pauses reading until the client catches up.

use std::io::{self, Read, Write};
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};

use crate::engine::Engine;
use crate::session::Session;
use crate::stats::WorkerStats;
use crate::{Shared, TOO_MANY_CONNECTIONS};

const LISTENER: Token = Token(usize::MAX - 1);
const WAKER: Token = Token(usize::MAX);

/// A running reactor: its threads and the wakers that stop them.
pub struct Reactor {
    threads: Vec<JoinHandle<()>>,
    wakers: Vec<Arc<Waker>>,
}

impl Reactor {
    /// Starts the acceptor and `shared.threads` workers on `listener`.
    pub fn start(listener: std::net::TcpListener, shared: Arc<Shared>) -> io::Result<Reactor> {
        listener.set_nonblocking(true)?;
        let mut threads = Vec::new();
        let mut wakers = Vec::new();
        let mut senders = Vec::new();
        for (i, worker_stats) in shared.stats.workers.iter().enumerate() {
            let poll = Poll::new()?;
            let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
            let (tx, rx) = mpsc::channel::<TcpStream>();
            senders.push((tx, waker.clone()));
            wakers.push(waker);
            let engine = Engine::new(
                shared.store.clone(),
                shared.stats.clone(),
                worker_stats.clone(),
            );
            let shared = shared.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("kvlab-worker-{i}"))
                    .spawn(move || Worker::new(poll, rx, engine, shared).run())?,
            );
        }
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        wakers.push(waker);
        let listener = TcpListener::from_std(listener);
        let acceptor_shared = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("kvlab-acceptor".into())
                .spawn(move || accept_loop(poll, listener, senders, acceptor_shared))?,
        );
        Ok(Reactor { threads, wakers })
    }

    /// Wakes every thread so it notices the shutdown flag, and waits for them.
    pub fn stop(self) {
        for w in &self.wakers {
            let _ = w.wake();
        }
        for t in self.threads {
            let _ = t.join();
        }
    }
}

fn accept_loop(
    mut poll: Poll,
    mut listener: TcpListener,
    workers: Vec<(mpsc::Sender<TcpStream>, Arc<Waker>)>,
    shared: Arc<Shared>,
) {
    if let Err(e) = poll
        .registry()
        .register(&mut listener, LISTENER, Interest::READABLE)
    {
        tracing::error!(%e, "cannot register listener");
        return;
    }
    let mut events = Events::with_capacity(64);
    let mut next = 0usize;
    while !shared.shutdown.load(SeqCst) {
        if let Err(e) = poll.poll(&mut events, None) {
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            tracing::error!(%e, "acceptor poll failed");
            return;
        }
        loop {
            match listener.accept() {
                Ok((mut stream, peer)) => {
                    let stats = &shared.stats;
                    if stats.curr_connections.load(Relaxed) >= stats.max_connections {
                        stats.rejected_connections.fetch_add(1, Relaxed);
                        let _ = stream.write(TOO_MANY_CONNECTIONS);
                        tracing::warn!(%peer, "too many open connections");
                        continue;
                    }
                    stats.curr_connections.fetch_add(1, Relaxed);
                    stats.total_connections.fetch_add(1, Relaxed);
                    let _ = stream.set_nodelay(true);
                    let (tx, waker) = &workers[next % workers.len()];
                    next = next.wrapping_add(1);
                    if tx.send(stream).is_ok() {
                        let _ = waker.wake();
                    } else {
                        stats.curr_connections.fetch_sub(1, Relaxed);
                    }
                    tracing::debug!(%peer, "accepted");
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE and friends: log and wait for the next readiness.
                    tracing::warn!(%e, "accept failed");
                    break;
                }
            }
        }
    }
}

struct Conn {
    stream: TcpStream,
    session: Session,
    /// Whether writable interest is armed (a write was partial).
    writable: bool,
}

struct Worker {
    poll: Poll,
    incoming: mpsc::Receiver<TcpStream>,
    engine: Engine,
    shared: Arc<Shared>,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
}

impl Worker {
    fn new(
        poll: Poll,
        incoming: mpsc::Receiver<TcpStream>,
        engine: Engine,
        shared: Arc<Shared>,
    ) -> Self {
        Worker {
            poll,
            incoming,
            engine,
            shared,
            conns: Vec::new(),
            free: Vec::new(),
        }
    }

    fn run(mut self) {
        let mut events = Events::with_capacity(1024);
        while !self.shared.shutdown.load(SeqCst) {
            if let Err(e) = self.poll.poll(&mut events, None) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                tracing::error!(%e, "worker poll failed");
                break;
            }
            for event in events.iter() {
                match event.token() {
                    WAKER => self.adopt_new(),
                    Token(i) => self.serve(i),
                }
            }
        }
        self.close_all();
    }

    fn adopt_new(&mut self) {
        while let Ok(mut stream) = self.incoming.try_recv() {
            let slot = self.free.pop().unwrap_or_else(|| {
                self.conns.push(None);
                self.conns.len() - 1
            });
            if let Err(e) =
                self.poll
                    .registry()
                    .register(&mut stream, Token(slot), Interest::READABLE)
            {
                tracing::warn!(%e, "cannot register connection");
                self.shared.stats.curr_connections.fetch_sub(1, Relaxed);
                self.free.push(slot);
                continue;
            }
            self.conns[slot] = Some(Conn {
                stream,
                session: Session::new(self.shared.limits),
                writable: false,
            });
            // Edge-triggered: data may already be waiting.
            self.serve(slot);
        }
    }

    fn serve(&mut self, slot: usize) {
        let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        let keep = drive(conn, &mut self.engine, &self.poll, Token(slot));
        if !keep {
            self.drop_conn(slot);
        }
    }

    fn drop_conn(&mut self, slot: usize) {
        if let Some(mut conn) = self.conns[slot].take() {
            let _ = self.poll.registry().deregister(&mut conn.stream);
            self.shared.stats.curr_connections.fetch_sub(1, Relaxed);
            self.free.push(slot);
        }
    }

    fn close_all(&mut self) {
        for slot in 0..self.conns.len() {
            if let Some(conn) = self.conns[slot].as_mut() {
                let out = conn.session.output();
                if !out.is_empty() {
                    let _ = conn.stream.write(out);
                }
            }
            self.drop_conn(slot);
        }
    }
}

/// Moves bytes for one connection until its input is drained. Returns false when the
/// connection is finished (peer closed, error, or the session closed after its replies).
///
/// A read shorter than the buffer is taken as "drained": on Linux every arrival of data
/// after that read raises a new edge, so this saves the extra `read` that would only
/// return `EAGAIN` — one read and one write per batch of pipelined requests.
fn drive(conn: &mut Conn, engine: &mut Engine, poll: &Poll, token: Token) -> bool {
    let mut drained = false;
    loop {
        conn.session.process(engine);
        if !flush(conn, engine) {
            return false;
        }
        if !conn.session.output().is_empty() {
            return arm_writable(conn, poll, token, true);
        }
        if conn.session.is_closing() {
            return false;
        }
        if drained {
            return arm_writable(conn, poll, token, false);
        }
        drained = true;
        while conn.session.wants_read() {
            let space = conn.session.read_space();
            let room = space.len();
            if room == 0 {
                break;
            }
            match conn.stream.read(space) {
                Ok(0) => return false,
                Ok(n) => {
                    WorkerStats::add(&engine.worker.bytes_read, n as u64);
                    conn.session.filled(n);
                    if n == room {
                        drained = false;
                    }
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return false,
            }
        }
    }
}

fn flush(conn: &mut Conn, engine: &mut Engine) -> bool {
    while !conn.session.output().is_empty() {
        match conn.stream.write(conn.session.output()) {
            Ok(0) => return false,
            Ok(n) => {
                WorkerStats::add(&engine.worker.bytes_written, n as u64);
                conn.session.wrote(n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
    true
}

fn arm_writable(conn: &mut Conn, poll: &Poll, token: Token, want: bool) -> bool {
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
