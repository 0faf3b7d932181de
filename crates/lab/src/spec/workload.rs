//! A part's workload: the `[workload]` keys, and one run's bench load and configuration.

use anyhow::bail;
use kvlab_bench::load::{Load, Options};
use kvlab_bench::BenchConfig;
use serde::Deserialize;

use crate::generator::Generator;

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
    "generator",
    "generator_cpus",
];

/// The workload of one run: bench's flat load keys ([`Options`]: the same keys, names and
/// defaults as `kvlab bench`'s flags), plus the lab's `clients` and `generator`. Every
/// default is bench's ([`kvlab_bench::load::Load`]); the lab decides none.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkloadSpec {
    /// Closed loop: total connections (sets threads × connections).
    pub clients: Option<usize>,
    /// The program that issues the load (default kvlab bench; see [`crate::generator`]).
    pub generator: Generator,
    /// The CPUs the load generator runs on (kvlab bench's threads, or the external
    /// program); none: wherever the lab may run.
    pub generator_cpus: Option<kvlab_control::CpuSet>,
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
        let generator = match t.remove("generator") {
            None => Generator::default(),
            Some(v) => v.try_into::<Generator>().map_err(|e| {
                D::Error::custom(format!(
                    "generator: {} (one of {})",
                    e.message(),
                    Generator::NAMES
                ))
            })?,
        };
        let generator_cpus = match t.remove("generator_cpus") {
            None => None,
            Some(v) => {
                let text = match &v {
                    toml::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                let set = text
                    .parse::<kvlab_control::CpuSet>()
                    .ok()
                    .filter(|s| !s.is_empty())
                    .ok_or_else(|| {
                        D::Error::custom(format!(
                            "generator_cpus = {v}: not a CPU list such as \"1\" or \"0-1,3\""
                        ))
                    })?;
                Some(set)
            }
        };
        let options = toml::Value::Table(t)
            .try_into::<Options>()
            .map_err(|e| D::Error::custom(e.message()))?;
        Ok(WorkloadSpec {
            clients,
            generator,
            generator_cpus,
            options,
        })
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
    ) -> anyhow::Result<BenchConfig> {
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

/// An error unless `k` is one of [`WORKLOAD_KEYS`].
pub(super) fn check_workload_key(k: &str) -> anyhow::Result<()> {
    if !WORKLOAD_KEYS.contains(&k) {
        bail!(
            "unknown workload key {k:?} (known: {})",
            WORKLOAD_KEYS.join(", ")
        );
    }
    Ok(())
}
