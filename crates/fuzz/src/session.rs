//! A whole connection: the sans-I/O session over the cache engine and a real store.
//!
//! The same byte stream is fed twice to fresh, identical servers: once as it comes, once cut
//! into chunks of fuzzer-chosen sizes (as reads from a socket would be). The replies must be
//! the same byte for byte, apart from `STAT` lines (uptime, rusage), and the session's input
//! buffer must stay within the parser's bounds.

use std::sync::Arc;

use kvlab_protocol::Limits;
use kvlab_server::admin::AdminState;
use kvlab_server::auth::AuthFile;
use kvlab_server::stats::{ServerStats, WorkerStats};
use kvlab_server::{Engine, Session};
use kvlab_store::{ManualClock, Policy, Store, StoreConfig};

/// What the first byte chooses.
#[derive(Clone, Copy, Debug)]
struct Setup {
    /// Small limits: 1 KiB values, 2 MiB of memory (evictions, "too large" with short input).
    small: bool,
    /// `-Y`: the connection must authenticate first (`set x 0 0 11` / `user secret`).
    auth: bool,
    policy: Policy,
}

impl Setup {
    fn from(byte: u8) -> Setup {
        Setup {
            small: byte & 1 != 0,
            auth: byte & 2 != 0,
            policy: match (byte >> 2) & 3 {
                0 | 3 => Policy::Lru,
                1 => Policy::Lfu,
                _ => Policy::Fifo,
            },
        }
    }

    /// The parser's limits. A command line longer than `max_line` that arrives in pieces
    /// closes the connection, while the same line arriving whole is served (as memcached
    /// does): that depends on the reads by design, so here lines may be as long as
    /// retrievals, and the `request` target covers the short limit.
    fn limits(&self) -> Limits {
        let defaults = Limits::default();
        Limits {
            item_size_max: if self.small {
                1024
            } else {
                defaults.item_size_max
            },
            max_line: defaults.max_get_line,
            max_get_line: defaults.max_get_line,
            binding: defaults.binding,
        }
    }

    fn engine(&self) -> Engine {
        let config = StoreConfig {
            memory_limit: if self.small { 2 << 20 } else { 64 << 20 },
            item_size_max: self.limits().item_size_max,
            policy: self.policy,
            shards: 1,
            max_items: 0,
        };
        let store = Arc::new(Store::new(
            config,
            Arc::new(ManualClock::new(1_800_000_000)),
        ));
        let worker = Arc::new(WorkerStats::default());
        let mut stats = ServerStats::for_tests(vec![worker.clone()]);
        if self.auth {
            let mut admin = AdminState::new(Arc::default());
            admin.auth = AuthFile::parse(b"user:secret\n").ok();
            stats.admin = Arc::new(admin);
        }
        Engine::new(store, Arc::new(stats), worker)
    }
}

/// Byte 0 picks the setup, bytes 1 and 2 seed the chunk sizes; the rest is the stream.
pub fn check(data: &[u8]) {
    let (select, rest) = crate::selector(data);
    let (seed, stream) = match rest {
        [a, b, stream @ ..] => (u16::from_le_bytes([*a, *b]), stream),
        _ => return,
    };
    let setup = Setup::from(select);
    let whole = replies(setup, stream, &mut std::iter::repeat(usize::MAX));
    let mut chunks = Chunks::new(seed);
    let split = replies(setup, stream, &mut chunks);
    if whole != split {
        let (w, s) = (
            String::from_utf8_lossy(&whole),
            String::from_utf8_lossy(&split),
        );
        panic!("replies differ with the stream split\nwhole: {w:?}\nsplit: {s:?}");
    }
}

/// Chunk sizes from a seed: a maximum of 1 to 64 bytes, then sizes up to it (xorshift).
struct Chunks {
    state: u32,
    max: u32,
}

impl Chunks {
    fn new(seed: u16) -> Chunks {
        Chunks {
            state: u32::from(seed) | 0x1_0000,
            max: u32::from(seed % 64) + 1,
        }
    }
}

impl Iterator for Chunks {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        let mut x = self.state;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.state = x;
        Some((x % self.max + 1) as usize)
    }
}

/// Feeds `stream` in chunks, writing every reply out as a driver would, and returns the
/// replies without their `STAT` lines.
fn replies(setup: Setup, stream: &[u8], chunks: &mut dyn Iterator<Item = usize>) -> Vec<u8> {
    let limits = setup.limits();
    let bound = 2 * (limits.item_size_max + limits.max_get_line.max(limits.max_line) + 2);
    let mut engine = setup.engine();
    let mut session: Session = Session::new(limits);
    let mut out = Vec::new();
    let mut at = 0;
    // Every round reads a chunk (if the session wants one) or drains what is buffered; a
    // round that does neither ends the run. Rounds are bounded by the stream's length.
    for _ in 0..=2 * stream.len() + 2 {
        let mut progress = false;
        if at < stream.len() && session.wants_read() {
            let space = session.read_space();
            let n = space
                .len()
                .min(stream.len() - at)
                .min(chunks.next().unwrap_or(1));
            space[..n].copy_from_slice(&stream[at..at + n]);
            session.filled(n);
            at += n;
            progress = n > 0;
        }
        session.process_inline(&mut engine);
        assert!(
            session.input_capacity() <= bound,
            "input buffer {} above {bound}",
            session.input_capacity()
        );
        let written = session.output();
        progress |= !written.is_empty();
        out.extend_from_slice(written);
        let n = written.len();
        session.wrote(n);
        if session.is_closing() || !progress {
            break;
        }
    }
    without_stats(&out)
}

/// The replies with `STAT ` lines left out (their figures differ from run to run).
fn without_stats(out: &[u8]) -> Vec<u8> {
    let mut kept = Vec::with_capacity(out.len());
    for line in out.split_inclusive(|&b| b == b'\n') {
        if !line.starts_with(b"STAT ") {
            kept.extend_from_slice(line);
        }
    }
    kept
}
