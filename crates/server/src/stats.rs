//! Server-wide figures: connection counts, per-worker command counters, request
//! service-time histograms and, over a durable store, its engine figures (`durable_*`),
//! rendered as memcached `stats` lines, JSON (`/stats`) or Prometheus text.
//!
//! Each worker thread owns a [`WorkerStats`]; only that thread writes it (relaxed atomic
//! adds on its own cache lines), and readers sum over all workers when `stats` is asked.
//! Service times are buffered per batch by the worker and recorded into its histogram under
//! a mutex once per batch, so a reader never blocks the hot path for more than one batch.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use kvlab_store::{Figure, Kind, Policy, Store};
use parking_lot::Mutex;

use crate::admin::AdminState;
use crate::crawler::{CrawlerConfig, CrawlerStats};
use crate::slabs::ClassCounters;

/// Declares [`WorkerStats`]: each per-worker counter is one line of the table, which makes
/// the field, its `stats` name (the field's name) and its sum over the workers.
macro_rules! worker_counters {
    ($( $(#[doc = $doc:literal])* $field:ident, )*) => {
        /// Per-worker command counters; written by one thread, read by any.
        #[derive(Default)]
        #[repr(align(128))]
        pub struct WorkerStats {
            $( $(#[doc = $doc])* pub $field: AtomicU64, )*
            /// Request service times in nanoseconds (parse start to reply composed).
            pub service_ns: Mutex<Option<Histogram<u64>>>,
            /// The same service times in `stats latency`'s fixed buckets.
            pub service_buckets: LatencyBuckets,
            /// How long ready connections waited for this worker's event loop.
            pub wait_buckets: LatencyBuckets,
            /// memcached's per-class command counters (`stats slabs`, `stats items`).
            pub classes: ClassCounters,
        }

        impl WorkerStats {
            /// Each counter's name and value summed over `workers`, in the table's order.
            fn sums<'w>(workers: impl Iterator<Item = &'w WorkerStats> + Clone) -> Vec<Stat> {
                vec![$(Stat::count(
                    stringify!($field),
                    Kind::Counter,
                    workers.clone().map(|w| w.$field.load(Relaxed)).sum(),
                )),*]
            }

            fn reset_counters(&self) {
                $( self.$field.store(0, Relaxed); )*
            }
        }
    };
}

worker_counters! {
    /// Get-type commands (`get`/`gets`/`gat`/`gats`: one per key; REST `GET`).
    cmd_get,
    /// Storage commands (and REST `PUT`).
    cmd_set,
    /// `flush_all` commands.
    cmd_flush,
    /// Touches (`touch`, `gat`/`gats` per key).
    cmd_touch,
    /// Meta commands (`mg`, `ms`, `md`, `ma`, `mn`, `me`).
    cmd_meta,
    /// Bytes read from clients.
    bytes_read,
    /// Bytes written to clients.
    bytes_written,
    /// Requests answered with a protocol error.
    protocol_errors,
    /// Authentication attempts (`-Y`).
    auth_cmds,
    /// Failed authentication attempts (`-Y`).
    auth_errors,
    /// Cluster node: requests answered `MOVED` or `TRYAGAIN` instead of served.
    cluster_redirects,
    /// Turns a connection gave up with requests still buffered (`-R`).
    conn_yields,
}

impl WorkerStats {
    /// Adds `n` to one of a worker's counters (relaxed: only its own thread writes it).
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    /// Records a batch of service times (ns).
    pub fn record_service(&self, samples: &[u64]) {
        if samples.is_empty() {
            return;
        }
        for &s in samples {
            self.service_buckets.record(s);
        }
        let mut h = self.service_ns.lock();
        let h = h.get_or_insert_with(new_histogram);
        for &s in samples {
            h.saturating_record(s.max(1));
        }
    }

    fn reset(&self) {
        self.reset_counters();
        self.classes.reset();
        *self.service_ns.lock() = None;
        self.service_buckets.reset();
        self.wait_buckets.reset();
    }
}

/// Number of finite buckets of `stats latency`.
pub const LATENCY_BUCKETS: usize = 68;

/// Upper bounds (µs) of `stats latency`'s buckets: 1, 2, 3, 4, 5, 6, 8 µs, then ten per
/// decade (10, 12, 15, 20, 25, 30, 40, 50, 60, 80 × 10^k) up to 10 s. A percentile read
/// from them by interpolation is off by less than one bucket's width (at most a third of
/// its value), which is enough to compare against an SLO, and they are few enough to read
/// every 100 ms.
pub const LATENCY_BOUNDS_US: [u64; LATENCY_BUCKETS] = latency_bounds();

const fn latency_bounds() -> [u64; LATENCY_BUCKETS] {
    const SMALL: [u64; 7] = [1, 2, 3, 4, 5, 6, 8];
    const MANTISSAS: [u64; 10] = [10, 12, 15, 20, 25, 30, 40, 50, 60, 80];
    let mut b = [0; LATENCY_BUCKETS];
    let mut i = 0;
    while i < SMALL.len() {
        b[i] = SMALL[i];
        i += 1;
    }
    let mut scale = 1;
    while scale <= 100_000 {
        let mut m = 0;
        while m < MANTISSAS.len() {
            b[i] = MANTISSAS[m] * scale;
            i += 1;
            m += 1;
        }
        scale *= 10;
    }
    b[i] = 10_000_000;
    b
}

/// A latency histogram in [`LATENCY_BOUNDS_US`]' buckets (and one past the last), with the
/// values' sum: counts only ever grow (until `stats reset`), so a reader takes the
/// difference of two readings for the window between them. Written by one worker thread
/// (relaxed adds on its own lines), summed by readers.
pub struct LatencyBuckets {
    counts: [AtomicU64; LATENCY_BUCKETS + 1],
    sum_ns: AtomicU64,
}

impl Default for LatencyBuckets {
    fn default() -> Self {
        LatencyBuckets {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
        }
    }
}

impl LatencyBuckets {
    /// Counts one value (ns) in the first bucket whose bound is at least it.
    pub fn record(&self, ns: u64) {
        let i = LATENCY_BOUNDS_US.partition_point(|&b| b * 1000 < ns);
        self.counts[i].fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(ns, Relaxed);
    }

    fn reset(&self) {
        for c in &self.counts {
            c.store(0, Relaxed);
        }
        self.sum_ns.store(0, Relaxed);
    }

    /// `stats latency` lines of the sum over `all`, names starting with `prefix`: `_count`,
    /// `_sum_us`, then `_le_<bound µs>`: how many took at most that long (cumulative, as a
    /// Prometheus histogram's buckets).
    fn render<'b>(
        prefix: &str,
        all: impl Iterator<Item = &'b LatencyBuckets> + Clone,
    ) -> Vec<(String, u64)> {
        let counts: Vec<u64> = (0..=LATENCY_BUCKETS)
            .map(|i| all.clone().map(|b| b.counts[i].load(Relaxed)).sum())
            .collect();
        let sum_ns: u64 = all.map(|b| b.sum_ns.load(Relaxed)).sum();
        let mut out = vec![
            (format!("{prefix}_count"), counts.iter().sum()),
            (format!("{prefix}_sum_us"), sum_ns / 1000),
        ];
        let mut below = 0;
        for (bound, n) in LATENCY_BOUNDS_US.iter().zip(&counts) {
            below += n;
            out.push((format!("{prefix}_le_{bound}"), below));
        }
        out
    }
}

fn new_histogram() -> Histogram<u64> {
    // 1 ns .. 100 s at 3 significant digits.
    Histogram::new_with_bounds(1, 100_000_000_000, 3)
        .unwrap_or_else(|_| Histogram::new(3).unwrap_or_else(|_| unreachable!()))
}

/// Figures shared by the whole server.
pub struct ServerStats {
    /// When the server started.
    pub started: Instant,
    /// The same, as unix time.
    pub started_unix: u64,
    /// Open client connections.
    pub curr_connections: AtomicUsize,
    /// Connections ever accepted.
    pub total_connections: AtomicU64,
    /// Connections refused over `-c`.
    pub rejected_connections: AtomicU64,
    /// The bytes connections' buffers hold, against `-o read_buf_mem_limit`.
    pub buffers: Arc<kvlab_net::BufferBudget>,
    /// `-c`.
    pub max_connections: usize,
    /// `verbosity` as last set.
    pub verbosity: AtomicU64,
    /// `slabs automove` as last set (memcached's default: 1). kvlab has no slab classes to
    /// rebalance — its memory is accounted per item — so the setting is kept and reported.
    pub slab_automove: AtomicU64,
    /// One per worker thread.
    pub workers: Vec<Arc<WorkerStats>>,
    /// Counters of the REST front end (its requests count in `cmd_get`/`cmd_set` too).
    pub http: Arc<WorkerStats>,
    /// `-t`.
    pub threads: usize,
    /// `-I`.
    pub item_size_max: usize,
    /// The eviction policy.
    pub policy: Policy,
    /// The port the server listens on.
    pub port: u16,
    /// The I/O model's name.
    pub io_model: &'static str,
    /// The crawler's settings, `None` when it is off.
    pub crawler_config: Option<CrawlerConfig>,
    /// The crawler thread's figures.
    pub crawler: Arc<CrawlerStats>,
    /// What the administration commands read and change.
    pub admin: Arc<AdminState>,
    /// `-o idle_timeout`.
    pub idle_timeout: Option<std::time::Duration>,
    /// Connections closed for idling (memcached `idle_kicks`, shown with an idle timeout).
    pub idle_kicks: AtomicU64,
    /// `-b`: the listen backlog (`tcp_backlog`).
    pub backlog: u32,
    /// `-l`: the address listened on (`inter`).
    pub listen: std::net::IpAddr,
    /// Descriptors kept besides the connections' (`reserved_fds`).
    pub reserved_fds: usize,
    /// The listening socket (listed by `stats conns`).
    pub listen_fd: Option<std::os::fd::RawFd>,
}

/// `VERSION` reply: the memcached protocol level kvlab speaks, then kvlab's own version.
/// Clients parse the first `x.y.z` to decide which features the server has.
pub const VERSION: &str = concat!("1.6.21 kvlab-", env!("CARGO_PKG_VERSION"));

/// One line of a snapshot: a name in memcached's `stats`, its value, and how it moves.
#[derive(Clone, Debug, PartialEq)]
pub struct Stat {
    /// The `stats` name (`/stats` key; `/metrics` adds the `kvlab_` prefix).
    pub name: &'static str,
    /// Counter or gauge (a text value is neither and is left out of `/metrics`).
    pub kind: Kind,
    /// The value.
    pub value: StatValue,
}

/// A stat's value, typed so that each rendering (text, JSON, Prometheus) needs no parsing.
#[derive(Clone, Debug, PartialEq)]
pub enum StatValue {
    /// A whole number.
    Int(u64),
    /// A real number and the decimals it is printed with.
    Real(f64, usize),
    /// Text (`version`, `libevent`).
    Text(String),
}

impl Stat {
    fn count(name: &'static str, kind: Kind, value: u64) -> Stat {
        Stat {
            name,
            kind,
            value: StatValue::Int(value),
        }
    }

    fn real(name: &'static str, kind: Kind, value: f64, decimals: usize) -> Stat {
        Stat {
            name,
            kind,
            value: StatValue::Real(value, decimals),
        }
    }

    fn text(name: &'static str, value: impl Into<String>) -> Stat {
        Stat {
            name,
            kind: Kind::Gauge,
            value: StatValue::Text(value.into()),
        }
    }
}

impl From<Figure> for Stat {
    fn from(f: Figure) -> Stat {
        Stat::count(f.name, f.kind, f.value)
    }
}

impl std::fmt::Display for StatValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StatValue::Int(n) => write!(f, "{n}"),
            StatValue::Real(x, decimals) => write!(f, "{x:.decimals$}"),
            StatValue::Text(t) => f.write_str(t),
        }
    }
}

/// A point-in-time snapshot of every figure, in memcached's names.
pub struct Snapshot {
    /// `stats`: memcached 1.6's fields in its order (those of a mechanism memcached lists
    /// only while it is on, only then), then a durable store's `durable_*`.
    pub fields: Vec<Stat>,
    /// `stats kvlab`: kvlab's own figures (protocol errors, cluster redirects, service
    /// times).
    pub kvlab: Vec<Stat>,
}

impl Snapshot {
    /// Every figure: `stats`' then `stats kvlab`'s (what `/stats` and `/metrics` show).
    pub fn all(self) -> impl Iterator<Item = Stat> {
        self.fields.into_iter().chain(self.kvlab)
    }
}

/// memcached 1.6.18's `stats` fields in its order (`server_stats` and
/// `item_stats_totals`), with every optional one: `idle_kicks` (with an idle timeout),
/// `slab_reassign_*` and `slabs_moved` (while slab reassign is allowed),
/// `lru_crawler_running` and `lru_crawler_starts` (while the crawler is enabled), and the
/// LRU maintainer's `lru_maintainer_juggles`, `evicted_active`, `moves_*`,
/// `direct_reclaims` and `lru_bumps_dropped` (unless `-o no_lru_maintainer`).
const MEMCACHED_STATS: [&str; 94] = [
    "pid",
    "uptime",
    "time",
    "version",
    "libevent",
    "pointer_size",
    "rusage_user",
    "rusage_system",
    "max_connections",
    "curr_connections",
    "total_connections",
    "rejected_connections",
    "connection_structures",
    "response_obj_oom",
    "response_obj_count",
    "response_obj_bytes",
    "read_buf_count",
    "read_buf_bytes",
    "read_buf_bytes_free",
    "read_buf_oom",
    "reserved_fds",
    "cmd_get",
    "cmd_set",
    "cmd_flush",
    "cmd_touch",
    "cmd_meta",
    "get_hits",
    "get_misses",
    "get_expired",
    "get_flushed",
    "delete_misses",
    "delete_hits",
    "incr_misses",
    "incr_hits",
    "decr_misses",
    "decr_hits",
    "cas_misses",
    "cas_hits",
    "cas_badval",
    "touch_hits",
    "touch_misses",
    "store_too_large",
    "store_no_memory",
    "auth_cmds",
    "auth_errors",
    "idle_kicks",
    "bytes_read",
    "bytes_written",
    "limit_maxbytes",
    "accepting_conns",
    "listen_disabled_num",
    "time_in_listen_disabled_us",
    "threads",
    "conn_yields",
    "hash_power_level",
    "hash_bytes",
    "hash_is_expanding",
    "slab_reassign_rescues",
    "slab_reassign_chunk_rescues",
    "slab_reassign_evictions_nomem",
    "slab_reassign_inline_reclaim",
    "slab_reassign_busy_items",
    "slab_reassign_busy_deletes",
    "slab_reassign_running",
    "slabs_moved",
    "lru_crawler_running",
    "lru_crawler_starts",
    "lru_maintainer_juggles",
    "malloc_fails",
    "log_worker_dropped",
    "log_worker_written",
    "log_watcher_skipped",
    "log_watcher_sent",
    "log_watchers",
    "unexpected_napi_ids",
    "round_robin_fallback",
    "bytes",
    "curr_items",
    "total_items",
    "slab_global_page_pool",
    "expired_unfetched",
    "evicted_unfetched",
    "evicted_active",
    "evictions",
    "reclaimed",
    "crawler_reclaimed",
    "crawler_items_checked",
    "lrutail_reflocked",
    "moves_to_cold",
    "moves_to_warm",
    "moves_within_lru",
    "direct_reclaims",
    "lru_bumps_dropped",
    // Not memcached's: kept last in `stats` with a durable store (as memcached adds
    // extstore's fields when it has one); every other name goes to `stats kvlab`.
    "durable_",
];

/// Where a figure goes: its place among [`MEMCACHED_STATS`], or `None` for `stats kvlab`.
fn memcached_place(name: &str) -> Option<usize> {
    let durable = MEMCACHED_STATS.len() - 1;
    if name.starts_with(MEMCACHED_STATS[durable]) {
        return Some(durable);
    }
    MEMCACHED_STATS[..durable].iter().position(|n| *n == name)
}

impl ServerStats {
    /// Sums the workers' counters and reads the store into memcached's field list
    /// (`fields`) and kvlab's own (`kvlab`: the service-time percentiles and the counters
    /// memcached has no name for).
    pub fn snapshot(&self, store: &Store) -> Snapshot {
        use Kind::{Counter, Gauge};
        let load = |a: &AtomicU64| a.load(Relaxed);
        let (user, system) = rusage();
        let mut fields = vec![
            Stat::count("pid", Gauge, u64::from(std::process::id())),
            Stat::count("uptime", Counter, self.started.elapsed().as_secs()),
            Stat::count("time", Gauge, unix_now()),
            Stat::text("version", VERSION),
            Stat::text("libevent", "none"),
            Stat::count("pointer_size", Gauge, u64::from(usize::BITS)),
            Stat::real("rusage_user", Counter, user, 6),
            Stat::real("rusage_system", Counter, system, 6),
            Stat::count("max_connections", Gauge, self.max_connections as u64),
            Stat::count(
                "curr_connections",
                Gauge,
                self.curr_connections.load(Relaxed) as u64,
            ),
            Stat::count("total_connections", Counter, load(&self.total_connections)),
            Stat::count(
                "rejected_connections",
                Counter,
                load(&self.rejected_connections),
            ),
            // A session per open connection, freed on close.
            Stat::count(
                "connection_structures",
                Gauge,
                self.curr_connections.load(Relaxed) as u64,
            ),
        ];
        // memcached's response objects and shared read buffers: kvlab composes replies
        // into each connection's own output buffer and reads into its own input buffer,
        // so these are those buffers (no response objects, no free buffers kept) and the
        // refusals over `-o read_buf_mem_limit` (`kvlab_net::buffers`).
        let b = &self.buffers;
        fields.extend([
            Stat::count("response_obj_oom", Counter, b.reply_oom()),
            Stat::count("response_obj_count", Gauge, 0),
            Stat::count("response_obj_bytes", Gauge, b.output_bytes() as u64),
            Stat::count("read_buf_count", Gauge, b.input_buffers() as u64),
            Stat::count("read_buf_bytes", Gauge, b.input_bytes() as u64),
            Stat::count("read_buf_bytes_free", Gauge, 0),
            // kvlab's input buffer always grows to hold a request (`kvlab_net::buffers`).
            Stat::count("read_buf_oom", Counter, 0),
        ]);
        fields.push(Stat::count("reserved_fds", Gauge, self.reserved_fds as u64));
        if self.idle_timeout.is_some() {
            fields.push(Stat::count("idle_kicks", Counter, load(&self.idle_kicks)));
        }
        fields.extend(WorkerStats::sums(
            self.workers
                .iter()
                .map(Arc::as_ref)
                .chain([self.http.as_ref()]),
        ));
        fields.extend(store.stats().figures().into_iter().map(Stat::from));
        fields.extend([
            Stat::count("accepting_conns", Gauge, 1),
            // kvlab never stops listening: a connection over `-c` is told so and closed.
            Stat::count("listen_disabled_num", Counter, 0),
            Stat::count("time_in_listen_disabled_us", Counter, 0),
            Stat::count("threads", Gauge, self.threads as u64),
        ]);
        // Not in kvlab's model, 0: one hash table per shard that grows on its own (no
        // global power, no expansion thread); no slab pages to move; no LRU maintainer
        // or segmented LRU; no logger buffers (`watch` writes to its connection).
        let zero = |names: &[&'static str]| -> Vec<Stat> {
            names.iter().map(|&n| Stat::count(n, Gauge, 0)).collect()
        };
        fields.extend(zero(&[
            "hash_power_level",
            "hash_bytes",
            "hash_is_expanding",
        ]));
        if self.admin.slab_reassign {
            fields.extend(zero(&[
                "slab_reassign_rescues",
                "slab_reassign_chunk_rescues",
                "slab_reassign_evictions_nomem",
                "slab_reassign_inline_reclaim",
                "slab_reassign_busy_items",
                "slab_reassign_busy_deletes",
                "slab_reassign_running",
                "slabs_moved",
            ]));
        }
        if self.admin.crawler.enabled() {
            fields.extend([
                Stat::count(
                    "lru_crawler_running",
                    Gauge,
                    u64::from(self.crawler.running.load(Relaxed)),
                ),
                Stat::count("lru_crawler_starts", Counter, load(&self.crawler.starts)),
            ]);
        }
        fields.extend(zero(&[
            "malloc_fails",
            "log_worker_dropped",
            "log_worker_written",
            "log_watcher_skipped",
            "log_watcher_sent",
            "log_watchers",
            "unexpected_napi_ids",
            "round_robin_fallback",
            "slab_global_page_pool",
            "lrutail_reflocked",
        ]));
        if self.admin.accepted.lru_maintainer {
            fields.extend(zero(&[
                "lru_maintainer_juggles",
                "evicted_active",
                "moves_to_cold",
                "moves_to_warm",
                "moves_within_lru",
                "direct_reclaims",
                "lru_bumps_dropped",
            ]));
        }
        if let Some(d) = store.durable_stats() {
            fields.extend(d.figures().into_iter().map(Stat::from));
        }
        let (mut fields, mut kvlab): (Vec<Stat>, Vec<Stat>) = fields
            .into_iter()
            .partition(|s| memcached_place(s.name).is_some());
        // Stable: the `durable_*` figures keep their order. Each place is looked up once.
        fields.sort_by_cached_key(|s| memcached_place(s.name));
        let mut merged = new_histogram();
        for w in &self.workers {
            if let Some(h) = w.service_ns.lock().as_ref() {
                let _ = merged.add(h);
            }
        }
        kvlab.push(Stat::count("service_time_samples", Gauge, merged.len()));
        for (name, q) in SERVICE_QUANTILES {
            let us = if merged.is_empty() {
                0.0
            } else {
                merged.value_at_quantile(q) as f64 / 1000.0
            };
            kvlab.push(Stat::real(name, Gauge, us, 3));
        }
        Snapshot { fields, kvlab }
    }

    /// `stats latency`: the requests' service times and the ready connections' waits for
    /// their event loop as cumulative histograms ([`LatencyBuckets`]), summed over the
    /// workers.
    pub fn latency(&self) -> Vec<(String, u64)> {
        let workers = self.workers.iter().map(Arc::as_ref);
        let mut out =
            LatencyBuckets::render("service_time", workers.clone().map(|w| &w.service_buckets));
        out.extend(LatencyBuckets::render(
            "loop_wait",
            workers.map(|w| &w.wait_buckets),
        ));
        out
    }

    /// A server-wide record for unit tests that run an engine without a server.
    pub fn for_tests(workers: Vec<Arc<WorkerStats>>) -> ServerStats {
        ServerStats {
            started: Instant::now(),
            started_unix: unix_now(),
            curr_connections: AtomicUsize::new(0),
            total_connections: AtomicU64::new(0),
            rejected_connections: AtomicU64::new(0),
            buffers: Arc::default(),
            max_connections: 1024,
            verbosity: AtomicU64::new(0),
            slab_automove: AtomicU64::new(1),
            threads: workers.len(),
            workers,
            http: Arc::default(),
            item_size_max: 1024 * 1024,
            policy: Policy::Lru,
            port: 0,
            io_model: "none",
            crawler_config: None,
            crawler: Arc::default(),
            admin: Arc::new(AdminState::new(Arc::default())),
            idle_timeout: None,
            idle_kicks: AtomicU64::new(0),
            backlog: 1024,
            listen: std::net::IpAddr::from([127, 0, 0, 1]),
            reserved_fds: 64,
            listen_fd: None,
        }
    }

    /// `stats settings` lines.
    pub fn settings(&self, store: &Store) -> Vec<(&'static str, String)> {
        let mut all = self.process_settings(store);
        all.extend(
            Self::MEMCACHED_DEFAULTS
                .iter()
                .map(|&(name, value)| (name, value.to_string())),
        );
        // `-o lru_maintainer|no_lru_maintainer` as given (memcached's default: on), which
        // decides whether `stats` lists the maintainer's fields; kvlab has no such thread.
        let at = all
            .iter()
            .position(|(name, _)| *name == "lru_segmented")
            .unwrap_or(all.len());
        all.insert(
            at,
            (
                "lru_maintainer_thread",
                yes_no(self.admin.accepted.lru_maintainer).to_string(),
            ),
        );
        // `-X` as given, in memcached's place for it.
        let at = all
            .iter()
            .position(|(name, _)| *name == "hash_algorithm")
            .unwrap_or(all.len());
        all.insert(
            at,
            ("dump_enabled", yes_no(self.admin.dumps_enabled).to_string()),
        );
        all.extend(self.admin_settings());
        all.extend(self.tls_settings());
        all.extend(self.idle_and_crawler_settings());
        all
    }

    /// memcached's defaults for what kvlab has no use for (no slab pages to move, no segmented
    /// LRU, no logger buffers), shown as memcached shows them: `slab_automove_ratio` …
    /// `slab_automove_freeratio` (`lru_maintainer_thread`, as given, is put in its place).
    const MEMCACHED_DEFAULTS: [(&'static str, &'static str); 17] = [
        ("slab_automove_ratio", "0.80"),
        ("slab_automove_window", "30"),
        ("slab_chunk_max", "524288"),
        ("tail_repair_time", "0"),
        // kvlab's shards hash keys with hashbrown's default hasher.
        ("hash_algorithm", "foldhash"),
        ("lru_segmented", "no"),
        ("hot_lru_pct", "20"),
        ("warm_lru_pct", "40"),
        ("hot_max_factor", "0.20"),
        ("warm_max_factor", "2.00"),
        ("temp_lru", "no"),
        ("temporary_ttl", "61"),
        ("watcher_logbuf_size", "262144"),
        ("worker_logbuf_size", "65536"),
        ("track_sizes", "no"),
        ("inline_ascii_response", "no"),
        ("slab_automove_freeratio", "0.010"),
    ];

    /// The process, its listener and its store: `maxbytes` … `hashpower_init`.
    fn process_settings(&self, store: &Store) -> Vec<(&'static str, String)> {
        vec![
            ("maxbytes", store.stats().limit_maxbytes.to_string()),
            ("maxconns", self.max_connections.to_string()),
            ("tcpport", self.port.to_string()),
            ("udpport", "0".into()),
            ("inter", self.listen.to_string()),
            ("verbosity", self.verbosity.load(Relaxed).to_string()),
            ("oldest", "0".into()),
            (
                "slab_automove",
                self.slab_automove.load(Relaxed).to_string(),
            ),
            (
                "evictions",
                if self.policy == Policy::None {
                    "off"
                } else {
                    "on"
                }
                .to_string(),
            ),
            ("eviction_policy", self.policy.to_string()),
            ("domain_socket", "NULL".into()),
            ("umask", "700".into()),
            ("num_threads", self.threads.to_string()),
            ("num_threads_per_udp", self.threads.to_string()),
            ("tcp_backlog", self.backlog.to_string()),
            ("auth_enabled_sasl", "no".into()),
            ("maxconns_fast", "yes".into()),
            ("hashpower_init", "0".into()),
        ]
    }

    /// The item limit and the administration switches: `item_size_max` …
    /// `auth_enabled_ascii`.
    fn admin_settings(&self) -> Vec<(&'static str, String)> {
        vec![
            ("item_size_max", self.item_size_max.to_string()),
            ("cas_enabled", yes_no(self.admin.cas_enabled).to_string()),
            (
                "flush_enabled",
                yes_no(self.admin.flush_enabled).to_string(),
            ),
            (
                "reqs_per_event",
                self.admin
                    .accepted
                    .reqs_per_event
                    .unwrap_or(DEFAULT_REQS_PER_EVENT)
                    .to_string(),
            ),
            (
                "binding_protocol",
                self.admin.accepted.binding_protocol.to_string(),
            ),
            (
                "read_buf_mem_limit",
                self.admin.accepted.read_buf_mem_limit.to_string(),
            ),
            ("io_model", self.io_model.to_string()),
            (
                "shutdown_command",
                yes_no(self.admin.shutdown_command).to_string(),
            ),
            (
                "growth_factor",
                format!("{:.2}", self.admin.classes.factor()),
            ),
            ("chunk_size", self.admin.classes.chunk_size().to_string()),
            (
                "stat_key_prefix",
                char::from(self.admin.detail.delimiter()).to_string(),
            ),
            (
                "detail_enabled",
                yes_no(self.admin.detail.enabled()).to_string(),
            ),
            (
                "slab_reassign",
                yes_no(self.admin.slab_reassign).to_string(),
            ),
            (
                "auth_enabled_ascii",
                yes_no(self.admin.auth.is_some()).to_string(),
            ),
        ]
    }

    /// TLS: `ssl_enabled` … `ssl_min_version`.
    fn tls_settings(&self) -> Vec<(&'static str, String)> {
        vec![
            ("ssl_enabled", yes_no(self.admin.tls.is_some()).to_string()),
            (
                "ssl_verify_mode",
                self.admin
                    .tls
                    .as_ref()
                    .map_or(0, |t| t.verify_mode)
                    .to_string(),
            ),
            (
                "ssl_chain_cert",
                tls_path(
                    self.admin.tls.as_ref().and_then(|t| t.chain_cert.as_ref()),
                    "(null)",
                ),
            ),
            (
                "ssl_key",
                tls_path(
                    self.admin.tls.as_ref().and_then(|t| t.key.as_ref()),
                    "(null)",
                ),
            ),
            // PEM (memcached's SSL_FILETYPE_PEM).
            ("ssl_keyformat", "1".into()),
            // rustls chooses among its own suites; memcached's default list is NULL.
            ("ssl_ciphers", "NULL".into()),
            (
                "ssl_ca_cert",
                tls_path(
                    self.admin.tls.as_ref().and_then(|t| t.ca_cert.as_ref()),
                    "NULL",
                ),
            ),
            ("ssl_wbuf_size", "16384".into()),
            // rustls's session cache is not configurable here: reported off.
            ("ssl_session_cache", "no".into()),
            ("ssl_kernel_tls", "no".into()),
            // rustls speaks TLS 1.2 and 1.3.
            ("ssl_min_version", "tlsv1.2".into()),
        ]
    }

    /// What memcached lists last: `num_napi_ids` and `memory_file` (features kvlab does not
    /// have, shown unset), the idle timeout and the LRU crawler.
    fn idle_and_crawler_settings(&self) -> Vec<(&'static str, String)> {
        vec![
            ("num_napi_ids", "(null)".into()),
            ("memory_file", "(null)".into()),
            (
                "idle_timeout",
                self.idle_timeout.map_or(0, |t| t.as_secs()).to_string(),
            ),
            (
                "lru_crawler",
                yes_no(self.admin.crawler.enabled()).to_string(),
            ),
            (
                "lru_crawler_sleep",
                self.crawler_config
                    .map_or(0, |c| c.pause.as_micros())
                    .to_string(),
            ),
            (
                "lru_crawler_tocrawl",
                self.admin.crawler_tocrawl.load(Relaxed).to_string(),
            ),
            (
                "lru_crawler_interval_ms",
                self.crawler_config
                    .map_or(0, |c| c.interval.as_millis())
                    .to_string(),
            ),
        ]
    }

    /// Every worker's counters, the REST front end's included.
    pub fn all_workers(&self) -> Vec<&WorkerStats> {
        self.workers
            .iter()
            .chain([&self.http])
            .map(Arc::as_ref)
            .collect()
    }

    /// `stats reset`, as memcached's: zero every counter — the workers' (`cmd_*`, bytes),
    /// the store's (hits, misses, `total_items`, evictions, reclaims), the per-class ones
    /// of `stats items`, the crawler's starts; state (`curr_items`, `bytes`, connections
    /// open, settings) stays. A durable store's `durable_*` figures (kvlab's own) stay.
    pub fn reset(&self, store: &Store) {
        store.reset_stats();
        self.admin.evictions.reset();
        self.crawler.starts.store(0, Relaxed);
        self.total_connections.store(0, Relaxed);
        self.rejected_connections.store(0, Relaxed);
        self.buffers.reset();
        self.idle_kicks.store(0, Relaxed);
        for w in self.workers.iter().chain([&self.http]) {
            w.reset();
        }
    }
}

/// A TLS file setting as memcached shows it: the path, or memcached's word for unset.
fn tls_path(path: Option<&std::path::PathBuf>, unset: &str) -> String {
    path.map_or_else(|| unset.to_string(), |p| p.display().to_string())
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// memcached's `-R` default, shown in `stats settings` when `-R` is not given.
const DEFAULT_REQS_PER_EVENT: u32 = 20;

/// Service-time percentiles of `stats kvlab` (microseconds).
pub const SERVICE_QUANTILES: [(&str, f64); 5] = [
    ("service_time_p50_us", 0.50),
    ("service_time_p90_us", 0.90),
    ("service_time_p99_us", 0.99),
    ("service_time_p999_us", 0.999),
    ("service_time_max_us", 1.0),
];

/// Now, as unix seconds.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn rusage() -> (f64, f64) {
    // SAFETY: getrusage only writes into the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a rusage struct.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return (0.0, 0.0);
    }
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    (t(ru.ru_utime), t(ru.ru_stime))
}

/// Renders a snapshot in the Prometheus text exposition format (`kvlab_` prefix); text
/// figures are left out.
pub fn prometheus(snapshot: &Snapshot) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for stat in snapshot.fields.iter().chain(&snapshot.kvlab) {
        if matches!(stat.value, StatValue::Text(_)) {
            continue;
        }
        let kind = match stat.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        };
        let (name, value) = (stat.name, &stat.value);
        let _ = writeln!(out, "# TYPE kvlab_{name} {kind}\nkvlab_{name} {value}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_bounds_grow_by_at_most_a_half() {
        assert_eq!(LATENCY_BOUNDS_US[0], 1);
        assert_eq!(LATENCY_BOUNDS_US[LATENCY_BUCKETS - 1], 10_000_000);
        for w in LATENCY_BOUNDS_US.windows(2) {
            assert!(w[0] < w[1], "{w:?}");
            assert!(w[1] * 2 <= w[0] * 3 || w[0] < 10, "{w:?}");
        }
    }

    #[test]
    fn latency_buckets_count_cumulatively_by_bound() {
        let w = WorkerStats::default();
        // 0.5 µs and 1 µs in the first bucket, 1.001 µs in the second, 900 µs in le_1000,
        // 20 s past every bound.
        w.record_service(&[500, 1000, 1001, 900_000, 20_000_000_000]);
        let lines: std::collections::HashMap<String, u64> =
            LatencyBuckets::render("s", [&w.service_buckets].into_iter())
                .into_iter()
                .collect();
        assert_eq!(lines["s_count"], 5);
        assert_eq!(
            lines["s_sum_us"],
            (500 + 1000 + 1001 + 900_000 + 20_000_000_000) / 1000
        );
        assert_eq!(lines["s_le_1"], 2);
        assert_eq!(lines["s_le_2"], 3);
        assert_eq!(lines["s_le_800"], 3);
        assert_eq!(lines["s_le_1000"], 4);
        assert_eq!(lines["s_le_10000000"], 4);
        w.reset();
        let lines = LatencyBuckets::render("s", [&w.service_buckets].into_iter());
        assert!(lines.iter().all(|(_, n)| *n == 0));
    }
}
