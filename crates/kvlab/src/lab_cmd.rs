//! `kvlab lab`: the command line of the experiment runner. Parses flags, calls
//! [`kvlab_lab`] and prints what it wrote; the experiment file's format and the results'
//! layout are documented there. `kvlab lab ring-clients` runs a storage-ring experiment's
//! clients on a host the lab placed them on.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use kvlab_lab::spec::HostTable;
use kvlab_lab::{Lab, Overrides, Source, SHIPPED};

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
    overrides: OverrideArgs,
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
        overrides: OverrideArgs,
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
    /// Run a storage-ring experiment's clients here, the original's way (what the lab
    /// starts on each client host): N threads, each sending --ops requests of random
    /// messages one at a time, routed by the client ring; prints (or writes) the result as
    /// JSON: each client's ops/s, errors, the wall and CPU time.
    RingClients(RingClientsArgs),
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("nodes").args(["kvlab", "memcached"])))]
struct RingClientsArgs {
    /// A kvlab cluster's nodes (HOST:PORT,…): the ring fetched from them, redirects followed.
    #[arg(long, value_name = "NODES", value_delimiter = ',')]
    kvlab: Vec<SocketAddr>,
    /// Plain memcached servers (HOST:PORT,…) behind a fixed client ring of them (the same
    /// consistent hashing as a cluster's ring).
    #[arg(long, value_name = "NODES", value_delimiter = ',')]
    memcached: Vec<SocketAddr>,
    /// The messages: a maildir, JSON lines or CSV (keys: the paths in a maildir).
    #[arg(long, value_name = "PATH")]
    data: PathBuf,
    /// Write a synthetic maildir of --messages e-mails at --data first when it is absent (the
    /// same count writes the same bytes as the lab's).
    #[arg(long)]
    synthetic: bool,
    /// Messages used: the data set's first.
    #[arg(long, default_value_t = 10_000)]
    messages: usize,
    /// Client threads.
    #[arg(long, default_value_t = 1)]
    clients: usize,
    /// The first thread's index among all the run's clients (its choice of messages).
    #[arg(long, default_value_t = 0)]
    first: usize,
    /// Requests each client sends, one at a time.
    #[arg(long, default_value_t = 1000)]
    ops: usize,
    /// get (verified) or put.
    #[arg(long, default_value = "get", value_parser = ["get", "put"])]
    op: String,
    /// The run's seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Start at this instant (ns since the Unix epoch, this machine's clock) once connected.
    #[arg(long, value_name = "NS")]
    start_at_ns: Option<u64>,
    /// Write the result to FILE (default: print it).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Only make and load the messages; print their fingerprint (count and hash).
    #[arg(long)]
    prepare: bool,
}

fn ring_clients(a: RingClientsArgs) -> anyhow::Result<()> {
    use kvlab_lab::ring::{ClientsJob, Route};
    if a.prepare {
        println!(
            "{}",
            kvlab_lab::ring::digest(&a.data, a.messages, a.synthetic)?
        );
        return Ok(());
    }
    let route = match (a.kvlab.is_empty(), a.memcached.is_empty()) {
        (false, true) => Route::Cluster(a.kvlab),
        (true, false) => Route::Fixed(a.memcached),
        _ => bail!("give the nodes: --kvlab NODES or --memcached NODES"),
    };
    if a.clients == 0 || a.ops == 0 {
        bail!("--clients and --ops must be > 0");
    }
    let job = ClientsJob {
        route,
        data: a.data,
        synthetic: a.synthetic,
        messages: a.messages,
        clients: a.clients,
        first: a.first,
        ops: a.ops,
        put: a.op == "put",
        seed: a.seed,
        start_at_ns: a.start_at_ns,
    };
    let out = serde_json::to_string(&kvlab_lab::ring::run_job(&job)?)?;
    match a.json {
        Some(f) => std::fs::write(&f, out).with_context(|| format!("writing {}", f.display())),
        None => {
            println!("{out}");
            Ok(())
        }
    }
}

/// Command-line overrides of an experiment file's values, for every part (mapped onto
/// [`kvlab_lab::Overrides`]).
#[derive(Debug, Clone, Default, Args)]
struct OverrideArgs {
    /// Runs per point and system (overrides every `repetitions` of the file).
    #[arg(long, value_name = "N")]
    repetitions: Option<usize>,
    /// Measured seconds per run (overrides every `duration`; a trace still lasts its
    /// qps_list).
    #[arg(long, value_name = "S")]
    duration: Option<f64>,
    /// Warm-up seconds per run (overrides every `warmup`).
    #[arg(long, value_name = "S")]
    warmup: Option<f64>,
    /// A workload key for every part, as in [workload]; repeatable, a later one wins. VALUE is
    /// read as TOML (4096, 0.5, true, [1, 2], "text") or else taken as text (get=9,set=1).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// A host table ([[host]]s and an optional [ssh]) in place of the experiment's: the same
    /// experiment on other machines (see docs/lab.md, Hosts).
    #[arg(long, value_name = "FILE")]
    hosts: Option<String>,
}

impl TryFrom<OverrideArgs> for Overrides {
    type Error = anyhow::Error;

    fn try_from(a: OverrideArgs) -> anyhow::Result<Overrides> {
        Ok(Overrides {
            repetitions: a.repetitions,
            duration: a.duration,
            warmup: a.warmup,
            set: a.set,
            hosts: a.hosts.as_deref().map(HostTable::read).transpose()?,
        })
    }
}

/// Runs `kvlab lab`.
pub fn run(args: LabArgs) -> anyhow::Result<()> {
    match args.command {
        None => run_source(&Source::quick(), args.out, args.overrides.try_into()?),
        Some(LabCommand::Run {
            file,
            out,
            overrides,
        }) => run_source(&Source::open(&file)?, out, overrides.try_into()?),
        Some(LabCommand::Analyse { dir }) => {
            let done = kvlab_lab::analyse_dir(&dir)?;
            print!("{}", done.summary);
            println!("report: {}", done.report.display());
            verdict(&done)
        }
        Some(LabCommand::List) => {
            for (name, _) in SHIPPED {
                println!("{name:<18} {}", kvlab_lab::shipped_summary(name));
            }
            println!("\nrun one with `kvlab lab run NAME`; print it with `kvlab lab show NAME`");
            Ok(())
        }
        Some(LabCommand::Show { name }) => match kvlab_lab::shipped(&name) {
            Some(text) => {
                print!("{text}");
                Ok(())
            }
            None => bail!("no shipped experiment {name:?} (see `kvlab lab list`)"),
        },
        Some(LabCommand::RingClients(a)) => ring_clients(a),
    }
}

fn run_source(source: &Source, out: Option<PathBuf>, overrides: Overrides) -> anyhow::Result<()> {
    if !overrides.is_empty() {
        eprintln!("overrides: {}", overrides.flags());
    }
    let done = Lab::default().run(source, &overrides, out)?;
    println!();
    print!("{}", done.summary);
    if done.raw_dir().is_dir() {
        println!("raw results: {}", done.raw_dir().display());
    } else {
        println!("results: {}", done.dir.display());
    }
    println!("report: {}", done.report.display());
    verdict(&done)
}

/// A checked experiment that did not pass (anomalies, a run gone wrong, keys it could not
/// verify) ends the command with its exit status, after its report is written.
fn verdict(done: &kvlab_lab::Finished) -> anyhow::Result<()> {
    if done.exit_code != 0 {
        eprintln!(
            "kvlab lab: the check did not pass (exit status {}; see the summary above)",
            done.exit_code
        );
        std::process::exit(done.exit_code);
    }
    Ok(())
}
