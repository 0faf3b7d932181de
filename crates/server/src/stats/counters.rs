//! The per-worker counters ([`WorkerStats`], one table of `stats` names) and the fixed
//! latency buckets of `stats latency` ([`LatencyBuckets`]).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use hdrhistogram::Histogram;
use kvlab_store::Kind;
use parking_lot::Mutex;

use super::Stat;
use crate::class_counts::ClassCounters;

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
            pub(super) fn sums<'w>(workers: impl Iterator<Item = &'w WorkerStats> + Clone) -> Vec<Stat> {
                vec![$(Stat::count(
                    stringify!($field),
                    Kind::Counter,
                    workers.clone().map(|w| w.$field.load(Relaxed)).sum(),
                )),*]
            }

            pub(super) fn reset_counters(&self) {
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

    pub(super) fn reset(&self) {
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

    pub(super) fn reset(&self) {
        for c in &self.counts {
            c.store(0, Relaxed);
        }
        self.sum_ns.store(0, Relaxed);
    }

    /// `stats latency` lines of the sum over `all`, names starting with `prefix`: `_count`,
    /// `_sum_us`, then `_le_<bound µs>`: how many took at most that long (cumulative, as a
    /// Prometheus histogram's buckets).
    pub(super) fn render<'b>(
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

pub(super) fn new_histogram() -> Histogram<u64> {
    // 1 ns .. 100 s at 3 significant digits.
    Histogram::new_with_bounds(1, 100_000_000_000, 3)
        .unwrap_or_else(|_| Histogram::new(3).unwrap_or_else(|_| unreachable!()))
}
