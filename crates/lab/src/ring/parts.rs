//! Carrying out a storage-ring experiment: the messages, then each part (scale,
//! throughput, cache) on rings of its own, the clients as threads of this process.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::Context;
use kvlab_bench::data::{DataKey, DataSet, DataSpec, DEFAULT_MAX_ITEM_SIZE};
use kvlab_client::ClusterClient;
use kvlab_faults::netns::Net;
use kvlab_ring::{Ring, DEFAULT_VNODES};

use super::nodes::{make_net, Nodes};
use super::report::write;
use super::{BenchPoint, Cpu, MethodRun, ReadBack, RingResult, RingSpec, ScaleEvent, ScaleResult};

/// How long a client waits for one answer.
const TIMEOUT: Duration = Duration::from_secs(5);
/// Threads that write the messages and read them back.
const FILLERS: usize = 4;

/// The messages: the data set's first `n` records.
struct Messages {
    set: Arc<DataSet>,
    n: u64,
    path: PathBuf,
}

impl Messages {
    fn key(&self, i: u64) -> &[u8] {
        self.set.key(i)
    }
    fn value(&self, i: u64) -> &[u8] {
        self.set.value(i)
    }
}

/// Runs a storage-ring experiment into `out` and writes its report; returns the summary.
pub fn run(
    spec: &RingSpec,
    text: &str,
    out: &Path,
    bin: &Path,
) -> anyhow::Result<(String, PathBuf)> {
    let msgs = messages(spec, out)?;
    let mean = (0..msgs.n).map(|i| msgs.value(i).len() as f64).sum::<f64>() / msgs.n as f64;
    let mut res = RingResult {
        spec_text: text.to_string(),
        name: spec.name.clone(),
        data: format!(
            "{} ({}, {} records)",
            msgs.path.display(),
            msgs.set.summary().format,
            msgs.set.len()
        ),
        messages: msgs.n,
        mean_message_bytes: mean,
        netns: spec.netns,
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        original: spec.original.clone(),
        ..RingResult::default()
    };
    if (msgs.n as usize) < spec.messages {
        res.notes.push(format!(
            "the data set has {} usable records, fewer than messages = {}",
            msgs.n, spec.messages
        ));
    }
    let net = match spec.netns {
        true => Some(Arc::new(make_net(&out.join("net"))?)),
        false => None,
    };
    let save = |res: &RingResult| crate::runner::write_json(&out.join("ring.json"), res);
    if spec.scale.nodes > 0 {
        match scale(spec, &msgs, bin, &out.join("scale"), net.clone()) {
            Ok(s) => res.scale = Some(s),
            Err(e) => res.notes.push(format!("the scale part failed: {e:#}")),
        }
        save(&res)?;
    }
    for &servers in &spec.throughput.servers {
        if let Err(e) = throughput(spec, &msgs, bin, out, net.clone(), servers, &mut res) {
            res.notes
                .push(format!("throughput with {servers} servers failed: {e:#}"));
        }
        save(&res)?;
    }
    for &size in &spec.cache.sizes {
        for policy in &spec.cache.policies {
            if let Err(e) = cache(spec, &msgs, bin, out, net.clone(), size, policy, &mut res) {
                res.notes
                    .push(format!("cache {size} {policy} failed: {e:#}"));
            }
        }
        save(&res)?;
    }
    if let Some(net) = net {
        if let Err(e) = net.down() {
            res.notes.push(format!("taking the network down: {e}"));
        }
    }
    save(&res)?;
    write(out, &res)
}

/// The data set `data` names, or a synthetic maildir written into `out/maildir`.
fn messages(spec: &RingSpec, out: &Path) -> anyhow::Result<Messages> {
    let path = match &spec.data {
        Some(p) => p.clone(),
        None => {
            let root = out.join("maildir");
            kvlab_bench::maildir::write_synthetic_maildir(&root, spec.messages, 7)
                .with_context(|| format!("writing a synthetic maildir in {}", root.display()))?;
            root
        }
    };
    let set = DataSet::shared(&DataSpec {
        path: path.clone(),
        key: DataKey::Path,
        max_item_size: DEFAULT_MAX_ITEM_SIZE,
        base64_keys: false,
    })?;
    let n = (spec.messages as u64).min(set.len() as u64);
    Ok(Messages { set, n, path })
}

/// Splits `0..n` over [`FILLERS`] threads, each with a cluster client; sums what `f`
/// counted for each index (the first count: errors).
fn each_message(
    seeds: &[SocketAddr],
    msgs: &Messages,
    f: &(dyn Fn(&mut ClusterClient, u64) -> [u64; 3] + Sync),
) -> anyhow::Result<[u64; 3]> {
    let totals: Vec<anyhow::Result<[u64; 3]>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..FILLERS as u64)
            .map(|t| {
                s.spawn(move || {
                    let mut c = ClusterClient::connect(seeds, TIMEOUT)?;
                    let mut sum = [0u64; 3];
                    let mut i = t;
                    while i < msgs.n {
                        for (a, b) in sum.iter_mut().zip(f(&mut c, i)) {
                            *a += b;
                        }
                        i += FILLERS as u64;
                    }
                    Ok(sum)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a client panicked")))
            })
            .collect()
    });
    let mut sum = [0u64; 3];
    for t in totals {
        for (a, b) in sum.iter_mut().zip(t?) {
            *a += b;
        }
    }
    Ok(sum)
}

/// Writes every message; returns the seconds it took and the writes that failed.
fn fill(seeds: &[SocketAddr], msgs: &Messages) -> anyhow::Result<(f64, u64)> {
    let t = Instant::now();
    let [errors, _, _] = each_message(
        seeds,
        msgs,
        &|c, i| match c.set(msgs.key(i), msgs.value(i)) {
            Ok(true) => [0, 0, 0],
            _ => [1, 0, 0],
        },
    )?;
    Ok((t.elapsed().as_secs_f64(), errors))
}

/// Reads every message back and compares its bytes.
fn read_back(seeds: &[SocketAddr], msgs: &Messages) -> ReadBack {
    let t = Instant::now();
    let r = each_message(seeds, msgs, &|c, i| match c.get(msgs.key(i)) {
        Ok(Some(v)) if v == msgs.value(i) => [0, 0, 0],
        Ok(Some(_)) => [0, 0, 1],
        Ok(None) => [0, 1, 0],
        Err(_) => [1, 0, 0],
    });
    let [errors, missing, wrong] = r.unwrap_or([msgs.n, 0, 0]);
    ReadBack {
        read: msgs.n,
        missing,
        wrong,
        errors,
        seconds: t.elapsed().as_secs_f64(),
    }
}

/// Messages whose owner differs between rings of nodes `a` and `b`.
fn moved(msgs: &Messages, a: &[String], b: &[String]) -> u64 {
    let (ra, rb) = (
        Ring::new(0, DEFAULT_VNODES, a),
        Ring::new(0, DEFAULT_VNODES, b),
    );
    (0..msgs.n)
        .filter(|&i| ra.owner(msgs.key(i)) != rb.owner(msgs.key(i)))
        .count() as u64
}

/// The scale part: `nodes` durable nodes, every message written, one node added and one
/// removed, every message read back after each.
fn scale(
    spec: &RingSpec,
    msgs: &Messages,
    bin: &Path,
    dir: &Path,
    net: Option<Arc<Net>>,
) -> anyhow::Result<ScaleResult> {
    let mut nodes = Nodes::start(spec.scale.nodes, &spec.node_args, bin, dir, net)?;
    let (fill_s, fill_errors) = fill(&nodes.addrs(), msgs)?;
    let mut res = ScaleResult {
        nodes: spec.scale.nodes,
        keys: msgs.n,
        fill_s,
        fill_errors,
        events: Vec::new(),
    };
    for action in ["add", "remove"] {
        let before = nodes.ring();
        let mut ev = ScaleEvent {
            action: action.into(),
            nodes_before: before.len(),
            keys: msgs.n,
            ..ScaleEvent::default()
        };
        let outcome = match action {
            "add" => nodes.add().map(|(name, start_s, m, s)| {
                ev.node = name;
                ev.start_s = start_s;
                (m, s)
            }),
            _ => {
                ev.node = before.first().cloned().unwrap_or_default();
                nodes.remove(&ev.node)
            }
        };
        match outcome {
            Ok((m, s)) => {
                ev.seconds = s;
                ev.migration = Some(m);
                ev.expected_keys = moved(msgs, &before, &nodes.ring());
            }
            Err(e) => ev.error = Some(format!("{e:#}")),
        }
        ev.read_back = read_back(&nodes.addrs(), msgs);
        res.events.push(ev);
    }
    finish(nodes, dir);
    Ok(res)
}

/// Stops a ring's nodes and removes their data directories.
fn finish(nodes: Nodes, dir: &Path) {
    drop(nodes);
    let _ = std::fs::remove_dir_all(dir.join("data"));
}

/// A pseudo-random number generator (SplitMix64) for the clients' choice of messages.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// CPU ticks of this process and of every node.
fn ticks(nodes: &Nodes) -> (u64, Vec<u64>) {
    let me = kvlab_procfs::read_proc_stat(std::process::id()).map_or(0, |s| s.cpu_ticks());
    (me, nodes.cpu_ticks())
}

/// The CPU between two readings `wall` seconds apart, in cores.
fn cpu(before: &(u64, Vec<u64>), after: &(u64, Vec<u64>), wall: f64) -> Cpu {
    let hz = kvlab_procfs::clock_ticks_per_second().max(1) as f64;
    let cores = |a: u64, b: u64| b.saturating_sub(a) as f64 / hz / wall.max(1e-9);
    let per: Vec<f64> = before
        .1
        .iter()
        .zip(&after.1)
        .map(|(&a, &b)| cores(a, b))
        .collect();
    Cpu {
        client: cores(before.0, after.0),
        nodes: per.iter().sum(),
        busiest_node: per.iter().copied().fold(0.0, f64::max),
    }
}

/// The original's method: `clients` threads, each sending `ops` requests of random messages
/// one at a time; each client's ops/s over its own time.
fn method(
    nodes: &Nodes,
    msgs: &Messages,
    clients: usize,
    ops: usize,
    put: bool,
    seed: u64,
) -> anyhow::Result<MethodRun> {
    let seeds = nodes.addrs();
    let gate = Barrier::new(clients + 1);
    let mut before = (0, Vec::new());
    let mut started = Instant::now();
    let results: Vec<anyhow::Result<(f64, u64)>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..clients as u64)
            .map(|t| {
                let (seeds, gate) = (&seeds, &gate);
                s.spawn(move || {
                    let client = ClusterClient::connect(seeds, TIMEOUT);
                    gate.wait();
                    let mut c = client?;
                    let mut rng = seed ^ (t + 1).wrapping_mul(0xA076_1D64_78BD_642F);
                    let mut errors = 0;
                    let t0 = Instant::now();
                    for _ in 0..ops {
                        let i = next(&mut rng) % msgs.n;
                        let ok = if put {
                            matches!(c.set(msgs.key(i), msgs.value(i)), Ok(true))
                        } else {
                            matches!(c.get(msgs.key(i)), Ok(Some(v)) if v == msgs.value(i))
                        };
                        errors += u64::from(!ok);
                    }
                    Ok((ops as f64 / t0.elapsed().as_secs_f64().max(1e-9), errors))
                })
            })
            .collect();
        before = ticks(nodes);
        started = Instant::now();
        gate.wait();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a client panicked")))
            })
            .collect()
    });
    let wall = started.elapsed().as_secs_f64();
    let after = ticks(nodes);
    let mut run = MethodRun {
        servers: nodes.nodes.len(),
        clients,
        op: if put { "put" } else { "get" }.into(),
        cpu: cpu(&before, &after, wall),
        aggregate: (clients * ops) as f64 / wall.max(1e-9),
        ..MethodRun::default()
    };
    for r in results {
        let (rate, errors) = r?;
        run.per_client.push(rate);
        run.errors += errors;
    }
    Ok(run)
}

/// kvlab bench's closed loop through the ring: one thread, `clients` connections, only
/// PUTs or only GETs of the data set's records, for `duration` seconds.
fn bench(
    nodes: &Nodes,
    msgs: &Messages,
    clients: usize,
    put: bool,
    duration: f64,
    seed: u64,
) -> anyhow::Result<BenchPoint> {
    let opts = kvlab_bench::load::Options {
        cluster: Some(true),
        data: Some(msgs.path.clone()),
        threads: Some(1),
        connections: Some(clients),
        mix: Some(if put { "set=1" } else { "get=1" }.into()),
        verify: Some(!put),
        load: Some(false),
        duration: Some(duration),
        warmup: Some(0.5),
        seed: Some(seed),
        ..kvlab_bench::load::Options::default()
    };
    let seed_addr = *nodes.addrs().first().context("no node")?;
    let cfg = opts.to_load()?.config(seed_addr)?;
    let before = ticks(nodes);
    let t = Instant::now();
    let r = kvlab_bench::run::run(&cfg, &[], &mut |_| {})?;
    let c = cpu(&before, &ticks(nodes), t.elapsed().as_secs_f64());
    let k = &r.counters;
    Ok(BenchPoint {
        servers: nodes.nodes.len(),
        clients,
        op: if put { "put" } else { "get" }.into(),
        qps: r.throughput_qps,
        p50_us: r.latency.p50_us,
        p99_us: r.latency.p99_us,
        p999_us: r.latency.p99_9_us,
        errors: k.errors + k.timeouts + k.verify_errors + k.misses,
        cpu: c,
    })
}

/// The throughput part for one server count: a ring holding every message, then for each
/// client count PUT and GET the original's way, then kvlab bench's.
fn throughput(
    spec: &RingSpec,
    msgs: &Messages,
    bin: &Path,
    out: &Path,
    net: Option<Arc<Net>>,
    servers: usize,
    res: &mut RingResult,
) -> anyhow::Result<()> {
    let t = &spec.throughput;
    let dir = out.join(format!("throughput-{servers}"));
    let nodes = Nodes::start(servers, &spec.node_args, bin, &dir, net)?;
    let (_, errors) = fill(&nodes.addrs(), msgs)?;
    if errors > 0 {
        res.notes.push(format!(
            "{servers} servers: {errors} writes of the fill failed"
        ));
    }
    for &clients in &t.clients {
        for rep in 1..=t.repetitions {
            for put in [true, false] {
                let seed = spec.seed ^ (rep as u64) << 32 ^ (clients as u64) << 16;
                let mut run = method(&nodes, msgs, clients, t.ops_per_client, put, seed)?;
                run.repetition = rep;
                res.method.push(run);
            }
        }
    }
    if t.bench_duration > 0.0 {
        if (msgs.set.len() as u64) > msgs.n {
            res.notes.push(format!(
                "kvlab bench's GETs not run: the data set has {} records, only the first {} \
                 written",
                msgs.set.len(),
                msgs.n
            ));
        }
        for &clients in &t.clients {
            for put in [true, false] {
                if !put && (msgs.set.len() as u64) > msgs.n {
                    continue;
                }
                match bench(&nodes, msgs, clients, put, t.bench_duration, spec.seed) {
                    Ok(p) => res.bench.push(p),
                    Err(e) => res.notes.push(format!(
                        "kvlab bench, {servers} servers, {clients} clients: {e:#}"
                    )),
                }
            }
        }
    }
    finish(nodes, &dir);
    Ok(())
}

/// `args` with `flag`'s value set to `value` (any earlier `flag V` or `flag=V` taken out).
fn with_flag(args: &[String], flag: &str, value: &str) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len() + 2);
    let mut skip = false;
    for a in args {
        if skip {
            skip = false;
        } else if a == flag {
            skip = true;
        } else if !a.starts_with(&format!("{flag}=")) {
            out.push(a.clone());
        }
    }
    out.extend([flag.to_string(), value.to_string()]);
    out
}

/// A node's `stats` figure, 0 when absent.
fn stat(addr: SocketAddr, name: &str) -> u64 {
    kvlab_process::stats(addr, None, TIMEOUT)
        .ok()
        .and_then(|s| s.into_iter().find(|(k, _)| k == name))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// The cache part for one size and policy: one node holding every message, GETs the
/// original's way; the hit ratio from the node's gets and its store's reads.
#[allow(clippy::too_many_arguments)] // one point of the grid: what it is and where it goes
fn cache(
    spec: &RingSpec,
    msgs: &Messages,
    bin: &Path,
    out: &Path,
    net: Option<Arc<Net>>,
    size: usize,
    policy: &str,
    res: &mut RingResult,
) -> anyhow::Result<()> {
    let c = &spec.cache;
    let args = with_flag(&spec.node_args, "--cache-items", &size.to_string());
    let args = with_flag(&args, "--eviction", policy);
    let dir = out.join(format!("cache-{size}-{policy}"));
    let nodes = Nodes::start(1, &args, bin, &dir, net)?;
    let addr = nodes.addrs()[0];
    let (_, errors) = fill(&[addr], msgs)?;
    if errors > 0 {
        res.notes.push(format!(
            "cache {size} {policy}: {errors} writes of the fill failed"
        ));
    }
    // A get of a key still in the write-behind queue is served from it, not from the store:
    // the measured gets begin once the queue has drained, so a miss in the cache reads the
    // store (and counts in `durable_reads`).
    let deadline = Instant::now() + Duration::from_secs(60);
    while stat(addr, "durable_queued_bytes") > 0 {
        if Instant::now() > deadline {
            res.notes.push(format!(
                "cache {size} {policy}: the write-behind queue had not drained 60 s after the \
                 fill; gets served from it count as hits"
            ));
            break;
        }
        std::thread::sleep(Duration::from_millis(50)); // a probe: the node's own figure
    }
    for rep in 1..=c.repetitions {
        let (gets, reads) = (stat(addr, "cmd_get"), stat(addr, "durable_reads"));
        let seed = spec.seed ^ (rep as u64) << 32;
        let mut run = method(&nodes, msgs, c.clients, c.ops_per_client, false, seed)?;
        let (gets, reads) = (
            stat(addr, "cmd_get").saturating_sub(gets),
            stat(addr, "durable_reads").saturating_sub(reads),
        );
        run.repetition = rep;
        run.hit_ratio = (gets > 0).then(|| 1.0 - reads.min(gets) as f64 / gets as f64);
        run.cache = Some((size, policy.to_string()));
        res.cache.push(run);
    }
    finish(nodes, &dir);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_is_replaced_not_repeated() {
        let a: Vec<String> = ["-t", "1", "--cache-items", "9", "--eviction=lfu"]
            .map(String::from)
            .to_vec();
        let b = with_flag(&with_flag(&a, "--cache-items", "100"), "--eviction", "fifo");
        assert_eq!(b, ["-t", "1", "--cache-items", "100", "--eviction", "fifo"]);
    }
}
