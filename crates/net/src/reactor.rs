//! The `reactor` I/O driver (the default): one epoll event loop per worker thread.
//!
//! ```text
//!             ┌──────────────┐  accept()  ┌───────────────┐
//!  clients ──►│ acceptor     │──────────► │ worker 0      │ mio::Poll, its connections,
//!             │ (1 thread,   │ round-robin│ Session+Service│ one read → process → one write
//!             │  mio::Poll)  │ via channel├───────────────┤
//!             └──────────────┘ + Waker    │ worker 1..t-1 │ same, independent
//!                                         └───────────────┘
//!            the services of all workers share the application's state (the cache's
//!            Arc<Store>, with sharded locks)
//! ```
//!
//! The acceptor enforces the connection limit (`-c`) and answers an extra connection with
//! memcached's `ERROR Too many open connections` before closing it. Workers are
//! edge-triggered: on readiness they read until the socket would block (or the session
//! stops wanting input because its replies are backed up), process, and write; a partial
//! write arms writable interest and pauses reading until the client catches up. Deferred
//! work (a durable cache's disk reads and persists) runs inline on the worker: its other
//! connections wait meanwhile — except work whose worker has sockets of its own
//! ([`crate::Work::IN_LOOP`], a proxy's backends), which the worker's loop watches in its
//! own epoll and completes as they become ready (see [`crate::event_loop`]).

use std::io;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use mio::net::{TcpListener, TcpStream};
use mio::{Poll, Waker};

use crate::driver;
use crate::event_loop::{EventLoop, WAKER};
use crate::service::App;
use crate::DriverConfig;

/// A running reactor: its threads and the wakers that stop them.
pub struct Reactor {
    threads: Vec<JoinHandle<()>>,
    wakers: Vec<Arc<Waker>>,
}

impl Reactor {
    /// Starts the acceptor and `config.threads` workers on `listener`.
    pub fn start<A: App>(
        listener: std::net::TcpListener,
        app: Arc<A>,
        config: DriverConfig,
    ) -> io::Result<Reactor> {
        listener.set_nonblocking(true)?;
        let mut threads = Vec::new();
        let mut wakers = Vec::new();
        let mut senders = Vec::new();
        for i in 0..config.threads.max(1) {
            let poll = Poll::new()?;
            let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
            let (tx, rx) = mpsc::channel::<TcpStream>();
            senders.push((tx, waker.clone()));
            wakers.push(waker);
            let service = app.service(i);
            let (app, limits, idle) = (app.clone(), config.limits, config.idle_timeout);
            let per_event = config.reqs_per_event;
            let tls = config.tls.clone();
            let buffers = config.buffers.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("kvlab-worker-{i}"))
                    .spawn(move || {
                        EventLoop::new(poll, service, app, limits)
                            .with_idle_timeout(idle)
                            .with_reqs_per_event(per_event)
                            .with_tls(tls)
                            .with_buffers(buffers)
                            .with_incoming(rx)
                            .run()
                    })?,
            );
        }
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        wakers.push(waker);
        let listener = TcpListener::from_std(listener);
        let acceptor_app = app.clone();
        threads.push(
            std::thread::Builder::new()
                .name("kvlab-acceptor".into())
                .spawn(move || {
                    let mut next = 0usize;
                    driver::accept_loop(poll, listener, &*acceptor_app, |stream| {
                        let (tx, waker) = &senders[next % senders.len()];
                        next = next.wrapping_add(1);
                        match tx.send(stream) {
                            Ok(()) => {
                                let _ = waker.wake();
                                true
                            }
                            Err(_) => false,
                        }
                    })
                })?,
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
