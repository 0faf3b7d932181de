//! The memory held by all connections' buffers, and its limit (memcached's
//! `-o read_buf_mem_limit`).
//!
//! Every [`Session`](crate::Session) of a server charges the bytes its input and output
//! buffers hold to one [`BufferBudget`]: it counts a change when a buffer is allocated,
//! grows or is given back — never per request — so the figures cost one relaxed atomic
//! add per buffer change. The limit is on the output buffers (the replies composed and
//! not yet written) and on what input buffers grow by to read ahead; each connection's
//! fixed initial input buffer (2 KiB, what an idle connection keeps) is charged but is
//! outside it: connections are bounded by `-c`.
//!
//! Over the limit, as memcached over its `read_buf_mem_limit` (which bounds its read
//! buffers and the response objects its replies are built in):
//!
//! - a reply that grew its connection's output buffer past the limit is dropped and its
//!   memory given back: a `get`/`gets`/`gat`/`gats` is answered `SERVER_ERROR out of memory
//!   writing get response`, any other request closes the connection once the replies before
//!   it are written (both counted in `response_obj_oom`);
//! - an input buffer does not grow to read ahead in larger chunks. It still grows to hold
//!   a request it has begun to read (a value, a long key list): memcached reads a value
//!   into item memory and a long line into a buffer outside its limit, and a `set` must
//!   not fail under the limit in kvlab where it succeeds in memcached. So kvlab never
//!   closes a connection for its read buffer (memcached's `read_buf_oom`, when it has no
//!   16 KiB read buffer for a connection with bytes to read).
//!
//! The check is made when a buffer grows, so a reply is composed before it is refused: the
//! limit bounds what connections *hold*, a single reply may pass it for as long as it takes
//! to compose. memcached splits its limit between its worker threads; kvlab's is one limit
//! for the whole server, whatever the I/O model.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

/// The bytes held by connections' buffers, against a limit.
#[derive(Debug, Default)]
pub struct BufferBudget {
    /// The limit (0: none).
    limit: usize,
    /// Bytes held by input buffers.
    input: AtomicUsize,
    /// Bytes held by output buffers.
    output: AtomicUsize,
    /// Sessions charging this budget, each with a fixed part outside the limit.
    sessions: AtomicUsize,
    /// Replies refused (`response_obj_oom`).
    reply_oom: AtomicU64,
}

/// Which buffer of a session a charge is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Buffer {
    Input,
    Output,
}

impl BufferBudget {
    /// A budget of `limit` bytes (memcached's `read_buf_mem_limit`, in bytes); 0: no limit,
    /// the bytes are only counted.
    pub fn new(limit: usize) -> BufferBudget {
        BufferBudget {
            limit,
            ..BufferBudget::default()
        }
    }

    /// The limit in bytes (0: none).
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes held by connections' input buffers now.
    pub fn input_bytes(&self) -> usize {
        self.input.load(Relaxed)
    }

    /// Bytes held by connections' output buffers now.
    pub fn output_bytes(&self) -> usize {
        self.output.load(Relaxed)
    }

    /// Input buffers held now: one per open connection.
    pub fn input_buffers(&self) -> usize {
        self.sessions.load(Relaxed)
    }

    /// Replies refused over the limit (memcached's `response_obj_oom`).
    pub fn reply_oom(&self) -> u64 {
        self.reply_oom.load(Relaxed)
    }

    /// `stats reset`: the refusal counter starts again from 0.
    pub fn reset(&self) {
        self.reply_oom.store(0, Relaxed);
    }

    fn counter(&self, which: Buffer) -> &AtomicUsize {
        match which {
            Buffer::Input => &self.input,
            Buffer::Output => &self.output,
        }
    }

    /// A session opens, holding `fixed` bytes of input buffer (outside the limit).
    pub(crate) fn open(&self, fixed: usize) {
        self.sessions.fetch_add(1, Relaxed);
        self.input.fetch_add(fixed, Relaxed);
    }

    /// A session closes, giving back the `input` and `output` bytes it held.
    pub(crate) fn close(&self, input: usize, output: usize) {
        self.sessions.fetch_sub(1, Relaxed);
        self.input.fetch_sub(input, Relaxed);
        self.output.fetch_sub(output, Relaxed);
    }

    /// Charges `n` more bytes of `which` if that keeps what the limit bounds within it
    /// (always, without a limit): output growth against the output buffers' bytes, input
    /// growth against those and the input buffers' bytes past each session's `fixed` part.
    pub(crate) fn try_grow(&self, which: Buffer, n: usize, fixed: usize) -> bool {
        if self.limit == 0 {
            self.counter(which).fetch_add(n, Relaxed);
            return true;
        }
        // The counters are read apart from the add: a race lets two growths pass the limit
        // by at most what they grow by, never more.
        let mut held = self.output.load(Relaxed);
        if which == Buffer::Input {
            let fixed = self.sessions.load(Relaxed).saturating_mul(fixed);
            held += self.input.load(Relaxed).saturating_sub(fixed);
        }
        if held.saturating_add(n) > self.limit {
            return false;
        }
        self.counter(which).fetch_add(n, Relaxed);
        true
    }

    /// Charges `n` more bytes of `which` whatever the limit (a reply's error line, what a
    /// buffer keeps after giving memory back).
    pub(crate) fn grow(&self, which: Buffer, n: usize) {
        self.counter(which).fetch_add(n, Relaxed);
    }

    /// Gives back `n` bytes of `which`.
    pub(crate) fn shrink(&self, which: Buffer, n: usize) {
        self.counter(which).fetch_sub(n, Relaxed);
    }

    pub(crate) fn count_reply_oom(&self) {
        self.reply_oom.fetch_add(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_past_the_limit_is_refused_and_fixed_parts_are_outside_it() {
        let b = BufferBudget::new(100);
        b.open(10);
        b.open(10);
        assert_eq!(b.input_bytes(), 20);
        assert!(b.try_grow(Buffer::Output, 60, 10));
        assert!(b.try_grow(Buffer::Input, 40, 10), "60 + 40 read ahead");
        assert!(!b.try_grow(Buffer::Input, 1, 10));
        // A request's own input (charged whatever the limit) does not bound replies.
        b.grow(Buffer::Input, 500);
        assert!(b.try_grow(Buffer::Output, 40, 10));
        assert!(!b.try_grow(Buffer::Output, 1, 10), "100 of output");
        b.shrink(Buffer::Output, 30);
        assert!(b.try_grow(Buffer::Output, 30, 10));
        assert_eq!((b.input_bytes(), b.output_bytes()), (560, 100));
        b.close(550, 100);
        b.close(10, 0);
        assert_eq!((b.input_bytes(), b.output_bytes()), (0, 0));
    }

    #[test]
    fn without_a_limit_every_growth_is_counted() {
        let b = BufferBudget::new(0);
        assert!(b.try_grow(Buffer::Input, usize::MAX / 2, 0));
        assert_eq!(b.input_bytes(), usize::MAX / 2);
    }
}
