//! The REST interface (`--http-port`): the cache over HTTP/JSON, sharing the store with the
//! memcached port.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::Shared;

/// A running REST endpoint.
pub struct HttpServer {
    addr: SocketAddr,
}

impl HttpServer {
    /// Binds `at` and serves until [`HttpServer::stop`].
    pub fn start(
        at: SocketAddr,
        shared: Arc<Shared>,
        admin_token: Option<String>,
    ) -> io::Result<HttpServer> {
        let _ = (shared, admin_token);
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("HTTP interface on {at} is not built yet"),
        ))
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving and joins its thread.
    pub fn stop(self) {}
}
