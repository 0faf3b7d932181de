//! A run's complete settings: target, load model, workload, measurement settings. It is
//! plain data (serde) because the master sends it to agents as JSON. It is derived, never
//! written by hand outside tests: [`crate::load::Load::config`] is the one conversion from a
//! load description, which holds the defaults and the checks with user-facing messages;
//! [`BenchConfig::validate`] re-checks what an agent receives.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::schedule::{Arrival, RatePlan};
use crate::workload::Workload;
use crate::BenchError;

/// The protocol the generator speaks to the target.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// memcached's text protocol.
    #[default]
    Memcached,
    /// HTTP/1.1 to kvlab's REST interface (`GET`/`PUT`/`DELETE /key/{k}`), keep-alive,
    /// pipelined.
    Http,
    /// memcached's meta protocol: `mg <key> v f` (a multi-get: quiet `mg … q` per key and
    /// `mn`), `ms <key> <len> F<flags> T<exptime>`, `md <key>`; on the memcached port.
    Meta,
}

impl Protocol {
    /// The client connection's wire protocol.
    pub fn wire(self) -> kvlab_client::Wire {
        match self {
            Protocol::Memcached => kvlab_client::Wire::Memcached,
            Protocol::Http => kvlab_client::Wire::Http,
            Protocol::Meta => kvlab_client::Wire::Meta,
        }
    }

    /// The name in flags and experiment files (`memcached`, `http`, `meta`).
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Memcached => "memcached",
            Protocol::Http => "http",
            Protocol::Meta => "meta",
        }
    }

    /// Whether it is served on a memcached port (text or meta), as opposed to HTTP.
    pub fn is_memcached_port(self) -> bool {
        self != Protocol::Http
    }
}

/// One run against one target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchConfig {
    /// The server.
    pub target: SocketAddr,
    /// What to speak to it.
    #[serde(default)]
    pub protocol: Protocol,
    /// Meta protocol: send keys base64-encoded (the `b` flag).
    #[serde(default)]
    pub meta_base64: bool,
    /// `target` is a node of a kvlab cluster: every key goes to its node by the ring.
    #[serde(default)]
    pub cluster: bool,
    /// Generator threads (per participant: the master and each agent).
    pub threads: usize,
    /// Connections per thread.
    pub connections: usize,
    /// Requests in flight per connection: the closed-loop pipeline depth; in open loop the
    /// cap beyond which planned requests wait (their latency still counts from the plan).
    pub depth: usize,
    /// Closed loop: pause between a reply and the next request on that slot, microseconds.
    pub think_us: u64,
    /// `None`: closed loop. `Some`: open loop with this arrival process.
    pub open: Option<Arrival>,
    /// Total target rate over the measured time (closed loop: one segment, rate ignored).
    pub plan: RatePlan,
    /// Stop after this many requests in total (all participants) instead of at the plan's end.
    pub requests: Option<u64>,
    /// Warm-up before measurement, seconds (run at the first segment's rate, then discarded).
    pub warmup_s: f64,
    /// Time-series interval, seconds.
    pub interval_s: f64,
    /// A request with no reply after this long counts as a timeout, milliseconds.
    pub timeout_ms: u64,
    /// What to send.
    pub workload: Workload,
    /// Seed of every random choice.
    pub seed: u64,
    /// Set every key once before the run.
    pub load: bool,
    /// Raised to end the run early (Ctrl-C): not a setting, never sent to an agent.
    #[serde(skip)]
    pub stop: Stop,
}

/// A run's stop signal, shared by its generator threads: once raised (the CLI raises it on
/// SIGINT), each thread stops sending, waits for the replies in flight as at a run's end,
/// reports its partial last interval, and the run's result is what was measured so far.
#[derive(Debug, Clone, Default)]
pub struct Stop(Arc<AtomicBool>);

impl Stop {
    /// Ends the run early.
    pub fn raise(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether the run was told to end.
    pub fn raised(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// The flag itself, for a signal handler to set (`signal_hook::flag::register`).
    pub fn flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.0)
    }
}

/// Two runs' settings are equal whatever their stop signals.
impl PartialEq for Stop {
    fn eq(&self, _: &Stop) -> bool {
        true
    }
}

/// Base64 keys are a meta protocol option, and their encoding must fit memcached's 250-byte
/// key token.
pub fn check_meta_base64(
    protocol: Protocol,
    base64: bool,
    workload: &Workload,
) -> Result<(), BenchError> {
    if !base64 {
        return Ok(());
    }
    if protocol != Protocol::Meta {
        return Err(BenchError::Spec(format!(
            "meta_base64 (--meta-base64) needs protocol = \"meta\", not \"{}\"",
            protocol.name()
        )));
    }
    let max = workload.max_key_len();
    let limit = kvlab_protocol::client::MAX_BASE64_KEY_LEN;
    if max > limit {
        return Err(BenchError::Spec(format!(
            "meta_base64: keys may be {max} bytes, but a base64 key must be at most {limit} \
             bytes (its encoding must fit memcached's 250-byte key); give a smaller key_size"
        )));
    }
    Ok(())
}

impl BenchConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), BenchError> {
        let bad = |m: &str| Err(BenchError::Spec(m.into()));
        if self.threads == 0 || self.threads > 1024 {
            return bad("--threads must be in 1..=1024");
        }
        if self.connections == 0 || self.connections > 65_536 {
            return bad("--connections must be in 1..=65536");
        }
        if self.depth == 0 || self.depth > 65_536 {
            return bad("--depth must be in 1..=65536");
        }
        if self.interval_s.is_nan() || self.interval_s <= 0.0 {
            return bad("--interval must be > 0");
        }
        if self.warmup_s.is_nan() || self.warmup_s < 0.0 {
            return bad("--warmup must be >= 0");
        }
        if self.timeout_ms == 0 {
            return bad("--timeout must be > 0");
        }
        if self.plan.segments.is_empty() {
            return bad("empty rate plan");
        }
        if self.requests == Some(0) {
            return bad("--requests must be > 0");
        }
        check_meta_base64(self.protocol, self.meta_base64, &self.workload)?;
        self.workload.validate()
    }

    /// Interval in ns.
    pub fn interval_ns(&self) -> u64 {
        ((self.interval_s * 1e9) as u64).max(1_000_000)
    }

    /// Warm-up in ns.
    pub fn warmup_ns(&self) -> u64 {
        (self.warmup_s * 1e9) as u64
    }

    /// End of the run, ns after its start: warm-up plus the plan (unbounded with `--requests`
    /// and no explicit duration is expressed by a very long plan).
    pub fn end_ns(&self) -> u64 {
        self.warmup_ns().saturating_add(self.plan.duration_ns())
    }

    /// The first interval boundary after `t` (ns after the start): the end of warm-up, every
    /// interval after it, every segment boundary, and the end.
    pub fn next_cut(&self, t: u64) -> u64 {
        let w = self.warmup_ns();
        let end = self.end_ns();
        if t < w {
            return w;
        }
        let rel = t - w;
        let iv = self.interval_ns();
        let mut cut = (rel / iv + 1) * iv;
        let mut seg_start = 0u64;
        for s in &self.plan.segments {
            seg_start += s.duration_ns;
            if seg_start > rel {
                cut = cut.min(seg_start);
                break;
            }
        }
        w.saturating_add(cut).min(end)
    }

    /// Total connections of one participant.
    pub fn conns_per_participant(&self) -> u64 {
        (self.threads * self.connections) as u64
    }
}
