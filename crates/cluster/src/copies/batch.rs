//! What a copy's writers and its reader share: the timing constants, a batch of writes to
//! copy to one holder, the reply its confirmations go to, and the outcome they add up to.

use std::io::Write;
use std::os::fd::RawFd;
use std::os::unix::net::UnixStream;
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// How long a write's copy may take to be confirmed by its holder before the write fails
/// (`SERVER_ERROR`).
pub const REPLICA_TIMEOUT: Duration = Duration::from_millis(1000);

/// How long a copy holder that failed is not tried again (its writes fail at once).
pub const REPLICA_BACKOFF: Duration = Duration::from_millis(500);

/// Tickets from this one up are writes already acknowledged (write policy `owner`): their
/// copies need not go out at once. A batch of only such tickets is held in its link's
/// queue for up to [`COPY_LINGER`] (or until [`HOLD_BYTES`] are queued, or a batch a reply
/// waits for goes out), and goes with every batch queued behind it — one message for many
/// writes.
pub const BEHIND: usize = 1 << 48;

/// How long the copies of acknowledged writes ([`BEHIND`]) may be held to go out together.
/// A write acknowledged less than this (plus a round trip) before its owner dies may be
/// lost; a read of such a key sends its state at once and waits for it to be confirmed.
pub const COPY_LINGER: Duration = Duration::from_millis(1);

/// Held copies go out once this many bytes are queued on their link.
pub const HOLD_BYTES: usize = 32 * 1024;

/// One ticket's outcome at one holder: `None` when the holder confirmed every key of the
/// ticket, else why not (`copy to NODE not written: …`).
#[derive(Debug)]
pub struct Confirm {
    /// The ticket the batch was queued with.
    pub ticket: usize,
    /// Why the copy is not there, if it is not.
    pub failure: Option<Arc<str>>,
    /// When (on the node's copy clock) the batch's keys were read from the store to be
    /// sent, or the failure was seen.
    pub seq: u64,
}

/// A ticket's outcome over all its holders, gathered from their [`Confirm`]s.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Confirmations still owed.
    pub left: u32,
    /// The first failure, if any.
    pub failure: Option<String>,
    /// Success: the earliest copy clock at which a holder's copy was read (every holder
    /// has the keys' state of at least then). Failure: the latest failure's.
    pub seq: u64,
}

impl Outcome {
    /// A ticket sent to `holders` holders, with `failure` already known (a holder backing
    /// off) at copy clock `seq`.
    pub fn new(holders: u32, failure: Option<String>, seq: u64) -> Outcome {
        Outcome {
            left: holders,
            seq: if failure.is_some() { seq } else { u64::MAX },
            failure,
        }
    }

    /// Takes one holder's confirmation; true once none is owed.
    pub fn add(&mut self, c: Confirm) -> bool {
        match (c.failure, &self.failure) {
            (Some(why), None) => {
                self.failure = Some(why.to_string());
                self.seq = c.seq;
            }
            (Some(_), Some(_)) => self.seq = self.seq.max(c.seq),
            (None, None) => self.seq = self.seq.min(c.seq),
            (None, Some(_)) => {}
        }
        self.left = self.left.saturating_sub(1);
        self.left == 0
    }
}

/// Where a batch's confirmations go: a channel, and (for an event loop) a socket whose
/// other end the loop watches, written one byte to wake it.
#[derive(Clone)]
pub struct Reply {
    tx: mpsc::Sender<Confirm>,
    wake: Option<Arc<UnixStream>>,
}

impl Reply {
    /// Confirmations to `tx`; `wake`, if any, is written a byte after each batch's.
    pub fn new(tx: mpsc::Sender<Confirm>, wake: Option<Arc<UnixStream>>) -> Reply {
        Reply { tx, wake }
    }

    /// Whether `self` and `other` answer to the same place.
    pub fn same(&self, other: &Reply) -> bool {
        match (&self.wake, &other.wake) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    pub(super) fn send(&self, tickets: &[usize], failure: Option<Arc<str>>, seq: u64) {
        self.send_quietly(tickets, failure, seq);
        if let Some(wake) = &self.wake {
            // A full socket already holds a wake-up the loop has not read yet.
            let _ = (&**wake).write(&[1]);
        }
    }

    /// [`Reply::send`] without the wake-up (the loop reads its confirmations next).
    pub(super) fn send_quietly(&self, tickets: &[usize], failure: Option<Arc<str>>, seq: u64) {
        for &ticket in tickets {
            let _ = self.tx.send(Confirm {
                ticket,
                failure: failure.clone(),
                seq,
            });
        }
    }
}

/// The keys of some writes to be copied to one holder, and the tickets of those writes.
pub struct Batch {
    /// The keys (their state is read from the store when the batch is sent).
    pub keys: Vec<Vec<u8>>,
    /// The writes' tickets, each once.
    pub tickets: Vec<usize>,
    /// Where the outcome goes.
    pub reply: Reply,
    /// Every ticket is [`BEHIND`]: the batch may be held ([`COPY_LINGER`]).
    pub behind: bool,
}

/// Registers a socket in an event loop's epoll under an id; the loop then calls
/// [`Copies::ready`] with that id when the socket is ready.
pub type Register = Box<dyn Fn(RawFd, usize) -> std::io::Result<()> + Send + Sync>;

/// Answers owed to batches' replies: (reply, tickets, failure, copy clock).
pub(super) type Answers = Vec<(Reply, Vec<usize>, Option<Arc<str>>, u64)>;

/// Hands each answered batch its confirmations.
pub(super) fn answer(answers: Answers) {
    for (reply, tickets, failure, seq) in answers {
        reply.send(&tickets, failure, seq);
    }
}
