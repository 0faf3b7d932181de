//! The optional Prometheus endpoint (`--metrics-port`): `GET /metrics` returns the same
//! figures as `stats`, in the Prometheus text format, from an axum server.
//!
//! It runs on its own thread with a single-threaded tokio runtime, so scraping never takes
//! time from the cache's worker threads beyond summing their counters.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::sync::oneshot;

use crate::Shared;

/// A running metrics endpoint.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Binds `at` and serves `/metrics` until [`MetricsServer::stop`].
    pub fn start(at: SocketAddr, shared: Arc<Shared>) -> io::Result<MetricsServer> {
        let listener = std::net::TcpListener::bind(at)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()?;
        let thread = std::thread::Builder::new()
            .name("kvlab-metrics".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                        tracing::error!("metrics listener unusable");
                        return;
                    };
                    let app = Router::new().route(
                        "/metrics",
                        get(move || {
                            let shared = shared.clone();
                            async move {
                                let body =
                                    crate::stats::prometheus(&shared.stats.snapshot(&shared.store));
                                ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body)
                                    .into_response()
                            }
                        }),
                    );
                    let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
                        let _ = stop_rx.await;
                    });
                    if let Err(e) = serve.await {
                        tracing::error!(%e, "metrics endpoint failed");
                    }
                });
            })?;
        Ok(MetricsServer {
            addr,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving and joins the thread.
    pub fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
