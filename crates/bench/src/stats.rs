//! Measurement: counters and latency histograms per generator thread and interval, their
//! merge, and the figures reported from them.
//!
//! Each thread records into its own histograms (no sharing on the hot path) and hands them
//! over at every interval boundary; the collector merges the hand-overs of all threads (and
//! agents) for that interval, and the intervals into the run's totals. Latencies are recorded
//! in nanoseconds twice: from the planned send time (`latency`, free of coordinated omission)
//! and from the actual send (`latency_send`, what a closed-loop tool would report).
//!
//! The figures that leave the generator in its rows — counters, percentiles, encoded
//! histograms — are defined in [`kvlab_measure`], which their readers share.

use hdrhistogram::serialization::{Deserializer, Serializer, V2DeflateSerializer};
pub use kvlab_measure::{
    new_histogram, record, Counters, EncodedHistogram, Histogram, HistogramError, Percentiles,
    MAX_LATENCY_NS,
};
use serde::{Deserialize, Serialize};

use crate::BenchError;

/// Serde adapter: a histogram as base64 of its V2+deflate serialisation (HdrHistogram's
/// interchange format), so agents can send theirs to the master.
pub mod hist_serde {
    use super::*;
    use base64::Engine;
    use serde::{de::Error as _, ser::Error as _};

    /// Serialises.
    pub fn serialize<S: serde::Serializer>(h: &Histogram<u64>, s: S) -> Result<S::Ok, S::Error> {
        let mut bytes = Vec::new();
        V2DeflateSerializer::new()
            .serialize(h, &mut bytes)
            .map_err(S::Error::custom)?;
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    /// Deserialises.
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Histogram<u64>, D::Error> {
        let s: String = serde::Deserialize::deserialize(d)?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(s)
            .map_err(D::Error::custom)?;
        Deserializer::new()
            .deserialize(&mut bytes.as_slice())
            .map_err(D::Error::custom)
    }
}

/// Which kind of request a latency belongs to (index into [`OpLatency`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// Get (a multi-get counts once).
    Get = 0,
    /// Set.
    Set = 1,
    /// Delete.
    Delete = 2,
}

impl OpKind {
    /// All kinds, in index order.
    pub const ALL: [OpKind; 3] = [OpKind::Get, OpKind::Set, OpKind::Delete];

    /// The lowercase name (`get`, `set`, `delete`).
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Get => "get",
            OpKind::Set => "set",
            OpKind::Delete => "delete",
        }
    }
}

/// Latency from the planned send time per kind of request, ns: a fixed array indexed by
/// [`OpKind`], so recording on the hot path neither allocates nor looks anything up.
#[derive(Debug, Clone, PartialEq)]
pub struct OpLatency(pub [Histogram<u64>; 3]);

impl Default for OpLatency {
    fn default() -> Self {
        OpLatency([new_histogram(), new_histogram(), new_histogram()])
    }
}

impl OpLatency {
    /// The histogram of `kind`.
    #[inline]
    pub fn of(&self, kind: OpKind) -> &Histogram<u64> {
        &self.0[kind as usize]
    }

    /// The histogram of `kind`, to record into.
    #[inline]
    pub fn of_mut(&mut self, kind: OpKind) -> &mut Histogram<u64> {
        &mut self.0[kind as usize]
    }

    /// Adds another report's histograms.
    pub fn add(&mut self, o: &OpLatency) -> Result<(), BenchError> {
        for (a, b) in self.0.iter_mut().zip(o.0.iter()) {
            a.add(b)
                .map_err(|e| BenchError::Internal(format!("merge: {e:?}")))?;
        }
        Ok(())
    }

    /// Percentiles of every kind that has samples.
    pub fn percentiles(&self) -> OpPercentiles {
        let p = |k: OpKind| {
            let h = self.of(k);
            (!h.is_empty()).then(|| Percentiles::of(h))
        };
        OpPercentiles {
            get: p(OpKind::Get),
            set: p(OpKind::Set),
            delete: p(OpKind::Delete),
        }
    }
}

/// Wire form of [`OpLatency`]: one serialised histogram per kind.
#[derive(Serialize, Deserialize)]
struct OpLatencyWire {
    #[serde(with = "hist_serde")]
    get: Histogram<u64>,
    #[serde(with = "hist_serde")]
    set: Histogram<u64>,
    #[serde(with = "hist_serde")]
    delete: Histogram<u64>,
}

impl Serialize for OpLatency {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let [get, set, delete] = self.0.clone();
        OpLatencyWire { get, set, delete }.serialize(s)
    }
}

impl<'de> Deserialize<'de> for OpLatency {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let w = OpLatencyWire::deserialize(d)?;
        Ok(OpLatency([w.get, w.set, w.delete]))
    }
}

/// Latency figures (from the planned send time) per kind of request, µs; a kind without
/// samples is absent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct OpPercentiles {
    /// Gets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub get: Option<Percentiles>,
    /// Sets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set: Option<Percentiles>,
    /// Deletes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete: Option<Percentiles>,
}

impl OpPercentiles {
    /// The kinds with samples, in [`OpKind`] order.
    pub fn present(&self) -> Vec<(OpKind, &Percentiles)> {
        [
            (OpKind::Get, &self.get),
            (OpKind::Set, &self.set),
            (OpKind::Delete, &self.delete),
        ]
        .into_iter()
        .filter_map(|(k, p)| p.as_ref().map(|p| (k, p)))
        .collect()
    }
}

/// What one thread measured in one interval.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IntervalReport {
    /// Interval number (0 = the first after the start, warm-up included).
    pub index: u64,
    /// The participant whose thread measured it (0 = the master, 1.. = agents; in a merged
    /// report, the first merged in's).
    #[serde(default)]
    pub participant: u32,
    /// Start, nanoseconds after the run's start.
    pub start_ns: u64,
    /// End, nanoseconds after the run's start.
    pub end_ns: u64,
    /// Counts.
    pub counters: Counters,
    /// Latency from the planned send time, ns.
    #[serde(with = "hist_serde")]
    pub latency: Histogram<u64>,
    /// Latency from the actual send, ns.
    #[serde(with = "hist_serde")]
    pub latency_send: Histogram<u64>,
    /// Latency from the planned send time per kind of request, ns.
    #[serde(default)]
    pub latency_by_op: OpLatency,
}

impl IntervalReport {
    /// An empty report.
    pub fn new(index: u64, start_ns: u64, end_ns: u64) -> Self {
        IntervalReport {
            index,
            participant: 0,
            start_ns,
            end_ns,
            counters: Counters::default(),
            latency: new_histogram(),
            latency_send: new_histogram(),
            latency_by_op: OpLatency::default(),
        }
    }

    /// Adds another thread's report of the same interval.
    pub fn merge(&mut self, o: &IntervalReport) -> Result<(), BenchError> {
        self.counters.add(&o.counters);
        self.latency
            .add(&o.latency)
            .map_err(|e| BenchError::Internal(format!("merge: {e:?}")))?;
        self.latency_send
            .add(&o.latency_send)
            .map_err(|e| BenchError::Internal(format!("merge: {e:?}")))?;
        self.latency_by_op.add(&o.latency_by_op)?;
        self.start_ns = self.start_ns.min(o.start_ns);
        self.end_ns = self.end_ns.max(o.end_ns);
        Ok(())
    }
}

/// Statistics of normalised inter-arrival gaps (gap × rate: Exp(1) for a Poisson process).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GapStats {
    /// Number of gaps.
    pub n: u64,
    /// Sum of normalised gaps.
    pub sum: f64,
    /// Sum of squares.
    pub sum_sq: f64,
    /// A uniform sample (reservoir) of normalised gaps for a KS test.
    pub sample: Vec<f64>,
}

/// Reservoir size for [`GapStats::sample`] per thread.
pub const GAP_SAMPLE: usize = 2000;

impl GapStats {
    /// Adds a gap; `r` is a uniform draw in [0,1) used for reservoir sampling.
    pub fn add(&mut self, x: f64, r: f64) {
        self.n += 1;
        self.sum += x;
        self.sum_sq += x * x;
        if self.sample.len() < GAP_SAMPLE {
            self.sample.push(x);
        } else {
            let j = (r * self.n as f64) as usize;
            if j < GAP_SAMPLE {
                self.sample[j] = x;
            }
        }
    }

    /// Merges another thread's statistics.
    pub fn merge(&mut self, o: &GapStats) {
        self.n += o.n;
        self.sum += o.sum;
        self.sum_sq += o.sum_sq;
        self.sample.extend_from_slice(&o.sample);
    }

    /// Mean of the normalised gaps.
    pub fn mean(&self) -> f64 {
        self.sum / self.n.max(1) as f64
    }

    /// Coefficient of variation (1 for exponential, 0 for constant).
    pub fn cv(&self) -> f64 {
        let n = self.n.max(1) as f64;
        let m = self.sum / n;
        let var = (self.sum_sq / n - m * m).max(0.0);
        var.sqrt() / m
    }
}

/// Kolmogorov–Smirnov statistic D of `sample` against the CDF `cdf`.
pub fn ks_statistic(sample: &mut [f64], cdf: impl Fn(f64) -> f64) -> f64 {
    sample.sort_by(f64::total_cmp);
    let n = sample.len() as f64;
    let mut d: f64 = 0.0;
    for (i, &x) in sample.iter().enumerate() {
        let f = cdf(x);
        d = d.max(f - i as f64 / n).max((i + 1) as f64 / n - f);
    }
    d
}

/// The KS critical value at significance 0.001 for `n` samples (asymptotic 1.95/√n).
pub fn ks_critical_001(n: usize) -> f64 {
    1.949 / (n.max(1) as f64).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_survive_the_wire() {
        let mut r = IntervalReport::new(3, 10, 20);
        for v in [1_000u64, 2_000, 3_000, 1_000_000] {
            record(&mut r.latency, v);
        }
        record(&mut r.latency_send, u64::MAX);
        record(r.latency_by_op.of_mut(OpKind::Set), 7_000);
        r.counters.completed = 4;
        let json = serde_json::to_string(&r).unwrap();
        let back: IntervalReport = serde_json::from_str(&json).unwrap();
        assert_eq!(back.latency, r.latency);
        assert_eq!(back.latency_send.max(), r.latency_send.max());
        assert_eq!(back.counters, r.counters);
        assert_eq!(back.latency_by_op, r.latency_by_op);
        assert!(back.latency_by_op.of(OpKind::Get).is_empty());
        let mut m = IntervalReport::new(3, 5, 15);
        m.merge(&back).unwrap();
        assert_eq!((m.start_ns, m.end_ns, m.latency.len()), (5, 20, 4));
        let p = m.latency_by_op.percentiles();
        assert_eq!(p.set.map(|p| p.count), Some(1));
        assert!(p.get.is_none() && p.delete.is_none());
    }

    #[test]
    fn gap_stats_of_constant_gaps() {
        let mut g = GapStats::default();
        for i in 0..5000 {
            g.add(1.0, (i as f64 * 0.618).fract());
        }
        assert!((g.mean() - 1.0).abs() < 1e-9 && g.cv() < 1e-6);
        assert_eq!(g.sample.len(), GAP_SAMPLE);
    }
}
