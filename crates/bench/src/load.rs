//! One load description: what `kvlab bench`, `kvlab populate` and an experiment's
//! `[workload]` all mean by "this load".
//!
//! ```text
//!  kvlab bench flags ─┐                         (all optional: absent = the default here)
//!  [workload] table ──┼──► Options ──to_load()──► Load ──validate()/config(target)──► BenchConfig
//!  kvlab populate ────┘    flat keys              the description       the run (wire format
//!                                                 (serde, defaults)     to agents)
//! ```
//!
//! - [`Load`] is the description: open or closed loop ([`Mode`]), the workload, warm-up,
//!   duration, interval, seed, protocol, threads. Every default is stated once, in the
//!   `Default` impls and constants of this module (and [`Workload::default`] for the
//!   workload); serde fills absent keys from them.
//! - [`Options`] is the flat `key = value` form that the command line and experiment files
//!   write (`qps`, `scan`, `qps_list`, `depth`, `key_size`, …). Each field is optional; absent
//!   means "the default of the [`Load`]". [`Options::to_load`] is the one mapping from those
//!   keys to a description, so the same keys give the same run everywhere.
//! - [`Load::config`] derives the run's [`BenchConfig`] (the form agents receive); nothing else
//!   builds a `BenchConfig` from user input.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::config::{BenchConfig, Protocol};
use crate::data::{DataKey, DataSpec, DEFAULT_MAX_ITEM_SIZE};
use crate::dist::{KeyDist, SizeDist};
use crate::schedule::{Arrival, RatePlan, Segment};
use crate::workload::{Mix, Workload};
use crate::BenchError;

/// Measured seconds of a run (of each step of a scan, of a random trace) when none is given.
pub const DEFAULT_DURATION_S: f64 = 10.0;
/// Seconds each rate of a list (or a rate file's bare `RATE` line) lasts when none is given.
pub const DEFAULT_QPS_INTERVAL_S: f64 = 1.0;
/// Seed of a random rate trace when none is given.
pub const DEFAULT_QPS_SEED: u64 = 1;
/// A run bounded by a request count and no duration: the plan only needs to outlast it.
const UNBOUNDED_S: f64 = 1e6;

/// The load of a run (or of every run of an experiment point): how requests are issued, what
/// they are, and how long and how finely it is measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Load {
    /// What the generator speaks.
    pub protocol: Protocol,
    /// Meta protocol: keys travel base64-encoded (`b` flag).
    pub meta_base64: bool,
    /// The target is a node of a kvlab cluster: route every key to its node by the
    /// cluster's ring and follow redirects (`kvlab_ring`).
    pub cluster: bool,
    /// Generator threads (per participant: the master and each agent).
    pub threads: usize,
    /// Connections per generator thread.
    pub connections: usize,
    /// Closed or open loop, with what belongs to each.
    pub mode: Mode,
    /// What to send.
    pub workload: Workload,
    /// Set every key once before the run; `None`: when the mix has gets.
    pub fill: Option<bool>,
    /// Warm-up before measurement, s (run at the first rate, then discarded).
    pub warmup_s: f64,
    /// Measured time, s (per step of a scan); `None`: [`DEFAULT_DURATION_S`], or unbounded
    /// when `requests` bounds the run.
    pub duration_s: Option<f64>,
    /// Stop after this many requests in total (all participants).
    pub requests: Option<u64>,
    /// Time-series interval, s.
    pub interval_s: f64,
    /// A request with no reply after this long is a timeout, ms.
    pub timeout_ms: u64,
    /// Seed of every random choice.
    pub seed: u64,
}

impl Default for Load {
    fn default() -> Self {
        Load {
            protocol: Protocol::default(),
            meta_base64: false,
            cluster: false,
            threads: 1,
            connections: 4,
            mode: Mode::default(),
            workload: Workload::default(),
            fill: None,
            warmup_s: 0.0,
            duration_s: None,
            requests: None,
            interval_s: 1.0,
            timeout_ms: 5000,
            seed: 1,
        }
    }
}

/// Closed or open loop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "loop", rename_all = "lowercase")]
pub enum Mode {
    /// Each connection keeps `depth` requests in flight and sends the next after a reply
    /// (and the think time).
    Closed(Closed),
    /// Requests are planned by an arrival process at a rate plan, whatever the replies do.
    Open(Open),
}

impl Default for Mode {
    fn default() -> Self {
        Mode::Closed(Closed::default())
    }
}

/// Closed-loop settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Closed {
    /// Requests in flight per connection (the pipeline depth).
    pub depth: usize,
    /// Pause between a reply and the next request on that slot, µs.
    pub think_us: u64,
}

impl Default for Closed {
    fn default() -> Self {
        Closed {
            depth: 1,
            think_us: 0,
        }
    }
}

/// Open-loop settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Open {
    /// Inter-arrival distribution.
    #[serde(default)]
    pub arrival: Arrival,
    /// The total target rate over time.
    pub rate: Rate,
    /// Cap on requests in flight per connection beyond which planned requests wait (their
    /// latency still counts from the plan).
    #[serde(default = "Open::default_depth")]
    pub depth: usize,
}

impl Open {
    /// Open loop at `rate` with the default arrival process and depth cap.
    pub fn new(rate: Rate) -> Self {
        Open {
            arrival: Arrival::default(),
            rate,
            depth: Open::default_depth(),
        }
    }

    /// The default cap on requests in flight per connection.
    pub fn default_depth() -> usize {
        1024
    }
}

/// The open-loop rate plan: total requests/s over all connections of all participants.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "plan", rename_all = "lowercase", deny_unknown_fields)]
pub enum Rate {
    /// One rate for the whole duration.
    Fixed {
        /// Requests/s.
        qps: f64,
    },
    /// `min`, `min + step`, … up to `max`, each for the duration.
    Scan {
        /// First rate, requests/s.
        min: f64,
        /// Last rate (at most), requests/s.
        max: f64,
        /// Increment, requests/s.
        step: f64,
    },
    /// A random trace: every `interval_s` a rate drawn uniformly from `[min, max]`, for the
    /// duration in all; the same seed gives the same trace.
    Random {
        /// Lowest rate, requests/s.
        min: f64,
        /// Highest rate, requests/s.
        max: f64,
        /// Seconds between changes.
        interval_s: f64,
        /// Seed of the trace.
        #[serde(default = "default_qps_seed")]
        seed: u64,
    },
    /// Explicit rates, each for `interval_s`.
    List {
        /// Requests/s.
        rates: Vec<f64>,
        /// Seconds each rate lasts.
        #[serde(default = "default_qps_interval")]
        interval_s: f64,
    },
    /// Explicit segments (a rate file).
    Segments {
        /// Consecutive (duration, rate) pairs.
        segments: Vec<Segment>,
    },
}

fn default_qps_seed() -> u64 {
    DEFAULT_QPS_SEED
}

fn default_qps_interval() -> f64 {
    DEFAULT_QPS_INTERVAL_S
}

impl Rate {
    /// The plan for a run of `duration_s` (used by fixed, scan steps and random traces).
    pub fn plan(&self, duration_s: f64) -> Result<RatePlan, BenchError> {
        match self {
            Rate::Fixed { qps } => RatePlan::fixed(*qps, duration_s),
            Rate::Scan { min, max, step } => RatePlan::scan(*min, *max, *step, duration_s),
            Rate::Random {
                min,
                max,
                interval_s,
                seed,
            } => {
                if !(*interval_s > 0.0 && interval_s.is_finite()) {
                    return Err(spec(format!("qps_interval = {interval_s}: must be > 0")));
                }
                RatePlan::random(*interval_s, *min, *max, *seed, duration_s)
            }
            Rate::List { rates, interval_s } => RatePlan::from_rates(rates, *interval_s),
            Rate::Segments { segments } => {
                if segments.is_empty() {
                    return Err(spec("empty rate plan".into()));
                }
                Ok(RatePlan {
                    segments: segments.clone(),
                })
            }
        }
    }
}

fn spec(m: String) -> BenchError {
    BenchError::Spec(m)
}

impl Load {
    /// Whether requests are planned (open loop).
    pub fn is_open(&self) -> bool {
        matches!(self.mode, Mode::Open(_))
    }

    /// Requests in flight per connection (closed) or its cap (open).
    pub fn depth(&self) -> usize {
        match &self.mode {
            Mode::Closed(c) => c.depth,
            Mode::Open(o) => o.depth,
        }
    }

    /// Closed-loop think time, µs (0 in open loop).
    pub fn think_us(&self) -> u64 {
        match &self.mode {
            Mode::Closed(c) => c.think_us,
            Mode::Open(_) => 0,
        }
    }

    /// Requests in flight at most in closed loop (the population N of one participant:
    /// threads × connections × depth).
    pub fn population(&self) -> usize {
        self.threads * self.connections * self.depth()
    }

    /// Whether the key space is set before the run.
    pub fn fills(&self) -> bool {
        self.fill.unwrap_or(self.workload.mix.get > 0)
    }

    /// The measured time the plan covers, s.
    fn plan_duration_s(&self) -> f64 {
        match (self.duration_s, self.requests) {
            (Some(d), _) => d,
            (None, Some(_)) => UNBOUNDED_S,
            (None, None) => DEFAULT_DURATION_S,
        }
    }

    /// The rate plan (closed loop: one segment of the duration, rate ignored).
    pub fn plan(&self) -> Result<RatePlan, BenchError> {
        match &self.mode {
            Mode::Closed(_) => RatePlan::fixed(0.0, self.plan_duration_s()),
            Mode::Open(o) => match o.rate {
                Rate::Fixed { .. } => o.rate.plan(self.plan_duration_s()),
                // A scan's steps and a trace last the duration given (or the default), even
                // when a request count ends the run first.
                _ => o.rate.plan(self.duration_s.unwrap_or(DEFAULT_DURATION_S)),
            },
        }
    }

    /// Checks every setting; the message names the key (as a flag it is `--key`).
    pub fn validate(&self) -> Result<(), BenchError> {
        let bad = |m: String| Err(spec(m));
        if !(1..=1024).contains(&self.threads) {
            return bad(format!("threads = {}: must be in 1..=1024", self.threads));
        }
        if !(1..=65_536).contains(&self.connections) {
            return bad(format!(
                "connections = {}: must be in 1..=65536",
                self.connections
            ));
        }
        let depth = self.depth();
        if !(1..=65_536).contains(&depth) {
            return bad(format!("depth = {depth}: must be in 1..=65536"));
        }
        if !(self.interval_s > 0.0 && self.interval_s.is_finite()) {
            return bad(format!("interval = {}: must be > 0 s", self.interval_s));
        }
        if !(self.warmup_s >= 0.0 && self.warmup_s.is_finite()) {
            return bad(format!("warmup = {}: must be >= 0 s", self.warmup_s));
        }
        if let Some(d) = self.duration_s {
            if !(d > 0.0 && d.is_finite()) {
                return bad(format!("duration = {d}: must be > 0 s"));
            }
        }
        if self.timeout_ms == 0 {
            return bad("timeout_ms = 0: must be > 0".into());
        }
        if self.requests == Some(0) {
            return bad("requests = 0: must be > 0".into());
        }
        if let Mode::Open(o) = &self.mode {
            if let Rate::Fixed { qps } = o.rate {
                if !(qps > 0.0 && qps.is_finite()) {
                    return bad(format!("qps = {qps}: must be > 0"));
                }
            }
        }
        self.plan()?;
        let wl = self.workload_read()?;
        crate::config::check_meta_base64(self.protocol, self.meta_base64, &wl)?;
        wl.validate()
    }

    /// The workload with its data set read (a description read back from a file names the
    /// set without holding it).
    fn workload_read(&self) -> Result<Workload, BenchError> {
        let mut wl = self.workload.clone();
        wl.attach_data()?;
        Ok(wl)
    }

    /// The run against `target`: the one conversion from a description to a [`BenchConfig`].
    pub fn config(&self, target: SocketAddr) -> Result<BenchConfig, BenchError> {
        self.validate()?;
        let cfg = BenchConfig {
            target,
            protocol: self.protocol,
            meta_base64: self.meta_base64,
            cluster: self.cluster,
            threads: self.threads,
            connections: self.connections,
            depth: self.depth(),
            think_us: self.think_us(),
            open: match &self.mode {
                Mode::Closed(_) => None,
                Mode::Open(o) => Some(o.arrival),
            },
            plan: self.plan()?,
            requests: self.requests,
            warmup_s: self.warmup_s,
            interval_s: self.interval_s,
            timeout_ms: self.timeout_ms,
            workload: self.workload_read()?,
            seed: self.seed,
            load: self.fills(),
            stop: Default::default(),
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

/// A size as a file or flag writes it: a number of bytes or a distribution's text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SizeSpec {
    /// Bytes.
    Bytes(u64),
    /// `N`, `A-B`, `normal:M,SD`, `gev:L,S,K`, … (see [`SizeDist::parse`]).
    Text(String),
}

impl SizeSpec {
    /// The distribution.
    pub fn parse(&self) -> Result<SizeDist, BenchError> {
        match self {
            SizeSpec::Bytes(n) => Ok(SizeDist::Fixed { n: *n }),
            SizeSpec::Text(s) => SizeDist::parse(s),
        }
    }
}

macro_rules! options {
    ($($(#[$doc:meta])* $name:ident: $ty:ty,)*) => {
        /// The flat `key = value` form of a [`Load`]: `kvlab bench`'s flags (`--key`), an
        /// experiment's `[workload]` keys, `kvlab populate`'s flags. Every key is optional;
        /// absent means the [`Load`]'s default.
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
        #[serde(default, deny_unknown_fields)]
        pub struct Options {
            $($(#[$doc])* pub $name: Option<$ty>,)*
        }

        impl Options {
            /// `self`, with every key it leaves out taken from `other`.
            pub fn or(self, other: Options) -> Options {
                Options { $($name: self.$name.or(other.$name),)* }
            }
        }
    };
}

options! {
    /// `memcached` (text), `meta` or `http`.
    protocol: Protocol,
    /// Meta protocol: send keys base64-encoded.
    meta_base64: bool,
    /// The target is a kvlab cluster node: route keys by the cluster's ring.
    cluster: bool,
    /// Generator threads.
    threads: usize,
    /// Connections per thread.
    connections: usize,
    /// Requests in flight per connection (closed: pipeline depth; open: cap).
    depth: usize,
    /// Closed loop: think time, µs.
    think_us: u64,
    /// Open loop: fixed total rate, requests/s.
    qps: f64,
    /// Open loop: `poisson` or `fixed` inter-arrival times.
    arrival: Arrival,
    /// Open loop: `MIN:MAX:STEP` rate sweep, each step for the duration.
    scan: String,
    /// Seconds per rate of `qps_list`/`qps_file`; with `qps_min`/`qps_max`: a random trace's
    /// step.
    qps_interval: f64,
    /// Random trace: lowest rate, requests/s.
    qps_min: f64,
    /// Random trace: highest rate, requests/s.
    qps_max: f64,
    /// Random trace: seed.
    qps_seed: u64,
    /// Explicit rates, requests/s, each for `qps_interval`.
    qps_list: Vec<f64>,
    /// A rate file: lines `RATE` (lasting `qps_interval`) or `SECONDS RATE`.
    qps_file: PathBuf,
    /// Workload preset (`etc`).
    preset: String,
    /// Distinct keys.
    keys: u64,
    /// Key prefix.
    key_prefix: String,
    /// Key size.
    key_size: SizeSpec,
    /// Key choice: `uniform`, `sequential`, `gaussian[:M,SD]`, `zipf:S`, `hot:F:P`.
    key_dist: String,
    /// Hot set `F:P` (the same as `key_dist = "hot:F:P"`).
    hot: String,
    /// Value size.
    value_size: SizeSpec,
    /// Operation mix, `get=9,set=1`.
    mix: String,
    /// Keys per get.
    multiget: u32,
    /// Verifiable values, every hit checked.
    verify: bool,
    /// Expiry time of sets, s (0 = never).
    exptime: u32,
    /// A real data set as keys and values: a maildir tree, a JSON-lines or a CSV file.
    data: PathBuf,
    /// With `data` a maildir: a message's key, `path` (relative to the root) or `message-id`.
    data_key: DataKey,
    /// With `data`: records whose item (key + value + overhead) is larger are skipped, bytes.
    max_item_size: u64,
    /// Fill the key space before the run (default: when the mix has gets).
    load: bool,
    /// Warm-up, s.
    warmup: f64,
    /// Measured time, s.
    duration: f64,
    /// Stop after this many requests.
    requests: u64,
    /// Time-series interval, s.
    interval: f64,
    /// Request timeout, ms.
    timeout_ms: u64,
    /// Seed of every random choice.
    seed: u64,
}

impl Options {
    /// Whether these keys ask for open loop (any rate plan key given).
    pub fn is_open(&self) -> bool {
        self.qps.is_some()
            || self.scan.is_some()
            || self.qps_list.is_some()
            || self.qps_file.is_some()
            || self.qps_min.is_some()
            || self.qps_max.is_some()
    }

    /// The rate plan these keys ask for (`None`: closed loop).
    fn rate(&self) -> Result<Option<Rate>, BenchError> {
        let random = self.qps_min.is_some() || self.qps_max.is_some();
        let given: Vec<&str> = [
            ("qps", self.qps.is_some()),
            ("scan", self.scan.is_some()),
            ("qps_list", self.qps_list.is_some()),
            ("qps_file", self.qps_file.is_some()),
            ("qps_min/qps_max", random),
        ]
        .iter()
        .filter(|(_, g)| *g)
        .map(|(k, _)| *k)
        .collect();
        if given.len() > 1 {
            return Err(spec(format!(
                "give one rate plan, not {}",
                given.join(" and ")
            )));
        }
        let interval = self.qps_interval.unwrap_or(DEFAULT_QPS_INTERVAL_S);
        if let Some(qps) = self.qps {
            return Ok(Some(Rate::Fixed { qps }));
        }
        if let Some(s) = &self.scan {
            let v: Vec<f64> = s
                .split(':')
                .map(|x| x.trim().parse::<f64>())
                .collect::<Result<_, _>>()
                .map_err(|_| spec(format!("scan = {s:?}: want MIN:MAX:STEP")))?;
            let &[min, max, step] = v.as_slice() else {
                return Err(spec(format!("scan = {s:?}: want MIN:MAX:STEP")));
            };
            return Ok(Some(Rate::Scan { min, max, step }));
        }
        if let Some(rates) = &self.qps_list {
            return Ok(Some(Rate::List {
                rates: rates.clone(),
                interval_s: interval,
            }));
        }
        if let Some(path) = &self.qps_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| spec(format!("qps_file {}: {e}", path.display())))?;
            let plan = RatePlan::parse_file(&text, interval)?;
            return Ok(Some(Rate::Segments {
                segments: plan.segments,
            }));
        }
        match (self.qps_interval, self.qps_min, self.qps_max) {
            (Some(interval_s), Some(min), Some(max)) => Ok(Some(Rate::Random {
                min,
                max,
                interval_s,
                seed: self.qps_seed.unwrap_or(DEFAULT_QPS_SEED),
            })),
            (Some(_), _, _) => Err(spec(
                "qps_interval needs qps_min and qps_max, qps_list or qps_file".into(),
            )),
            (None, None, None) => Ok(None),
            (None, _, _) => Err(spec(
                "qps_min/qps_max need qps_interval (a random trace)".into(),
            )),
        }
    }

    /// The workload these keys ask for: the preset's (or the default), then each key given.
    pub fn workload(&self) -> Result<Workload, BenchError> {
        let d = Workload::default();
        let mut wl = Workload::preset(
            self.preset.as_deref(),
            self.keys.unwrap_or(d.keys),
            self.key_prefix.as_deref().unwrap_or(&d.key_prefix),
        )?;
        let ctx = |k: &'static str| move |e: BenchError| spec(format!("{k}: {e}"));
        if let Some(s) = &self.key_size {
            wl.key_size = s.parse().map_err(ctx("key_size"))?;
        }
        if let Some(s) = &self.value_size {
            wl.value_size = s.parse().map_err(ctx("value_size"))?;
        }
        if let Some(m) = &self.mix {
            wl.mix = Mix::parse(m).map_err(ctx("mix"))?;
        }
        match (&self.key_dist, &self.hot) {
            (Some(_), Some(_)) => {
                return Err(spec(
                    "give key_dist or hot, not both (hot = \"F:P\" is key_dist = \"hot:F:P\")"
                        .into(),
                ))
            }
            (Some(k), None) => wl.key_dist = KeyDist::parse(k).map_err(ctx("key_dist"))?,
            (None, Some(h)) => {
                let bad = || spec(format!("hot = {h:?}: want F:P, e.g. 0.1:0.9"));
                let (f, p) = h.split_once(':').ok_or_else(bad)?;
                let f: f64 = f.trim().parse().map_err(|_| bad())?;
                let p: f64 = p.trim().parse().map_err(|_| bad())?;
                wl.key_dist = KeyDist::hot(f, p)?;
            }
            (None, None) => {}
        }
        if let Some(m) = self.multiget {
            wl.multiget = m;
        }
        if let Some(v) = self.verify {
            wl.verify = v;
        }
        if let Some(e) = self.exptime {
            wl.exptime = e;
        }
        self.attach_data(&mut wl)?;
        Ok(wl)
    }

    /// `data`, `data_key`, `max_item_size`: the data set as the key space (read here).
    fn attach_data(&self, wl: &mut Workload) -> Result<(), BenchError> {
        let Some(path) = &self.data else {
            let stray: Vec<&str> = [
                ("data_key", self.data_key.is_some()),
                ("max_item_size", self.max_item_size.is_some()),
            ]
            .iter()
            .filter(|(_, g)| *g)
            .map(|(k, _)| *k)
            .collect();
            if !stray.is_empty() {
                return Err(spec(format!("{} need(s) data", stray.join(" and "))));
            }
            return Ok(());
        };
        let given: Vec<&str> = [
            ("preset", self.preset.is_some()),
            ("keys", self.keys.is_some()),
            ("key_prefix", self.key_prefix.is_some()),
            ("key_size", self.key_size.is_some()),
            ("value_size", self.value_size.is_some()),
        ]
        .iter()
        .filter(|(_, g)| *g)
        .map(|(k, _)| *k)
        .collect();
        if !given.is_empty() {
            return Err(spec(format!(
                "data gives the keys and values: leave out {}",
                given.join(", ")
            )));
        }
        wl.data = Some(DataSpec {
            path: path.clone(),
            key: self.data_key.unwrap_or_default(),
            max_item_size: self.max_item_size.unwrap_or(DEFAULT_MAX_ITEM_SIZE),
            base64_keys: self.meta_base64.unwrap_or(false) && self.protocol == Some(Protocol::Meta),
        });
        wl.attach_data()
    }

    /// The description these keys give, checked.
    pub fn to_load(&self) -> Result<Load, BenchError> {
        let d = Load::default();
        let mode = match self.rate()? {
            Some(rate) => {
                let mut o = Open::new(rate);
                if let Some(a) = self.arrival {
                    o.arrival = a;
                }
                if let Some(n) = self.depth {
                    o.depth = n;
                }
                Mode::Open(o)
            }
            None => {
                let mut c = Closed::default();
                if let Some(n) = self.depth {
                    c.depth = n;
                }
                if let Some(z) = self.think_us {
                    c.think_us = z;
                }
                Mode::Closed(c)
            }
        };
        let load = Load {
            protocol: self.protocol.unwrap_or(d.protocol),
            meta_base64: self.meta_base64.unwrap_or(d.meta_base64),
            cluster: self.cluster.unwrap_or(d.cluster),
            threads: self.threads.unwrap_or(d.threads),
            connections: self.connections.unwrap_or(d.connections),
            mode,
            workload: self.workload()?,
            fill: self.load.or(d.fill),
            warmup_s: self.warmup.unwrap_or(d.warmup_s),
            duration_s: self.duration.or(d.duration_s),
            requests: self.requests.or(d.requests),
            interval_s: self.interval.unwrap_or(d.interval_s),
            timeout_ms: self.timeout_ms.unwrap_or(d.timeout_ms),
            seed: self.seed.unwrap_or(d.seed),
        };
        load.validate()?;
        Ok(load)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn target() -> SocketAddr {
        ([127, 0, 0, 1], 11211).into()
    }

    #[test]
    fn no_keys_is_the_default_description() {
        let l = Options::default().to_load().unwrap();
        assert_eq!(l, Load::default());
        let from_serde: Load = serde_json::from_str("{}").unwrap();
        assert_eq!(from_serde, Load::default());
        let c = l.config(target()).unwrap();
        assert_eq!((c.threads, c.connections, c.depth), (1, 4, 1));
        assert_eq!(c.open, None);
        assert_eq!(c.plan.duration_ns(), 10_000_000_000);
        assert!(c.load, "the default mix has gets");
    }

    #[test]
    fn open_loop_defaults_its_own_depth() {
        let o = Options {
            qps: Some(5000.0),
            ..Options::default()
        };
        let l = o.to_load().unwrap();
        assert!(o.is_open() && l.is_open() && !Options::default().is_open());
        assert_eq!(l.depth(), 1024);
        let c = l.config(target()).unwrap();
        assert_eq!(c.open, Some(Arrival::Poisson));
        let open: Open = serde_json::from_str(r#"{"rate":{"plan":"fixed","qps":1}}"#).unwrap();
        assert_eq!(open, Open::new(Rate::Fixed { qps: 1.0 }));
    }

    #[test]
    fn serde_round_trips_every_mode() {
        for o in [
            Options {
                scan: Some("1000:3000:1000".into()),
                ..Options::default()
            },
            Options {
                qps_interval: Some(0.5),
                qps_min: Some(10.0),
                qps_max: Some(20.0),
                ..Options::default()
            },
            Options {
                qps_list: Some(vec![1.0, 2.0]),
                think_us: Some(3),
                ..Options::default()
            },
            Options {
                think_us: Some(3),
                depth: Some(8),
                ..Options::default()
            },
        ] {
            let l = o.to_load().unwrap();
            let json = serde_json::to_string(&l).unwrap();
            assert_eq!(serde_json::from_str::<Load>(&json).unwrap(), l, "{json}");
        }
    }

    #[test]
    fn bad_values_say_which_key() {
        let cases: &[(Options, &str)] = &[
            (
                Options {
                    threads: Some(0),
                    ..Options::default()
                },
                "threads = 0",
            ),
            (
                Options {
                    qps: Some(1.0),
                    qps_list: Some(vec![1.0]),
                    ..Options::default()
                },
                "qps and qps_list",
            ),
            (
                Options {
                    qps: Some(-5.0),
                    ..Options::default()
                },
                "qps = -5",
            ),
            (
                Options {
                    scan: Some("1:2".into()),
                    ..Options::default()
                },
                "MIN:MAX:STEP",
            ),
            (
                Options {
                    qps_interval: Some(1.0),
                    ..Options::default()
                },
                "qps_interval needs",
            ),
            (
                Options {
                    qps_min: Some(1.0),
                    ..Options::default()
                },
                "need qps_interval",
            ),
            (
                Options {
                    mix: Some("put=1".into()),
                    ..Options::default()
                },
                "mix: unknown operation",
            ),
            (
                Options {
                    key_dist: Some("zipf:1".into()),
                    hot: Some("0.1:0.9".into()),
                    ..Options::default()
                },
                "key_dist or hot",
            ),
            (
                Options {
                    depth: Some(0),
                    qps: Some(10.0),
                    ..Options::default()
                },
                "depth = 0",
            ),
            (
                Options {
                    warmup: Some(-1.0),
                    ..Options::default()
                },
                "warmup = -1",
            ),
            (
                Options {
                    preset: Some("xyz".into()),
                    ..Options::default()
                },
                "unknown workload preset",
            ),
        ];
        for (o, want) in cases {
            let e = o.to_load().unwrap_err().to_string();
            assert!(e.contains(want), "{o:?}: {e:?} lacks {want:?}");
        }
        let e = serde_json::from_str::<Options>(r#"{"client": 3}"#).unwrap_err();
        assert!(e.to_string().contains("client"), "{e}");
    }

    #[test]
    fn or_fills_only_absent_keys() {
        let a = Options {
            depth: Some(3),
            ..Options::default()
        };
        let b = Options {
            depth: Some(128),
            keys: Some(7),
            ..Options::default()
        };
        let c = a.or(b);
        assert_eq!((c.depth, c.keys), (Some(3), Some(7)));
    }

    #[test]
    fn a_request_count_without_duration_is_not_cut_at_the_default() {
        let l = Options {
            requests: Some(100),
            ..Options::default()
        }
        .to_load()
        .unwrap();
        assert!(l.plan().unwrap().duration_ns() > 100 * 1_000_000_000);
    }
}
