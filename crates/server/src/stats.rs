//! Server-wide figures: connection counts, per-worker command counters, request
//! service-time histograms and, over a durable store, its engine figures (`durable_*`),
//! rendered as memcached `stats` lines, JSON (`/stats`) or Prometheus text.
//!
//! Each worker thread owns a [`WorkerStats`]; only that thread writes it (relaxed atomic
//! adds on its own cache lines), and readers sum over all workers when `stats` is asked.
//! Service times are buffered per batch by the worker and recorded into its histogram under
//! a mutex once per batch, so a reader never blocks the hot path for more than one batch.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use kvlab_store::{DurableStats, Store, StoreStats};
use parking_lot::Mutex;

use crate::crawler::CrawlerConfig;

/// Per-worker command counters; written by one thread, read by any.
#[derive(Default)]
#[repr(align(128))]
pub struct WorkerStats {
    pub cmd_get: AtomicU64,
    pub cmd_set: AtomicU64,
    pub cmd_touch: AtomicU64,
    pub cmd_flush: AtomicU64,
    pub cmd_meta: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub protocol_errors: AtomicU64,
    /// Request service times in nanoseconds (parse start to reply composed).
    pub service_ns: Mutex<Option<Histogram<u64>>>,
}

impl WorkerStats {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    /// Records a batch of service times (ns).
    pub fn record_service(&self, samples: &[u64]) {
        if samples.is_empty() {
            return;
        }
        let mut h = self.service_ns.lock();
        let h = h.get_or_insert_with(new_histogram);
        for &s in samples {
            h.saturating_record(s.max(1));
        }
    }

    fn reset(&self) {
        for c in [
            &self.cmd_get,
            &self.cmd_set,
            &self.cmd_touch,
            &self.cmd_flush,
            &self.cmd_meta,
            &self.bytes_read,
            &self.bytes_written,
            &self.protocol_errors,
        ] {
            c.store(0, Relaxed);
        }
        *self.service_ns.lock() = None;
    }
}

fn new_histogram() -> Histogram<u64> {
    // 1 ns .. 100 s at 3 significant digits.
    Histogram::new_with_bounds(1, 100_000_000_000, 3)
        .unwrap_or_else(|_| Histogram::new(3).unwrap_or_else(|_| unreachable!()))
}

/// Figures shared by the whole server.
pub struct ServerStats {
    pub started: Instant,
    pub started_unix: u64,
    pub curr_connections: AtomicUsize,
    pub total_connections: AtomicU64,
    pub rejected_connections: AtomicU64,
    pub max_connections: usize,
    pub verbosity: AtomicU64,
    pub workers: Vec<Arc<WorkerStats>>,
    /// Counters of the REST front end (its requests count in `cmd_get`/`cmd_set` too).
    pub http: Arc<WorkerStats>,
    pub threads: usize,
    pub item_size_max: usize,
    pub policy: String,
    pub port: u16,
    pub io_model: &'static str,
    /// The crawler's settings, `None` when it is off.
    pub crawler_config: Option<CrawlerConfig>,
    pub crawler: CrawlerStats,
}

/// The crawler thread's own figures (what it reclaims is counted by the store).
#[derive(Default)]
pub struct CrawlerStats {
    /// A pass is in progress (memcached `lru_crawler_running`).
    pub running: AtomicBool,
    /// Passes started (memcached `lru_crawler_starts`).
    pub starts: AtomicU64,
}

/// `VERSION` reply: the memcached protocol level kvlab speaks, then kvlab's own version.
/// Clients parse the first `x.y.z` to decide which features the server has.
pub const VERSION: &str = concat!("1.6.21 kvlab-", env!("CARGO_PKG_VERSION"));

/// A point-in-time snapshot of every figure, in memcached's names.
pub struct Snapshot {
    pub fields: Vec<(&'static str, String)>,
}

impl ServerStats {
    /// Sums the workers' counters and reads the store into memcached's field list, with
    /// kvlab's service-time percentiles appended.
    pub fn snapshot(&self, store: &Store) -> Snapshot {
        let now_unix = unix_now();
        let s: StoreStats = store.stats();
        let sum = |f: fn(&WorkerStats) -> &AtomicU64| -> u64 {
            self.workers
                .iter()
                .chain([&self.http])
                .map(|w| f(w).load(Relaxed))
                .sum()
        };
        let (user, system) = rusage();
        let mut fields: Vec<(&'static str, String)> = vec![
            ("pid", std::process::id().to_string()),
            ("uptime", self.started.elapsed().as_secs().to_string()),
            ("time", now_unix.to_string()),
            ("version", VERSION.to_string()),
            ("libevent", "none".to_string()),
            ("pointer_size", (usize::BITS).to_string()),
            ("rusage_user", format!("{user:.6}")),
            ("rusage_system", format!("{system:.6}")),
            ("max_connections", self.max_connections.to_string()),
            (
                "curr_connections",
                self.curr_connections.load(Relaxed).to_string(),
            ),
            (
                "total_connections",
                self.total_connections.load(Relaxed).to_string(),
            ),
            (
                "rejected_connections",
                self.rejected_connections.load(Relaxed).to_string(),
            ),
            ("cmd_get", sum(|w| &w.cmd_get).to_string()),
            ("cmd_set", sum(|w| &w.cmd_set).to_string()),
            ("cmd_flush", sum(|w| &w.cmd_flush).to_string()),
            ("cmd_touch", sum(|w| &w.cmd_touch).to_string()),
            ("cmd_meta", sum(|w| &w.cmd_meta).to_string()),
            ("get_hits", s.get_hits.to_string()),
            ("get_misses", s.get_misses.to_string()),
            ("get_expired", s.get_expired.to_string()),
            ("get_flushed", s.get_flushed.to_string()),
            ("delete_misses", s.delete_misses.to_string()),
            ("delete_hits", s.delete_hits.to_string()),
            ("incr_misses", s.incr_misses.to_string()),
            ("incr_hits", s.incr_hits.to_string()),
            ("decr_misses", s.decr_misses.to_string()),
            ("decr_hits", s.decr_hits.to_string()),
            ("cas_misses", s.cas_misses.to_string()),
            ("cas_hits", s.cas_hits.to_string()),
            ("cas_badval", s.cas_badval.to_string()),
            ("touch_hits", s.touch_hits.to_string()),
            ("touch_misses", s.touch_misses.to_string()),
            ("bytes_read", sum(|w| &w.bytes_read).to_string()),
            ("bytes_written", sum(|w| &w.bytes_written).to_string()),
            ("protocol_errors", sum(|w| &w.protocol_errors).to_string()),
            ("limit_maxbytes", s.limit_maxbytes.to_string()),
            ("accepting_conns", "1".to_string()),
            ("threads", self.threads.to_string()),
            ("bytes", s.bytes.to_string()),
            ("curr_items", s.curr_items.to_string()),
            ("total_items", s.total_items.to_string()),
            ("expired_unfetched", s.expired_unfetched.to_string()),
            ("evicted_unfetched", s.evicted_unfetched.to_string()),
            ("evictions", s.evictions.to_string()),
            ("reclaimed", s.reclaimed.to_string()),
            ("crawler_reclaimed", s.crawler_reclaimed.to_string()),
            ("crawler_items_checked", s.crawler_items_checked.to_string()),
            ("store_too_large", s.store_too_large.to_string()),
            ("store_no_memory", s.store_no_memory.to_string()),
            (
                "lru_crawler_running",
                u8::from(self.crawler.running.load(Relaxed)).to_string(),
            ),
            (
                "lru_crawler_starts",
                self.crawler.starts.load(Relaxed).to_string(),
            ),
        ];
        if let Some(d) = store.durable_stats() {
            fields.extend(durable_fields(&d));
        }
        let mut merged = new_histogram();
        for w in &self.workers {
            if let Some(h) = w.service_ns.lock().as_ref() {
                let _ = merged.add(h);
            }
        }
        fields.push(("service_time_samples", merged.len().to_string()));
        for (name, q) in SERVICE_QUANTILES {
            let us = if merged.is_empty() {
                0.0
            } else {
                merged.value_at_quantile(q) as f64 / 1000.0
            };
            fields.push((name, format!("{us:.3}")));
        }
        Snapshot { fields }
    }

    /// A server-wide record for unit tests that run an engine without a server.
    pub fn for_tests(workers: Vec<Arc<WorkerStats>>) -> ServerStats {
        ServerStats {
            started: Instant::now(),
            started_unix: unix_now(),
            curr_connections: AtomicUsize::new(0),
            total_connections: AtomicU64::new(0),
            rejected_connections: AtomicU64::new(0),
            max_connections: 1024,
            verbosity: AtomicU64::new(0),
            threads: workers.len(),
            workers,
            http: Arc::default(),
            item_size_max: 1024 * 1024,
            policy: "lru".into(),
            port: 0,
            io_model: "none",
            crawler_config: None,
            crawler: CrawlerStats::default(),
        }
    }

    /// `stats settings` lines.
    pub fn settings(&self, store: &Store) -> Vec<(&'static str, String)> {
        vec![
            ("maxbytes", store.stats().limit_maxbytes.to_string()),
            ("maxconns", self.max_connections.to_string()),
            ("tcpport", self.port.to_string()),
            ("verbosity", self.verbosity.load(Relaxed).to_string()),
            (
                "evictions",
                if self.policy == "none" { "off" } else { "on" }.to_string(),
            ),
            ("eviction_policy", self.policy.clone()),
            ("num_threads", self.threads.to_string()),
            ("item_size_max", self.item_size_max.to_string()),
            ("cas_enabled", "yes".to_string()),
            ("io_model", self.io_model.to_string()),
            (
                "lru_crawler",
                if self.crawler_config.is_some() {
                    "yes"
                } else {
                    "no"
                }
                .to_string(),
            ),
            (
                "lru_crawler_sleep",
                self.crawler_config
                    .map_or(0, |c| c.pause.as_micros())
                    .to_string(),
            ),
            (
                "lru_crawler_interval_ms",
                self.crawler_config
                    .map_or(0, |c| c.interval.as_millis())
                    .to_string(),
            ),
        ]
    }

    /// `stats reset`: zero the counters (store counters are cumulative and stay).
    pub fn reset(&self) {
        self.total_connections.store(0, Relaxed);
        self.rejected_connections.store(0, Relaxed);
        for w in self.workers.iter().chain([&self.http]) {
            w.reset();
        }
    }
}

/// The durable store's engine figures (only for a store with `--data-dir`).
fn durable_fields(d: &DurableStats) -> [(&'static str, String); 10] {
    [
        // Read-through misses served from the engine.
        ("durable_reads", d.reads.to_string()),
        // Engine batches (commit rounds and purge batches).
        ("durable_commits", d.commits.to_string()),
        ("durable_fsyncs", d.fsyncs.to_string()),
        // Item puts and deletes written.
        ("durable_items_written", d.items_written.to_string()),
        ("durable_persists", d.persists.to_string()),
        // Bytes of changes queued for the engine (write-behind and tombstones).
        ("durable_queued_bytes", d.pending_bytes.to_string()),
        ("durable_flush_errors", d.flush_errors.to_string()),
        // Dead records (flushed or expired) deleted from the engine.
        ("durable_purged", d.purged.to_string()),
        ("durable_purge_scanned", d.purge_scanned.to_string()),
        ("durable_purge_passes", d.purge_passes.to_string()),
    ]
}

/// Service-time percentiles appended to `stats` (microseconds).
pub const SERVICE_QUANTILES: [(&str, f64); 5] = [
    ("service_time_p50_us", 0.50),
    ("service_time_p90_us", 0.90),
    ("service_time_p99_us", 0.99),
    ("service_time_p999_us", 0.999),
    ("service_time_max_us", 1.0),
];

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

/// Renders a snapshot in the Prometheus text exposition format (`kvlab_` prefix).
pub fn prometheus(snapshot: &Snapshot) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for (name, value) in &snapshot.fields {
        if value.parse::<f64>().is_err() {
            continue;
        }
        let kind = if COUNTERS.contains(name) {
            "counter"
        } else {
            "gauge"
        };
        let _ = writeln!(out, "# TYPE kvlab_{name} {kind}\nkvlab_{name} {value}");
    }
    out
}

const COUNTERS: &[&str] = &[
    "total_connections",
    "rejected_connections",
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
    "bytes_read",
    "bytes_written",
    "protocol_errors",
    "total_items",
    "expired_unfetched",
    "evicted_unfetched",
    "evictions",
    "reclaimed",
    "crawler_reclaimed",
    "crawler_items_checked",
    "lru_crawler_starts",
    "store_too_large",
    "store_no_memory",
    "durable_reads",
    "durable_commits",
    "durable_fsyncs",
    "durable_items_written",
    "durable_persists",
    "durable_flush_errors",
    "durable_purged",
    "durable_purge_scanned",
    "durable_purge_passes",
    "rusage_user",
    "rusage_system",
];
