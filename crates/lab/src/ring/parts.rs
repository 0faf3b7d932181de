//! Carrying out a storage-ring experiment: the messages, then each part (scale,
//! throughput, cache) on rings of its own, the clients as threads of this process or, placed
//! on hosts, as `kvlab lab ring-clients` processes there.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use kvlab_client::ClusterClient;
use kvlab_hosts::Started;
use kvlab_ring::{Ring, DEFAULT_VNODES};

use super::clients::{self, ClientsJob, ClientsOutcome, Messages, Route, TIMEOUT};
use super::report::write;
use super::{BenchPoint, Cpu, MethodRun, ReadBack, RingResult, RingSpec, ScaleEvent, ScaleResult};
use crate::nodes::etcd::{ClusterEtcd, EtcdAt};
use crate::nodes::{make_net, open_placement, Kind, Nodes, Site};
use crate::placement::{host_cpu, HostsReading, Placement};

/// Threads that write the messages and read them back.
const FILLERS: usize = 4;

/// Where the clients run: threads here, or processes on hosts.
struct Clients<'a> {
    msgs: &'a Messages,
    /// The placement and the client hosts, each with its path to the messages.
    hosts: Option<(&'a Placement, Vec<(String, String)>)>,
    /// Whether the messages on the hosts are the synthetic maildir.
    synthetic: bool,
    /// Where client processes' logs come back to.
    logs: &'a Path,
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
    if spec.memcached && spec.node_hosts.is_empty() && kvlab_process::which("memcached").is_none() {
        bail!("memcached = true: no memcached here (apt-get install memcached)");
    }
    let logs = out.join("logs");
    let etcd_at = spec.etcd_place()?;
    let placement = place(spec, out, bin, &logs, &etcd_at)?;
    let client_hosts = match &placement {
        Some(pl) if !spec.client_hosts.is_empty() => {
            Some((pl.as_ref(), prepare_clients(spec, pl, &msgs)?))
        }
        _ => None,
    };
    if let Some(pl) = &placement {
        res.hosts = pl.meta(&Default::default());
        res.placement = Some((spec.node_hosts.clone(), spec.client_hosts.clone()));
    }
    let clients = Clients {
        msgs: &msgs,
        hosts: client_hosts,
        synthetic: spec.data.is_none(),
        logs: &logs,
    };
    let net = match spec.netns {
        true => Some(Arc::new(make_net(&out.join("net"))?)),
        false => None,
    };
    let save = |res: &RingResult| crate::runner::write_json(&out.join("ring.json"), res);
    let etcd = ClusterEtcd::start(&etcd_at, placement.as_ref(), out, &logs)?;
    res.topology = etcd.as_ref().map_or("file".into(), ClusterEtcd::describe);
    res.etcd = etcd.as_ref().and_then(ClusterEtcd::placed);
    let site = Site {
        replicas: 1,
        durable: true,
        net: net.clone(),
        hosts: placement
            .clone()
            .filter(|_| !spec.node_hosts.is_empty())
            .map(|pl| (pl, spec.node_hosts.clone())),
        etcd: etcd.as_ref().map(|e| e.addr().to_string()),
    };
    if spec.scale.nodes > 0 {
        match scale(spec, &msgs, bin, &out.join("scale"), &site) {
            Ok(s) => res.scale = Some(s),
            Err(e) => res.notes.push(format!("the scale part failed: {e:#}")),
        }
        save(&res)?;
    }
    for &servers in &spec.throughput.servers {
        let r = throughput(spec, &clients, bin, out, &site, servers, &mut res);
        if let Err(e) = r {
            res.notes
                .push(format!("throughput with {servers} servers failed: {e:#}"));
        }
        save(&res)?;
    }
    for &size in &spec.cache.sizes {
        for policy in &spec.cache.policies {
            let point = (size, policy.as_str());
            if let Err(e) = cache(spec, &clients, bin, out, &site, point, &mut res) {
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
    // The placement's other holders gone first (etcd after every ring): its teardown is
    // the last word.
    drop(site);
    drop(etcd);
    if let Some(pl) = placement {
        let end = pl.finish()?;
        res.hosts = pl.meta(&end);
    }
    save(&res)?;
    write(out, &res)
}

/// The experiment's hosts connected and prepared (none when no role names one): kvlab
/// shipped, the run directories made, memcached checked on the node hosts when it runs and
/// etcd on its host.
fn place(
    spec: &RingSpec,
    out: &Path,
    bin: &Path,
    logs: &Path,
    etcd: &EtcdAt,
) -> anyhow::Result<Option<Arc<Placement>>> {
    if !spec.on_hosts() {
        return Ok(None);
    }
    let (hosts, ssh) = spec.placed()?;
    let mut needs: Vec<(&str, Vec<&str>)> = Vec::new();
    if spec.memcached {
        needs.extend(
            spec.node_hosts
                .iter()
                .map(|h| (h.as_str(), vec!["memcached"])),
        );
    }
    if let EtcdAt::Host(h) = etcd {
        needs.push((h.as_str(), vec!["etcd"]));
    }
    open_placement(&hosts, &ssh, bin, out, logs, &needs)
}

/// Each client host's path to the messages, checked to hold the same messages as here
/// (`kvlab lab ring-clients --prepare`: the synthetic maildir written in its run directory,
/// or the data set at the same path).
fn prepare_clients(
    spec: &RingSpec,
    pl: &Placement,
    msgs: &Messages,
) -> anyhow::Result<Vec<(String, String)>> {
    let want = msgs.digest();
    let mut out = Vec::new();
    for h in &spec.client_hosts {
        if out.iter().any(|(x, _)| x == h) {
            continue;
        }
        let path = match &spec.data {
            Some(d) => d.display().to_string(),
            None => format!("{}/maildir", pl.run_dir(h)?),
        };
        let mut argv = vec![
            pl.kvlab(h)?,
            "lab".into(),
            "ring-clients".into(),
            "--prepare".into(),
            "--data".into(),
            path.clone(),
            "--messages".into(),
            spec.messages.to_string(),
        ];
        if spec.data.is_none() {
            argv.push("--synthetic".into());
        }
        eprintln!("hosts: {h}: the messages at {path}");
        let got = pl
            .run_for(
                h,
                "preparing the messages",
                &kvlab_hosts::quote_all(&argv),
                Duration::from_secs(600),
            )?
            .trim()
            .to_string();
        if got != want {
            bail!(
                "host {h}: the messages at {path} are not the lab's ({got:?}, here {want:?}): \
                 give every client host the same data set at the same path"
            );
        }
        out.push((h.clone(), path));
    }
    Ok(out)
}

/// The data set `data` names, or a synthetic maildir written into `out/maildir`.
fn messages(spec: &RingSpec, out: &Path) -> anyhow::Result<Messages> {
    match &spec.data {
        Some(p) => Messages::load(p, spec.messages, false),
        None => Messages::load(&out.join("maildir"), spec.messages, true),
    }
}

/// Splits `0..n` over [`FILLERS`] threads, each with a cluster client; sums what `f`
/// counted for each index (the first count: errors).
fn each_message(
    route: &Route,
    msgs: &Messages,
    f: &(dyn Fn(&mut ClusterClient, u64) -> [u64; 3] + Sync),
) -> anyhow::Result<[u64; 3]> {
    let totals: Vec<anyhow::Result<[u64; 3]>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..FILLERS as u64)
            .map(|t| {
                s.spawn(move || {
                    let mut c = route.connect()?;
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
fn fill(route: &Route, msgs: &Messages) -> anyhow::Result<(f64, u64)> {
    let t = Instant::now();
    let [errors, _, _] = each_message(
        route,
        msgs,
        &|c, i| match c.set(msgs.key(i), msgs.value(i)) {
            Ok(true) => [0, 0, 0],
            _ => [1, 0, 0],
        },
    )?;
    Ok((t.elapsed().as_secs_f64(), errors))
}

/// Reads every message back and compares its bytes.
fn read_back(route: &Route, msgs: &Messages) -> ReadBack {
    let t = Instant::now();
    let r = each_message(route, msgs, &|c, i| match c.get(msgs.key(i)) {
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
/// removed, every message read back after each. On hosts (`site`'s, with etcd), node i on
/// the node hosts' i-th in turn — the added one too —, the removed one stopped there.
fn scale(
    spec: &RingSpec,
    msgs: &Messages,
    bin: &Path,
    dir: &Path,
    site: &Site,
) -> anyhow::Result<ScaleResult> {
    let mut nodes = Nodes::start(
        Kind::Kvlab,
        spec.scale.nodes,
        &spec.node_args,
        bin,
        dir,
        site.clone(),
    )?;
    let placed = Nodes::placed;
    let (fill_s, fill_errors) = fill(&Route::Cluster(nodes.addrs()), msgs)?;
    let mut res = ScaleResult {
        nodes: spec.scale.nodes,
        keys: msgs.n,
        fill_s,
        fill_errors,
        events: Vec::new(),
        placed: placed(&nodes),
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
                ev.host = nodes.host_of(&name);
                ev.node = name;
                ev.start_s = start_s;
                for p in placed(&nodes) {
                    if !res.placed.contains(&p) {
                        res.placed.push(p);
                    }
                }
                (m, s)
            }),
            _ => {
                ev.node = before.first().cloned().unwrap_or_default();
                ev.host = nodes.host_of(&ev.node);
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
        ev.read_back = read_back(&Route::Cluster(nodes.addrs()), msgs);
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

/// The route to `nodes`: through the cluster's ring, or a fixed ring of memcached servers.
fn route(nodes: &Nodes) -> Route {
    match nodes.kind() {
        Kind::Kvlab => Route::Cluster(nodes.addrs()),
        Kind::Memcached => Route::Fixed(nodes.addrs()),
    }
}

/// A reading of the nodes' CPU (local ones from /proc here, those on hosts with every
/// host's machine, in one round trip per host).
struct Reading {
    at: Instant,
    local: Vec<Option<f64>>,
    hosts: Option<HostsReading>,
}

/// The rings up (every system's, so a host's readings show them all) and what is read of
/// them: each ring's nodes on hosts, in order.
struct Rings<'a> {
    all: &'a [&'a Nodes],
    placement: Option<&'a Placement>,
}

impl Rings<'_> {
    fn procs(&self) -> Vec<Started> {
        self.all.iter().flat_map(|n| n.remote()).collect()
    }

    fn read(&self, of: &Nodes) -> Reading {
        let hosts = self.placement.map(|pl| pl.read(&self.procs()));
        Reading {
            at: hosts.as_ref().map_or_else(Instant::now, |h| h.at),
            local: of.local_cpu_s(),
            hosts,
        }
    }

    /// The CPU of `of`'s nodes and the clients between two readings, over `wall` seconds
    /// of requests (the nodes idle outside them); the hosts' machines over the readings.
    fn cpu(
        &self,
        of: &Nodes,
        a: &Reading,
        b: &Reading,
        wall: f64,
        client_s: f64,
    ) -> (Cpu, Vec<crate::placement::HostCpu>) {
        let procs = self.procs();
        // The index in `procs` of each of `of`'s nodes on a host.
        let mut remote = of.remote().into_iter();
        let per: Vec<f64> = a
            .local
            .iter()
            .zip(&b.local)
            .map(|(x, y)| match (x, y) {
                (Some(x), Some(y)) => (y - x).max(0.0),
                _ => {
                    let p = remote.next();
                    let i = p.and_then(|p| procs.iter().position(|q| *q == p));
                    let at = |r: &Reading| r.hosts.as_ref().and_then(|h| h.cpu.get(i?).copied()?);
                    match (at(a), at(b)) {
                        (Some(x), Some(y)) => (y - x).max(0.0),
                        _ => 0.0,
                    }
                }
            })
            .map(|s| s / wall.max(1e-9))
            .collect();
        let hosts = match (&a.hosts, &b.hosts) {
            (Some(x), Some(y)) => host_cpu(x, y, &procs),
            _ => Vec::new(),
        };
        let cpu = Cpu {
            client: client_s / wall.max(1e-9),
            nodes: per.iter().sum(),
            busiest_node: per.iter().copied().fold(0.0, f64::max),
        };
        (cpu, hosts)
    }
}

/// The original's method: `clients` threads, each sending `ops` requests of random messages
/// one at a time; each client's ops/s over its own time. Threads of this process, or split
/// over the client hosts.
#[allow(clippy::too_many_arguments)] // one measured run: what, against which ring, how
fn method(
    rings: &Rings,
    nodes: &Nodes,
    cl: &Clients,
    clients: usize,
    ops: usize,
    put: bool,
    seed: u64,
    tag: &str,
) -> anyhow::Result<MethodRun> {
    let job = ClientsJob {
        route: route(nodes),
        data: cl.msgs.path.clone(),
        synthetic: false,
        messages: cl.msgs.n as usize,
        clients,
        first: 0,
        ops,
        put,
        seed,
        start_at_ns: None,
    };
    let mut run = MethodRun {
        servers: nodes.nodes.len(),
        clients,
        op: if put { "put" } else { "get" }.into(),
        system: nodes.kind().name().into(),
        ..MethodRun::default()
    };
    let (outcomes, a, b) = match &cl.hosts {
        None => {
            let mut a = None;
            let o = clients::run(cl.msgs, &job, None, &mut || a = Some(rings.read(nodes)))?;
            let b = rings.read(nodes);
            (vec![o], a.unwrap_or_else(|| rings.read(nodes)), b)
        }
        Some((pl, hosts)) => {
            let (o, a, b, placed) = on_hosts(rings, nodes, pl, hosts, cl, &job, tag)?;
            run.placed = placed;
            (o, a, b)
        }
    };
    let wall = outcomes.iter().map(|o| o.wall_s).fold(0.0, f64::max);
    let client_s = outcomes.iter().map(|o| o.cpu_s).sum();
    let (cpu, hosts) = rings.cpu(nodes, &a, &b, wall, client_s);
    run.cpu = cpu;
    run.hosts = hosts;
    run.aggregate = (clients * ops) as f64 / wall.max(1e-9);
    if cl.hosts.is_some() {
        run.late_s = Some(outcomes.iter().map(|o| o.late_s).fold(0.0, f64::max));
    }
    if let Some(pl) = rings.placement {
        let mut placed: Vec<_> = nodes.remote().iter().map(|n| pl.described(n)).collect();
        placed.append(&mut run.placed);
        run.placed = placed;
    }
    for o in outcomes {
        run.per_client.extend(o.per_client);
        run.errors += o.errors;
    }
    Ok(run)
}

/// How long the client processes have between being started and the instant they start
/// together (loading the messages, connecting).
fn lead(messages: u64) -> Duration {
    Duration::from_millis(1500 + messages / 5)
}

/// `job`'s clients split over the client hosts (host j of k: `clients / k`, one more for
/// the first `clients % k`), each a `kvlab lab ring-clients` there, started together at an
/// instant set on its own clock; the nodes and hosts read just before it and after the
/// last ends. Returns each host's outcome, the readings, and where the clients ran.
#[allow(clippy::type_complexity)] // the outcomes, two readings, the processes
fn on_hosts(
    rings: &Rings,
    nodes: &Nodes,
    pl: &Placement,
    hosts: &[(String, String)],
    cl: &Clients,
    job: &ClientsJob,
    tag: &str,
) -> anyhow::Result<(
    Vec<ClientsOutcome>,
    Reading,
    Reading,
    Vec<crate::placement::PlacedProcess>,
)> {
    let k = hosts.len();
    let start = SystemTime::now() + lead(cl.msgs.n);
    let start_ns = start.duration_since(UNIX_EPOCH)?.as_nanos() as i128;
    let mut started: Vec<(Started, String)> = Vec::new();
    let mut first = 0;
    let launch = (|| -> anyhow::Result<()> {
        for (j, (h, data)) in hosts.iter().enumerate() {
            let n = job.clients / k + usize::from(j < job.clients % k);
            if n == 0 {
                continue;
            }
            let offset = pl.clock(h).map_or(0, |c| c.offset_ns);
            let name = format!("clients-{tag}-{h}");
            let result = format!("{}/{name}.json", pl.run_dir(h)?);
            let (flag, addrs) = match &job.route {
                Route::Cluster(a) => ("--kvlab", a),
                Route::Fixed(a) => ("--memcached", a),
            };
            let mut argv = vec![
                pl.kvlab(h)?,
                "lab".into(),
                "ring-clients".into(),
                flag.into(),
                addrs
                    .iter()
                    .map(|a| a.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
                "--data".into(),
                data.clone(),
                "--messages".into(),
                job.messages.to_string(),
                "--clients".into(),
                n.to_string(),
                "--first".into(),
                first.to_string(),
                "--ops".into(),
                job.ops.to_string(),
                "--op".into(),
                if job.put { "put" } else { "get" }.into(),
                "--seed".into(),
                job.seed.to_string(),
                "--start-at-ns".into(),
                (start_ns + i128::from(offset)).to_string(),
                "--json".into(),
                result.clone(),
            ];
            if cl.synthetic {
                argv.push("--synthetic".into());
            }
            first += n;
            started.push((pl.start(h, &name, &argv)?, result));
        }
        Ok(())
    })();
    let stop_all = |started: &[(Started, String)]| {
        for (p, _) in started {
            pl.stop(p, &cl.logs.join(format!("{}.log", p.name)));
        }
    };
    if let Err(e) = launch {
        stop_all(&started);
        return Err(e);
    }
    // The nodes and hosts read just before the start.
    if let Ok(wait) = (start - Duration::from_millis(100)).duration_since(SystemTime::now()) {
        std::thread::sleep(wait); // the instant set for the clients
    }
    let a = rings.read(nodes);
    let limit = Instant::now() + Duration::from_secs(120) + TIMEOUT * job.ops as u32 / 10;
    let mut left: Vec<&Started> = started.iter().map(|(p, _)| p).collect();
    while !left.is_empty() {
        let mut still = Vec::new();
        for p in left {
            if pl.remote(&p.host)?.running(p)? {
                still.push(p);
            }
        }
        left = still;
        if left.is_empty() {
            break;
        }
        if Instant::now() > limit {
            stop_all(&started);
            bail!("the clients on {} did not end in time", left[0].host);
        }
        std::thread::sleep(Duration::from_millis(50)); // a probe: each process's state
    }
    let b = rings.read(nodes);
    let placed = started.iter().map(|(p, _)| pl.described(p)).collect();
    let mut outcomes = Vec::new();
    for (p, result) in &started {
        let text = pl.run(
            &p.host,
            "reading the clients' result",
            &format!("cat {} 2>/dev/null || true", kvlab_hosts::quote(result)),
        );
        match text
            .ok()
            .and_then(|t| serde_json::from_str::<ClientsOutcome>(&t).ok())
        {
            Some(o) => outcomes.push(o),
            None => {
                stop_all(&started);
                let log = std::fs::read_to_string(cl.logs.join(format!("{}.log", p.name)))
                    .unwrap_or_default();
                bail!(
                    "host {}: {} left no result: {}",
                    p.host,
                    p.name,
                    log.trim().lines().last().unwrap_or("(no log)")
                );
            }
        }
    }
    stop_all(&started);
    Ok((outcomes, a, b, placed))
}

/// kvlab bench's closed loop through the ring: one thread, `clients` connections, only
/// PUTs or only GETs of the data set's records, for `duration` seconds.
fn bench(
    rings: &Rings,
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
    let before = rings.read(nodes);
    let me0 = kvlab_procfs::own_cpu_s();
    let r = kvlab_bench::run::run(&cfg, &[], &mut |_| {})?;
    let after = rings.read(nodes);
    let wall = (after.at - before.at).as_secs_f64();
    let (c, _) = rings.cpu(
        nodes,
        &before,
        &after,
        wall,
        kvlab_procfs::own_cpu_s() - me0,
    );
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

/// The throughput part for one server count: a ring holding every message (and, with
/// `memcached = true`, memcached servers holding them too), then for each client count,
/// repetition and op the original's way against each system in turn (A B A B), then
/// kvlab bench's.
fn throughput(
    spec: &RingSpec,
    cl: &Clients,
    bin: &Path,
    out: &Path,
    site: &Site,
    servers: usize,
    res: &mut RingResult,
) -> anyhow::Result<()> {
    let t = &spec.throughput;
    let msgs = cl.msgs;
    let dir = out.join(format!("throughput-{servers}"));
    let mut systems = vec![Nodes::start(
        Kind::Kvlab,
        servers,
        &spec.node_args,
        bin,
        &dir,
        site.clone(),
    )?];
    if spec.memcached {
        let mdir = out.join(format!("throughput-{servers}-memcached"));
        systems.push(Nodes::start(
            Kind::Memcached,
            servers,
            &spec.memcached_args,
            bin,
            &mdir,
            site.clone(),
        )?);
    }
    for nodes in &systems {
        let (_, errors) = fill(&route(nodes), msgs)?;
        if errors > 0 {
            res.notes.push(format!(
                "{servers} {} servers: {errors} writes of the fill failed",
                nodes.kind().name()
            ));
        }
    }
    let all: Vec<&Nodes> = systems.iter().collect();
    let rings = Rings {
        all: &all,
        placement: site
            .hosts
            .as_ref()
            .map(|(pl, _)| pl.as_ref())
            .or(cl.hosts.as_ref().map(|(pl, _)| *pl)),
    };
    let mut n = 0;
    for &clients in &t.clients {
        for rep in 1..=t.repetitions {
            for put in [true, false] {
                for nodes in &systems {
                    let seed = spec.seed ^ (rep as u64) << 32 ^ (clients as u64) << 16;
                    n += 1;
                    let tag = format!("{servers}-{n}");
                    let mut run = method(
                        &rings,
                        nodes,
                        cl,
                        clients,
                        t.ops_per_client,
                        put,
                        seed,
                        &tag,
                    )?;
                    run.repetition = rep;
                    res.method.push(run);
                }
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
                match bench(
                    &rings,
                    &systems[0],
                    msgs,
                    clients,
                    put,
                    t.bench_duration,
                    spec.seed,
                ) {
                    Ok(p) => res.bench.push(p),
                    Err(e) => res.notes.push(format!(
                        "kvlab bench, {servers} servers, {clients} clients: {e:#}"
                    )),
                }
            }
        }
    }
    for nodes in systems {
        finish(nodes, &dir);
    }
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

/// The cache part for one size and policy: one node holding every message (on hosts, on
/// the first node host), GETs the original's way (by `cl`: threads here or processes on the
/// client hosts); the hit ratio from the node's gets and its store's reads.
fn cache(
    spec: &RingSpec,
    cl: &Clients,
    bin: &Path,
    out: &Path,
    site: &Site,
    (size, policy): (usize, &str),
    res: &mut RingResult,
) -> anyhow::Result<()> {
    let c = &spec.cache;
    let msgs = cl.msgs;
    let args = with_flag(&spec.node_args, "--cache-items", &size.to_string());
    let args = with_flag(&args, "--eviction", policy);
    let dir = out.join(format!("cache-{size}-{policy}"));
    let nodes = Nodes::start(Kind::Kvlab, 1, &args, bin, &dir, site.clone())?;
    let addr = nodes.addrs()[0];
    let (_, errors) = fill(&Route::Cluster(vec![addr]), msgs)?;
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
        let rings = Rings {
            all: &[&nodes],
            placement: site
                .hosts
                .as_ref()
                .map(|(pl, _)| pl.as_ref())
                .or(cl.hosts.as_ref().map(|(pl, _)| *pl)),
        };
        let tag = format!("cache-{size}-{policy}-{rep}");
        let mut run = method(
            &rings,
            &nodes,
            cl,
            c.clients,
            c.ops_per_client,
            false,
            seed,
            &tag,
        )?;
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
