//! `kvlab bench`: the load generator's command line.

use clap::Args;

/// Flags of `kvlab bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {}

/// Runs `kvlab bench`.
pub fn run(_args: BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("kvlab bench is not built yet")
}
