//! The `kvlab` binary: one command line over every kvlab crate. Each subcommand is a thin
//! module that maps flags onto a library crate's types and prints what comes back; the work
//! lives in the libraries, so it can be used and tested without this binary.
//!
//! ```text
//! kvlab server    server_cmd    ──► kvlab_server (Session, I/O drivers, engine, REST)
//!                                    └─► kvlab_store (items, eviction, TTL, durable layer)
//!                                    └─► kvlab_protocol (parse/compose, both directions)
//! kvlab bench     bench_cmd     ──► kvlab_bench (load description, open/closed loop, agents)
//!                                    └─► kvlab_client (pipelined connections, HTTP side)
//!                                    └─► kvlab_measure (the rows and histograms it writes)
//! kvlab proxy     proxy_cmd     ──► kvlab_proxy (routing, workers, stage times)
//!                                    └─► kvlab_net (epoll driver), kvlab_protocol
//! kvlab cluster   cluster_cmd   ──► kvlab_cluster (topology, coordinator) over nodes that
//!                                    are `kvlab server --cluster` (kvlab_cluster::node)
//! kvlab populate  populate_cmd  ──► kvlab_bench::populate (or a data dir through the store)
//! kvlab control   control_cmd   ──► kvlab_control (policies, cpuset/affinity, freezer/signals,
//!                                    job queue, JSON-lines log)
//! kvlab faults    faults_cmd    ──► kvlab_faults (recording clients, seeded nemesis, checker)
//!                                    └─► the kvlab binary itself: nodes, proxy, coordinators
//! kvlab lab       lab_cmd       ──► kvlab_lab (experiment spec, systems, runner, analysis)
//!                                    ├─► kvlab_process (start on a free port, wait)
//!                                    ├─► kvlab_bench (the load of every run)
//!                                    └─► kvlab_analysis (statistics, models) ─► kvlab_report
//! ```
//!
//! Errors are `anyhow` here (the library crates return `thiserror` enums, or for the lab
//! still `anyhow`), shown with their context and a non-zero exit.

mod bench_cmd;
mod cluster_cmd;
mod control_cmd;
mod faults_cmd;
mod lab_cmd;
mod populate_cmd;
mod proxy_cmd;
mod server_cmd;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "kvlab",
    version,
    about = "Run and measure memcached-style caches"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// memcached-compatible cache server (takes memcached's flags).
    Server(server_cmd::ServerArgs),
    /// Load generator: open and closed loop, honest latencies.
    Bench(Box<bench_cmd::BenchArgs>),
    /// Experiments end to end: start systems, load them, repeat, analyse, write a report.
    Lab(lab_cmd::LabArgs),
    /// Fill a running server (or a data dir) with N keys, fast.
    Populate(populate_cmd::PopulateArgs),
    /// memcached proxy in front of several servers: sharding, replication, split multi-gets.
    Proxy(proxy_cmd::ProxyArgs),
    /// Keep a server inside its latency SLO while batch jobs use the spare cores.
    Control(Box<control_cmd::ControlArgs>),
    /// Elastic cluster: start nodes, add or remove one while it serves, status.
    Cluster(cluster_cmd::ClusterArgs),
    /// Fault injection: seeded kills, pauses, adds and removes under recorded load; checked.
    Faults(faults_cmd::FaultsArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Server(args) => {
            // Before any thread allocates (see the function's doc).
            kvlab_server::limit_malloc_arenas();
            server_cmd::run(args)
        }
        Command::Bench(args) => bench_cmd::run(*args),
        Command::Populate(args) => populate_cmd::run(args),
        Command::Lab(args) => lab_cmd::run(args),
        Command::Proxy(args) => proxy_cmd::run(args),
        Command::Control(args) => control_cmd::run(*args),
        Command::Cluster(args) => cluster_cmd::run(args),
        Command::Faults(args) => faults_cmd::run(args),
    }
}
