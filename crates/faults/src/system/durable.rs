//! Durable nodes: the flags that give a node a data directory of its own.

use std::path::Path;

/// Durable nodes: each node keeps its keys under the run's `data/` in a directory of its
/// own (`data/node-127.0.0.1-PORT`), with `--durability sync` (every acknowledged write and
/// delete is on its disk before the reply) and a write-back cache of `cache_items` entries,
/// so most keys live on disk only. A node killed and restarted opens the same directory
/// again; a node started fresh (added, or its address used again) gets a new, empty one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Durable {
    /// The write-back cache's bound, in entries (`--cache-items`).
    pub cache_items: usize,
}

impl Durable {
    /// The cache bound a run uses unless told otherwise: small beside the 200 keys the
    /// clients share, so most reads and writes of old keys go to the disk.
    pub const CACHE_ITEMS: usize = 64;

    /// `kvlab server` flags for a node over `dir`, beside `server_args` (which may set
    /// `--durability` or `--cache-items` themselves: theirs are kept).
    pub fn server_flags(&self, dir: &Path, server_args: &[String]) -> Vec<String> {
        let mut flags = vec!["--data-dir".to_string(), dir.display().to_string()];
        if flag_value(server_args, "--durability").is_none() {
            flags.extend(["--durability".to_string(), "sync".to_string()]);
        }
        if flag_value(server_args, "--cache-items").is_none() {
            flags.extend(["--cache-items".to_string(), self.cache_items.to_string()]);
        }
        flags
    }

    /// Whether durable nodes started with `server_args` run under `--durability sync` (the
    /// harness's choice unless the flags say otherwise): only then is a killed node's disk
    /// expected to hold every acknowledged write.
    pub fn syncs(server_args: &[String]) -> bool {
        flag_value(server_args, "--durability").is_none_or(|d| d == "sync")
    }
}

/// The value the last `FLAG VALUE` or `FLAG=VALUE` in `args` gives, if any.
fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let mut said = None;
    for (i, a) in args.iter().enumerate() {
        if a == flag {
            said = args.get(i + 1).map(String::as_str);
        } else if let Some(v) = a.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            said = Some(v);
        }
    }
    said
}
