//! The optional Prometheus endpoint (`--metrics-port`): `GET /metrics` returns the same
//! figures as `stats`, in the Prometheus text format.
//!
//! It is served by the same axum machinery as the REST interface ([`HttpServer`]), on its
//! own thread and tokio runtime, so scraping never takes time from the cache's worker
//! threads beyond summing their counters.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::http::HttpServer;
use crate::Shared;

/// A running metrics endpoint.
pub type MetricsServer = HttpServer;

/// Binds `at` and serves `/metrics` under `limits` until [`HttpServer::stop`].
pub fn start(
    at: SocketAddr,
    shared: Arc<Shared>,
    limits: crate::http::HttpLimits,
) -> io::Result<MetricsServer> {
    kvlab_net::http::serve_metrics(at, "kvlab-metrics", limits, move || {
        crate::stats::prometheus(&shared.stats.snapshot(&shared.store))
    })
}
