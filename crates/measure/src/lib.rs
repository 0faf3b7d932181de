//! What a load generator measures, in the form it writes it: request counts, latency
//! histograms (HdrHistogram, nanoseconds) and their percentiles (microseconds), and one
//! interval's row — a line of `kvlab bench --live`, an element of `--json`'s `intervals`.
//!
//! `kvlab bench` writes these rows; `kvlab control` and `kvlab lab` read them. They live
//! here, below all three, so that the readers need not depend on the load generator; this
//! crate imports no other kvlab crate.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use hdrhistogram::serialization::{Deserializer, Serializer, V2DeflateSerializer};
/// The histogram type of every latency here (for users that add rows' histograms up).
pub use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// A histogram that could not be encoded, decoded or added to another; says why.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct HistogramError(String);

/// Highest latency recorded exactly, in nanoseconds (100 s); longer ones are recorded as this.
pub const MAX_LATENCY_NS: u64 = 100_000_000_000;

/// A new latency histogram: 1 ns .. 100 s, 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
    // Invariant: the bounds are valid constants (low 1 ≥ 1, high ≥ 2·low, sigfig 3 ≤ 5).
    #[allow(clippy::unwrap_used)]
    Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3).unwrap()
}

/// Records `ns` (clamped to the histogram's range).
#[inline]
pub fn record(h: &mut Histogram<u64>, ns: u64) {
    h.saturating_record(ns.clamp(1, MAX_LATENCY_NS));
}

/// Event counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Open loop: requests planned (their planned send time fell in the interval), whether
    /// or not they could be sent.
    #[serde(default)]
    pub planned: u64,
    /// Requests sent.
    pub sent: u64,
    /// Requests answered (any reply, including error replies).
    pub completed: u64,
    /// Of those: gets (multi-gets count once).
    pub gets: u64,
    /// Sets.
    pub sets: u64,
    /// Deletes.
    pub deletes: u64,
    /// Keys found by gets.
    pub hits: u64,
    /// Keys not found by gets.
    pub misses: u64,
    /// Requests that ended in an error: error replies, wrong values, broken connections.
    pub errors: u64,
    /// Of the errors: hits whose value failed `--verify`.
    pub verify_errors: u64,
    /// Requests with no reply within the timeout.
    pub timeouts: u64,
    /// `--cluster`: redirects followed (`MOVED`/`TRYAGAIN`; the request was sent again and
    /// counts once, when answered).
    #[serde(default)]
    pub redirects: u64,
}

impl Counters {
    /// Adds `o` to `self`.
    pub fn add(&mut self, o: &Counters) {
        self.planned += o.planned;
        self.sent += o.sent;
        self.completed += o.completed;
        self.gets += o.gets;
        self.sets += o.sets;
        self.deletes += o.deletes;
        self.hits += o.hits;
        self.misses += o.misses;
        self.errors += o.errors;
        self.verify_errors += o.verify_errors;
        self.timeouts += o.timeouts;
        self.redirects += o.redirects;
    }
}

/// A latency histogram in HdrHistogram's interchange form (V2 + deflate, base64), as an
/// interval row carries it: rows of any span decode and add up to the exact histogram of
/// their union, so a consumer gets the percentiles of a trace segment or a window from the
/// 100 ms rows without the generator keeping either. Its size grows with the number of
/// distinct latencies: 0.4–1 KB for 100 ms rows at 2k–8k requests/s.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EncodedHistogram(String);

impl EncodedHistogram {
    /// Encodes `h`.
    pub fn encode(h: &Histogram<u64>) -> Result<EncodedHistogram, HistogramError> {
        use base64::Engine;
        let mut bytes = Vec::new();
        V2DeflateSerializer::new()
            .serialize(h, &mut bytes)
            .map_err(|e| HistogramError(format!("encoding a histogram: {e:?}")))?;
        Ok(EncodedHistogram(
            base64::engine::general_purpose::STANDARD.encode(bytes),
        ))
    }

    /// Decodes it.
    pub fn decode(&self) -> Result<Histogram<u64>, HistogramError> {
        use base64::Engine;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(&self.0)
            .map_err(|e| HistogramError(format!("a histogram's base64: {e}")))?;
        Deserializer::new()
            .deserialize(&mut bytes.as_slice())
            .map_err(|e| HistogramError(format!("decoding a histogram: {e:?}")))
    }

    /// Adds it to `into` (a histogram of [`new_histogram`]'s bounds, or one that grows).
    pub fn add_to(&self, into: &mut Histogram<u64>) -> Result<(), HistogramError> {
        into.add(self.decode()?)
            .map_err(|e| HistogramError(format!("merging histograms: {e:?}")))
    }
}

/// Latency figures in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// Mean, µs.
    pub mean_us: f64,
    /// 25th percentile, µs.
    pub p25_us: f64,
    /// Median, µs.
    pub p50_us: f64,
    /// 75th percentile, µs.
    pub p75_us: f64,
    /// 90th percentile, µs.
    pub p90_us: f64,
    /// 95th percentile, µs.
    pub p95_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// 99.9th percentile, µs.
    pub p99_9_us: f64,
    /// 99.99th percentile, µs.
    pub p99_99_us: f64,
    /// Maximum, µs.
    pub max_us: f64,
    /// Number of samples.
    pub count: u64,
}

impl Percentiles {
    /// From a nanosecond histogram.
    pub fn of(h: &Histogram<u64>) -> Self {
        let us = |ns: u64| ns as f64 / 1000.0;
        let q = |p: f64| {
            if h.is_empty() {
                0.0
            } else {
                us(h.value_at_quantile(p))
            }
        };
        Percentiles {
            mean_us: if h.is_empty() { 0.0 } else { h.mean() / 1000.0 },
            p25_us: q(0.25),
            p50_us: q(0.50),
            p75_us: q(0.75),
            p90_us: q(0.90),
            p95_us: q(0.95),
            p99_us: q(0.99),
            p99_9_us: q(0.999),
            p99_99_us: q(0.9999),
            max_us: if h.is_empty() { 0.0 } else { us(h.max()) },
            count: h.len(),
        }
    }

    /// The names and values in print order (name, µs).
    pub fn columns(&self) -> [(&'static str, f64); 10] {
        [
            ("p25", self.p25_us),
            ("p50", self.p50_us),
            ("p75", self.p75_us),
            ("p90", self.p90_us),
            ("p95", self.p95_us),
            ("p99", self.p99_us),
            ("p99.9", self.p99_9_us),
            ("p99.99", self.p99_99_us),
            ("max", self.max_us),
            ("mean", self.mean_us),
        ]
    }
}

/// One interval of a run's time series, as `kvlab bench` writes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IntervalRow {
    /// Start, ms since the Unix epoch.
    pub ts_start: u64,
    /// End, ms since the Unix epoch.
    pub ts_end: u64,
    /// Part of the warm-up (not in the totals).
    pub warmup: bool,
    /// Index of the rate step (segment) it belongs to.
    pub step: usize,
    /// Target total rate, requests/s (`None` in closed loop).
    pub target_qps: Option<f64>,
    /// Replies per second.
    pub achieved_qps: f64,
    /// Counts.
    pub counters: Counters,
    /// Latency from the planned send time, µs.
    pub latency: Percentiles,
    /// Latency from the actual send, µs.
    pub latency_send: Percentiles,
    /// The latency from the planned send time as a histogram (ns), so that rows add up to
    /// the exact percentiles of any span of them: a trace segment, a window (`kvlab
    /// control`'s figures). Absent in rows written by older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_hist: Option<EncodedHistogram>,
}

/// Median of a sample (mean of the middle two for an even count; 0 when empty).
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// One interval as one line of JSON (no newline): what `kvlab bench --live` appends as each
/// interval ends (`kvlab control` reads the p95 from it).
pub fn interval_json(i: &IntervalRow) -> String {
    serde_json::to_string(i).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_in_microseconds() {
        let mut h = new_histogram();
        for v in 1..=1000u64 {
            record(&mut h, v * 1000);
        }
        let p = Percentiles::of(&h);
        assert!((p.p50_us - 500.0).abs() < 1.0, "{p:?}");
        assert!((p.p99_us - 990.0).abs() < 1.0, "{p:?}");
        assert!((p.max_us - 1000.0).abs() < 1.0, "{p:?}");
        assert_eq!(p.count, 1000);
    }

    #[test]
    fn encoded_histograms_add_up_to_their_union() {
        let (mut a, mut b, mut both) = (new_histogram(), new_histogram(), new_histogram());
        for v in 1..=950u64 {
            record(&mut a, v * 1000);
            record(&mut both, v * 1000);
        }
        for v in 0..50u64 {
            record(&mut b, 5_000_000 + v);
            record(&mut both, 5_000_000 + v);
        }
        let (ea, eb) = (
            EncodedHistogram::encode(&a).unwrap(),
            EncodedHistogram::encode(&b).unwrap(),
        );
        assert_eq!(ea.decode().unwrap(), a);
        let mut sum = new_histogram();
        ea.add_to(&mut sum).unwrap();
        eb.add_to(&mut sum).unwrap();
        assert_eq!(sum, both);
        assert_eq!(Percentiles::of(&sum), Percentiles::of(&both));
        // Compact enough for a row every 100 ms.
        let json = serde_json::to_string(&ea).unwrap();
        assert!(json.len() < 4096, "{} bytes", json.len());
        assert!(EncodedHistogram("not base64!".into()).decode().is_err());
    }
}
