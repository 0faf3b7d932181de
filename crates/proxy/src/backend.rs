//! Backends as the proxy sees them: their shared health (failures in a row, ejected or not,
//! requests outstanding, the keys whose writes it missed), and one worker's connection to one
//! of them — non-blocking, with every request written to it pipelined and its replies
//! expected in order.
//!
//! ```text
//!  worker ──out buffer (requests of a batch, one write)──► backend
//!         ◄──in buffer (replies, framed in order)───────── backend
//!            expect queue: Frame + part + deadline, one per request sent
//! ```

use std::collections::{HashSet, VecDeque};
use std::io::{self, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs as _};
use std::os::fd::AsRawFd as _;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kvlab_protocol::client::{parse_reply, ParsedReply, Reply};
use parking_lot::Mutex;

/// Most keys recorded as missed for one backend; past it the backend is flushed when it
/// comes back instead of repaired key by key.
pub const MISSED_KEYS_MAX: usize = 100_000;

/// What a backend of a replicated pool missed while it was out: the keys whose writes did
/// not reach it, and whether it must be flushed first (it missed a `flush_all`, or more keys
/// than [`MISSED_KEYS_MAX`]). Touched only when a write fails and by the prober, never on a
/// request that succeeds.
#[derive(Debug, Default)]
pub struct Missed {
    /// Keys to copy from a peer replica (or delete) before the backend serves again.
    pub keys: HashSet<Vec<u8>>,
    /// Flush it before repairing `keys`.
    pub flush: bool,
}

/// A write a backend missed, as recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change<'a> {
    /// A write of one key.
    Key(&'a [u8]),
    /// A `flush_all`: every key it holds is stale.
    Everything,
    /// A setting (`slabs automove`): no data changed.
    Nothing,
}

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
    /// Times it answered the prober again but stayed out (a key it missed could not be
    /// repaired yet).
    pub rejoin_waits: AtomicU64,
    /// In a replicated pool: what it missed while out. Its lock also orders ejection against
    /// rejoin: a key is recorded and the backend ejected under it, and the prober puts the
    /// backend back under it only when nothing is left to repair, so a backend with a
    /// repair pending never serves.
    pub missed: Mutex<Missed>,
    /// Keys copied from a peer replica (or deleted) when it came back.
    pub repaired: AtomicU64,
    /// Times it was flushed when it came back.
    pub flushes: AtomicU64,
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
            rejoin_waits: AtomicU64::new(0),
            missed: Mutex::new(Missed::default()),
            repaired: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
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

    /// In a replicated pool: it missed `change`; records it for repair and ejects it, under
    /// one lock (see [`Health::missed`]).
    pub fn missed_write(&self, change: Change<'_>) {
        let mut missed = self.missed.lock();
        match change {
            Change::Key(key) if missed.keys.len() < MISSED_KEYS_MAX => {
                if !missed.keys.contains(key) {
                    missed.keys.insert(key.to_vec());
                }
            }
            Change::Key(_) => {
                // Past the bound: it will be flushed, so the keys recorded so far need no
                // repair; those recorded from now on are repaired after the flush.
                tracing::warn!(
                    backend = %self.name,
                    keys = MISSED_KEYS_MAX,
                    "backend missed too many writes to repair key by key: it will be flushed"
                );
                missed.keys.clear();
                missed.flush = true;
            }
            Change::Everything => missed.flush = true,
            Change::Nothing => {}
        }
        self.eject();
    }

    /// Puts it back in service (the prober saw it answer) if nothing it missed is left to
    /// repair; true when it did.
    pub fn rejoin(&self) -> bool {
        let missed = self.missed.lock();
        if !missed.keys.is_empty() || missed.flush {
            return false;
        }
        self.failures.store(0, Ordering::Relaxed);
        self.ejected.store(false, Ordering::Relaxed);
        self.rejoins.fetch_add(1, Ordering::Relaxed);
        true
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

/// Where one `VALUE` block of a framed retrieval reply lies in it: the block (header line,
/// data and its `\r\n`) is `start..end`, its key `key_at..key_end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValueAt {
    /// The block's first byte.
    pub start: usize,
    /// Past the block's last byte.
    pub end: usize,
    /// The key's first byte.
    pub key_at: usize,
    /// Past the key's last byte.
    pub key_end: usize,
}

/// Frames the reply at the front of `buf`; `Ok(None)` when incomplete, `Err` when the
/// backend sent something that is not a reply of that kind (the connection is unusable).
pub fn frame(kind: Frame, buf: &[u8]) -> Result<Option<Framed>, String> {
    frame_at(kind, buf, None)
}

/// As [`frame`], and notes in `values` (cleared first) where each `VALUE` block of a
/// retrieval reply lies, so that the reply need not be parsed again to be split by key.
pub fn frame_values(
    kind: Frame,
    buf: &[u8],
    values: &mut Vec<ValueAt>,
) -> Result<Option<Framed>, String> {
    values.clear();
    frame_at(kind, buf, Some(values))
}

fn frame_at(
    kind: Frame,
    buf: &[u8],
    mut blocks: Option<&mut Vec<ValueAt>>,
) -> Result<Option<Framed>, String> {
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
            (Frame::Retrieval, Reply::Value { key, .. }) => {
                values += 1;
                if let Some(blocks) = blocks.as_deref_mut() {
                    // The key is a slice of `buf` (the parser borrows it).
                    let key_at = key.as_ptr() as usize - buf.as_ptr() as usize;
                    blocks.push(ValueAt {
                        start: at,
                        end,
                        key_at,
                        key_end: key_at + key.len(),
                    });
                }
            }
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

/// Splits a coalesced `get k1 k2 …`'s reply (`reply`, its `VALUE` blocks at `values` as
/// framed) by the keys it asked for, in order (`None`: a key nobody waits for, passed
/// over): `ranges` gets each key's block in `reply`, or an empty range for a miss. A
/// backend answers the hits in the order asked, so each key's block is the next one when
/// it names that key.
pub fn split_by_key<'k>(
    reply: &[u8],
    values: &[ValueAt],
    keys: impl Iterator<Item = Option<&'k [u8]>>,
    ranges: &mut Vec<(usize, usize)>,
) {
    ranges.clear();
    let mut next = 0;
    for key in keys {
        let range = match (key, values.get(next)) {
            (Some(key), Some(v)) if reply.get(v.key_at..v.key_end) == Some(key) => {
                next += 1;
                (v.start, v.end)
            }
            _ => (0, 0),
        };
        ranges.push(range);
    }
}

/// One worker's connection to one backend.
///
/// A batch's one-key `get`s to the backend travel as one coalesced line, written after the
/// batch's other requests: memcached sends its replies (a `sendmsg`) after each retrieval
/// command, so a batch `set; get a b; set` costs it two sends where `set; set; get a b`
/// costs one. Requests of different client connections may pass each other (they were in
/// flight together, so any order is one a client could have seen); a client connection's
/// own requests never do: a request of a client with a key in the open line closes the line
/// first, and goes after it.
pub struct Conn {
    /// Where it goes (`host:port`).
    pub name: String,
    stream: Option<TcpStream>,
    /// The backend's rejoin count when this connection was opened.
    epoch: u64,
    /// Requests composed and not yet written (the open `get` line goes after them).
    out: Vec<u8>,
    written: usize,
    input: Vec<u8>,
    start: usize,
    end: usize,
    /// Replies owed, in order (those of the open `get` line follow, in `line_expect`).
    pub expect: VecDeque<Expect>,
    /// The open coalesced `get`/`gets` line (`line_cas`: `gets`), its keys, the client
    /// connections with a key in it and the replies owed for them.
    line: Vec<u8>,
    line_keys: u32,
    line_cas: bool,
    line_clients: Vec<u32>,
    line_expect: Vec<Expect>,
}

/// Most keys one coalesced `get` carries.
pub const COALESCE_KEYS: u32 = 24;
/// Longest coalesced `get` line, in bytes (backends read a command line of a few KiB at
/// most before they must see its end).
pub const COALESCE_LINE: usize = 2048;

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
            line: Vec::new(),
            line_keys: 0,
            line_cas: false,
            line_clients: Vec::new(),
            line_expect: Vec::new(),
        }
    }

    /// Where a request of client connection `client` (other than a one-key `get` that may
    /// join the open line) is composed; its reply is owed after those already owed
    /// ([`Conn::owe`]). When the client has a key in the open `get` line, the line is
    /// closed first, so the request goes after it.
    pub fn out_for(&mut self, client: u32) -> &mut Vec<u8> {
        if self.line_clients.contains(&client) {
            self.close_line();
        }
        &mut self.out
    }

    /// Owes the reply to the request just composed with [`Conn::out_for`].
    pub fn owe(&mut self, expect: Expect) {
        self.expect.push_back(expect);
    }

    /// Composes `get KEY` (`gets` with `cas`) for client connection `client`, owing
    /// `expect` for it. With `join`, the key joins the open line when it is of the same kind
    /// and has room (true: one reply answers the whole line; a backend answers `get a b`
    /// exactly as `get a` then `get b`, with `END` once), or opens a new line (the open one
    /// is closed). Without `join` the request stands alone, in order with the others.
    pub fn push_get(
        &mut self,
        cas: bool,
        key: &[u8],
        client: u32,
        join: bool,
        expect: Expect,
    ) -> bool {
        let verb: &[u8] = if cas { b"gets " } else { b"get " };
        if !join {
            let out = self.out_for(client);
            out.extend_from_slice(verb);
            out.extend_from_slice(key);
            out.extend_from_slice(b"\r\n");
            self.owe(Expect {
                joined: false,
                ..expect
            });
            return false;
        }
        let joined = !self.line.is_empty()
            && self.line_cas == cas
            && self.line_keys < COALESCE_KEYS
            && self.line.len() + key.len() < COALESCE_LINE;
        if joined {
            self.line.truncate(self.line.len() - 2);
            self.line.push(b' ');
        } else {
            self.close_line();
            self.line.extend_from_slice(verb);
            self.line_cas = cas;
        }
        self.line.extend_from_slice(key);
        self.line.extend_from_slice(b"\r\n");
        self.line_keys += 1;
        if !self.line_clients.contains(&client) {
            self.line_clients.push(client);
        }
        self.line_expect.push(Expect { joined, ..expect });
        joined
    }

    /// Puts the open `get` line after the requests composed, its replies after theirs.
    fn close_line(&mut self) {
        if self.line.is_empty() {
            return;
        }
        self.out.extend_from_slice(&self.line);
        self.expect.extend(self.line_expect.drain(..));
        self.line.clear();
        self.line_keys = 0;
        self.line_clients.clear();
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
        self.written < self.out.len() || !self.line.is_empty()
    }

    /// Writes what it can without blocking.
    pub fn flush(&mut self) -> io::Result<()> {
        self.close_line();
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
        self.close_line();
        self.stream = None;
        self.out.clear();
        self.written = 0;
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

    fn owed(part: u32) -> Expect {
        Expect {
            frame: Frame::Retrieval,
            part: Some(part),
            sent: Instant::now(),
            ejections: 0,
            write: false,
            joined: false,
        }
    }

    /// The bytes to write and the parts owed, in order, as `flush` would write them.
    fn batch(c: &mut Conn) -> (String, Vec<(u32, bool)>) {
        c.close_line();
        let bytes = String::from_utf8(c.out.clone()).unwrap();
        let owed = c
            .expect
            .iter()
            .map(|e| (e.part.unwrap(), e.joined))
            .collect();
        (bytes, owed)
    }

    #[test]
    fn one_key_gets_join_one_line_after_the_other_clients_requests() {
        let mut c = Conn::new("x".into());
        assert!(!c.push_get(false, b"a", 1, true, owed(0)));
        assert!(c.push_get(false, b"b", 2, true, owed(1)));
        // Another client's write goes ahead of the open line; the line stays open.
        c.out_for(3).extend_from_slice(b"set s 0 0 1\r\nx\r\n");
        c.owe(owed(2));
        assert!(c.push_get(false, b"c", 4, true, owed(3)));
        // A `gets` does not join a `get` line: it opens its own.
        assert!(!c.push_get(true, b"d", 5, true, owed(4)));
        assert_eq!(
            batch(&mut c),
            (
                "set s 0 0 1\r\nx\r\nget a b c\r\ngets d\r\n".into(),
                vec![(2, false), (0, false), (1, true), (3, true), (4, false)]
            )
        );
    }

    #[test]
    fn a_clients_request_never_passes_its_own_get_in_the_line() {
        let mut c = Conn::new("x".into());
        c.push_get(false, b"a", 1, true, owed(0));
        c.push_get(false, b"b", 2, true, owed(1));
        // Client 2 deletes the key it just asked for: the line goes first, then the delete.
        c.out_for(2).extend_from_slice(b"delete b\r\n");
        c.owe(owed(2));
        assert!(!c.push_get(false, b"c", 1, true, owed(3)));
        assert_eq!(
            batch(&mut c),
            (
                "get a b\r\ndelete b\r\nget c\r\n".into(),
                vec![(0, false), (1, true), (2, false), (3, false)]
            )
        );
        // Without `join` (in front of a kvlab cluster) each `get` stands alone, in order.
        let mut c = Conn::new("x".into());
        assert!(!c.push_get(false, b"a", 1, false, owed(0)));
        assert!(!c.push_get(false, b"b", 2, false, owed(1)));
        assert_eq!(
            batch(&mut c),
            ("get a\r\nget b\r\n".into(), vec![(0, false), (1, false)])
        );
    }

    #[test]
    fn a_line_is_full_at_its_key_or_byte_limit() {
        let mut c = Conn::new("x".into());
        for k in 0..COALESCE_KEYS {
            assert_eq!(
                c.push_get(false, format!("k{k}").as_bytes(), k, true, owed(k)),
                k > 0
            );
        }
        assert!(!c.push_get(false, b"next", 99, true, owed(99)));
        let long = vec![b'x'; 250];
        let mut c = Conn::new("x".into());
        let mut lines = 0;
        for k in 0..20 {
            lines += u32::from(!c.push_get(false, &long, k, true, owed(k)));
        }
        let (bytes, _) = batch(&mut c);
        assert_eq!(lines, 3);
        assert!(bytes.split("\r\n").all(|l| l.len() < COALESCE_LINE));
        // A reset owes back everything, the open line's replies too.
        let mut c = Conn::new("x".into());
        c.out_for(1).extend_from_slice(b"delete a\r\n");
        c.owe(owed(0));
        c.push_get(false, b"b", 2, true, owed(1));
        assert_eq!(c.reset().len(), 2);
        assert!(!c.wants_write());
    }

    #[test]
    fn a_missed_write_ejects_and_holds_the_backend_out_until_repaired() {
        let h = Health::new("x".into());
        h.missed_write(Change::Key(b"a"));
        h.missed_write(Change::Key(b"a"));
        h.missed_write(Change::Nothing);
        assert!(h.is_ejected());
        assert_eq!(h.missed.lock().keys.len(), 1);
        // Not back while a key waits for its repair.
        assert!(!h.rejoin());
        assert!(h.is_ejected());
        h.missed.lock().keys.clear();
        assert!(h.rejoin());
        assert!(!h.is_ejected());
        assert_eq!(h.rejoins.load(Ordering::Relaxed), 1);
        // A missed flush_all: flushed first, the keys recorded kept (repaired after it).
        h.missed_write(Change::Key(b"b"));
        h.missed_write(Change::Everything);
        assert!(h.is_ejected());
        let m = h.missed.lock();
        assert!(m.flush);
        assert_eq!(m.keys.len(), 1);
    }

    #[test]
    fn past_the_bound_the_backend_is_flushed_instead() {
        let h = Health::new("x".into());
        for k in 0..MISSED_KEYS_MAX {
            h.missed_write(Change::Key(format!("k{k}").as_bytes()));
        }
        assert!(!h.missed.lock().flush);
        h.missed_write(Change::Key(b"one more"));
        let m = h.missed.lock();
        assert!(m.flush);
        assert!(m.keys.is_empty());
    }

    /// How a coalesced reply was split before its values were noted while framing: each
    /// key's block found by parsing the reply again from the last block handed out.
    fn split_by_parsing_again(reply: &[u8], keys: &[Option<&[u8]>]) -> Vec<(usize, usize)> {
        let mut at = 0;
        let mut ranges = Vec::new();
        for key in keys {
            let mut range = (0, 0);
            if let (Some(key), Ok(ParsedReply::Complete { reply: r, len })) =
                (key, parse_reply(&reply[at..]))
            {
                if matches!(r, Reply::Value { key: got, .. } if got == *key) {
                    range = (at, at + len);
                    at += len;
                }
            }
            ranges.push(range);
        }
        ranges
    }

    #[test]
    fn a_coalesced_reply_splits_by_key_as_parsing_it_again_did() {
        // A reply, and the keys its line asked for.
        type Case<'a> = (&'a [u8], &'a [Option<&'a [u8]>]);
        let cases: &[Case] = &[
            // Hits and misses, in the order asked.
            (
                b"VALUE a 0 1\r\nx\r\nVALUE c 5 2\r\nyy\r\nEND\r\n",
                &[Some(b"a"), Some(b"b"), Some(b"c"), Some(b"d")],
            ),
            // Every key a miss.
            (b"END\r\n", &[Some(b"a"), Some(b"b")]),
            // Values whose data look like reply lines.
            (
                b"VALUE a 0 20\r\n\r\nVALUE b 0 1\r\nEND\r\n\r\nVALUE b 0 9\r\n\r\nEND\r\nxx\r\nEND\r\n",
                &[Some(b"a"), Some(b"b")],
            ),
            // The same key twice: each asks gets one block.
            (
                b"VALUE k 0 1\r\n1\r\nVALUE k 0 1\r\n1\r\nEND\r\n",
                &[Some(b"k"), Some(b"k"), Some(b"k")],
            ),
            // `gets`: with CAS values; a key nobody waits for any more.
            (
                b"VALUE a 0 1 17\r\nx\r\nVALUE b 0 1 18\r\ny\r\nEND\r\n",
                &[Some(b"a"), None, Some(b"b")],
            ),
            // A key that is a prefix of the next one's.
            (
                b"VALUE ab 0 1\r\nx\r\nEND\r\n",
                &[Some(b"a"), Some(b"ab")],
            ),
        ];
        let mut values = Vec::new();
        let mut ranges = Vec::new();
        for &(reply, keys) in cases {
            let f = frame_values(Frame::Retrieval, reply, &mut values)
                .unwrap()
                .unwrap();
            assert_eq!(f.len, reply.len());
            assert_eq!(values.len(), f.values as usize);
            split_by_key(reply, &values, keys.iter().copied(), &mut ranges);
            assert_eq!(ranges, split_by_parsing_again(reply, keys), "{reply:?}");
        }
        // The blocks as noted: the data's look-alike lines are inside the first block.
        let reply = cases[2].0;
        frame_values(Frame::Retrieval, reply, &mut values).unwrap();
        assert_eq!(values.len(), 2);
        assert_eq!(&reply[values[0].key_at..values[0].key_end], b"a");
        assert_eq!(&reply[values[1].start..values[1].key_end], b"VALUE b");
        assert_eq!(&reply[values[1].end..], b"END\r\n");
        // An error line frames with no values (every key gets the line).
        let f = frame_values(
            Frame::Retrieval,
            b"SERVER_ERROR out of memory\r\n",
            &mut values,
        )
        .unwrap()
        .unwrap();
        assert!(f.error && values.is_empty());
        // Other kinds note nothing.
        frame_values(Frame::Meta, b"VA 1 f0\r\nx\r\n", &mut values).unwrap();
        assert!(values.is_empty());
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
