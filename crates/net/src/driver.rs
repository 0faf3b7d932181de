//! What every I/O driver shares: admitting connections under the `-c` limit, and pumping
//! bytes between a non-blocking socket and its [`Session`].

use std::io::{self, Read, Write};

use kvlab_protocol::response::TOO_MANY_CONNECTIONS;

use crate::service::{App, Service};
use crate::session::Session;

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

/// The listener's token in an acceptor's poll.
pub const LISTENER: Token = Token(usize::MAX - 1);

/// Counts a new connection in, or refuses it with memcached's message when the server is at
/// its connection limit. Returns whether the connection was admitted; a refused one should
/// be dropped (closed) by the caller.
pub fn admit<A: App>(app: &A, stream: &mut impl Write, peer: std::net::SocketAddr) -> bool {
    if !app.admit(peer) {
        let _ = stream.write(TOO_MANY_CONNECTIONS);
        tracing::warn!(%peer, "too many open connections");
        return false;
    }
    tracing::debug!(%peer, "accepted");
    true
}

/// Where a pumped connection stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pump {
    /// Done: peer closed, an error, or the session closed after its replies.
    Closed,
    /// Input drained and every reply written: wait for readability.
    Idle,
    /// Replies are waiting for the socket to drain: wait for writability.
    Blocked,
    /// Every reply written, but the session gave its turn up with requests still buffered
    /// ([`Session::per_turn`]): serve it again after the loop's other ready connections.
    Yielded,
}

/// Idle connections: the driver stamps a connection with [`Idle::now`] when it is ready,
/// and [`Idle::sweep_due`] says when to look at them (about once a second; the clock is
/// read once per loop round, not per request). One idle a second or more gives its
/// buffers back ([`Session::shrink`]); one idle past the idle timeout, if any, is closed.
pub(crate) struct Idle {
    timeout: Option<std::time::Duration>,
    now: std::time::Instant,
    last_sweep: std::time::Instant,
}

impl Idle {
    /// How often connections are checked.
    pub(crate) const EVERY: std::time::Duration = std::time::Duration::from_secs(1);

    pub(crate) fn new(timeout: Option<std::time::Duration>) -> Idle {
        let now = std::time::Instant::now();
        Idle {
            timeout,
            now,
            last_sweep: now,
        }
    }

    /// Reads the clock (once per loop round).
    pub(crate) fn tick(&mut self) {
        self.now = std::time::Instant::now();
    }

    /// The time of this round.
    pub(crate) fn now(&self) -> std::time::Instant {
        self.now
    }

    /// Whether a second has passed since the last sweep (and starts a new one if so).
    pub(crate) fn sweep_due(&mut self) -> bool {
        if self.now.duration_since(self.last_sweep) < Self::EVERY {
            return false;
        }
        self.last_sweep = self.now;
        true
    }

    /// Whether a connection last served at `last` with `session` is to be closed: idle
    /// past the timeout, with no reply owed or unsent. (Half a command line counts as
    /// idle, as in memcached.)
    pub(crate) fn expired<S: Service>(
        &self,
        last: std::time::Instant,
        session: &Session<S>,
    ) -> bool {
        self.timeout
            .is_some_and(|t| self.now.duration_since(last) > t)
            && !session.is_waiting()
            && session.output().is_empty()
    }

    /// Whether a connection last ready at `last` has been idle for a sweep interval (its
    /// buffers can go back).
    pub(crate) fn stale(&self, last: std::time::Instant) -> bool {
        self.now.duration_since(last) >= Self::EVERY
    }
}

/// What a driver knows of a connection's unread input (see [`pump`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input {
    /// Drained: nothing to read until the next readiness event.
    Drained,
    /// May hold input; a read shorter than the buffer drains it, since every later arrival
    /// raises a new event.
    Ready,
    /// May hold input *and its end* (the peer's FIN) with no later event to tell: the event
    /// said the peer closed its side (edge-triggered epoll merges a FIN into the event of
    /// the data before it), or bytes came before the socket was watched (a signal-driven
    /// socket). Read until a read would block or finds the end.
    ToEnd,
    /// The peer closed its side: nothing more will come. The connection closes once every
    /// reply it is owed is written.
    Ended,
}

impl Input {
    /// The state after a readiness event: `closed` when the event says the peer closed
    /// its side. An end already found stays found.
    pub fn on_event(self, closed: bool) -> Input {
        match self {
            Input::Ended => Input::Ended,
            _ if closed => Input::ToEnd,
            Input::ToEnd => Input::ToEnd,
            _ => Input::Ready,
        }
    }
}

/// Moves bytes for one non-blocking connection until its input is drained or its output
/// blocks.
///
/// A read shorter than the buffer is taken as "drained" (when `input` is
/// [`Input::Ready`]): on Linux every arrival of data after that read raises a new edge
/// (epoll) or signal (`O_ASYNC`), so this saves the extra `read` that would only return
/// `EAGAIN` — one read and one write per batch of pipelined requests. The peer's FIN may
/// have come with the data already, raising nothing more: then the driver says
/// [`Input::ToEnd`] and reads go on until one finds the end (0 bytes) or would block.
///
/// `input` is cleared to [`Input::Drained`] when a read finds the input drained, and the
/// caller sets it again on a readiness event ([`Input::on_event`]). So a connection pumped
/// because deferred work completed (its replies to write) costs no read that would only
/// return `EAGAIN`. A read of 0 bytes closes the connection once the replies owed for
/// what came before are written: at once if none is pending, else when the last completes.
///
/// With `inline`, deferred work runs here on the service's own worker; otherwise it stays in
/// the session for the caller to hand to helper threads ([`Session::take_work`]).
pub fn pump<T: Read + Write + std::os::fd::AsFd, S: Service>(
    stream: &mut T,
    session: &mut Session<S>,
    service: &mut S,
    inline: bool,
    input: &mut Input,
) -> Pump {
    let mut drained = false;
    loop {
        if inline {
            session.process_inline(service);
        } else {
            session.process(service);
        }
        if session.hands_off() && !session.is_waiting() {
            hand_off(stream, session, service);
            return Pump::Closed;
        }
        if !flush(stream, session, service) {
            return Pump::Closed;
        }
        if !session.output().is_empty() {
            return Pump::Blocked;
        }
        if session.take_yield() {
            return Pump::Yielded;
        }
        if (session.is_closing() || *input == Input::Ended) && !session.is_waiting() {
            return Pump::Closed;
        }
        if drained || matches!(*input, Input::Drained | Input::Ended) {
            return Pump::Idle;
        }
        drained = true;
        while session.wants_read() {
            let space = session.read_space();
            let room = space.len();
            if room == 0 {
                break;
            }
            match stream.read(space) {
                Ok(0) => {
                    *input = Input::Ended;
                    // Requests read before the end are answered first.
                    drained = false;
                    break;
                }
                Ok(n) => {
                    service.bytes_read(n);
                    session.filled(n);
                    if n == room || *input == Input::ToEnd {
                        drained = false;
                    } else {
                        *input = Input::Drained;
                    }
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    *input = Input::Drained;
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return Pump::Closed,
            }
        }
    }
}

/// A session that hands its connection off ([`crate::Flow::HandOff`]) gives the service
/// its own descriptor of the socket and its unsent replies (the driver then drops its
/// copy).
pub(crate) fn hand_off<T: std::os::fd::AsFd, S: Service>(
    stream: &T,
    session: &Session<S>,
    service: &mut S,
) {
    if session.hands_off() {
        match stream.as_fd().try_clone_to_owned() {
            Ok(fd) => service.take_over(fd, session.output(), session.unread()),
            Err(e) => tracing::warn!(%e, "cannot hand a connection off"),
        }
    }
}

/// Writes as much pending output as the socket takes. False on a dead connection.
fn flush<T: Write, S: Service>(stream: &mut T, session: &mut Session<S>, service: &mut S) -> bool {
    while !session.output().is_empty() {
        match stream.write(session.output()) {
            Ok(0) => return false,
            Ok(n) => {
                service.bytes_written(n);
                session.wrote(n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
    true
}

/// Best-effort write of whatever a session still holds, for shutdown.
pub fn flush_on_close<T: Write, S: Service>(stream: &mut T, session: &Session<S>) {
    let out = session.output();
    if !out.is_empty() {
        let _ = stream.write(out);
    }
}

/// Accepts connections until shutdown, admitting each under the connection limit and
/// handing it to `handoff` (which returns false if it could not take it). `poll` must have
/// a waker registered so that shutdown can interrupt the wait.
pub fn accept_loop<A: App>(
    mut poll: Poll,
    mut listener: TcpListener,
    app: &A,
    mut handoff: impl FnMut(TcpStream) -> bool,
) {
    if let Err(e) = poll
        .registry()
        .register(&mut listener, LISTENER, Interest::READABLE)
    {
        tracing::error!(%e, "cannot register listener");
        return;
    }
    let mut events = Events::with_capacity(64);
    while !app.stopping() {
        if let Err(e) = poll.poll(&mut events, None) {
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            tracing::error!(%e, "acceptor poll failed");
            return;
        }
        while let Some((stream, _peer)) = accept_one(&listener, app) {
            if !handoff(stream) {
                app.release();
            }
        }
    }
}

/// Accepts one admitted connection, or None when the listener would block. Refused
/// connections are answered and closed here.
pub fn accept_one<A: App>(
    listener: &TcpListener,
    app: &A,
) -> Option<(TcpStream, std::net::SocketAddr)> {
    use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
    loop {
        // SAFETY: the descriptor is the new connection's, owned by nothing else.
        match accept_fd(listener.as_raw_fd())
            .map(|(fd, peer)| (unsafe { TcpStream::from_raw_fd(fd.into_raw_fd()) }, peer))
        {
            Ok((mut stream, peer)) => {
                if !admit(app, &mut stream, peer) {
                    continue;
                }
                let _ = stream.set_nodelay(true);
                return Some((stream, peer));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // EMFILE and friends: log and wait for the next readiness.
                tracing::warn!(%e, "accept failed");
                return None;
            }
        }
    }
}

/// Accepts a connection on listening socket `listener`, non-blocking and close-on-exec,
/// with its peer's address. A TCP listener's peer is its address; a unix-domain
/// listener's (`kvlab server -s PATH`) has none, and is `0.0.0.0:0`. The drivers treat
/// either connection alike: reads, writes and shutdown are the same system calls (a unix
/// socket refuses TCP_NODELAY, which the drivers ask for best effort).
pub fn accept_fd(
    listener: std::os::fd::RawFd,
) -> io::Result<(std::os::fd::OwnedFd, std::net::SocketAddr)> {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
    use std::os::fd::FromRawFd;
    // SAFETY: an all-zero sockaddr_storage is valid; accept4 writes at most `len` bytes
    // into it and returns a new descriptor or -1.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let fd = unsafe {
        libc::accept4(
            listener,
            (&mut storage as *mut libc::sockaddr_storage).cast(),
            &mut len,
            libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: accept4 returned a new descriptor that nothing else owns.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    let peer = match i32::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let a = unsafe {
                &*(&storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>()
            };
            SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            ))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let a = unsafe {
                &*(&storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            ))
        }
        _ => SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)),
    };
    Ok((fd, peer))
}
