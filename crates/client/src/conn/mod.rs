//! A non-blocking, pipelined memcached connection for an event loop.
//!
//! The caller owns the loop (one mio `Poll` per thread driving many connections). A [`Conn`]
//! owns the socket, one output buffer, one input buffer and the FIFO of requests in flight:
//!
//! ```text
//!  request(compose)  ──────────► out buffer ──flush()──► socket (one write per batch)
//!                                   pending FIFO: (kind, user) … in request order
//!  on_readable(f) ◄── parse frames in place ◄── in buffer ◄── socket (read until drained)
//!        └─► f(Event::Value{..}) for every VALUE of the head request (borrowed, zero-copy)
//!        └─► f(Event::Done{user, outcome}) when the head request's reply is complete
//! ```
//!
//! memcached answers requests on a connection in order, so matching is by position: the
//! oldest pending request owns the next reply frame. `user` is the caller's per-request data
//! (for the load generator: the planned and actual send times), returned with the outcome.
//! After a [`ConnError`] the stream is out of step: drop the connection (its pending requests
//! are available through [`Conn::drain_pending`] to be counted).
//!
//! The same connection speaks HTTP/1.1 to kvlab's REST interface ([`Wire::Http`], requests
//! composed with [`crate::http`]): keep-alive, pipelined, responses matched in order too. A
//! `Get { keys: K }` is then K pipelined `GET`s reported as one request: each `200` is an
//! [`Event::Value`] (with an empty `key`: the raw-bytes response does not repeat it), each
//! `404` a miss, and the request is done after the K-th response.
//!
//! With [`Wire::Meta`] the requests are memcached's meta commands: `Store` is an `ms`
//! (`HD`, or `NS`/`EX`/`NF`), `Delete` an `md` (`HD` or `NF`). A `Get { keys: 1 }` is one
//! `mg` answered by `VA` (a hit, an [`Event::Value`]) or `EN` (a miss). A `Get { keys: K }`
//! with K > 1 is K *quiet* gets (`mg … q`) and an `mn`: misses send nothing, each hit is a
//! `VA`, and the request is done at the `MN`; an error line for one of its keys marks the
//! request failed without ending it. `VA` does not repeat the key, so its `Event::Value` has
//! an empty `key`; client flags come from the `f` return flag.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::SocketAddr;

use kvlab_protocol::client::{ComposeError, Reply, ReplyError};

use crate::http::HttpError;
use mio::net::TcpStream;
use mio::{Interest, Registry, Token};
use thiserror::Error;

mod http_replies;
mod meta_replies;
mod text_replies;

/// Initial input buffer size, in bytes: large enough for a deep pipeline of small replies in
/// one `read`; grows only when one frame is larger.
const IN_BUF: usize = 64 * 1024;
/// Compact or grow the input buffer when less than this many bytes are free at its end.
const MIN_READ: usize = 16 * 1024;

/// What a request expects back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReqKind {
    /// `get`/`gets` of `keys` keys: zero or more `VALUE` frames, then `END`. Over
    /// [`Wire::Meta`]: one `mg` (`VA` or `EN`) when `keys` is 1, else `keys` quiet `mg … q`
    /// and an `mn` (zero or more `VA`, then `MN`).
    Get {
        /// Number of keys asked for.
        keys: u32,
    },
    /// A storage command: `STORED`, `NOT_STORED`, `EXISTS` or `NOT_FOUND` (meta `ms`: `HD`,
    /// `NS`, `EX` or `NF`).
    Store,
    /// `delete`: `DELETED` or `NOT_FOUND` (meta `md`: `HD` or `NF`).
    Delete,
    /// Any command answered by exactly one line (`incr`, `touch`, `version`, meta without value).
    Line,
}

/// The protocol a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Wire {
    /// memcached's text protocol (meta commands may be sent as [`ReqKind::Line`]).
    #[default]
    Memcached,
    /// memcached's meta protocol: gets are `mg`, stores `ms`, deletes `md` (see
    /// [`Conn`]'s module docs for how replies are matched).
    Meta,
    /// HTTP/1.1 to kvlab's REST interface.
    Http,
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// `END` after a retrieval, `STORED`, `DELETED`, `TOUCHED`, `OK`, a number, `VERSION`, `HD`.
    Ok,
    /// `NOT_FOUND`, `NOT_STORED`, `EXISTS`, meta `EN`/`NF`/`NS`/`EX`; HTTP 404 to a
    /// `DELETE`.
    Negative,
    /// `ERROR`, `CLIENT_ERROR`, `SERVER_ERROR`; HTTP 4xx (but 404) and 5xx.
    Error,
}

/// The outcome of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// How it ended.
    pub status: Status,
    /// For a get: keys found.
    pub hits: u32,
    /// For a get: keys asked for and not found.
    pub misses: u32,
    /// The error was a cluster node's redirect (`MOVED`/`TRYAGAIN`, see
    /// [`kvlab_ring::Redirect`]), under the node's ring of this epoch.
    pub redirect: Option<u64>,
}

/// What [`Conn::on_readable`] reports.
#[derive(Debug)]
pub enum Event<'a, T> {
    /// One value of the head request (a get), borrowed from the input buffer.
    Value {
        /// The request's user data.
        user: &'a T,
        /// The key in the `VALUE` line (empty over HTTP, whose raw response does not carry it).
        key: &'a [u8],
        /// Client flags.
        flags: u32,
        /// The data block.
        data: &'a [u8],
    },
    /// The head request is complete.
    Done {
        /// Its user data.
        user: T,
        /// What it was.
        kind: ReqKind,
        /// How it ended.
        outcome: Outcome,
    },
}

/// A connection failure; the connection must be dropped afterwards.
#[derive(Debug, Error)]
pub enum ConnError {
    /// The socket failed.
    #[error("socket: {0}")]
    Io(#[from] io::Error),
    /// The server sent bytes that are not a reply.
    #[error("protocol: {0}")]
    Protocol(#[from] ReplyError),
    /// The server sent bytes that are not an HTTP response.
    #[error("HTTP: {0}")]
    Http(#[from] HttpError),
    /// A valid reply that does not answer the request in front.
    #[error("unexpected reply {reply} to a {kind:?} request")]
    Unexpected {
        /// The reply (debug form).
        reply: String,
        /// The request it was matched to (`None`: nothing was pending).
        kind: Option<ReqKind>,
    },
    /// The server closed the connection.
    #[error("server closed the connection")]
    Closed,
}

struct Pending<T> {
    kind: ReqKind,
    user: T,
}

/// A non-blocking pipelined connection; `T` is the caller's per-request data.
pub struct Conn<T> {
    stream: TcpStream,
    out: Vec<u8>,
    out_pos: usize,
    inb: Vec<u8>,
    in_start: usize,
    in_end: usize,
    pending: VecDeque<Pending<T>>,
    /// Values seen so far for the head request.
    head_hits: u32,
    /// The head request's error was a cluster redirect under this epoch.
    head_redirect: Option<u64>,
    /// HTTP: responses seen so far for the head request (a multi-get is several GETs).
    head_responses: u32,
    /// HTTP: one of the head request's GETs was answered with an error; meta: one of the head
    /// quiet multi-get's keys was.
    head_failed: bool,
    wire: Wire,
}

impl<T> Conn<T> {
    /// Starts connecting (non-blocking; requests may be queued at once and go out when the
    /// connection is established). Sets `TCP_NODELAY`.
    pub fn connect(addr: SocketAddr) -> io::Result<Self> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        Ok(Self::from_stream(stream))
    }

    /// Wraps an already connected non-blocking stream (memcached protocol).
    pub fn from_stream(stream: TcpStream) -> Self {
        Self::with_wire(stream, Wire::Memcached)
    }

    /// Wraps an already connected non-blocking stream speaking `wire`.
    pub fn with_wire(stream: TcpStream, wire: Wire) -> Self {
        Conn {
            stream,
            out: Vec::with_capacity(16 * 1024),
            out_pos: 0,
            inb: vec![0; IN_BUF],
            in_start: 0,
            in_end: 0,
            pending: VecDeque::with_capacity(64),
            head_hits: 0,
            head_redirect: None,
            head_responses: 0,
            head_failed: false,
            wire,
        }
    }

    /// The protocol this connection speaks.
    pub fn wire(&self) -> Wire {
        self.wire
    }

    /// Registers the socket for read and write readiness (edge-triggered).
    pub fn register(&mut self, registry: &Registry, token: Token) -> io::Result<()> {
        registry.register(
            &mut self.stream,
            token,
            Interest::READABLE | Interest::WRITABLE,
        )
    }

    /// Removes the socket from the poller.
    pub fn deregister(&mut self, registry: &Registry) -> io::Result<()> {
        registry.deregister(&mut self.stream)
    }

    /// Requests sent or queued and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// True when composed bytes wait to be written.
    pub fn has_output(&self) -> bool {
        self.out_pos < self.out.len()
    }

    /// The socket, e.g. to read its peer address or error.
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// Queues one request: `compose` appends its bytes to the output buffer and returns what
    /// the request expects back and its user data; on a compose error nothing is queued.
    pub fn request(
        &mut self,
        compose: impl FnOnce(&mut Vec<u8>) -> Result<(ReqKind, T), ComposeError>,
    ) -> Result<(), ComposeError> {
        let mark = self.out.len();
        match compose(&mut self.out) {
            Ok((kind, user)) => {
                self.pending.push_back(Pending { kind, user });
                Ok(())
            }
            Err(e) => {
                self.out.truncate(mark);
                Err(e)
            }
        }
    }

    /// Writes queued bytes until done or the socket would block. Returns true when all were
    /// written. A connection still being established counts as "would block".
    pub fn flush(&mut self) -> io::Result<bool> {
        while self.out_pos < self.out.len() {
            match self.stream.write(&self.out[self.out_pos..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.out_pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::NotConnected => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.out.clear();
        self.out_pos = 0;
        Ok(true)
    }

    /// Reads everything available and reports values and completed requests to `f`, in
    /// order. Returns the number of completed requests.
    pub fn on_readable(&mut self, mut f: impl FnMut(Event<'_, T>)) -> Result<usize, ConnError> {
        let mut done = 0;
        loop {
            if self.inb.len() - self.in_end < MIN_READ {
                self.make_room();
            }
            let space = self.inb.len() - self.in_end;
            let n = match self.stream.read(&mut self.inb[self.in_end..]) {
                Ok(0) => return Err(ConnError::Closed),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::NotConnected => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            };
            self.in_end += n;
            done += self.parse(&mut f)?;
            // A short read means the socket was drained at that moment; data arriving later
            // raises a new edge, so the extra read that would only say EAGAIN is skipped.
            if n < space {
                break;
            }
        }
        Ok(done)
    }

    /// Moves unparsed bytes to the front; grows the buffer when a frame needs more room.
    fn make_room(&mut self) {
        let unparsed = self.in_end - self.in_start;
        if self.in_start > 0 {
            self.inb.copy_within(self.in_start..self.in_end, 0);
            self.in_start = 0;
            self.in_end = unparsed;
        }
        if self.inb.len() - self.in_end < MIN_READ {
            // Bounded: parse_reply rejects frames above MAX_DATA_LEN before we get here again.
            let new_len = (self.inb.len() * 2).max(self.in_end + MIN_READ);
            self.inb.resize(new_len, 0);
        }
    }

    fn parse(&mut self, f: &mut impl FnMut(Event<'_, T>)) -> Result<usize, ConnError> {
        match self.wire {
            Wire::Http => self.parse_http(f),
            Wire::Meta => self.parse_meta(f),
            Wire::Memcached => self.parse_text(f),
        }
    }

    /// Consumes the `len` bytes of the reply line that ends the oldest request and reports
    /// it with the hits counted since its head; `false` when the caller must stop.
    fn finish_head(
        &mut self,
        kind: ReqKind,
        status: Status,
        len: usize,
        f: &mut impl FnMut(Event<'_, T>),
    ) -> bool {
        self.in_start += len;
        let hits = std::mem::take(&mut self.head_hits);
        let redirect = self.head_redirect.take();
        let misses = match kind {
            ReqKind::Get { keys } if status == Status::Ok => keys.saturating_sub(hits),
            _ => 0,
        };
        self.complete_head(
            kind,
            Outcome {
                status,
                hits,
                misses,
                redirect,
            },
            f,
        )
    }

    /// Pops the request at the head of the queue and reports it `Done` with `outcome`.
    /// False if the queue was empty (callers only call it after `head` proved otherwise).
    fn complete_head(
        &mut self,
        kind: ReqKind,
        outcome: Outcome,
        f: &mut impl FnMut(Event<'_, T>),
    ) -> bool {
        let Some(p) = self.pending.pop_front() else {
            return false;
        };
        f(Event::Done {
            user: p.user,
            kind,
            outcome,
        });
        true
    }

    /// Rewinds the input buffer once everything in it has been parsed.
    fn reset_if_drained(&mut self) {
        if self.in_start == self.in_end {
            self.in_start = 0;
            self.in_end = 0;
        }
    }

    /// Removes and returns the user data of every request still pending (after an error or
    /// timeout, to count them), and discards buffered bytes.
    pub fn drain_pending(&mut self) -> impl Iterator<Item = (ReqKind, T)> + '_ {
        self.out.clear();
        self.out_pos = 0;
        self.in_start = 0;
        self.in_end = 0;
        self.head_hits = 0;
        self.head_responses = 0;
        self.head_failed = false;
        self.pending.drain(..).map(|p| (p.kind, p.user))
    }

    /// The oldest pending request's user data.
    pub fn oldest(&self) -> Option<&T> {
        self.pending.front().map(|p| &p.user)
    }

    /// The socket's pending error (`SO_ERROR`), e.g. a refused connection.
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        self.stream.take_error()
    }
}

fn lossy_head(b: &[u8]) -> String {
    String::from_utf8_lossy(&b[..b.len().min(100)]).into_owned()
}

fn unexpected(reply: &Reply<'_>, kind: Option<ReqKind>) -> ConnError {
    let mut s = format!("{reply:?}");
    s.truncate(100);
    ConnError::Unexpected { reply: s, kind }
}

/// The epoch of a cluster node's redirect (`SERVER_ERROR MOVED|TRYAGAIN <epoch> …`).
fn redirect_epoch(r: &Reply<'_>) -> Option<u64> {
    match r {
        Reply::ServerError(reason) => kvlab_ring::Redirect::parse(reason).map(|r| r.epoch()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http;
    use kvlab_protocol::client as proto;
    use mio::{Events, Poll};
    use std::io::{BufRead, BufReader};
    use std::time::{Duration, Instant};

    /// A one-connection server thread that answers with canned bytes after reading `lines`
    /// request lines, split into small writes to exercise partial reads.
    fn canned_server(lines: usize, reply: &'static [u8]) -> SocketAddr {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut line = String::new();
            for _ in 0..lines {
                line.clear();
                r.read_line(&mut line).unwrap();
                if line.starts_with("set") || line.starts_with("ms ") {
                    line.clear();
                    r.read_line(&mut line).unwrap();
                }
            }
            let mut s = s;
            for chunk in reply.chunks(3) {
                s.write_all(chunk).unwrap();
                s.flush().unwrap();
            }
        });
        addr
    }

    fn run_until<T>(conn: &mut Conn<T>, want: usize, mut f: impl FnMut(Event<'_, T>)) {
        let mut poll = Poll::new().unwrap();
        conn.register(poll.registry(), Token(0)).unwrap();
        let mut events = Events::with_capacity(8);
        let mut done = 0;
        let deadline = Instant::now() + Duration::from_secs(10);
        while done < want {
            assert!(Instant::now() < deadline, "timed out");
            conn.flush().unwrap();
            poll.poll(&mut events, Some(Duration::from_millis(100)))
                .unwrap();
            done += conn.on_readable(&mut f).unwrap();
        }
    }

    #[test]
    fn matches_pipelined_replies_in_order() {
        let addr = canned_server(
            4,
            b"VALUE a 1 3\r\nxyz\r\nVALUE c 0 0\r\n\r\nEND\r\nSTORED\r\nNOT_FOUND\r\nSERVER_ERROR oops\r\n",
        );
        let mut conn: Conn<u32> = Conn::connect(addr).unwrap();
        conn.request(|o| {
            let mut g = proto::MultiGet::begin(o, false);
            g.key(b"a")?;
            g.key(b"b")?;
            g.key(b"c")?;
            g.finish().map(|_| (ReqKind::Get { keys: 3 }, 1))
        })
        .unwrap();
        conn.request(|o| {
            proto::store(o, proto::StoreCmd::Set, b"a", 0, 0, b"v", false)
                .map(|_| (ReqKind::Store, 2))
        })
        .unwrap();
        conn.request(|o| proto::delete(o, b"a", false).map(|_| (ReqKind::Delete, 3)))
            .unwrap();
        conn.request(|o| proto::get(o, b"z").map(|_| (ReqKind::Get { keys: 1 }, 4)))
            .unwrap();
        assert_eq!(conn.in_flight(), 4);
        let mut seen = Vec::new();
        run_until(&mut conn, 4, |e| match e {
            Event::Value {
                user, key, data, ..
            } => seen.push(format!("{user}:{}={}", s(key), s(data))),
            Event::Done { user, outcome, .. } => seen.push(format!(
                "{user}:{:?} h{} m{}",
                outcome.status, outcome.hits, outcome.misses
            )),
        });
        assert_eq!(
            seen,
            [
                "1:a=xyz",
                "1:c=",
                "1:Ok h2 m1",
                "2:Ok h0 m0",
                "3:Negative h0 m0",
                "4:Error h0 m0"
            ]
        );
        assert_eq!(conn.in_flight(), 0);
    }

    #[test]
    fn meta_replies_are_matched_in_order_and_quiet_gets_end_at_mn() {
        use proto::MetaKeyMode::Plain;
        let addr = canned_server(
            12,
            b"VA 3 f1\r\nxyz\r\nVA 0\r\n\r\nMN\r\nHD\r\nNF\r\nEN\r\nVA 2 f7\r\nhi\r\n\
CLIENT_ERROR bad command line format\r\nVA 1 f0\r\nz\r\nMN\r\nNS\r\nMN\r\n",
        );
        let stream = TcpStream::connect(addr).unwrap();
        let mut conn: Conn<u32> = Conn::with_wire(stream, Wire::Meta);
        let quiet_get = |keys: &'static [&'static [u8]], user| {
            move |o: &mut Vec<u8>| {
                for k in keys {
                    proto::meta_get(o, k, Plain, true)?;
                }
                proto::meta_noop(o);
                Ok((
                    ReqKind::Get {
                        keys: keys.len() as u32,
                    },
                    user,
                ))
            }
        };
        // Three quiet gets (hit, miss: no line at all, hit), then MN ends the request.
        conn.request(quiet_get(&[b"a", b"b", b"c"], 1)).unwrap();
        conn.request(|o| proto::meta_set(o, b"a", Plain, 0, 0, b"v").map(|_| (ReqKind::Store, 2)))
            .unwrap();
        conn.request(|o| proto::meta_delete(o, b"z", Plain).map(|_| (ReqKind::Delete, 3)))
            .unwrap();
        for user in [4, 5] {
            conn.request(|o| {
                proto::meta_get(o, b"k", Plain, false).map(|_| (ReqKind::Get { keys: 1 }, user))
            })
            .unwrap();
        }
        // An error for one key of a quiet get fails the request, which still ends at MN.
        conn.request(quiet_get(&[b"bad", b"d"], 6)).unwrap();
        conn.request(|o| proto::meta_set(o, b"a", Plain, 0, 0, b"v").map(|_| (ReqKind::Store, 7)))
            .unwrap();
        conn.request(|o| {
            proto::meta_noop(o);
            Ok((ReqKind::Line, 8))
        })
        .unwrap();
        let mut seen = Vec::new();
        run_until(&mut conn, 8, |e| match e {
            Event::Value {
                user,
                key,
                flags,
                data,
            } => seen.push(format!("{user}:{}={} f{flags}", s(key), s(data))),
            Event::Done { user, outcome, .. } => seen.push(format!(
                "{user}:{:?} h{} m{}",
                outcome.status, outcome.hits, outcome.misses
            )),
        });
        assert_eq!(
            seen,
            [
                "1:=xyz f1",
                "1:= f0",
                "1:Ok h2 m1",
                "2:Ok h0 m0",
                "3:Negative h0 m0",
                "4:Ok h0 m1",
                "5:=hi f7",
                "5:Ok h1 m0",
                "6:=z f0",
                "6:Error h1 m0",
                "7:Negative h0 m0",
                "8:Ok h0 m0",
            ]
        );
        assert_eq!(conn.in_flight(), 0);
    }

    #[test]
    fn a_meta_reply_that_does_not_fit_is_an_error() {
        // `MN` cannot end a single (not quiet) get; a text reply is not a meta reply.
        for reply in [&b"MN\r\n"[..], b"END\r\n"] {
            let reply: &'static [u8] = Box::leak(reply.to_vec().into_boxed_slice());
            let addr = canned_server(1, reply);
            let stream = TcpStream::connect(addr).unwrap();
            let mut conn: Conn<()> = Conn::with_wire(stream, Wire::Meta);
            conn.request(|o| {
                proto::meta_get(o, b"k", proto::MetaKeyMode::Plain, false)
                    .map(|_| (ReqKind::Get { keys: 1 }, ()))
            })
            .unwrap();
            let mut poll = Poll::new().unwrap();
            conn.register(poll.registry(), Token(0)).unwrap();
            let mut events = Events::with_capacity(8);
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                assert!(Instant::now() < deadline);
                conn.flush().unwrap();
                poll.poll(&mut events, Some(Duration::from_millis(100)))
                    .unwrap();
                match conn.on_readable(|_| {}) {
                    Ok(_) => continue,
                    Err(ConnError::Unexpected { kind, .. }) => {
                        assert_eq!(kind, Some(ReqKind::Get { keys: 1 }));
                        break;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }
    }

    #[test]
    fn a_reply_that_does_not_fit_the_request_is_an_error() {
        let addr = canned_server(1, b"STORED\r\n");
        let mut conn: Conn<()> = Conn::connect(addr).unwrap();
        conn.request(|o| proto::get(o, b"k").map(|_| (ReqKind::Get { keys: 1 }, ())))
            .unwrap();
        let mut poll = Poll::new().unwrap();
        conn.register(poll.registry(), Token(0)).unwrap();
        let mut events = Events::with_capacity(8);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            assert!(Instant::now() < deadline);
            conn.flush().unwrap();
            poll.poll(&mut events, Some(Duration::from_millis(100)))
                .unwrap();
            match conn.on_readable(|_| {}) {
                Ok(_) => continue,
                Err(ConnError::Unexpected { kind, .. }) => {
                    assert_eq!(kind, Some(ReqKind::Get { keys: 1 }));
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(conn.drain_pending().count(), 1);
    }

    #[test]
    fn large_values_grow_the_buffer() {
        let mut reply = b"VALUE big 0 200000\r\n".to_vec();
        reply.resize(reply.len() + 200_000, b'x');
        reply.extend_from_slice(b"\r\nEND\r\n");
        let reply: &'static [u8] = Box::leak(reply.into_boxed_slice());
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut b = [0u8; 64];
            let _ = s.read(&mut b).unwrap();
            s.write_all(reply).unwrap();
        });
        let mut conn: Conn<()> = Conn::connect(addr).unwrap();
        conn.request(|o| proto::get(o, b"big").map(|_| (ReqKind::Get { keys: 1 }, ())))
            .unwrap();
        let mut len = 0;
        run_until(&mut conn, 1, |e| {
            if let Event::Value { data, .. } = e {
                len = data.len();
            }
        });
        assert_eq!(len, 200_000);
    }

    /// A one-connection HTTP server thread: reads `n` pipelined requests (heads and bodies),
    /// then answers with canned bytes in 5-byte writes.
    fn canned_http_server(n: usize, reply: &'static [u8]) -> SocketAddr {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            for _ in 0..n {
                let mut len = 0usize;
                loop {
                    let mut line = String::new();
                    r.read_line(&mut line).unwrap();
                    if line == "\r\n" {
                        break;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap();
                    }
                }
                let mut body = vec![0u8; len];
                r.read_exact(&mut body).unwrap();
            }
            let mut s = s;
            for chunk in reply.chunks(5) {
                s.write_all(chunk).unwrap();
                s.flush().unwrap();
            }
        });
        addr
    }

    #[test]
    fn http_replies_are_matched_in_order_across_partial_reads() {
        // A 3-key multi-get (hit, miss with a chunked body, hit), a PUT, a DELETE of a missing
        // key, a GET answered with 500, after an interim 100 Continue.
        let addr = canned_http_server(
            6,
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nxyz\
HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n\
HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n\
HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}\
HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}\
HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 500 Oops\r\ncontent-length: 0\r\n\r\n",
        );
        let stream = TcpStream::connect(addr).unwrap();
        let mut conn: Conn<u32> = Conn::with_wire(stream, Wire::Http);
        conn.request(|o| {
            for k in [&b"a"[..], b"b", b"c"] {
                http::get(o, b"h", k);
            }
            Ok((ReqKind::Get { keys: 3 }, 1))
        })
        .unwrap();
        conn.request(|o| {
            http::put(o, b"h", b"a/b", 0, b"v\r\n");
            Ok((ReqKind::Store, 2))
        })
        .unwrap();
        conn.request(|o| {
            http::delete(o, b"h", b"z");
            Ok((ReqKind::Delete, 3))
        })
        .unwrap();
        conn.request(|o| {
            http::get(o, b"h", b"q");
            Ok((ReqKind::Get { keys: 1 }, 4))
        })
        .unwrap();
        let mut seen = Vec::new();
        run_until(&mut conn, 4, |e| match e {
            Event::Value {
                user, key, data, ..
            } => seen.push(format!("{user}:{}={}", s(key), s(data))),
            Event::Done { user, outcome, .. } => seen.push(format!(
                "{user}:{:?} h{} m{}",
                outcome.status, outcome.hits, outcome.misses
            )),
        });
        assert_eq!(
            seen,
            [
                "1:=xyz",
                "1:=",
                "1:Ok h2 m1",
                "2:Ok h0 m0",
                "3:Negative h0 m0",
                "4:Error h0 m0"
            ]
        );
        assert_eq!(conn.in_flight(), 0);
    }

    #[test]
    fn an_http_response_with_nothing_pending_is_an_error() {
        let addr = canned_http_server(0, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
        let stream = TcpStream::connect(addr).unwrap();
        let mut conn: Conn<()> = Conn::with_wire(stream, Wire::Http);
        let mut poll = Poll::new().unwrap();
        conn.register(poll.registry(), Token(0)).unwrap();
        let mut events = Events::with_capacity(8);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            assert!(Instant::now() < deadline);
            poll.poll(&mut events, Some(Duration::from_millis(100)))
                .unwrap();
            match conn.on_readable(|_| {}) {
                Ok(_) => continue,
                Err(ConnError::Unexpected { kind: None, .. }) => break,
                Err(e) => panic!("{e}"),
            }
        }
    }

    fn s(b: &[u8]) -> String {
        String::from_utf8_lossy(b).into_owned()
    }
}
