//! `kvlab cluster`: start, grow, shrink and inspect a kvlab cluster (see `kvlab_cluster`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use kvlab_cluster::coordinator::{self, MigrationReport};
use kvlab_cluster::{ClusterError, CopyWritePolicy, TopologyStore};
use kvlab_etcd::open_store;
use kvlab_ring::DEFAULT_VNODES;

mod local;

#[derive(Debug, Args)]
pub struct ClusterArgs {
    /// Where the cluster's topology is: `file:PATH` or PATH (the embedded store for one
    /// machine: a JSON file every node polls).
    /// `etcd://HOST:PORT[,HOST:PORT…]/NAME` keeps it in etcd (nodes' logs and pids then go
    /// to kvlab-cluster/NAME).
    #[arg(long, global = true, default_value = "kvlab-cluster/topology.json")]
    topology: String,
    #[command(subcommand)]
    command: ClusterCommand,
}

#[derive(Debug, Subcommand)]
enum ClusterCommand {
    /// Start N local nodes (`kvlab server --cluster`) in the background and create the
    /// cluster of them; their logs and pids go beside the topology file.
    Up {
        /// Nodes to start.
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// Port of the first node; the others follow.
        #[arg(long, default_value_t = 7101)]
        base_port: u16,
        /// Ring points per node.
        #[arg(long, default_value_t = DEFAULT_VNODES)]
        vnodes: u32,
        /// Copies of every key (the owner writes them through before it answers); with 2 or
        /// more and an etcd topology, a node that dies is taken out of the ring when its
        /// lease lapses and its keys are served from their copies.
        #[arg(long, default_value_t = 1)]
        replicas: u32,
        /// With copies: `all` acknowledges a write once every copy holder confirmed it (an
        /// acknowledged write is on `--replicas` nodes); `owner` once the owner applied it,
        /// its copies following (faster; a write acknowledged just before its owner dies
        /// may be lost, a value read never is).
        #[arg(long, default_value_t = CopyWritePolicy::All)]
        write_policy: CopyWritePolicy,
        /// Flags for every node's `kvlab server` (e.g. `-m 1024 -t 2`), after `--`.
        #[arg(last = true)]
        server_args: Vec<String>,
    },
    /// Create a cluster of nodes that are already running with `--cluster` on this topology.
    Create {
        /// Ring points per node.
        #[arg(long, default_value_t = DEFAULT_VNODES)]
        vnodes: u32,
        /// Copies of every key (see `up --replicas`).
        #[arg(long, default_value_t = 1)]
        replicas: u32,
        /// When a write with copies is acknowledged (see `up --write-policy`).
        #[arg(long, default_value_t = CopyWritePolicy::All)]
        write_policy: CopyWritePolicy,
        /// The nodes, HOST:PORT.
        #[arg(required = true)]
        nodes: Vec<String>,
    },
    /// Add a node and move its share of the keys to it while the cluster serves.
    Add {
        /// The node (HOST:PORT), running `kvlab server --cluster` on this topology; with
        /// --start, the port of a local node to start first.
        node: String,
        /// Start a local node on that address first (logs beside the topology file), with
        /// the flags after `--`.
        #[arg(long)]
        start: bool,
        /// Flags for the started node's `kvlab server`, after `--`.
        #[arg(last = true)]
        server_args: Vec<String>,
    },
    /// Start a stopped member again (crashed, killed, or stopped by hand) on this machine,
    /// with the flags `up` or `add --start` first gave it: over its own data directory
    /// (`--data-dir D` became `D/node-PORT`), so a durable node comes back with its keys.
    Start {
        /// The member, HOST:PORT.
        node: String,
    },
    /// Move a node's keys to the others and take it out of the ring (it keeps running;
    /// stop it afterwards).
    Remove {
        /// The node, HOST:PORT.
        node: String,
    },
    /// The topology, the migration under way, and every node's view and progress.
    Status {
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Drive a migration left half-way (its coordinator died) to its end.
    Resume,
    /// Roll back a migration that is still copying (the old ring stays).
    Abort,
    /// Stop the cluster's nodes that run on this machine (each by the pid it reports, else
    /// the one `up` recorded) and remove the topology; nodes on other machines are named and
    /// left running. A node that cannot be stopped fails the command and keeps the topology.
    Down,
}

pub fn run(args: ClusterArgs) -> anyhow::Result<()> {
    let store = open_store(&args.topology)?;
    let dir = topology_dir(&args.topology);
    match args.command {
        ClusterCommand::Up {
            nodes,
            base_port,
            vnodes,
            replicas,
            write_policy,
            server_args,
        } => {
            if nodes == 0 {
                bail!("--nodes must be at least 1");
            }
            if store.load()?.is_some() {
                bail!(
                    "a cluster already exists in {} (kvlab cluster down first)",
                    store.describe()
                );
            }
            if base_port as usize + nodes - 1 > u16::MAX as usize {
                bail!("--base-port {base_port} with {nodes} nodes goes past port 65535");
            }
            let names: Vec<String> = (0..nodes)
                .map(|i| format!("127.0.0.1:{}", base_port as usize + i))
                .collect();
            local::check_free(&names)?;
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            // The topology first: a node reads it when it starts.
            coordinator::create(
                store.as_ref(),
                vnodes,
                replicas,
                write_policy,
                names.clone(),
            )?;
            let mut started = Vec::new();
            if let Err(e) = start_all(&dir, &args.topology, &names, &server_args, &mut started) {
                let n = started.len();
                let killed = local::stop_started(started, &dir);
                let removed = match store.clear() {
                    Ok(()) => "removed the topology it created".to_string(),
                    Err(c) => format!("could not remove the topology it created: {c}"),
                };
                bail!(
                    "{e:#}\nundone: stopped the {n} nodes it started; {removed}{}",
                    lines(&killed)
                );
            }
            println!("cluster of {} nodes up: {}", nodes, names.join(" "));
            println!("topology: {}", store.describe());
            Ok(())
        }
        ClusterCommand::Create {
            vnodes,
            replicas,
            write_policy,
            nodes,
        } => {
            let t = coordinator::create(store.as_ref(), vnodes, replicas, write_policy, nodes)?;
            println!(
                "cluster created at epoch {}: {}",
                t.epoch,
                t.nodes.join(" ")
            );
            Ok(())
        }
        ClusterCommand::Add {
            node,
            start,
            server_args,
        } => {
            if !start {
                let r = coordinator::add(store.as_ref(), &node, &mut show_progress())?;
                return finish(&r);
            }
            if store.load()?.is_none() {
                bail!("no cluster in {}", store.describe());
            }
            local::check_free(std::slice::from_ref(&node))?;
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let mut s = local::start(&dir, &args.topology, &node, &server_args)?;
            if let Err(e) = local::wait(&mut s) {
                let killed = local::stop_started(vec![s], &dir);
                bail!(
                    "{e:#}\nundone: stopped the node it started{}",
                    lines(&killed)
                );
            }
            match coordinator::add(store.as_ref(), &node, &mut show_progress()) {
                Ok(r) => finish(&r),
                // A node the topology names (a migration to it to resume) keeps running.
                Err(e) if names_node(store.as_ref(), &node) => bail!(
                    "{e}\nthe node it started ({node}, pid {}) keeps running: the topology \
                     names it",
                    s.pid()
                ),
                Err(e) => {
                    let killed = local::stop_started(vec![s], &dir);
                    bail!("{e}\nundone: stopped the node it started{}", lines(&killed))
                }
            }
        }
        ClusterCommand::Start { node } => {
            let Some(t) = store.load()? else {
                bail!("no cluster in {}", store.describe());
            };
            let mut members = t.nodes.clone();
            members.extend(t.migration.iter().flat_map(|m| m.to.iter().cloned()));
            if !members.contains(&node) {
                bail!(
                    "{node} is not a member of the ring (members: {}); `kvlab cluster add \
                     --start {node}` adds a new one",
                    t.nodes.join(" ")
                );
            }
            if let Ok(status) = coordinator::node_status(&node) {
                bail!(
                    "{node} is running already (pid {})",
                    status["pid"]
                        .as_u64()
                        .map_or("unknown".into(), |p| p.to_string())
                );
            }
            local::check_free(std::slice::from_ref(&node))?;
            let mut s = local::restart(&dir, &args.topology, &node)?;
            if let Err(e) = local::wait(&mut s) {
                let killed = local::stop_started(vec![s], &dir);
                bail!(
                    "{e:#}\nundone: stopped the node it started{}",
                    lines(&killed)
                );
            }
            println!("{node} started again (pid {}) with its own flags", s.pid());
            Ok(())
        }
        ClusterCommand::Remove { node } => {
            let r = coordinator::remove(store.as_ref(), &node, &mut show_progress())?;
            finish(&r)
        }
        ClusterCommand::Resume => {
            let r = coordinator::resume(store.as_ref(), &mut show_progress())?;
            finish(&r)
        }
        ClusterCommand::Abort => {
            let t = coordinator::abort(store.as_ref())?;
            println!(
                "rolled back: epoch {}, nodes {}",
                t.epoch,
                t.nodes.join(" ")
            );
            Ok(())
        }
        ClusterCommand::Status { json } => status(store.as_ref(), json),
        ClusterCommand::Down => down(store.as_ref(), &args.topology, &dir),
    }
}

/// Where `up` and `add --start` keep the nodes' logs and pids: beside a topology file, or
/// `kvlab-cluster/NAME` for a cluster in etcd.
fn topology_dir(spec: &str) -> PathBuf {
    if let Some(rest) = spec.strip_prefix("etcd://") {
        let name = rest.split_once('/').map_or("", |(_, n)| n);
        let name = if name.is_empty() { "default" } else { name };
        return PathBuf::from("kvlab-cluster").join(name.replace('/', "_"));
    }
    let path = Path::new(spec.strip_prefix("file:").unwrap_or(spec));
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Starts a node for each of `names` and waits until each answers as the process it
/// started; `started` holds those started, for the caller to stop if this fails.
fn start_all(
    dir: &Path,
    topology: &str,
    names: &[String],
    server_args: &[String],
    started: &mut Vec<local::Started>,
) -> anyhow::Result<()> {
    for n in names {
        started.push(local::start(dir, topology, n, server_args)?);
    }
    for s in started.iter_mut() {
        local::wait(s)?;
    }
    Ok(())
}

/// Notes for a message, each on a line of its own.
fn lines(notes: &[String]) -> String {
    notes.iter().map(|n| format!("\n{n}")).collect()
}

/// Whether the topology names `node` (or cannot be read, so that it may).
fn names_node(store: &dyn TopologyStore, node: &str) -> bool {
    match store.load() {
        Ok(Some(t)) => {
            t.nodes.iter().any(|n| n == node)
                || t.migration.is_some_and(|m| m.to.iter().any(|n| n == node))
        }
        Ok(None) => false,
        Err(_) => true,
    }
}

fn show_progress() -> impl FnMut(&MigrationReport) {
    // A migration that ends within half a second prints only its result.
    let mut last = Instant::now();
    move |r: &MigrationReport| {
        if last.elapsed() >= Duration::from_millis(500) {
            last = Instant::now();
            eprintln!(
                "  migration {}: {:.1} s, {} keys copied, {} changes streamed, {:.1} MB",
                r.id,
                r.total_s,
                r.keys_copied,
                r.changes_sent,
                r.bytes_sent as f64 / 1e6
            );
        }
    }
}

fn finish(r: &MigrationReport) -> anyhow::Result<()> {
    println!(
        "migration {} done in {:.3} s (copy {:.3} s, hand-off {:.3} s): {} keys copied, {} \
         changes streamed, {:.1} MB ({:.1} MB/s){}",
        r.id,
        r.total_s,
        r.copy_s,
        r.handoff_s,
        r.keys_copied,
        r.changes_sent,
        r.bytes_sent as f64 / 1e6,
        r.bytes_sent as f64 / 1e6 / r.total_s.max(1e-9),
        if r.refused > 0 {
            format!("; {} items refused by their new owner", r.refused)
        } else {
            String::new()
        }
    );
    println!("nodes: {}", r.to.join(" "));
    Ok(())
}

fn status(store: &dyn TopologyStore, json: bool) -> anyhow::Result<()> {
    let Some(t) = store.load()? else {
        bail!("no cluster in {}", store.describe());
    };
    let mut names = t.nodes.clone();
    if let Some(m) = &t.migration {
        for n in &m.to {
            if !names.contains(n) {
                names.push(n.clone());
            }
        }
    }
    let nodes: Vec<(String, Result<serde_json::Value, String>)> = names
        .iter()
        .map(|n| {
            (
                n.clone(),
                coordinator::node_status(n).map_err(|e| match e {
                    ClusterError::Unreachable { reason, .. } => format!("unreachable ({reason})"),
                    e => e.to_string(),
                }),
            )
        })
        .collect();
    if json {
        let out = serde_json::json!({
            "topology": t,
            "nodes": nodes.iter().map(|(n, s)| (n.clone(), match s {
                Ok(v) => v.clone(),
                Err(e) => serde_json::json!({ "error": e }),
            })).collect::<serde_json::Map<_, _>>(),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "epoch {}, {} points per node, nodes: {}",
        t.epoch,
        t.vnodes,
        t.nodes.join(" ")
    );
    if t.replicas > 1 {
        println!(
            "{} copies of every key, write policy {}",
            t.replicas, t.write_policy
        );
    }
    if let Some(m) = &t.migration {
        println!("migration {} ({:?}) to: {}", m.id, m.phase, m.to.join(" "));
    }
    for (n, s) in nodes {
        match s {
            Ok(v) => {
                let p = &v["progress"];
                println!(
                    "  {n}: epoch {}, {} items, migration {} keys copied {} changes {} bytes {}{}",
                    v["epoch"],
                    v["items"],
                    p["migration"],
                    p["keys_copied"],
                    p["changes_sent"],
                    p["bytes_sent"],
                    if p["handed_off"] == p["migration"] && p["migration"] != 0 {
                        " (handed off)"
                    } else {
                        ""
                    }
                );
            }
            Err(e) => println!("  {n}: {e}"),
        }
    }
    Ok(())
}

/// Stops the topology's nodes that run on this machine (and any node `up` or `add
/// --start` recorded beside it) and removes the topology. A node that cannot be stopped
/// keeps the topology, so that `down` can be run again.
fn down(store: &dyn TopologyStore, topology: &str, dir: &Path) -> anyhow::Result<()> {
    let t = store.load()?;
    let r = local::stop_nodes(t.as_ref(), topology, dir);
    if t.is_none() && r.stopped.is_empty() && r.failed.is_empty() {
        bail!("no cluster in {}: nothing to stop", store.describe());
    }
    for k in &r.killed {
        eprintln!("{k}");
    }
    println!(
        "stopped {} nodes{}",
        r.stopped.len(),
        if r.stopped.is_empty() {
            String::new()
        } else {
            format!(": {}", r.stopped.join(" "))
        }
    );
    if !r.not_running.is_empty() {
        println!("not running: {}", r.not_running.join(" "));
    }
    if !r.elsewhere.is_empty() {
        println!(
            "not stopped, not on this machine (stop them where they run): {}",
            r.elsewhere.join(" ")
        );
    }
    if !r.failed.is_empty() {
        bail!(
            "could not stop {} nodes:\n  {}\nthe topology in {} is kept: run `kvlab cluster \
             down` again once they are stopped",
            r.failed.len(),
            r.failed.join("\n  "),
            store.describe()
        );
    }
    if t.is_some() {
        store.clear()?;
        println!("topology removed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_files_go_beside_a_topology_file_or_under_the_etcd_clusters_name() {
        assert_eq!(
            topology_dir("/tmp/c/topology.json"),
            PathBuf::from("/tmp/c")
        );
        assert_eq!(topology_dir("file:t.json"), PathBuf::from("."));
        assert_eq!(
            topology_dir("etcd://127.0.0.1:2379,127.0.0.1:2380/prod"),
            PathBuf::from("kvlab-cluster/prod")
        );
        assert_eq!(
            topology_dir("etcd://127.0.0.1:2379"),
            PathBuf::from("kvlab-cluster/default")
        );
    }
}
