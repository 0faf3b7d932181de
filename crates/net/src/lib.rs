//! kvlab's network front end: a sans-IO memcached session and four I/O drivers, generic over
//! a [`Service`] whose replies may complete later — and always leave in request order.
//!
//! The request path, outside in:
//!
//! ```text
//! socket ──► I/O driver ──► Session (sans-IO) ──► protocol::parse ──► Service::call ──► Flow
//!                              │ ordered reply slots: ready bytes | pending (deferred Work)
//!                              ▼
//!            Work::run (inline, or on a helper thread of the pool) ──► Completion
//!                              │ rerun the request | release held reply | reply bytes | SERVER_ERROR
//! socket ◄── I/O driver ◄── Session::output (up to the first pending slot)
//! ```
//!
//! Modules:
//!
//! - [`service`]: the seam — [`Service`] (executes requests for one thread, monomorphised
//!   into every driver), [`Work`] and [`Completion`] (a reply completing later), [`App`]
//!   (makes services and helper workers, admits connections under `-c`, says when to stop);
//! - [`session`]: bytes in, bytes out; pipelining, the ordered queue of reply slots,
//!   barriers, bounded buffers;
//! - [`buffers`]: the memory all connections' buffers hold, against memcached's
//!   `read_buf_mem_limit`;
//! - [`driver`]: what every driver shares: admission, the accept loop, the pump between a
//!   non-blocking socket and its session;
//! - [`event_loop`]: one edge-triggered epoll loop over many connections;
//! - [`tls`]: a connection's bytes through rustls (`-Z`), non-blocking and blocking;
//! - [`http`] (feature `http`): the HTTP endpoints' listener — kvlab-rest's REST interface and `/metrics`,
//!   the proxy's `/metrics` — on its own thread and tokio runtime, with bounded connections;
//! - [`pool`]: helper threads that run deferred work and wake the loop (thread diagram there);
//! - the drivers, each with its thread diagram: [`reactor`] (the default: one loop per worker,
//!   deferred work inline), [`threaded`] (a thread per connection, deferred work inline),
//!   [`epoll`] (one loop + helper threads, woken by an eventfd), [`signal`] (one loop woken
//!   by real-time signals + helper threads, woken through a signal-driven pipe).
//!
//! memcached-protocol parsing and composition live in `kvlab-protocol`; what a request means
//! lives in the service (the cache in `kvlab-server`, a proxy, a cluster node).

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod buffers;
pub mod driver;
pub mod epoll;
pub mod event_loop;
#[cfg(feature = "http")]
pub mod http;
pub mod pool;
pub mod reactor;
pub mod service;
pub mod session;
pub mod signal;
pub mod threaded;
pub mod tls;

use std::io;
use std::sync::Arc;

use kvlab_protocol::Limits;

pub use buffers::BufferBudget;
pub use service::{App, Completion, Flow, Order, Service, Watch, Work};
pub use session::Session;

/// Which I/O driver runs the sessions; all drive the same [`Session`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoModel {
    /// One epoll event loop per worker thread, fed by an acceptor (the default).
    Reactor,
    /// One thread per connection, blocking I/O.
    Threaded,
    /// One epoll event-loop thread for everything; deferred work on helper threads.
    Epoll,
    /// One event-loop thread woken by real-time signals (`O_ASYNC`, `F_SETSIG`).
    Signal,
}

impl IoModel {
    /// Every driver, for tests that must pass under each.
    pub const ALL: &'static [IoModel] = &[
        IoModel::Reactor,
        IoModel::Threaded,
        IoModel::Epoll,
        IoModel::Signal,
    ];

    /// The name `--io` takes.
    pub fn name(self) -> &'static str {
        match self {
            IoModel::Reactor => "reactor",
            IoModel::Threaded => "threaded",
            IoModel::Epoll => "epoll",
            IoModel::Signal => "signal",
        }
    }
}

impl std::str::FromStr for IoModel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        IoModel::ALL
            .iter()
            .copied()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                format!("unknown I/O model {s:?} (known: reactor, threaded, epoll, signal)")
            })
    }
}

/// What every driver is told.
#[derive(Clone, Debug)]
pub struct DriverConfig {
    /// Worker threads (reactor) or helper threads (epoll, signal); `-t`.
    pub threads: usize,
    /// Parsing limits of every session.
    pub limits: Limits,
    /// Close a connection idle this long (memcached's `-o idle_timeout`): no request
    /// and no reply in flight. Checked about once a second. `None`: never.
    pub idle_timeout: Option<std::time::Duration>,
    /// Serve TLS (memcached's `-Z`) with this configuration: every connection's bytes go
    /// through rustls ([`tls`]). The reactor, epoll and threaded drivers serve it; the
    /// signal driver refuses to start with it.
    pub tls: Option<std::sync::Arc<rustls::ServerConfig>>,
    /// Most requests a connection has answered per turn of an event loop before the
    /// loop's other ready connections are served (memcached's `-R`); its further
    /// buffered requests wait for the loop's next turn, counted as a yield
    /// ([`service::Service::yielded`]). The `reactor` and `epoll` drivers keep it;
    /// `threaded` (a thread per connection) and `signal` have no turn to give. `None`:
    /// a connection answers all it has read at once.
    pub reqs_per_event: Option<u32>,
    /// Where every session charges its buffers, and their limit (memcached's
    /// `-o read_buf_mem_limit`, [`buffers`]). `None`: not counted, no limit.
    pub buffers: Option<Arc<BufferBudget>>,
}

/// A running I/O driver.
pub enum Driver {
    /// See [`reactor`].
    Reactor(reactor::Reactor),
    /// See [`threaded`].
    Threaded(threaded::Threaded),
    /// See [`epoll`].
    Epoll(epoll::Epoll),
    /// See [`signal`].
    Signal(signal::SignalDriver),
}

impl Driver {
    /// Starts driver `io` serving `app` on `listener`.
    pub fn start<A: App>(
        io: IoModel,
        listener: std::net::TcpListener,
        app: Arc<A>,
        config: DriverConfig,
    ) -> io::Result<Driver> {
        Ok(match io {
            IoModel::Reactor => Driver::Reactor(reactor::Reactor::start(listener, app, config)?),
            IoModel::Threaded => {
                Driver::Threaded(threaded::Threaded::start(listener, app, config)?)
            }
            IoModel::Epoll => Driver::Epoll(epoll::Epoll::start(listener, app, config)?),
            IoModel::Signal if config.tls.is_some() => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "the signal I/O model does not serve TLS (use reactor, epoll or threaded)",
                ))
            }
            IoModel::Signal => Driver::Signal(signal::SignalDriver::start(listener, app, config)?),
        })
    }

    /// Stops the driver's threads (the app must already say [`App::stopping`]) and waits for
    /// them; every connection is closed after a best-effort flush.
    pub fn stop(self) {
        match self {
            Driver::Reactor(d) => d.stop(),
            Driver::Threaded(d) => d.stop(),
            Driver::Epoll(d) => d.stop(),
            Driver::Signal(d) => d.stop(),
        }
    }
}
