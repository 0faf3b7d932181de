//! `kvlab faults`: seeded fault-injection runs against a local kvlab cluster, checked the
//! way Jepsen checks databases (see `kvlab_faults`). `run` runs one seed, `soak` many and
//! prints a table, `check` checks a recorded history again.
//!
//! With `--netns` every node, etcd member and the proxy runs in a network namespace of its
//! own (root only; see `kvlab_faults::netns`), and the nemesis also partitions and delays.
//!
//! SIGINT or SIGTERM ends a run early, stopping what it started (namespaces included).
//! Exit status: 0 when nothing was found, 1 when the checker found anomalies, 2 when a run
//! could not go as planned (it still checks what it has), could not start at all (no
//! namespaces without root, for one), or could not verify every key it wrote (an
//! acknowledged write never read back: its loss would go unseen).

use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand, ValueEnum};
use kvlab_faults::clients::Workload;
use kvlab_faults::runner::CopyWritePolicy;
use kvlab_faults::{ClientKind, Durable, Mix, RunConfig, RunSummary, TopologyKind};

#[derive(Debug, Args)]
pub struct FaultsArgs {
    #[command(subcommand)]
    command: FaultsCommand,
}

#[derive(Debug, Subcommand)]
enum FaultsCommand {
    /// One seeded run: start a cluster, load it while the nemesis strikes, heal it, read
    /// every key back, check the history. Files go to OUT/seed-SEED.
    Run {
        /// Draws the faults and the clients' choices.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[command(flatten)]
        opts: RunOpts,
    },
    /// Runs seeds A..B (both included) one after the other, then prints a table.
    Soak {
        /// `A..B` (both included) or one seed.
        #[arg(long, default_value = "1..10")]
        seeds: String,
        #[command(flatten)]
        opts: RunOpts,
    },
    /// Checks a recorded history (`history.jsonl`) again and prints what was found.
    Check {
        /// The history file.
        history: PathBuf,
        /// The write policy the cluster ran with (`owner`: acknowledged writes nobody read
        /// are set aside).
        #[arg(long, default_value_t = CopyWritePolicy::All)]
        write_policy: CopyWritePolicy,
        /// The whole report as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum TopologyArg {
    /// A JSON file in the run's directory.
    File,
    /// An etcd started for the run (`etcd` on PATH, or $ETCD).
    Etcd,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ClientArg {
    /// Cluster-aware clients (route by the ring, follow redirects).
    Cluster,
    /// Plain memcached clients through `kvlab proxy --cluster`.
    Proxy,
    /// Plain memcached clients through `kvlab proxy` over a pool of plain `kvlab server`s
    /// with `--replicas` copies of every key (no cluster: faults are pauses, and with
    /// --netns partitions and delays).
    Pool,
}

#[derive(Debug, Args)]
struct RunOpts {
    /// Seconds of load and faults (the heal and the checks come after).
    #[arg(long, default_value_t = 20)]
    duration: u64,
    /// Where the cluster's topology lives.
    #[arg(long, value_enum, default_value = "file")]
    topology: TopologyArg,
    /// etcd members with `--topology etcd` (with 3, one may die and a quorum remains).
    #[arg(long, default_value_t = 1)]
    etcd_members: usize,
    /// Copies of every key.
    #[arg(long, default_value_t = 1)]
    replicas: u32,
    /// With copies, when a write is acknowledged (`kvlab cluster create --write-policy`):
    /// under `owner` the checker sets aside the acknowledged writes nobody read (the policy
    /// may lose those) and checks that no value read is ever undone.
    #[arg(long, default_value_t = CopyWritePolicy::All)]
    write_policy: CopyWritePolicy,
    /// How clients reach the cluster.
    #[arg(long, value_enum, default_value = "cluster")]
    client: ClientArg,
    /// Nodes at the start.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Fault kinds to draw, comma-separated: kill, pause, add, remove, add-two, remove-two,
    /// coordinator-kill, etcd-kill, flush, partition, delay. Default: the kinds the cluster
    /// is expected to survive (kill only with 2 copies or more, etcd-kill only with etcd,
    /// partition and delay only with --netns).
    #[arg(long)]
    faults: Option<String>,
    /// Run every node, etcd member and the proxy in a network namespace of its own, on a
    /// private 10.77.X.0/24 that exists only inside them (needs root, iproute2, iptables);
    /// the nemesis then also partitions (node from node, from etcd, from the proxy, from
    /// everything) and delays nodes. Everything made is removed at the end.
    #[arg(long)]
    netns: bool,
    /// Durable nodes: each keeps its keys in a data directory of its own
    /// (OUT/seed-SEED/data/node-ADDRESS) with `--durability sync` and a small write-back
    /// cache (--cache-items), and a node killed with `kill -9` is restarted over its
    /// directory. With a file topology the nemesis then kills nodes with one copy too:
    /// every acknowledged write must come back from the killed node's disk.
    #[arg(long)]
    durable: bool,
    /// With --durable: the entries each node's write-back cache holds; the other keys are
    /// on its disk only (`--cache-items` after `--` wins).
    #[arg(long, default_value_t = Durable::CACHE_ITEMS, requires = "durable")]
    cache_items: usize,
    /// Client threads.
    #[arg(long, default_value_t = 4)]
    clients: u32,
    /// Keys the clients share.
    #[arg(long, default_value_t = 200)]
    keys: u32,
    /// Operations a second per client, at most.
    #[arg(long, default_value_t = 250)]
    rate: u32,
    /// One request's timeout, ms (then its outcome is unknown).
    #[arg(long, default_value_t = 1000)]
    timeout_ms: u64,
    /// Where each run's directory goes.
    #[arg(long, default_value = "kvlab-faults")]
    out: PathBuf,
    /// Flags for every node's `kvlab server`, after `--` (default `-t 2 -m 64`).
    #[arg(last = true)]
    server_args: Vec<String>,
}

impl RunOpts {
    fn config(&self, seed: u64, interrupt: &Arc<AtomicBool>) -> anyhow::Result<RunConfig> {
        if self.nodes < 2 {
            bail!("--nodes must be at least 2");
        }
        if self.replicas == 0 || self.replicas as usize > self.nodes {
            bail!("--replicas must be 1..={} (the nodes)", self.nodes);
        }
        if self.write_policy == CopyWritePolicy::Owner
            && (self.replicas < 2 || matches!(self.client, ClientArg::Pool))
        {
            bail!("--write-policy owner is a cluster's with --replicas 2 or more");
        }
        if matches!(self.client, ClientArg::Pool) && matches!(self.topology, TopologyArg::Etcd) {
            bail!("--client pool has no topology: leave --topology at file");
        }
        if self.durable && matches!(self.client, ClientArg::Pool) {
            bail!("--durable runs a cluster's nodes: not with --client pool");
        }
        let topology = match self.topology {
            TopologyArg::File => TopologyKind::File,
            TopologyArg::Etcd => TopologyKind::Etcd {
                members: self.etcd_members.max(1),
            },
        };
        let mut cfg = RunConfig {
            interrupt: Arc::clone(interrupt),
            seed,
            duration: Duration::from_secs(self.duration),
            nodes: self.nodes,
            replicas: self.replicas,
            write_policy: self.write_policy,
            topology,
            client: match self.client {
                ClientArg::Cluster => ClientKind::Cluster,
                ClientArg::Proxy => ClientKind::Proxy,
                ClientArg::Pool => ClientKind::Pool,
            },
            mix: None,
            workload: Workload {
                clients: self.clients.max(1),
                keys: self.keys.max(1),
                rate: self.rate.max(1),
                timeout: Duration::from_millis(self.timeout_ms.max(1)),
                ..Workload::default()
            },
            exe: std::env::current_exe().context("finding the kvlab binary")?,
            dir: self.out.join(format!("seed-{seed}")),
            server_args: if self.server_args.is_empty() {
                ["-t", "2", "-m", "64"].map(String::from).to_vec()
            } else {
                self.server_args.clone()
            },
            netns: self.netns,
            durable: self.durable.then_some(Durable {
                cache_items: self.cache_items,
            }),
        };
        if let Some(list) = &self.faults {
            cfg.mix = Some(Mix::parse(list, cfg.capabilities()).map_err(anyhow::Error::msg)?);
        }
        Ok(cfg)
    }
}

fn seeds(text: &str) -> anyhow::Result<RangeInclusive<u64>> {
    let parse = |s: &str| {
        s.trim()
            .parse::<u64>()
            .with_context(|| format!("--seeds {text}: expected A..B or one seed"))
    };
    match text.split_once("..") {
        Some((a, b)) => {
            let (a, b) = (parse(a)?, parse(b.trim_start_matches('='))?);
            if b < a {
                bail!("--seeds {text}: the range is empty");
            }
            Ok(a..=b)
        }
        None => {
            let a = parse(text)?;
            Ok(a..=a)
        }
    }
}

/// The runs' verdict: anomalies in any run, 1; else a run that went wrong or could not
/// verify keys, 2 (saying how many keys); else 0.
fn status(runs: &[RunSummary]) -> i32 {
    let code = kvlab_faults::runner::exit_code(runs);
    let unverified: u64 = runs.iter().map(|r| r.unverified_keys).sum();
    if code == 2 && unverified > 0 {
        eprintln!(
            "kvlab faults: {}",
            kvlab_faults::checker::unverified_line(unverified)
        );
    }
    code
}

pub fn run(args: FaultsArgs) -> anyhow::Result<()> {
    // SIGINT or SIGTERM ends a run early but cleanly: every process it started is stopped
    // (they would outlive this one otherwise) and what it recorded is checked.
    let interrupt = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&interrupt))
            .context("installing the signal handlers")?;
    }
    // Without namespaces a --netns run cannot start: say why, and end as a run that could
    // not go as planned.
    let netns = match &args.command {
        FaultsCommand::Run { opts, .. } | FaultsCommand::Soak { opts, .. } => opts.netns,
        FaultsCommand::Check { .. } => false,
    };
    if netns {
        if let Err(why) = kvlab_faults::netns::preflight() {
            eprintln!("kvlab faults: --netns: {why}");
            std::process::exit(2);
        }
    }
    let code = match args.command {
        FaultsCommand::Run { seed, opts } => {
            let cfg = opts.config(seed, &interrupt)?;
            let r = kvlab_faults::run(&cfg);
            println!("{}", r.line());
            println!("files: {}", cfg.dir.display());
            status(std::slice::from_ref(&r))
        }
        FaultsCommand::Soak { seeds: range, opts } => {
            let mut runs = Vec::new();
            for seed in seeds(&range)? {
                let r = kvlab_faults::run(&opts.config(seed, &interrupt)?);
                println!("{}", r.line());
                runs.push(r);
                if interrupt.load(Ordering::Relaxed) {
                    break;
                }
            }
            println!();
            print!("{}", kvlab_faults::runner::table(&runs));
            println!("files: {}", opts.out.display());
            status(&runs)
        }
        FaultsCommand::Check {
            history,
            write_policy,
            json,
        } => {
            let r = kvlab_faults::runner::check_file(&history, write_policy)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                if r.set_aside > 0 {
                    println!(
                        "{} acknowledged writes nobody read set aside (write policy owner)",
                        r.set_aside
                    );
                }
                println!(
                    "ops {} (ok {}, failed {}, unknown {}) over {} keys; anomalies {} (lost {}, \
                     stale {}, never-written {}, non-linearizable keys {}); {} keys unverified",
                    r.ops,
                    r.ok,
                    r.failed,
                    r.unknown,
                    r.keys,
                    r.anomaly_count(),
                    r.lost_writes,
                    r.stale_reads,
                    r.never_written,
                    r.linearizability.not_linearizable.len(),
                    r.unverified_keys.len()
                );
                for a in r.anomalies.iter().take(10) {
                    println!("  {:?} {}: {}", a.kind, a.key, a.why);
                }
            }
            if !r.unverified_keys.is_empty() {
                eprintln!(
                    "kvlab faults: {}",
                    kvlab_faults::checker::unverified_line(r.unverified_keys.len() as u64)
                );
            }
            r.exit_code()
        }
    };
    std::process::exit(code);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_are_a_range_with_both_ends_or_one() {
        assert_eq!(seeds("3..5").unwrap(), 3..=5);
        assert_eq!(seeds("3..=5").unwrap(), 3..=5);
        assert_eq!(seeds("7").unwrap(), 7..=7);
        assert!(seeds("5..3").is_err());
        assert!(seeds("x").is_err());
    }
}
