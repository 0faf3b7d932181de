//! Experiment files: parsing, checking, and expansion into the list of runs.
//!
//! The format is documented in the module doc of [the crate root](crate). Parsing is strict
//! (unknown keys are errors, with the key's name) so a typo never silently falls back to a
//! default.

use std::collections::BTreeSet;
use std::fmt;

use anyhow::{bail, Context};
use kvlab_bench::load::{Load, Options};
use kvlab_bench::{Config, Protocol};
use serde::{Deserialize, Serialize};

/// Default repetitions per point.
pub const DEFAULT_REPETITIONS: usize = 3;
/// Default measured seconds per run.
pub const DEFAULT_DURATION: f64 = kvlab_bench::load::DEFAULT_DURATION_S;
/// Default warm-up seconds per run.
pub const DEFAULT_WARMUP: f64 = 1.0;
/// Default confidence level of intervals.
pub const DEFAULT_CONFIDENCE: f64 = 0.95;
/// Default relative tolerance of model checks.
pub const DEFAULT_TOLERANCE: f64 = 0.10;
/// The built-in placeholder of a system's args: a fresh empty directory for every start of
/// the system (a durable server's `--data-dir`), removed when it stops.
pub const DATA_DIR: &str = "data_dir";
/// Default latency bound of a rate scan's sustained rate: p95 below this, µs.
pub const DEFAULT_SLO_P95_US: f64 = 1000.0;

/// The file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    name: Option<String>,
    description: Option<String>,
    repetitions: Option<usize>,
    duration: Option<f64>,
    warmup: Option<f64>,
    confidence: Option<f64>,
    tolerance: Option<f64>,
    slo_p95_us: Option<f64>,
    seed: Option<u64>,
    corunner: Option<String>,
    #[serde(default, rename = "system")]
    systems: Vec<SystemSpec>,
    #[serde(default)]
    workload: toml::Table,
    #[serde(default)]
    factors: toml::Table,
    design: Option<String>,
    #[serde(default)]
    points: Vec<toml::Table>,
    #[serde(default, rename = "part")]
    parts: Vec<PartSpec>,
    speedup: Option<SpeedupFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpeedupFile {
    jobs: String,
    cpus: Option<String>,
    repetitions: Option<usize>,
}

/// An experiment's `[speedup]`: each batch job of a job file alone at each of its core
/// counts, after the parts (see [`crate::speedup`]).
#[derive(Debug, Clone, PartialEq)]
pub struct SpeedupSpec {
    /// The job file: shipped (`control-jobs`, `control-jobs-quick`) or a path next to the
    /// experiment file.
    pub jobs: String,
    /// The CPUs to pin to (default: all this process may use).
    pub cpus: Option<String>,
    /// Runs per job and core count.
    pub repetitions: usize,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PartSpec {
    name: Option<String>,
    description: Option<String>,
    systems: Option<Vec<String>>,
    repetitions: Option<usize>,
    duration: Option<f64>,
    warmup: Option<f64>,
    corunner: Option<String>,
    #[serde(default)]
    workload: toml::Table,
    #[serde(default)]
    factors: toml::Table,
    design: Option<String>,
    #[serde(default)]
    points: Vec<toml::Table>,
}

/// How a system under test is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SystemKind {
    /// `kvlab server` (this executable unless `binary` says otherwise).
    Kvlab,
    /// A memcached binary (`binary`, default `memcached` on PATH).
    Memcached,
    /// Already running at `address`; not started or stopped.
    External,
    /// `kvlab proxy` (this executable unless `binary` says otherwise) in front of `backends`
    /// servers of kind `backend`, each started by the lab on its own port.
    Proxy,
}

/// The server a proxy's backends run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// `kvlab server` (the lab's kvlab executable): runs anywhere the lab does.
    #[default]
    Kvlab,
    /// `memcached` on PATH.
    Memcached,
}

impl BackendKind {
    /// The system kind a backend is started as.
    pub fn system_kind(self) -> SystemKind {
        match self {
            BackendKind::Kvlab => SystemKind::Kvlab,
            BackendKind::Memcached => SystemKind::Memcached,
        }
    }
}

/// How many backends a proxy has: a number, or a `"{factor}"` text that a factor's level
/// fills in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum BackendCount {
    /// A fixed number.
    Number(i64),
    /// Text with `{factor}` placeholders, e.g. `"{backends}"`.
    Text(String),
}

/// The most backends a proxy system may have.
pub const MAX_BACKENDS: usize = 64;

/// One system under test.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SystemSpec {
    /// Unique name, used in the report.
    pub name: String,
    /// How it starts; default: `kvlab` or `memcached` when the name is one of those.
    pub kind: Option<SystemKind>,
    /// Extra flags (`{factor}` is replaced by the point's level of that factor).
    #[serde(default)]
    pub args: Vec<String>,
    /// The program to run.
    pub binary: Option<String>,
    /// External systems: host:port.
    pub address: Option<String>,
    /// External systems: a pid whose CPU time is read from /proc.
    pub pid: Option<u32>,
    /// Skip the system (with a note) when its binary is missing.
    #[serde(default)]
    pub optional: bool,
    /// Seconds to wait for it to answer `version`.
    pub start_timeout: Option<f64>,
    /// A proxy's backends: how many (default 1; `"{factor}"` lets a factor vary it).
    pub backends: Option<BackendCount>,
    /// A proxy's backends: which server they run (default `kvlab`).
    pub backend: Option<BackendKind>,
    /// A proxy's backends: every backend's flags (`{factor}` placeholders as in `args`).
    #[serde(default)]
    pub backend_args: Vec<String>,
    /// The CPUs every thread of the system may run on, a CPU list (`"0"`, `"0-1"`; a
    /// `{factor}` placeholder lets a factor vary it); set once it is up. Default: any.
    pub cpus: Option<String>,
}

/// What a system runs with at one point, its `{factor}` placeholders filled in: a running
/// instance serves a point only when these are the same.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flags {
    /// The system's own flags.
    pub args: Vec<String>,
    /// A proxy's backends: how many, and each one's flags.
    pub backends: Option<(usize, Vec<String>)>,
    /// The CPUs its threads may run on (a CPU list), when it is pinned.
    pub cpus: Option<String>,
}

impl SystemKind {
    /// Whether a system of this kind can be loaded over `protocol` (every system speaks
    /// memcached's text and meta protocols; only a kvlab server the lab starts has an HTTP
    /// interface).
    pub fn serves(self, protocol: Protocol) -> bool {
        protocol.is_memcached_port() || self == SystemKind::Kvlab
    }
}

/// The `{placeholders}` in `texts`, in order.
fn placeholders_in<'a>(texts: impl IntoIterator<Item = &'a String>) -> Vec<String> {
    let mut out = Vec::new();
    for a in texts {
        let mut rest = a.as_str();
        while let Some(i) = rest.find('{') {
            let after = &rest[i + 1..];
            match after.find('}') {
                Some(j) => {
                    out.push(after[..j].to_string());
                    rest = &after[j + 1..];
                }
                None => break,
            }
        }
    }
    out
}

/// `texts` with the point's levels filled in.
fn render(texts: &[String], levels: &[(String, Level)]) -> Vec<String> {
    texts
        .iter()
        .map(|a| {
            let mut s = a.clone();
            for (f, l) in levels {
                s = s.replace(&format!("{{{f}}}"), &l.to_string());
            }
            s
        })
        .collect()
}

impl SystemSpec {
    /// The kind, defaulted from the name.
    pub fn kind(&self) -> anyhow::Result<SystemKind> {
        match (self.kind, self.name.as_str()) {
            (Some(k), _) => Ok(k),
            (None, "kvlab") => Ok(SystemKind::Kvlab),
            (None, "memcached") => Ok(SystemKind::Memcached),
            (None, "proxy") => Ok(SystemKind::Proxy),
            (None, n) => bail!(
                "system {n:?}: say kind = \"kvlab\", \"memcached\", \"proxy\" or \"external\""
            ),
        }
    }

    /// The `{placeholders}` used in `args` (and a proxy's `backends` and `backend_args`).
    pub fn placeholders(&self) -> Vec<String> {
        let count = match &self.backends {
            Some(BackendCount::Text(t)) => Some(t),
            _ => None,
        };
        placeholders_in(
            self.args
                .iter()
                .chain(&self.backend_args)
                .chain(count)
                .chain(&self.cpus),
        )
    }

    /// `args` with the point's levels filled in.
    pub fn render_args(&self, levels: &[(String, Level)]) -> Vec<String> {
        render(&self.args, levels)
    }

    /// Everything the system runs with at a point: its flags and, for a proxy, its backends'
    /// number and flags. An error when the number of backends is not a whole number in
    /// 1..=[`MAX_BACKENDS`].
    pub fn render(&self, levels: &[(String, Level)]) -> anyhow::Result<Flags> {
        let backends = match self.kind()? {
            SystemKind::Proxy => {
                let n = match &self.backends {
                    None => 1,
                    Some(BackendCount::Number(n)) => *n,
                    Some(BackendCount::Text(t)) => {
                        let r = render(std::slice::from_ref(t), levels).remove(0);
                        r.trim().parse::<i64>().map_err(|_| {
                            anyhow::anyhow!(
                                "system {:?}: backends = {t:?} is {r:?}, not a number",
                                self.name
                            )
                        })?
                    }
                };
                if !(1..=MAX_BACKENDS as i64).contains(&n) {
                    bail!(
                        "system {:?}: backends = {n}: a proxy needs 1 to {MAX_BACKENDS} backends",
                        self.name
                    );
                }
                Some((n as usize, render(&self.backend_args, levels)))
            }
            _ => None,
        };
        let cpus = match &self.cpus {
            None => None,
            Some(c) => {
                let r = render(std::slice::from_ref(c), levels).remove(0);
                if r.trim().is_empty()
                    || !r.split(',').flat_map(|p| p.split('-')).all(|n| {
                        !n.trim().is_empty() && n.trim().bytes().all(|b| b.is_ascii_digit())
                    })
                {
                    bail!(
                        "system {:?}: cpus = {c:?} is {r:?}, not a CPU list such as \"0\" or \"0-1,3\"",
                        self.name
                    );
                }
                Some(r.trim().to_string())
            }
        };
        Ok(Flags {
            args: self.render_args(levels),
            backends,
            cpus,
        })
    }

    /// The spec of a proxy's backend `i` (its kind, flags and start timeout), as a system of
    /// its own: what the lab starts for it.
    pub fn backend_spec(&self, i: usize, backend_args: Vec<String>) -> SystemSpec {
        let kind = self.backend.unwrap_or_default().system_kind();
        SystemSpec {
            name: format!("{}-backend{i}", self.name),
            kind: Some(kind),
            args: backend_args,
            binary: None,
            address: None,
            pid: None,
            optional: self.optional,
            start_timeout: self.start_timeout,
            backends: None,
            backend: None,
            backend_args: Vec::new(),
            cpus: None,
        }
    }

    /// Checks what the file says of one system, before any point is resolved.
    fn check(&self) -> anyhow::Result<()> {
        let kind = self.kind()?;
        let name = &self.name;
        match kind {
            SystemKind::External if self.address.is_none() => {
                bail!("system {name:?}: kind = \"external\" needs address = \"host:port\"")
            }
            SystemKind::Kvlab | SystemKind::Memcached | SystemKind::Proxy
                if self.address.is_some() =>
            {
                bail!(
                    "system {name:?}: address is only for kind = \"external\" (the lab picks a \
                     port)"
                )
            }
            _ => {}
        }
        if kind != SystemKind::Proxy {
            let given: Vec<&str> = [
                ("backends", self.backends.is_some()),
                ("backend", self.backend.is_some()),
                ("backend_args", !self.backend_args.is_empty()),
            ]
            .into_iter()
            .filter_map(|(k, set)| set.then_some(k))
            .collect();
            if !given.is_empty() {
                bail!(
                    "system {name:?}: {} only for kind = \"proxy\"",
                    match given.len() {
                        1 => format!("{} is", given[0]),
                        _ => format!("{} are", given.join(", ")),
                    }
                );
            }
            return Ok(());
        }
        match &self.backends {
            Some(BackendCount::Number(n)) if !(1..=MAX_BACKENDS as i64).contains(n) => {
                bail!("system {name:?}: backends = {n}: a proxy needs 1 to {MAX_BACKENDS} backends")
            }
            Some(BackendCount::Text(t)) if placeholders_in([t]).is_empty() => bail!(
                "system {name:?}: backends = {t:?}: give a number, or \"{{factor}}\" to vary it"
            ),
            _ => {}
        }
        for a in &self.args {
            let flag = a.split('=').next().unwrap_or_default();
            if [
                "--backend",
                "--config",
                "--log-dir",
                "-p",
                "--port",
                "-l",
                "--listen",
            ]
            .contains(&flag)
            {
                bail!(
                    "system {name:?}: remove {flag} from args; the lab starts the backends and \
                     gives the proxy its address, --backend for each and --log-dir"
                );
            }
        }
        Ok(())
    }
}

/// A factor's level: a TOML integer, float, string or boolean.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Level {
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// A string.
    Str(String),
}

impl Level {
    fn from_toml(v: &toml::Value, what: &str) -> anyhow::Result<Level> {
        Ok(match v {
            toml::Value::Integer(i) => Level::Int(*i),
            toml::Value::Float(f) => Level::Float(*f),
            toml::Value::Boolean(b) => Level::Bool(*b),
            toml::Value::String(s) => Level::Str(s.clone()),
            other => bail!("{what}: a level must be a number, string or boolean, not {other}"),
        })
    }

    fn to_toml(&self) -> toml::Value {
        match self {
            Level::Int(i) => toml::Value::Integer(*i),
            Level::Float(f) => toml::Value::Float(*f),
            Level::Bool(b) => toml::Value::Boolean(*b),
            Level::Str(s) => toml::Value::String(s.clone()),
        }
    }

    /// The level as a number, if it is one.
    pub fn number(&self) -> Option<f64> {
        match self {
            Level::Int(i) => Some(*i as f64),
            Level::Float(f) => Some(*f),
            _ => None,
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Level::Int(i) => write!(f, "{i}"),
            Level::Float(x) => write!(f, "{x}"),
            Level::Bool(b) => write!(f, "{b}"),
            Level::Str(s) => f.write_str(s),
        }
    }
}

/// How a part's points are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Design {
    /// Every combination of the factors' levels.
    Full,
    /// 2^k: every factor has exactly two levels (low, high); analysed for effects.
    TwoK,
    /// The listed `points` only.
    Points,
}

/// One part of an experiment, resolved.
#[derive(Debug, Clone)]
pub struct Part {
    /// Name (unique in the experiment).
    pub name: String,
    /// What it is for.
    pub description: Option<String>,
    /// Indices into [`Experiment::systems`].
    pub systems: Vec<usize>,
    /// Repetitions per point.
    pub repetitions: usize,
    /// Measured seconds per run.
    pub duration: f64,
    /// Warm-up seconds per run.
    pub warmup: f64,
    /// The workload table (experiment's, overridden by the part's).
    pub workload: toml::Table,
    /// Factors and their levels, in file order.
    pub factors: Vec<(String, Vec<Level>)>,
    /// The design.
    pub design: Design,
    /// The points: each a level per factor, in factor order.
    pub points: Vec<Vec<(String, Level)>>,
    /// The protocol each point speaks (parallel to `points`).
    pub protocols: Vec<Protocol>,
    /// A command run beside each run (`sh -c`, its own process group, ended after the run):
    /// interference such as `stress-ng --cache 1 --taskset 1`; `{factor}` placeholders.
    pub corunner: Option<String>,
}

impl Part {
    /// The co-runner's command at one point (`None`: none, or it renders empty).
    pub fn corunner_of(&self, levels: &[(String, Level)]) -> Option<String> {
        let c = render(std::slice::from_ref(self.corunner.as_ref()?), levels).remove(0);
        (!c.trim().is_empty()).then_some(c)
    }

    /// The workload of one point.
    pub fn workload_of(&self, levels: &[(String, Level)]) -> anyhow::Result<WorkloadSpec> {
        let mut t = self.workload.clone();
        for (f, l) in levels {
            if WORKLOAD_KEYS.contains(&f.as_str()) {
                t.insert(f.clone(), l.to_toml());
            }
        }
        toml::Value::Table(t)
            .try_into::<WorkloadSpec>()
            .map_err(|e| anyhow::anyhow!("part {:?}: workload: {}", self.name, e.message()))
    }

    /// Whether the part is a trace run (a changing open-loop rate).
    pub fn is_trace(&self) -> bool {
        self.workload.contains_key("qps_list")
    }

    /// Whether `system` can serve point `k` (its protocol).
    pub fn serves(&self, system: &SystemSpec, k: usize) -> bool {
        system
            .kind()
            .is_ok_and(|kind| kind.serves(self.protocols[k]))
    }

    /// Whether the part loads `system` over HTTP at some point: the lab then starts it with
    /// `--http-port`.
    pub fn uses_http(&self, system: &SystemSpec) -> bool {
        (0..self.points.len())
            .any(|k| self.protocols[k] == Protocol::Http && self.serves(system, k))
    }
}

/// `factor=level …`, for messages.
pub fn levels_text(levels: &[(String, Level)]) -> String {
    levels
        .iter()
        .map(|(f, l)| format!("{f}={l}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn protocol_name(p: Protocol) -> &'static str {
    p.name()
}

/// A whole experiment, resolved and checked.
#[derive(Debug, Clone)]
pub struct Experiment {
    /// Name (used in the output directory).
    pub name: String,
    /// What it is for.
    pub description: Option<String>,
    /// Confidence level of intervals.
    pub confidence: f64,
    /// Relative tolerance of model checks.
    pub tolerance: f64,
    /// A rate scan's sustained rate is the largest offered rate whose p95 stays below this
    /// (µs), with every lower rate of the scan passing too.
    pub slo_p95_us: f64,
    /// Base seed (repetition i uses seed + i).
    pub seed: u64,
    /// Systems under test.
    pub systems: Vec<SystemSpec>,
    /// Parts, run in order.
    pub parts: Vec<Part>,
    /// The batch jobs' speed-up runs after the parts, if any.
    pub speedup: Option<SpeedupSpec>,
}

/// The keys of the `[workload]` table.
pub const WORKLOAD_KEYS: &[&str] = &[
    "clients",
    "threads",
    "connections",
    "depth",
    "think_us",
    "qps",
    "arrival",
    "qps_list",
    "qps_interval",
    "preset",
    "keys",
    "key_prefix",
    "key_size",
    "key_dist",
    "value_size",
    "mix",
    "multiget",
    "verify",
    "load",
    "interval",
    "timeout_ms",
    "protocol",
    "meta_base64",
    "data",
    "data_key",
    "max_item_size",
];

/// The workload of one run: bench's flat load keys ([`Options`]: the same keys, names and
/// defaults as `kvlab bench`'s flags), plus the lab's `clients`. Every default is bench's
/// ([`kvlab_bench::load::Load`]); the lab decides none.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkloadSpec {
    /// Closed loop: total connections (sets threads × connections).
    pub clients: Option<usize>,
    /// Every other key.
    pub options: Options,
}

impl<'de> Deserialize<'de> for WorkloadSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let mut t = toml::Table::deserialize(d)?;
        let clients = match t.remove("clients") {
            None => None,
            Some(v) => Some(
                v.try_into::<usize>()
                    .map_err(|e| D::Error::custom(format!("clients: {}", e.message())))?,
            ),
        };
        let options = toml::Value::Table(t)
            .try_into::<Options>()
            .map_err(|e| D::Error::custom(e.message()))?;
        Ok(WorkloadSpec { clients, options })
    }
}

impl WorkloadSpec {
    /// Open loop (a rate or a trace).
    pub fn is_open(&self) -> bool {
        self.options.is_open()
    }

    /// Generator threads and connections per thread: `clients` split over at most
    /// `threads` threads (lowered to a divisor), else the keys (or bench's defaults).
    pub fn threads_connections(&self) -> (usize, usize) {
        let d = Load::default();
        let threads = self.options.threads.unwrap_or(d.threads);
        match self.clients {
            Some(n) => {
                let max = threads.clamp(1, n.max(1));
                let t = (1..=max).rev().find(|t| n % t == 0).unwrap_or(1);
                (t, n / t)
            }
            None => (threads, self.options.connections.unwrap_or(d.connections)),
        }
    }

    /// The bench load description of one run: the keys, `clients` resolved, and the part's
    /// duration and warm-up and the repetition's seed.
    pub fn load(&self, duration: f64, warmup: f64, seed: u64) -> anyhow::Result<Load> {
        let (threads, connections) = self.threads_connections();
        let opts = Options {
            threads: Some(threads),
            connections: Some(connections),
            duration: Some(duration),
            warmup: Some(warmup),
            seed: Some(seed),
            ..self.options.clone()
        };
        Ok(opts.to_load()?)
    }

    /// The bench configuration of one run against `target`.
    pub fn config(
        &self,
        target: std::net::SocketAddr,
        duration: f64,
        warmup: f64,
        seed: u64,
    ) -> anyhow::Result<Config> {
        Ok(self.load(duration, warmup, seed)?.config(target)?)
    }

    /// What a server holds after the load phase: reload when it changes.
    pub fn data_signature(&self) -> String {
        match self.options.workload() {
            Ok(w) => match &w.data {
                Some(d) => format!("data|{}|{:?}|{}", d.path.display(), d.key, d.max_item_size),
                None => format!(
                    "{}|{}|{}|{}",
                    w.keys, w.key_prefix, w.key_size, w.value_size
                ),
            },
            Err(e) => format!("invalid: {e}"),
        }
    }
}

fn levels_of(name: &str, v: &toml::Value) -> anyhow::Result<Vec<Level>> {
    let what = format!("factor {name:?}");
    let levels = match v {
        toml::Value::Array(a) => a
            .iter()
            .map(|x| Level::from_toml(x, &what))
            .collect::<anyhow::Result<Vec<_>>>()?,
        toml::Value::Table(t) => {
            // { from = 5000, to = 125000, step = 5000 } or { values = [...] }
            let num = |k: &str| -> anyhow::Result<Option<f64>> {
                match t.get(k) {
                    None => Ok(None),
                    Some(toml::Value::Integer(i)) => Ok(Some(*i as f64)),
                    Some(toml::Value::Float(f)) => Ok(Some(*f)),
                    Some(o) => bail!("{what}: {k} must be a number, not {o}"),
                }
            };
            for k in t.keys() {
                if !["from", "to", "step", "times"].contains(&k.as_str()) {
                    bail!("{what}: unknown key {k:?} (a range has from, to, and step or times)");
                }
            }
            let (Some(from), Some(to)) = (num("from")?, num("to")?) else {
                bail!("{what}: a range needs from and to");
            };
            let ints = t.values().all(|v| v.is_integer());
            let mut out = Vec::new();
            match (num("step")?, num("times")?) {
                (Some(step), None) if step > 0.0 && to >= from => {
                    let n = ((to - from) / step + 1e-9).floor() as usize;
                    if n > 10_000 {
                        bail!("{what}: more than 10 000 levels");
                    }
                    for i in 0..=n {
                        out.push(from + step * i as f64);
                    }
                }
                (None, Some(times)) if times > 1.0 && to >= from && from > 0.0 => {
                    let mut x = from;
                    while x <= to * (1.0 + 1e-9) {
                        out.push(x);
                        x *= times;
                        if out.len() > 10_000 {
                            bail!("{what}: more than 10 000 levels");
                        }
                    }
                }
                _ => bail!(
                    "{what}: a range needs step > 0 (arithmetic) or times > 1 (geometric), \
                     and from <= to"
                ),
            }
            out.into_iter()
                .map(|x| {
                    if ints {
                        Level::Int(x.round() as i64)
                    } else {
                        Level::Float(x)
                    }
                })
                .collect()
        }
        other => Level::from_toml(other, &what).map(|l| vec![l])?,
    };
    if levels.is_empty() {
        bail!("{what} has no levels");
    }
    Ok(levels)
}

fn expand_full(factors: &[(String, Vec<Level>)]) -> Vec<Vec<(String, Level)>> {
    // Standard order: the first factor varies fastest (as in a 2^k sign table).
    let total: usize = factors.iter().map(|(_, l)| l.len()).product();
    (0..total)
        .map(|mut i| {
            factors
                .iter()
                .map(|(f, ls)| {
                    let l = ls[i % ls.len()].clone();
                    i /= ls.len();
                    (f.clone(), l)
                })
                .collect()
        })
        .collect()
}

impl Experiment {
    /// Parses and checks an experiment file with command-line `overrides`; `default_name`
    /// names it when the file does not.
    pub fn parse(
        text: &str,
        default_name: &str,
        overrides: &Overrides,
    ) -> anyhow::Result<Experiment> {
        let mut f: FileSpec = toml::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))?;
        let sets = overrides.apply(&mut f)?;
        let confidence = f.confidence.unwrap_or(DEFAULT_CONFIDENCE);
        if !(confidence > 0.0 && confidence < 1.0) {
            bail!("confidence must be in (0, 1), e.g. 0.95");
        }
        let tolerance = f.tolerance.unwrap_or(DEFAULT_TOLERANCE);
        if !(tolerance >= 0.0 && tolerance.is_finite()) {
            bail!("tolerance must be >= 0, e.g. 0.10");
        }
        let slo_p95_us = f.slo_p95_us.unwrap_or(DEFAULT_SLO_P95_US);
        if !(slo_p95_us > 0.0 && slo_p95_us.is_finite()) {
            bail!("slo_p95_us must be > 0, e.g. 1000");
        }
        if f.systems.is_empty() {
            bail!("no systems: add at least one [[system]] (e.g. name = \"kvlab\")");
        }
        let mut names = BTreeSet::new();
        for s in &f.systems {
            if !names.insert(s.name.clone()) {
                bail!("two systems are named {:?}", s.name);
            }
            s.check()?;
        }
        let top = PartSpec {
            name: None,
            description: None,
            systems: None,
            repetitions: None,
            duration: None,
            warmup: None,
            corunner: None,
            workload: toml::Table::new(),
            factors: f.factors.clone(),
            design: f.design.clone(),
            points: f.points.clone(),
        };
        let has_top_design = !f.factors.is_empty() || f.design.is_some() || !f.points.is_empty();
        let specs: Vec<PartSpec> = if f.parts.is_empty() {
            vec![top]
        } else {
            if has_top_design {
                bail!("with [[part]]s, put factors, design and points inside each part");
            }
            std::mem::take(&mut f.parts)
        };
        let mut parts = Vec::new();
        let mut part_names = BTreeSet::new();
        for (i, p) in specs.into_iter().enumerate() {
            let name = p.name.clone().unwrap_or_else(|| {
                if i == 0 {
                    "main".into()
                } else {
                    format!("part{}", i + 1)
                }
            });
            if !part_names.insert(name.clone()) {
                bail!("two parts are named {name:?}");
            }
            let part =
                resolve_part(&f, p, name.clone()).with_context(|| format!("part {name:?}"))?;
            for (k, _) in &sets {
                if let Some((_, levels)) = part.factors.iter().find(|(f, _)| f == k) {
                    bail!(
                        "--set {k}: part {name:?} varies {k} as a factor ({} levels); a --set \
                         value would replace them all, so change the levels in the file instead",
                        levels.len()
                    );
                }
            }
            parts.push(part);
        }
        let speedup = match f.speedup {
            Some(sp) => {
                let repetitions = sp.repetitions.unwrap_or(1);
                if repetitions == 0 {
                    bail!("[speedup] repetitions must be at least 1");
                }
                Some(SpeedupSpec {
                    jobs: sp.jobs,
                    cpus: sp.cpus,
                    repetitions,
                })
            }
            None => None,
        };
        let name = f.name.clone().unwrap_or_else(|| default_name.to_string());
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        {
            bail!("name {name:?}: use letters, digits, '-', '_' or '.' (it names a directory)");
        }
        Ok(Experiment {
            name,
            description: f.description,
            confidence,
            tolerance,
            slo_p95_us,
            seed: f.seed.unwrap_or(1),
            systems: f.systems,
            parts,
            speedup,
        })
    }

    /// Runs in the order they are measured.
    pub fn runs(&self) -> Vec<PlannedRun> {
        let mut out = Vec::new();
        for (pi, p) in self.parts.iter().enumerate() {
            for rep in 0..p.repetitions {
                for k in 0..p.points.len() {
                    for &s in p.systems.iter().filter(|&&s| p.serves(&self.systems[s], k)) {
                        out.push(PlannedRun {
                            part: pi,
                            point: k,
                            system: s,
                            repetition: rep,
                        });
                    }
                }
            }
        }
        out
    }

    /// Runs left out because an optional system cannot serve a point's protocol: (system,
    /// why), one per part and system.
    pub fn unserved(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for p in &self.parts {
            for &s in &p.systems {
                let sys = &self.systems[s];
                let not: Vec<usize> = (0..p.points.len()).filter(|&k| !p.serves(sys, k)).collect();
                if let Some(&k) = not.first() {
                    let which = if not.len() == p.points.len() {
                        "any point".to_string()
                    } else {
                        format!(
                            "{} of {} points, e.g. {}",
                            not.len(),
                            p.points.len(),
                            levels_text(&p.points[k])
                        )
                    };
                    out.push((
                        sys.name.clone(),
                        format!(
                            "part {}: not run at {which}: protocol = \"{}\" is served only by \
                             a kvlab system",
                            p.name,
                            protocol_name(p.protocols[k])
                        ),
                    ));
                }
            }
        }
        out
    }

    /// Planned seconds of one run (warm-up + measured), for the progress estimate.
    pub fn planned_seconds(&self, r: &PlannedRun) -> f64 {
        let p = &self.parts[r.part];
        // The plan's length: the duration, or a trace's own length.
        let secs = p
            .workload_of(&p.points[r.point])
            .and_then(|w| Ok(w.load(p.duration, p.warmup, self.seed)?.plan()?))
            .map_or(p.duration, |plan| plan.duration_ns() as f64 / 1e9);
        secs + p.warmup
    }
}

/// Command-line overrides of an experiment file's values, for every part (the file's top
/// level and each `[[part]]` alike). Stored in `meta.json`, so a re-analysis resolves the
/// experiment as it was run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Overrides {
    /// Runs per point and system (overrides every `repetitions` of the file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repetitions: Option<usize>,
    /// Measured seconds per run (overrides every `duration`; a trace still lasts its
    /// qps_list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<f64>,
    /// Warm-up seconds per run (overrides every `warmup`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup: Option<f64>,
    /// A workload key for every part, as in [workload]; repeatable, a later one wins. VALUE is
    /// read as TOML (4096, 0.5, true, [1, 2], "text") or else taken as text (get=9,set=1).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set: Vec<String>,
}

impl Overrides {
    /// Whether nothing is overridden.
    pub fn is_empty(&self) -> bool {
        *self == Overrides::default()
    }

    /// The overrides as the flags that give them, e.g. `--repetitions 1 --set keys=1000`.
    pub fn flags(&self) -> String {
        let mut out: Vec<String> = Vec::new();
        if let Some(n) = self.repetitions {
            out.push(format!("--repetitions {n}"));
        }
        if let Some(s) = self.duration {
            out.push(format!("--duration {s}"));
        }
        if let Some(s) = self.warmup {
            out.push(format!("--warmup {s}"));
        }
        out.extend(self.set.iter().map(|kv| format!("--set {kv}")));
        out.join(" ")
    }

    /// The `--set` assignments, each key checked and its value read.
    fn assignments(&self) -> anyhow::Result<Vec<(String, toml::Value)>> {
        self.set
            .iter()
            .map(|kv| {
                let Some((k, v)) = kv.split_once('=') else {
                    bail!("--set {kv}: expected KEY=VALUE, e.g. --set keys=1000");
                };
                let k = k.trim();
                check_workload_key(k).with_context(|| format!("--set {kv}"))?;
                // A TOML value when it is one (numbers, booleans, arrays, quoted strings),
                // else the text as a string: `mix=get=9,set=1`, `protocol=http`.
                let value = toml::from_str::<toml::Table>(&format!("v = {v}"))
                    .ok()
                    .and_then(|mut t| t.remove("v"))
                    .unwrap_or_else(|| toml::Value::String(v.to_string()));
                Ok((k.to_string(), value))
            })
            .collect()
    }

    /// Writes the overrides into the file's values (top level and every part); returns the
    /// `--set` assignments.
    fn apply(&self, f: &mut FileSpec) -> anyhow::Result<Vec<(String, toml::Value)>> {
        let sets = self.assignments()?;
        f.repetitions = self.repetitions.or(f.repetitions);
        f.duration = self.duration.or(f.duration);
        f.warmup = self.warmup.or(f.warmup);
        f.workload.extend(sets.iter().cloned());
        for p in &mut f.parts {
            p.repetitions = self.repetitions.or(p.repetitions);
            p.duration = self.duration.or(p.duration);
            p.warmup = self.warmup.or(p.warmup);
            p.workload.extend(sets.iter().cloned());
        }
        Ok(sets)
    }
}

/// One run to do: a point of a part against a system, one repetition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedRun {
    /// Index of the part.
    pub part: usize,
    /// Index of the point in the part.
    pub point: usize,
    /// Index of the system.
    pub system: usize,
    /// Repetition, from 0.
    pub repetition: usize,
}

fn check_workload_key(k: &str) -> anyhow::Result<()> {
    if !WORKLOAD_KEYS.contains(&k) {
        bail!(
            "unknown workload key {k:?} (known: {})",
            WORKLOAD_KEYS.join(", ")
        );
    }
    Ok(())
}

fn positive_secs(what: &str, v: f64, zero_ok: bool) -> anyhow::Result<f64> {
    if !v.is_finite() || v < 0.0 || (!zero_ok && v == 0.0) || v > 86_400.0 {
        bail!(
            "{what} = {v}: must be {} seconds (at most a day)",
            if zero_ok { ">= 0" } else { "> 0" }
        );
    }
    Ok(v)
}

fn resolve_part(f: &FileSpec, p: PartSpec, name: String) -> anyhow::Result<Part> {
    let systems: Vec<usize> = match &p.systems {
        None => (0..f.systems.len()).collect(),
        Some(names) => names
            .iter()
            .map(|n| {
                f.systems
                    .iter()
                    .position(|s| &s.name == n)
                    .with_context(|| format!("unknown system {n:?} in systems"))
            })
            .collect::<anyhow::Result<_>>()?,
    };
    if systems.is_empty() {
        bail!("no systems");
    }
    let repetitions = p
        .repetitions
        .or(f.repetitions)
        .unwrap_or(DEFAULT_REPETITIONS);
    if !(1..=1000).contains(&repetitions) {
        bail!("repetitions must be in 1..=1000");
    }
    let duration = positive_secs(
        "duration",
        p.duration.or(f.duration).unwrap_or(DEFAULT_DURATION),
        false,
    )?;
    let warmup = positive_secs(
        "warmup",
        p.warmup.or(f.warmup).unwrap_or(DEFAULT_WARMUP),
        true,
    )?;
    let mut workload = f.workload.clone();
    for (k, v) in p.workload {
        workload.insert(k, v);
    }
    for k in workload.keys() {
        check_workload_key(k)?;
    }
    let mut factors = Vec::new();
    for (k, v) in &p.factors {
        if [
            "design",
            "points",
            "repetitions",
            "duration",
            "warmup",
            "systems",
            "corunner",
        ]
        .contains(&k.as_str())
        {
            bail!(
                "{k:?} is inside [factors]: in TOML, keys after a [table] header belong to that \
                 table; move `{k} = …` above the [factors] header"
            );
        }
        factors.push((k.clone(), levels_of(k, v)?));
    }
    let design = match p.design.as_deref() {
        None if !p.points.is_empty() => Design::Points,
        None | Some("full") => Design::Full,
        Some("2k") => Design::TwoK,
        Some("points") => Design::Points,
        Some(o) => bail!("design {o:?}: full, 2k or points"),
    };
    let points: Vec<Vec<(String, Level)>> = match design {
        Design::Full => {
            if !p.points.is_empty() {
                bail!("points are listed but design = \"full\": use design = \"points\"");
            }
            expand_full(&factors)
        }
        Design::TwoK => {
            if factors.is_empty() {
                bail!("design = \"2k\" needs factors");
            }
            if factors.len() > 10 {
                bail!("design = \"2k\": at most 10 factors");
            }
            for (f, ls) in &factors {
                if ls.len() != 2 {
                    bail!(
                        "design = \"2k\": factor {f:?} has {} levels; give exactly two [low, high]",
                        ls.len()
                    );
                }
            }
            if !p.points.is_empty() {
                bail!("points are listed but design = \"2k\"");
            }
            expand_full(&factors)
        }
        Design::Points => {
            if p.points.is_empty() {
                bail!("design = \"points\" needs points = [{{ factor = level, … }}, …]");
            }
            // Factor order: the factors table, then keys in order of first appearance.
            let mut order: Vec<String> = factors.iter().map(|(f, _)| f.clone()).collect();
            for pt in &p.points {
                for k in pt.keys() {
                    if !order.contains(k) {
                        order.push(k.clone());
                    }
                }
            }
            let mut pts = Vec::new();
            for (i, pt) in p.points.iter().enumerate() {
                let mut row = Vec::new();
                for f in &order {
                    let l = match pt.get(f) {
                        Some(v) => Level::from_toml(v, &format!("point {} factor {f:?}", i + 1))?,
                        None => match factors.iter().find(|(n, _)| n == f) {
                            Some((_, ls)) if ls.len() == 1 => ls[0].clone(),
                            _ => bail!("point {} has no level for factor {f:?}", i + 1),
                        },
                    };
                    row.push((f.clone(), l));
                }
                pts.push(row);
            }
            factors = order
                .iter()
                .map(|f| {
                    let mut ls: Vec<Level> = Vec::new();
                    for row in &pts {
                        for (n, l) in row {
                            if n == f && !ls.contains(l) {
                                ls.push(l.clone());
                            }
                        }
                    }
                    (f.clone(), ls)
                })
                .collect();
            pts
        }
    };
    if points.len() > 100_000 {
        bail!("{} points: too many", points.len());
    }
    // Every factor must act on something, and every placeholder must be defined.
    let corunner = p.corunner.clone().or_else(|| f.corunner.clone());
    let used: BTreeSet<String> = systems
        .iter()
        .flat_map(|&s| f.systems[s].placeholders())
        .chain(placeholders_in(&corunner))
        .collect();
    for (fname, _) in &factors {
        if !WORKLOAD_KEYS.contains(&fname.as_str()) && !used.contains(fname) {
            bail!(
                "factor {fname:?} is neither a workload key ({}) nor used as {{{fname}}} in a \
                 system's args or cpus, or the corunner",
                WORKLOAD_KEYS.join(", ")
            );
        }
    }
    for u in used.iter().filter(|u| u.as_str() != DATA_DIR) {
        if !factors.iter().any(|(f, _)| f == u) {
            bail!("a system's args (or cpus, or the corunner) use {{{u}}} but the part has no factor {u:?}");
        }
    }
    // A proxy's number of backends at every point, now.
    for &s in &systems {
        for pt in &points {
            f.systems[s].render(pt)?;
        }
    }
    let mut part = Part {
        name,
        description: p.description,
        systems,
        repetitions,
        duration,
        warmup,
        workload,
        factors,
        design,
        points,
        protocols: Vec::new(),
        corunner,
    };
    // Check every point's workload now, not an hour into the run.
    let dummy: std::net::SocketAddr = ([127, 0, 0, 1], 1).into();
    for pt in &part.points {
        let w = part.workload_of(pt)?;
        let cfg = w
            .config(dummy, duration, warmup, 1)
            .with_context(|| match pt.is_empty() {
                true => "the workload".to_string(),
                false => format!("point {}", levels_text(pt)),
            })?;
        part.protocols.push(cfg.protocol);
    }
    check_protocols(&f.systems, &part)?;
    Ok(part)
}

/// Every system of the part must serve every point's protocol, unless it is optional (then
/// its runs at those points are left out, see [`Experiment::unserved`]); a kvlab system that
/// speaks HTTP gets its `--http-port` from the lab.
fn check_protocols(systems: &[SystemSpec], part: &Part) -> anyhow::Result<()> {
    for &s in &part.systems {
        let sys = &systems[s];
        let kind = sys.kind()?;
        if let Some(&p) = part.protocols.iter().find(|&&p| !kind.serves(p)) {
            if !sys.optional {
                bail!(
                    "system {:?} cannot serve protocol = \"{}\": only a kvlab system has an HTTP \
                     interface; leave it out of this part (systems = [...]), or mark it \
                     optional = true to skip its runs at those points",
                    sys.name,
                    protocol_name(p)
                );
            }
        }
        if part.uses_http(sys)
            && sys
                .args
                .iter()
                .any(|a| a == "--http-port" || a.starts_with("--http-port="))
        {
            bail!(
                "system {:?}: remove --http-port from args; the lab picks the HTTP port itself",
                sys.name
            );
        }
    }
    let runnable =
        (0..part.points.len()).any(|k| part.systems.iter().any(|&s| part.serves(&systems[s], k)));
    if !runnable {
        bail!("no system of this part serves its protocol (only a kvlab system serves HTTP)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_experiments_parse() {
        for (name, text) in crate::SHIPPED {
            if crate::workflow::is_workflow(text) {
                crate::workflow::WorkflowSpec::parse(text)
                    .unwrap_or_else(|e| panic!("{name}: {e:#}"));
                continue;
            }
            if crate::scaling::is_scaling(text) {
                crate::scaling::ScalingSpec::parse(text, name)
                    .unwrap_or_else(|e| panic!("{name}: {e:#}"));
                continue;
            }
            if crate::faults::is_faults(text) {
                crate::faults::FaultsSpec::parse(text, name, &Overrides::default())
                    .unwrap_or_else(|e| panic!("{name}: {e:#}"));
                continue;
            }
            let e = Experiment::parse(text, name, &Overrides::default())
                .unwrap_or_else(|e| panic!("{name}: {e:#}"));
            assert!(!e.runs().is_empty(), "{name}");
        }
    }

    #[test]
    fn data_dir_is_built_in_and_other_placeholders_need_a_factor() {
        let file = |arg: &str| {
            format!(
                "[[system]]\nname = \"kvlab\"\nargs = [\"--data-dir\", \"{arg}\"]\n\
                 [factors]\nclients = [1, 2]\n"
            )
        };
        let e = Experiment::parse(&file("{data_dir}"), "x", &Overrides::default()).unwrap();
        assert_eq!(
            e.systems[0].render_args(&e.parts[0].points[0])[1],
            "{data_dir}"
        );
        let err = Experiment::parse(&file("{dir}"), "x", &Overrides::default()).unwrap_err();
        assert!(format!("{err:#}").contains("no factor \"dir\""), "{err:#}");
    }

    #[test]
    fn cpus_and_the_corunner_are_factors() {
        let e = Experiment::parse(
            r#"
            corunner = "stress-ng --{stressor} 1 --taskset 0"
            [[system]]
            name = "kvlab"
            args = ["-t", "{threads}"]
            cpus = "{cpus}"
            [workload]
            qps = 1000
            [factors]
            threads = [1, 2]
            cpus = ["0", "0-1"]
            stressor = ["cpu", "stream"]
            "#,
            "x",
            &Overrides::default(),
        )
        .unwrap();
        let p = &e.parts[0];
        let last = p.points.last().unwrap();
        assert_eq!(
            e.systems[0].render(last).unwrap().cpus.as_deref(),
            Some("0-1")
        );
        assert_eq!(
            p.corunner_of(last).as_deref(),
            Some("stress-ng --stream 1 --taskset 0")
        );
        // A corunner placeholder needs its factor; a bad CPU list is refused.
        for (text, want) in [
            (
                "corunner = \"x {k}\"\n[[system]]\nname = \"kvlab\"\n",
                "no factor \"k\"",
            ),
            (
                "[[system]]\nname = \"kvlab\"\ncpus = \"{c}\"\n[factors]\nc = [\"a\"]\n",
                "not a CPU list",
            ),
        ] {
            let err = Experiment::parse(text, "x", &Overrides::default()).unwrap_err();
            assert!(format!("{err:#}").contains(want), "{err:#}");
        }
    }

    #[test]
    fn ranges_and_2k_expand() {
        let e = Experiment::parse(
            r#"
            design = "2k"
            [[system]]
            name = "kvlab"
            args = ["-t", "{server_threads}"]
            [workload]
            clients = 4
            [factors]
            server_threads = [1, 4]
            value_size = [100, 10000]
            "#,
            "x",
            &Overrides::default(),
        )
        .unwrap();
        let p = &e.parts[0];
        assert_eq!(p.points.len(), 4);
        assert_eq!(p.points[1][0].1, Level::Int(4));
        assert_eq!(p.points[1][1].1, Level::Int(100));
        let e = Experiment::parse(
            r#"
            [[system]]
            name = "kvlab"
            [factors]
            qps = { from = 5000, to = 125000, step = 5000 }
            "#,
            "x",
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(e.parts[0].points.len(), 25);
    }

    #[test]
    fn typos_are_errors() {
        let err = Experiment::parse(
            "[[system]]\nname = \"kvlab\"\n[workload]\nclient = 3\n",
            "x",
            &Overrides::default(),
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("client"), "{err:#}");
        let err = Experiment::parse(
            "[[system]]\nname = \"kvlab\"\n[factors]\nserver_threads = [1, 2]\n",
            "x",
            &Overrides::default(),
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("server_threads"), "{err:#}");
    }

    #[test]
    fn http_points_leave_out_optional_systems_that_cannot_serve_them() {
        let e = Experiment::parse(
            r#"
            [[system]]
            name = "kvlab"
            [[system]]
            name = "memcached"
            optional = true
            [factors]
            protocol = ["memcached", "http"]
            "#,
            "x",
            &Overrides::default(),
        )
        .unwrap();
        let p = &e.parts[0];
        assert_eq!(p.protocols, [Protocol::Memcached, Protocol::Http]);
        let runs: Vec<(usize, usize)> = e.runs().iter().map(|r| (r.point, r.system)).collect();
        assert_eq!(runs.len(), 3 * DEFAULT_REPETITIONS);
        assert!(!runs.contains(&(1, 1)), "memcached at the HTTP point");
        assert!(p.uses_http(&e.systems[0]) && !p.uses_http(&e.systems[1]));
        assert_eq!(e.unserved().len(), 1);
        assert!(
            e.unserved()[0].1.contains("protocol=http"),
            "{:?}",
            e.unserved()
        );
    }

    #[test]
    fn meta_points_are_served_by_every_system() {
        let e = Experiment::parse(
            r#"
            [[system]]
            name = "kvlab"
            [[system]]
            name = "memcached"
            [workload]
            meta_base64 = true
            [factors]
            protocol = ["memcached", "meta"]
            "#,
            "x",
            &Overrides::default(),
        );
        // meta_base64 with the text protocol is refused...
        let err = e.unwrap_err();
        assert!(format!("{err:#}").contains("needs protocol"), "{err:#}");
        // ...and a meta point runs on both systems, over their memcached port.
        let e = Experiment::parse(
            r#"
            [[system]]
            name = "kvlab"
            [[system]]
            name = "memcached"
            [workload]
            protocol = "meta"
            meta_base64 = true
            "#,
            "x",
            &Overrides::default(),
        )
        .unwrap();
        let p = &e.parts[0];
        assert_eq!(p.protocols, [Protocol::Meta]);
        assert_eq!(e.runs().len(), 2 * DEFAULT_REPETITIONS);
        assert!(e.unserved().is_empty());
        assert!(!p.uses_http(&e.systems[0]) && !p.uses_http(&e.systems[1]));
    }

    #[test]
    fn set_values_are_toml_or_text() {
        let ov = Overrides {
            set: [
                "keys=1000",
                "mix=get=9,set=1",
                "verify=true",
                "qps_list=[1, 2.5]",
            ]
            .map(String::from)
            .to_vec(),
            ..Overrides::default()
        };
        let a = ov.assignments().unwrap();
        assert_eq!(a[0], ("keys".into(), toml::Value::Integer(1000)));
        assert_eq!(
            a[1],
            ("mix".into(), toml::Value::String("get=9,set=1".into()))
        );
        assert_eq!(a[2], ("verify".into(), toml::Value::Boolean(true)));
        assert!(a[3].1.is_array());
        assert_eq!(
            ov.flags(),
            "--set keys=1000 --set mix=get=9,set=1 --set verify=true --set qps_list=[1, 2.5]"
        );
    }

    #[test]
    fn proxy_systems_render_their_backends_and_are_checked() {
        let e = Experiment::parse(
            r#"
            [[system]]
            name = "proxy"
            args = ["-t", "{workers}", "--io", "epoll"]
            backends = "{backends}"
            backend = "memcached"
            backend_args = ["-m", "{mem}"]
            [factors]
            backends = [1, 3]
            workers = [8]
            mem = [64]
            "#,
            "x",
            &Overrides::default(),
        )
        .unwrap();
        let sys = &e.systems[0];
        assert_eq!(sys.kind().unwrap(), SystemKind::Proxy);
        let flags = sys.render(&e.parts[0].points[1]).unwrap();
        assert_eq!(flags.args, ["-t", "8", "--io", "epoll"]);
        assert_eq!(flags.backends, Some((3, vec!["-m".into(), "64".into()])));
        let b = sys.backend_spec(2, vec!["-m".into(), "64".into()]);
        assert_eq!(b.kind, Some(SystemKind::Memcached));
        assert_eq!(b.name, "proxy-backend2");
        // Defaults: one kvlab backend, no flags.
        let e = Experiment::parse(
            "[[system]]\nname = \"p\"\nkind = \"proxy\"\n",
            "x",
            &Overrides::default(),
        )
        .unwrap();
        let flags = e.systems[0].render(&[]).unwrap();
        assert_eq!(flags.backends, Some((1, Vec::new())));
        assert_eq!(
            e.systems[0].backend_spec(0, Vec::new()).kind,
            Some(SystemKind::Kvlab)
        );
        // A kvlab server has no backends.
        let e = Experiment::parse("[[system]]\nname = \"kvlab\"\n", "x", &Overrides::default())
            .unwrap();
        assert_eq!(e.systems[0].render(&[]).unwrap().backends, None);

        let err = |text: &str| {
            let e = Experiment::parse(text, "x", &Overrides::default()).unwrap_err();
            format!("{e:#}")
        };
        let proxy = "[[system]]\nname = \"p\"\nkind = \"proxy\"\n";
        let e = err(&format!("{proxy}backends = 0\n"));
        assert!(e.contains("1 to 64 backends"), "{e}");
        let e = err(&format!(
            "{proxy}backends = \"{{n}}\"\n[factors]\nn = [1, 0]\nclients = [1]\n"
        ));
        assert!(e.contains("backends = 0"), "{e}");
        let e = err(&format!(
            "{proxy}backends = \"{{n}}\"\n[factors]\nn = [\"two\"]\n"
        ));
        assert!(e.contains("not a number"), "{e}");
        let e = err(&format!("{proxy}backends = \"three\"\n"));
        assert!(e.contains("give a number"), "{e}");
        let e = err(&format!("{proxy}address = \"127.0.0.1:1\"\n"));
        assert!(e.contains("address is only for"), "{e}");
        let e = err(&format!("{proxy}args = [\"--backend\", \"127.0.0.1:1\"]\n"));
        assert!(e.contains("remove --backend"), "{e}");
        let e = err(&format!("{proxy}backend = \"redis\"\n"));
        assert!(e.contains("redis"), "{e}");
        let e = err("[[system]]\nname = \"kvlab\"\nbackends = 3\nbackend_args = [\"-t\"]\n");
        assert!(
            e.contains("backends, backend_args are only for kind = \"proxy\""),
            "{e}"
        );
        let e = err(&format!("{proxy}backend_arg = []\n"));
        assert!(e.contains("backend_arg"), "{e}");
        // A proxy has no HTTP interface.
        let e = err(&format!("{proxy}[workload]\nprotocol = \"http\"\n"));
        assert!(e.contains("cannot serve protocol"), "{e}");
    }

    #[test]
    fn clients_split_over_threads() {
        let mut w: WorkloadSpec = toml::from_str("clients = 6\nthreads = 4").unwrap();
        assert_eq!(w.threads_connections(), (3, 2));
        w.clients = Some(1);
        assert_eq!(w.threads_connections(), (1, 1));
    }
}
