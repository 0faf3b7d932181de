//! The `kvlab` binary: one command line over every kvlab crate.

mod bench_cmd;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "kvlab", version, about = "Run and measure memcached-style caches")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Load generator: open and closed loop, honest latencies.
    Bench(bench_cmd::BenchArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Bench(args) => bench_cmd::run(args),
    }
}
