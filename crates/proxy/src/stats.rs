//! Every request measured: each worker records, per request, its queue length on arrival
//! and its time in each stage (queue, worker, backend; total = queue + worker), and per
//! backend its requests, failures and service time, into its own [`Recorder`] (locked once
//! per batch). `stats`, `/metrics` and the window logger read the sum over workers.
//!
//! ```text
//!  arrival ──queue──► dequeued by a worker ──worker (own + backend)──► reply handed back
//!          (network thread parsed it)        backend = send → its slowest reply
//! ```

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use hdrhistogram::Histogram;

/// Highest time a histogram holds (ns): 60 s.
const MAX_NS: u64 = 60_000_000_000;
/// Percentiles within 1%: a histogram is then ~30 KB (3 digits: ~220 KB, whose cache misses
/// on every record were most of what recording cost).
const SIGNIFICANT_DIGITS: u8 = 2;

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_NS, SIGNIFICANT_DIGITS).expect("valid constant bounds")
}

/// The number of requests in the queue over time, without a lock: arrivals (network
/// thread) and departures (a worker's batch) each add to a count and a sum of their times.
/// Its time integral up to T is then exact:
///
/// ```text
///   ∫₀ᵀ len dt = (arrivals − departures)·T − Σ arrival times + Σ departure times
/// ```
///
/// (each request in the queue at T adds T − its arrival; each one gone, its departure −
/// arrival). The sums wrap; the integral, a small number, comes out right modulo 2⁶⁴.
#[derive(Debug)]
pub struct QueueLength {
    epoch: Instant,
    arrivals: AtomicU64,
    arrival_ns: AtomicU64,
    departures: AtomicU64,
    departure_ns: AtomicU64,
    /// The integral at the last [`QueueLength::take_area`].
    taken: AtomicU64,
}

impl QueueLength {
    /// An empty queue; times count from `epoch` (no event comes before it).
    pub fn new(epoch: Instant) -> QueueLength {
        QueueLength {
            epoch,
            arrivals: AtomicU64::new(0),
            arrival_ns: AtomicU64::new(0),
            departures: AtomicU64::new(0),
            departure_ns: AtomicU64::new(0),
            taken: AtomicU64::new(0),
        }
    }

    fn ns(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// One request arrives at `now`; returns the length it found.
    pub fn arrive(&self, now: Instant) -> u64 {
        self.arrival_ns.fetch_add(self.ns(now), Relaxed);
        let before = self.arrivals.fetch_add(1, Relaxed);
        before.saturating_sub(self.departures.load(Relaxed))
    }

    /// `n` requests leave at `now`.
    pub fn leave(&self, now: Instant, n: u64) {
        self.departure_ns
            .fetch_add(self.ns(now).wrapping_mul(n), Relaxed);
        self.departures.fetch_add(n, Relaxed);
    }

    /// Requests queued now.
    pub fn queued(&self) -> u64 {
        let departed = self.departures.load(Relaxed);
        self.arrivals.load(Relaxed).saturating_sub(departed)
    }

    /// The integral since the start, up to `now` (request·nanoseconds).
    pub fn total_area(&self, now: Instant) -> u128 {
        let t = self.ns(now);
        let departed = self.departures.load(Relaxed);
        let departed_ns = self.departure_ns.load(Relaxed);
        let arrived = self.arrivals.load(Relaxed);
        let arrived_ns = self.arrival_ns.load(Relaxed);
        let area = arrived
            .wrapping_sub(departed)
            .wrapping_mul(t)
            .wrapping_sub(arrived_ns)
            .wrapping_add(departed_ns);
        // Loads of a moving queue may disagree by an event: never below zero.
        u128::from(if (area as i64) < 0 { 0 } else { area })
    }

    /// The integral since the last call, up to `now` (request·nanoseconds).
    pub fn take_area(&self, now: Instant) -> u128 {
        let total = self.total_area(now) as u64;
        u128::from(total.saturating_sub(self.taken.swap(total, Relaxed)))
    }
}

/// What a worker knows about one finished request.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// A read (`get`, `mg`, …) rather than a write or a flush.
    pub read: bool,
    /// Keys asked for (reads).
    pub keys: u32,
    /// Values returned (reads).
    pub hits: u32,
    /// The reply was an error (the proxy's `SERVER_ERROR`, or a backend's error line).
    pub error: bool,
    /// Some part of it was retried on another replica.
    pub retried: bool,
    /// Backend requests it took.
    pub parts: u32,
    /// When the network thread handed it over.
    pub arrival: Instant,
    /// Requests queued when it arrived.
    pub queue_len: u32,
    /// Time in the queue (ns).
    pub queue_ns: u64,
    /// Time in the worker (ns), backend time included.
    pub worker_ns: u64,
    /// Time from its first send to its last backend reply (ns).
    pub backend_ns: u64,
}

impl Sample {
    /// Time in the proxy (ns): queue + worker.
    pub fn total_ns(&self) -> u64 {
        self.queue_ns + self.worker_ns
    }
}

/// One stage's times: exact count and sum, and a histogram for percentiles.
#[derive(Clone, Debug)]
pub struct Stage {
    /// Requests.
    pub count: u64,
    /// Sum of their times (ns).
    pub sum_ns: u64,
    /// Their times (ns).
    pub hist: Histogram<u64>,
}

impl Default for Stage {
    fn default() -> Self {
        Stage {
            count: 0,
            sum_ns: 0,
            hist: histogram(),
        }
    }
}

impl Stage {
    pub(crate) fn record(&mut self, ns: u64) {
        self.count += 1;
        self.sum_ns += ns;
        let _ = self.hist.record(ns.clamp(1, MAX_NS));
    }

    /// Mean in microseconds (0 when empty).
    pub fn mean_us(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum_ns as f64 / self.count as f64 / 1e3
        }
    }

    /// Quantile `q` in microseconds.
    pub fn quantile_us(&self, q: f64) -> f64 {
        self.hist.value_at_quantile(q) as f64 / 1e3
    }

    fn add(&mut self, other: &Stage) {
        self.count += other.count;
        self.sum_ns += other.sum_ns;
        let _ = self.hist.add(&other.hist);
    }

    pub(crate) fn sub(&mut self, other: &Stage) {
        self.count -= other.count.min(self.count);
        self.sum_ns -= other.sum_ns.min(self.sum_ns);
        let _ = self.hist.subtract(&other.hist);
    }
}

/// One backend's figures.
#[derive(Clone, Debug, Default)]
pub struct BackendFigures {
    /// Requests answered or failed.
    pub requests: u64,
    /// Failed: refused, closed, timed out, garbled, or ejected.
    pub errors: u64,
    /// Of which timed out.
    pub timeouts: u64,
    /// Service time of answered requests: send → reply.
    pub time: Stage,
}

impl BackendFigures {
    fn add(&mut self, o: &BackendFigures) {
        self.requests += o.requests;
        self.errors += o.errors;
        self.timeouts += o.timeouts;
        self.time.add(&o.time);
    }

    fn sub(&mut self, o: &BackendFigures) {
        self.requests -= o.requests.min(self.requests);
        self.errors -= o.errors.min(self.errors);
        self.timeouts -= o.timeouts.min(self.timeouts);
        self.time.sub(&o.time);
    }
}

/// Cumulative figures of one worker (or, summed, of the proxy).
#[derive(Clone, Debug, Default)]
pub struct Recorder {
    /// Requests finished.
    pub requests: u64,
    /// Of which reads.
    pub reads: u64,
    /// Keys asked for by reads.
    pub keys: u64,
    /// Values returned by reads.
    pub hits: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Requests with a part retried on another replica.
    pub retries: u64,
    /// Backend requests sent.
    pub parts: u64,
    /// Sum of the queue lengths seen on arrival.
    pub queue_len_sum: u64,
    /// Time in the queue.
    pub queue: Stage,
    /// Time in the worker.
    pub worker: Stage,
    /// Time waiting for backends.
    pub backend: Stage,
    /// Time in the proxy.
    pub total: Stage,
    /// Per backend (global index of the current routing).
    pub backends: Vec<BackendFigures>,
    /// Sampled request lines not yet written (`--log-sample`).
    pub sampled: Vec<String>,
    /// Write every n-th request as a line (0: none).
    pub sample_every: u64,
}

impl Recorder {
    /// Records one finished request.
    pub fn record(&mut self, s: &Sample, epoch: Instant) {
        self.requests += 1;
        if s.read {
            self.reads += 1;
            self.keys += u64::from(s.keys);
            self.hits += u64::from(s.hits);
        }
        self.errors += u64::from(s.error);
        self.retries += u64::from(s.retried);
        self.parts += u64::from(s.parts);
        self.queue_len_sum += u64::from(s.queue_len);
        self.queue.record(s.queue_ns);
        self.worker.record(s.worker_ns);
        self.backend.record(s.backend_ns);
        self.total.record(s.total_ns());
        if self.sample_every > 0 && self.requests.is_multiple_of(self.sample_every) {
            self.sampled.push(format!(
                "{:.6},{},{},{},{},{},{},{},{},{},{}",
                s.arrival.saturating_duration_since(epoch).as_secs_f64(),
                if s.read { "read" } else { "write" },
                s.keys,
                s.hits,
                s.queue_len,
                s.queue_ns / 1000,
                s.worker_ns / 1000,
                s.backend_ns / 1000,
                s.total_ns() / 1000,
                s.parts,
                if s.error { "error" } else { "ok" },
            ));
        }
    }

    /// Records one backend request's outcome (`ns`: its service time, when answered).
    pub fn backend(&mut self, b: usize, ns: Option<u64>, timeout: bool) {
        if self.backends.len() <= b {
            self.backends.resize_with(b + 1, BackendFigures::default);
        }
        let f = &mut self.backends[b];
        f.requests += 1;
        match ns {
            Some(ns) => f.time.record(ns),
            None => f.errors += 1,
        }
        f.timeouts += u64::from(timeout);
    }

    /// Adds `other`'s figures (not its sampled lines).
    pub fn add(&mut self, o: &Recorder) {
        self.requests += o.requests;
        self.reads += o.reads;
        self.keys += o.keys;
        self.hits += o.hits;
        self.errors += o.errors;
        self.retries += o.retries;
        self.parts += o.parts;
        self.queue_len_sum += o.queue_len_sum;
        self.queue.add(&o.queue);
        self.worker.add(&o.worker);
        self.backend.add(&o.backend);
        self.total.add(&o.total);
        if self.backends.len() < o.backends.len() {
            self.backends
                .resize_with(o.backends.len(), BackendFigures::default);
        }
        for (a, b) in self.backends.iter_mut().zip(&o.backends) {
            a.add(b);
        }
    }

    /// The figures since `earlier` (a previous sum): what one window added.
    pub fn since(&self, earlier: &Recorder) -> Recorder {
        let mut w = self.clone();
        w.sampled.clear();
        w.requests -= earlier.requests.min(w.requests);
        w.reads -= earlier.reads.min(w.reads);
        w.keys -= earlier.keys.min(w.keys);
        w.hits -= earlier.hits.min(w.hits);
        w.errors -= earlier.errors.min(w.errors);
        w.retries -= earlier.retries.min(w.retries);
        w.parts -= earlier.parts.min(w.parts);
        w.queue_len_sum -= earlier.queue_len_sum.min(w.queue_len_sum);
        w.queue.sub(&earlier.queue);
        w.worker.sub(&earlier.worker);
        w.backend.sub(&earlier.backend);
        w.total.sub(&earlier.total);
        for (a, b) in w.backends.iter_mut().zip(&earlier.backends) {
            a.sub(b);
        }
        w
    }

    /// Mean queue length seen by arrivals.
    pub fn mean_queue_len(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.queue_len_sum as f64 / self.requests as f64
        }
    }

    /// Hits over keys asked for (0 without reads).
    pub fn hit_ratio(&self) -> f64 {
        if self.keys == 0 {
            0.0
        } else {
            self.hits as f64 / self.keys as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(queue_ns: u64, worker_ns: u64) -> Sample {
        Sample {
            read: true,
            keys: 2,
            hits: 1,
            error: false,
            retried: false,
            parts: 2,
            arrival: Instant::now(),
            queue_len: 3,
            queue_ns,
            worker_ns,
            backend_ns: worker_ns / 2,
        }
    }

    #[test]
    fn the_queue_length_integral_is_exact() {
        let t = Instant::now();
        let ms = |n| t + std::time::Duration::from_millis(n);
        let q = QueueLength::new(t);
        assert_eq!(q.arrive(ms(0)), 0);
        assert_eq!(q.arrive(ms(10)), 1); // 1 for 10 ms
        q.leave(ms(30), 2); // 2 for 20 ms
        assert_eq!(q.take_area(ms(40)), 50 * 1_000_000);
        assert_eq!(q.take_area(ms(50)), 0);
    }

    #[test]
    fn stages_add_up_and_windows_subtract() {
        let epoch = Instant::now();
        let mut r = Recorder {
            sample_every: 2,
            ..Recorder::default()
        };
        r.record(&sample(1_000, 9_000), epoch);
        let first = r.clone();
        r.record(&sample(3_000, 7_000), epoch);
        r.backend(2, Some(5_000), false);
        r.backend(2, None, true);
        assert_eq!(r.total.sum_ns, r.queue.sum_ns + r.worker.sum_ns);
        assert_eq!(r.total.mean_us(), 10.0);
        assert_eq!(r.hit_ratio(), 0.5);
        assert_eq!(r.mean_queue_len(), 3.0);
        assert_eq!(r.sampled.len(), 1, "every second request");
        let w = r.since(&first);
        assert_eq!((w.requests, w.queue.count), (1, 1));
        assert_eq!(w.queue.mean_us(), 3.0);
        assert_eq!(w.backends[2].requests, 2);
        assert_eq!((w.backends[2].errors, w.backends[2].timeouts), (1, 1));
        let mut sum = Recorder::default();
        sum.add(&r);
        sum.add(&first);
        assert_eq!(sum.requests, 3);
    }
}
