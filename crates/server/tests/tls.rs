//! `-Z`: the memcached port over TLS (rustls), under every I/O model that serves it, with
//! the same replies as plain text and as Debian's memcached `-Z`; a plaintext client is
//! refused.

mod common;
#[path = "common/tls_client.rs"]
mod tls_client;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;
use tls_client::tls_client;

use common::*;
use kvlab_server::tls::TlsSettings;
use kvlab_server::IoModel;
use kvlab_testkit::Memcached;

/// A self-signed certificate for 127.0.0.1, written as PEM files in `dir`.
fn certificate(dir: &Path) -> (TlsSettings, Vec<u8>) {
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
        .expect("certificate");
    let (chain, key) = (dir.join("chain.pem"), dir.join("key.pem"));
    std::fs::write(&chain, cert.cert.pem()).expect("write");
    std::fs::write(&key, cert.key_pair.serialize_pem()).expect("write");
    let settings = TlsSettings {
        chain_cert: Some(chain),
        key: Some(key),
        ..TlsSettings::default()
    };
    (settings, cert.cert.der().to_vec())
}

/// Sends `req` over TLS and reads until the reply ends with `until`.
fn exchange_tls(s: &mut impl ReadWrite, req: &[u8], until: &[u8]) -> Vec<u8> {
    s.write_all(req).expect("write");
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    while !got.ends_with(until) {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    got
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// Requests whose replies must not change over TLS: pipelined, a value larger than
/// TLS records and socket buffers, a multi-get.
fn script(len: usize) -> (Vec<u8>, Vec<u8>) {
    let big = vec![b'b'; len];
    let mut req = b"set a 0 0 2\r\nhi\r\n".to_vec();
    req.extend_from_slice(format!("set big 7 0 {}\r\n", big.len()).as_bytes());
    req.extend_from_slice(&big);
    req.extend_from_slice(b"\r\nget a big nope a\r\nmn\r\n");
    let mut want = b"STORED\r\nSTORED\r\nVALUE a 0 2\r\nhi\r\n".to_vec();
    want.extend_from_slice(format!("VALUE big 7 {}\r\n", big.len()).as_bytes());
    want.extend_from_slice(&big);
    want.extend_from_slice(b"\r\nVALUE a 0 2\r\nhi\r\nEND\r\nMN\r\n");
    (req, want)
}

#[test]
fn get_and_set_over_tls_as_in_plain_text_and_in_memcached() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (settings, der) = certificate(dir.path());
    // memcached 1.6.18 -Z stalls when a request follows a value of 20 kB or more in the
    // same pipelined write (it answers the stores, then nothing: the rest stays in its TLS
    // buffer), so it is compared on a 5 kB value; kvlab also on 300 kB.
    let (small_req, small_want) = script(5_000);
    let (req, want) = script(300_000);
    let chain = settings.chain_cert.clone().expect("chain");
    let key = settings.key.clone().expect("key");
    let opts = format!(
        "ssl_chain_cert={},ssl_key={}",
        chain.display(),
        key.display()
    );
    let mc = Memcached::start_with(&["-Z", "-o", &opts])
        .unwrap_or_else(|e| panic!("{e} (.ci/run installs memcached)"));
    let mut s = tls_client(mc.addr, &der);
    let got = exchange_tls(&mut s, &small_req, b"MN\r\n");
    assert!(
        got == small_want,
        "memcached -Z: {} bytes, want {}",
        got.len(),
        small_want.len()
    );
    for io in [IoModel::Reactor, IoModel::Epoll, IoModel::Threaded] {
        let tls = settings.clone();
        let (server, _clock) = start(io, move |c| c.tls = Some(tls));
        let mut s = tls_client(server.addr(), &der);
        let got = exchange_tls(&mut s, &req, b"MN\r\n");
        assert!(
            got == want,
            "{}: {} bytes, want {}",
            io.name(),
            got.len(),
            want.len()
        );
        // A second connection, and a value split across many small writes.
        let mut s = tls_client(server.addr(), &der);
        for chunk in req.chunks(997) {
            s.write_all(chunk).expect("write");
        }
        assert!(
            exchange_tls(&mut s, b"", b"MN\r\n") == want,
            "{}",
            io.name()
        );
        let settings = exchange_tls(&mut s, b"stats settings\r\n", b"END\r\n");
        assert!(String::from_utf8_lossy(&settings).contains("STAT ssl_enabled yes\r\n"));
        // `watch` cannot take over a TLS connection's socket.
        assert_eq!(
            exchange_tls(&mut s, b"watch\r\n", b"\r\n"),
            b"WATCHER_FAILED failed to add log watcher\r\n"
        );
        // A plaintext client: no memcached reply, then the close.
        let mut plain = TcpStream::connect(server.addr()).expect("connect");
        plain
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        plain.write_all(b"get a\r\nversion\r\n").expect("write");
        let mut got = Vec::new();
        let _ = plain.read_to_end(&mut got);
        assert!(
            !got.windows(3).any(|w| w == b"END") && got.len() < 64,
            "{}: {} bytes back",
            io.name(),
            got.len()
        );
    }
    // The signal driver does not serve TLS: the server says so at start.
    let dir2 = tempfile::tempdir().expect("tempdir");
    let (tls, _) = certificate(dir2.path());
    let config = kvlab_server::ServerConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        io: IoModel::Signal,
        tls: Some(tls),
        crawler: None,
        ..kvlab_server::ServerConfig::default()
    };
    let err = kvlab_server::Server::start(config).err().expect("refused");
    assert!(err.to_string().contains("signal"), "{err}");
    // Missing files are a clear error too.
    let config = kvlab_server::ServerConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        tls: Some(TlsSettings::default()),
        crawler: None,
        ..kvlab_server::ServerConfig::default()
    };
    let err = kvlab_server::Server::start(config).err().expect("refused");
    assert!(err.to_string().contains("ssl_chain_cert"), "{err}");
}

/// pymemcache with an `ssl.SSLContext` runs its whole round trip over TLS.
#[test]
fn pymemcache_round_trips_over_tls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (settings, _) = certificate(dir.path());
    let ca = settings.chain_cert.clone().expect("chain");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/python/pymemcache_roundtrip.py");
    for io in [IoModel::Reactor, IoModel::Epoll, IoModel::Threaded] {
        let tls = settings.clone();
        let (server, _clock) = start(io, move |c| c.tls = Some(tls));
        let out = std::process::Command::new("python3")
            .arg(&script)
            .arg(server.addr().port().to_string())
            .arg("--tls")
            .arg(&ca)
            .output()
            .expect("python3 runs");
        assert!(
            out.status.success(),
            "io {}: pymemcache over TLS failed (pymemcache: .ci/run installs it)\n{}{}",
            io.name(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
