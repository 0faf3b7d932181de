//! The `threaded` I/O driver: one thread per client connection, blocking socket I/O.
//!
//! ```text
//!             ┌──────────────┐ accept() ┌──────────────────────────┐
//!  clients ──►│ acceptor     │────────► │ conn thread: read (blocks) │  one per connection,
//!             │ (1 thread,   │  spawn   │  → Session.process         │  Session + Engine of its own
//!             │  mio::Poll)  │          │  → write_all (blocks)      │
//!             └──────────────┘          └──────────────────────────┘
//! ```
//!
//! The simplest model and the classic baseline: no readiness notification, the kernel
//! schedules one thread per client. Its cost is a thread (stack, context switches) per
//! connection. Blocking disk work runs inline on the connection's own thread. Shutdown shuts
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

use crate::driver;
use crate::engine::Engine;
use crate::session::Session;
use crate::stats::WorkerStats;
use crate::Shared;

const WAKER: mio::Token = mio::Token(usize::MAX);

/// The open connections, so that shutdown can interrupt their blocked reads.
#[derive(Default)]
struct Registry {
    streams: Mutex<HashMap<u64, std::net::TcpStream>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    next_id: AtomicU64,
}

/// A running threaded driver.
pub struct Threaded {
    acceptor: Option<JoinHandle<()>>,
    waker: Arc<Waker>,
    registry: Arc<Registry>,
}

impl Threaded {
    pub fn start(listener: std::net::TcpListener, shared: Arc<Shared>) -> io::Result<Threaded> {
        listener.set_nonblocking(true)?;
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let registry = Arc::new(Registry::default());
        let reg = registry.clone();
        let listener = mio::net::TcpListener::from_std(listener);
        let acceptor = std::thread::Builder::new()
            .name("kvlab-acceptor".into())
            .spawn(move || {
                driver::accept_loop(poll, listener, &shared, |stream| {
                    spawn_conn(stream, &shared, &reg)
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
        let threads = std::mem::take(&mut *self.registry.threads.lock());
        for t in threads {
            let _ = t.join();
        }
    }
}

fn spawn_conn(stream: mio::net::TcpStream, shared: &Arc<Shared>, reg: &Arc<Registry>) -> bool {
    // SAFETY: `into_raw_fd` hands over sole ownership of a valid socket descriptor.
    let stream = unsafe { std::net::TcpStream::from_raw_fd(stream.into_raw_fd()) };
    if stream.set_nonblocking(false).is_err() {
        return false;
    }
    let Ok(clone) = stream.try_clone() else {
        return false;
    };
    let id = reg.next_id.fetch_add(1, Relaxed);
    reg.streams.lock().insert(id, clone);
    // Connections share the per-worker counters round-robin: each counter is atomic and
    // each histogram is behind its own mutex, so sharing is safe and cheap.
    let workers = &shared.stats.workers;
    let worker = workers[(id as usize) % workers.len()].clone();
    let engine = Engine::new(shared.store.clone(), shared.stats.clone(), worker);
    let (shared2, reg2) = (shared.clone(), reg.clone());
    let spawned = std::thread::Builder::new()
        .name(format!("kvlab-conn-{id}"))
        .spawn(move || {
            serve(stream, engine, &shared2);
            reg2.streams.lock().remove(&id);
            driver::release(&shared2.stats);
        });
    match spawned {
        Ok(handle) => {
            let mut threads = reg.threads.lock();
            threads.retain(|t| !t.is_finished());
            threads.push(handle);
            true
        }
        Err(e) => {
            tracing::warn!(%e, "cannot spawn connection thread");
            reg.streams.lock().remove(&id);
            false
        }
    }
}

/// Blocking loop for one connection: read, process, write everything, repeat.
fn serve(mut stream: std::net::TcpStream, mut engine: Engine, shared: &Shared) {
    let mut session = Session::new(shared.limits);
    loop {
        session.process(&mut engine);
        if !session.output().is_empty() {
            match stream.write(session.output()) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    WorkerStats::add(&engine.worker.bytes_written, n as u64);
                    session.wrote(n);
                }
            }
            continue;
        }
        if session.is_closing() {
            return;
        }
        match stream.read(session.read_space()) {
            Ok(0) => return,
            Ok(n) => {
                WorkerStats::add(&engine.worker.bytes_read, n as u64);
                session.filled(n);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}
