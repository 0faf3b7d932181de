//! `watch fetchers|mutations|evictions`: connections turned into log streams, as
//! memcached's logger serves them.
//!
//! ```text
//!  worker threads                          kvlab-watch (one thread, while any watcher)
//!   get/set … ─► Watchers::fetch/store       wait (≤ 100 ms or a wake)
//!     (one relaxed load when nobody            for each watcher: write what its socket
//!      watches that stream) ─► format the        takes (non-blocking); drop a watcher whose
//!      line, append it to each watcher's         peer closed or failed
//!      buffer under one mutex, wake ─────────►
//! ```
//!
//! A `watch` request hands its socket over ([`kvlab_net::Flow::HandOff`]) after its `OK`;
//! what the client sends afterwards is not read. Each watcher's buffer is bounded
//! (memcached's `watcher_logbuf_size`, 256 KiB): lines that do not fit are counted and
//! reported as memcached does (`skipped=N`) once there is room again, so a slow watcher
//! never holds memory or a worker up. Lines are memcached 1.6's:
//! `ts=<s>.<µs> gid=<n> type=item_get key=<uri> status=found|not_found clsid=<c> cfd=<fd>
//! size=<n>` and `type=item_store key=… status=stored|not_stored|exists|not_found|too_large|
//! no_memory cmd=set|add|replace|append|prepend|cas ttl=<s> clsid=… cfd=… size=…`, and
//! `type=eviction key=… fetch=yes|no ttl=<s or -1> la=<s ago> clsid=… size=…`.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kvlab_protocol::admin::uri_encode;
use kvlab_protocol::Watch;
use parking_lot::{Condvar, Mutex};

use crate::conns::Registration;

/// memcached's `watcher_logbuf_size`.
const BUFFER: usize = 256 * 1024;
/// Most watchers at once (memcached's `WATCHER_LIMIT`).
const LIMIT: usize = 20;

struct Watcher {
    /// Its place among the open connections (before `stream`: it leaves them before its
    /// socket closes).
    _conn: Option<Registration>,
    stream: TcpStream,
    streams: u16,
    buf: Vec<u8>,
    skipped: u64,
}

#[derive(Default)]
struct Inner {
    watchers: Vec<Watcher>,
    stopped: bool,
}

/// The watchers and the thread that writes to them.
#[derive(Default)]
pub struct Watchers {
    /// The union of every watcher's streams: what the hot path checks.
    active: AtomicU16,
    gid: AtomicU64,
    inner: Mutex<Inner>,
    cv: Condvar,
    thread: Mutex<Option<JoinHandle<()>>>,
    started: AtomicBool,
}

/// Why a watcher could not be added (memcached's replies).
#[derive(Debug, PartialEq, Eq)]
pub enum AddError {
    /// `WATCHER_TOO_MANY log watcher limit reached`
    TooMany,
    /// `WATCHER_FAILED failed to add log watcher`
    Failed,
}

impl Watchers {
    /// Whether anyone watches `stream` ([`Watch`] bits).
    #[inline]
    pub fn watching(&self, stream: u16) -> bool {
        self.active.load(Relaxed) & stream != 0
    }

    /// Whether another watcher can be added.
    pub fn check_room(&self) -> Result<(), AddError> {
        if self.inner.lock().watchers.len() >= LIMIT {
            return Err(AddError::TooMany);
        }
        Ok(())
    }

    /// Adds the socket of a connection that asked `watch` for `streams`, with the replies
    /// it is owed first (its `OK`), and its place among the open connections (`conn`,
    /// kept while it watches); starts the writing thread the first time. From here on the
    /// watcher hears of every event.
    pub fn add(
        self: &Arc<Self>,
        socket: OwnedFd,
        streams: u16,
        unsent: &[u8],
        conn: Option<Registration>,
    ) -> Result<(), AddError> {
        let stream = TcpStream::from(socket);
        stream.set_nonblocking(true).map_err(|_| AddError::Failed)?;
        {
            let mut inner = self.inner.lock();
            if inner.watchers.len() >= LIMIT {
                return Err(AddError::TooMany);
            }
            if let Some(c) = &conn {
                c.watching();
            }
            inner.watchers.push(Watcher {
                _conn: conn,
                stream,
                streams,
                buf: unsent.to_vec(),
                skipped: 0,
            });
            self.active.fetch_or(streams, Relaxed);
        }
        self.cv.notify_one();
        if !self.started.swap(true, Relaxed) {
            let me = self.clone();
            let spawned = std::thread::Builder::new()
                .name("kvlab-watch".into())
                .spawn(move || me.run());
            match spawned {
                Ok(t) => *self.thread.lock() = Some(t),
                Err(_) => return Err(AddError::Failed),
            }
        }
        Ok(())
    }

    /// Stops the thread and closes every watcher.
    pub fn stop(&self) {
        {
            let mut inner = self.inner.lock();
            inner.stopped = true;
            inner.watchers.clear();
            self.active.store(0, Relaxed);
        }
        self.cv.notify_all();
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }

    /// An item fetch (`found`: a hit), by a command with `key` from the connection on
    /// socket `cfd`: `class` and `size` (value bytes) of the item found.
    pub fn fetch(&self, key: &[u8], found: bool, class: u32, size: usize, cfd: i32) {
        self.log(Watch::FETCHERS, |out, n| {
            out.extend_from_slice(b" type=item_get key=");
            uri_encode(out, key);
            out.extend_from_slice(if found {
                b" status=found clsid="
            } else {
                b" status=not_found clsid="
            });
            out.extend_from_slice(n.format(class).as_bytes());
            out.extend_from_slice(b" cfd=");
            out.extend_from_slice(n.format(cfd).as_bytes());
            out.extend_from_slice(b" size=");
            out.extend_from_slice(n.format(size).as_bytes());
        });
    }

    /// An item store: `status` and `cmd` as memcached names them, `ttl` seconds from now
    /// (0: none), the new item's `class` and value `size`.
    #[allow(clippy::too_many_arguments)]
    pub fn store(
        &self,
        key: &[u8],
        status: &str,
        cmd: &str,
        ttl: u32,
        class: u32,
        size: usize,
        cfd: i32,
    ) {
        self.log(Watch::MUTATIONS, |out, n| {
            out.extend_from_slice(b" type=item_store key=");
            uri_encode(out, key);
            for (name, value) in [(&b" status="[..], status), (b" cmd=", cmd)] {
                out.extend_from_slice(name);
                out.extend_from_slice(value.as_bytes());
            }
            for (name, value) in [
                (&b" ttl="[..], i64::from(ttl)),
                (b" clsid=", i64::from(class)),
                (b" cfd=", i64::from(cfd)),
                (b" size=", size as i64),
            ] {
                out.extend_from_slice(name);
                out.extend_from_slice(n.format(value).as_bytes());
            }
        });
    }

    /// An eviction: `ttl` seconds left (-1: none), `idle` seconds since its last access.
    pub fn eviction(
        &self,
        key: &[u8],
        fetched: bool,
        ttl: i64,
        idle: u64,
        class: u32,
        size: usize,
    ) {
        self.log(Watch::EVICTIONS, |out, n| {
            out.extend_from_slice(b" type=eviction key=");
            uri_encode(out, key);
            out.extend_from_slice(if fetched { b" fetch=yes" } else { b" fetch=no" });
            for (name, value) in [
                (&b" ttl="[..], ttl),
                (b" la=", idle as i64),
                (b" clsid=", i64::from(class)),
                (b" size=", size as i64),
            ] {
                out.extend_from_slice(name);
                out.extend_from_slice(n.format(value).as_bytes());
            }
        });
    }

    /// Formats one line (`ts=… gid=…` then `body`) into every watcher of `stream`.
    fn log(&self, stream: u16, body: impl FnOnce(&mut Vec<u8>, &mut itoa::Buffer)) {
        if !self.watching(stream) {
            return;
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let gid = self.gid.fetch_add(1, Relaxed) + 1;
        let mut line = Vec::with_capacity(160);
        let mut n = itoa::Buffer::new();
        line.extend_from_slice(b"ts=");
        line.extend_from_slice(n.format(now.as_secs()).as_bytes());
        line.push(b'.');
        line.extend_from_slice(n.format(now.subsec_micros()).as_bytes());
        line.extend_from_slice(b" gid=");
        line.extend_from_slice(n.format(gid).as_bytes());
        body(&mut line, &mut n);
        line.push(b'\n');
        let mut inner = self.inner.lock();
        let mut wake = false;
        for w in inner
            .watchers
            .iter_mut()
            .filter(|w| w.streams & stream != 0)
        {
            if w.buf.len() + line.len() > BUFFER {
                w.skipped += 1;
            } else {
                // The thread is woken for a buffer's first line; later ones join it.
                wake |= w.buf.is_empty();
                w.buf.extend_from_slice(&line);
            }
        }
        drop(inner);
        if wake {
            self.cv.notify_one();
        }
    }

    fn run(&self) {
        let mut probe = [0u8; 256];
        let mut inner = self.inner.lock();
        while !inner.stopped {
            if inner.watchers.is_empty() {
                self.cv.wait(&mut inner);
            } else {
                // Also looks every 100 ms for watchers whose client went away.
                self.cv.wait_for(&mut inner, Duration::from_millis(100));
            }
            let before = inner.watchers.len();
            inner.watchers.retain_mut(|w| {
                // The client closed (or sent something: a watcher's input is not read,
                // memcached ignores it too).
                match w.stream.read(&mut probe) {
                    Ok(0) => return false,
                    Err(e) if e.kind() != io::ErrorKind::WouldBlock => return false,
                    _ => {}
                }
                if w.skipped > 0 && w.buf.len() + 32 <= BUFFER {
                    w.buf
                        .extend_from_slice(format!("skipped={}\n", w.skipped).as_bytes());
                    w.skipped = 0;
                }
                while !w.buf.is_empty() {
                    match w.stream.write(&w.buf) {
                        Ok(0) => return false,
                        Ok(n) => {
                            w.buf.drain(..n);
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) => return false,
                    }
                }
                true
            });
            if inner.watchers.len() != before {
                let streams = inner.watchers.iter().fold(0, |s, w| s | w.streams);
                self.active.store(streams, Relaxed);
            }
        }
    }
}
