//! The `epoll` I/O driver: a single event-loop thread with non-blocking sockets and epoll
//! readiness, which also accepts.
//!
//! ```text
//!  clients ──► ┌────────────────────────────────────┐
//!              │ event loop (1 thread, mio = epoll) │  listener + every connection
//!              │  accept / read → process → write   │
//!              └────────────────────────────────────┘
//! ```
//!
//! One thread serves everything, so nothing on it may block: deferred work (a durable
//! cache's read-through on a miss or persist under `--durability sync`; a backend request)
//! goes to `-t` helper threads ([`crate::pool`]) and completes through the loop's waker (an
//! eventfd); meanwhile the loop serves every other connection.
//!
//! ```text
//!  helpers (-t threads): work.run ──► completions ──► waker ──► event loop
//! ```

use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;

use mio::{Poll, Waker};

use crate::event_loop::{EventLoop, WAKER};
use crate::service::App;
use crate::DriverConfig;

/// A running single-loop driver.
pub struct Epoll {
    thread: Option<JoinHandle<()>>,
    waker: Arc<Waker>,
}

impl Epoll {
    /// Starts the loop on `listener`, with `config.threads` helper threads.
    pub fn start<A: App>(
        listener: std::net::TcpListener,
        app: Arc<A>,
        config: DriverConfig,
    ) -> io::Result<Epoll> {
        listener.set_nonblocking(true)?;
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let service = app.service(0);
        let event_loop = EventLoop::new(poll, service, app, config.limits)
            .with_idle_timeout(config.idle_timeout)
            .with_reqs_per_event(config.reqs_per_event)
            .with_tls(config.tls.clone())
            .with_buffers(config.buffers.clone())
            .with_listener(mio::net::TcpListener::from_std(listener))?
            .with_helpers(config.threads, waker.clone())?;
        let thread = std::thread::Builder::new()
            .name("kvlab-epoll".into())
            .spawn(move || event_loop.run())?;
        Ok(Epoll {
            thread: Some(thread),
            waker,
        })
    }

    /// Wakes the loop so it notices the stop, and waits for it.
    pub fn stop(mut self) {
        let _ = self.waker.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
