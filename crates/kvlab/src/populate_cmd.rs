//! `kvlab populate`: fill a running server (or a data dir) quickly with N keys.

use clap::Args;

/// Flags of `kvlab populate`.
#[derive(Debug, Args)]
pub struct PopulateArgs {}

/// Runs `kvlab populate`.
pub fn run(_args: PopulateArgs) -> anyhow::Result<()> {
    anyhow::bail!("kvlab populate is not built yet")
}
