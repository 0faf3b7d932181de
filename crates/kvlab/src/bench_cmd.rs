//! `kvlab bench`: the load generator's command line.
//!
//! Maps flags onto a [`kvlab_bench::load::Load`] (through its flat
//! [`kvlab_bench::load::Options`], one flag per key), derives a [`kvlab_bench::BenchConfig`] per
//! target from it, runs them A B A B … for
//! `--repeat` rounds, prints a summary per run and the per-target comparison, and writes
//! `--json` / `--csv`. `kvlab bench agent` serves masters for distributed load.
//! `--find-sustained` searches each target for the largest open-loop rate whose latency stays
//! under `--mean-below` or `--p95-below` (see [`kvlab_bench::sustained`]).

use std::io::IsTerminal;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use kvlab_bench::data::DataKey;
use kvlab_bench::load::{
    Closed, Load, Open, Options, SizeSpec, DEFAULT_DURATION_S, DEFAULT_QPS_SEED,
};
use kvlab_bench::report;
use kvlab_bench::schedule::Arrival;
use kvlab_bench::sustained::{self, Bound, SearchSpec};
use kvlab_bench::workload::Workload;
use kvlab_bench::{BenchConfig, Protocol};

/// Flags of `kvlab bench`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: Option<BenchCommand>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Serve a master's workload from this machine (distributed load).
    Agent(AgentArgs),
}

#[derive(Debug, Args)]
struct AgentArgs {
    /// Address to listen on for the master.
    #[arg(long, default_value = "0.0.0.0:5556")]
    listen: String,
    /// Serve one master, then exit.
    #[arg(long)]
    once: bool,
}

/// `text` with the default that `kvlab_bench` states for it.
fn dflt(text: &str, value: impl std::fmt::Display) -> String {
    format!("{text} [default: {value}]")
}

fn depth_help() -> String {
    format!(
        "Requests in flight per connection (closed loop: pipeline depth, default {}; open loop: \
         cap before planned requests wait, default {})",
        Closed::default().depth,
        Open::default_depth()
    )
}

/// The flags of one run. Every load flag is optional: absent means the default of
/// [`kvlab_bench::load::Load`] (shown in the help, read from there), and the flags map onto
/// [`kvlab_bench::load::Options`] one to one.
#[derive(Debug, Args)]
struct RunArgs {
    /// Server address; repeat to compare several (run A B A B …).
    #[arg(long = "target", short = 's', default_value = "127.0.0.1:11211")]
    targets: Vec<String>,
    /// Rounds over all targets.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    #[arg(long, value_enum, help = dflt(
        "Protocol: `memcached` (text protocol), `meta` (memcached's meta protocol: mg/ms/md, \
         quiet mg + mn for multi-gets; same port) or `http` (kvlab's REST interface, keep-alive, \
         pipelined; the target is the server's --http-port)",
        protocol_name(Load::default().protocol)))]
    protocol: Option<ProtocolArg>,
    /// With --protocol meta: send keys base64-encoded (the `b` flag; keys up to 186 bytes).
    #[arg(long)]
    meta_base64: bool,
    /// Load a kvlab cluster through this node (HOST:PORT; instead of -s): every key goes to
    /// its node by the cluster's ring; MOVED/TRYAGAIN redirects are followed, not counted
    /// as errors (the run reports how many).
    #[arg(long, value_name = "ADDR", conflicts_with = "targets")]
    cluster: Option<String>,

    // --- load model ---
    #[arg(long, short = 'T', help = dflt("Generator threads", Load::default().threads))]
    threads: Option<usize>,
    #[arg(long, short = 'c', help = dflt("Connections per thread", Load::default().connections))]
    connections: Option<usize>,
    #[arg(long, short = 'd', help = depth_help())]
    depth: Option<usize>,
    #[arg(long, help = dflt("Closed loop: think time between a reply and the next request, µs",
        Closed::default().think_us))]
    think_us: Option<u64>,
    #[arg(long, help = format!("Run length in seconds (per step with --scan; with --requests \
        and no --duration the count alone ends the run) [default: {}; with --find-sustained {} \
        per step]", DEFAULT_DURATION_S, SearchSpec::new(Bound::Mean, 1.0).step_s))]
    duration: Option<f64>,
    /// Stop after this many requests in total instead (a --duration given too still caps it).
    #[arg(long)]
    requests: Option<u64>,
    /// Open loop: total target rate, requests/s over all connections.
    #[arg(long, conflicts_with_all = ["scan", "qps_interval", "qps_list", "qps_file"])]
    qps: Option<f64>,
    #[arg(long, value_enum, help = dflt("Open-loop inter-arrival distribution",
        arrival_name(Arrival::default())))]
    arrival: Option<ArrivalArg>,
    /// Open-loop rate sweep MIN:MAX:STEP (requests/s), --duration per step.
    #[arg(long, conflicts_with_all = ["qps_interval", "qps_list", "qps_file"])]
    scan: Option<String>,
    /// Changing rate: a new total rate every S seconds (with --qps-min/--qps-max/--qps-seed,
    /// --qps-list or --qps-file).
    #[arg(long)]
    qps_interval: Option<f64>,
    #[arg(long, help = dflt("Random trace: lowest rate, requests/s. With \
        --find-sustained: the first rate tried", SearchSpec::new(Bound::Mean, 1.0).start))]
    qps_min: Option<f64>,
    #[arg(long, help = dflt("Random trace: highest rate, requests/s. With \
        --find-sustained: the highest rate tried", SearchSpec::new(Bound::Mean, 1.0).max))]
    qps_max: Option<f64>,
    #[arg(long, help = dflt("Random trace: seed (the same seed gives the same trace)",
        DEFAULT_QPS_SEED))]
    qps_seed: Option<u64>,
    /// Explicit rates, comma-separated (requests/s), each for --qps-interval seconds.
    #[arg(long, value_delimiter = ',')]
    qps_list: Option<Vec<f64>>,
    /// File of rates: lines `RATE` (lasting --qps-interval) or `SECONDS RATE`.
    #[arg(long)]
    qps_file: Option<PathBuf>,

    // --- workload ---
    /// Preset: `etc` = Facebook ETC key/value sizes and a 30:1 get:set mix (mutilate's).
    #[arg(long)]
    workload: Option<String>,
    #[arg(long, help = dflt("Number of distinct keys", Workload::default().keys))]
    keys: Option<u64>,
    #[arg(long, help = dflt("Key prefix", Workload::default().key_prefix))]
    key_prefix: Option<String>,
    /// Key size in bytes: N, A-B, or a distribution (gev:LOC,SCALE,SHAPE, normal:M,SD, …).
    #[arg(long)]
    key_size: Option<String>,
    #[arg(long, help = dflt("Key choice: uniform, sequential, gaussian[:MEAN,SD], zipf:S, \
        hot:F:P", format!("{:?}", Workload::default().key_dist).to_lowercase()))]
    key_dist: Option<String>,
    /// Hot set F:P: a fraction F of keys gets a fraction P of requests (= --key-dist hot:F:P).
    #[arg(long, conflicts_with = "key_dist")]
    hot: Option<String>,
    /// Value size in bytes: N, A-B, uniform:A,B, normal:M,SD, exp:M, gpareto:L,S,K, gev:L,S,K.
    #[arg(long)]
    value_size: Option<String>,
    /// Operation mix, e.g. get=9,set=1 or get=21,delete=8,set=1.
    #[arg(long)]
    mix: Option<String>,
    #[arg(long, help = dflt("Keys per get request (multi-get)", Workload::default().multiget))]
    multiget: Option<u32>,
    /// Check every hit: values derive from key and version; a wrong value is an error (with
    /// --data: a hit must equal its record's bytes, byte for byte).
    #[arg(long)]
    verify: bool,
    /// Real data set as keys and values: a maildir tree (a directory: every file under it),
    /// a JSON-lines file (.jsonl/.ndjson, or first byte `{`: {"key": …, "value": …} or
    /// {"key": …, "value_base64": …} a line) or a CSV file (.csv: key,value rows). Gets and
    /// sets choose among its records by --key-dist; sets send the records' bytes; the load
    /// phase writes every record once. Keys memcached cannot carry are mapped (reported).
    #[arg(long, value_name = "PATH", conflicts_with_all = ["workload", "keys", "key_prefix",
        "key_size", "value_size"])]
    data: Option<PathBuf>,
    #[arg(long, value_enum, requires = "data", help = dflt("With a maildir --data: a \
        message's key, `path` (relative to the root) or `message-id` (its Message-ID header; \
        the path when it has none)", "path"))]
    data_key: Option<DataKeyArg>,
    #[arg(long, value_name = "BYTES", requires = "data", value_parser = parse_size,
        help = dflt("With --data: records whose item (key + value + 80 bytes) is larger are \
        skipped and counted; N, Nk or Nm, as memcached's -I",
        kvlab_bench::data::DEFAULT_MAX_ITEM_SIZE))]
    max_item_size: Option<u64>,
    /// Fill every key before the run (the default when the mix has gets).
    #[arg(long, conflicts_with = "noload")]
    load: bool,
    /// Do not fill keys before the run.
    #[arg(long)]
    noload: bool,
    #[arg(long, help = format!("Warm-up seconds, run and discarded [default: {}; with \
        --find-sustained {} per step]", Load::default().warmup_s,
        SearchSpec::new(Bound::Mean, 1.0).warmup_s))]
    warmup: Option<f64>,

    // --- sustained-throughput search ---
    /// Search the largest open-loop rate whose latency (from the planned send) stays under
    /// --mean-below or --p95-below while ≥ 99 % of planned requests are answered; --duration
    /// is then per step.
    #[arg(long, conflicts_with_all = ["qps", "scan", "qps_interval", "qps_list", "qps_file", "requests"])]
    find_sustained: bool,
    /// Search bound on the mean latency, e.g. 1ms, 500us.
    #[arg(long, requires = "find_sustained", conflicts_with = "p95_below", value_parser = parse_duration_us)]
    mean_below: Option<f64>,
    /// Search bound on the 95th percentile latency, e.g. 2ms.
    #[arg(long, requires = "find_sustained", value_parser = parse_duration_us)]
    p95_below: Option<f64>,
    #[arg(long, requires = "find_sustained", help = dflt("Search precision: stop when \
        the bracket (bad − good) / good is at most this",
        SearchSpec::new(Bound::Mean, 1.0).precision))]
    precision: Option<f64>,
    #[arg(long, requires = "find_sustained", help = dflt("Search time budget, seconds \
        (the search stops with what it has)", SearchSpec::new(Bound::Mean, 1.0).max_time_s))]
    max_time: Option<f64>,
    /// Search: fill the key space again before every step (with the load phase on), so a mix
    /// with deletes starts each step from a full cache.
    #[arg(long, requires = "find_sustained")]
    reload_each_step: bool,
    /// Search: measure a failed rate again up to N times; it fails only if every try does
    /// (for machines whose latency at a low rate moves with the CPU's wake-ups).
    #[arg(long, requires = "find_sustained", default_value_t = 0)]
    retries: u32,

    // --- measurement and output ---
    #[arg(long, help = dflt("Time-series interval, seconds", Load::default().interval_s))]
    interval: Option<f64>,
    #[arg(long, help = dflt("A request unanswered this long is a timeout, milliseconds",
        Load::default().timeout_ms))]
    timeout_ms: Option<u64>,
    #[arg(long, help = dflt("Seed of all random choices", Load::default().seed))]
    seed: Option<u64>,
    /// Write every run and interval as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the intervals as CSV.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Append every interval to FILE as one line of JSON as soon as it is measured (what
    /// `kvlab control --live` reads; with --interval 0.1 it sees the p95 every 100 ms).
    #[arg(long, value_name = "FILE")]
    live: Option<PathBuf>,
    /// An agent (`kvlab bench agent`) to generate load too; repeat for several.
    #[arg(long = "agent")]
    agents: Vec<String>,
    /// No progress line.
    #[arg(long, short = 'q')]
    quiet: bool,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum DataKeyArg {
    Path,
    MessageId,
}

/// `N`, `Nk` or `Nm` bytes (k = 1024), as memcached's `-I`.
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1024),
        Some((i, 'm' | 'M')) => (&t[..i], 1024 * 1024),
        _ => (t, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("{s:?}: want N, Nk or Nm bytes"))
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum ProtocolArg {
    Memcached,
    Meta,
    Http,
}

fn protocol_name(p: Protocol) -> &'static str {
    p.name()
}

fn arrival_name(a: Arrival) -> &'static str {
    match a {
        Arrival::Poisson => "poisson",
        Arrival::Fixed => "fixed",
    }
}

/// Parses a latency such as `1ms`, `500us`, `0.5s`, `250µs`, `800ns` into microseconds.
fn parse_duration_us(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("{s:?}: give a unit (ns, us, ms, s)"))?;
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("{s:?}: bad number"))?;
    let scale = match unit.trim() {
        "ns" => 1e-3,
        "us" | "µs" => 1.0,
        "ms" => 1e3,
        "s" => 1e6,
        u => return Err(format!("{s:?}: unknown unit {u:?} (ns, us, ms, s)")),
    };
    if !(n > 0.0 && n.is_finite()) {
        return Err(format!("{s:?}: must be > 0"));
    }
    Ok(n * scale)
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum ArrivalArg {
    Poisson,
    Fixed,
}

fn resolve(addr: &str) -> anyhow::Result<SocketAddr> {
    addr.to_socket_addrs()
        .with_context(|| format!("bad address {addr:?}"))?
        .next()
        .with_context(|| format!("{addr:?} resolves to nothing"))
}

impl RunArgs {
    /// The load flags as [`Options`]: one flag, one key; nothing decided here.
    fn options(&self) -> Options {
        Options {
            protocol: self.protocol.map(|p| match p {
                ProtocolArg::Memcached => Protocol::Memcached,
                ProtocolArg::Meta => Protocol::Meta,
                ProtocolArg::Http => Protocol::Http,
            }),
            meta_base64: self.meta_base64.then_some(true),
            cluster: self.cluster.is_some().then_some(true),
            threads: self.threads,
            connections: self.connections,
            depth: self.depth,
            think_us: self.think_us,
            qps: self.qps,
            arrival: self.arrival.map(|a| match a {
                ArrivalArg::Poisson => Arrival::Poisson,
                ArrivalArg::Fixed => Arrival::Fixed,
            }),
            scan: self.scan.clone(),
            qps_interval: self.qps_interval,
            qps_min: self.qps_min,
            qps_max: self.qps_max,
            qps_seed: self.qps_seed,
            qps_list: self.qps_list.clone(),
            qps_file: self.qps_file.clone(),
            preset: self.workload.clone(),
            keys: self.keys,
            key_prefix: self.key_prefix.clone(),
            key_size: self.key_size.clone().map(SizeSpec::Text),
            key_dist: self.key_dist.clone(),
            hot: self.hot.clone(),
            value_size: self.value_size.clone().map(SizeSpec::Text),
            mix: self.mix.clone(),
            multiget: self.multiget,
            verify: self.verify.then_some(true),
            exptime: None,
            data: self.data.clone(),
            data_key: self.data_key.map(|k| match k {
                DataKeyArg::Path => DataKey::Path,
                DataKeyArg::MessageId => DataKey::MessageId,
            }),
            max_item_size: self.max_item_size,
            load: match (self.load, self.noload) {
                (true, _) => Some(true),
                (_, true) => Some(false),
                _ => None,
            },
            warmup: self.warmup,
            duration: self.duration,
            requests: self.requests,
            interval: self.interval,
            timeout_ms: self.timeout_ms,
            seed: self.seed,
        }
    }

    /// The description of one run (not of a search).
    fn load(&self) -> anyhow::Result<Load> {
        Ok(self.options().to_load()?)
    }

    fn configs_of(&self, load: &Load) -> anyhow::Result<Vec<BenchConfig>> {
        match &self.cluster {
            Some(seed) => Ok(vec![load.config(resolve(seed)?)?]),
            None => self
                .targets
                .iter()
                .map(|t| Ok(load.config(resolve(t)?)?))
                .collect(),
        }
    }

    fn search_spec(&self) -> anyhow::Result<SearchSpec> {
        let (bound, us) = match (self.mean_below, self.p95_below) {
            (Some(us), None) => (Bound::Mean, us),
            (None, Some(us)) => (Bound::P95, us),
            _ => bail!("--find-sustained needs --mean-below DUR or --p95-below DUR"),
        };
        let mut spec = SearchSpec::new(bound, us);
        if let Some(q) = self.qps_min {
            spec.start = q;
            spec.min = spec.min.min(q);
        }
        if let Some(q) = self.qps_max {
            spec.max = q;
        }
        if let Some(p) = self.precision {
            spec.precision = p;
        }
        spec.reload_each_step = self.reload_each_step;
        spec.retries = self.retries;
        if let Some(t) = self.max_time {
            spec.max_time_s = t;
        }
        if let Some(d) = self.duration {
            spec.step_s = d;
        }
        if let Some(w) = self.warmup {
            spec.warmup_s = w;
        }
        if let Some(a) = self.arrival {
            spec.arrival = match a {
                ArrivalArg::Poisson => Arrival::Poisson,
                ArrivalArg::Fixed => Arrival::Fixed,
            };
        }
        spec.validate()?;
        Ok(spec)
    }

    /// The description a search's steps start from: open loop (so its defaults, such as the
    /// depth cap, apply) at the first rate; the search replaces the rate, warm-up and
    /// duration of each step.
    fn search_load(&self, spec: &SearchSpec) -> anyhow::Result<Load> {
        let opts = Options {
            qps: Some(spec.start),
            qps_min: None,
            qps_max: None,
            ..self.options()
        };
        Ok(opts.to_load()?)
    }
}

/// `--find-sustained`: one search per target (and round).
fn run_search(
    r: &RunArgs,
    agents: &[SocketAddr],
    stop: &kvlab_bench::config::Stop,
) -> anyhow::Result<()> {
    let spec = r.search_spec()?;
    let configs = r.configs_of(&r.search_load(&spec)?)?;
    let mut results = Vec::new();
    for round in 0..r.repeat {
        for cfg in &configs {
            if stop.raised() {
                break;
            }
            let mut cfg = cfg.clone();
            cfg.stop = stop.clone();
            // Fill each target once, before its first search.
            cfg.load = cfg.load && round == 0;
            if !r.quiet {
                eprintln!(
                    "searching {} ({:?}){}",
                    cfg.target,
                    cfg.protocol,
                    if cfg.load { ", filling it first" } else { "" }
                );
            }
            let quiet = r.quiet;
            let res = sustained::find_sustained(&cfg, &spec, agents, &mut |s| {
                if !quiet {
                    eprintln!(
                        "  step {:>2}: offered {:>10.0} req/s, achieved {:>10.0} req/s, mean {:>9.1} µs, p95 {:>9.1} µs: {}",
                        s.index,
                        s.offered_qps,
                        s.achieved_qps,
                        s.mean_us,
                        s.p95_us,
                        s.verdict.text()
                    );
                }
            })
            .with_context(|| format!("search on {}", cfg.target))?;
            print!("{}", sustained::table(&res));
            results.push(res);
        }
    }
    if let Some(p) = &r.json {
        std::fs::write(p, sustained::to_json(&results))
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &r.csv {
        std::fs::write(p, sustained::to_csv(&results))
            .with_context(|| format!("writing {}", p.display()))?;
    }
    interrupted(stop)
}

/// Runs `kvlab bench`.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    if let Some(BenchCommand::Agent(a)) = args.command {
        let listen = resolve(&a.listen)?;
        return kvlab_bench::agent::serve(listen, a.once, |addr| {
            eprintln!("kvlab bench agent listening on {addr}");
        })
        .context("agent");
    }
    let r = args.run;
    if r.repeat == 0 {
        bail!("--repeat must be >= 1");
    }
    let agents: Vec<SocketAddr> = r
        .agents
        .iter()
        .map(|a| resolve(a))
        .collect::<Result<_, _>>()?;
    // Ctrl-C (or SIGTERM) ends the run in progress with what it measured so far; a
    // second one ends the program at once.
    let stop = kvlab_bench::config::Stop::default();
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register_conditional_shutdown(sig, 130, stop.flag())
            .and_then(|_| signal_hook::flag::register(sig, stop.flag()))
            .context("installing signal handlers")?;
    }
    if r.find_sustained {
        return run_search(&r, &agents, &stop);
    }
    let mut configs = r.configs_of(&r.load()?)?;
    for cfg in &mut configs {
        cfg.stop = stop.clone();
    }
    let show_progress = !r.quiet && std::io::stderr().is_terminal();
    let mut live = match &r.live {
        Some(p) => {
            Some(std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?)
        }
        None => None,
    };
    let mut runs = Vec::new();
    let mut loaded = vec![false; configs.len()];
    for round in 0..r.repeat {
        for (i, cfg) in configs.iter().enumerate() {
            let mut cfg = cfg.clone();
            // Fill each target once, before its first run.
            cfg.load = cfg.load && !loaded[i];
            loaded[i] = true;
            if configs.len() > 1 || r.repeat > 1 {
                eprintln!(
                    "run {} of {}: target {}",
                    runs.len() + 1,
                    configs.len() * r.repeat,
                    cfg.target
                );
            }
            // Unknown length for a request-count run: the bar then stays empty.
            let total_s = if cfg.requests.is_some() {
                0.0
            } else {
                cfg.end_ns() as f64 / 1e9
            };
            let mut first_ts: Option<u64> = None;
            let mut progress = |row: &kvlab_bench::run::IntervalRow| {
                if let Some(f) = &mut live {
                    use std::io::Write as _;
                    // Best effort: a full disk must not stop the load mid-run.
                    let _ = writeln!(f, "{}", report::interval_json(row)).and_then(|()| f.flush());
                }
                if show_progress {
                    let first = *first_ts.get_or_insert(row.ts_start);
                    let elapsed = row.ts_end.saturating_sub(first) as f64 / 1000.0;
                    eprint!("\r{}", report::progress_line(row, elapsed, total_s));
                }
            };
            let result = kvlab_bench::run(&cfg, &agents, &mut progress)
                .with_context(|| format!("round {}, target {}", round + 1, cfg.target))?;
            if show_progress {
                eprintln!();
            }
            print!("{}", report::summary(&result));
            runs.push(result);
            if stop.raised() {
                break;
            }
        }
        if stop.raised() {
            break;
        }
    }
    let comparison = report::compare(&runs);
    if configs.len() > 1 || r.repeat > 1 {
        println!();
        print!("{}", report::comparison_table(&comparison));
    }
    if let Some(p) = &r.json {
        std::fs::write(p, report::to_json(&runs, &comparison))
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &r.csv {
        std::fs::write(p, report::to_csv(&runs))
            .with_context(|| format!("writing {}", p.display()))?;
    }
    interrupted(&stop)
}

/// After an interrupted run's partial result was printed and written: says so and exits
/// 130 (as a shell reports a command ended by Ctrl-C).
fn interrupted(stop: &kvlab_bench::config::Stop) -> anyhow::Result<()> {
    if stop.raised() {
        eprintln!("interrupted: the result above is partial (up to the interrupt)");
        std::process::exit(130);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    fn args(flags: &[&str]) -> RunArgs {
        let mut v = vec!["bench"];
        v.extend_from_slice(flags);
        Cli::try_parse_from(v).unwrap().run
    }

    fn config(flags: &[&str]) -> BenchConfig {
        args(flags)
            .configs_of(&args(flags).load().unwrap())
            .unwrap()[0]
            .clone()
    }

    #[test]
    fn no_flags_is_the_default_load() {
        let a = args(&[]);
        assert_eq!(a.options(), Options::default());
        assert_eq!(a.load().unwrap(), Load::default());
    }

    #[test]
    fn flags_map_onto_options_one_to_one() {
        let c = config(&[
            "-T",
            "2",
            "-c",
            "3",
            "--qps",
            "5000",
            "--arrival",
            "fixed",
            "--keys",
            "1000",
            "--key-size",
            "20",
            "--value-size",
            "10-20",
            "--mix",
            "get=1,set=1",
            "--verify",
            "--noload",
            "--warmup",
            "0.5",
            "--duration",
            "3",
            "--seed",
            "7",
            "--protocol",
            "http",
            "--interval",
            "0.5",
            "--timeout-ms",
            "99",
        ]);
        assert_eq!((c.threads, c.connections, c.depth), (2, 3, 1024));
        assert_eq!(c.open, Some(Arrival::Fixed));
        assert_eq!(c.plan.segments[0].qps, 5000.0);
        assert_eq!(c.plan.duration_ns(), 3_000_000_000);
        assert_eq!(c.workload.keys, 1000);
        assert!(c.workload.verify && !c.load);
        assert_eq!(
            (c.warmup_s, c.interval_s, c.timeout_ms, c.seed),
            (0.5, 0.5, 99, 7)
        );
        assert_eq!(c.protocol, Protocol::Http);
        let c = config(&["--qps-list", "100,200", "--qps-interval", "2"]);
        assert_eq!(c.plan.segments.len(), 2);
        assert_eq!(c.plan.duration_ns(), 4_000_000_000);
        let c = config(&["--protocol", "meta", "--meta-base64"]);
        assert_eq!((c.protocol, c.meta_base64), (Protocol::Meta, true));
        let c = config(&["--protocol", "meta"]);
        assert_eq!((c.protocol, c.meta_base64), (Protocol::Meta, false));
        let e = args(&["--meta-base64"]).load().unwrap_err();
        assert!(format!("{e}").contains("needs protocol = \"meta\""), "{e}");
        let c = config(&["--requests", "50"]);
        assert!(
            c.plan.duration_ns() > 1_000_000_000_000,
            "the count ends the run"
        );
    }

    #[test]
    fn bad_flags_fail_clearly() {
        let e = args(&["--qps-min", "5"]).load().unwrap_err();
        assert!(format!("{e}").contains("qps_interval"), "{e}");
        let e = args(&["--threads", "0"]).load().unwrap_err();
        assert!(format!("{e}").contains("threads = 0"), "{e}");
        assert!(Cli::try_parse_from(["bench", "--qps", "1", "--scan", "1:2:1"]).is_err());
    }

    #[test]
    fn a_search_starts_from_the_open_loop_defaults() {
        let a = args(&[
            "--find-sustained",
            "--mean-below",
            "1ms",
            "--qps-min",
            "500",
        ]);
        let spec = a.search_spec().unwrap();
        assert_eq!(spec.start, 500.0);
        let base = a.search_load(&spec).unwrap();
        assert_eq!(base.depth(), Open::default_depth());
        assert_eq!(spec.step_s, SearchSpec::new(Bound::Mean, 1.0).step_s);
    }

    /// The same values as flags and as an experiment's `[workload]` keys give the same run;
    /// with none given, both are bench's defaults (a default restated differently on either
    /// side fails here).
    #[test]
    fn flags_and_an_experiment_workload_give_the_same_config() {
        use kvlab_lab::spec::WorkloadSpec;
        let target: SocketAddr = ([127, 0, 0, 1], 11211).into();
        let cases: &[(&[&str], &str)] = &[
            (&[], ""),
            (
                &[
                    "-T",
                    "2",
                    "-c",
                    "3",
                    "-d",
                    "4",
                    "--think-us",
                    "5",
                    "--keys",
                    "1000",
                    "--key-size",
                    "20",
                    "--value-size",
                    "10-20",
                    "--mix",
                    "get=1,set=1",
                    "--verify",
                    "--noload",
                    "--interval",
                    "0.5",
                    "--timeout-ms",
                    "99",
                    "--protocol",
                    "http",
                    "--key-dist",
                    "zipf:0.9",
                    "--multiget",
                    "2",
                    "--key-prefix",
                    "k",
                ],
                "threads = 2\nconnections = 3\ndepth = 4\nthink_us = 5\nkeys = 1000\n\
                 key_size = 20\nvalue_size = \"10-20\"\nmix = \"get=1,set=1\"\nverify = true\n\
                 load = false\ninterval = 0.5\ntimeout_ms = 99\nprotocol = \"http\"\n\
                 key_dist = \"zipf:0.9\"\nmultiget = 2\nkey_prefix = \"k\"",
            ),
            (
                &["--qps", "5000", "--arrival", "fixed", "--workload", "etc"],
                "qps = 5000\narrival = \"fixed\"\npreset = \"etc\"",
            ),
            (
                &["--qps-list", "100,200", "--qps-interval", "2", "--load"],
                "qps_list = [100, 200]\nqps_interval = 2\nload = true",
            ),
        ];
        for (flags, keys) in cases {
            let cli = args(flags).load().unwrap();
            let spec: WorkloadSpec = toml::from_str(keys).unwrap();
            // The lab gives every run its duration, warm-up and seed: the CLI's here.
            let duration = cli.duration_s.unwrap_or(DEFAULT_DURATION_S);
            let lab = spec.load(duration, cli.warmup_s, cli.seed).unwrap();
            assert_eq!(
                cli.config(target).unwrap(),
                lab.config(target).unwrap(),
                "{flags:?} vs {keys:?}"
            );
        }
    }

    /// `--data` and its flags as an experiment's `data`, `data_key`, `max_item_size`.
    #[test]
    fn data_flags_and_workload_keys_give_the_same_config() {
        use kvlab_lab::spec::WorkloadSpec;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("d.jsonl");
        std::fs::write(&file, "{\"key\":\"a b\",\"value\":\"x\"}\n").unwrap();
        let path = file.to_str().unwrap();
        let target: SocketAddr = ([127, 0, 0, 1], 11211).into();
        let flags = [
            "--data",
            path,
            "--data-key",
            "message-id",
            "--max-item-size",
            "64k",
        ];
        let cli = args(&flags).load().unwrap();
        let spec: WorkloadSpec = toml::from_str(&format!(
            "data = {path:?}\ndata_key = \"message-id\"\nmax_item_size = 65536"
        ))
        .unwrap();
        let lab = spec
            .load(DEFAULT_DURATION_S, cli.warmup_s, cli.seed)
            .unwrap();
        let c = cli.config(target).unwrap();
        assert_eq!(c, lab.config(target).unwrap());
        let d = c.workload.data.as_ref().unwrap();
        assert_eq!((d.max_item_size, d.key), (65536, DataKey::MessageId));
        assert_eq!(c.workload.keys, 1);
        assert_eq!(c.workload.data_set.summary().unwrap().mapped_keys, 1);
        assert!(Cli::try_parse_from(["bench", "--data", path, "--keys", "5"]).is_err());
        assert!(Cli::try_parse_from(["bench", "--data-key", "path"]).is_err());
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert!(parse_size("1g").is_err());
        let e = args(&["--data", "/nonexistent/kvlab-data"])
            .load()
            .unwrap_err();
        assert!(format!("{e}").contains("/nonexistent/kvlab-data"), "{e}");
    }

    #[test]
    fn bad_values_fail_alike_as_flags_and_as_workload_keys() {
        use kvlab_lab::spec::WorkloadSpec;
        for (flags, keys, want) in [
            (&["--threads", "0"][..], "threads = 0", "threads = 0"),
            (
                &["--mix", "put=1"][..],
                "mix = \"put=1\"",
                "unknown operation",
            ),
            (
                &["--depth", "0", "--qps", "5"][..],
                "depth = 0\nqps = 5",
                "depth = 0",
            ),
        ] {
            let by_flag = args(flags).load().unwrap_err().to_string();
            let spec: WorkloadSpec = toml::from_str(keys).unwrap();
            let by_key = format!("{:#}", spec.load(1.0, 0.0, 1).unwrap_err());
            assert_eq!(by_flag, by_key);
            assert!(by_flag.contains(want), "{by_flag}");
        }
        let e = toml::from_str::<WorkloadSpec>("arrival = \"bursty\"").unwrap_err();
        assert!(e.to_string().contains("poisson"), "{e}");
    }
}
