//! `kvlab lab`: experiments end to end — start systems, load them, repeat, analyse, report.
//!
//! ```text
//! kvlab lab                          the quick standard experiment (experiments/quick.toml,
//!                                    built in): kvlab's server, and memcached beside it when
//!                                    it is on PATH; prints a summary and the report's path
//! kvlab lab run FILE|NAME [--out D]  an experiment file, or a shipped one by name
//! kvlab lab analyse DIR              re-analyse DIR/raw/*.json and rewrite DIR/report/
//! kvlab lab list                     the shipped experiments
//! kvlab lab show NAME                print a shipped experiment file
//! ```
//!
//! Results go to `results/<name>-<YYYYMMDD-HHMMSS>/` (see [`runner`] for the layout).
//!
//! `kvlab lab run` (and `kvlab lab`) take overrides of the file's values for a quick run of a
//! big file, applied to every part alike (the top level and each `[[part]]`):
//!
//! ```text
//! --repetitions N          every `repetitions`
//! --duration S             every `duration` (a trace still lasts its qps_list)
//! --warmup S               every `warmup`
//! --set KEY=VALUE          a workload key, in every part's workload (repeatable; a later one
//!                          wins). VALUE is read as TOML (4096, 0.5, true, [1, 2], "text") or
//!                          else taken as text (mix=get=9,set=1, protocol=http). A key that a
//!                          part varies as a factor is an error.
//! ```
//!
//! They are checked with the file's rules and messages, printed at the start, stored in
//! `meta.json` (`overrides`, so `kvlab lab analyse DIR` resolves the experiment as it was
//! run) and shown in the report's metadata; the report's part descriptions give the resolved
//! values.
//!
//! # Experiment files (TOML)
//!
//! Every key is optional unless marked *required*; the default follows `=`.
//!
//! ```toml
//! name = "<file stem>"        # names the results directory
//! description = ""
//! repetitions = 3             # runs per point and system (95 % CIs need >= 2)
//! duration = 10.0             # measured seconds per run (a trace lasts its qps_list)
//! warmup = 1.0                # seconds run and discarded before each measurement
//! confidence = 0.95           # level of every confidence interval
//! tolerance = 0.10            # model checks: |predicted - measured| / measured that still
//!                             # agrees when the prediction is outside the measured CI
//! slo_p95_us = 1000.0         # rate scans: the sustained rate is the largest offered rate
//!                             # with p95 below this (µs) and >= 99 % of it achieved, every
//!                             # lower rate of the scan passing too
//! seed = 1                    # repetition i uses seed + i
//!
//! [[system]]                  # one or more; *required*
//! name = "kvlab"              # *required*, unique
//! kind = "kvlab"              # kvlab | memcached | external; default from the name
//!                             # (kvlab and memcached), required otherwise
//! args = []                   # extra flags; "{factor}" takes the point's level, e.g.
//!                             # ["-t", "{server_threads}", "-m", "64"]; "{data_dir}" is a
//!                             # fresh empty directory for every start of the system,
//!                             # removed when it stops (a durable server's --data-dir,
//!                             # under the results' logs/). The lab adds the
//!                             # address: kvlab `server -l 127.0.0.1 -p PORT` (and
//!                             # `--http-port PORT2` when a point of the part speaks HTTP),
//!                             # memcached `-U 0 -l 127.0.0.1 -p PORT` (and `-u root` as root)
//! binary = <this kvlab> | "memcached"   # program, looked up on PATH
//! address = ""                # external: host:port (*required* for external)
//! pid = <none>                # external: a pid whose CPU is read from /proc/<pid>/stat
//! optional = false            # a missing binary skips the system instead of failing; so
//!                             # does a point it cannot serve (HTTP on memcached), with a note
//! start_timeout = 10.0        # seconds to wait for an answer to `version` (and to `GET /`
//!                             # on the HTTP port)
//!
//! [workload]                  # everything `kvlab bench` takes
//! clients = <none>            # closed loop: total connections (= threads x connections,
//!                             # threads lowered to a divisor); overrides `connections`
//! threads = 1                 # generator threads
//! connections = 4             # connections per generator thread
//! depth = 1 | 1024            # requests in flight per connection (closed | open loop)
//! think_us = 0                # closed loop think time Z, µs
//! qps = <none>                # open loop: total rate, req/s (none = closed loop)
//! arrival = "poisson"         # open loop: poisson | fixed
//! qps_list = <none>           # trace: rates (req/s), each for qps_interval seconds
//! qps_interval = 1.0
//! preset = <none>             # "etc": Facebook ETC key/value sizes, get:set 30:1
//! keys = 100000
//! key_prefix = "key:"
//! key_size = 16               # bytes, or "A-B", "normal:M,SD", "gev:L,S,K", …
//! key_dist = "uniform"        # uniform | sequential | gaussian[:M,SD] | zipf:S | hot:F:P
//! value_size = 100            # bytes, or a distribution as key_size
//! mix = "get=9,set=1"         # weights of get, set, delete
//! multiget = 1
//! verify = false
//! load = <gets in mix>        # fill the key space once per fresh server (and workload)
//! interval = 1.0              # time-series interval, s
//! timeout_ms = 5000
//! protocol = "memcached"      # memcached | http: HTTP/1.1 to a kvlab server's REST interface
//!                             # (keep-alive, pipelined); only kind = "kvlab" serves it, so a
//!                             # memcached or external system in such a part is an error
//!                             # unless optional. A factor too: protocol = ["memcached", "http"]
//!                             # compares both on one server
//!
//! [factors]                   # factor = [levels]; a workload key, or a {name} in args
//! clients = [1, 2, 4, 8]
//! qps = { from = 5000, to = 125000, step = 5000 }   # or { from = 1, to = 64, times = 2 }
//! design = "full"             # full (every combination) | 2k (two levels each) | points
//! points = []                 # design "points": [{ clients = 1, value_size = 100 }, …]
//!
//! [[part]]                    # several studies in one file: each part has its own
//! name = "part<i>"            # name, description, systems = [names], repetitions,
//!                             # duration, warmup, [part.workload] (over [workload]),
//!                             # [part.factors], design, points
//! ```
//!
//! What the analysis does with a part depends on its factors: `clients` in closed loop →
//! throughput/response time vs clients, knee, interactive law, MVA and its bounds; `qps` →
//! rate scan with p95 and server CPU, the sustained rate under `slo_p95_us`, M/M/1 and
//! M/M/m; `design = "2k"` → effects and allocation of variation (throughput); `qps_list` →
//! p95, rate and CPU over time. Every part gets a table of all points, percentiles vs its
//! first factor and latency histograms.

mod analyse;
mod runner;
mod spec;
mod system;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};

/// The experiments shipped in `experiments/`, built in.
pub(crate) const SHIPPED: &[(&str, &str)] = &[
    ("quick", include_str!("../../../../experiments/quick.toml")),
    (
        "baseline-clients",
        include_str!("../../../../experiments/baseline-clients.toml"),
    ),
    (
        "rate-scan",
        include_str!("../../../../experiments/rate-scan.toml"),
    ),
    (
        "factorial-2k",
        include_str!("../../../../experiments/factorial-2k.toml"),
    ),
    (
        "protocols",
        include_str!("../../../../experiments/protocols.toml"),
    ),
];

/// Flags of `kvlab lab`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct LabArgs {
    #[command(subcommand)]
    command: Option<LabCommand>,
    /// Results directory (default results/<experiment>-<date>).
    #[arg(long)]
    out: Option<PathBuf>,
    #[command(flatten)]
    overrides: spec::Overrides,
}

#[derive(Debug, Subcommand)]
enum LabCommand {
    /// Run an experiment file (or a shipped experiment by name), analyse it, write the report.
    Run {
        /// The experiment file, or the name of a shipped one (see `kvlab lab list`).
        file: String,
        /// Results directory (default results/<experiment>-<date>).
        #[arg(long)]
        out: Option<PathBuf>,
        #[command(flatten)]
        overrides: spec::Overrides,
    },
    /// Re-analyse a results directory's raw data and rewrite its report.
    #[command(alias = "analyze")]
    Analyse {
        /// The results directory (with meta.json and raw/).
        dir: PathBuf,
    },
    /// List the shipped experiments.
    List,
    /// Print a shipped experiment file.
    Show {
        /// Its name.
        name: String,
    },
}

/// Runs `kvlab lab`.
pub fn run(args: LabArgs) -> anyhow::Result<()> {
    match args.command {
        None => run_text(
            "(built in) experiments/quick.toml",
            SHIPPED[0].1,
            "quick",
            args.out,
            &args.overrides,
        ),
        Some(LabCommand::Run {
            file,
            out,
            overrides,
        }) => {
            let path = Path::new(&file);
            if path.exists() {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                let stem = path
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "experiment".into());
                run_text(&file, &text, &stem, out, &overrides)
            } else if let Some((name, text)) = SHIPPED.iter().find(|(n, _)| *n == file) {
                run_text(
                    &format!("(built in) experiments/{name}.toml"),
                    text,
                    name,
                    out,
                    &overrides,
                )
            } else {
                bail!(
                    "{file}: no such file, and no shipped experiment of that name (shipped: {})",
                    SHIPPED
                        .iter()
                        .map(|(n, _)| *n)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        }
        Some(LabCommand::Analyse { dir }) => {
            let (meta, raws) = runner::load(&dir)?;
            let exp = spec::Experiment::parse(&meta.experiment_text, "experiment", &meta.overrides)
                .context("the experiment stored in meta.json")?;
            let a = analyse::analyse(&exp, &meta, &raws)?;
            let index = analyse::write(&dir, &a)?;
            print!("{}", a.summary);
            println!("report: {}", index.display());
            Ok(())
        }
        Some(LabCommand::List) => {
            for (name, text) in SHIPPED {
                let desc = spec::Experiment::parse(text, name, &spec::Overrides::default())
                    .ok()
                    .and_then(|e| e.description)
                    .unwrap_or_default();
                println!("{name:<18} {}", desc.lines().next().unwrap_or(""));
            }
            println!("\nrun one with `kvlab lab run NAME`; print it with `kvlab lab show NAME`");
            Ok(())
        }
        Some(LabCommand::Show { name }) => match SHIPPED.iter().find(|(n, _)| *n == name) {
            Some((_, text)) => {
                print!("{text}");
                Ok(())
            }
            None => bail!("no shipped experiment {name:?} (see `kvlab lab list`)"),
        },
    }
}

fn run_text(
    file: &str,
    text: &str,
    stem: &str,
    out: Option<PathBuf>,
    overrides: &spec::Overrides,
) -> anyhow::Result<()> {
    let exp = spec::Experiment::parse(text, stem, overrides).with_context(|| {
        if overrides.is_empty() {
            format!("experiment {file}")
        } else {
            format!("experiment {file} with {}", overrides.flags())
        }
    })?;
    let now = std::time::SystemTime::now();
    let out = match out {
        Some(o) => o,
        None => {
            let base =
                PathBuf::from("results").join(format!("{}-{}", exp.name, runner::stamp(now)));
            let mut dir = base.clone();
            let mut i = 2;
            while dir.exists() {
                dir = PathBuf::from(format!("{}-{i}", base.display()));
                i += 1;
            }
            dir
        }
    };
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    if !overrides.is_empty() {
        eprintln!("overrides: {}", overrides.flags());
    }
    let mut meta = runner::Meta::collect(file, text, overrides);
    let raws = runner::run_experiment(&exp, &mut meta, &out)?;
    let a = analyse::analyse(&exp, &meta, &raws)?;
    let index = analyse::write(&out, &a)?;
    println!();
    print!("{}", a.summary);
    println!("raw results: {}", out.join("raw").display());
    println!("report: {}", index.display());
    Ok(())
}
