//! The HTTP endpoints of kvlab's processes — the server's REST interface and `/metrics`,
//! the proxy's `/metrics` — all served the same way: an axum router on its own thread with
//! its own tokio runtime, under bounds on its connections.
//!
//! ```text
//!  HttpServer::serve ──► thread `name` ── block_on(axum::serve) ── accept loop (at most
//!                          HttpLimits::max_connections open; each closed after
//!                          HttpLimits::idle_timeout without a byte either way)
//!                          tokio multi-thread runtime, 2 workers (`name`-rt):
//!                          one task per connection (hyper HTTP/1.1: keep-alive, pipelining)
//!  HttpServer::stop ──► watch signal ──► graceful shutdown: idle connections close, busy ones
//!                          finish their request; after GRACE the runtime drops what is left
//! ```
//!
//! HTTP never runs on the memcached worker threads: a slow HTTP client costs those threads
//! nothing but CPU time. What the routes do is the caller's; [`serve_metrics`] is the one
//! route every process with a `--metrics-port` shares.

use std::io;
use std::net::SocketAddr;
use std::thread::JoinHandle;
use std::time::Duration;

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::sync::watch;

use listener::Bounded;

mod listener;

/// How long [`HttpServer::stop`] lets open requests finish before dropping them.
const GRACE: Duration = Duration::from_secs(5);

/// A running HTTP endpoint.
pub struct HttpServer {
    addr: SocketAddr,
    stop: Option<watch::Sender<bool>>,
    thread: Option<JoinHandle<()>>,
}

impl HttpServer {
    /// Binds `at` and serves `app` on a thread named `name` with its own two-worker tokio
    /// runtime, until [`HttpServer::stop`], under the default [`HttpLimits`]. Shared by the
    /// server's REST interface and `/metrics`, and the proxy's `/metrics`.
    pub fn serve(at: SocketAddr, app: Router, name: &str) -> io::Result<HttpServer> {
        Self::serve_with(at, app, name, HttpLimits::default())
    }

    /// [`HttpServer::serve`] under `limits`.
    pub fn serve_with(
        at: SocketAddr,
        app: Router,
        name: &str,
        limits: HttpLimits,
    ) -> io::Result<HttpServer> {
        let listener = std::net::TcpListener::bind(at)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(format!("{name}-rt"))
            .enable_io()
            .enable_time()
            .build()?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => {
                            tracing::error!(%e, "HTTP listener unusable");
                            return;
                        }
                    };
                    let mut graceful = stop_rx.clone();
                    let listener = Bounded::new(listener, limits);
                    let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
                        let _ = graceful.wait_for(|stop| *stop).await;
                    });
                    let served = tokio::spawn(async move {
                        if let Err(e) = serve.await {
                            tracing::error!(%e, "HTTP interface failed");
                        }
                    });
                    // Wait for the stop signal (or a dropped sender), then give open requests
                    // GRACE to finish; what is left is dropped with the runtime.
                    let mut stop = stop_rx;
                    let _ = stop.wait_for(|stop| *stop).await;
                    if tokio::time::timeout(GRACE, served).await.is_err() {
                        tracing::warn!("HTTP connections still open after {GRACE:?}; closing");
                    }
                });
            })?;
        Ok(HttpServer {
            addr,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving and joins its thread.
    pub fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(true);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(true);
        }
    }
}

/// Bounds on an HTTP endpoint's connections, so that slow, stalled or idle clients cannot
/// hold the process's file descriptors: the memcached port must always accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// Most connections open at once; more wait in the listen backlog until one closes.
    pub max_connections: usize,
    /// A connection that neither reads nor writes a byte for this long is closed: an idle
    /// keep-alive connection, and a request whose header or body stalls, alike.
    pub idle_timeout: Duration,
}

impl Default for HttpLimits {
    /// 256 connections per endpoint (the REST port and `/metrics` together hold at most
    /// 512 descriptors, whatever clients do), closed after 30 s without a byte.
    fn default() -> Self {
        HttpLimits {
            max_connections: 256,
            idle_timeout: Duration::from_secs(30),
        }
    }
}

/// Binds `at` and serves `GET /metrics` under `limits` on a thread named `name`: each
/// scrape answers what `render` returns, in the Prometheus text format.
pub fn serve_metrics(
    at: SocketAddr,
    name: &str,
    limits: HttpLimits,
    render: impl Fn() -> String + Clone + Send + Sync + 'static,
) -> io::Result<HttpServer> {
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let render = render.clone();
            async move {
                (
                    [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                    render(),
                )
                    .into_response()
            }
        }),
    );
    HttpServer::serve_with(at, app, name, limits)
}
