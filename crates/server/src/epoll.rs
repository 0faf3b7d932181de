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
//! One thread serves everything, so nothing on it may block: with a durable store, disk work
//! (read-through on a miss, persisting a write under `--durability sync`) goes to `-t` helper
//! threads ([`crate::disk`]) and completes through the loop's waker (an eventfd); meanwhile
//! the loop serves every other connection.
//!
//! ```text
//!  helpers (-t threads): load / persist ──► results ──► waker ──► event loop
//! ```

use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;

use mio::{Poll, Waker};

use crate::engine::Engine;
use crate::event_loop::{EventLoop, WAKER};
use crate::Shared;

/// A running single-loop driver.
pub struct Epoll {
    thread: Option<JoinHandle<()>>,
    waker: Arc<Waker>,
}

impl Epoll {
    pub fn start(listener: std::net::TcpListener, shared: Arc<Shared>) -> io::Result<Epoll> {
        listener.set_nonblocking(true)?;
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let engine = Engine::new(
            shared.store.clone(),
            shared.stats.clone(),
            shared.stats.workers[0].clone(),
        )
        .deferring();
        let helpers = shared.stats.threads;
        let event_loop = EventLoop::new(poll, engine, shared)
            .with_listener(mio::net::TcpListener::from_std(listener))?
            .with_disk_helpers(helpers, waker.clone())?;
        let thread = std::thread::Builder::new()
            .name("kvlab-epoll".into())
            .spawn(move || event_loop.run())?;
        Ok(Epoll {
            thread: Some(thread),
            waker,
        })
    }

    pub fn stop(mut self) {
        let _ = self.waker.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
