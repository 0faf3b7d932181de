//! The report of a faults experiment: anomalies and failed runs at the top, a table per
//! configuration, then each run's timeline; and the summary `kvlab lab` prints.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kvlab_faults::{History, RunSummary};
use kvlab_report::{Item, Note, Report, Row, Section, Table};

use super::timeline::{anomaly_time, kind_name, timeline};
use super::{Configuration, FaultsResult, RunRecord, Seeds};

/// A run's files as read back for the report.
struct RunFiles {
    history: Option<History>,
    report: Option<kvlab_faults::Report>,
}

fn read_run(dir: &Path) -> RunFiles {
    let history = std::fs::File::open(dir.join("history.jsonl"))
        .ok()
        .and_then(|f| History::read_jsonl(std::io::BufReader::new(f), "history.jsonl").ok());
    let report = std::fs::read(dir.join("anomalies.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    RunFiles { history, report }
}

/// Most anomalies of one run in the report's table (its anomalies.json has more).
const ANOMALY_ROWS: usize = 10;

fn run_row(seed: &str, s: &RunSummary) -> Row {
    Row::new([
        seed.to_string(),
        s.mix.clone(),
        format!(
            "{} ({} failed, {} skipped)",
            s.actions, s.actions_failed, s.actions_skipped
        ),
        s.ops.to_string(),
        format!("{} / {} / {}", s.ok, s.failed, s.unknown),
        format!(
            "{} ({} / {} / {} / {})",
            s.anomalies, s.lost_writes, s.stale_reads, s.never_written, s.not_linearizable
        ),
        s.unverified_keys.to_string(),
        format!("{:.1}", s.seconds),
        s.error.clone().unwrap_or_else(|| "-".into()),
    ])
    .highlighted(!s.clean())
}

const RUN_COLUMNS: [&str; 9] = [
    "seed",
    "faults drawn",
    "nemesis actions",
    "operations checked",
    "ok / failed / unknown",
    "anomalies (lost writes / stale reads / never written / keys not linearizable)",
    "keys unverified",
    "run (s)",
    "run error",
];

fn seeds_text(s: &Seeds) -> String {
    match s {
        Seeds::Range { from, to } => format!("{from}..={to}"),
        Seeds::List(v) => v.iter().map(u64::to_string).collect::<Vec<_>>().join(", "),
    }
}

/// Writes the report; returns the summary and `index.html`'s path.
pub(super) fn write(out: &Path, res: &FaultsResult) -> anyhow::Result<(String, PathBuf)> {
    let spec = &res.spec;
    let files: Vec<RunFiles> = res
        .runs
        .iter()
        .map(|r| read_run(&out.join(&r.dir)))
        .collect();
    let configs = res.spec.configurations();
    let mut sections = vec![anomalies_section(res, &files)];
    sections.push(runs_section(res, &configs));
    sections.extend(timeline_sections(res, &files, &configs));
    let report = Report {
        title: format!("kvlab lab: {}", spec.name),
        subtitle: Some(if spec.description.is_empty() {
            "Seeded faults against a kvlab cluster, every operation recorded and checked".into()
        } else {
            spec.description.clone()
        }),
        metadata: metadata(res, &configs),
        sections,
    };
    let written = kvlab_report::write_report(out.join("report"), &report)?;
    Ok((summary_text(res, &configs), written.index))
}

/// A run's name in the report's notes: `seed 1 (file, 1 copy, cluster-aware clients)`.
fn name_of(r: &RunRecord) -> String {
    format!("seed {} ({})", r.seed, r.configuration.label())
}

/// At the top of the report: what the checker found, and runs that did not go as planned.
fn anomalies_section(res: &FaultsResult, files: &[RunFiles]) -> Section {
    let mut top = Vec::new();
    let mut anomaly_rows = Vec::new();
    for (r, f) in res.runs.iter().zip(files) {
        top.extend(run_notes(r));
        let Some(report) = &f.report else { continue };
        anomaly_rows.extend(anomaly_rows_of(r, report));
    }
    let total_anomalies: u64 = res.runs.iter().map(|r| r.summary.anomalies).sum();
    let total_ops: u64 = res.runs.iter().map(|r| r.summary.ops).sum();
    if res.interrupted {
        top.push(Item::Note(Note::warning(
            "Interrupted",
            format!(
                "A signal ended the experiment after {} of its runs.",
                res.runs.len()
            ),
        )));
    }
    if total_anomalies == 0 {
        top.insert(
            0,
            Item::Note(Note::info(
                "No anomalies",
                format!(
                    "{} runs, {total_ops} operations checked: no lost write, no stale read, no \
                     value never written, every history searched has a linearization.",
                    res.runs.len()
                ),
            )),
        );
    }
    if !anomaly_rows.is_empty() {
        top.push(Item::Table(Table {
            title: "Anomalies".into(),
            columns: ["seed", "configuration", "anomaly", "key", "at (s)", "why"]
                .map(String::from)
                .to_vec(),
            rows: anomaly_rows,
            caption: Some(format!(
                "The first {ANOMALY_ROWS} anomalies of each run in time (seconds since the \
                 run's start), and every key with no linearization; a run's anomalies.json \
                 lists up to {} of each kind, with the operations that show them.",
                kvlab_faults::checker::LISTED_PER_KIND
            )),
        }));
    }
    Section {
        title: "Anomalies".into(),
        text: vec![
            "The checker judges every key's history as a register of unique values: a lost \
             write (the final read after the heal misses an acknowledged write), a stale read \
             (a read older than a write acknowledged before it began), a value never written, \
             and a key whose history has no linearization. A write of unknown outcome may \
             have taken effect at any time after it began."
                .into(),
        ],
        items: top,
    }
}

/// One run's warnings: its anomalies, its error, its unverified keys.
fn run_notes(r: &RunRecord) -> Vec<Item> {
    let mut top = Vec::new();
    let s = &r.summary;
    if s.anomalies > 0 {
        let mut kinds = Vec::new();
        for (n, what) in [
            (s.lost_writes, "lost writes"),
            (s.stale_reads, "stale reads"),
            (s.never_written, "reads of values never written"),
            (s.not_linearizable, "keys with no linearization"),
        ] {
            if n > 0 {
                kinds.push(format!("{n} {what}"));
            }
        }
        top.push(Item::Note(Note::warning(
            format!("{}: {} anomalies", name_of(r), s.anomalies),
            format!(
                "The checker found {} anomalies: {}. The history is {}/history.jsonl \
                 (`kvlab faults check` judges it again).",
                s.anomalies,
                kinds.join(", "),
                r.dir
            ),
        )));
    }
    if let Some(e) = &s.error {
        top.push(Item::Note(Note::warning(
            format!("The run did not go as planned: {}", name_of(r)),
            format!("{e} (what it recorded was checked)"),
        )));
    }
    if s.unverified_keys > 0 {
        top.push(Item::Note(Note::warning(
            format!("Keys not verified: {}", name_of(r)),
            format!(
                "{} keys with an acknowledged write were not read back after the heal: \
                 their writes may be lost unseen.",
                s.unverified_keys
            ),
        )));
    }
    top
}

/// One run's rows of the anomalies table: its first anomalies in time, then every key with
/// no linearization.
fn anomaly_rows_of(r: &RunRecord, report: &kvlab_faults::Report) -> Vec<Row> {
    let mut anomaly_rows = Vec::new();
    let mut listed: Vec<&kvlab_faults::Anomaly> = report.anomalies.iter().collect();
    listed.sort_by(|a, b| {
        let t = |a: &kvlab_faults::Anomaly| anomaly_time(a).unwrap_or(f64::INFINITY);
        t(a).total_cmp(&t(b))
    });
    for a in listed.into_iter().take(ANOMALY_ROWS) {
        anomaly_rows.push(
            Row::new([
                r.seed.to_string(),
                r.configuration.label(),
                kind_name(a.kind).to_string(),
                a.key.clone(),
                anomaly_time(a).map_or("-".into(), |t| format!("{t:.3}")),
                a.why.clone(),
            ])
            .highlighted(true),
        );
    }
    for k in &report.linearizability.not_linearizable {
        anomaly_rows.push(
            Row::new([
                r.seed.to_string(),
                r.configuration.label(),
                "not linearizable".to_string(),
                k.clone(),
                "-".to_string(),
                "the key's history has no linearization (found by the search alone)".to_string(),
            ])
            .highlighted(true),
        );
    }
    anomaly_rows
}

/// "Faults: runs": what was run, and a table per configuration (a row per seed, then the
/// totals).
fn runs_section(res: &FaultsResult, configs: &[Configuration]) -> Section {
    let spec = &res.spec;
    let mut tables = Vec::new();
    for c in configs {
        let runs: Vec<&RunRecord> = res.runs.iter().filter(|r| r.configuration == *c).collect();
        if runs.is_empty() {
            continue;
        }
        let mut rows: Vec<Row> = runs
            .iter()
            .map(|r| run_row(&r.seed.to_string(), &r.summary))
            .collect();
        rows.push(run_row(&format!("all {}", runs.len()), &totals(&runs)));
        tables.push(Item::Table(Table {
            title: format!("Runs: {}", c.label()),
            columns: RUN_COLUMNS.map(String::from).to_vec(),
            rows,
            caption: Some(
                "Operations checked include the final reads. Highlighted: a run with \
                 anomalies, unverified keys or an error."
                    .into(),
            ),
        }));
    }
    let mut faults_text = vec![format!(
        "{} runs: seeds {} × {} configuration(s), {} s of load and faults each on {} nodes \
         ({} clients over {} keys, at most {} operations a second each, {:.0}% writes, \
         {} ms timeouts); then the nemesis ends its last fault, the cluster is healed, \
         every key read back and the history checked.",
        res.runs.len(),
        seeds_text(&spec.seeds),
        configs.len(),
        spec.duration,
        spec.nodes,
        spec.clients,
        spec.keys,
        spec.rate,
        100.0 * spec.write_share,
        spec.timeout_ms
    )];
    faults_text.push(match &spec.faults {
        Some(f) => format!("Fault kinds drawn: {}.", f.join(", ")),
        None => "Fault kinds drawn: what each configuration is expected to survive (kill -9 \
                 only with two copies, etcd member kills only with etcd)."
            .into(),
    });
    Section {
        title: "Faults: runs".into(),
        text: faults_text,
        items: tables,
    }
}

/// The runs of one configuration added up (the faults drawn by kind, the error as how many
/// runs did not go as planned).
fn totals(runs: &[&RunRecord]) -> RunSummary {
    let mut t = RunSummary::default();
    let mut mixes: BTreeMap<String, usize> = BTreeMap::new();
    for r in runs {
        let s = &r.summary;
        for part in s.mix.split_whitespace() {
            if let Some((k, n)) = part.split_once('=') {
                *mixes.entry(k.to_string()).or_default() += n.parse::<usize>().unwrap_or(0);
            }
        }
        t.actions += s.actions;
        t.actions_failed += s.actions_failed;
        t.actions_skipped += s.actions_skipped;
        t.ops += s.ops;
        t.ok += s.ok;
        t.failed += s.failed;
        t.unknown += s.unknown;
        t.lost_writes += s.lost_writes;
        t.stale_reads += s.stale_reads;
        t.never_written += s.never_written;
        t.not_linearizable += s.not_linearizable;
        t.anomalies += s.anomalies;
        t.unverified_keys += s.unverified_keys;
        t.seconds += s.seconds;
    }
    t.mix = mixes
        .iter()
        .map(|(k, n)| format!("{k}={n}"))
        .collect::<Vec<_>>()
        .join(" ");
    let failed_runs = runs.iter().filter(|r| r.summary.error.is_some()).count();
    if failed_runs > 0 {
        t.error = Some(format!("{failed_runs} runs did not go as planned"));
    }
    t
}

/// "Timelines: <configuration>": a timeline per run of each configuration that has runs.
fn timeline_sections(
    res: &FaultsResult,
    files: &[RunFiles],
    configs: &[Configuration],
) -> Vec<Section> {
    let mut sections = Vec::new();
    for c in configs {
        let mut items = Vec::new();
        for (r, f) in res.runs.iter().zip(files) {
            if r.configuration != *c {
                continue;
            }
            match &f.history {
                Some(h) => {
                    let anomalies = f.report.as_ref().map_or(&[][..], |x| &x.anomalies[..]);
                    items.push(Item::LinePlot(timeline(
                        &format!("Timeline: seed {}, {}", r.seed, c.slug()),
                        h,
                        anomalies,
                        res.spec.interval,
                    )));
                }
                None => items.push(Item::Note(Note::info(
                    format!("Seed {}: no history", r.seed),
                    format!("{}/history.jsonl could not be read", r.dir),
                ))),
            }
        }
        if items.is_empty() {
            continue;
        }
        sections.push(Section {
            title: format!("Timelines: {}", c.label()),
            text: vec![format!(
                "One plot per seed; each run's actions, with what they said, are in its \
                 timeline.txt (runs/{}/seed-N/).",
                c.slug()
            )],
            items,
        });
    }
    sections
}

/// The report's metadata: kvlab's version and commit, the seeds, the configurations, the
/// overrides.
fn metadata(res: &FaultsResult, configs: &[Configuration]) -> Vec<(String, String)> {
    let mut metadata = vec![
        ("kvlab".to_string(), env!("CARGO_PKG_VERSION").to_string()),
        ("commit".into(), crate::runner::commit().into()),
        ("seeds".into(), seeds_text(&res.spec.seeds)),
        (
            "configurations".into(),
            configs
                .iter()
                .map(Configuration::label)
                .collect::<Vec<_>>()
                .join("; "),
        ),
    ];
    if !res.overrides.is_empty() {
        metadata.push(("overrides".into(), res.overrides.flags()));
    }
    metadata
}

/// What `kvlab lab` prints: the verdict, then a table per configuration.
fn summary_text(res: &FaultsResult, configs: &[Configuration]) -> String {
    let total_anomalies: u64 = res.runs.iter().map(|r| r.summary.anomalies).sum();
    let total_ops: u64 = res.runs.iter().map(|r| r.summary.ops).sum();
    let clean = res.runs.iter().all(|r| r.summary.clean());
    let mut summary = format!("{}: ", res.spec.name);
    summary.push_str(&if clean {
        format!(
            "{} runs, {total_ops} operations checked, no anomalies\n",
            res.runs.len()
        )
    } else {
        format!(
            "{} runs, {total_ops} operations checked, {total_anomalies} ANOMALIES; {} runs \
             not clean\n",
            res.runs.len(),
            res.runs.iter().filter(|r| !r.summary.clean()).count()
        )
    });
    for c in configs {
        let runs: Vec<RunSummary> = res
            .runs
            .iter()
            .filter(|r| r.configuration == *c)
            .map(|r| r.summary.clone())
            .collect();
        if runs.is_empty() {
            continue;
        }
        summary.push_str(&format!("\n{}\n", c.label()));
        summary.push_str(&kvlab_faults::runner::table(&runs));
    }
    summary
}
