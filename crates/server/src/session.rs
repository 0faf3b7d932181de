//! The sans-IO session: input bytes in, output bytes out, through an [`Engine`].
//!
//! A session does not know which I/O driver runs it. The driver reads into
//! [`Session::read_space`], reports how much arrived with [`Session::filled`], calls
//! [`Session::process`], and writes [`Session::output`]. Pipelined requests are answered in
//! order, and every reply composed from one read leaves in one write.
//!
//! Memory is bounded: the input buffer only grows to the largest valid request (one
//! command line plus an item of `-I` bytes), a refused large value is discarded as it
//! arrives rather than buffered, and processing pauses while the output buffer holds more
//! than [`OUTPUT_HIGH_WATER`] bytes that the client has not read.

use std::time::Instant;

use kvlab_protocol::{parse, Limits, Parsed, ProtocolError};

use crate::engine::{Blocking, Engine, Flow};
use crate::stats::WorkerStats;

/// Initial and idle size of the input buffer.
const INPUT_INITIAL: usize = 16 * 1024;
/// Processing stops while this much output is waiting for the client to read it.
pub const OUTPUT_HIGH_WATER: usize = 4 * 1024 * 1024;
/// Buffers grown past this are given back when the connection goes idle.
const SHRINK_ABOVE: usize = 256 * 1024;

/// One client connection's protocol state.
pub struct Session {
    input: Vec<u8>,
    /// `input[start..end]` holds bytes received and not yet parsed.
    start: usize,
    end: usize,
    output: Vec<u8>,
    /// Bytes of `output` already written.
    written: usize,
    /// Bytes still to discard (the data of a refused value).
    swallow: usize,
    closing: bool,
    limits: Limits,
    /// Where a reply held back for a not-yet-dispatched persist starts.
    hold_at: Option<usize>,
    /// Service times of the current batch (ns), recorded into the worker's histogram.
    samples: Vec<u64>,
    /// Keys read through from disk for the request being executed (so it isn't deferred
    /// for the same key twice).
    loaded: Vec<Vec<u8>>,
    /// Blocking work the current request waits for; processing stops until it completes.
    waiting: Option<Waiting>,
}

/// What a session waits for while its blocking work runs.
enum Waiting {
    /// Not yet handed to the driver.
    Ready(Blocking),
    /// Handed out; `hold` is where the reply held back until completion starts (if any).
    Running { hold: Option<usize> },
}

impl Session {
    pub fn new(limits: Limits) -> Self {
        Session {
            input: vec![0; INPUT_INITIAL],
            start: 0,
            end: 0,
            output: Vec::with_capacity(INPUT_INITIAL),
            written: 0,
            swallow: 0,
            closing: false,
            limits,
            hold_at: None,
            samples: Vec::with_capacity(64),
            loaded: Vec::new(),
            waiting: None,
        }
    }

    /// The largest buffer a valid request can need.
    fn input_max(&self) -> usize {
        self.limits.item_size_max + self.limits.max_get_line.max(self.limits.max_line) + 2
    }

    /// Whether the driver should read more input now. False while output is backed up or the
    /// session is closing: the client must read its replies first.
    pub fn wants_read(&self) -> bool {
        !self.closing && self.pending_output() < OUTPUT_HIGH_WATER
    }

    /// Free space to read into, made by compacting and, if a request needs it, growing.
    pub fn read_space(&mut self) -> &mut [u8] {
        if self.end == self.input.len() {
            if self.start > 0 {
                self.input.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            } else if self.input.len() < self.input_max() {
                let grown = (self.input.len() * 2).min(self.input_max());
                self.input.resize(grown, 0);
            }
        }
        &mut self.input[self.end..]
    }

    /// Records that `n` bytes were read into [`Session::read_space`].
    pub fn filled(&mut self, n: usize) {
        self.end += n;
        if self.swallow > 0 {
            let drop = self.swallow.min(self.end - self.start);
            self.swallow -= drop;
            self.start += drop;
        }
    }

    /// Parses and applies every complete request buffered, composing replies.
    pub fn process(&mut self, engine: &mut Engine) {
        let mut clock = Instant::now();
        while !self.closing
            && self.waiting.is_none()
            && self.start < self.end
            && self.pending_output() < OUTPUT_HIGH_WATER
        {
            let parsed = parse(&self.input[self.start..self.end], &self.limits);
            match parsed {
                Parsed::Request { request, consumed } => {
                    let hold = self.output.len();
                    match engine.execute(&request, &mut self.output, &self.loaded) {
                        Flow::Continue => {}
                        Flow::Close => self.closing = true,
                        Flow::Defer(blocking) => {
                            // A read-through re-runs the request once the key is loaded, so
                            // it stays unconsumed; a persist holds back the composed reply.
                            let rerun = blocking.reruns_request();
                            self.waiting = Some(Waiting::Ready(blocking));
                            if rerun {
                                break;
                            }
                            self.waiting_hold(hold);
                        }
                    }
                    self.start += consumed;
                    if self.waiting.is_none() {
                        self.loaded.clear();
                    }
                }
                Parsed::Incomplete => break,
                Parsed::Error {
                    error,
                    consumed,
                    swallow,
                    noreply,
                } => {
                    WorkerStats::add(&engine.worker.protocol_errors, 1);
                    if error == ProtocolError::TooLarge {
                        engine.store.count_too_large();
                    }
                    tracing::debug!(%error, "bad request");
                    if !noreply {
                        self.output.extend_from_slice(error.reply());
                    }
                    self.start += consumed;
                    let buffered = (self.end - self.start).min(swallow);
                    self.start += buffered;
                    self.swallow = swallow - buffered;
                    if error.closes() {
                        self.closing = true;
                    }
                }
            }
            let now = Instant::now();
            self.samples
                .push(now.duration_since(clock).as_nanos() as u64);
            clock = now;
        }
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        engine.worker.record_service(&self.samples);
        self.samples.clear();
    }

    fn waiting_hold(&mut self, hold: usize) {
        if let Some(Waiting::Ready(_)) = &self.waiting {
            self.hold_at = Some(hold);
        }
    }

    /// Takes the blocking work the session waits for, for the driver to run (on a helper
    /// thread, or inline). The session stays stopped until [`Session::complete`].
    pub fn take_blocking(&mut self) -> Option<Blocking> {
        match self.waiting.take() {
            Some(Waiting::Ready(b)) => {
                self.waiting = Some(Waiting::Running {
                    hold: self.hold_at.take(),
                });
                Some(b)
            }
            other => {
                self.waiting = other;
                None
            }
        }
    }

    /// Whether the session waits for blocking work to complete.
    pub fn is_waiting(&self) -> bool {
        self.waiting.is_some()
    }

    /// Reports the outcome of the work from [`Session::take_blocking`]: a loaded key lets the
    /// request run again; a persisted write releases its reply, or replaces it with a
    /// `SERVER_ERROR` if the disk failed.
    pub fn complete(&mut self, done: &Blocking, result: std::io::Result<()>) {
        let hold = match self.waiting.take() {
            Some(Waiting::Running { hold }) => hold,
            other => {
                self.waiting = other;
                return;
            }
        };
        if let Err(e) = result {
            tracing::warn!(%e, "disk operation failed");
            if let Some(at) = hold {
                self.output.truncate(at.max(self.written));
            }
            self.output.extend_from_slice(b"SERVER_ERROR ");
            self.output
                .extend_from_slice(e.to_string().replace(['\r', '\n'], " ").as_bytes());
            self.output.extend_from_slice(b"\r\n");
            if done.reruns_request() {
                // The request can't run without its data: drop it with the error.
                if let Parsed::Request { consumed, .. } =
                    parse(&self.input[self.start..self.end], &self.limits)
                {
                    self.start += consumed;
                }
            }
            self.loaded.clear();
            return;
        }
        if let Blocking::Load(key) = done {
            self.loaded.push(key.clone());
        } else {
            self.loaded.clear();
        }
    }

    /// Replies composed and not yet written (up to a reply held back for a pending persist).
    pub fn output(&self) -> &[u8] {
        let end = match &self.waiting {
            Some(Waiting::Running { hold: Some(at) }) => *at,
            _ => self.hold_at.unwrap_or(self.output.len()),
        };
        let end = end.min(self.output.len());
        &self.output[self.written.min(end)..end]
    }

    fn pending_output(&self) -> usize {
        self.output.len() - self.written
    }

    /// Records that `n` bytes of [`Session::output`] were written.
    pub fn wrote(&mut self, n: usize) {
        self.written += n;
        if self.written == self.output.len() {
            // A held-back reply (pending persist) is empty here: its start becomes 0.
            self.hold_at = self.hold_at.map(|_| 0);
            if let Some(Waiting::Running { hold: Some(at) }) = &mut self.waiting {
                *at = 0;
            }
            self.output.clear();
            self.written = 0;
            if self.output.capacity() > SHRINK_ABOVE {
                self.output.shrink_to(INPUT_INITIAL);
            }
            if self.start == self.end && self.input.len() > SHRINK_ABOVE {
                self.input.truncate(INPUT_INITIAL);
                self.input.shrink_to_fit();
            }
        }
    }

    /// Whether the connection should close once its output is written.
    pub fn is_closing(&self) -> bool {
        self.closing
    }

    /// Bytes held by the input buffer (its allocation), for bounds checks.
    pub fn input_capacity(&self) -> usize {
        self.input.capacity()
    }

    /// Marks the session closing (e.g. server shutdown).
    pub fn close(&mut self) {
        self.closing = true;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use kvlab_store::{Config, ManualClock, Store};

    use super::*;
    use crate::stats::{ServerStats, WorkerStats};

    fn engine() -> Engine {
        let store = Arc::new(Store::new(
            Config::default(),
            Arc::new(ManualClock::new(1_800_000_000)),
        ));
        let worker = Arc::new(WorkerStats::default());
        let server = Arc::new(ServerStats::for_tests(vec![worker.clone()]));
        Engine::new(store, server, worker)
    }

    /// Feeds `bytes` the way a driver would, in reads of at most `chunk` bytes.
    fn feed(s: &mut Session, e: &mut Engine, bytes: &[u8], chunk: usize, max_cap: &mut usize) {
        let mut at = 0;
        while at < bytes.len() && s.wants_read() {
            let space = s.read_space();
            let n = space.len().min(chunk).min(bytes.len() - at);
            space[..n].copy_from_slice(&bytes[at..at + n]);
            s.filled(n);
            at += n;
            s.process(e);
            *max_cap = (*max_cap).max(s.input_capacity());
        }
    }

    fn take_output(s: &mut Session) -> Vec<u8> {
        let out = s.output().to_vec();
        s.wrote(out.len());
        out
    }

    #[test]
    fn garbage_without_newline_closes_and_stays_small() {
        let (mut s, mut e) = (Session::new(Limits::default()), engine());
        let mut cap = 0;
        feed(&mut s, &mut e, &vec![b'z'; 10 << 20], 4096, &mut cap);
        assert!(s.is_closing());
        assert_eq!(take_output(&mut s), b"CLIENT_ERROR line too long\r\n");
        assert!(cap <= INPUT_INITIAL, "input grew to {cap}");
    }

    #[test]
    fn refused_value_is_swallowed_without_buffering() {
        let (mut s, mut e) = (Session::new(Limits::default()), engine());
        let mut cap = 0;
        let mut req = b"set k 0 0 5000000\r\n".to_vec();
        req.extend(std::iter::repeat_n(b'x', 5_000_000));
        req.extend_from_slice(b"\r\nget k\r\n");
        feed(&mut s, &mut e, &req, 16 * 1024, &mut cap);
        assert_eq!(
            take_output(&mut s),
            b"SERVER_ERROR object too large for cache\r\nEND\r\n"
        );
        assert!(cap <= INPUT_INITIAL, "input grew to {cap}");
    }

    #[test]
    fn unfinished_value_is_bounded_by_the_item_limit() {
        let limits = Limits::default();
        let (mut s, mut e) = (Session::new(limits), engine());
        let mut cap = 0;
        let mut req = b"set k 0 0 1000000\r\n".to_vec();
        req.extend(std::iter::repeat_n(b'x', 999_999));
        feed(&mut s, &mut e, &req, 64 * 1024, &mut cap);
        assert!(!s.is_closing());
        assert!(s.output().is_empty());
        assert!(cap <= s.input_max(), "input grew to {cap}");
        feed(&mut s, &mut e, b"x\r\n", 64, &mut cap);
        assert_eq!(take_output(&mut s), b"STORED\r\n");
    }

    #[test]
    fn a_reader_that_does_not_read_pauses_processing() {
        let (mut s, mut e) = (Session::new(Limits::default()), engine());
        let mut cap = 0;
        let mut set = b"set big 0 0 500000\r\n".to_vec();
        set.extend(std::iter::repeat_n(b'v', 500_000));
        set.extend_from_slice(b"\r\n");
        feed(&mut s, &mut e, &set, 1 << 20, &mut cap);
        assert_eq!(take_output(&mut s), b"STORED\r\n");
        let gets = b"get big\r\n".repeat(1000);
        feed(&mut s, &mut e, &gets, 1 << 20, &mut cap);
        assert!(!s.wants_read());
        let pending = s.output().len();
        assert!(
            (OUTPUT_HIGH_WATER..OUTPUT_HIGH_WATER + 600_000).contains(&pending),
            "{pending}"
        );
        // Once the client reads, processing resumes where it stopped.
        take_output(&mut s);
        assert!(s.wants_read());
        s.process(&mut e);
        assert!(!s.output().is_empty());
    }

    #[test]
    fn pipelined_replies_keep_request_order() {
        let (mut s, mut e) = (Session::new(Limits::default()), engine());
        let mut cap = 0;
        let req = b"set a 0 0 1\r\n1\r\nget a\r\ndelete a\r\nget a\r\nbogus\r\nversion\r\n";
        // Byte by byte: every split point of a pipeline gives the same replies.
        feed(&mut s, &mut e, req, 1, &mut cap);
        let out = take_output(&mut s);
        let want = format!(
            "STORED\r\nVALUE a 0 1\r\n1\r\nEND\r\nDELETED\r\nEND\r\nERROR\r\nVERSION {}\r\n",
            crate::stats::VERSION
        );
        assert_eq!(String::from_utf8_lossy(&out), want);
    }
}
