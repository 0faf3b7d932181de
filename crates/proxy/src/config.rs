//! What a proxy is told: its pools of backends and how requests are routed to them, from
//! flags or a TOML file. Every default is stated once, here, and documented in docs/proxy.md.
//!
//! ```toml
//! workers = 0                 # workers (-t); 0: one per CPU under --io reactor, 8 under epoll
//! timeout_ms = 1000           # a backend request not answered by then fails
//! failure_limit = 2           # consecutive failures that eject a backend from reads
//! retry_timeout_ms = 1000     # how often an ejected backend is probed
//!
//! [[pool]]
//! name = "pool0"
//! prefix = ""                 # keys starting with this go to this pool ("" = all others)
//! distribution = "ketama"     # or "modula"
//! replicas = 1                # copies of every key (R = number of backends: all everywhere)
//! write_policy = "all"        # or "majority"
//! read_policy = "round-robin" # or "least-outstanding"
//! multiget = "sharded"        # or "single"
//! backends = ["127.0.0.1:11212", "127.0.0.1:11213:2"]   # host:port[:weight] [name]
//! ```

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::ring::{Backend, Distribution, PoolRing, RingError};

/// Workers when the configuration leaves them to the proxy (`workers = 0`, the default):
/// under `--io epoll`, whose helper threads wait on the backends, this many; under
/// `--io reactor`, whose event loops each keep a core busy, one per CPU.
pub const EPOLL_WORKERS: usize = 8;
/// Default backend request timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(1000);
/// Default consecutive failures that eject a backend from reads (twemproxy's
/// `server_failure_limit` default).
pub const DEFAULT_FAILURE_LIMIT: u32 = 2;
/// Default interval between probes of an ejected backend.
pub const DEFAULT_RETRY_TIMEOUT: Duration = Duration::from_millis(1000);
/// Most replicas of a key.
pub const MAX_REPLICAS: usize = 16;

/// When a replicated write is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReplicaWritePolicy {
    /// Success only when every replica succeeded; else the first failure.
    All,
    /// Success as soon as a majority of replicas succeeded.
    Majority,
}

/// Which replica serves a read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReadPolicy {
    /// The next replica in turn (per worker).
    RoundRobin,
    /// The replica with the fewest requests outstanding.
    LeastOutstanding,
}

/// How a multi-key get is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MultiGet {
    /// One request per backend holding some of the keys, sent in parallel, merged in key order.
    Sharded,
    /// The whole request to one backend (every backend must hold every key).
    Single,
}

macro_rules! from_str_via_serde {
    ($($t:ty: $what:literal),*) => {$(
        impl std::str::FromStr for $t {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                <$t>::deserialize(serde::de::value::StrDeserializer::<serde::de::value::Error>::new(s))
                    .map_err(|_| format!("unknown {} {s:?}", $what))
            }
        }
    )*};
}
from_str_via_serde!(ReplicaWritePolicy: "write policy", ReadPolicy: "read policy", MultiGet: "multi-get mode");

/// One pool: backends sharing a key space.
#[derive(Clone, Debug)]
pub struct Pool {
    /// A kvlab cluster's ring (`--cluster`): the backends are its nodes, in its order, and
    /// keys go where it says.
    pub cluster: Option<std::sync::Arc<kvlab_ring::Ring>>,
    /// Its name (in stats and logs).
    pub name: String,
    /// Keys starting with this prefix go to this pool; `""` takes every key no other pool takes.
    pub prefix: String,
    /// Its backends.
    pub backends: Vec<Backend>,
    /// Key → backend map.
    pub distribution: Distribution,
    /// Copies of every key (1 ..= backends).
    pub replicas: usize,
    /// When a replicated write is answered.
    pub write_policy: ReplicaWritePolicy,
    /// Which replica serves a read.
    pub read_policy: ReadPolicy,
    /// How a multi-key get is sent.
    pub multiget: MultiGet,
}

impl Pool {
    /// A pool of `backends` with every other setting at its default.
    pub fn new(backends: Vec<Backend>) -> Pool {
        Pool {
            cluster: None,
            name: "pool0".into(),
            prefix: String::new(),
            backends,
            distribution: Distribution::Ketama,
            replicas: 1,
            write_policy: ReplicaWritePolicy::All,
            read_policy: ReadPolicy::RoundRobin,
            multiget: MultiGet::Sharded,
        }
    }
}

/// Everything that routes requests; what a reload replaces.
#[derive(Clone, Debug)]
pub struct ProxyConfig {
    /// The pools, checked in order of longest prefix first.
    pub pools: Vec<Pool>,
    /// Workers (event loops or helper threads); 0 leaves it to the proxy
    /// ([`ProxyConfig::workers_for`]).
    pub workers: usize,
    /// A backend request not answered by then fails.
    pub timeout: Duration,
    /// Consecutive failures that eject a backend from reads.
    pub failure_limit: u32,
    /// Interval between probes of an ejected backend.
    pub retry_timeout: Duration,
    /// A node of the kvlab cluster to follow (`--cluster`): the one pool's backends and ring
    /// come from the cluster's live ring, and MOVED/TRYAGAIN replies are followed.
    pub cluster: Option<String>,
}

/// A configuration that can't be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The TOML is malformed or has unknown keys.
    #[error("{0}")]
    Toml(String),
    /// A setting is out of range or inconsistent.
    #[error("{0}")]
    Invalid(String),
    /// A pool's ring can't be built.
    #[error("pool {pool}: {source}")]
    Ring {
        /// The pool.
        pool: String,
        /// Why.
        source: RingError,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    workers: Option<usize>,
    timeout_ms: Option<u64>,
    failure_limit: Option<u32>,
    retry_timeout_ms: Option<u64>,
    #[serde(default)]
    pool: Vec<FilePool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FilePool {
    name: Option<String>,
    #[serde(default)]
    prefix: String,
    backends: Vec<String>,
    distribution: Option<String>,
    replicas: Option<usize>,
    write_policy: Option<ReplicaWritePolicy>,
    read_policy: Option<ReadPolicy>,
    multiget: Option<MultiGet>,
}

impl ProxyConfig {
    /// One pool of `backends`, every setting at its default.
    pub fn new(backends: Vec<Backend>) -> ProxyConfig {
        ProxyConfig {
            pools: vec![Pool::new(backends)],
            workers: 0,
            timeout: DEFAULT_TIMEOUT,
            failure_limit: DEFAULT_FAILURE_LIMIT,
            retry_timeout: DEFAULT_RETRY_TIMEOUT,
            cluster: None,
        }
    }

    /// The configuration for following a kvlab cluster whose ring is `ring` (seed `seed`):
    /// one pool of its nodes.
    pub fn of_cluster(
        &self,
        seed: &str,
        ring: kvlab_ring::Ring,
    ) -> Result<ProxyConfig, ConfigError> {
        let backends = ring
            .nodes()
            .iter()
            .map(|n| parse_backend(n))
            .collect::<Result<Vec<_>, _>>()?;
        let mut pool = Pool::new(backends);
        pool.cluster = Some(std::sync::Arc::new(ring));
        Ok(ProxyConfig {
            pools: vec![pool],
            cluster: Some(seed.to_string()),
            ..self.clone()
        })
    }

    /// Reads and checks a TOML file.
    pub fn load(path: &Path) -> Result<ProxyConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        ProxyConfig::parse(&text)
    }

    /// Parses and checks TOML text.
    pub fn parse(text: &str) -> Result<ProxyConfig, ConfigError> {
        let file: File = toml::from_str(text).map_err(|e| ConfigError::Toml(e.to_string()))?;
        let mut config = ProxyConfig::new(Vec::new());
        config.pools.clear();
        if let Some(w) = file.workers {
            config.workers = w;
        }
        if let Some(ms) = file.timeout_ms {
            config.timeout = Duration::from_millis(ms);
        }
        if let Some(k) = file.failure_limit {
            config.failure_limit = k;
        }
        if let Some(ms) = file.retry_timeout_ms {
            config.retry_timeout = Duration::from_millis(ms);
        }
        for (i, p) in file.pool.into_iter().enumerate() {
            let backends = p
                .backends
                .iter()
                .map(|b| parse_backend(b))
                .collect::<Result<Vec<_>, _>>()?;
            let mut pool = Pool::new(backends);
            pool.name = p.name.unwrap_or_else(|| format!("pool{i}"));
            pool.prefix = p.prefix;
            if let Some(d) = p.distribution {
                pool.distribution = parse_distribution(&d)?;
            }
            pool.replicas = p.replicas.unwrap_or(1);
            pool.write_policy = p.write_policy.unwrap_or(ReplicaWritePolicy::All);
            pool.read_policy = p.read_policy.unwrap_or(ReadPolicy::RoundRobin);
            pool.multiget = p.multiget.unwrap_or(MultiGet::Sharded);
            config.pools.push(pool);
        }
        config.check()?;
        Ok(config)
    }

    /// The workers to run under `io`: as configured, or when left to the proxy (0) one
    /// event loop per CPU (`--io reactor`) or [`EPOLL_WORKERS`] helper threads.
    pub fn workers_for(&self, io: crate::ProxyIo) -> usize {
        match (self.workers, io) {
            (0, crate::ProxyIo::Reactor) => {
                std::thread::available_parallelism().map_or(1, |n| n.get())
            }
            (0, crate::ProxyIo::Epoll) => EPOLL_WORKERS,
            (w, _) => w,
        }
    }

    /// Checks ranges and consistency (also of a configuration built from flags).
    pub fn check(&self) -> Result<(), ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(m));
        if self.pools.is_empty() {
            return invalid("no backends: give --backend HOST:PORT or a [[pool]]".into());
        }
        if self.workers > 1024 {
            return invalid(format!(
                "workers = {}: must be 1..=1024 (or 0: one per CPU under --io reactor, {EPOLL_WORKERS} under epoll)",
                self.workers
            ));
        }
        if self.timeout.is_zero() {
            return invalid("timeout_ms must be positive".into());
        }
        if self.failure_limit == 0 {
            return invalid("failure_limit must be at least 1".into());
        }
        let mut prefixes = std::collections::HashSet::new();
        for pool in &self.pools {
            if !prefixes.insert(pool.prefix.as_str()) {
                return invalid(format!("two pools have the prefix {:?}", pool.prefix));
            }
            if pool.replicas == 0 || pool.replicas > pool.backends.len().min(MAX_REPLICAS) {
                return invalid(format!(
                    "pool {}: replicas = {} must be 1..={} (its backends, at most {MAX_REPLICAS})",
                    pool.name,
                    pool.replicas,
                    pool.backends.len().min(MAX_REPLICAS)
                ));
            }
            if pool.cluster.is_none() {
                PoolRing::new(&pool.backends, pool.distribution).map_err(|source| {
                    ConfigError::Ring {
                        pool: pool.name.clone(),
                        source,
                    }
                })?;
            } else if pool.backends.is_empty() {
                return invalid("the cluster has no nodes".into());
            }
        }
        if !prefixes.contains("") {
            return invalid("one pool must take every other key (prefix = \"\")".into());
        }
        Ok(())
    }
}

/// `host:port[:weight] [name]` (twemproxy's server line; the name, if any, is what ketama
/// hashes instead of the address).
pub fn parse_backend(s: &str) -> Result<Backend, ConfigError> {
    let bad = || {
        ConfigError::Invalid(format!(
            "backend {s:?}: expected HOST:PORT, HOST:PORT:WEIGHT or HOST:PORT:WEIGHT NAME"
        ))
    };
    let (address, name) = match s.trim().split_once(char::is_whitespace) {
        Some((address, name)) => (address, Some(name.trim())),
        None => (s.trim(), None),
    };
    if name.is_some_and(|n| n.is_empty() || n.contains(char::is_whitespace)) {
        return Err(bad());
    }
    let mut parts = address.rsplitn(3, ':').collect::<Vec<_>>();
    parts.reverse();
    let (host, port, weight) = match parts.as_slice() {
        [host, port] => (*host, *port, "1"),
        [host, port, weight] => (*host, *port, *weight),
        _ => return Err(bad()),
    };
    let port: u16 = port.parse().map_err(|_| bad())?;
    let weight: u32 = weight.parse().map_err(|_| bad())?;
    if host.is_empty() || weight == 0 {
        return Err(bad());
    }
    let mut b = Backend::new(host, port);
    b.weight = weight;
    b.name = name.map(str::to_string);
    Ok(b)
}

/// `ketama` or `modula`.
pub fn parse_distribution(s: &str) -> Result<Distribution, ConfigError> {
    match s {
        "ketama" => Ok(Distribution::Ketama),
        "modula" => Ok(Distribution::Modula),
        _ => Err(ConfigError::Invalid(format!(
            "unknown distribution {s:?} (known: ketama, modula)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_parse_as_twemproxy_server_lines() {
        let b = parse_backend("10.0.0.1:11212").unwrap();
        assert_eq!(
            (b.host.as_str(), b.port, b.weight, b.name),
            ("10.0.0.1", 11212, 1, None)
        );
        let b = parse_backend("10.0.0.1:11212:3 shard-a").unwrap();
        assert_eq!(
            (b.port, b.weight, b.name.as_deref()),
            (11212, 3, Some("shard-a"))
        );
        assert_eq!(b.ketama_name(), "shard-a");
        for bad in [
            "10.0.0.1",
            "10.0.0.1:x",
            "10.0.0.1:11211:0",
            "10.0.0.1:11211:1 two words",
            ":11211",
        ] {
            assert!(parse_backend(bad).is_err(), "{bad:?} was taken");
        }
        let same = ProxyConfig::new(vec![
            parse_backend("10.0.0.1:11211:1 a").unwrap(),
            parse_backend("10.0.0.2:11211:1 a").unwrap(),
        ]);
        assert!(same.check().is_err(), "two servers of one name were taken");
    }

    #[test]
    fn a_file_with_every_setting() {
        let c = ProxyConfig::parse(
            r#"
            workers = 4
            timeout_ms = 250
            failure_limit = 3
            retry_timeout_ms = 500
            [[pool]]
            name = "users"
            prefix = "user:"
            backends = ["a:1", "b:2:3"]
            distribution = "modula"
            replicas = 2
            write_policy = "majority"
            read_policy = "least-outstanding"
            multiget = "single"
            [[pool]]
            backends = ["c:11211"]
            "#,
        )
        .unwrap();
        assert_eq!(c.workers, 4);
        assert_eq!(c.timeout, Duration::from_millis(250));
        assert_eq!(c.failure_limit, 3);
        let p = &c.pools[0];
        assert_eq!((p.name.as_str(), p.prefix.as_str()), ("users", "user:"));
        assert_eq!(p.backends[1].weight, 3);
        assert_eq!(p.distribution, Distribution::Modula);
        assert_eq!(p.write_policy, ReplicaWritePolicy::Majority);
        assert_eq!(p.read_policy, ReadPolicy::LeastOutstanding);
        assert_eq!(p.multiget, MultiGet::Single);
        let d = &c.pools[1];
        assert_eq!((d.replicas, d.write_policy), (1, ReplicaWritePolicy::All));
        assert_eq!(d.distribution, Distribution::Ketama);
    }

    #[test]
    fn workers_left_to_the_proxy_are_one_per_cpu_under_the_reactor_and_8_under_epoll() {
        let c = ProxyConfig::parse("[[pool]]\nbackends = [\"a:1\"]").unwrap();
        assert_eq!(c.workers, 0);
        let cpus = std::thread::available_parallelism().unwrap().get();
        assert_eq!(c.workers_for(crate::ProxyIo::Reactor), cpus);
        assert_eq!(c.workers_for(crate::ProxyIo::Epoll), EPOLL_WORKERS);
        let c = ProxyConfig::parse("workers = 3\n[[pool]]\nbackends = [\"a:1\"]").unwrap();
        assert_eq!(c.workers_for(crate::ProxyIo::Reactor), 3);
        assert_eq!(c.workers_for(crate::ProxyIo::Epoll), 3);
    }

    #[test]
    fn bad_files_say_why() {
        for (text, says) in [
            ("", "no backends"),
            (
                "[[pool]]\nbackends = [\"a:1\"]\nreplicas = 2",
                "replicas = 2",
            ),
            ("[[pool]]\nbackends = [\"a\"]", "HOST:PORT"),
            (
                "[[pool]]\nbackends = [\"a:1\"]\nprefix = \"x\"",
                "every other key",
            ),
            (
                "[[pool]]\nbackends = [\"a:1\"]\nwrite_policy = \"some\"",
                "unknown variant",
            ),
            ("[[pool]]\nbackends = [\"a:1\"]\nbogus = 1", "unknown field"),
            ("workers = 1025\n[[pool]]\nbackends = [\"a:1\"]", "workers"),
            ("[[pool]]\nbackends = [\"a:1:0\"]", "WEIGHT"),
        ] {
            let err = ProxyConfig::parse(text).unwrap_err().to_string();
            assert!(err.contains(says), "{text:?}: {err}");
        }
    }

    #[test]
    fn policies_parse_from_flags() {
        assert_eq!(
            "majority".parse::<ReplicaWritePolicy>(),
            Ok(ReplicaWritePolicy::Majority)
        );
        assert_eq!(
            "least-outstanding".parse::<ReadPolicy>(),
            Ok(ReadPolicy::LeastOutstanding)
        );
        assert!("x".parse::<MultiGet>().is_err());
    }
}
