//! Server-wide figures: connection counts, per-worker command counters, request
//! service-time histograms and, over a durable store, its engine figures (`durable_*`),
//! rendered as memcached `stats` lines, JSON (`/stats`) or Prometheus text.
//!
//! Each worker thread owns a [`WorkerStats`]; only that thread writes it (relaxed atomic
//! adds on its own cache lines), and readers sum over all workers when `stats` is asked.
//! Service times are buffered per batch by the worker and recorded into its histogram under
//! a mutex once per batch, so a reader never blocks the hot path for more than one batch.
//!
//! This file holds [`ServerStats`] and its snapshot; `counters` the per-worker counters and
//! latency buckets, `render` a snapshot's lines and their formats, `settings` the
//! `stats settings` lines.

mod counters;
mod render;
mod settings;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use kvlab_store::{Kind, Policy, Store};

use crate::admin::AdminState;
use crate::crawler::{CrawlerConfig, CrawlerStats};

use counters::new_histogram;
pub use counters::{LatencyBuckets, WorkerStats, LATENCY_BOUNDS_US, LATENCY_BUCKETS};
use render::memcached_place;
pub use render::{prometheus, Snapshot, Stat, StatValue};

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
