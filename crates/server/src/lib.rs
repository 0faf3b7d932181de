//! kvlab's memcached-compatible server: the cache [`kvlab_net::Service`] over the network
//! front end of `kvlab-net`.
//!
//! The request path, outside in:
//!
//! ```text
//! socket ──► kvlab_net driver ──► Session (sans-IO) ──► protocol::parse ──► Engine ──► Store
//!        ◄──                  ◄──                   ◄── protocol::response ◄──
//! ```
//!
//! - [`admin`]: memcached's administration commands (`shutdown`, `cache_memlimit`,
//!   `slabs reassign`, `stats detail` with [`detail`], `lru_crawler`);
//! - [`slabs`]: `stats items` and `stats slabs` by memcached's size classes, and
//!   evictions counted per class; [`watch`]: `watch` log streams; [`conns`]: the open
//!   connections (`stats conns`);
//! - [`auth`]: memcached's ASCII authentication (`-Y`);
//! - [`tls`]: `-Z` (memcached's TLS options as a rustls configuration);
//! - [`cache`]: the durable cache's semantics (read-through, persist before the reply) and
//!   its disk work, shared by the engine and the REST handlers;
//! - [`engine`]: memcached command semantics over the store, reply composition; the
//!   [`kvlab_net::Service`] that every `kvlab_net` driver runs, with disk work
//!   ([`engine::Blocking`]) as its deferred work;
//! - `kvlab_net`: the sans-IO session and the I/O drivers ([`IoModel`]);
//! - [`crawler`]: the background thread that reclaims expired and flushed items;
//! - [`stats`]: memcached's `stats` fields, service-time percentiles, Prometheus text;
//! - [`FrontEnd`]: what serves the cache beside the memcached port — the REST interface and
//!   `/metrics` of the `kvlab-rest` crate, which the binary adds, so this crate builds
//!   without an HTTP stack or an async runtime.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod admin;
pub mod auth;
pub mod cache;
mod class_counts;
pub mod conns;
pub mod crawler;
pub mod detail;
pub mod engine;
pub mod slabs;
pub mod stats;
pub mod tls;
pub mod watch;

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Instant;

use kvlab_protocol::Limits;
use kvlab_store::{Clock, DurableConfig, Policy, SizeClasses, Store, StoreConfig, SystemClock};

use crate::admin::AdminState;

use crate::stats::{ServerStats, WorkerStats};

pub use crawler::CrawlerConfig;
pub use engine::{Engine, Flow};
pub use kvlab_net::IoModel;

/// The sans-IO session running the cache engine.
pub type Session = kvlab_net::Session<Engine>;

/// memcached's reply to a connection over the `-c` limit.
pub const TOO_MANY_CONNECTIONS: &[u8] = kvlab_protocol::response::TOO_MANY_CONNECTIONS;

/// Everything `kvlab server` can be told.
#[derive(Clone)]
pub struct ServerConfig {
    /// Address to listen on (`-l`, `-p`); port 0 picks a free one.
    pub listen: SocketAddr,
    /// A unix-domain socket to listen on instead of `listen` (memcached's `-s PATH`, with
    /// `-a MASK` its permissions): clients on the same host, no TCP.
    pub unix_socket: Option<UnixSocket>,
    /// Worker threads (`-t`).
    pub threads: usize,
    /// Cache memory limit in bytes (`-m` is in MiB).
    pub memory_limit: usize,
    /// Most items the cache holds at once (`--cache-items`; 0: only `memory_limit`
    /// bounds it): see [`kvlab_store::StoreConfig::max_items`].
    pub cache_items: usize,
    /// Connection limit (`-c`).
    pub max_connections: usize,
    /// Listen backlog (`-b`, memcached's default 1024): connections the kernel completes
    /// and queues before the server accepts them (capped by `net.core.somaxconn`).
    pub backlog: u32,
    /// Largest item (`-I`).
    pub item_size_max: usize,
    /// Eviction policy (`--eviction`; `-M` means `none`).
    pub policy: Policy,
    /// I/O driver (`--io`).
    pub io: IoModel,
    /// What serves the cache beside the memcached port (`--http-port`, `--metrics-port`:
    /// `kvlab-rest`'s REST interface and `/metrics`), started after the store.
    pub front_ends: Vec<Arc<dyn FrontEnd>>,
    /// The store's clock; tests pass a manual one.
    pub clock: Arc<dyn Clock>,
    /// Keep the items on disk (`--data-dir`, `--durability`, `--flush-interval`): memory
    /// becomes a write-back cache over an embedded storage engine.
    pub durable: Option<DurableConfig>,
    /// The background crawler that reclaims expired and flushed items
    /// (`--crawler-interval-ms`, `-o lru_crawler|no_lru_crawler`); `None` = off (the
    /// thread waits for `lru_crawler enable`).
    pub crawler: Option<CrawlerConfig>,
    /// `-A`: serve the `shutdown` command.
    pub shutdown_command: bool,
    /// `slabs reassign` allowed (`-o slab_reassign`, the default; `-o no_slab_reassign`).
    pub slab_reassign: bool,
    /// CAS values on (memcached's default); `-C` turns them off: `gets`, `gats` and the
    /// meta `c` flag show 0, and `cas` (or a meta `C` compare) never matches (`EXISTS`, or
    /// `NOT_FOUND` for a missing key), as memcached answers.
    pub cas_enabled: bool,
    /// `flush_all` served (memcached's default); `-F` answers it `CLIENT_ERROR flush_all
    /// not allowed`.
    pub flush_enabled: bool,
    /// `stats cachedump` and `lru_crawler metadump` served (memcached's default); `-X`
    /// refuses them as memcached does.
    pub dumps_enabled: bool,
    /// `watch` served (memcached's default); `-W` refuses it as memcached does.
    pub watch_enabled: bool,
    /// memcached's `-R`, `-B`, `-o read_buf_mem_limit`, `-o lru_maintainer`: reported in
    /// `stats settings`; what each does is on [`admin::AcceptedSettings`].
    pub accepted: admin::AcceptedSettings,
    /// memcached's size classes (`-f` growth factor, `-n` smallest chunk's data size),
    /// used to report items by class.
    pub growth_factor: f64,
    /// `-n`: bytes of key and data in the smallest chunk.
    pub chunk_size: u32,
    /// `-D`: the key prefix delimiter of `stats detail`; giving it turns detail on.
    pub prefix_delimiter: Option<u8>,
    /// `-o idle_timeout=N`: close connections idle this long (counted in `idle_kicks`).
    pub idle_timeout: Option<std::time::Duration>,
    /// `-Y FILE`: connections must authenticate as one of these users first.
    pub auth: Option<auth::AuthFile>,
    /// `-Z`: TLS on the memcached port, with memcached's `ssl_*` options.
    pub tls: Option<tls::TlsSettings>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 11211)),
            threads: 4,
            memory_limit: 64 * 1024 * 1024,
            unix_socket: None,
            cache_items: 0,
            max_connections: 1024,
            backlog: 1024,
            item_size_max: 1024 * 1024,
            policy: Policy::Lru,
            io: IoModel::Reactor,
            front_ends: Vec::new(),
            clock: Arc::new(SystemClock),
            durable: None,
            crawler: Some(CrawlerConfig::default()),
            shutdown_command: false,
            slab_reassign: true,
            cas_enabled: true,
            flush_enabled: true,
            dumps_enabled: true,
            watch_enabled: true,
            accepted: admin::AcceptedSettings::default(),
            growth_factor: 1.25,
            chunk_size: 48,
            prefix_delimiter: None,
            idle_timeout: None,
            auth: None,
            tls: None,
        }
    }
}

/// State every thread of a running server shares.
pub struct ServerState {
    /// The cache.
    pub store: Arc<Store>,
    /// Server-wide figures.
    pub stats: Arc<ServerStats>,
    /// The parser's bounds (`-I`).
    pub limits: Limits,
    /// Set when the threads must stop; they check it after every wake-up.
    pub shutdown: AtomicBool,
}

impl ServerState {
    /// Asks the owner of the [`Server`] to shut it down; returns at once.
    pub fn request_stop(&self) {
        self.stats.admin.stop.request();
    }
}

/// The cache as the network front end serves it: one [`Engine`] per serving thread, the
/// store as every disk helper's state, the `-c` limit and the shutdown flag.
impl kvlab_net::App for ServerState {
    type Service = Engine;

    fn service(&self, index: usize) -> Engine {
        // Threads (and, for the threaded driver, connections) share the per-worker counters
        // round-robin: each counter is atomic and each histogram is behind its own mutex, so
        // sharing is safe and cheap.
        let workers = &self.stats.workers;
        let worker = workers[index % workers.len()].clone();
        Engine::new(self.store.clone(), self.stats.clone(), worker)
    }

    fn helper(&self, _index: usize) -> crate::cache::Helper {
        crate::cache::Helper::new(self.store.clone())
    }

    fn admit(&self, _peer: SocketAddr) -> bool {
        let stats = &self.stats;
        if stats.curr_connections.load(Relaxed) >= stats.max_connections {
            stats.rejected_connections.fetch_add(1, Relaxed);
            return false;
        }
        stats.curr_connections.fetch_add(1, Relaxed);
        stats.total_connections.fetch_add(1, Relaxed);
        true
    }

    fn release(&self) {
        self.stats.curr_connections.fetch_sub(1, Relaxed);
    }

    fn idle_kick(&self) {
        self.stats.idle_kicks.fetch_add(1, Relaxed);
    }

    fn stopping(&self) -> bool {
        self.shutdown.load(SeqCst)
    }
}

/// A cloneable handle that asks a running server to stop (for signal handlers).
#[derive(Clone)]
pub struct StopHandle(Arc<ServerState>);

impl StopHandle {
    /// Asks the server to stop (what `shutdown` and SIGTERM do); `Server::wait` returns.
    pub fn request_stop(&self) {
        self.0.request_stop();
    }
}

/// A front end that serves the cache beside the memcached port over the same [`ServerState`]
/// state (`kvlab-rest`'s REST interface and `/metrics`): started by [`Server::start`] once
/// the store is up, stopped with the server.
pub trait FrontEnd: Send + Sync {
    /// Its name, by which [`Server::front_end_addr`] finds it.
    fn name(&self) -> &'static str;
    /// The most descriptors it holds at once (its connection limit): reserved beside `-c`.
    fn descriptors(&self) -> usize;
    /// Binds its listener and starts serving `shared`.
    fn start(&self, shared: Arc<ServerState>) -> io::Result<Box<dyn RunningFrontEnd>>;
}

/// A started [`FrontEnd`].
pub trait RunningFrontEnd: Send {
    /// The address it listens on.
    fn addr(&self) -> SocketAddr;
    /// Stops accepting; its open connections finish their requests.
    fn stop(self: Box<Self>);
}

/// A running server.
pub struct Server {
    addr: SocketAddr,
    shared: Arc<ServerState>,
    driver: Option<kvlab_net::Driver>,
    front_ends: Vec<(&'static str, Box<dyn RunningFrontEnd>)>,
    crawler: Option<crawler::Crawler>,
    /// What stops first when the server stops ([`Server::on_stop`]).
    on_stop: Vec<Box<dyn FnOnce() + Send>>,
}

/// Descriptors a server needs beyond its connections: listeners, epoll and event fds,
/// the durable store's files, log and pipe ends.
const FD_OVERHEAD: usize = 64;

/// The open-file limit a server with `config` needs: `-c` connections, every front end's
/// connection limit, and [`FD_OVERHEAD`].
pub fn descriptors_needed(config: &ServerConfig) -> usize {
    let front_ends: usize = config.front_ends.iter().map(|f| f.descriptors()).sum();
    config.max_connections + front_ends + FD_OVERHEAD
}

/// Makes glibc malloc serve every thread from one arena (`M_ARENA_MAX` 1), once per
/// process, unless the operator set `MALLOC_ARENA_MAX`.
///
/// Why: by default glibc gives each thread that allocates under contention an arena of
/// its own, up to 8 per core. Items are allocated by whichever I/O thread stores them
/// and freed by whichever evicts them, and a flood of pipelined 10 KB sets spread them
/// over every arena; each arena keeps its own free memory (only an arena's top is
/// returned), so RSS rose flood over flood — 200 clients × 1,000 sets of 10 KB into
/// `-m 64`, four floods: reactor 93 → 112 MB, threaded (an arena per connection
/// thread) 118 → 162 MB; with one arena both stay at 76 MB (memcached 70). The cost is
/// a shared arena lock for allocations that miss glibc's per-thread cache (blocks over
/// 1 KiB: item values above that size, buffers); reads allocate nothing.
pub fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
                // SAFETY: mallopt only sets an allocator parameter; M_ARENA_MAX takes
                // effect for arenas created from now on.
                unsafe {
                    libc::mallopt(libc::M_ARENA_MAX, 1);
                }
            }
        });
    }
}

/// Raises the soft open-file limit to what `config` needs (as memcached raises it for
/// `-c`), up to the hard limit, so that the memcached port's `-c` connections always have
/// descriptors whatever the HTTP endpoints hold; warns when the hard limit is lower.
fn reserve_descriptors(config: &ServerConfig) {
    let needed = descriptors_needed(config) as libc::rlim_t;
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 || lim.rlim_cur >= needed {
            return;
        }
        let raised = libc::rlimit {
            rlim_cur: needed.min(lim.rlim_max),
            rlim_max: lim.rlim_max,
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
            lim = raised;
        }
    }
    if lim.rlim_cur < needed {
        tracing::warn!(
            limit = lim.rlim_cur,
            needed,
            "the open-file limit is below -c plus the HTTP endpoints' connections: \
             connections past it will fail to accept (raise ulimit -n or lower -c)"
        );
    }
}

/// Sets a listening socket's backlog: std binds with 128; `listen` again on a listening
/// socket only changes its backlog (Linux).
/// `-s PATH -a MASK`: a unix-domain socket to listen on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnixSocket {
    /// The socket's path; a socket already there (left by a server that died) is replaced,
    /// anything else is an error.
    pub path: std::path::PathBuf,
    /// Its permission bits (memcached's `-a`, default 0700).
    pub mask: u32,
}

impl UnixSocket {
    /// Binds the socket with its permissions. The drivers serve it as they serve TCP: they
    /// take a listening descriptor and accept with [`kvlab_net::driver::accept_fd`], which
    /// knows either kind, so the listener travels as a `TcpListener` holding it.
    fn bind(&self) -> io::Result<std::net::TcpListener> {
        use std::os::fd::{FromRawFd, IntoRawFd};
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        if let Ok(meta) = std::fs::symlink_metadata(&self.path) {
            if !meta.file_type().is_socket() {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} exists and is not a socket", self.path.display()),
                ));
            }
            std::fs::remove_file(&self.path)?;
        }
        let l = std::os::unix::net::UnixListener::bind(&self.path)?;
        std::fs::set_permissions(
            &self.path,
            std::fs::Permissions::from_mode(self.mask & 0o777),
        )?;
        // SAFETY: the descriptor moves from the unix listener, which gives it up, to the
        // listener type the drivers take; only descriptor-level calls are made on it
        // (listen, epoll registration, accept4 by `accept_fd`, close).
        Ok(unsafe { std::net::TcpListener::from_raw_fd(l.into_raw_fd()) })
    }
}

fn set_backlog(listener: &std::net::TcpListener, backlog: u32) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let backlog = libc::c_int::try_from(backlog).unwrap_or(libc::c_int::MAX);
    // SAFETY: listen on a socket this function borrows, with an int argument.
    if unsafe { libc::listen(listener.as_raw_fd(), backlog) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl Server {
    /// Binds the listener and starts the driver's threads. Returns once the server accepts
    /// connections.
    pub fn start(config: ServerConfig) -> io::Result<Server> {
        Self::start_with(config, |shared, _| Ok(shared.clone()))
    }

    /// The same, with the driver serving the [`kvlab_net::App`] that `app` makes of the
    /// server's state and its bound address, once the store and the figures exist and
    /// before the first connection is accepted: a service that wraps the cache engine (a
    /// cluster node's, `kvlab_cluster::serve`).
    pub fn start_with<A: kvlab_net::App>(
        config: ServerConfig,
        app: impl FnOnce(&Arc<ServerState>, SocketAddr) -> io::Result<Arc<A>>,
    ) -> io::Result<Server> {
        if config.threads == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "threads must be at least 1",
            ));
        }
        let tls = match &config.tls {
            Some(t) => Some(
                t.server_config()
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?,
            ),
            None => None,
        };
        limit_malloc_arenas();
        reserve_descriptors(&config);
        let (listener, addr) = match &config.unix_socket {
            Some(unix) => (unix.bind()?, SocketAddr::from(([0, 0, 0, 0], 0))),
            None => {
                let l = std::net::TcpListener::bind(config.listen)?;
                let addr = l.local_addr()?;
                (l, addr)
            }
        };
        set_backlog(&listener, config.backlog)?;
        let store_config = StoreConfig {
            memory_limit: config.memory_limit,
            item_size_max: config.item_size_max,
            policy: config.policy,
            shards: 0,
            max_items: config.cache_items,
        };
        let store = Arc::new(match &config.durable {
            Some(durable) => Store::open(store_config, config.clock.clone(), durable.clone())?,
            None => Store::new(store_config, config.clock.clone()),
        });
        let mut admin = AdminState::new(Arc::default());
        admin.shutdown_command = config.shutdown_command;
        admin.slab_reassign = config.slab_reassign;
        admin.cas_enabled = config.cas_enabled;
        admin.flush_enabled = config.flush_enabled;
        admin.dumps_enabled = config.dumps_enabled;
        admin.watch_enabled = config.watch_enabled;
        admin.accepted = config.accepted;
        admin.auth = config.auth.clone();
        admin.tls = config.tls.clone();
        admin.classes = SizeClasses::new(
            config.growth_factor,
            config.chunk_size,
            config.item_size_max,
        );
        if let Some(d) = config.prefix_delimiter {
            admin.detail = detail::Detail::new(d, true);
        }
        admin.crawler = crawler::Control::new(config.crawler.is_some());
        let crawler_stats = admin.crawler_stats.clone();
        admin.evictions = Arc::new(class_counts::ClassEvictions::new(
            admin.classes.clone(),
            admin.watchers.clone(),
        ));
        let crawler_control = admin.crawler.clone();
        let stats = Arc::new(ServerStats {
            started: Instant::now(),
            started_unix: stats::unix_now(),
            curr_connections: AtomicUsize::new(0),
            total_connections: AtomicU64::new(0),
            rejected_connections: AtomicU64::new(0),
            buffers: Arc::new(kvlab_net::BufferBudget::new(
                usize::try_from(config.accepted.read_buf_mem_limit).unwrap_or(usize::MAX),
            )),
            max_connections: config.max_connections,
            verbosity: AtomicU64::new(0),
            slab_automove: AtomicU64::new(1),
            workers: (0..config.threads)
                .map(|_| Arc::new(WorkerStats::default()))
                .collect(),
            http: Arc::default(),
            threads: config.threads,
            item_size_max: config.item_size_max,
            policy: config.policy,
            port: addr.port(),
            io_model: config.io.name(),
            crawler_config: config.crawler,
            crawler: crawler_stats,
            admin: Arc::new(admin),
            idle_timeout: config.idle_timeout,
            idle_kicks: AtomicU64::new(0),
            backlog: config.backlog,
            listen: addr.ip(),
            reserved_fds: FD_OVERHEAD,
            listen_fd: Some(std::os::fd::AsRawFd::as_raw_fd(&listener)),
        });
        let limits = Limits {
            item_size_max: config.item_size_max,
            binding: config.accepted.binding_protocol,
            ..Limits::default()
        };
        store.observe_evictions(stats.admin.evictions.clone());
        let shared = Arc::new(ServerState {
            store,
            stats,
            limits,
            shutdown: AtomicBool::new(false),
        });
        let mut front_ends = Vec::with_capacity(config.front_ends.len());
        for f in &config.front_ends {
            front_ends.push((f.name(), f.start(shared.clone())?));
        }
        // Before the driver: if that fails to start, dropping the crawler stops it. Off
        // (`config.crawler` is `None`), the thread waits for `lru_crawler enable`.
        let crawler = Some(crawler::Crawler::start(
            shared.store.clone(),
            shared.stats.crawler.clone(),
            config.crawler.unwrap_or_default(),
            crawler_control,
        )?);
        let net = kvlab_net::DriverConfig {
            threads: config.threads,
            limits,
            idle_timeout: config.idle_timeout,
            tls,
            reqs_per_event: config.accepted.reqs_per_event,
            buffers: Some(shared.stats.buffers.clone()),
        };
        let app = app(&shared, addr)?;
        let driver = kvlab_net::Driver::start(config.io, listener, app, net)?;
        Ok(Server {
            addr,
            shared,
            driver: Some(driver),
            front_ends,
            crawler,
            on_stop: Vec::new(),
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address of the front end named `name` ([`FrontEnd::name`]), if it runs.
    pub fn front_end_addr(&self, name: &str) -> Option<SocketAddr> {
        self.front_ends
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, f)| f.addr())
    }

    /// The store, shared with every front end.
    pub fn store(&self) -> &Arc<Store> {
        &self.shared.store
    }

    /// The state the front ends share (store, stats, limits).
    pub fn shared(&self) -> &Arc<ServerState> {
        &self.shared
    }

    /// A handle that asks this server to stop.
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle(self.shared.clone())
    }

    /// Runs `stop` first when the server stops, before its threads (a cluster node's own
    /// threads, which the engines' service uses).
    pub fn on_stop(&mut self, stop: impl FnOnce() + Send + 'static) {
        self.on_stop.push(Box::new(stop));
    }

    /// Blocks until something asks the server to stop ([`StopHandle::request_stop`],
    /// `shutdown` with `-A`).
    pub fn wait(&self) {
        self.shared.stats.admin.stop.wait();
    }

    /// Stops accepting, closes every connection after flushing what it has composed, and
    /// waits for the threads to finish.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.shared.shutdown.store(true, SeqCst);
        for stop in self.on_stop.drain(..) {
            stop();
        }
        if let Some(c) = self.crawler.take() {
            c.stop();
        }
        if let Some(d) = self.driver.take() {
            d.stop();
        }
        self.shared.stats.admin.watchers.stop();
        for (_, f) in self.front_ends.drain(..) {
            f.stop();
        }
        // With a durable store, everything dirty reaches disk before the server is gone.
        if self.shared.store.durability().is_some() {
            if let Err(e) = self.shared.store.sync_all() {
                tracing::error!(%e, "writing the cache to disk at shutdown failed");
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}
