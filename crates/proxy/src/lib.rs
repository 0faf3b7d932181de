//! kvlab's proxy: a memcached front end in front of several backends — sharding
//! (twemproxy-compatible ketama and modula), replicated writes, reads spread over replicas,
//! split multi-gets — built as the classic middleware so that its queueing can be measured
//! and modelled.
//!
//! ```text
//!  --io epoll (the classic middleware):
//!  clients ──► network thread (kvlab_net epoll driver + ProxyService: parse, answer
//!              │                 version/stats/mn locally, queue the rest)
//!              ▼
//!            request queue (arrival time, queue length on arrival)
//!              ▼
//!            workers 1..t (each: a batch of ≤ 64 requests → route → one pipelined write
//!              │            per backend → replies framed in order → decide → reply)
//!              ▼
//!            backends (one connection per worker per backend)
//!
//!  --io reactor: no network thread and no queue between threads; each of t event loops
//!  serves its clients and its own backend connections in one epoll (see `ProxyIo`).
//!
//!  beside them: prober (ejected backends: probe, repair, rejoin) · window logger (CSV,
//!               queue-length sampler) · /metrics (axum) · reload (SIGHUP, file change)
//! ```
//!
//! Modules: [`ring`] (key → backend, bit for bit as twemproxy), [`config`] (pools, policies,
//! TOML), [`route`] (pools by prefix, replicas, read choice), [`backend`] (health, one
//! worker's connection, reply framing), [`forward`] (a request as forwarded), [`worker`] (a
//! batch through the backends), [`rejoin`] (a backend that answers again: repaired, back in),
//! [`service`] (the network stage), [`stats`] (per-request stage times), [`render`]
//! (`stats`, Prometheus, CSV), [`log`] (the window logger).

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod backend;
pub mod config;
pub mod forward;
pub mod log;
pub mod rejoin;
pub mod render;
pub mod ring;
pub mod route;
pub mod service;
pub mod stats;
pub mod worker;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvlab_net::{Driver, IoModel};
use kvlab_protocol::Limits;
use parking_lot::{Mutex, RwLock};

pub use config::{MultiGet, Pool, ProxyConfig, ReadPolicy, ReplicaWritePolicy};
pub use ring::{key_hash, Backend, Distribution, PoolRing, RingError, KETAMA_POINTS_PER_BACKEND};
pub use route::Routing;

/// What `version` answers.
pub const VERSION: &str = concat!("kvlab-proxy-", env!("CARGO_PKG_VERSION"));

/// How a proxy runs, beside its routing.
#[derive(Clone, Debug)]
pub struct ProxyOptions {
    /// Where clients connect.
    pub listen: SocketAddr,
    /// Maximum simultaneous client connections.
    pub conn_limit: usize,
    /// Parsing limits (`-I`: the largest value accepted).
    pub limits: Limits,
    /// Where the window logs go (none: no files).
    pub log_dir: Option<PathBuf>,
    /// Length of a window.
    pub log_interval: Duration,
    /// Write one line per `n` requests to `requests.csv` (0: none).
    pub log_sample: u64,
    /// Serve Prometheus text at `/metrics` on this address.
    pub metrics: Option<SocketAddr>,
    /// The file the configuration came from: SIGHUP or a change reloads it.
    pub config_file: Option<PathBuf>,
    /// The thread model.
    pub io: ProxyIo,
    /// Record per-request figures (stage times, queue length, per-backend times); off only
    /// to measure what recording costs (counters of requests stay).
    pub record: bool,
}

/// The proxy's thread model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyIo {
    /// The classic middleware: one network thread parses and queues, `t` worker threads
    /// take batches from the queue and talk to the backends (a connection's requests stay
    /// on one worker while any is in flight). Queue and worker times are real stages.
    Epoll,
    /// `t` event loops, each serving its own clients and backends in one epoll: requests
    /// read in one round of readiness events go to the backends together at its end (one
    /// write per backend), and each is answered when its replies arrive, in a later round,
    /// while the loop goes on reading. No hand-off between threads; the queue stage is the
    /// wait for the end of the round, the worker stage from there to the decision.
    Reactor,
}

impl std::str::FromStr for ProxyIo {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "epoll" => Ok(ProxyIo::Epoll),
            "reactor" => Ok(ProxyIo::Reactor),
            _ => Err(format!(
                "unknown proxy I/O model {s:?} (known: reactor, epoll)"
            )),
        }
    }
}

impl ProxyOptions {
    /// Listening on `listen`, everything else at its default.
    pub fn new(listen: SocketAddr) -> ProxyOptions {
        ProxyOptions {
            listen,
            conn_limit: 4096,
            limits: Limits::default(),
            log_dir: None,
            log_interval: Duration::from_secs(1),
            log_sample: 0,
            metrics: None,
            config_file: None,
            io: ProxyIo::Reactor,
            record: true,
        }
    }
}

/// The network stage's own time per request (parse + route + queue), from the session.
#[derive(Debug, Default)]
pub struct NetStage {
    /// Its samples.
    pub stage: stats::Stage,
}

impl NetStage {
    fn record(&mut self, samples: &[u64]) {
        for &ns in samples {
            self.stage.record(ns);
        }
    }
}

/// What the network thread, the workers, the prober and the logger share.
pub struct ProxyState {
    routing: RwLock<(Arc<Routing>, u64)>,
    /// Bumped by every reload; workers compare it at each batch.
    pub version: AtomicU64,
    /// Requests queued and not yet taken by a worker, and the time integral of that number.
    pub queue: stats::QueueLength,
    /// Parsing limits (workers re-parse what they forward).
    pub limits: Limits,
    /// One recorder per worker.
    pub recorders: Vec<Mutex<stats::Recorder>>,
    /// The network stage's times.
    pub net: Mutex<NetStage>,
    /// When the proxy started (times in logs count from it).
    pub epoch: Instant,
    /// Unix time at `epoch`.
    pub epoch_unix: f64,
    /// Open client connections.
    pub curr_connections: AtomicU64,
    /// Client connections ever admitted.
    pub total_connections: AtomicU64,
    /// Client connections refused at the limit.
    pub rejected_connections: AtomicU64,
    /// The limit.
    pub conn_limit: usize,
    /// Requests that could not be parsed.
    pub protocol_errors: AtomicU64,
    /// Bytes read from clients.
    pub bytes_read: AtomicU64,
    /// Bytes written to clients.
    pub bytes_written: AtomicU64,
    /// Reloads that took effect.
    pub reloads: AtomicU64,
    /// Reloads refused (the old configuration stayed).
    pub reload_failures: AtomicU64,
    /// The reason of the last refused reload.
    pub last_reload_error: Mutex<String>,
    /// Set (by SIGHUP) to reload the configuration file.
    pub reload_requested: Arc<AtomicBool>,
    /// The thread model (a reload's `workers = 0` is resolved under it).
    pub io: ProxyIo,
    /// One cluster ring fetch at a time (`follow_cluster`).
    cluster_lock: Mutex<()>,
    /// The file the configuration came from.
    pub config_file: Option<PathBuf>,
    /// Per-request figures are recorded ([`ProxyOptions::record`]).
    pub record: bool,
    /// Set to stop every thread.
    pub stopping: AtomicBool,
}

impl ProxyState {
    /// The current routing table and its version.
    pub fn routing(&self) -> (Arc<Routing>, u64) {
        let r = self.routing.read();
        (r.0.clone(), r.1)
    }

    /// The sum of every worker's recorder.
    pub fn totals(&self) -> stats::Recorder {
        let mut sum = stats::Recorder::default();
        for r in &self.recorders {
            sum.add(&r.lock());
        }
        sum
    }

    /// Replaces the routing with `config`; on error the old one stays, and the reason is
    /// counted, kept and returned.
    pub fn reload(&self, mut config: ProxyConfig) -> Result<(), String> {
        config.workers = config.workers_for(self.io);
        let (old, _) = self.routing();
        let result = if config.workers != old.config.workers {
            Err(format!(
                "workers = {} differs from the running {} (a restart changes it)",
                config.workers, old.config.workers
            ))
        } else {
            Routing::new(config, Some(&old))
        };
        match result {
            Ok(routing) => {
                let mut w = self.routing.write();
                let version = w.1 + 1;
                *w = (Arc::new(routing), version);
                self.version.store(version, Ordering::Release);
                self.reloads.fetch_add(1, Ordering::Relaxed);
                tracing::info!(version, "configuration reloaded");
                Ok(())
            }
            Err(reason) => Err(self.refuse_reload(reason)),
        }
    }

    /// Following a kvlab cluster (`--cluster`): fetches the ring from one of its nodes (the
    /// current ring's, then the seed) and takes it up if its epoch is newer. True when the
    /// routing changed. Serialised: workers that saw a redirect at the same time fetch once.
    pub(crate) fn follow_cluster(&self) -> bool {
        let _one = self.cluster_lock.lock();
        let (routing, _) = self.routing();
        let Some(seed) = routing.config.cluster.clone() else {
            return false;
        };
        let current = routing.pools.first().and_then(|p| p.pool.cluster.clone());
        let epoch = current.as_ref().map_or(0, |r| r.epoch());
        let mut candidates: Vec<String> = current
            .iter()
            .flat_map(|r| r.nodes().iter().cloned())
            .collect();
        candidates.push(seed.clone());
        for node in candidates {
            let Ok(addr) = kvlab_client::cluster::resolve(&node) else {
                continue;
            };
            let Ok(ring) = kvlab_client::cluster::fetch_ring(addr, Duration::from_millis(500))
            else {
                continue;
            };
            if ring.epoch() <= epoch {
                return false;
            }
            let ring_epoch = ring.epoch();
            return match routing.config.of_cluster(&seed, ring) {
                Ok(config) => {
                    let changed = self.reload(config).is_ok();
                    if changed {
                        tracing::info!(epoch = ring_epoch, "following the cluster's new ring");
                    }
                    changed
                }
                Err(e) => {
                    self.refuse_reload(e.to_string());
                    false
                }
            };
        }
        false
    }

    /// Counts and keeps the reason of a refused reload; returns it.
    pub fn refuse_reload(&self, reason: String) -> String {
        self.reload_failures.fetch_add(1, Ordering::Relaxed);
        tracing::error!(%reason, "reload refused; the running configuration stays");
        *self.last_reload_error.lock() = reason.clone();
        reason
    }
}

/// A running proxy.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<ProxyState>,
    driver: Option<Driver>,
    threads: Vec<std::thread::JoinHandle<()>>,
    metrics: Option<kvlab_net::http::HttpServer>,
}

/// Why a proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration is unusable.
    #[error("configuration: {0}")]
    Config(String),
    /// A socket, thread or file could not be set up.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl Proxy {
    /// Binds, starts the network thread, the workers, the prober, the logger and (if asked)
    /// `/metrics`.
    pub fn start(mut config: ProxyConfig, options: ProxyOptions) -> Result<Proxy, StartError> {
        config.workers = config.workers_for(options.io);
        let routing = Routing::new(config, None).map_err(StartError::Config)?;
        let workers = routing.config.workers;
        let epoch = Instant::now();
        let epoch_unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let shared = Arc::new(ProxyState {
            routing: RwLock::new((Arc::new(routing), 0)),
            version: AtomicU64::new(0),
            queue: stats::QueueLength::new(epoch),
            limits: options.limits,
            recorders: (0..workers)
                .map(|_| {
                    Mutex::new(stats::Recorder {
                        sample_every: options.log_sample,
                        ..stats::Recorder::default()
                    })
                })
                .collect(),
            net: Mutex::new(NetStage::default()),
            epoch,
            epoch_unix,
            curr_connections: AtomicU64::new(0),
            total_connections: AtomicU64::new(0),
            rejected_connections: AtomicU64::new(0),
            conn_limit: options.conn_limit,
            protocol_errors: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            reloads: AtomicU64::new(0),
            reload_failures: AtomicU64::new(0),
            last_reload_error: Mutex::new(String::new()),
            reload_requested: Arc::new(AtomicBool::new(false)),
            io: options.io,
            cluster_lock: Mutex::new(()),
            config_file: options.config_file.clone(),
            record: options.record,
            stopping: AtomicBool::new(false),
        });
        let listener = std::net::TcpListener::bind(options.listen)?;
        let addr = listener.local_addr()?;
        let app = Arc::new(service::ProxyApp {
            shared: shared.clone(),
        });
        let io = match options.io {
            ProxyIo::Epoll => IoModel::Epoll,
            ProxyIo::Reactor => IoModel::Reactor,
        };
        let driver = Driver::start(
            io,
            listener,
            app,
            kvlab_net::DriverConfig {
                threads: workers,
                limits: options.limits,
                idle_timeout: None,
                tls: None,
                reqs_per_event: None,
                buffers: None,
            },
        )?;
        let mut threads = Vec::new();
        let s = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("kvlab-prober".into())
                .spawn(move || prober(&s))?,
        );
        let logger = log::Logger::new(shared.clone(), &options)?;
        threads.push(
            std::thread::Builder::new()
                .name("kvlab-logger".into())
                .spawn(move || logger.run())?,
        );
        let metrics = match options.metrics {
            Some(at) => Some(render::serve_metrics(at, shared.clone())?),
            None => None,
        };
        Ok(Proxy {
            addr,
            shared,
            driver: Some(driver),
            threads,
            metrics,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where `/metrics` is served.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(|m| m.addr())
    }

    /// What the threads share (figures, reload).
    pub fn shared(&self) -> &Arc<ProxyState> {
        &self.shared
    }

    /// Stops every thread and waits for them; the last window is logged.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.shared.stopping.store(true, Ordering::Relaxed);
        if let Some(d) = self.driver.take() {
            d.stop();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        if let Some(m) = self.metrics.take() {
            m.stop();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// How often a proxy following a kvlab cluster asks for its ring (a redirect asks at once).
const CLUSTER_POLL: Duration = Duration::from_millis(200);

/// Every `retry_timeout`, asks each ejected backend `version`; one that answers rejoins
/// ([`rejoin::rejoin`]: in a replicated pool, once the keys whose writes it missed are
/// repaired from their peers). Also reloads the configuration file on SIGHUP or when it
/// changes, and follows a kvlab cluster's ring.
fn prober(shared: &ProxyState) {
    let mut next = Instant::now();
    let modified = |path: &PathBuf| std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let mut seen = shared.config_file.as_ref().and_then(modified);
    let mut next_look = Instant::now();
    let mut next_ring = Instant::now();
    while !shared.stopping.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(20));
        if let Some(path) = &shared.config_file {
            let mut reload = shared.reload_requested.swap(false, Ordering::Relaxed);
            if Instant::now() >= next_look {
                next_look = Instant::now() + Duration::from_secs(1);
                let now = modified(path);
                if now != seen {
                    seen = now;
                    reload = true;
                }
            }
            if reload {
                let _ = match ProxyConfig::load(path) {
                    Ok(config) => shared.reload(config),
                    Err(e) => Err(shared.refuse_reload(e.to_string())),
                };
            }
        }
        let (routing, _) = shared.routing();
        if routing.config.cluster.is_some() && Instant::now() >= next_ring {
            next_ring = Instant::now() + CLUSTER_POLL;
            shared.follow_cluster();
        }
        if Instant::now() < next {
            continue;
        }
        let config = &routing.config;
        next = Instant::now() + config.retry_timeout;
        for (b, health) in routing.backends.iter().enumerate() {
            if !health.is_ejected() {
                continue;
            }
            let alive = backend::ask(&health.name, b"version\r\n", config.timeout)
                .is_ok_and(|r| r.starts_with(b"VERSION"));
            if !alive {
                continue;
            }
            match rejoin::rejoin(&routing, b, &shared.stopping) {
                Ok(repaired) => {
                    tracing::warn!(backend = %health.name, repaired, "backend answers again: back in");
                }
                Err(reason) => {
                    health.rejoin_waits.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(backend = %health.name, %reason, "backend answers but cannot be repaired yet; stays out");
                }
            }
        }
    }
}
