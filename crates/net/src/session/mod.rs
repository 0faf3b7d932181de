//! The sans-IO session: input bytes in, output bytes out, through a [`Service`].
//!
//! A session does not know which I/O driver runs it. The driver reads into
//! [`Session::read_space`], reports how much arrived with [`Session::filled`], calls
//! [`Session::process`], and writes [`Session::output`]. Pipelined requests are answered in
//! order, and every reply composed from one read leaves in one write.
//!
//! A reply may complete later ([`Flow::Defer`]). The output buffer is then an ordered queue
//! of reply slots: ready replies are plain bytes, and each pending slot is a marker (where
//! its held-back reply starts, how long it is) in a small queue beside it. Output is released
//! up to the first pending slot, so replies leave in request order however their work
//! completes. The driver takes the work with [`Session::take_work`], runs it (inline or on a
//! helper thread) and hands the outcome back with [`Session::complete`]. A ready reply costs
//! no slot entry and no allocation.
//!
//! Memory is bounded: the input buffer only grows to the largest valid request (one
//! command line plus an item of `-I` bytes), a refused large value is discarded as it
//! arrives rather than buffered, processing pauses while the output buffer holds more
//! than [`OUTPUT_HIGH_WATER`] bytes that the client has not read, and at most
//! [`MAX_IN_FLIGHT`] replies of one connection are pending at a time. A session made
//! [`Session::with_budget`] charges its buffers to the server's [`BufferBudget`] as they
//! grow and shrink, and is refused growth past its limit (memcached's
//! `read_buf_mem_limit`, see [`crate::buffers`]).

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use kvlab_protocol::{binary, parse, Binding, Family, Limits, Parsed};

use crate::buffers::{Buffer, BufferBudget};
use crate::service::{Completion, Flow, Order, Service, Work};
use binary_protocol::BinaryBuffers;

mod binary_protocol;
mod reply_slots;

/// Initial and idle size of the input buffer: a command line or a small value fits, and
/// an idle connection holds little (memory per connection is what limits how many a
/// server holds).
const INPUT_INITIAL: usize = 2 * 1024;
/// A read that fills the input buffer doubles it, up to this, so a busy pipelining
/// connection reads in large chunks; [`Session::shrink`] gives it back once idle.
const INPUT_BURST: usize = 16 * 1024;
/// Processing stops while this much output is waiting for the client to read it.
pub const OUTPUT_HIGH_WATER: usize = 4 * 1024 * 1024;
/// Buffers grown past this are given back when the connection goes idle.
const SHRINK_ABOVE: usize = 256 * 1024;
/// Most replies of one connection pending at a time ([`Order::Pipelined`]): a proxy's
/// pipelining depth towards its backends.
pub const MAX_IN_FLIGHT: usize = 16;

thread_local! {
    /// The thread's spare input buffer ([`INPUT_INITIAL`] bytes), lent to a session of this
    /// thread that holds none, for one turn: read into, parsed, and given back when the
    /// turn used every byte, as memcached reads into a thread's buffer. So a connection
    /// between requests holds no input buffer, and a request costs no allocation (two swaps
    /// of a thread-local cell). A session left with part of a request keeps the buffer as
    /// its own (charged to its budget), until it goes idle ([`Session::shrink`]).
    static SPARE: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// A new input buffer of [`INPUT_INITIAL`] bytes (a thread's first, or one to replace the
/// spare a session kept).
#[cold]
fn fresh_input() -> Vec<u8> {
    vec![0; INPUT_INITIAL]
}

/// Names a pending reply slot of one session (increasing per session).
pub type SlotId = u64;

/// A reply that completes later.
#[derive(Debug)]
struct Pending {
    id: SlotId,
    /// Where the slot's held-back reply starts in `output`.
    at: usize,
    /// Length of the held-back reply (bytes after `at + len` belong to later requests).
    len: usize,
    order: Order,
}

/// One client connection's protocol state.
pub struct Session<S: Service> {
    input: Vec<u8>,
    /// The last read filled all the free input space: more is likely waiting.
    filled_all: bool,
    /// `input[start..end]` holds bytes received and not yet parsed.
    start: usize,
    end: usize,
    output: Vec<u8>,
    /// Bytes of `output` already written.
    written: usize,
    /// Bytes still to discard (the data of a refused value).
    swallow: usize,
    closing: bool,
    /// Closing by handing the socket to the service ([`Flow::HandOff`]).
    hand_off: bool,
    limits: Limits,
    /// Service times of the current batch (ns), reported to the service.
    samples: Vec<u64>,
    /// The service's per-connection state.
    conn: S::Conn,
    /// Pending reply slots, in request order.
    pending: VecDeque<Pending>,
    /// Work of pending slots not yet taken by the driver, in request order.
    work: VecDeque<(SlotId, S::Work)>,
    next_id: SlotId,
    /// The next request parsed is a re-run ([`Completion::Rerun`]).
    rerun: bool,
    /// Which protocol the connection speaks, known from its first byte.
    speaks: Speaks,
    /// A binary connection's buffers (made by its first request, kept).
    binary: Option<Box<BinaryBuffers>>,
    /// Most requests answered per turn (0: all buffered); see [`Session::per_turn`].
    per_turn: u32,
    /// The last turn stopped at `per_turn` with a request buffered.
    yielded: bool,
    /// Where the buffers' bytes are charged (`None`: nowhere, no limit).
    budget: Option<Arc<BufferBudget>>,
    /// `input` is the thread's spare buffer, lent for this turn (not charged).
    lent: bool,
    /// Bytes of the input and output buffers' allocations charged to `budget`.
    charged_in: usize,
    charged_out: usize,
}

/// memcached's reply to a multi-get whose reply it has no memory for.
const OOM_GET: &[u8] = b"SERVER_ERROR out of memory writing get response\r\n";

/// Where a turn goes after a request's call ([`Session::follow`]).
enum Next {
    /// Its reply is composed or held in a slot: on to the next request.
    Answered,
    /// Its work ran inline and it runs again now ([`Order::Rerun`]).
    RunAgain,
    /// It runs again once its deferred work completes: the turn stops.
    Waits,
}

/// A bad request: counted, and answered with memcached's error unless the service has its
/// own reply or `noreply` silences it.
fn refuse<S: Service>(
    service: &mut S,
    conn: &mut S::Conn,
    output: &mut Vec<u8>,
    error: kvlab_protocol::ProtocolError,
    noreply: bool,
) {
    service.protocol_error(error);
    tracing::debug!(%error, "bad request");
    match service.error_reply(conn, error) {
        Some(reply) if !error.closes() => output.extend_from_slice(reply),
        _ if noreply => {}
        _ => output.extend_from_slice(error.reply()),
    }
}

/// The protocol of a connection: `Limits::binding`, or under `-B auto` (the default) its
/// first byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Speaks {
    /// No byte yet.
    Unknown,
    /// The text and meta protocol.
    Text,
    /// The binary protocol (first byte 0x80), served by translation
    /// ([`kvlab_protocol::binary`]).
    Binary,
}

impl<S: Service> Session<S> {
    /// A session for a new connection, parsing under `limits`.
    pub fn new(limits: Limits) -> Self {
        Session {
            // Allocated when the first bytes arrive ([`Session::read_space`]): a connection
            // that sends nothing, or went idle ([`Session::shrink`]), holds no buffer.
            input: Vec::new(),
            filled_all: false,
            start: 0,
            end: 0,
            // Allocated by the first reply, kept while the connection is busy.
            output: Vec::new(),
            written: 0,
            swallow: 0,
            closing: false,
            hand_off: false,
            limits,
            samples: Vec::new(),
            conn: S::Conn::default(),
            pending: VecDeque::new(),
            work: VecDeque::new(),
            next_id: 0,
            rerun: false,
            speaks: Speaks::Unknown,
            binary: None,
            per_turn: 0,
            yielded: false,
            budget: None,
            lent: false,
            charged_in: 0,
            charged_out: 0,
        }
    }

    /// A session whose buffers are charged to `budget`, and refused growth past its limit
    /// ([`crate::buffers`]); with `None`, as [`Session::new`].
    pub fn with_budget(limits: Limits, budget: Option<&Arc<BufferBudget>>) -> Self {
        let mut s = Session::new(limits);
        if let Some(b) = budget {
            b.open(0);
            s.budget = Some(b.clone());
        }
        s
    }

    /// Answers at most `n` requests per [`Session::process`] (memcached's `-R`): a request
    /// beyond them waits, still buffered, for the next call, and the session says so once
    /// ([`Session::take_yield`]), so that an event loop serves its other connections first.
    pub fn per_turn(&mut self, n: u32) {
        self.per_turn = n;
    }

    /// Whether the last turn stopped with requests left at [`Session::per_turn`]'s bound
    /// (cleared by asking).
    pub fn take_yield(&mut self) -> bool {
        std::mem::take(&mut self.yielded)
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
        if self.input.is_empty() {
            self.borrow_spare();
        }
        let burst = std::mem::take(&mut self.filled_all) && self.input.len() < INPUT_BURST;
        if self.end == self.input.len() || burst {
            if self.start > 0 {
                self.input.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            let full = self.end == self.input.len();
            if (full || burst) && self.input.len() < self.input_max() {
                let grown = (self.input.len() * 2).min(self.input_max());
                // A request that needs the room gets it whatever the budget (memcached
                // reads a value into item memory, a long key list into a buffer of its
                // own); reading ahead in larger chunks only within the budget.
                let more = grown.saturating_sub(self.input.capacity());
                let allowed = full
                    || self
                        .budget
                        .as_deref()
                        .is_none_or(|b| b.try_grow(Buffer::Input, more, INPUT_INITIAL));
                if allowed {
                    self.adopt();
                    if !full {
                        self.charged_in += more;
                    }
                    self.input.resize(grown, 0);
                    self.settle();
                }
            }
        }
        &mut self.input[self.end..]
    }

    /// Brings the charges to `budget` to the buffers' allocations now, whatever the limit
    /// (what a buffer gave back, or grew by outside a request's check). Two compares when
    /// nothing changed.
    #[inline]
    fn settle(&mut self) {
        let same =
            self.input_held() == self.charged_in && self.output.capacity() == self.charged_out;
        if !same && self.budget.is_some() {
            self.settle_changed();
        }
    }

    /// [`Session::settle`] once a buffer's allocation changed.
    #[cold]
    fn settle_changed(&mut self) {
        let Some(b) = self.budget.as_deref() else {
            return;
        };
        for (which, held, charged) in [
            (Buffer::Input, self.input_held(), &mut self.charged_in),
            (
                Buffer::Output,
                self.output.capacity(),
                &mut self.charged_out,
            ),
        ] {
            if held > *charged {
                b.grow(which, held - *charged);
            } else if held < *charged {
                b.shrink(which, *charged - held);
            }
            *charged = held;
        }
    }

    /// The input buffer's bytes this session holds as its own (a lent one is the thread's).
    #[inline]
    fn input_held(&self) -> usize {
        if self.lent {
            0
        } else {
            self.input.capacity()
        }
    }

    /// Reads into the thread's spare buffer for this turn (a fresh one if another session
    /// kept it). Inline, as is [`Session::give_back_input`]: the pair runs once a request
    /// and costs a few dozen instructions as calls.
    #[inline]
    fn borrow_spare(&mut self) {
        let spare = SPARE.take();
        self.input = if spare.len() == INPUT_INITIAL {
            spare
        } else {
            fresh_input()
        };
        self.lent = true;
    }

    /// The lent input buffer becomes this session's own (it keeps bytes, or grows).
    #[cold]
    fn adopt(&mut self) {
        if self.lent {
            self.lent = false;
            self.settle();
        }
    }

    /// At the end of a turn: a lent input buffer goes back to the thread if the turn used
    /// every byte read, else the session keeps it.
    #[inline]
    fn give_back_input(&mut self) {
        if self.lent {
            if self.start == self.end && self.input.len() == INPUT_INITIAL {
                self.start = 0;
                self.end = 0;
                self.lent = false;
                SPARE.set(std::mem::take(&mut self.input));
            } else {
                self.adopt();
            }
        }
    }

    /// After a request whose reply grew the output buffer (from `hold`): charges the
    /// growth, or — past the budget's limit — drops the reply and gives its memory back, as
    /// memcached does when it has no response object left: a multi-get (`get_family`) is
    /// answered `SERVER_ERROR out of memory writing get response`, any other request closes
    /// the connection once the replies before it are written.
    fn charge_reply(&mut self, hold: usize, get_family: bool) {
        let Some(b) = self.budget.as_deref() else {
            return;
        };
        let more = self.output.capacity() - self.charged_out;
        if b.try_grow(Buffer::Output, more, INPUT_INITIAL) {
            self.charged_out += more;
            return;
        }
        b.count_reply_oom();
        tracing::debug!(bytes = more, "reply refused over read_buf_mem_limit");
        self.output.truncate(hold);
        self.output.shrink_to(self.charged_out.max(hold));
        if get_family {
            self.output.extend_from_slice(OOM_GET);
        } else {
            self.closing = true;
        }
        self.settle();
    }

    /// Gives back the buffer memory of a connection with nothing buffered (no input, no
    /// output, no reply pending): every buffer is freed, as memcached returns an idle
    /// connection's read buffer, and the next bytes allocate the input buffer again. The
    /// drivers call it for connections idle a while (a second), so a busy one keeps its
    /// buffers and no request pays for an allocation.
    pub fn shrink(&mut self) {
        if self.start == self.end
            && self.pending_output() == 0
            && self.pending.is_empty()
            && self.work.is_empty()
            && self.swallow == 0
        {
            self.start = 0;
            self.end = 0;
            self.input = Vec::new();
            self.output = Vec::new();
            self.written = 0;
            self.samples = Vec::new();
            self.pending = VecDeque::new();
            self.work = VecDeque::new();
            self.binary = None;
            self.settle();
        }
    }

    /// Records that `n` bytes were read into [`Session::read_space`].
    pub fn filled(&mut self, n: usize) {
        self.filled_all = self.end + n == self.input.len();
        self.end += n;
        if self.swallow > 0 {
            let drop = self.swallow.min(self.end - self.start);
            self.swallow -= drop;
            self.start += drop;
        }
    }

    /// Whether processing waits for pending replies: a barrier or re-run is pending, or
    /// [`MAX_IN_FLIGHT`] replies are.
    fn held_up(&self) -> bool {
        self.pending.len() >= MAX_IN_FLIGHT
            || self
                .pending
                .back()
                .is_some_and(|p| p.order != Order::Pipelined)
    }

    /// Parses and applies every complete request buffered, composing replies, until a
    /// pending reply holds processing up. Deferred work waits in the session for the driver
    /// ([`Session::take_work`]).
    pub fn process(&mut self, service: &mut S) {
        self.turn(service, false);
    }

    /// Like [`Session::process`], but deferred work runs at once, inline on the service's own
    /// worker, as part of its request (its time counts in the request's service time): for
    /// drivers without helper threads. No reply slot is ever pending afterwards.
    pub fn process_inline(&mut self, service: &mut S) {
        self.turn(service, true);
    }

    /// [`Session::run`], then the thread's spare input buffer given back if this session
    /// read into it and used every byte.
    fn turn(&mut self, service: &mut S, inline: bool) {
        self.run(service, inline);
        self.give_back_input();
    }

    /// One turn: the connection's protocol first, then every request buffered, in order,
    /// until a pending reply, the output's high water or [`Session::per_turn`] stops it.
    fn run(&mut self, service: &mut S, inline: bool) {
        if self.speaks != Speaks::Text && self.ran_binary(service) {
            return;
        }
        let mut clock = Instant::now();
        let mut answered = 0u32;
        while self.may_go_on() {
            let parsed = parse(&self.input[self.start..self.end], &self.limits);
            let mut timed = true;
            match parsed {
                Parsed::Request { .. } if self.per_turn != 0 && answered >= self.per_turn => {
                    // Parsed again next turn: a yield happens only under `-R`.
                    self.yielded = true;
                    service.yielded();
                    break;
                }
                Parsed::Request { request, consumed } => {
                    answered += 1;
                    timed = service.timed(&request);
                    let hold = self.output.len();
                    let get_family = request.family() == Family::Retrieval;
                    let rerun = std::mem::take(&mut self.rerun);
                    let flow = service.call(&mut self.conn, &request, &mut self.output, rerun);
                    match self.follow(service, flow, hold, get_family, inline) {
                        Next::Answered => self.start += consumed,
                        // Again now, within the same service-time sample.
                        Next::RunAgain => continue,
                        // It stays unconsumed until its work completes.
                        Next::Waits => break,
                    }
                }
                Parsed::Incomplete => break,
                Parsed::Error {
                    error,
                    consumed,
                    swallow,
                    noreply,
                    drops,
                } => {
                    let hold = self.output.len();
                    refuse(service, &mut self.conn, &mut self.output, error, noreply);
                    if let Some(work) =
                        drops.and_then(|key| service.drop_stale(&mut self.conn, key))
                    {
                        self.stale_dropped(service, work, hold, inline);
                    }
                    self.skip(consumed, swallow, error.closes());
                }
            }
            let now = Instant::now();
            if timed {
                self.samples
                    .push(now.duration_since(clock).as_nanos() as u64);
            }
            clock = now;
        }
        self.end_turn(service);
    }

    /// The protocol of a connection that has not shown it yet (`-B`, or its first byte);
    /// a binary connection's turn is run here. Whether the turn is over.
    fn ran_binary(&mut self, service: &mut S) -> bool {
        if self.start == self.end {
            return true;
        }
        if self.speaks == Speaks::Unknown {
            self.speaks = match self.limits.binding {
                Binding::Auto if self.input[self.start] == binary::REQUEST_MAGIC => Speaks::Binary,
                Binding::Auto | Binding::Ascii => Speaks::Text,
                // A first byte other than the magic closes the connection, as in
                // memcached, once a whole header is in (`run_binary`).
                Binding::Binary => Speaks::Binary,
            };
        }
        if self.speaks != Speaks::Binary {
            return false;
        }
        self.run_binary(service);
        // Binary replies are charged, not refused (memcached's binary `get` is
        // one key a request).
        self.settle();
        true
    }

    /// Whether another request may be answered this turn.
    #[inline]
    fn may_go_on(&self) -> bool {
        !self.closing
            && !self.held_up()
            && self.start < self.end
            && self.pending_output() < OUTPUT_HIGH_WATER
    }

    /// What follows a request's call, given its flow: closing, its deferred work run now
    /// (`inline`) or held in a reply slot, and the reply's growth of the output charged.
    /// `hold` is where its reply starts.
    #[inline]
    fn follow(
        &mut self,
        service: &mut S,
        flow: Flow<S::Work>,
        hold: usize,
        get_family: bool,
        inline: bool,
    ) -> Next {
        let deferred = self.pending.len();
        match flow {
            Flow::Done => {}
            Flow::Close => self.closing = true,
            Flow::HandOff => {
                self.closing = true;
                self.hand_off = true;
            }
            Flow::Defer(work, order) if inline => match (work.run(service.worker()), order) {
                (Completion::Failed(reason), _) => {
                    // A request waiting to run again is dropped with the error.
                    self.output.truncate(hold);
                    server_error(&mut self.output, &reason);
                }
                (_, Order::Rerun) => {
                    self.output.truncate(hold);
                    self.rerun = true;
                    return Next::RunAgain;
                }
                (Completion::Reply(bytes), _) => {
                    self.output.extend_from_slice(&bytes);
                    service.recycle(bytes);
                }
                (Completion::Rerun | Completion::Release, _) => {}
            },
            Flow::Defer(work, order) => {
                if order == Order::Rerun {
                    self.output.truncate(hold);
                }
                self.hold_slot(work, hold, order);
                if order == Order::Rerun {
                    return Next::Waits;
                }
            }
        }
        // A reply composed now (not held back for work) that grew the buffer.
        if self.output.capacity() > self.charged_out && self.pending.len() == deferred {
            self.charge_reply(hold, get_family);
        }
        Next::Answered
    }

    /// A reply slot from `hold` to the end of the output, held back until `work` completes.
    fn hold_slot(&mut self, work: S::Work, hold: usize, order: Order) {
        let id = self.next_id;
        self.next_id += 1;
        self.pending.push_back(Pending {
            id,
            at: hold,
            len: self.output.len() - hold,
            order,
        });
        self.work.push_back((id, work));
    }

    /// The work of dropping a refused `set`'s old value (its error reply from `hold`): run
    /// now (`inline`), or the reply held back until it completes.
    fn stale_dropped(&mut self, service: &mut S, work: S::Work, hold: usize, inline: bool) {
        if !inline {
            self.hold_slot(work, hold, Order::Pipelined);
            return;
        }
        if let Completion::Reply(bytes) = work.run(service.worker()) {
            self.output.extend_from_slice(&bytes);
            service.recycle(bytes);
        }
    }

    /// Past a bad request: its `consumed` bytes, and `swallow` bytes of its refused data as
    /// they arrive; `closes`: the connection closes after the replies before.
    fn skip(&mut self, consumed: usize, swallow: usize, closes: bool) {
        self.start += consumed;
        let buffered = (self.end - self.start).min(swallow);
        self.start += buffered;
        self.swallow = swallow - buffered;
        if closes {
            self.closing = true;
        }
    }

    /// The end of a turn: the input rewound if all of it was used, the service times
    /// reported, the buffers' charges settled.
    fn end_turn(&mut self, service: &mut S) {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        service.record_service(&self.samples);
        self.samples.clear();
        self.settle();
    }

    /// Replies composed and not yet written, up to the first pending reply.
    pub fn output(&self) -> &[u8] {
        let end = self.pending.front().map_or(self.output.len(), |p| p.at);
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
            // Every pending slot left is empty and at the end: it now starts at 0.
            for p in &mut self.pending {
                p.at = 0;
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
            self.settle();
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

    /// Tells the service that this session's connection is on socket `fd`, over TLS or not
    /// ([`Service::opened`]).
    pub fn opened(&mut self, service: &mut S, fd: std::os::fd::RawFd, tls: bool) {
        service.opened(&mut self.conn, fd, tls);
    }

    /// Whether the socket goes to the service once the replies are out
    /// ([`Flow::HandOff`]).
    pub fn hands_off(&self) -> bool {
        self.hand_off
    }

    /// The input read and not yet processed (after a hand-off: what the client sent behind
    /// the request that handed the connection off).
    pub fn unread(&self) -> &[u8] {
        &self.input[self.start..self.end]
    }

    /// Puts `bytes` in front of what is read next (a connection taken over with input
    /// already read from it).
    pub fn preload(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let space = self.read_space();
            let n = space.len().min(bytes.len());
            if n == 0 {
                return; // past the largest valid request: the parser refuses it anyway
            }
            space[..n].copy_from_slice(&bytes[..n]);
            self.filled(n);
            bytes = &bytes[n..];
        }
    }

    /// Marks the session closing (e.g. server shutdown).
    pub fn close(&mut self) {
        self.closing = true;
    }
}

impl<S: Service> Drop for Session<S> {
    fn drop(&mut self) {
        if let Some(b) = &self.budget {
            b.close(self.charged_in, self.charged_out);
        }
    }
}

/// Appends `SERVER_ERROR <reason>` (line breaks in `reason` made spaces).
fn server_error(out: &mut Vec<u8>, reason: &str) {
    tracing::warn!(%reason, "deferred work failed");
    out.extend_from_slice(b"SERVER_ERROR ");
    out.extend(reason.bytes().map(|b| match b {
        b'\r' | b'\n' => b' ',
        b => b,
    }));
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use kvlab_protocol::{ProtocolError, Request};

    use super::*;

    /// Work of the test service: a value looked up later, on whatever order is asked.
    struct Later {
        reply: Completion,
    }

    impl Work for Later {
        type Worker = ();
        fn run(self, _: &mut ()) -> Completion {
            self.reply
        }
    }

    /// A tiny service: `set` stores, `get` answers from a map. Keys starting `p` (pipelined)
    /// answer later with the value as [`Completion::Reply`]; `b` (barrier) holds its `END`
    /// back until released; `r` (re-run) misses until it has run again.
    #[derive(Default)]
    struct Toy {
        map: HashMap<Vec<u8>, Vec<u8>>,
        errors: usize,
        calls: usize,
        worker: (),
    }

    impl Service for Toy {
        type Conn = ();
        type Work = Later;

        fn call(
            &mut self,
            _: &mut (),
            req: &Request<'_>,
            out: &mut Vec<u8>,
            rerun: bool,
        ) -> Flow<Later> {
            self.calls += 1;
            match *req {
                Request::Store { key, data, .. } => {
                    self.map.insert(key.to_vec(), data.to_vec());
                    out.extend_from_slice(b"STORED\r\n");
                }
                Request::Get { keys, .. } => {
                    let mut deferred = None;
                    for key in keys.iter() {
                        match key.first() {
                            Some(b'p') => {
                                let mut v = b"VALUE ".to_vec();
                                v.extend_from_slice(key);
                                v.extend_from_slice(b"\r\n");
                                deferred = Some((
                                    Later {
                                        reply: Completion::Reply(v),
                                    },
                                    Order::Pipelined,
                                ));
                            }
                            Some(b'b') => {
                                deferred = Some((
                                    Later {
                                        reply: Completion::Release,
                                    },
                                    Order::Barrier,
                                ));
                            }
                            Some(b'r') if !rerun => {
                                return Flow::Defer(
                                    Later {
                                        reply: Completion::Rerun,
                                    },
                                    Order::Rerun,
                                );
                            }
                            Some(b'r') => out.extend_from_slice(b"LOADED\r\n"),
                            _ => {
                                if let Some(v) = self.map.get(key) {
                                    out.extend_from_slice(b"VALUE ");
                                    out.extend_from_slice(v);
                                    out.extend_from_slice(b"\r\n");
                                }
                            }
                        }
                    }
                    out.extend_from_slice(b"END\r\n");
                    if let Some((w, o)) = deferred {
                        return Flow::Defer(w, o);
                    }
                }
                Request::Version => out.extend_from_slice(b"VERSION toy\r\n"),
                // `delete` echoes the value: a large reply that is not a get's.
                Request::Delete { key, .. } => {
                    if let Some(v) = self.map.get(key) {
                        out.extend_from_slice(v);
                        out.extend_from_slice(b"\r\n");
                    }
                }
                Request::Quit => return Flow::Close,
                _ => out.extend_from_slice(b"ERROR\r\n"),
            }
            Flow::Done
        }

        fn worker(&mut self) -> &mut () {
            &mut self.worker
        }

        fn protocol_error(&mut self, _: ProtocolError) {
            self.errors += 1;
        }
        fn record_service(&mut self, _: &[u64]) {}
        fn bytes_read(&mut self, _: usize) {}
        fn bytes_written(&mut self, _: usize) {}
    }

    /// Feeds `bytes` the way a driver would, in reads of at most `chunk` bytes.
    fn feed(s: &mut Session<Toy>, e: &mut Toy, bytes: &[u8], chunk: usize, max_cap: &mut usize) {
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

    fn take_output(s: &mut Session<Toy>) -> Vec<u8> {
        let out = s.output().to_vec();
        s.wrote(out.len());
        out
    }

    fn new() -> (Session<Toy>, Toy) {
        (Session::new(Limits::default()), Toy::default())
    }

    /// Under a budget: a multi-get whose reply passes the limit is refused with memcached's
    /// line and the session serves on; another request's reply past it closes the session
    /// after the replies before it; every byte is given back when the session goes.
    #[test]
    fn replies_past_the_buffer_budget_are_refused() {
        let budget = Arc::new(BufferBudget::new(100_000));
        let mut s: Session<Toy> = Session::with_budget(Limits::default(), Some(&budget));
        let mut e = Toy::default();
        assert_eq!(budget.input_bytes(), 0, "no buffer before the first bytes");
        let value = "v".repeat(20_000);
        for k in ["a", "c", "d", "e", "f"] {
            e.map
                .insert(k.as_bytes().to_vec(), value.clone().into_bytes());
        }
        let mut cap = 0;
        feed(&mut s, &mut e, b"get a c\r\n", 1 << 20, &mut cap);
        assert_eq!(take_output(&mut s).len(), 2 * (6 + 20_000 + 2) + 5);
        assert_eq!(budget.output_bytes(), s.output.capacity());
        feed(
            &mut s,
            &mut e,
            b"get a c d e\r\nget a\r\n",
            1 << 20,
            &mut cap,
        );
        let out = take_output(&mut s);
        assert!(out.starts_with(OOM_GET), "{:?}", &out[..60]);
        assert_eq!(
            out.len(),
            OOM_GET.len() + 6 + 20_000 + 2 + 5,
            "the next get is served"
        );
        assert_eq!(budget.reply_oom(), 1);
        assert!(!s.is_closing());
        // Another request's reply past it: the replies before go out, then the session
        // closes; the request after is not served.
        let stacked =
            b"version\r\ndelete a\r\ndelete c\r\ndelete d\r\ndelete e\r\ndelete f\r\nversion\r\n";
        feed(&mut s, &mut e, stacked, 1 << 20, &mut cap);
        let out = take_output(&mut s);
        assert!(out.starts_with(b"VERSION toy\r\n"));
        let values = (out.len() - 13) / (20_000 + 2);
        assert_eq!(out.len(), 13 + values * (20_000 + 2), "whole replies");
        assert!(values < 5, "{values} values served");
        assert!(s.is_closing());
        assert_eq!(budget.reply_oom(), 2);
        drop(s);
        assert_eq!((budget.input_bytes(), budget.output_bytes()), (0, 0));
    }

    /// A connection starts with no buffer; its first bytes allocate a small input buffer,
    /// reads that fill it double it (up to a burst size); once idle, `shrink` gives it all
    /// back — and not while half a command is buffered.
    #[test]
    fn buffers_start_small_grow_with_bursts_and_shrink_when_idle() {
        let (mut s, mut e) = new();
        assert_eq!(s.input_capacity(), 0);
        assert_eq!(s.output.capacity(), 0);
        // Half a command: nothing grows.
        let mut cap = 0;
        feed(&mut s, &mut e, b"get k", 64 * 1024, &mut cap);
        assert_eq!(cap, INPUT_INITIAL);
        s.shrink();
        assert_eq!(s.input_capacity(), INPUT_INITIAL, "half a command is kept");
        // A burst of pipelined requests arriving in reads that fill the buffer.
        let burst = b"\r\n"
            .iter()
            .copied()
            .chain(b"get k\r\n".repeat(20_000))
            .collect::<Vec<u8>>();
        feed(&mut s, &mut e, &burst, 64 * 1024, &mut cap);
        assert_eq!(cap, INPUT_BURST, "grown to the burst size, no further");
        let out = take_output(&mut s);
        assert_eq!(out, b"END\r\n".repeat(20_001));
        assert!(s.output.capacity() > 0);
        s.shrink();
        assert_eq!(s.input_capacity(), 0);
        assert_eq!(s.output.capacity(), 0);
        // Still serves after shrinking.
        feed(&mut s, &mut e, b"get k\r\n", 64 * 1024, &mut cap);
        assert_eq!(take_output(&mut s), b"END\r\n");
    }

    #[test]
    fn garbage_without_newline_closes_and_stays_small() {
        let (mut s, mut e) = new();
        let mut cap = 0;
        feed(&mut s, &mut e, &vec![b'z'; 10 << 20], 4096, &mut cap);
        assert!(s.is_closing());
        // Closed without a word, as memcached does.
        assert_eq!(take_output(&mut s), b"");
        assert!(cap <= INPUT_BURST, "input grew to {cap}");
        assert_eq!(e.errors, 1);
    }

    #[test]
    fn refused_value_is_swallowed_without_buffering() {
        let (mut s, mut e) = new();
        let mut cap = 0;
        let mut req = b"set k 0 0 5000000\r\n".to_vec();
        req.extend(std::iter::repeat_n(b'x', 5_000_000));
        req.extend_from_slice(b"\r\nget k\r\n");
        feed(&mut s, &mut e, &req, 16 * 1024, &mut cap);
        assert_eq!(
            take_output(&mut s),
            b"SERVER_ERROR object too large for cache\r\nEND\r\n"
        );
        assert!(cap <= INPUT_BURST, "input grew to {cap}");
        assert_eq!(e.errors, 1);
    }

    #[test]
    fn unfinished_value_is_bounded_by_the_item_limit() {
        let (mut s, mut e) = new();
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
        let (mut s, mut e) = new();
        let mut cap = 0;
        let mut set = b"set k 0 0 500000\r\n".to_vec();
        set.extend(std::iter::repeat_n(b'v', 500_000));
        set.extend_from_slice(b"\r\n");
        feed(&mut s, &mut e, &set, 1 << 20, &mut cap);
        assert_eq!(take_output(&mut s), b"STORED\r\n");
        let gets = b"get k\r\n".repeat(1000);
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
        let (mut s, mut e) = new();
        let mut cap = 0;
        let req = b"set a 0 0 1\r\n1\r\nget a\r\nbogus\r\nversion\r\n";
        // Byte by byte: every split point of a pipeline gives the same replies.
        feed(&mut s, &mut e, req, 1, &mut cap);
        let out = take_output(&mut s);
        assert_eq!(
            String::from_utf8_lossy(&out),
            "STORED\r\nVALUE 1\r\nEND\r\nERROR\r\nVERSION toy\r\n"
        );
    }

    #[test]
    fn pending_slots_completing_out_of_order_leave_in_request_order() {
        let (mut s, mut e) = new();
        let mut cap = 0;
        feed(
            &mut s,
            &mut e,
            b"get p1\r\nversion\r\nget p2\r\nget p3\r\nversion\r\n",
            1 << 10,
            &mut cap,
        );
        // Every request was processed: the pipelined slots don't hold later ones up.
        assert_eq!(e.calls, 5);
        assert!(
            s.output().is_empty(),
            "nothing may pass the first pending reply"
        );
        let work: Vec<_> = std::iter::from_fn(|| s.take_work()).collect();
        assert_eq!(work.len(), 3);
        let mut done: Vec<_> = work
            .into_iter()
            .map(|(id, w)| (id, w.run(&mut ())))
            .collect();
        // The last first: still nothing leaves.
        let (id3, c3) = done.pop().unwrap();
        s.complete(id3, c3);
        assert!(s.output().is_empty());
        let (id2, c2) = done.pop().unwrap();
        s.complete(id2, c2);
        assert!(s.output().is_empty());
        let (id1, c1) = done.pop().unwrap();
        s.complete(id1, c1);
        assert!(!s.is_waiting());
        assert_eq!(
            String::from_utf8_lossy(&take_output(&mut s)),
            "END\r\nVALUE p1\r\nVERSION toy\r\nEND\r\nVALUE p2\r\nEND\r\nVALUE p3\r\nVERSION toy\r\n"
        );
    }

    #[test]
    fn ready_replies_before_a_pending_one_leave_at_once() {
        let (mut s, mut e) = new();
        let mut cap = 0;
        feed(
            &mut s,
            &mut e,
            b"version\r\nget p1\r\nversion\r\n",
            1 << 10,
            &mut cap,
        );
        assert_eq!(take_output(&mut s), b"VERSION toy\r\n");
        // Written up to the pending slot; the rest waits for it. A failure replaces the
        // slot's held-back reply.
        let (id, _) = s.take_work().unwrap();
        s.complete(id, Completion::Failed("backend\r\ndown".into()));
        assert_eq!(
            String::from_utf8_lossy(&take_output(&mut s)),
            "SERVER_ERROR backend  down\r\nVERSION toy\r\n"
        );
    }

    #[test]
    fn a_barrier_holds_later_requests_until_it_completes() {
        let (mut s, mut e) = new();
        let mut cap = 0;
        feed(
            &mut s,
            &mut e,
            b"get b1\r\nversion\r\nget a\r\n",
            1 << 10,
            &mut cap,
        );
        assert_eq!(
            e.calls, 1,
            "nothing after a barrier runs while it is pending"
        );
        assert!(s.output().is_empty(), "the barrier's reply is held back");
        let (id, w) = s.take_work().unwrap();
        assert!(s.take_work().is_none());
        s.complete(id, w.run(&mut ()));
        s.process(&mut e);
        assert_eq!(e.calls, 3);
        assert_eq!(
            String::from_utf8_lossy(&take_output(&mut s)),
            "END\r\nVERSION toy\r\nEND\r\n"
        );
    }

    #[test]
    fn a_rerun_runs_the_request_again_before_later_ones() {
        let (mut s, mut e) = new();
        let mut cap = 0;
        feed(&mut s, &mut e, b"get r1\r\nversion\r\n", 1 << 10, &mut cap);
        assert_eq!(e.calls, 1);
        assert!(s.output().is_empty());
        let (id, w) = s.take_work().unwrap();
        s.complete(id, w.run(&mut ()));
        s.process(&mut e);
        assert_eq!(e.calls, 3);
        assert_eq!(
            String::from_utf8_lossy(&take_output(&mut s)),
            "LOADED\r\nEND\r\nVERSION toy\r\n"
        );
    }

    #[test]
    fn inline_work_completes_within_its_request() {
        let (mut s, mut e) = new();
        let req = b"get r1\r\nget p1\r\nget b1\r\nversion\r\n";
        let space = s.read_space();
        space[..req.len()].copy_from_slice(req);
        s.filled(req.len());
        s.process_inline(&mut e);
        assert!(!s.is_waiting());
        assert!(s.take_work().is_none());
        assert_eq!(
            String::from_utf8_lossy(&take_output(&mut s)),
            "LOADED\r\nEND\r\nEND\r\nVALUE p1\r\nEND\r\nVERSION toy\r\n"
        );
    }

    #[test]
    fn a_failed_rerun_drops_its_request_with_the_error() {
        let (mut s, mut e) = new();
        let mut cap = 0;
        feed(&mut s, &mut e, b"get r1\r\nversion\r\n", 1 << 10, &mut cap);
        let (id, _) = s.take_work().unwrap();
        s.complete(id, Completion::Failed("disk".into()));
        s.process(&mut e);
        assert_eq!(
            String::from_utf8_lossy(&take_output(&mut s)),
            "SERVER_ERROR disk\r\nVERSION toy\r\n"
        );
    }

    #[test]
    fn replacing_output_moves_what_follows_and_the_later_slots() {
        let mut s: Session<Toy> = Session::new(Limits::default());
        for (at, len, with, want) in [
            (3, 0, &b"NEW"[..], &b"aaaNEWheldbbb"[..]),
            (3, 4, &b"xy"[..], &b"aaaxybbb"[..]),
            (3, 4, &b"longer!"[..], &b"aaalonger!bbb"[..]),
            (10, 0, &b"end"[..], &b"aaaheldbbbend"[..]),
        ] {
            s.output = b"aaaheldbbb".to_vec();
            s.pending.clear();
            s.pending.push_back(Pending {
                id: 9,
                at: 10,
                len: 0,
                order: Order::Pipelined,
            });
            s.replace(0, at..at + len, with);
            assert_eq!(s.output, want);
            assert_eq!(
                s.pending[0].at,
                want.len(),
                "the later slot stays at the end"
            );
        }
    }

    #[test]
    fn in_flight_replies_are_bounded() {
        let (mut s, mut e) = new();
        let mut cap = 0;
        let req = b"get p\r\n".repeat(MAX_IN_FLIGHT + 4);
        feed(&mut s, &mut e, &req, 1 << 10, &mut cap);
        assert_eq!(e.calls, MAX_IN_FLIGHT);
        let (id, w) = s.take_work().unwrap();
        s.complete(id, w.run(&mut ()));
        s.process(&mut e);
        assert_eq!(e.calls, MAX_IN_FLIGHT + 1);
        assert_eq!(take_output(&mut s), b"END\r\nVALUE p\r\n");
    }
}
