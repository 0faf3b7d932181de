//! The report of a storage-ring experiment: the original's figures beside kvlab's, then a
//! table per part, and the summary `kvlab lab` prints.

use std::path::{Path, PathBuf};

use kvlab_report::{Item, Note, Report, Row, Section, Table};

use super::{Cpu, MethodRun, RingResult, ScaleEvent};

/// The scale targets: each migration under this many seconds, nothing lost.
const SCALE_TARGET_S: f64 = 0.2;
/// The GET target: this many times the original's ops/s per client.
const GET_TARGET_X: f64 = 100.0;

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
        });
    }
    out
}

/// The GET figure the original's way with 2 servers and 5 clients, if measured.
fn get_2x5(res: &RingResult) -> Option<Point<'_>> {
    points(&res.method, |r| (r.servers, r.clients, r.op.clone()))
        .into_iter()
        .find(|p| p.first.servers == 2 && p.first.clients == 5 && p.first.op == "get")
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
                    regime(&p.cpu, res.cpus)
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
                format!("{} {}", e.action, e.node),
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
        points(runs, |r| (r.servers, r.clients, r.op.clone()))
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
                    r.op.to_uppercase(),
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
                regime(&p.cpu, res.cpus),
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
            "{} messages of {} (mean {:.0} bytes); nodes {}; {} CPUs.",
            res.messages,
            res.data,
            res.mean_message_bytes,
            if res.netns {
                "each in a network namespace of its own, the clients across a bridge"
            } else {
                "on loopback"
            },
            res.cpus
        )],
        items: vec![Item::Table(comparison(res))],
    }];
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

/// What `kvlab lab` prints.
fn summary_text(res: &RingResult) -> String {
    let mut s = format!(
        "{}: {} messages (mean {:.0} bytes)\n",
        res.name, res.messages, res.mean_message_bytes
    );
    if let Some(sc) = &res.scale {
        for e in &sc.events {
            s.push_str(&format!(
                "  {} {} ({} nodes): {:.3} s, {} keys moved (expected {}), {} lost, {} read errors{}\n",
                e.action,
                e.node,
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
            regime(&p.cpu, res.cpus)
        ));
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
