//! The `kvlab` binary: one command line over every kvlab crate.

mod bench_cmd;
mod lab_cmd;
mod populate_cmd;
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
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Server(args) => server_cmd::run(args),
        Command::Bench(args) => bench_cmd::run(*args),
        Command::Populate(args) => populate_cmd::run(args),
        Command::Lab(args) => lab_cmd::run(args),
    }
}
