//! memcached's administration commands over the cache: `shutdown` (with `-A`),
//! `cache_memlimit`, `slabs reassign`, `stats detail`, `lru_crawler`. Each reply is
//! memcached 1.6's for the same request (checked by the wire tests against memcached
//! itself).
//!
//! kvlab has no slab pages (an item is one block, charged its real size), so
//! `slabs reassign` answers as memcached does when the source class has no spare page;
//! the size classes themselves ([`SizeClasses`]) are memcached's, so class numbers in
//! `lru_crawler` and the per-class stats mean what they mean there.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use kvlab_protocol::admin::uri_encode;
use kvlab_protocol::response as r;
use kvlab_protocol::{Admin, Cachedump, LruCrawler, ShutdownMode};
use kvlab_store::{ExportedItem, ScanCursor, SizeClasses, Store, MAX_CLASSES};
use parking_lot::{Condvar, Mutex};

use crate::auth::AuthFile;
use crate::class_counts::ClassEvictions;
use crate::crawler::{self, CrawlerStats};
use crate::detail::Detail;
use crate::watch::Watchers;

/// A request to stop the server (`shutdown`, a signal, `POST /shutdown`) and who waits
/// for it.
#[derive(Default)]
pub struct StopRequest {
    requested: Mutex<bool>,
    cv: Condvar,
}

impl StopRequest {
    /// Asks for the stop; returns at once.
    pub fn request(&self) {
        *self.requested.lock() = true;
        self.cv.notify_all();
    }

    /// Blocks until a stop is requested.
    pub fn wait(&self) {
        let mut requested = self.requested.lock();
        while !*requested {
            self.cv.wait(&mut requested);
        }
    }
}

/// memcached settings kvlab accepts for drop-in compatibility, each reported in `stats
/// settings` as given; what each does in kvlab's model is on its field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcceptedSettings {
    /// `-R`: memcached's most requests per connection per event (`None`: not given,
    /// shown as memcached's default, 20). Given, the `reactor` and `epoll` models answer at
    /// most that many of a connection's requests per turn of their loop (`conn_yields`
    /// counts the turns given up); not given, all of one read's requests at once.
    pub reqs_per_event: Option<u32>,
    /// `-B`: `ascii`, `binary` or `auto-negotiate` (the default); each connection
    /// speaks it ([`kvlab_protocol::Binding`]).
    pub binding_protocol: kvlab_protocol::Binding,
    /// `-o read_buf_mem_limit`, bytes (0: none, the default): the most all connections'
    /// buffers may grow by ([`kvlab_net::buffers`]).
    pub read_buf_mem_limit: u64,
    /// `-o lru_maintainer|no_lru_maintainer` (memcached's default: on; `-o no_modern`
    /// turns it off): kvlab keeps its LRU as it serves, with no maintainer thread, and
    /// lists the maintainer's fields in `stats` (all 0) as memcached does, only while on.
    pub lru_maintainer: bool,
}

impl Default for AcceptedSettings {
    fn default() -> Self {
        AcceptedSettings {
            reqs_per_event: None,
            binding_protocol: kvlab_protocol::Binding::Auto,
            read_buf_mem_limit: 0,
            lru_maintainer: true,
        }
    }
}

/// The settings and state the administration commands read and change.
pub struct AdminState {
    /// `-A`: `shutdown` is served.
    pub shutdown_command: bool,
    /// `slabs reassign` is allowed (memcached's default; `-o no_slab_reassign` refuses it).
    pub slab_reassign: bool,
    /// CAS values are kept and shown (memcached's default; `-C` turns them off: every CAS
    /// shown is 0 and no compare matches).
    pub cas_enabled: bool,
    /// `flush_all` is served (memcached's default; `-F` refuses it).
    pub flush_enabled: bool,
    /// `stats cachedump` and `lru_crawler metadump` are served (memcached's default; `-X`
    /// refuses them).
    pub dumps_enabled: bool,
    /// `watch` is served (memcached's default; `-W` refuses it).
    pub watch_enabled: bool,
    /// memcached's `-R`, `-B`, `-o read_buf_mem_limit`, `-o lru_maintainer` as given
    /// (see [`AcceptedSettings`]).
    pub accepted: AcceptedSettings,
    /// memcached's size classes for `-f`, `-n`, `-I`.
    pub classes: SizeClasses,
    /// Per-prefix figures (`stats detail`, `-D`).
    pub detail: Detail,
    /// The crawler thread's switch and kick.
    pub crawler: Arc<crawler::Control>,
    /// The crawler's figures (a pass running makes `lru_crawler crawl` answer `BUSY`).
    pub crawler_stats: Arc<CrawlerStats>,
    /// `lru_crawler tocrawl` as last set (kept and shown; kvlab's passes visit all).
    pub crawler_tocrawl: AtomicU64,
    /// `lru_crawler sleep` as last set, in µs (kept and shown).
    pub crawler_sleep_us: AtomicU64,
    /// The server's stop request.
    pub stop: Arc<StopRequest>,
    /// A `shutdown` was served (its connection closes; the server stops).
    pub shutting_down: AtomicBool,
    /// `watch` log streams.
    pub watchers: Arc<Watchers>,
    /// The open connections (`stats conns`).
    pub conns: Arc<crate::conns::Conns>,
    /// `-Y`: the users a connection must authenticate as first.
    pub auth: Option<AuthFile>,
    /// `-Z`: the TLS settings (for `stats settings`).
    pub tls: Option<crate::tls::TlsSettings>,
    /// Evictions by class (the store's eviction observer).
    pub evictions: Arc<ClassEvictions>,
}

impl AdminState {
    /// Defaults as memcached's: no `shutdown`, slab reassign allowed, default classes,
    /// detail off with `:`, the crawler on.
    pub fn new(stop: Arc<StopRequest>) -> AdminState {
        let watchers = Arc::new(Watchers::default());
        AdminState {
            evictions: Arc::new(ClassEvictions::new(
                SizeClasses::default(),
                watchers.clone(),
            )),
            watchers,
            conns: Arc::default(),
            auth: None,
            tls: None,
            shutdown_command: false,
            slab_reassign: true,
            cas_enabled: true,
            flush_enabled: true,
            dumps_enabled: true,
            watch_enabled: true,
            accepted: AcceptedSettings::default(),
            classes: SizeClasses::default(),
            detail: Detail::new(b':', false),
            crawler: crawler::Control::new(true),
            crawler_stats: Arc::default(),
            crawler_tocrawl: AtomicU64::new(0),
            crawler_sleep_us: AtomicU64::new(100),
            stop,
            shutting_down: AtomicBool::new(false),
        }
    }
}

/// What the connection does after an administration command.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Go on reading requests.
    Continue,
    /// Close it (`shutdown`: memcached closes the asking connection at once).
    Close,
}

/// Runs `cmd`, appending memcached's reply to `out`.
pub fn execute(state: &AdminState, store: &Store, cmd: Admin<'_>, out: &mut Vec<u8>) -> Next {
    match cmd {
        Admin::Shutdown(mode) => {
            if !state.shutdown_command {
                out.extend_from_slice(b"ERROR: shutdown not enabled\r\n");
                return Next::Continue;
            }
            if mode == ShutdownMode::Invalid {
                out.extend_from_slice(b"CLIENT_ERROR invalid shutdown mode\r\n");
                return Next::Continue;
            }
            // Both modes stop the server the way a signal does: stop accepting, send
            // every connection's composed replies, close, and (durable) write back.
            state.shutting_down.store(true, Relaxed);
            state.stop.request();
            return Next::Close;
        }
        Admin::CacheMemlimit { megabytes, noreply } => {
            let reply: &[u8] = match megabytes {
                None => r::ERROR,
                Some(mb) if mb < 8 => b"MEMLIMIT_TOO_SMALL cannot set maxbytes to less than 8m\r\n",
                Some(mb) if mb > 1_000_000_000 => {
                    b"MEMLIMIT_ADJUST_FAILED input value is megabytes not bytes\r\n"
                }
                Some(mb) => {
                    // At most 10^9 MiB: fits a usize on the 64-bit targets kvlab builds for.
                    let bytes = usize::try_from(mb << 20).unwrap_or(usize::MAX);
                    store.set_memory_limit(bytes);
                    r::OK
                }
            };
            if !noreply {
                out.extend_from_slice(reply);
            }
        }
        Admin::SlabsReassign { classes } => out.extend_from_slice(reassign(state, classes)),
        Admin::StatsDetail(action) => match action {
            b"on" | b"off" => {
                state.detail.set_enabled(action == b"on");
                out.extend_from_slice(r::OK);
            }
            b"dump" => state.detail.dump(out),
            _ => out.extend_from_slice(b"CLIENT_ERROR usage: stats detail on|off|dump\r\n"),
        },
        Admin::StatsCachedump(_) if !state.dumps_enabled => {
            out.extend_from_slice(b"CLIENT_ERROR stats cachedump not allowed\r\n")
        }
        Admin::StatsCachedump(dump) => cachedump(state, store, dump, out),
        Admin::LruCrawler(c) => lru_crawler(state, store, c, out),
        // The log streams are served by the session (see `crate::watch`); the engine
        // hands them over before they reach here.
        Admin::Watch { .. } => out.extend_from_slice(r::ERROR),
    }
    Next::Continue
}

/// memcached's `slabs reassign`: in order, disabled, bad numbers, same class, class
/// range (`-1` as the source asks memcached to pick one with a spare page: with none,
/// it stays -1 and is out of range), then the source's spare pages — which kvlab
/// never has.
fn reassign(state: &AdminState, classes: Option<(i64, i64)>) -> &'static [u8] {
    if !state.slab_reassign {
        return b"CLIENT_ERROR slab reassignment disabled\r\n";
    }
    let Some((src, dst)) = classes else {
        return b"CLIENT_ERROR bad command line format\r\n";
    };
    if src == dst {
        return b"SAME src and dst class are identical\r\n";
    }
    let largest = i64::from(state.classes.largest());
    if !(0..=largest).contains(&src) || !(0..=largest).contains(&dst) {
        return b"BADCLASS invalid src or dst class id\r\n";
    }
    b"NOSPARE source class has no spare pages\r\n"
}

/// Which classes an `lru_crawler` argument names: `all`, `hash` (every item) or a
/// comma-separated list of class ids 1..=63; `None` for anything else (`BADCLASS`).
fn class_filter(arg: &[u8]) -> Option<[bool; MAX_CLASSES as usize]> {
    let mut want = [false; MAX_CLASSES as usize];
    if arg == b"all" || arg == b"hash" {
        return Some([true; MAX_CLASSES as usize]);
    }
    // memcached splits with `strtok`: empty pieces (`1,`, `,2`) are skipped.
    for id in arg.split(|&b| b == b',').filter(|p| !p.is_empty()) {
        let id = std::str::from_utf8(id).ok()?.parse::<u32>().ok()?;
        if !(1..MAX_CLASSES).contains(&id) {
            return None;
        }
        want[id as usize] = true;
    }
    Some(want)
}

fn lru_crawler(state: &AdminState, store: &Store, cmd: LruCrawler<'_>, out: &mut Vec<u8>) {
    const DISABLED: &[u8] = b"CLIENT_ERROR lru crawler disabled\r\n";
    const BADCLASS: &[u8] = b"BADCLASS invalid class id\r\n";
    match cmd {
        LruCrawler::Crawl(arg) => {
            if !state.crawler.enabled() {
                return out.extend_from_slice(DISABLED);
            }
            // memcached's order: the class list, a pass running, then `hash` (a metadump
            // mode only: memcached fails to start such a crawl).
            if class_filter(arg).is_none() {
                return out.extend_from_slice(BADCLASS);
            }
            if state.crawler_stats.running.load(Relaxed) {
                return out.extend_from_slice(b"BUSY currently processing crawler request\r\n");
            }
            if arg == b"hash" {
                return out.extend_from_slice(b"ERROR an unknown error happened\r\n");
            }
            // kvlab's pass covers every class: reclaiming more expired items than asked
            // for is harmless.
            state.crawler.kick();
            out.extend_from_slice(r::OK);
        }
        LruCrawler::Metadump(_) if !state.dumps_enabled => {
            out.extend_from_slice(b"ERROR metadump not allowed\r\n")
        }
        LruCrawler::Metadump(arg) => {
            if !state.crawler.enabled() {
                return out.extend_from_slice(DISABLED);
            }
            match class_filter(arg) {
                Some(want) => metadump(state, store, &want, out),
                None => out.extend_from_slice(BADCLASS),
            }
        }
        LruCrawler::Tocrawl(n) => {
            state.crawler_tocrawl.store(n.unwrap_or(0), Relaxed);
            out.extend_from_slice(r::OK);
        }
        LruCrawler::Sleep(us) => match us {
            Some(us) if us <= 1_000_000 => {
                state.crawler_sleep_us.store(us, Relaxed);
                out.extend_from_slice(r::OK);
            }
            _ => out.extend_from_slice(b"CLIENT_ERROR sleep must be one second or less\r\n"),
        },
        LruCrawler::Enable | LruCrawler::Disable => {
            state.crawler.set_enabled(cmd == LruCrawler::Enable);
            out.extend_from_slice(r::OK);
        }
        LruCrawler::Unknown => out.extend_from_slice(r::ERROR),
    }
}

/// `stats cachedump <class> <limit>`: memcached's `ITEM <key> [<value bytes> b; <exptime>
/// s]` line (exptime as unix time, 0 for none) per live item of the class, newest first,
/// at most `limit` of them (0: all), then `END`; `CLIENT_ERROR Illegal slab id` for a
/// class past memcached's 63. memcached lists its class's cold LRU from its head: the
/// items most recently stored (or bumped) first. kvlab keeps one LRU and no store-wide
/// order of writes it can export, so "newest" is the item's last store or read, to the
/// second, and within one second the newer CAS of its shard (exact for items of one
/// shard; items of different shards stored in the same second may be listed in either
/// order). Like memcached's (which stops at 2 MB), the listing is bounded: at most 2 MB
/// of lines.
fn cachedump(state: &AdminState, store: &Store, dump: Cachedump, out: &mut Vec<u8>) {
    const MAX_BYTES: usize = 2 * 1024 * 1024;
    // The shortest line, `ITEM k [0 b; 0 s]\r\n`: no more lines fit in MAX_BYTES.
    const MAX_LINES: usize = MAX_BYTES / 19;
    let (class, limit) = match dump {
        Cachedump::Usage => return out.extend_from_slice(b"CLIENT_ERROR bad command line\r\n"),
        Cachedump::BadFormat => {
            return out.extend_from_slice(b"CLIENT_ERROR bad command line format\r\n")
        }
        Cachedump::List { class, limit } => (class, limit),
    };
    if class >= u64::from(MAX_CLASSES) {
        return out.extend_from_slice(b"CLIENT_ERROR Illegal slab id\r\n");
    }
    let keep = match usize::try_from(limit) {
        Ok(0) | Err(_) => MAX_LINES,
        Ok(n) => n.min(MAX_LINES),
    };
    // A CAS is a shard's sequence number above the shard's index bits.
    let shard_bits = store.config().shards.max(1).trailing_zeros();
    let newest =
        |item: &ExportedItem| std::cmp::Reverse((item.last_access(), item.cas() >> shard_bits));
    let mut found: Vec<ExportedItem> = Vec::new();
    let mut cursor = ScanCursor::default();
    let mut batch = Vec::new();
    loop {
        batch.clear();
        let step = store.scan(&mut cursor, 1024, &mut batch);
        for item in batch.drain(..) {
            let size = SizeClasses::item_size(item.key().len(), item.value().len(), item.flags());
            if u64::from(state.classes.class_of(size)) == class {
                found.push(item);
            }
        }
        // Only the newest `keep` can be listed: bound what is held while scanning.
        if found.len() >= 2 * keep.max(1024) {
            found.select_nth_unstable_by_key(keep - 1, newest);
            found.truncate(keep);
        }
        if step.done {
            break;
        }
    }
    found.sort_unstable_by_key(newest);
    found.truncate(keep);
    let mut written = 0;
    let mut line = Vec::new();
    let mut n = itoa::Buffer::new();
    for item in &found {
        line.clear();
        line.extend_from_slice(b"ITEM ");
        line.extend_from_slice(item.key());
        line.extend_from_slice(b" [");
        line.extend_from_slice(n.format(item.value().len()).as_bytes());
        line.extend_from_slice(b" b; ");
        line.extend_from_slice(n.format(item.exptime()).as_bytes());
        line.extend_from_slice(b" s]\r\n");
        // memcached's bound: the lines and its `END\r\n\0` within 2 MB.
        if written + line.len() + 6 > MAX_BYTES {
            break;
        }
        out.extend_from_slice(&line);
        written += line.len();
    }
    out.extend_from_slice(r::END);
}

/// memcached's metadump line per live item of the wanted classes, then `END`:
/// `key=<uri-encoded> exp=<unix or -1> la=<unix> cas=<n> fetch=<yes|no> cls=<id>
/// size=<bytes>`, each line ended by a bare `\n` as memcached writes it. The whole
/// dump is composed before it is sent (memcached streams it from its crawler thread):
/// about 100 bytes per item.
fn metadump(state: &AdminState, store: &Store, want: &[bool], out: &mut Vec<u8>) {
    let mut cursor = ScanCursor::default();
    let mut batch = Vec::new();
    let mut n = itoa::Buffer::new();
    loop {
        batch.clear();
        let step = store.scan(&mut cursor, 1024, &mut batch);
        for item in &batch {
            let (key, value) = (item.key(), item.value().len());
            let size = SizeClasses::item_size(key.len(), value, item.flags());
            let class = state.classes.class_of(size);
            if !want.get(class as usize).copied().unwrap_or(false) {
                continue;
            }
            out.extend_from_slice(b"key=");
            uri_encode(out, key);
            out.extend_from_slice(b" exp=");
            match item.exptime() {
                0 => out.extend_from_slice(b"-1"),
                t => out.extend_from_slice(n.format(t).as_bytes()),
            }
            out.extend_from_slice(b" la=");
            out.extend_from_slice(n.format(item.last_access()).as_bytes());
            out.extend_from_slice(b" cas=");
            out.extend_from_slice(n.format(item.cas()).as_bytes());
            out.extend_from_slice(if item.fetched() {
                b" fetch=yes"
            } else {
                b" fetch=no"
            });
            out.extend_from_slice(b" cls=");
            out.extend_from_slice(n.format(class).as_bytes());
            out.extend_from_slice(b" size=");
            out.extend_from_slice(n.format(size).as_bytes());
            out.push(b'\n');
        }
        if step.done {
            break;
        }
    }
    out.extend_from_slice(r::END);
}
