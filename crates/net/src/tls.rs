//! TLS on a connection (rustls), as the drivers see it: a non-blocking [`TlsStream`] that
//! reads and writes plaintext like a socket, for the event loops' `pump`, and a blocking
//! [`BlockingTls`] for the threaded driver.
//!
//! The non-blocking stream keeps the contract `pump` relies on: a read shorter than the
//! buffer means the socket is drained (it returns early only when the socket would block or
//! closed, never while rustls still holds plaintext), and a write accepts plaintext only
//! when the ciphertext of earlier writes has left; what rustls still holds after a write
//! ([`pending`]) makes the driver wait for the socket to become writable and
//! [`flush`] it then.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};

use rustls::{ServerConnection, StreamOwned};

/// Plaintext over a non-blocking socket `S` through a server-side TLS connection.
pub struct TlsStream<'a, S> {
    sock: &'a mut S,
    conn: &'a mut ServerConnection,
}

impl<'a, S: Read + Write> TlsStream<'a, S> {
    /// The plaintext view of `conn` over `sock`.
    pub fn new(sock: &'a mut S, conn: &'a mut ServerConnection) -> Self {
        TlsStream { sock, conn }
    }
}

/// Writes the ciphertext rustls holds until it is out or the socket would block
/// (`WouldBlock`).
pub fn flush<S: Write>(conn: &mut ServerConnection, sock: &mut S) -> io::Result<()> {
    while conn.wants_write() {
        match conn.write_tls(sock) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Whether ciphertext is still waiting for the socket.
pub fn pending(conn: &ServerConnection) -> bool {
    conn.wants_write()
}

impl<S: Read + Write> Read for TlsStream<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut n = 0;
        loop {
            match self.conn.reader().read(&mut buf[n..]) {
                Ok(0) if n == buf.len() => return Ok(n),
                // The peer's close_notify: end of the stream.
                Ok(0) => return Ok(n),
                Ok(k) => {
                    n += k;
                    if n == buf.len() {
                        return Ok(n);
                    }
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            match self.conn.read_tls(self.sock) {
                // The socket closed (without close_notify).
                Ok(0) => return Ok(n),
                Ok(_) => {
                    if let Err(e) = self.conn.process_new_packets() {
                        // Not TLS (a plaintext client), or a broken peer: send the alert
                        // rustls composed, then fail the connection.
                        let _ = flush(self.conn, self.sock);
                        return Err(io::Error::new(io::ErrorKind::InvalidData, e));
                    }
                    // Handshake messages go out as soon as they are composed.
                    match flush(self.conn, self.sock) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => return Err(e),
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return if n > 0 { Ok(n) } else { Err(e) };
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

impl<S: Read + Write> Write for TlsStream<'_, S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // Earlier ciphertext first: plaintext is taken only when the socket keeps up, so
        // what rustls buffers stays bounded.
        flush(self.conn, self.sock)?;
        let n = self.conn.writer().write(buf)?;
        match flush(self.conn, self.sock) {
            Ok(()) => Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(n),
            Err(e) => Err(e),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        flush(self.conn, self.sock)
    }
}

impl<S: AsFd> AsFd for TlsStream<'_, S> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

/// A blocking TLS stream (the threaded driver's): rustls completes the handshake and every
/// write before returning.
pub struct BlockingTls(pub StreamOwned<ServerConnection, std::net::TcpStream>);

impl Read for BlockingTls {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for BlockingTls {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl AsFd for BlockingTls {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.sock.as_fd()
    }
}
