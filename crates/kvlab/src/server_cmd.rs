//! `kvlab server`: memcached's flags with memcached's meanings, so it is a drop-in
//! replacement (`kvlab server -p 11211 -t 4 -m 64`).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use anyhow::Context as _;
use clap::Args;
use kvlab_server::{CrawlerConfig, IoModel, Server, ServerConfig};
use kvlab_store::{Durability, DurableConfig, Policy};

mod process;

/// Flags of `kvlab server`.
#[derive(Debug, Args)]
pub struct ServerArgs {
    /// TCP port to listen on (0 or memcached's -1 pick a free port and print it; with
    /// MEMCACHED_PORT_FILENAME set, the port is written to that file as memcached writes it).
    #[arg(short = 'p', long = "port", default_value_t = 11211, allow_negative_numbers = true,
          value_parser = parse_port)]
    port: u16,
    /// Interface to listen on.
    #[arg(short = 'l', long = "listen", default_value = "127.0.0.1")]
    listen: IpAddr,
    /// Number of worker threads, each with its own event loop.
    #[arg(short = 't', long = "threads", default_value_t = 4)]
    threads: usize,
    /// Item memory in megabytes: keys, values and per-item overhead never exceed it.
    #[arg(short = 'm', long = "memory-limit", default_value_t = 64)]
    memory_mb: usize,
    /// Maximum simultaneous connections; one more is answered
    /// "ERROR Too many open connections" and closed.
    #[arg(short = 'c', long = "conn-limit", default_value_t = 1024)]
    conn_limit: usize,
    /// Listen backlog: connections the kernel queues before they are accepted (capped by
    /// net.core.somaxconn).
    #[arg(short = 'b', long = "listen-backlog", default_value_t = 1024)]
    backlog: u32,
    /// Largest item size, in bytes or with a k/m suffix (1m = 1 MiB); larger values are
    /// refused with "SERVER_ERROR object too large for cache".
    #[arg(short = 'I', long = "max-item-size", default_value = "1m", value_parser = parse_size)]
    item_size_max: usize,
    /// Return "SERVER_ERROR out of memory storing object" instead of evicting (same as
    /// --eviction none).
    #[arg(short = 'M', long = "disable-evictions")]
    disable_evictions: bool,
    /// Eviction policy when memory is full: lru, lfu, fifo, largest (largest values
    /// first) or none (refuse new items, like -M).
    #[arg(long = "eviction", default_value = "lru")]
    eviction: Policy,
    /// Most items the cache holds at once, beside -m (0: -m alone bounds it); beyond it
    /// a new key evicts by --eviction. With --data-dir it bounds the write-back cache,
    /// not the data on disk.
    #[arg(long = "cache-items", default_value_t = 0)]
    cache_items: usize,
    /// I/O model: reactor (one epoll loop per worker thread), threaded (a thread per
    /// connection, blocking I/O), epoll (one event-loop thread, disk work on helper threads),
    /// signal (one event-loop thread woken by real-time signals).
    #[arg(long = "io", default_value = "reactor")]
    io: IoModel,
    /// Serve Prometheus text at http://LISTEN:PORT/metrics.
    #[arg(long = "metrics-port")]
    metrics_port: Option<u16>,
    /// Serve the cache over HTTP/JSON (REST) on this port, sharing the store.
    #[arg(long = "http-port")]
    http_port: Option<u16>,
    /// Bearer token that authorises POST /shutdown on the HTTP port (without it, 403).
    #[arg(long = "admin-token", env = "KVLAB_ADMIN_TOKEN")]
    admin_token: Option<String>,
    /// Keep the items on disk in DIR (an embedded fjall database): memory becomes a
    /// write-back cache over it, bounded by -m (and --cache-items), and a restart
    /// recovers the data. A cluster node (--cluster) keeps its keys there too.
    #[arg(long = "data-dir")]
    data_dir: Option<std::path::PathBuf>,
    /// With --data-dir: none (dirty items reach disk only on eviction or clean shutdown; a
    /// crash loses the rest), interval (every --flush-interval, fsynced; a crash loses at
    /// most about one interval), sync (every acknowledged write is fsynced before its
    /// reply; a crash loses nothing acknowledged).
    #[arg(long = "durability", default_value = "interval", requires = "data_dir")]
    durability: Durability,
    /// With --data-dir: how often dirty items are written, in milliseconds (expired
    /// records are purged from the disk at most every 60 intervals).
    #[arg(
        long = "flush-interval-ms",
        default_value_t = 1000,
        requires = "data_dir"
    )]
    flush_interval_ms: u64,
    /// How often the background crawler starts a pass over the whole store that
    /// reclaims expired and flushed items (memcached's LRU crawler), in
    /// milliseconds; 0 turns it off.
    #[arg(long = "crawler-interval-ms", default_value_t = 2000)]
    crawler_interval_ms: u64,
    /// memcached's extended options, comma-separated; kvlab knows lru_crawler (the
    /// default), no_lru_crawler (same as --crawler-interval-ms 0), slab_reassign (the
    /// default), no_slab_reassign, idle_timeout=SECONDS, modern (the default: nothing to
    /// change), no_modern (memcached 1.4's defaults that kvlab has: no crawler, no slab
    /// reassign), read_buf_mem_limit=MB (the most all connections' buffers may grow by,
    /// as memcached's); hashpower=N, slab_automove[=N], temporary_ttl=N, maxconns_fast and
    /// track_sizes are accepted with no effect (kvlab's table grows by itself, it has no
    /// slabs to move, no temporary items, and refuses excess connections as memcached's
    /// maxconns_fast does), each said in one line at start; lru_maintainer and no_lru_maintainer (accepted: kvlab keeps its LRU as it
    /// serves, with no maintainer thread), slab_chunk_max=BYTES (accepted: kvlab has no
    /// slab chunks, an item is charged its own size), watcher_logbuf_size=BYTES (accepted:
    /// a watcher's backlog is bounded by kvlab's own limit) and the ssl_* options of -Z.
    #[arg(short = 'o', long = "extended", value_delimiter = ',')]
    extended: Vec<String>,
    /// Enable the "shutdown" command (memcached's -A).
    #[arg(short = 'A', long = "enable-shutdown")]
    enable_shutdown: bool,
    /// Growth factor between memcached's size classes, as which items are reported in
    /// "stats items", "stats slabs" and "lru_crawler".
    #[arg(short = 'f', long = "slab-growth-factor", default_value_t = 1.25)]
    growth_factor: f64,
    /// Bytes of key + value + flags in the smallest size class's chunk.
    #[arg(short = 'n', long = "slab-min-size", default_value_t = 48)]
    chunk_size: u32,
    /// Key prefix delimiter for "stats detail" (giving it turns detail on).
    #[arg(short = 'D')]
    prefix_delimiter: Option<char>,
    /// memcached's ASCII authentication: a file of user:password lines; a connection's
    /// first command must be "set <key> <flags> <exptime> <length>" with "user password"
    /// as its data, and every other request is refused until then.
    #[arg(short = 'Y', long = "auth-file")]
    auth_file: Option<std::path::PathBuf>,
    /// TLS on the memcached port (memcached's -Z), with -o ssl_chain_cert=FILE,
    /// ssl_key=FILE and optionally ssl_ca_cert=FILE, ssl_verify_mode=0..3 (client
    /// certificates: 0 none, 1 optional, 2 and 3 required).
    #[arg(short = 'Z', long = "enable-ssl")]
    enable_ssl: bool,
    /// UDP port; kvlab serves TCP only, so only 0 (off, memcached's default) is accepted.
    #[arg(short = 'U', long = "udp-port", default_value_t = 0)]
    udp_port: u16,
    /// Join a kvlab cluster whose topology is in this file (`file:PATH` or PATH, as
    /// `kvlab cluster up`/`create` made it): serve the keys the ring gives this node,
    /// answer `SERVER_ERROR MOVED <epoch> <node>` for others, `cluster ring` with the ring.
    #[arg(long = "cluster")]
    cluster: Option<String>,
    /// With --cluster: this node's name in the topology [default: the listen address]
    #[arg(long = "cluster-node", requires = "cluster")]
    cluster_node: Option<String>,
    /// Run as USER: started as root, kvlab drops to USER's uid and gid (and no
    /// supplementary groups) before it opens any socket or file, as memcached does; an
    /// unknown USER is refused. Not root, it is ignored (as memcached ignores it). Unlike
    /// memcached, kvlab does not refuse to run as root without -u.
    #[arg(short = 'u', long = "user")]
    user: Option<String>,
    /// memcached's most requests served per connection per event before others get a turn
    /// (must be > 0; "stats settings" shows memcached's 20 when not given). Given, the
    /// reactor and epoll models answer at most N of a connection's buffered requests per
    /// turn of their loop, counted in "conn_yields" when more wait; not given, a
    /// connection's requests of one read are all answered at once (in one write).
    #[arg(short = 'R', long = "max-reqs-per-event")]
    reqs_per_event: Option<u32>,
    /// memcached's binding protocol: ascii (text and meta only), binary (the binary
    /// protocol only: a connection whose first bytes are not a binary request is closed)
    /// or auto (by each connection's first byte).
    #[arg(short = 'B', long = "protocol", default_value = "auto", value_parser = ["ascii", "binary", "auto"])]
    protocol: String,
    /// Disable CAS (memcached's -C): gets, gats and the meta c flag show 0, and cas (or a
    /// meta C compare) never matches: EXISTS, or NOT_FOUND for a missing key.
    #[arg(short = 'C', long = "disable-cas")]
    disable_cas: bool,
    /// Disable flush_all (memcached's -F): it is answered "CLIENT_ERROR flush_all not
    /// allowed".
    #[arg(short = 'F', long = "disable-flush-all")]
    disable_flush_all: bool,
    /// Verbose: -v logs errors and warnings and connection events, -vv each bad request.
    #[arg(short = 'v', action = clap::ArgAction::Count)]
    verbose: u8,
    /// Listen on this unix-domain socket instead of TCP (memcached's -s): clients on the
    /// same host, no network. A socket left at PATH by a server that died is replaced.
    #[arg(short = 's', long = "unix-socket")]
    unix_socket: Option<std::path::PathBuf>,
    /// The unix socket's permissions, octal (memcached's -a; default 0700).
    #[arg(short = 'a', long = "unix-mask", default_value = "0700", value_parser = parse_mask)]
    unix_mask: u32,
    /// Refuse the dump commands, `stats cachedump` and `lru_crawler metadump` (memcached's
    /// -X), as memcached refuses them.
    #[arg(short = 'X', long = "disable-dumping")]
    disable_dumping: bool,
    /// Refuse `watch` (memcached's -W), as memcached refuses it.
    #[arg(short = 'W', long = "disable-watch")]
    disable_watch: bool,
    /// Run as a daemon (memcached's -d): the command returns once the server listens (or
    /// fails, with its error and exit status 1), and the server goes on detached in a
    /// session of its own, its standard streams on /dev/null (unless -v). Unlike
    /// memcached it keeps its working directory, so relative paths keep their meaning.
    #[arg(short = 'd', long = "daemon")]
    daemonize: bool,
    /// Write the server's pid to this file once it listens; removed when it shuts down
    /// (memcached's -P).
    #[arg(short = 'P', long = "pidfile")]
    pid_file: Option<std::path::PathBuf>,
    /// Lock all of the server's memory, current and future (mlockall, memcached's -k): a
    /// warning when the limit (ulimit -l) does not allow it, as memcached warns.
    #[arg(short = 'k', long = "lock-memory")]
    lock_memory: bool,
    /// Raise the core file size limit to its maximum (memcached's -r).
    #[arg(short = 'r', long = "enable-coredumps")]
    enable_coredumps: bool,
    /// memcached's large memory pages (-L): accepted, no effect (kvlab's items come from
    /// the system allocator, which uses transparent huge pages where the kernel does).
    #[arg(short = 'L', long = "enable-largepages")]
    large_pages: bool,
    /// memcached's memory file for restarts (-e PATH): accepted, no effect; kvlab keeps
    /// its items across restarts with --data-dir.
    #[arg(short = 'e', long = "memory-file")]
    memory_file: Option<std::path::PathBuf>,
}

fn parse_mask(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("{s:?} is not an octal permission mask (e.g. 0700, 0766)"))
}

pub(crate) fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (digits, mult) = match s.as_bytes().last() {
        Some(b'k' | b'K') => (&s[..s.len() - 1], 1024),
        Some(b'm' | b'M') => (&s[..s.len() - 1], 1024 * 1024),
        _ => (s, 1),
    };
    let n: usize = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 1048576, 512k, 1m)"))?;
    let size = n.checked_mul(mult).ok_or("size too large")?;
    if !(1024..=1024 * 1024 * 1024).contains(&size) {
        return Err(format!("item size {size} out of range (1k..1024m)"));
    }
    Ok(size)
}

/// What `-o` says.
#[derive(Debug, Default, PartialEq)]
struct Extended {
    crawler: Option<CrawlerConfig>,
    /// `-o read_buf_mem_limit` in bytes (0: none), reported in `stats settings`.
    read_buf_mem_limit: u64,
    /// `-o lru_maintainer` (the default) or `no_lru_maintainer`, reported in `stats
    /// settings` and deciding whether `stats` lists the maintainer's fields.
    lru_maintainer: bool,
    slab_reassign: bool,
    idle_timeout: Option<std::time::Duration>,
    tls: kvlab_server::tls::TlsSettings,
    /// memcached options accepted with no effect (one line each on stderr at start).
    ignored: Vec<String>,
}

/// The `-o` options (and `--crawler-interval-ms`, which `-o lru_crawler` must agree
/// with).
fn extended(interval_ms: u64, extended: &[String]) -> anyhow::Result<Extended> {
    let mut on = interval_ms != 0;
    let mut out = Extended {
        slab_reassign: true,
        lru_maintainer: true,
        ..Extended::default()
    };
    for opt in extended {
        let (name, value) = match opt.trim().split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (opt.trim(), None),
        };
        match (name, value) {
            ("lru_crawler", None) if interval_ms == 0 => {
                anyhow::bail!("-o lru_crawler contradicts --crawler-interval-ms 0")
            }
            ("lru_crawler", None) => on = true,
            ("no_lru_crawler", None) => on = false,
            ("slab_reassign", None) => out.slab_reassign = true,
            ("no_slab_reassign", None) => out.slab_reassign = false,
            ("modern", None) => {}
            // memcached's parts that kvlab's model has no counterpart of (see the flag's
            // help): accepted so that scripts written for memcached start kvlab.
            ("lru_maintainer", None) => out.lru_maintainer = true,
            ("no_lru_maintainer", None) => out.lru_maintainer = false,
            // memcached's tuning of parts kvlab does not have: accepted, with one line
            // saying so (see the flag's help).
            ("hashpower" | "slab_automove" | "temporary_ttl", Some(v)) => {
                v.parse::<u64>()
                    .with_context(|| format!("-o {name}={v}: not a number"))?;
                out.ignored.push(format!("-o {name}={v}"));
            }
            ("maxconns_fast" | "no_maxconns_fast" | "track_sizes" | "slab_automove", None) => {
                out.ignored.push(format!("-o {name}"));
            }
            ("slab_chunk_max" | "watcher_logbuf_size", Some(v)) => {
                v.parse::<u64>()
                    .with_context(|| format!("-o {name}={v}: not a number of bytes"))?;
            }
            // memcached 1.4's defaults: of those kvlab has, no crawler, no slab reassign.
            ("no_modern", None) => {
                on = false;
                out.slab_reassign = false;
                out.lru_maintainer = false;
            }
            ("read_buf_mem_limit", Some(v)) => {
                let mb: u64 = v.parse().with_context(|| {
                    format!("could not parse argument to read_buf_mem_limit: {v:?}")
                })?;
                out.read_buf_mem_limit = mb.saturating_mul(1024 * 1024);
            }
            ("ssl_chain_cert", Some(v)) => out.tls.chain_cert = Some(v.into()),
            ("ssl_key", Some(v)) => out.tls.key = Some(v.into()),
            ("ssl_ca_cert", Some(v)) => out.tls.ca_cert = Some(v.into()),
            ("ssl_verify_mode", Some(v)) => {
                out.tls.verify_mode = match v.parse() {
                    Ok(m @ 0..=3) => m,
                    _ => anyhow::bail!("-o ssl_verify_mode={v}: 0, 1, 2 or 3"),
                }
            }
            ("idle_timeout", Some(v)) => {
                let secs: u64 = v
                    .parse()
                    .with_context(|| format!("-o idle_timeout={v}: not a number of seconds"))?;
                out.idle_timeout = (secs > 0).then(|| std::time::Duration::from_secs(secs));
            }
            _ => anyhow::bail!(
                "unsupported -o option {opt:?} (kvlab knows lru_crawler, no_lru_crawler, \
                 slab_reassign, no_slab_reassign, idle_timeout=N, modern, no_modern, \
                 read_buf_mem_limit=MB, lru_maintainer, no_lru_maintainer, \
                 slab_chunk_max=N, watcher_logbuf_size=N, ssl_chain_cert=, ssl_key=, ssl_ca_cert=, \
                 ssl_verify_mode=; hashpower=N, slab_automove[=N], temporary_ttl=N, \
                 maxconns_fast and track_sizes are accepted with no effect)"
            ),
        }
    }
    out.crawler = on.then(|| CrawlerConfig {
        interval: std::time::Duration::from_millis(interval_ms),
        ..CrawlerConfig::default()
    });
    Ok(out)
}

/// `-u USER`: when running as root, become USER (its uid and gid, no supplementary
/// groups), as memcached does; otherwise nothing (memcached ignores -u then too).
fn drop_privileges(user: &str) -> anyhow::Result<()> {
    // SAFETY: getuid and geteuid only read the process's credentials.
    if unsafe { libc::getuid() != 0 && libc::geteuid() != 0 } {
        return Ok(());
    }
    let name = std::ffi::CString::new(user).context("-u: a user name has no NUL byte")?;
    // SAFETY: `name` is a valid C string; getpwnam's result is read at once, before any
    // other call that could reuse its static buffer (startup is single-threaded here).
    let ids = unsafe {
        let pw = libc::getpwnam(name.as_ptr());
        if pw.is_null() {
            None
        } else {
            Some(((*pw).pw_uid, (*pw).pw_gid))
        }
    };
    let Some((uid, gid)) = ids else {
        anyhow::bail!("can't find the user {user} to switch to");
    };
    // SAFETY: plain system calls on the process's own credentials.
    unsafe {
        if libc::setgroups(0, std::ptr::null()) < 0 {
            let err = std::io::Error::last_os_error();
            // EPERM: already without the privilege to change groups (memcached goes on).
            if err.raw_os_error() != Some(libc::EPERM) {
                anyhow::bail!("failed to drop supplementary groups: {err}");
            }
        }
        if libc::setgid(gid) < 0 || libc::setuid(uid) < 0 {
            anyhow::bail!("failed to assume identity of user {user}");
        }
    }
    Ok(())
}

/// The HTTP front ends `--http-port` and `--metrics-port` ask for (kvlab-rest's), on the
/// listen address.
fn front_ends(args: &ServerArgs) -> Vec<Arc<dyn kvlab_server::FrontEnd>> {
    let mut front_ends: Vec<Arc<dyn kvlab_server::FrontEnd>> = Vec::new();
    if let Some(p) = args.metrics_port {
        front_ends.push(Arc::new(kvlab_rest::Metrics::on(SocketAddr::new(
            args.listen,
            p,
        ))));
    }
    if let Some(p) = args.http_port {
        let mut rest = kvlab_rest::Rest::on(SocketAddr::new(args.listen, p));
        rest.admin_token = args.admin_token.clone();
        front_ends.push(Arc::new(rest));
    }
    front_ends
}

/// Log level for memcached's -v count.
pub fn init_logging(verbose: u8) {
    let level = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Refuses a `--data-dir` that holds cluster nodes' directories (`node-PORT`, as `kvlab
/// cluster up -- --data-dir D` lays them out) instead of a store: a node started over it
/// would start empty and join the ring, and its keys would read as misses.
fn not_a_parent_of_nodes(dir: &std::path::Path, port: &str) -> anyhow::Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(()); // a new directory
    };
    let mut nodes: Vec<String> = entries
        .flatten()
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| {
            n.strip_prefix("node-")
                .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect();
    if nodes.is_empty() {
        return Ok(());
    }
    nodes.sort();
    let own = dir.join(format!("node-{port}"));
    anyhow::bail!(
        "--data-dir {} holds the data directories of cluster nodes ({}), not a store of its \
         own: this node's is {}{} (`kvlab cluster start HOST:PORT` restarts a member over its \
         own directory with the flags it was started with)",
        dir.display(),
        nodes.join(", "),
        own.display(),
        if own.is_dir() { "" } else { " (not there yet)" }
    )
}

/// Runs `kvlab server` until SIGINT or SIGTERM.
pub fn run(args: ServerArgs) -> anyhow::Result<()> {
    init_logging(args.verbose);
    if args.udp_port != 0 {
        anyhow::bail!("UDP is not supported: use -U 0 (the default)");
    }
    let policy = if args.disable_evictions {
        Policy::None
    } else {
        args.eviction
    };
    if args.growth_factor <= 1.0 {
        anyhow::bail!("Factor must be greater than 1");
    }
    if args.chunk_size == 0 {
        anyhow::bail!("Chunk size must be greater than 0");
    }
    let prefix_delimiter = match args.prefix_delimiter {
        Some(c) if c.is_ascii() => Some(c as u8),
        Some(c) => anyhow::bail!("-D {c:?}: the delimiter must be one ASCII character"),
        None => None,
    };
    if args.reqs_per_event == Some(0) {
        anyhow::bail!("Number of requests per event must be greater than 0");
    }
    // memcached's own refusals, in its words.
    if args.item_size_max > args.memory_mb.saturating_mul(1024 * 1024) / 2 {
        anyhow::bail!("Cannot set item size limit higher than 1/2 of memory max.");
    }
    if args.conn_limit == 0 {
        anyhow::bail!("Maximum connections must be greater than 0");
    }
    let ext = extended(args.crawler_interval_ms, &args.extended)?;
    for what in accepted_without_effect(&args, &ext) {
        eprintln!("kvlab server: {what}");
    }
    if let Some(dir) = &args.data_dir {
        let port = args
            .cluster_node
            .as_deref()
            .and_then(|n| n.rsplit_once(':'))
            .map_or_else(|| args.port.to_string(), |(_, p)| p.to_string());
        not_a_parent_of_nodes(dir, &port)?;
    }
    // As memcached: privileges go before any socket or file is opened.
    if let Some(user) = &args.user {
        drop_privileges(user)?;
    }
    let auth = match &args.auth_file {
        Some(path) => Some(kvlab_server::auth::AuthFile::load(path)?),
        None => None,
    };
    let memory_limit = args
        .memory_mb
        .checked_mul(1024 * 1024)
        .context("memory limit too large")?;
    let config = ServerConfig {
        listen: SocketAddr::new(args.listen, args.port),
        unix_socket: args
            .unix_socket
            .clone()
            .map(|path| kvlab_server::UnixSocket {
                path,
                mask: args.unix_mask,
            }),
        threads: args.threads,
        memory_limit,
        cache_items: args.cache_items,
        max_connections: args.conn_limit,
        backlog: args.backlog,
        item_size_max: args.item_size_max,
        policy,
        io: args.io,
        front_ends: front_ends(&args),
        durable: args.data_dir.clone().map(|dir| DurableConfig {
            dir,
            durability: args.durability,
            flush_interval: std::time::Duration::from_millis(args.flush_interval_ms.max(1)),
        }),
        crawler: ext.crawler,
        slab_reassign: ext.slab_reassign,
        idle_timeout: ext.idle_timeout,
        auth,
        tls: args.enable_ssl.then(|| ext.tls.clone()),
        shutdown_command: args.enable_shutdown,
        growth_factor: args.growth_factor,
        chunk_size: args.chunk_size,
        prefix_delimiter,
        cas_enabled: !args.disable_cas,
        flush_enabled: !args.disable_flush_all,
        dumps_enabled: !args.disable_dumping,
        watch_enabled: !args.disable_watch,
        accepted: kvlab_server::admin::AcceptedSettings {
            reqs_per_event: args.reqs_per_event,
            binding_protocol: match args.protocol.as_str() {
                "ascii" => kvlab_protocol::Binding::Ascii,
                "binary" => kvlab_protocol::Binding::Binary,
                _ => kvlab_protocol::Binding::Auto,
            },
            read_buf_mem_limit: ext.read_buf_mem_limit,
            lru_maintainer: ext.lru_maintainer,
        },
        ..ServerConfig::default()
    };
    let cluster = args
        .cluster
        .clone()
        .map(|topology| kvlab_cluster::ClusterConfig {
            topology,
            node: args.cluster_node.clone(),
            open: kvlab_etcd::open_store,
        });
    // Before any thread starts (the signal thread, the server's): fork is safe only then.
    let daemon = if args.daemonize {
        Some(process::daemonize()?)
    } else {
        None
    };
    process::limits(args.lock_memory, args.enable_coredumps);
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .context("installing signal handlers")?;
    let server = match cluster {
        Some(cluster) => kvlab_cluster::serve(config, cluster),
        None => Server::start(config),
    }
    .with_context(|| match &args.unix_socket {
        Some(p) => format!("starting server on unix socket {}", p.display()),
        None => format!("starting server on {}:{}", args.listen, args.port),
    })?;
    // The port file before the line that says the server listens: a reader that waits for
    // that line finds the file written.
    if args.unix_socket.is_none() {
        if let Some(path) = std::env::var_os("MEMCACHED_PORT_FILENAME") {
            process::write_port_file(std::path::Path::new(&path), server.addr());
        }
    }
    eprintln!(
        "kvlab server listening on {} ({} threads, {} MiB{}, eviction {}, io {}{}){}",
        match &args.unix_socket {
            Some(p) => format!("unix:{}", p.display()),
            None => server.addr().to_string(),
        },
        args.threads,
        args.memory_mb,
        match args.cache_items {
            0 => String::new(),
            n => format!(", {n} items"),
        },
        policy,
        args.io.name(),
        match &args.data_dir {
            Some(d) => format!(", data {} durability {}", d.display(), args.durability),
            None => String::new(),
        },
        kvlab_rest::metrics_addr(&server)
            .map(|a| format!(", metrics on http://{a}/metrics"))
            .unwrap_or_default()
            + &kvlab_rest::rest_addr(&server)
                .map(|a| format!(", REST on http://{a}/"))
                .unwrap_or_default()
    );
    let pid_file = args.pid_file.as_deref().and_then(process::PidFile::write);
    if let Some(d) = daemon {
        d.ready(args.verbose > 0);
    }
    let stop = server.stop_handle();
    std::thread::Builder::new()
        .name("kvlab-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                eprintln!("kvlab server: signal {sig}, shutting down");
                stop.request_stop();
            }
        })?;
    server.wait();
    server.shutdown();
    if let Some(p) = &args.unix_socket {
        let _ = std::fs::remove_file(p);
    }
    drop(pid_file);
    Ok(())
}

/// `-p`: a TCP port, or memcached's -1 for one the kernel picks (kvlab's 0 too; memcached's
/// `-p 0`, no TCP at all, has no counterpart: kvlab always serves TCP or a unix socket).
fn parse_port(s: &str) -> Result<u16, String> {
    if s == "-1" {
        return Ok(0);
    }
    s.parse()
        .map_err(|_| format!("{s:?} is not a port (0-65535, or -1 for any free port)"))
}

/// The memcached flags given that kvlab accepts with no effect, each with why.
fn accepted_without_effect(args: &ServerArgs, ext: &Extended) -> Vec<String> {
    let mut out = Vec::new();
    if args.large_pages {
        out.push(
            "-L accepted, no effect: items come from the system allocator (transparent huge \
             pages where the kernel uses them)"
                .to_string(),
        );
    }
    if let Some(p) = &args.memory_file {
        out.push(format!(
            "-e {} accepted, no effect: kvlab keeps items across restarts with --data-dir",
            p.display()
        ));
    }
    for o in &ext.ignored {
        out.push(format!(
            "{o} accepted, no effect: kvlab has no such part to tune (docs/server.md)"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crawler_flags() {
        let on = |ms, o: &[&str]| {
            let o: Vec<String> = o.iter().map(|s| s.to_string()).collect();
            extended(ms, &o).map(|e| e.crawler.map(|c| c.interval.as_millis()))
        };
        assert_eq!(on(2000, &[]).unwrap(), Some(2000));
        assert_eq!(on(0, &[]).unwrap(), None);
        assert_eq!(on(500, &["lru_crawler"]).unwrap(), Some(500));
        assert_eq!(on(500, &["no_lru_crawler"]).unwrap(), None);
        assert!(on(0, &["lru_crawler"]).is_err());
        let err = on(500, &["no_such_option=2"]).unwrap_err().to_string();
        assert!(err.contains("no_such_option"), "{err}");
        // memcached's options for parts kvlab does not have: accepted, and said.
        let o: Vec<String> = vec!["slab_automove=2".into(), "track_sizes".into()];
        assert_eq!(
            extended(500, &o).unwrap().ignored,
            ["-o slab_automove=2", "-o track_sizes"]
        );
        let o: Vec<String> = vec!["hashpower=x".into()];
        assert!(extended(500, &o).is_err(), "a number is still checked");
        let o = |o: &[&str]| {
            let o: Vec<String> = o.iter().map(|s| s.to_string()).collect();
            extended(2000, &o)
        };
        assert!(o(&[]).unwrap().slab_reassign);
        assert!(!o(&["no_slab_reassign"]).unwrap().slab_reassign);
        // The LRU maintainer's fields follow memcached's switch (and `no_modern`).
        assert!(o(&[]).unwrap().lru_maintainer);
        assert!(!o(&["no_lru_maintainer"]).unwrap().lru_maintainer);
        assert!(!o(&["no_modern"]).unwrap().lru_maintainer);
        assert!(
            o(&["no_lru_maintainer", "lru_maintainer"])
                .unwrap()
                .lru_maintainer
        );
        assert_eq!(
            o(&["idle_timeout=5"]).unwrap().idle_timeout,
            Some(std::time::Duration::from_secs(5))
        );
        assert_eq!(o(&["idle_timeout=0"]).unwrap().idle_timeout, None);
        assert!(o(&["idle_timeout=x"]).is_err());
        // memcached's options kvlab's model has no counterpart of start it all the same.
        assert!(o(&[
            "no_lru_maintainer",
            "lru_maintainer",
            "slab_chunk_max=524288"
        ])
        .is_ok());
        assert!(o(&["watcher_logbuf_size=262144"]).is_ok());
        assert!(o(&["slab_chunk_max=big"]).is_err());
    }

    #[test]
    fn listen_backlog_flag() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            server: ServerArgs,
        }
        let parse = |args: &[&str]| Cli::try_parse_from(args).map(|c| c.server.backlog);
        assert_eq!(parse(&["kvlab"]).unwrap(), 1024);
        assert_eq!(parse(&["kvlab", "-b", "700"]).unwrap(), 700);
        assert_eq!(parse(&["kvlab", "--listen-backlog", "64"]).unwrap(), 64);
        assert!(parse(&["kvlab", "-b", "x"]).is_err());
    }
}
