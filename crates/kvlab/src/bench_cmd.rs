//! `kvlab bench`: the load generator's command line.
//!
//! Parses flags into [`kvlab_bench::Config`]s (one per target), runs them A B A B … for
//! `--repeat` rounds, prints a summary per run and the per-target comparison, and writes
//! `--json` / `--csv`. `kvlab bench agent` serves masters for distributed load.
//! `--find-sustained` searches each target for the largest open-loop rate whose latency stays
//! under `--mean-below` or `--p95-below` (see [`kvlab_bench::sustained`]).

use std::io::IsTerminal;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use kvlab_bench::dist::{KeyDist, SizeDist};
use kvlab_bench::report;
use kvlab_bench::schedule::{Arrival, RatePlan};
use kvlab_bench::sustained::{self, Bound, SearchSpec};
use kvlab_bench::workload::{Mix, Workload};
use kvlab_bench::{Config, Protocol};

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

#[derive(Debug, Args)]
struct RunArgs {
    /// Server address; repeat to compare several (run A B A B …).
    #[arg(long = "target", short = 's', default_value = "127.0.0.1:11211")]
    targets: Vec<String>,
    /// Rounds over all targets.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Protocol: `memcached` (text protocol) or `http` (kvlab's REST interface, keep-alive,
    /// pipelined; the target is the server's --http-port).
    #[arg(long, value_enum, default_value = "memcached")]
    protocol: ProtocolArg,

    // --- load model ---
    /// Generator threads.
    #[arg(long, short = 'T', default_value_t = 1)]
    threads: usize,
    /// Connections per thread.
    #[arg(long, short = 'c', default_value_t = 4)]
    connections: usize,
    /// Requests in flight per connection (closed loop: pipeline depth, default 1; open loop:
    /// cap before planned requests wait, default 1024).
    #[arg(long, short = 'd')]
    depth: Option<usize>,
    /// Closed loop: think time between a reply and the next request, µs.
    #[arg(long, default_value_t = 0)]
    think_us: u64,
    /// Run length in seconds (per step with --scan).
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Stop after this many requests in total instead (a --duration given too still caps it).
    #[arg(long)]
    requests: Option<u64>,
    /// Open loop: total target rate, requests/s over all connections.
    #[arg(long, conflicts_with_all = ["scan", "qps_interval", "qps_list", "qps_file"])]
    qps: Option<f64>,
    /// Open-loop inter-arrival distribution.
    #[arg(long, value_enum, default_value = "poisson")]
    arrival: ArrivalArg,
    /// Open-loop rate sweep MIN:MAX:STEP (requests/s), --duration per step.
    #[arg(long, conflicts_with_all = ["qps_interval", "qps_list", "qps_file"])]
    scan: Option<String>,
    /// Changing rate: a new total rate every S seconds (with --qps-min/--qps-max/--qps-seed,
    /// --qps-list or --qps-file).
    #[arg(long)]
    qps_interval: Option<f64>,
    /// Random trace: lowest rate, requests/s. With --find-sustained: the first rate tried
    /// (default 1000).
    #[arg(long)]
    qps_min: Option<f64>,
    /// Random trace: highest rate, requests/s. With --find-sustained: the highest rate tried
    /// (default 10 000 000).
    #[arg(long)]
    qps_max: Option<f64>,
    /// Random trace: seed (the same seed gives the same trace).
    #[arg(long, default_value_t = 1)]
    qps_seed: u64,
    /// Explicit rates, comma-separated (requests/s), each for --qps-interval seconds.
    #[arg(long)]
    qps_list: Option<String>,
    /// File of rates: lines `RATE` (lasting --qps-interval) or `SECONDS RATE`.
    #[arg(long)]
    qps_file: Option<PathBuf>,

    // --- workload ---
    /// Preset: `etc` = Facebook ETC key/value sizes and a 30:1 get:set mix (mutilate's).
    #[arg(long)]
    workload: Option<String>,
    /// Number of distinct keys.
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// Key prefix.
    #[arg(long, default_value = "key:")]
    key_prefix: String,
    /// Key size in bytes: N, A-B, or a distribution (gev:LOC,SCALE,SHAPE, normal:M,SD, …).
    #[arg(long)]
    key_size: Option<String>,
    /// Key choice: uniform, sequential, gaussian[:MEAN,SD], zipf:S, hot:F:P.
    #[arg(long, default_value = "uniform")]
    key_dist: String,
    /// Hot set F:P: a fraction F of keys gets a fraction P of requests (= --key-dist hot:F:P).
    #[arg(long)]
    hot: Option<String>,
    /// Value size in bytes: N, A-B, uniform:A,B, normal:M,SD, exp:M, gpareto:L,S,K, gev:L,S,K.
    #[arg(long)]
    value_size: Option<String>,
    /// Operation mix, e.g. get=9,set=1 or get=21,delete=8,set=1.
    #[arg(long)]
    mix: Option<String>,
    /// Keys per get request (multi-get).
    #[arg(long, default_value_t = 1)]
    multiget: u32,
    /// Check every hit: values derive from key and version; a wrong value is an error.
    #[arg(long)]
    verify: bool,
    /// Fill every key before the run (the default when the mix has gets).
    #[arg(long, conflicts_with = "noload")]
    load: bool,
    /// Do not fill keys before the run.
    #[arg(long)]
    noload: bool,
    /// Warm-up seconds, run and discarded (default 0; with --find-sustained 0.5 per step).
    #[arg(long)]
    warmup: Option<f64>,

    // --- sustained-throughput search ---
    /// Search the largest open-loop rate whose latency (from the planned send) stays under
    /// --mean-below or --p95-below while ≥ 99 % of planned requests are answered; --duration
    /// is then per step (default 2 s).
    #[arg(long, conflicts_with_all = ["qps", "scan", "qps_interval", "qps_list", "qps_file", "requests"])]
    find_sustained: bool,
    /// Search bound on the mean latency, e.g. 1ms, 500us.
    #[arg(long, requires = "find_sustained", conflicts_with = "p95_below", value_parser = parse_duration_us)]
    mean_below: Option<f64>,
    /// Search bound on the 95th percentile latency, e.g. 2ms.
    #[arg(long, requires = "find_sustained", value_parser = parse_duration_us)]
    p95_below: Option<f64>,
    /// Search precision: stop when the bracket (bad − good) / good is at most this.
    #[arg(long, default_value_t = 0.05, requires = "find_sustained")]
    precision: f64,
    /// Search time budget, seconds (the search stops with what it has).
    #[arg(long, default_value_t = 300.0, requires = "find_sustained")]
    max_time: f64,
    /// Search: fill the key space again before every step (with the load phase on), so a mix
    /// with deletes starts each step from a full cache.
    #[arg(long, requires = "find_sustained")]
    reload_each_step: bool,

    // --- measurement and output ---
    /// Time-series interval, seconds.
    #[arg(long, default_value_t = 1.0)]
    interval: f64,
    /// A request unanswered this long is a timeout, milliseconds.
    #[arg(long, default_value_t = 5000)]
    timeout_ms: u64,
    /// Seed of all random choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write every run and interval as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the intervals as CSV.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// An agent (`kvlab bench agent`) to generate load too; repeat for several.
    #[arg(long = "agent")]
    agents: Vec<String>,
    /// No progress line.
    #[arg(long, short = 'q')]
    quiet: bool,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum ProtocolArg {
    Memcached,
    Http,
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

fn parse_scan(s: &str) -> anyhow::Result<(f64, f64, f64)> {
    let v: Vec<f64> = s
        .split(':')
        .map(|x| x.trim().parse::<f64>())
        .collect::<Result<_, _>>()
        .with_context(|| format!("--scan {s:?}: want MIN:MAX:STEP"))?;
    match v.as_slice() {
        &[a, b, c] => Ok((a, b, c)),
        _ => bail!("--scan {s:?}: want MIN:MAX:STEP"),
    }
}

impl RunArgs {
    fn plan(&self) -> anyhow::Result<(Option<Arrival>, RatePlan)> {
        let arrival = match self.arrival {
            ArrivalArg::Poisson => Arrival::Poisson,
            ArrivalArg::Fixed => Arrival::Fixed,
        };
        // With --requests and no explicit rate plan, the run is bounded by the count; the
        // plan then only needs to outlast it.
        let duration = if self.requests.is_some() && !duration_given() {
            1e6
        } else {
            self.duration
        };
        if let Some(q) = self.qps {
            return Ok((Some(arrival), RatePlan::fixed(q, duration)?));
        }
        if let Some(s) = &self.scan {
            let (a, b, c) = parse_scan(s)?;
            return Ok((Some(arrival), RatePlan::scan(a, b, c, self.duration)?));
        }
        if let Some(path) = &self.qps_file {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            return Ok((
                Some(arrival),
                RatePlan::parse_file(&text, self.qps_interval.unwrap_or(1.0))?,
            ));
        }
        if let Some(list) = &self.qps_list {
            let rates: Vec<f64> = list
                .split(',')
                .map(|x| x.trim().parse::<f64>())
                .collect::<Result<_, _>>()
                .with_context(|| format!("--qps-list {list:?}"))?;
            return Ok((
                Some(arrival),
                RatePlan::from_rates(&rates, self.qps_interval.unwrap_or(1.0))?,
            ));
        }
        if let Some(iv) = self.qps_interval {
            let (Some(lo), Some(hi)) = (self.qps_min, self.qps_max) else {
                // (clap cannot express "both or neither" next to --find-sustained's use.)
                bail!("--qps-interval needs --qps-min and --qps-max, --qps-list or --qps-file");
            };
            return Ok((
                Some(arrival),
                RatePlan::random(iv, lo, hi, self.qps_seed, self.duration)?,
            ));
        }
        if (self.qps_min.is_some() || self.qps_max.is_some()) && !self.find_sustained {
            bail!("--qps-min/--qps-max need --qps-interval (or --find-sustained)");
        }
        Ok((None, RatePlan::fixed(0.0, duration)?))
    }

    fn workload(&self) -> anyhow::Result<Workload> {
        let mut wl = Workload::preset(self.workload.as_deref(), self.keys, &self.key_prefix)?;
        if let Some(s) = &self.key_size {
            wl.key_size = SizeDist::parse(s)?;
        }
        if let Some(s) = &self.value_size {
            wl.value_size = SizeDist::parse(s)?;
        }
        if let Some(s) = &self.mix {
            wl.mix = Mix::parse(s)?;
        }
        wl.key_dist = match &self.hot {
            Some(h) => {
                let (f, p) = h.split_once(':').context("--hot wants F:P, e.g. 0.1:0.9")?;
                KeyDist::hot(f.parse().context("--hot F")?, p.parse().context("--hot P")?)?
            }
            None => KeyDist::parse(&self.key_dist)?,
        };
        wl.multiget = self.multiget;
        wl.verify = self.verify;
        wl.validate()?;
        Ok(wl)
    }

    fn configs(&self) -> anyhow::Result<Vec<Config>> {
        let (open, plan) = self.plan()?;
        let workload = self.workload()?;
        let load = !self.noload && (self.load || workload.mix.get > 0);
        let depth = self.depth.unwrap_or(if open.is_some() { 1024 } else { 1 });
        let mut out = Vec::new();
        for t in &self.targets {
            let cfg = Config {
                target: resolve(t)?,
                protocol: match self.protocol {
                    ProtocolArg::Memcached => Protocol::Memcached,
                    ProtocolArg::Http => Protocol::Http,
                },
                threads: self.threads,
                connections: self.connections,
                depth,
                think_us: self.think_us,
                open,
                plan: plan.clone(),
                requests: self.requests,
                warmup_s: self.warmup.unwrap_or(0.0),
                interval_s: self.interval,
                timeout_ms: self.timeout_ms,
                workload: workload.clone(),
                seed: self.seed,
                load,
            };
            cfg.validate()?;
            out.push(cfg);
        }
        Ok(out)
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
        spec.precision = self.precision;
        spec.reload_each_step = self.reload_each_step;
        spec.max_time_s = self.max_time;
        if duration_given() {
            spec.step_s = self.duration;
        }
        if let Some(w) = self.warmup {
            spec.warmup_s = w;
        }
        spec.arrival = match self.arrival {
            ArrivalArg::Poisson => Arrival::Poisson,
            ArrivalArg::Fixed => Arrival::Fixed,
        };
        spec.validate()?;
        Ok(spec)
    }
}

/// `--find-sustained`: one search per target (and round).
fn run_search(r: &RunArgs, agents: &[SocketAddr]) -> anyhow::Result<()> {
    let spec = r.search_spec()?;
    let mut configs = r.configs()?;
    if r.depth.is_none() {
        // Open loop's default cap on requests in flight per connection.
        for c in &mut configs {
            c.depth = 1024;
        }
    }
    let mut results = Vec::new();
    for round in 0..r.repeat {
        for cfg in &configs {
            let mut cfg = cfg.clone();
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
    Ok(())
}

/// True when `--duration` was on the command line (clap's default is otherwise used).
fn duration_given() -> bool {
    std::env::args().any(|a| a == "--duration" || a.starts_with("--duration="))
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
    if r.find_sustained {
        return run_search(&r, &agents);
    }
    let configs = r.configs()?;
    let show_progress = !r.quiet && std::io::stderr().is_terminal();
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
    Ok(())
}
