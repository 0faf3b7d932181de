//! A rustls client that trusts one certificate, for the `-Z` tests and the TLS throughput
//! example (which includes this file by path).

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

/// A TLS connection to `addr` (as `127.0.0.1`) trusting only the DER certificate `der`, with
/// Nagle off and a 10 s read timeout.
pub fn tls_client(
    addr: SocketAddr,
    der: &[u8],
) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(der.to_vec()))
        .expect("root");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
    let conn = rustls::ClientConnection::new(Arc::new(config), name).expect("client");
    let sock = TcpStream::connect(addr).expect("connect");
    sock.set_nodelay(true).expect("nodelay");
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    rustls::StreamOwned::new(conn, sock)
}
