//! The `threaded` I/O driver: one thread per client connection, blocking socket I/O.
//!
//! ```text
//!             ┌──────────────┐ accept() ┌──────────────────────────┐
//!  clients ──►│ acceptor     │────────► │ conn thread: read (blocks) │  one per connection,
//!             │ (1 thread,   │  spawn   │  → Session.process         │  Session + Service of its own
//!             │  mio::Poll)  │          │  → write_all (blocks)      │
//!             └──────────────┘          └──────────────────────────┘
//! ```
//!
//! The simplest model and the classic baseline: no readiness notification, the kernel
//! schedules one thread per client. Its cost is a thread (stack, context switches) per
//! connection. Deferred work (disk, a backend) runs inline on the connection's own thread. Shutdown shuts
//! every socket down so that blocked reads return.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::{FromRawFd, IntoRawFd};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;

use mio::{Poll, Waker};
use parking_lot::Mutex;

use kvlab_protocol::Limits;

use crate::driver;
use crate::service::{App, Service};
use crate::session::Session;
use crate::DriverConfig;

const WAKER: mio::Token = mio::Token(usize::MAX);

/// The open connections, so that shutdown can interrupt their blocked reads.
#[derive(Default)]
struct Registry {
    streams: Mutex<HashMap<u64, std::net::TcpStream>>,
    threads: Mutex<Threads>,
    next_id: AtomicU64,
}

/// The connections' threads, for shutdown to join. Finished ones are dropped when the list
/// has doubled since the last look: a look per accept would cost the acceptor time in
/// proportion to the threads alive, in a burst of connects (quadratic), when it must keep up.
#[derive(Default)]
struct Threads {
    handles: Vec<JoinHandle<()>>,
    /// Look for finished threads when this many are listed.
    reap_at: usize,
}

impl Threads {
    fn push(&mut self, handle: JoinHandle<()>) {
        if self.handles.len() >= self.reap_at {
            self.handles.retain(|t| !t.is_finished());
            self.reap_at = (self.handles.len() * 2).max(64);
        }
        self.handles.push(handle);
    }
}

/// A running threaded driver.
pub struct Threaded {
    acceptor: Option<JoinHandle<()>>,
    waker: Arc<Waker>,
    registry: Arc<Registry>,
}

impl Threaded {
    /// Starts the acceptor on `listener`; each connection gets a thread.
    pub fn start<A: App>(
        listener: std::net::TcpListener,
        app: Arc<A>,
        config: DriverConfig,
    ) -> io::Result<Threaded> {
        listener.set_nonblocking(true)?;
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let registry = Arc::new(Registry::default());
        let reg = registry.clone();
        let listener = mio::net::TcpListener::from_std(listener);
        let acceptor = std::thread::Builder::new()
            .name("kvlab-acceptor".into())
            .spawn(move || {
                driver::accept_loop(poll, listener, &*app, |stream| {
                    spawn_conn(stream, &app, &config, &reg)
                })
            })?;
        Ok(Threaded {
            acceptor: Some(acceptor),
            waker,
            registry,
        })
    }

    /// Stops accepting, shuts every connection's socket so its thread wakes, and joins all.
    pub fn stop(mut self) {
        let _ = self.waker.wake();
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        for s in self.registry.streams.lock().values() {
            let _ = s.shutdown(Shutdown::Both);
        }
        let threads = std::mem::take(&mut self.registry.threads.lock().handles);
        for t in threads {
            let _ = t.join();
        }
    }
}

fn spawn_conn<A: App>(
    stream: mio::net::TcpStream,
    app: &Arc<A>,
    config: &DriverConfig,
    reg: &Arc<Registry>,
) -> bool {
    // SAFETY: `into_raw_fd` hands over sole ownership of a valid socket descriptor.
    let stream = unsafe { std::net::TcpStream::from_raw_fd(stream.into_raw_fd()) };
    if stream.set_nonblocking(false).is_err() {
        return false;
    }
    // With an idle timeout a blocked read returns after it, and the thread looks.
    if stream.set_read_timeout(config.idle_timeout).is_err() {
        return false;
    }
    let Ok(clone) = stream.try_clone() else {
        return false;
    };
    let id = reg.next_id.fetch_add(1, Relaxed);
    reg.streams.lock().insert(id, clone);
    let service = app.service(id as usize);
    let (app2, reg2) = (app.clone(), reg.clone());
    let (limits, tls) = (config.limits, config.tls.clone());
    let buffers = config.buffers.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("kvlab-conn-{id}"))
        .spawn(move || {
            use std::os::fd::AsRawFd;
            let fd = stream.as_raw_fd();
            let end = match tls {
                Some(config) => match rustls::ServerConnection::new(config) {
                    Ok(conn) => {
                        let stream =
                            crate::tls::BlockingTls(rustls::StreamOwned::new(conn, stream));
                        let session = Session::with_budget(limits, buffers.as_ref());
                        serve_session(stream, service, session, fd, true)
                    }
                    Err(e) => {
                        tracing::warn!(%e, "cannot start TLS on a connection");
                        End::Closed
                    }
                },
                None => {
                    let session = Session::with_budget(limits, buffers.as_ref());
                    serve_session(stream, service, session, fd, false)
                }
            };
            if end == End::Idle {
                app2.idle_kick();
            }
            reg2.streams.lock().remove(&id);
            app2.release();
        });
    match spawned {
        Ok(handle) => {
            reg.threads.lock().push(handle);
            true
        }
        Err(e) => {
            tracing::warn!(%e, "cannot spawn connection thread");
            reg.streams.lock().remove(&id);
            false
        }
    }
}

/// Serves a connection taken over from another driver ([`crate::Flow::HandOff`]) on the
/// calling thread, blocking, until it closes: `unsent` (the replies composed before the
/// hand-off) goes first. A cluster node serves its peers' copy and migration streams this
/// way, off the threads that serve clients, so that a client request waiting on a peer
/// never waits on a thread that waits on it in turn.
pub fn serve_taken_over<S: Service>(
    socket: std::os::fd::OwnedFd,
    unsent: &[u8],
    unread: &[u8],
    service: S,
    limits: Limits,
) {
    use std::os::fd::AsRawFd;
    let mut stream = std::net::TcpStream::from(socket);
    if stream.set_nonblocking(false).is_err() || stream.write_all(unsent).is_err() {
        return;
    }
    let fd = stream.as_raw_fd();
    let mut session = Session::new(limits);
    session.preload(unread);
    serve_session(stream, service, session, fd, false);
}

/// How a connection's thread ended.
#[derive(PartialEq, Eq)]
enum End {
    /// Closed by the client, an error, `quit`, or shutdown.
    Closed,
    /// Idle past the idle timeout (the socket's read timeout).
    Idle,
}

/// [`serve`] with a session made already (holding input read elsewhere).
fn serve_session<T: Read + Write + std::os::fd::AsFd, S: Service>(
    mut stream: T,
    mut service: S,
    mut session: Session<S>,
    fd: std::os::fd::RawFd,
    tls: bool,
) -> End {
    session.opened(&mut service, fd, tls);
    loop {
        session.process_inline(&mut service);
        if session.hands_off() {
            driver::hand_off(&stream, &session, &mut service);
            return End::Closed;
        }
        if !session.output().is_empty() {
            match stream.write(session.output()) {
                Ok(0) | Err(_) => return End::Closed,
                Ok(n) => {
                    service.bytes_written(n);
                    session.wrote(n);
                }
            }
            continue;
        }
        if session.is_closing() {
            return End::Closed;
        }
        match stream.read(session.read_space()) {
            Ok(0) => return End::Closed,
            Ok(n) => {
                service.bytes_read(n);
                session.filled(n);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // The read timeout is the idle timeout: nothing came for that long (work runs
            // inline and every reply was written, so nothing is owed).
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return End::Idle
            }
            Err(_) => return End::Closed,
        }
    }
}
