//! One epoll event loop over many connections: the building block of the `reactor` (one
//! loop per worker thread, fed by an acceptor) and `epoll` (one loop that also accepts)
//! drivers.
//!
//! Edge-triggered: on readiness a connection is pumped until its input is drained or its
//! output blocks; a blocked connection arms writable interest and reads nothing more until
//! the client has taken its replies.

use std::io;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::mpsc;
use std::sync::Arc;

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

use crate::disk::{DiskPool, Done};
use crate::driver::{self, Pump, LISTENER};
use crate::engine::Engine;
use crate::session::Session;
use crate::Shared;

/// The token of the loop's waker (new connections, shutdown).
pub const WAKER: Token = Token(usize::MAX);

struct Conn {
    stream: TcpStream,
    session: Session,
    /// Whether writable interest is armed (a write was partial).
    writable: bool,
    /// Distinguishes this connection from later ones in the same slot.
    generation: u64,
}

/// Disk helpers and the channel their results come back on.
struct Disk {
    pool: DiskPool,
    done: mpsc::Receiver<Done>,
}

/// An event loop and the connections it owns.
pub struct EventLoop {
    poll: Poll,
    incoming: Option<mpsc::Receiver<TcpStream>>,
    listener: Option<TcpListener>,
    engine: Engine,
    shared: Arc<Shared>,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    disk: Option<Disk>,
    generation: u64,
}

impl EventLoop {
    pub fn new(poll: Poll, engine: Engine, shared: Arc<Shared>) -> Self {
        EventLoop {
            poll,
            incoming: None,
            listener: None,
            engine,
            shared,
            conns: Vec::new(),
            free: Vec::new(),
            disk: None,
            generation: 0,
        }
    }

    /// Blocking disk work goes to `threads` helper threads, whose results wake the loop
    /// through its waker; the loop itself never blocks on disk.
    pub fn with_disk_helpers(mut self, threads: usize, waker: Arc<mio::Waker>) -> io::Result<Self> {
        let (tx, rx) = mpsc::channel();
        let wake: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
            let _ = waker.wake();
        });
        let pool = DiskPool::start(threads, self.shared.store.clone(), tx, wake)?;
        self.disk = Some(Disk { pool, done: rx });
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
                    WAKER => {
                        self.adopt_new();
                        self.complete_disk_work();
                    }
                    LISTENER => self.accept(),
                    Token(i) => self.serve(i),
                }
            }
        }
        self.close_all();
    }

    fn accept(&mut self) {
        while let Some(listener) = self.listener.as_ref() {
            match driver::accept_one(listener, &self.shared) {
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
        let slot = self.free.pop().unwrap_or_else(|| {
            self.conns.push(None);
            self.conns.len() - 1
        });
        let registry = self.poll.registry();
        if let Err(e) = registry.register(&mut stream, Token(slot), Interest::READABLE) {
            tracing::warn!(%e, "cannot register connection");
            driver::release(&self.shared.stats);
            self.free.push(slot);
            return;
        }
        self.generation += 1;
        self.conns[slot] = Some(Conn {
            stream,
            session: Session::new(self.shared.limits),
            writable: false,
            generation: self.generation,
        });
        // Edge-triggered: data may already be waiting.
        self.serve(slot);
    }

    fn serve(&mut self, slot: usize) {
        let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        let keep = match driver::pump(&mut conn.stream, &mut conn.session, &mut self.engine) {
            Pump::Closed => false,
            Pump::Idle => arm_writable(conn, &self.poll, Token(slot), false),
            Pump::Blocked => arm_writable(conn, &self.poll, Token(slot), true),
        };
        if !keep {
            self.drop_conn(slot);
            return;
        }
        if let (Some(work), Some(disk)) = (conn.session.take_blocking(), &self.disk) {
            disk.pool.submit((slot, conn.generation), work);
        }
    }

    /// Hands finished disk work back to its sessions and lets them carry on.
    fn complete_disk_work(&mut self) {
        while let Some(done) = self.disk.as_ref().and_then(|d| d.done.try_recv().ok()) {
            let (slot, generation) = done.conn;
            let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            if conn.generation != generation {
                continue;
            }
            conn.session.complete(&done.work, done.result);
            self.serve(slot);
        }
    }

    fn drop_conn(&mut self, slot: usize) {
        if let Some(mut conn) = self.conns[slot].take() {
            let _ = self.poll.registry().deregister(&mut conn.stream);
            driver::release(&self.shared.stats);
            self.free.push(slot);
        }
    }

    fn close_all(&mut self) {
        for slot in 0..self.conns.len() {
            if let Some(conn) = self.conns[slot].as_mut() {
                driver::flush_on_close(&mut conn.stream, &conn.session);
            }
            self.drop_conn(slot);
        }
    }
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
