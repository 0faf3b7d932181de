//! The report of a storage-ring experiment: the original's figures beside kvlab's, then a
//! table per part, and the summary `kvlab lab` prints.

use std::path::{Path, PathBuf};

use kvlab_report::{Item, Note, Report, Row, Section, Table};

use super::{Cpu, MethodRun, RingResult, ScaleEvent};

/// The scale targets: each migration under this many seconds, nothing lost.
const SCALE_TARGET_S: f64 = 0.2;
/// The GET target: this many times the original's ops/s per client.
const GET_TARGET_X: f64 = 100.0;
/// The durable ring's GET per client against memcached's behind the same client ring.
const MEMCACHED_TARGET_X: f64 = 0.95;

/// Which process was busy over a measured time, in words.
pub(super) fn regime(c: &Cpu, cpus: usize) -> String {
    let who = if c.client >= c.busiest_node {
        format!("client {:.2} cores", c.client)
    } else {
        format!("a node {:.2} cores (nodes {:.2})", c.busiest_node, c.nodes)
    };
    if c.client + c.nodes >= 0.85 * cpus as f64 {
        format!("CPU-bound: {cpus} cores busy; busiest {who}")
    } else if c.busiest_node >= 0.85 && c.busiest_node > c.client {
        format!("node-bound: {who}")
    } else {
        format!("latency-bound: none saturated; busiest {who}")
    }
}

/// Runs of one point (repetitions): mean and standard deviation of the per-client mean,
/// the mean aggregate, errors summed, the CPU averaged.
struct Point<'a> {
    first: &'a MethodRun,
    per_client: (f64, f64),
    aggregate: f64,
    errors: u64,
    cpu: Cpu,
    hit_ratio: Option<f64>,
    reps: usize,
    /// Placed on hosts: the busiest host (by its share of its CPUs busy, averaged over the
    /// repetitions).
    host: Option<BusyHost>,
}

/// A host's machine over a point's runs, averaged.
struct BusyHost {
    name: String,
    busy: f64,
    cpus: usize,
    /// The lab's node processes there, cores.
    nodes: f64,
}

/// The busiest host over `runs` (each host's busy cores averaged over the runs).
fn busiest_host(runs: &[&MethodRun]) -> Option<BusyHost> {
    let mut hosts: Vec<BusyHost> = Vec::new();
    let n = runs.len().max(1) as f64;
    for r in runs {
        for c in &r.hosts {
            // `+ 0.0`: an empty sum is -0.0.
            let nodes: f64 = c.processes.iter().map(|(_, x)| x).sum::<f64>() + 0.0;
            match hosts.iter_mut().find(|h| h.name == c.host) {
                Some(h) => {
                    h.busy += c.busy_cores / n;
                    h.nodes += nodes / n;
                    // Counted from the ticks over a short span: the largest count read.
                    h.cpus = h.cpus.max(c.cpus);
                }
                None => hosts.push(BusyHost {
                    name: c.host.clone(),
                    busy: c.busy_cores / n,
                    cpus: c.cpus,
                    nodes: nodes / n,
                }),
            }
        }
    }
    hosts.into_iter().max_by(|a, b| {
        let share = |h: &BusyHost| h.busy / h.cpus.max(1) as f64;
        share(a).total_cmp(&share(b))
    })
}

/// Which process was busy at a point, in words: on hosts, the busiest host's machine first
/// (namespaces of one machine each see the whole machine).
fn regime_of(p: &Point, cpus: usize) -> String {
    let Some(h) = &p.host else {
        return regime(&p.cpu, cpus);
    };
    let cores = if h.cpus > 0 { h.cpus } else { cpus };
    if h.busy >= 0.85 * cores as f64 {
        format!(
            "CPU-bound: host {} busy {:.2} of {cores} cores, the lab's nodes there {:.2} and \
             the clients {:.2} (all hosts): the rest is other processes",
            h.name, h.busy, h.nodes, p.cpu.client
        )
    } else {
        format!(
            "{}; busiest host {} {:.2} of {cores} cores",
            regime(&p.cpu, cpus),
            h.name,
            h.busy
        )
    }
}

fn points<'a, K: PartialEq>(
    runs: &'a [MethodRun],
    key: impl Fn(&MethodRun) -> K,
) -> Vec<Point<'a>> {
    let mut out: Vec<Point<'a>> = Vec::new();
    let mut keys: Vec<K> = Vec::new();
    for r in runs {
        let k = key(r);
        if keys.contains(&k) {
            continue;
        }
        let group: Vec<&MethodRun> = runs.iter().filter(|x| key(x) == k).collect();
        keys.push(k);
        let n = group.len() as f64;
        let means: Vec<f64> = group.iter().map(|r| r.mean_per_client()).collect();
        let mean = means.iter().sum::<f64>() / n;
        let sd = if group.len() > 1 {
            (means.iter().map(|m| (m - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
        } else {
            0.0
        };
        let avg = |f: &dyn Fn(&MethodRun) -> f64| group.iter().map(|r| f(r)).sum::<f64>() / n;
        let hits: Vec<f64> = group.iter().filter_map(|r| r.hit_ratio).collect();
        out.push(Point {
            first: r,
            per_client: (mean, sd),
            aggregate: avg(&|r| r.aggregate),
            errors: group.iter().map(|r| r.errors).sum(),
            cpu: Cpu {
                client: avg(&|r| r.cpu.client),
                nodes: avg(&|r| r.cpu.nodes),
                busiest_node: avg(&|r| r.cpu.busiest_node),
            },
            hit_ratio: (!hits.is_empty()).then(|| hits.iter().sum::<f64>() / hits.len() as f64),
            reps: group.len(),
            host: busiest_host(&group),
        });
    }
    out
}

/// A point of the throughput part: system, servers, clients, op.
fn method_key(r: &MethodRun) -> (String, usize, usize, String) {
    (r.system().to_string(), r.servers, r.clients, r.op.clone())
}

/// The GET figure the original's way with 2 servers and 5 clients, if measured.
fn get_2x5(res: &RingResult) -> Option<Point<'_>> {
    points(&res.method, method_key).into_iter().find(|p| {
        p.first.system() == "kvlab"
            && p.first.servers == 2
            && p.first.clients == 5
            && p.first.op == "get"
    })
}

/// The durable ring's points beside memcached's at the same servers, clients and op:
/// (kvlab, memcached, kvlab's per-client mean over memcached's).
fn against_memcached(res: &RingResult) -> Vec<(Point<'_>, Point<'_>, f64)> {
    let pts = points(&res.method, method_key);
    let (mut kv, mut mc): (Vec<Point>, Vec<Point>) =
        pts.into_iter().partition(|p| p.first.system() == "kvlab");
    let mut out = Vec::new();
    for k in kv.drain(..) {
        let same = |m: &Point| {
            m.first.servers == k.first.servers
                && m.first.clients == k.first.clients
                && m.first.op == k.first.op
        };
        if let Some(i) = mc.iter().position(same) {
            let m = mc.remove(i);
            let ratio = k.per_client.0 / m.per_client.0.max(1e-9);
            out.push((k, m, ratio));
        }
    }
    out
}

fn memcached_table(res: &RingResult) -> Option<Table> {
    let pairs = against_memcached(res);
    if pairs.is_empty() {
        return None;
    }
    let rows = pairs
        .iter()
        .map(|(k, m, ratio)| {
            let get = k.first.op == "get";
            let met = *ratio >= MEMCACHED_TARGET_X && k.errors == 0 && m.errors == 0;
            Row::new([
                k.first.servers.to_string(),
                k.first.clients.to_string(),
                k.first.op.to_uppercase(),
                format!("{:.0} ± {:.0}", k.per_client.0, k.per_client.1),
                format!("{:.0} ± {:.0}", m.per_client.0, m.per_client.1),
                format!("{ratio:.3}×"),
                if get {
                    format!("≥ {MEMCACHED_TARGET_X}×")
                } else {
                    "–".into()
                },
                if !get {
                    "–".into()
                } else if met {
                    "yes".into()
                } else {
                    "no".into()
                },
                format!("{} / {}", k.errors, m.errors),
                format!("{} | {}", regime_of(k, res.cpus), regime_of(m, res.cpus)),
            ])
            .highlighted(get && !met)
        })
        .collect();
    Some(Table {
        title: "The durable ring against memcached behind the same client ring".into(),
        columns: [
            "servers",
            "clients",
            "op",
            "kvlab ops/s per client",
            "memcached ops/s per client",
            "kvlab / memcached",
            "target",
            "met",
            "errors (kvlab / memcached)",
            "regime (kvlab | memcached)",
        ]
        .map(String::from)
        .to_vec(),
        rows,
        caption: Some(
            "Both systems loaded by the same clients, the same way (the same seeds: the same \
             messages in the same order), placed on the same hosts, their runs alternated; \
             memcached's servers behind a fixed client ring of them (the same consistent \
             hashing as the cluster's ring, nothing fetched, no redirects). Mean ± sd over \
             the repetitions of the per-client mean."
                .into(),
        ),
    })
}

/// Each host's machine and the lab's processes on it, averaged over each system's runs.
fn hosts_table(res: &RingResult) -> Option<Table> {
    if res.hosts.is_empty() {
        return None;
    }
    let mut rows = Vec::new();
    let clocks = |h: &crate::placement::HostMeta| {
        format!(
            "{} / {}",
            h.clock_start.map_or("-".into(), |c| c.to_string()),
            h.clock_end.map_or("-".into(), |c| c.to_string())
        )
    };
    for h in &res.hosts {
        let before = rows.len();
        for system in ["kvlab", "memcached"] {
            let runs: Vec<&MethodRun> = res
                .method
                .iter()
                .filter(|r| r.system() == system && !r.hosts.is_empty())
                .collect();
            let cpus: Vec<&crate::placement::HostCpu> = runs
                .iter()
                .flat_map(|r| r.hosts.iter().filter(|c| c.host == h.name))
                .collect();
            if cpus.is_empty() {
                continue;
            }
            let n = cpus.len() as f64;
            let busy = cpus.iter().map(|c| c.busy_cores).sum::<f64>() / n;
            let steal = cpus.iter().map(|c| c.steal).sum::<f64>() / n;
            // The processes of this system's nodes and of the clients on the host.
            let mut procs: Vec<(String, f64, usize)> = Vec::new();
            for c in &cpus {
                for (name, cores) in &c.processes {
                    if !name.starts_with(system) {
                        continue;
                    }
                    match procs.iter_mut().find(|p| &p.0 == name) {
                        Some(p) => (p.1, p.2) = (p.1 + cores, p.2 + 1),
                        None => procs.push((name.clone(), *cores, 1)),
                    }
                }
            }
            let clients: Vec<&crate::placement::PlacedProcess> = runs
                .iter()
                .flat_map(|r| r.placed.iter())
                .filter(|p| p.host == h.name && p.name.starts_with("clients-"))
                .collect();
            let mut what: Vec<String> = procs
                .iter()
                .map(|(n, c, k)| format!("{n} {:.2}", c / *k as f64))
                .collect();
            if !clients.is_empty() {
                let per = runs
                    .iter()
                    .filter(|r| {
                        r.placed
                            .iter()
                            .any(|p| p.host == h.name && p.name.starts_with("clients-"))
                    })
                    .map(|r| r.cpu.client)
                    .sum::<f64>()
                    / runs.len().max(1) as f64;
                what.push(format!(
                    "client processes ({} runs; all hosts' clients {:.2})",
                    clients.len() / runs.len().max(1),
                    per
                ));
            }
            rows.push(Row::new([
                h.name.clone(),
                h.reach.clone(),
                system.to_string(),
                format!("{busy:.2}"),
                format!("{:.1}%", 100.0 * steal),
                if what.is_empty() {
                    "-".into()
                } else {
                    what.join("; ")
                },
                clocks(h),
            ]));
        }
        if rows.len() == before {
            // No measured run read it: what ran there (the scale part's nodes, etcd).
            let scale = res.scale.iter().flat_map(|s| &s.placed);
            let mut what: Vec<String> = scale
                .chain(&res.etcd)
                .filter(|p| p.host == h.name)
                .map(|p| p.name.clone())
                .collect();
            what.dedup();
            rows.push(Row::new([
                h.name.clone(),
                h.reach.clone(),
                "-".into(),
                "-".into(),
                "-".into(),
                if what.is_empty() {
                    "-".into()
                } else {
                    what.join(", ")
                },
                clocks(h),
            ]));
        }
    }
    Some(Table {
        title: "Hosts".into(),
        columns: [
            "host",
            "reached",
            "runs of",
            "busy cores (mean)",
            "steal",
            "the lab's processes there (cores)",
            "clock at the start / the end",
        ]
        .map(String::from)
        .to_vec(),
        rows,
        caption: Some(
            "Each host's busy cores (/proc/stat) from just before the clients' start to just \
             after the last ended, averaged over each system's runs; the nodes' CPU over the \
             same span. Hosts that are namespaces of one machine share its cores: their busy \
             cores are each the whole machine's."
                .into(),
        ),
    })
}

fn event<'a>(res: &'a RingResult, action: &str) -> Option<&'a ScaleEvent> {
    res.scale
        .as_ref()
        .and_then(|s| s.events.iter().find(|e| e.action == action))
}

/// "Original vs kvlab": a row per figure the original published.
fn comparison(res: &RingResult) -> Table {
    let o = &res.original;
    let mut rows = Vec::new();
    for (label, orig, action) in [
        ("scale down by one server (s)", o.scale_down_s, "remove"),
        ("scale up by one server (s)", o.scale_up_s, "add"),
    ] {
        let Some(orig) = orig else { continue };
        let e = event(res, action);
        let (kv, ratio, met) = match e {
            Some(e) if e.error.is_none() => (
                format!(
                    "{:.3} ({} nodes, {} messages, {} lost)",
                    e.seconds,
                    e.nodes_before,
                    e.keys,
                    e.read_back.lost()
                ),
                format!("{:.0}× faster", orig / e.seconds.max(1e-9)),
                e.seconds < SCALE_TARGET_S && e.read_back.lost() == 0 && e.read_back.errors == 0,
            ),
            Some(e) => (
                format!("failed: {}", e.error.clone().unwrap_or_default()),
                "–".into(),
                false,
            ),
            None => ("not measured".into(), "–".into(), false),
        };
        rows.push(
            Row::new([
                label.to_string(),
                format!("{orig}"),
                kv,
                ratio,
                format!("< {SCALE_TARGET_S} s, 0 lost"),
                if met { "yes" } else { "no" }.to_string(),
            ])
            .highlighted(!met),
        );
    }
    if let Some(orig) = o.get_ops_per_client {
        let p = get_2x5(res);
        let (kv, ratio, met) = match &p {
            Some(p) => (
                format!(
                    "{:.0} per client ({:.0} all clients); {}",
                    p.per_client.0,
                    p.aggregate,
                    regime_of(p, res.cpus)
                ),
                format!("{:.0}×", p.per_client.0 / orig),
                p.per_client.0 >= GET_TARGET_X * orig && p.errors == 0,
            ),
            None => ("not measured".into(), "–".into(), false),
        };
        rows.push(
            Row::new([
                "GET ops/s per client, 2 servers, 5 clients (the original's method)".to_string(),
                format!("{orig}"),
                kv,
                ratio,
                format!("≥ {GET_TARGET_X:.0}× ({:.0})", GET_TARGET_X * orig),
                if met { "yes" } else { "no" }.to_string(),
            ])
            .highlighted(!met),
        );
    }
    Table {
        title: "The original's figures beside kvlab's".into(),
        columns: ["figure", "the original", "kvlab", "ratio", "target", "met"]
            .map(String::from)
            .to_vec(),
        rows,
        caption: Some(
            "The original's figures are the constants of the experiment file's [original] \
             table, as the original published them (three laptops); kvlab's were measured \
             by this run on one machine."
                .into(),
        ),
    }
}

fn scale_table(res: &RingResult) -> Option<Table> {
    let s = res.scale.as_ref()?;
    let rows = s
        .events
        .iter()
        .map(|e| {
            let m = e.migration.as_ref();
            let moved = m.map_or(0, |m| m.keys_copied);
            let bad = e.error.is_some() || e.read_back.lost() > 0 || e.read_back.errors > 0;
            Row::new([
                match &e.host {
                    Some(h) => format!("{} {} on {h}", e.action, e.node),
                    None => format!("{} {}", e.action, e.node),
                },
                format!(
                    "{} → {}",
                    e.nodes_before,
                    if e.action == "add" {
                        e.nodes_before + 1
                    } else {
                        e.nodes_before.saturating_sub(1)
                    }
                ),
                format!("{:.3}", e.seconds),
                m.map_or("-".into(), |m| {
                    format!("{:.3} / {:.3}", m.copy_s, m.handoff_s)
                }),
                if e.action == "add" {
                    format!("{:.2}", e.start_s)
                } else {
                    "-".into()
                },
                m.map_or("-".into(), |_| moved.to_string()),
                format!(
                    "{} ({:.1}%; 1/N: {:.1}%)",
                    e.expected_keys,
                    100.0 * e.expected_keys as f64 / e.keys.max(1) as f64,
                    100.0 / (e.nodes_before.max(1) + usize::from(e.action == "add")) as f64
                ),
                m.map_or("-".into(), |m| m.refused.to_string()),
                format!("{} / {}", e.read_back.read, e.read_back.lost()),
                e.read_back.errors.to_string(),
                e.error.clone().unwrap_or_else(|| "ok".into()),
            ])
            .highlighted(bad)
        })
        .collect();
    Some(Table {
        title: "Scale up and down by one server".into(),
        columns: [
            "event",
            "nodes",
            "took (s)",
            "copy / hand-off (s)",
            "node start (s)",
            "keys moved",
            "expected (ring)",
            "refused",
            "read back / lost",
            "read errors",
            "outcome",
        ]
        .map(String::from)
        .to_vec(),
        rows,
        caption: Some(format!(
            "{} messages written to {} durable nodes in {:.2} s ({} failed). \"took\": the \
             migration, from the coordinator's start to its end (the added node's own start \
             apart). Expected: the messages whose owner differs between the rings before and \
             after; keys moved: the items the migration's snapshots sent (a durable node's pass \
             may send a key both cached and on disk twice, so it can exceed the expected). \
             Every message was read back after each event and compared byte for byte: lost = \
             missing or other bytes.",
            s.keys, s.nodes, s.fill_s, s.fill_errors
        )),
    })
}

fn method_table(res: &RingResult, title: &str, runs: &[MethodRun], cache: bool) -> Table {
    let pts = if cache {
        points(runs, |r| r.cache.clone())
    } else {
        points(runs, |r| {
            let (s, n, c, o) = method_key(r);
            (Some(s), n, c, o)
        })
    };
    let rows = pts
        .iter()
        .map(|p| {
            let r = p.first;
            let mut cells = Vec::new();
            match &r.cache {
                Some((size, policy)) if cache => {
                    cells.extend([size.to_string(), policy.clone()]);
                }
                _ => cells.extend([
                    r.servers.to_string(),
                    r.clients.to_string(),
                    match r.system() {
                        "kvlab" => r.op.to_uppercase(),
                        other => format!("{} ({other})", r.op.to_uppercase()),
                    },
                ]),
            }
            cells.extend([
                format!("{:.0} ± {:.0}", p.per_client.0, p.per_client.1),
                format!("{:.0}", p.aggregate),
            ]);
            if cache {
                cells.push(
                    p.hit_ratio
                        .map_or("-".into(), |h| format!("{:.1}%", 100.0 * h)),
                );
            }
            cells.extend([
                p.errors.to_string(),
                format!(
                    "{:.2} / {:.2} ({:.2})",
                    p.cpu.client, p.cpu.nodes, p.cpu.busiest_node
                ),
                regime_of(p, res.cpus),
            ]);
            Row::new(cells).highlighted(p.errors > 0)
        })
        .collect();
    let mut columns: Vec<String> = if cache {
        vec!["cache (entries)".into(), "policy".into()]
    } else {
        vec!["servers".into(), "clients".into(), "op".into()]
    };
    columns.extend([
        "ops/s per client (mean ± sd over repetitions)".into(),
        "ops/s all clients".into(),
    ]);
    if cache {
        columns.push("cache hit ratio".into());
    }
    columns.extend([
        "errors".into(),
        "CPU cores: client / nodes (busiest node)".into(),
        "regime".into(),
    ]);
    let reps = pts.first().map_or(0, |p| p.reps);
    Table {
        title: title.into(),
        columns,
        rows,
        caption: Some(format!(
            "Each client thread sends its requests one at a time (real messages, chosen at \
             random); its ops/s are its requests over its own time, averaged over the \
             clients, then over {reps} repetitions. Errors: failed requests, and GETs that \
             missed or returned other bytes. CPU: this process (the clients) and the nodes, \
             over the measured time.{}",
            if cache {
                " Hit ratio: 1 − the store's reads (`durable_reads`) / the node's gets."
            } else {
                ""
            }
        )),
    }
}

fn bench_table(res: &RingResult) -> Table {
    let rows = res
        .bench
        .iter()
        .map(|b| {
            Row::new([
                b.servers.to_string(),
                b.clients.to_string(),
                b.op.to_uppercase(),
                format!("{:.0}", b.qps),
                format!("{:.0}", b.p50_us),
                format!("{:.0}", b.p99_us),
                format!("{:.0}", b.p999_us),
                b.errors.to_string(),
                format!(
                    "{:.2} / {:.2} ({:.2})",
                    b.cpu.client, b.cpu.nodes, b.cpu.busiest_node
                ),
                regime(&b.cpu, res.cpus),
            ])
            .highlighted(b.errors > 0)
        })
        .collect();
    Table {
        title: "Throughput and latency, kvlab bench (closed loop)".into(),
        columns: [
            "servers",
            "connections",
            "op",
            "ops/s",
            "p50 (µs)",
            "p99 (µs)",
            "p99.9 (µs)",
            "errors",
            "CPU cores: client / nodes (busiest node)",
            "regime",
        ]
        .map(String::from)
        .to_vec(),
        rows,
        caption: Some(
            "kvlab bench through the ring (--cluster): one thread, one request in flight per \
             connection, the same messages as values; GETs verified."
                .into(),
        ),
    }
}

/// Writes the report; returns the summary and `index.html`'s path.
pub(super) fn write(out: &Path, res: &RingResult) -> anyhow::Result<(String, PathBuf)> {
    let mut sections = vec![Section {
        title: "The original's figures beside kvlab's".into(),
        text: vec![format!(
            "{} messages of {} (mean {:.0} bytes); nodes {}; {}{} CPUs.",
            res.messages,
            res.data,
            res.mean_message_bytes,
            where_(res),
            match res.topology.as_str() {
                "" | "file" => String::new(),
                t => format!("the rings' topologies in {t}; "),
            },
            res.cpus
        )],
        items: vec![Item::Table(comparison(res))],
    }];
    if let Some(t) = memcached_table(res) {
        sections.push(Section {
            title: "Against memcached".into(),
            text: vec![],
            items: vec![Item::Table(t)],
        });
    }
    if let Some(t) = hosts_table(res) {
        sections.push(Section {
            title: "Hosts".into(),
            text: vec![],
            items: vec![Item::Table(t)],
        });
    }
    if let Some(t) = scale_table(res) {
        sections.push(Section {
            title: "Scale up and down".into(),
            text: vec![],
            items: vec![Item::Table(t)],
        });
    }
    if !res.method.is_empty() || !res.bench.is_empty() {
        let mut items = vec![Item::Table(method_table(
            res,
            "Throughput, the original's method",
            &res.method,
            false,
        ))];
        if !res.bench.is_empty() {
            items.push(Item::Table(bench_table(res)));
        }
        sections.push(Section {
            title: "Throughput against servers × clients".into(),
            text: vec![],
            items,
        });
    }
    if !res.cache.is_empty() {
        sections.push(Section {
            title: "Cache size × displacement strategy".into(),
            text: vec![
                "One durable node, its cache bounded in entries (--cache-items), \
                        every message written first; GETs of random messages."
                    .into(),
            ],
            items: vec![Item::Table(method_table(
                res,
                "GET throughput and hit ratio, one server",
                &res.cache,
                true,
            ))],
        });
    }
    if !res.notes.is_empty() {
        sections[0].items.insert(
            0,
            Item::Note(Note::warning("Notes of the run", res.notes.join("; "))),
        );
    }
    let report = Report {
        title: format!("kvlab lab: {}", res.name),
        subtitle: Some(
            "The storage ring: durable nodes, real messages, the original's figures beside".into(),
        ),
        metadata: vec![
            ("kvlab".into(), env!("CARGO_PKG_VERSION").into()),
            ("commit".into(), crate::runner::commit().into()),
            ("messages".into(), res.messages.to_string()),
        ],
        sections,
    };
    let files = kvlab_report::write_report(out.join("report"), &report)?;
    Ok((summary_text(res), files.index))
}

/// Where the nodes and the clients ran, in words.
fn where_(res: &RingResult) -> String {
    match &res.placement {
        Some((nodes, clients)) => format!(
            "on {}, the clients on {}",
            if nodes.is_empty() {
                "this machine".to_string()
            } else {
                format!("hosts {} (node i on the i-th in turn)", nodes.join(", "))
            },
            if clients.is_empty() {
                "this machine (threads of the lab)".to_string()
            } else {
                format!(
                    "hosts {} (a kvlab lab ring-clients on each)",
                    clients.join(", ")
                )
            }
        ),
        None if res.netns => {
            "each in a network namespace of its own, the clients across a bridge".into()
        }
        None => "on loopback".into(),
    }
}

/// What `kvlab lab` prints.
fn summary_text(res: &RingResult) -> String {
    let mut s = format!(
        "{}: {} messages (mean {:.0} bytes)\n",
        res.name, res.messages, res.mean_message_bytes
    );
    if let Some(sc) = &res.scale {
        for e in &sc.events {
            s.push_str(&format!(
                "  {} {}{} ({} nodes): {:.3} s, {} keys moved (expected {}), {} lost, {} read errors{}\n",
                e.action,
                e.node,
                e.host.as_ref().map(|h| format!(" on {h}")).unwrap_or_default(),
                e.nodes_before,
                e.seconds,
                e.migration.as_ref().map_or(0, |m| m.keys_copied),
                e.expected_keys,
                e.read_back.lost(),
                e.read_back.errors,
                e.error.as_ref().map(|x| format!(" FAILED: {x}")).unwrap_or_default()
            ));
        }
    }
    if let Some(p) = get_2x5(res) {
        s.push_str(&format!(
            "  GET, 2 servers, 5 clients, the original's method: {:.0} ops/s per client ({:.0} all); {}\n",
            p.per_client.0,
            p.aggregate,
            regime_of(&p, res.cpus)
        ));
    }
    for (k, m, ratio) in against_memcached(res) {
        s.push_str(&format!(
            "  {}, {} servers, {} clients: kvlab {:.0} ops/s per client, memcached {:.0}: {ratio:.3}×{}; {} | {}\n",
            k.first.op.to_uppercase(),
            k.first.servers,
            k.first.clients,
            k.per_client.0,
            m.per_client.0,
            if k.first.op == "get" {
                format!(" (goal ≥ {MEMCACHED_TARGET_X}×)")
            } else {
                String::new()
            },
            regime_of(&k, res.cpus),
            regime_of(&m, res.cpus),
        ));
    }
    for h in &res.hosts {
        let busy: Vec<f64> = res
            .method
            .iter()
            .flat_map(|r| r.hosts.iter().filter(|c| c.host == h.name))
            .map(|c| c.busy_cores)
            .collect();
        if !busy.is_empty() {
            s.push_str(&format!(
                "  host {} ({}): busy {:.2} cores on average over the runs; clock {}\n",
                h.name,
                h.reach,
                busy.iter().sum::<f64>() / busy.len() as f64,
                h.clock_start.map_or("-".into(), |c| c.to_string())
            ));
        }
    }
    s.push_str(&format!(
        "  {} runs the original's way, {} kvlab bench points, {} cache runs\n",
        res.method.len(),
        res.bench.len(),
        res.cache.len()
    ));
    for n in &res.notes {
        s.push_str(&format!("  note: {n}\n"));
    }
    s
}
