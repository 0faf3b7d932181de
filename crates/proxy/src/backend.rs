//! Backends as the proxy sees them: their shared health (failures in a row, ejected or not,
//! requests outstanding), and one worker's connection to one of them — non-blocking, with
//! every request written to it pipelined and its replies expected in order.
//!
//! ```text
//!  worker ──out buffer (requests of a batch, one write)──► backend
//!         ◄──in buffer (replies, framed in order)───────── backend
//!            expect queue: Frame + part + deadline, one per request sent
//! ```

use std::collections::VecDeque;
use std::io::{self, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs as _};
use std::os::fd::AsRawFd as _;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kvlab_protocol::client::{parse_reply, ParsedReply, Reply};

/// The shared state of one backend, seen by every worker and the prober.
#[derive(Debug)]
pub struct Health {
    /// `host:port` as configured.
    pub name: String,
    /// Failures in a row (a success resets it).
    pub failures: AtomicU32,
    /// Out of reads (and writes fail at once) until the prober sees it answer again.
    pub ejected: AtomicBool,
    /// Requests sent and not yet answered, over all workers.
    pub outstanding: AtomicI64,
    /// Times it was ejected.
    pub ejections: AtomicU64,
    /// Times it came back. A worker's connection opened before the latest rejoin is to a
    /// process that may be gone: it is replaced before use.
    pub rejoins: AtomicU64,
}

impl Health {
    /// A healthy backend.
    pub fn new(name: String) -> Health {
        Health {
            name,
            failures: AtomicU32::new(0),
            ejected: AtomicBool::new(false),
            outstanding: AtomicI64::new(0),
            ejections: AtomicU64::new(0),
            rejoins: AtomicU64::new(0),
        }
    }

    /// Whether reads avoid it and writes to it fail at once.
    pub fn is_ejected(&self) -> bool {
        self.ejected.load(Ordering::Relaxed)
    }

    /// Counts a failure; ejects the backend at `limit` in a row. True when this ejected it.
    pub fn failed(&self, limit: u32) -> bool {
        let n = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= limit && !self.ejected.swap(true, Ordering::Relaxed) {
            self.ejections.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(backend = %self.name, failures = n, "backend ejected");
            return true;
        }
        false
    }

    /// Ejects the backend now, whatever its failures in a row: it missed a write.
    pub fn eject(&self) {
        self.failures.store(u32::MAX / 2, Ordering::Relaxed);
        if !self.ejected.swap(true, Ordering::Relaxed) {
            self.ejections.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(backend = %self.name, "backend ejected: it missed a write");
        }
    }

    /// Counts a success (resets the failures in a row).
    pub fn succeeded(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
    }
}

/// How the reply to one forwarded request is framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame {
    /// One line (storage, delete, incr, touch, flush_all, `me`).
    Line,
    /// `VALUE` blocks up to `END` (or one error line).
    Retrieval,
    /// One meta reply (`VA` with its data, `HD`, `EN`, …).
    Meta,
    /// A quiet meta request followed by `mn`: whatever comes before `MN` (maybe nothing).
    MetaQuiet,
}

/// A reply owed by the backend, in the order requests were written.
#[derive(Clone, Copy, Debug)]
pub struct Expect {
    /// How to frame it.
    pub frame: Frame,
    /// The part (of the worker's requests in flight) it answers. A part whose request was
    /// decided without it (a majority write's slowest replica) stays until its reply comes,
    /// which is then read and dropped.
    pub part: Option<u32>,
    /// When it was sent.
    pub sent: Instant,
    /// The backend's ejection count when it was sent: a reply that arrives after the
    /// backend was ejected (a paused backend that resumed before the request's deadline,
    /// but before the prober flushed it) may carry stale data and is not used.
    pub ejections: u64,
    /// It changes data (a write, a flush, a mutating `mg`): if it fails, the backend may have
    /// missed a write the client was told succeeded, so it is ejected at once.
    pub write: bool,
    /// Its request joined the previous one's line (a coalesced `get`, see
    /// [`Conn::push_get`]): one reply answers both.
    pub joined: bool,
}

/// One framed reply: `len` bytes at the front of the input; `body` is the part to keep (all
/// of it, or what came before `MN`); `values` counts `VALUE`/`VA` frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Framed {
    /// Bytes consumed.
    pub len: usize,
    /// Bytes of the reply kept.
    pub body: usize,
    /// Values in it.
    pub values: u32,
    /// The reply is an error line (`ERROR`, `CLIENT_ERROR`, `SERVER_ERROR`).
    pub error: bool,
    /// The reply is `SERVER_ERROR` (worth a retry elsewhere).
    pub server_error: bool,
}

/// Frames the reply at the front of `buf`; `Ok(None)` when incomplete, `Err` when the
/// backend sent something that is not a reply of that kind (the connection is unusable).
pub fn frame(kind: Frame, buf: &[u8]) -> Result<Option<Framed>, String> {
    let mut at = 0;
    let mut values = 0;
    let mut quiet_error = (false, false);
    loop {
        if kind == Frame::Line {
            return Ok(memchr::memchr(b'\n', buf).map(|nl| {
                let line = &buf[..nl];
                let error = line.starts_with(b"ERROR")
                    || line.starts_with(b"CLIENT_ERROR")
                    || line.starts_with(b"SERVER_ERROR");
                Framed {
                    len: nl + 1,
                    body: nl + 1,
                    values: 0,
                    error,
                    server_error: line.starts_with(b"SERVER_ERROR"),
                }
            }));
        }
        let (reply, len) = match parse_reply(&buf[at..]) {
            Ok(ParsedReply::Complete { reply, len }) => (reply, len),
            Ok(ParsedReply::Incomplete) => return Ok(None),
            Err(e) => return Err(format!("bad reply: {e}")),
        };
        let end = at + len;
        let done = |body, values, error, server_error| {
            Ok(Some(Framed {
                len: end,
                body,
                values,
                error,
                server_error,
            }))
        };
        if reply.is_error() {
            let server_error = matches!(reply, Reply::ServerError(_));
            if kind != Frame::MetaQuiet {
                return done(end, values, true, server_error);
            }
            // A quiet request's error still comes before its `MN`.
            quiet_error = (true, quiet_error.1 || server_error);
            at = end;
            continue;
        }
        match (kind, reply) {
            (Frame::Retrieval, Reply::Value { .. }) => values += 1,
            (Frame::Retrieval, Reply::End) => return done(end, values, false, false),
            (Frame::MetaQuiet, Reply::MetaNoop) => {
                return done(at, values, quiet_error.0, quiet_error.1)
            }
            (Frame::MetaQuiet, Reply::MetaValue { .. } | Reply::MetaHeader(_)) => values += 1,
            (Frame::MetaQuiet, _) => {}
            (Frame::Meta, Reply::MetaValue { .. } | Reply::MetaHeader(_)) => {
                return done(end, values + 1, false, false);
            }
            (Frame::Meta, Reply::MetaNoop) => return Err("unexpected MN".into()),
            (Frame::Meta, _) => return done(end, values, false, false),
            (_, other) => return Err(format!("unexpected reply {other:?}")),
        }
        at = end;
    }
}

/// One worker's connection to one backend.
pub struct Conn {
    /// Where it goes (`host:port`).
    pub name: String,
    stream: Option<TcpStream>,
    /// The backend's rejoin count when this connection was opened.
    epoch: u64,
    /// Requests composed and not yet written.
    pub out: Vec<u8>,
    written: usize,
    input: Vec<u8>,
    start: usize,
    end: usize,
    /// Replies owed, in order.
    pub expect: VecDeque<Expect>,
    /// The `get`/`gets` line last composed, while nothing followed it: where it starts and
    /// ends in `out`, its keys, whether it is `gets`.
    open_get: (usize, usize, u32, bool),
}

/// Most keys one coalesced `get` carries.
pub const COALESCE_KEYS: u32 = 24;
/// Longest coalesced `get` line, in bytes (backends read a command line of a few KiB at
/// most before they must see its end).
pub const COALESCE_LINE: usize = 2048;
const NO_GET: (usize, usize, u32, bool) = (0, usize::MAX, 0, false);

const INPUT_INITIAL: usize = 16 * 1024;
const SHRINK_ABOVE: usize = 1024 * 1024;

impl Conn {
    /// Not connected yet: it connects on first use.
    pub fn new(name: String) -> Conn {
        Conn {
            name,
            stream: None,
            epoch: 0,
            out: Vec::with_capacity(INPUT_INITIAL),
            written: 0,
            input: vec![0; INPUT_INITIAL],
            start: 0,
            end: 0,
            expect: VecDeque::new(),
            open_get: NO_GET,
        }
    }

    /// Composes `get KEY` (`gets` with `cas`). When the last request composed and not yet
    /// written is a `get` of the same kind with room, the key joins its line instead (true):
    /// the backend then composes one reply for both and sends it at once, where a pipeline
    /// of one-key `get`s costs memcached a `sendmsg` each. Nothing else changes: a backend
    /// answers `get a b` exactly as `get a` then `get b`, with `END` once. Without `join`
    /// the line stands alone.
    pub fn push_get(&mut self, cas: bool, key: &[u8], join: bool) -> bool {
        let (start, end, keys, open_cas) = self.open_get;
        if join
            && self.written == 0
            && self.out.len() == end
            && open_cas == cas
            && keys < COALESCE_KEYS
            && end - start + key.len() < COALESCE_LINE
        {
            self.out.truncate(end - 2);
            self.out.push(b' ');
            self.out.extend_from_slice(key);
            self.out.extend_from_slice(b"\r\n");
            self.open_get = (start, self.out.len(), keys + 1, cas);
            return true;
        }
        let start = self.out.len();
        self.out
            .extend_from_slice(if cas { b"gets " } else { b"get " });
        self.out.extend_from_slice(key);
        self.out.extend_from_slice(b"\r\n");
        self.open_get = (start, self.out.len(), 1, cas);
        false
    }

    /// Connects if not connected (blocking, bounded by `timeout`), or if the connection
    /// predates the backend's latest rejoin (`epoch`: its rejoin count) and nothing is in
    /// flight on it. True when it made a new connection.
    pub fn ensure_connected(&mut self, timeout: Duration, epoch: u64) -> io::Result<bool> {
        if self.stream.is_some() && (self.epoch == epoch || !self.expect.is_empty()) {
            return Ok(false);
        }
        self.stream = None;
        let stream = connect(&self.name, timeout)?;
        stream.set_nonblocking(true)?;
        self.stream = Some(stream);
        self.epoch = epoch;
        Ok(true)
    }

    /// Whether a socket is open.
    pub fn is_connected(&self) -> bool {
        self.stream.is_some()
    }

    /// The socket's descriptor, for `poll`.
    pub fn fd(&self) -> Option<i32> {
        self.stream.as_ref().map(|s| s.as_raw_fd())
    }

    /// Whether requests are waiting to be written.
    pub fn wants_write(&self) -> bool {
        self.written < self.out.len()
    }

    /// Writes what it can without blocking.
    pub fn flush(&mut self) -> io::Result<()> {
        let Some(stream) = self.stream.as_mut() else {
            return Err(io::ErrorKind::NotConnected.into());
        };
        while self.written < self.out.len() {
            match stream.write(&self.out[self.written..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.out.clear();
        self.written = 0;
        self.open_get = NO_GET;
        if self.out.capacity() > SHRINK_ABOVE {
            self.out.shrink_to(INPUT_INITIAL);
        }
        Ok(())
    }

    /// Reads what has arrived without blocking; `Ok(false)` when the backend closed.
    ///
    /// A read shorter than the room it had is taken as "drained" (as the network front end
    /// does for clients): on Linux any data arriving after it raises a new readiness edge,
    /// so the `read` that would only say `EAGAIN` is saved.
    pub fn fill(&mut self) -> io::Result<bool> {
        let Some(stream) = self.stream.as_mut() else {
            return Err(io::ErrorKind::NotConnected.into());
        };
        loop {
            if self.end == self.input.len() {
                if self.start > 0 {
                    self.input.copy_within(self.start..self.end, 0);
                    self.end -= self.start;
                    self.start = 0;
                } else {
                    let grown = self.input.len() * 2;
                    self.input.resize(grown, 0);
                }
            }
            let room = self.input.len() - self.end;
            match stream.read(&mut self.input[self.end..]) {
                Ok(0) => return Ok(false),
                Ok(n) if n < room => {
                    self.end += n;
                    return Ok(true);
                }
                Ok(n) => self.end += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The bytes received and not yet consumed.
    pub fn input(&self) -> &[u8] {
        &self.input[self.start..self.end]
    }

    /// Drops `n` bytes from the front of the input.
    pub fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            if self.input.len() > SHRINK_ABOVE {
                self.input.truncate(INPUT_INITIAL);
                self.input.shrink_to_fit();
            }
        }
    }

    /// Closes the socket and forgets everything in flight; returns the replies that were owed.
    pub fn reset(&mut self) -> VecDeque<Expect> {
        self.stream = None;
        self.out.clear();
        self.written = 0;
        self.open_get = NO_GET;
        self.start = 0;
        self.end = 0;
        std::mem::take(&mut self.expect)
    }
}

/// Connects to `host:port`, trying each address it resolves to.
pub fn connect(name: &str, timeout: Duration) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
    let addrs: Vec<SocketAddr> = name.to_socket_addrs()?.collect();
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(s) => {
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Asks a backend `line` on a fresh blocking connection and returns the first reply line
/// (the prober's `version` and `flush_all`).
pub fn ask(name: &str, line: &[u8], timeout: Duration) -> io::Result<Vec<u8>> {
    let mut s = connect(name, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.write_all(line)?;
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    let deadline = Instant::now() + timeout;
    while !got.contains(&b'\n') {
        if Instant::now() > deadline {
            return Err(io::ErrorKind::TimedOut.into());
        }
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        got.extend_from_slice(&buf[..n]);
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(kind: Frame, buf: &[u8]) -> Option<(usize, usize, u32, bool)> {
        frame(kind, buf)
            .unwrap()
            .map(|x| (x.len, x.body, x.values, x.error))
    }

    #[test]
    fn one_key_gets_join_the_get_line_before_them() {
        let mut c = Conn::new("x".into());
        assert!(!c.push_get(false, b"a", true));
        assert!(c.push_get(false, b"b", true));
        // A `gets` does not join a `get`, nor anything join what follows another request.
        assert!(!c.push_get(true, b"c", true));
        assert!(c.push_get(true, b"d", true));
        c.out.extend_from_slice(b"delete e\r\n");
        assert!(!c.push_get(true, b"f", true));
        assert_eq!(c.out, b"get a b\r\ngets c d\r\ndelete e\r\ngets f\r\n");
        // A line is full at COALESCE_KEYS keys.
        for k in 1..COALESCE_KEYS {
            assert!(c.push_get(true, format!("k{k}").as_bytes(), true));
        }
        assert!(!c.push_get(true, b"g", true));
        assert!(!c.push_get(true, b"h", false));
    }

    #[test]
    fn replies_are_framed_by_kind() {
        assert_eq!(f(Frame::Line, b"STORED\r\nEND"), Some((8, 8, 0, false)));
        assert_eq!(f(Frame::Line, b"STOR"), None);
        let get = b"VALUE a 0 1\r\nx\r\nVALUE b 0 2\r\nyy\r\nEND\r\nNEXT";
        assert_eq!(f(Frame::Retrieval, get), Some((38, 38, 2, false)));
        assert_eq!(f(Frame::Retrieval, &get[..30]), None);
        assert_eq!(
            f(Frame::Retrieval, b"SERVER_ERROR out of memory\r\n"),
            Some((28, 28, 0, true))
        );
        assert_eq!(
            f(Frame::Meta, b"VA 1 f0\r\nx\r\n"),
            Some((12, 12, 1, false))
        );
        assert_eq!(f(Frame::Meta, b"EN\r\n"), Some((4, 4, 0, false)));
        // A quiet request: what comes before MN, possibly nothing.
        assert_eq!(f(Frame::MetaQuiet, b"MN\r\n"), Some((4, 0, 0, false)));
        assert_eq!(f(Frame::MetaQuiet, b"NS\r\nMN\r\n"), Some((8, 4, 0, false)));
        assert_eq!(f(Frame::MetaQuiet, b"NS\r\n"), None);
        assert_eq!(
            f(Frame::MetaQuiet, b"CLIENT_ERROR bad data chunk\r\nMN\r\n"),
            Some((33, 29, 0, true))
        );
        assert!(frame(Frame::Retrieval, b"STORED\r\n").is_err());
    }
}
