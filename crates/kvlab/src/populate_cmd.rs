//! `kvlab populate`: fill a running server quickly with N keys, then check a sample.
//!
//! The keys and values are exactly those of `kvlab bench` with the same `--keys`,
//! `--key-prefix`, `--key-size` and `--value-size` (or `--workload etc`): a following
//! `kvlab bench --noload` hits, and `--verify` accepts the values. See
//! [`kvlab_bench::populate`].

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use kvlab_bench::load::{Load, Options, SizeSpec};
use kvlab_bench::populate;
use kvlab_bench::workload::Workload;

/// Flags of `kvlab populate`. The load flags map onto [`kvlab_bench::load::Options`] one to
/// one; absent ones take [`populate::defaults`], then the [`kvlab_bench::load::Load`] defaults.
#[derive(Debug, Args)]
pub struct PopulateArgs {
    /// Server address (memcached protocol).
    #[arg(long, short = 's', default_value = "127.0.0.1:11211")]
    target: String,
    /// Number of keys: key indices 0..N, as `kvlab bench --keys N` names them.
    #[arg(long)]
    keys: u64,
    #[arg(long, help = dflt("Value size in bytes: N, A-B, or a distribution (as `kvlab bench \
        --value-size`)", Workload::default().value_size))]
    value_size: Option<String>,
    #[arg(long, help = dflt("Key prefix", format!("{:?}", Workload::default().key_prefix)))]
    key_prefix: Option<String>,
    #[arg(long, help = dflt("Key size in bytes (as `kvlab bench --key-size`)",
        Workload::default().key_size))]
    key_size: Option<String>,
    /// Preset: `etc` = the Facebook ETC key and value sizes (as `kvlab bench --workload etc`;
    /// an explicit --key-size or --value-size wins over it).
    #[arg(long)]
    workload: Option<String>,
    #[arg(long, short = 'c', help = dflt("Connections per thread", fill_default().connections))]
    connections: Option<usize>,
    #[arg(long, short = 'T', help = dflt("Threads", fill_default().threads))]
    threads: Option<usize>,
    #[arg(long, short = 'd', help = dflt("Sets in flight per connection",
        fill_default().depth()))]
    depth: Option<usize>,
    /// Keys read back and verified afterwards (spread over the key space; 0 = none).
    #[arg(long, default_value_t = 1000)]
    verify_sample: u64,
    #[arg(long, help = dflt("Expiry time of the items, seconds (0 = never)",
        Workload::default().exptime))]
    exptime: Option<u32>,
    /// Fill this data directory of the durable store directly (no server may have it open),
    /// instead of a running server; then `kvlab server --data-dir DIR` serves the keys.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// With --data-dir: memory of the write-back cache while filling, MiB (items beyond it
    /// are written behind to the engine as they are evicted).
    #[arg(long, default_value_t = 256, requires = "data_dir")]
    memory: usize,
}

/// `text` with the default that `kvlab_bench` states for it.
fn dflt(text: &str, value: impl std::fmt::Display) -> String {
    format!("{text} [default: {value}]")
}

/// The fill with no flags given (for the help text's defaults).
fn fill_default() -> Load {
    // Invariant: populate's defaults over the bench's defaults form a valid fill (a unit test
    // checks it); a failure here would be a bug in kvlab_bench, shown in the help.
    populate::fill_load(&Options::default()).unwrap_or_default()
}

fn resolve(addr: &str) -> anyhow::Result<SocketAddr> {
    addr.to_socket_addrs()
        .with_context(|| format!("bad address {addr:?}"))?
        .next()
        .with_context(|| format!("{addr:?} resolves to nothing"))
}

impl PopulateArgs {
    /// The load flags as [`Options`]: one flag, one key.
    fn options(&self) -> Options {
        Options {
            keys: Some(self.keys),
            value_size: self.value_size.clone().map(SizeSpec::Text),
            key_prefix: self.key_prefix.clone(),
            key_size: self.key_size.clone().map(SizeSpec::Text),
            preset: self.workload.clone(),
            connections: self.connections,
            threads: self.threads,
            depth: self.depth,
            exptime: self.exptime,
            ..Options::default()
        }
    }
}

/// Runs `kvlab populate`.
pub fn run(args: PopulateArgs) -> anyhow::Result<()> {
    let load = populate::fill_load(&args.options())?;
    let wl = &load.workload;
    if let Some(dir) = &args.data_dir {
        return populate_dir(dir, wl, load.threads, &args);
    }
    let target = resolve(&args.target)?;
    let r = populate::populate_load(target, &load).context("populate")?;
    println!(
        "populated {} keys on {target} in {:.3} s: {:.0} keys/s ({} connections × depth {})",
        r.keys,
        r.seconds,
        r.keys_per_s,
        load.threads * load.connections,
        load.depth()
    );
    if args.verify_sample > 0 {
        let v = populate::verify_sample(target, wl, args.verify_sample).context("verify")?;
        println!(
            "verified a sample of {} keys: {} correct, {} missing, {} wrong",
            v.checked, v.correct, v.missing, v.wrong
        );
        if v.correct != v.checked {
            bail!(
                "{} of {} sampled keys missing and {} wrong (evicted? expired? see the server's -m)",
                v.missing,
                v.checked,
                v.wrong
            );
        }
    }
    Ok(())
}

/// What filling a data directory did.
#[derive(Debug)]
struct DirFill {
    keys: u64,
    seconds: f64,
    sample: (u64, u64),
}

/// Sets keys `0..wl.keys` with verifiable values into the durable store at `dir` from
/// `threads` threads, syncs it, then reopens the directory and checks `sample` keys.
fn fill_dir(
    dir: &Path,
    wl: &Workload,
    threads: usize,
    memory_mib: usize,
    sample: u64,
) -> anyhow::Result<DirFill> {
    use kvlab_store::{
        Durability, DurableConfig, SetMode, SetRequest, SetStatus, Store, StoreConfig, SystemClock,
    };
    let open = || {
        Store::open(
            StoreConfig {
                memory_limit: memory_mib << 20,
                ..StoreConfig::default()
            },
            Arc::new(SystemClock),
            // `none` while filling: nothing is written until eviction or the final
            // sync_all, which writes everything and fsyncs.
            DurableConfig {
                durability: Durability::None,
                ..DurableConfig::new(dir)
            },
        )
        .with_context(|| format!("opening the data directory {}", dir.display()))
    };
    let store = open()?;
    let t0 = Instant::now();
    let threads = threads.clamp(1, 256) as u64;
    let failed = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let store = &store;
                s.spawn(move || {
                    let (lo, hi) = (wl.keys * t / threads, wl.keys * (t + 1) / threads);
                    let mut buf = [0u8; 256];
                    let mut value = Vec::new();
                    for k in lo..hi {
                        value.clear();
                        wl.write_verified(k, 1, &mut value);
                        let key = wl.key(k, &mut buf);
                        let mut req = SetRequest::new(SetMode::Set, key, &value);
                        req.exptime = i64::from(wl.exptime);
                        if !matches!(store.set(&req), SetStatus::Stored { .. }) {
                            return Some(k);
                        }
                    }
                    None
                })
            })
            .collect();
        handles
            .into_iter()
            .find_map(|h| h.join().unwrap_or(Some(u64::MAX)))
    });
    if let Some(k) = failed {
        bail!("the store refused key {k} (larger than the item limit?)");
    }
    store.sync_all().context("sync_all")?;
    drop(store);
    let seconds = t0.elapsed().as_secs_f64();
    // Check what is on disk: a fresh store over the directory reads the sample back.
    let store = open()?;
    let n = sample.min(wl.keys);
    let mut buf = [0u8; 256];
    let mut ok = 0;
    for i in 0..n {
        let k = if n == 1 {
            0
        } else {
            (i as u128 * (wl.keys - 1) as u128 / (n - 1) as u128) as u64
        };
        let key = wl.key(k, &mut buf);
        if store.load(key)? {
            if let Some(item) = store.get(key) {
                ok += u64::from(wl.check_value(key, &item.value));
            }
        }
    }
    Ok(DirFill {
        keys: wl.keys,
        seconds,
        sample: (n, ok),
    })
}

fn populate_dir(
    dir: &Path,
    wl: &Workload,
    threads: usize,
    args: &PopulateArgs,
) -> anyhow::Result<()> {
    let f = fill_dir(dir, wl, threads, args.memory, args.verify_sample)?;
    println!(
        "populated {} keys into {} in {:.3} s (synced): {:.0} keys/s",
        f.keys,
        dir.display(),
        f.seconds,
        f.keys as f64 / f.seconds.max(1e-9)
    );
    if f.sample.0 > 0 {
        println!(
            "verified a sample of {} keys after reopening: {} correct",
            f.sample.0, f.sample.1
        );
        if f.sample.1 != f.sample.0 {
            bail!(
                "{} of {} sampled keys missing or wrong",
                f.sample.0 - f.sample.1,
                f.sample.0
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn no_flags_is_populates_default_fill() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            p: PopulateArgs,
        }
        let cli = Cli::try_parse_from(["populate", "--keys", "5"]).unwrap();
        let l = populate::fill_load(&cli.p.options()).unwrap();
        assert_eq!(l.depth(), populate::defaults().depth.unwrap());
        assert_eq!(l.workload.keys, 5);
        assert!(l.workload.verify && l.workload.mix.get == 0);
        assert_eq!(fill_default().threads, Load::default().threads);
        let cli = Cli::try_parse_from(["populate", "--keys", "5", "--workload", "etc"]).unwrap();
        let l = populate::fill_load(&cli.p.options()).unwrap();
        assert_eq!(l.workload.value_size, kvlab_bench::dist::etc_value_size());
        let cli = Cli::try_parse_from(["populate", "--keys", "0"]).unwrap();
        let e = populate::fill_load(&cli.p.options()).unwrap_err();
        assert!(e.to_string().contains("keys"), "{e}");
    }

    #[test]
    fn fills_a_data_dir_that_reopens_with_every_sampled_key() {
        let dir = std::env::temp_dir().join(format!("kvlab-populate-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let wl = Workload {
            keys: 5000,
            value_size: kvlab_bench::dist::SizeDist::Uniform { min: 10, max: 500 },
            verify: true,
            ..Workload::default()
        };
        // 1 MiB of cache for ~1.5 MB of items: most are written behind on eviction.
        let f = fill_dir(&dir, &wl, 2, 1, 300).unwrap();
        assert_eq!(f.keys, 5000);
        assert_eq!(f.sample, (300, 300));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
