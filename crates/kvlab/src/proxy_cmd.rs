//! `kvlab proxy`: listens like `kvlab server` and forwards to backends given with
//! `--backend` (one pool) or `--config proxy.toml` (pools and every setting; SIGHUP or a
//! change of the file reloads it).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use kvlab_proxy::config::{parse_backend, parse_distribution};
use kvlab_proxy::{MultiGet, Proxy, ProxyConfig, ProxyOptions, ReadPolicy, ReplicaWritePolicy};

/// Flags of `kvlab proxy`.
#[derive(Debug, Args)]
pub struct ProxyArgs {
    /// TCP port to listen on (0 picks a free port and prints it).
    #[arg(short = 'p', long = "port", default_value_t = 11211)]
    port: u16,
    /// Interface to listen on.
    #[arg(short = 'l', long = "listen", default_value = "127.0.0.1")]
    listen: IpAddr,
    /// Workers that talk to the backends: event loops under --io reactor, helper threads
    /// under --io epoll [default: `workers` in --config, else one per CPU under reactor and
    /// 8 under epoll].
    #[arg(short = 't', long = "threads")]
    threads: Option<usize>,
    /// Thread model: reactor (each of the -t workers is an event loop serving its own
    /// clients and backends, no hand-off: the fastest) or epoll (the classic middleware:
    /// one network thread and a request queue in front of -t workers, every stage timed).
    #[arg(long = "io", default_value = "reactor")]
    io: kvlab_proxy::ProxyIo,
    /// A backend, HOST:PORT or HOST:PORT:WEIGHT, optionally followed by a space and a name
    /// (twemproxy's server line: ketama hashes the name instead of the address), repeat for
    /// each; one pool. Not with --config.
    #[arg(long = "backend", value_name = "HOST:PORT[:WEIGHT] [NAME]")]
    backends: Vec<String>,
    /// Pools, backends and every setting from a TOML file (see docs/proxy.md); SIGHUP or a
    /// change of the file reloads it without dropping clients.
    #[arg(long = "config", value_name = "FILE", conflicts_with_all = ["backends", "distribution", "replicas", "write_policy", "read_policy", "multiget", "timeout_ms", "failure_limit", "retry_timeout_ms"])]
    config: Option<PathBuf>,
    /// Front a kvlab cluster through this node (HOST:PORT): the backends are the cluster's
    /// nodes, keys go where its live ring says (followed as it changes), and MOVED/TRYAGAIN
    /// redirects are followed, so unmodified memcached clients need no changes.
    #[arg(long = "cluster", value_name = "HOST:PORT", conflicts_with_all = ["config", "backends", "distribution", "replicas", "write_policy", "read_policy", "multiget"])]
    cluster: Option<String>,
    /// Key → backend map: ketama (consistent hashing, the same servers as twemproxy and
    /// libmemcached) or modula.
    #[arg(long = "distribution")]
    distribution: Option<String>,
    /// Copies of every key: a write goes to all of them, a read to one [default: 1].
    #[arg(long = "replicas")]
    replicas: Option<usize>,
    /// When a replicated write is answered: all (every replica stored it) or majority.
    #[arg(long = "write-policy")]
    write_policy: Option<ReplicaWritePolicy>,
    /// Which replica serves a read: round-robin or least-outstanding.
    #[arg(long = "read-policy")]
    read_policy: Option<ReadPolicy>,
    /// Multi-key gets: sharded (one request per backend, merged in key order) or single
    /// (the whole request to one backend; every backend must hold every key).
    #[arg(long = "multiget")]
    multiget: Option<MultiGet>,
    /// A backend request not answered within this many milliseconds fails [default: 1000].
    #[arg(long = "timeout-ms")]
    timeout_ms: Option<u64>,
    /// Failures in a row that eject a backend from reads [default: 2].
    #[arg(long = "failure-limit")]
    failure_limit: Option<u32>,
    /// Milliseconds between probes of an ejected backend; one that answers is put back (in
    /// a replicated pool once the writes it missed are copied to it) [default: 1000].
    #[arg(long = "retry-timeout-ms")]
    retry_timeout_ms: Option<u64>,
    /// Maximum simultaneous client connections.
    #[arg(short = 'c', long = "conn-limit", default_value_t = 4096)]
    conn_limit: usize,
    /// Largest value accepted, in bytes or with a k/m suffix (as the backends' -I).
    #[arg(short = 'I', long = "max-item-size", default_value = "1m", value_parser = crate::server_cmd::parse_size)]
    item_size_max: usize,
    /// Write per-window figures (windows.csv, backends.csv, requests.csv) to DIR.
    #[arg(long = "log-dir", value_name = "DIR")]
    log_dir: Option<PathBuf>,
    /// Length of a logging window, in seconds.
    #[arg(long = "log-interval", default_value_t = 1.0)]
    log_interval: f64,
    /// Write every N-th request to requests.csv (0: none).
    #[arg(long = "log-sample", default_value_t = 0)]
    log_sample: u64,
    /// Serve Prometheus text at http://LISTEN:PORT/metrics.
    #[arg(long = "metrics-port")]
    metrics_port: Option<u16>,
    /// Do not record per-request figures (stage times, queue length, backend times): only
    /// to measure what recording costs.
    #[arg(long = "no-record")]
    no_record: bool,
    /// More logging (-v info, -vv debug).
    #[arg(short = 'v', action = clap::ArgAction::Count)]
    verbose: u8,
}

/// The routing configuration the flags describe.
fn proxy_config(args: &ProxyArgs) -> anyhow::Result<ProxyConfig> {
    let mut config = match &args.config {
        Some(path) => ProxyConfig::load(path)?,
        None => {
            let backends = args
                .backends
                .iter()
                .map(|b| parse_backend(b))
                .collect::<Result<Vec<_>, _>>()?;
            let mut c = ProxyConfig::new(backends);
            let pool = &mut c.pools[0];
            if let Some(d) = &args.distribution {
                pool.distribution = parse_distribution(d)?;
            }
            if let Some(r) = args.replicas {
                pool.replicas = r;
            }
            if let Some(p) = args.write_policy {
                pool.write_policy = p;
            }
            if let Some(p) = args.read_policy {
                pool.read_policy = p;
            }
            if let Some(m) = args.multiget {
                pool.multiget = m;
            }
            if let Some(ms) = args.timeout_ms {
                c.timeout = Duration::from_millis(ms);
            }
            if let Some(k) = args.failure_limit {
                c.failure_limit = k;
            }
            if let Some(ms) = args.retry_timeout_ms {
                c.retry_timeout = Duration::from_millis(ms);
            }
            if let Some(seed) = &args.cluster {
                let addr = kvlab_client::cluster::resolve(seed)?;
                let ring = kvlab_client::cluster::fetch_ring(addr, Duration::from_secs(2))
                    .map_err(|e| anyhow::anyhow!("cluster ring from {seed}: {e}"))?;
                c = c.of_cluster(seed, ring)?;
            }
            if c.pools[0].backends.is_empty() {
                anyhow::bail!(
                    "no backends: give --backend HOST:PORT (repeatable) or --config FILE"
                );
            }
            c
        }
    };
    if let Some(t) = args.threads {
        config.workers = t;
    }
    config.check()?;
    Ok(config)
}

/// Runs the proxy until SIGINT or SIGTERM.
pub fn run(args: ProxyArgs) -> anyhow::Result<()> {
    crate::server_cmd::init_logging(args.verbose);
    let config = proxy_config(&args)?;
    if !(args.log_interval > 0.0 && args.log_interval.is_finite()) {
        anyhow::bail!("--log-interval must be a positive number of seconds");
    }
    let mut options = ProxyOptions::new(SocketAddr::new(args.listen, args.port));
    options.conn_limit = args.conn_limit;
    options.limits.item_size_max = args.item_size_max;
    options.log_dir = args.log_dir.clone();
    options.log_interval = Duration::from_secs_f64(args.log_interval);
    options.log_sample = args.log_sample;
    options.metrics = args.metrics_port.map(|p| SocketAddr::new(args.listen, p));
    options.config_file = args.config.clone();
    options.io = args.io;
    options.record = !args.no_record;
    let summary = format!(
        "{} pool(s), {} backend(s), {} workers, io {:?}",
        config.pools.len(),
        config.pools.iter().map(|p| p.backends.len()).sum::<usize>(),
        config.workers_for(args.io),
        args.io
    );
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ])
    .context("installing signal handlers")?;
    let proxy = Proxy::start(config, options)
        .with_context(|| format!("starting proxy on {}:{}", args.listen, args.port))?;
    eprintln!(
        "kvlab proxy listening on {} ({summary}){}",
        proxy.addr(),
        proxy
            .metrics_addr()
            .map(|a| format!(", metrics on http://{a}/metrics"))
            .unwrap_or_default()
    );
    let reload = proxy.shared().reload_requested.clone();
    for sig in signals.forever() {
        if sig == signal_hook::consts::SIGHUP {
            if args.config.is_some() {
                reload.store(true, std::sync::atomic::Ordering::Relaxed);
            } else {
                eprintln!("kvlab proxy: SIGHUP ignored (no --config file to reload)");
            }
            continue;
        }
        eprintln!("kvlab proxy: signal {sig}, shutting down");
        break;
    }
    proxy.stop();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ProxyArgs,
    }

    fn config(argv: &[&str]) -> anyhow::Result<ProxyConfig> {
        let cli = Cli::try_parse_from(std::iter::once("proxy").chain(argv.iter().copied()))?;
        proxy_config(&cli.args)
    }

    #[test]
    fn flags_and_a_file_describe_the_same_pool() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.toml");
        std::fs::write(
            &file,
            "workers = 3\n[[pool]]\nbackends = [\"a:1\", \"b:2:3\"]\nreplicas = 2\nwrite_policy = \"majority\"\n",
        )
        .unwrap();
        let from_flags = config(&[
            "--backend",
            "a:1",
            "--backend",
            "b:2:3",
            "--replicas",
            "2",
            "--write-policy",
            "majority",
            "-t",
            "3",
        ])
        .unwrap();
        let from_file = config(&["--config", file.to_str().unwrap()]).unwrap();
        assert_eq!(format!("{from_flags:?}"), format!("{from_file:?}"));
        assert_eq!(from_flags.workers, 3);
        assert_eq!(
            kvlab_proxy::config::DEFAULT_FAILURE_LIMIT,
            from_file.failure_limit
        );
    }

    #[test]
    fn bad_flags_are_refused() {
        assert!(config(&[]).unwrap_err().to_string().contains("no backends"));
        assert!(config(&["--backend", "a:1", "--replicas", "2"]).is_err());
        assert!(config(&["--backend", "a:1", "--config", "x.toml"]).is_err());
        assert!(config(&["--backend", "a:1", "--write-policy", "some"]).is_err());
    }
}
