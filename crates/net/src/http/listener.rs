//! An HTTP endpoint's listener: a bound on open connections and an idle timeout for each.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::HttpLimits;

/// A listener that accepts only while fewer than [`HttpLimits::max_connections`] of its
/// connections are open, and hands out connections that close after
/// [`HttpLimits::idle_timeout`] without a byte either way.
pub(super) struct Bounded {
    inner: tokio::net::TcpListener,
    open: Arc<tokio::sync::Semaphore>,
    idle: Duration,
}

impl Bounded {
    pub(super) fn new(inner: tokio::net::TcpListener, limits: HttpLimits) -> Bounded {
        Bounded {
            inner,
            open: Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1))),
            idle: limits.idle_timeout,
        }
    }
}

impl axum::serve::Listener for Bounded {
    type Io = Timed;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Timed, SocketAddr) {
        // At the limit, wait for a connection to close before accepting another.
        let permit = loop {
            // The semaphore is never closed, so acquiring only fails if it were.
            if let Ok(p) = self.open.clone().acquire_owned().await {
                break p;
            }
        };
        loop {
            match self.inner.accept().await {
                Ok((tcp, peer)) => {
                    // Without TCP_NODELAY, Nagle holds a reply that follows another on the
                    // same connection until the client's delayed ACK (~40 ms).
                    let _ = tcp.set_nodelay(true);
                    let deadline = Box::pin(tokio::time::sleep(self.idle));
                    return (
                        Timed {
                            tcp,
                            _permit: permit,
                            idle: self.idle,
                            deadline,
                        },
                        peer,
                    );
                }
                Err(e) => {
                    // EMFILE and friends: wait a little rather than spin.
                    tracing::warn!(%e, "HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// An HTTP connection that fails with `TimedOut` (and so is closed) once it has neither
/// read nor written a byte for its idle timeout; it holds one of its listener's permits.
pub(super) struct Timed {
    tcp: tokio::net::TcpStream,
    _permit: tokio::sync::OwnedSemaphorePermit,
    idle: Duration,
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl Timed {
    fn active(&mut self) {
        let next = tokio::time::Instant::now() + self.idle;
        self.deadline.as_mut().reset(next);
    }
}

impl tokio::io::AsyncRead for Timed {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        use std::future::Future as _;
        use std::task::Poll;
        match std::pin::Pin::new(&mut self.tcp).poll_read(cx, buf) {
            Poll::Ready(r) => {
                self.active();
                Poll::Ready(r)
            }
            Poll::Pending => match self.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "HTTP connection idle past its timeout",
                ))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl tokio::io::AsyncWrite for Timed {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.tcp).poll_write(cx, buf);
        if r.is_ready() {
            self.active();
        }
        r
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.tcp).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> std::task::Poll<io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs);
        if r.is_ready() {
            self.active();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }
}
