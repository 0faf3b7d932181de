//! The experiment as a whole: the verdict of the model checks, the overview's notes and
//! section, the report's metadata, and the rows of the terminal summary.

use std::fmt::Write as _;

use kvlab_report::{Item, Note, Section};

use super::Tally;
use crate::runner::{Meta, RawRun};
use crate::spec::Experiment;

/// Appends a row of a terminal summary table: `first` left-aligned in 34 columns, then each
/// cell right-aligned in its column's width (a table's header and rows share `widths`).
pub(super) fn summary_row(
    out: &mut String,
    first: &str,
    cells: &[impl AsRef<str>],
    widths: &[usize],
) {
    let _ = write!(out, "  {first:<34}");
    for (c, w) in cells.iter().zip(widths) {
        let _ = write!(out, " {:>w$}", c.as_ref());
    }
    out.push('\n');
}

/// The verdict of the model checks in `tally` (there are some): a line of the terminal
/// `summary` and the overview's note.
pub(super) fn model_checks_verdict(tally: &Tally, summary: &mut String) -> Item {
    let _ = writeln!(
        summary,
        "\nmodel checks: {} of {} disagree with the measurement{}",
        tally.disagree.len(),
        tally.checks,
        if tally.disagree.is_empty() {
            String::new()
        } else {
            format!(
                " (see the report), e.g. {}",
                tally
                    .disagree
                    .iter()
                    .take(3)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; ")
            )
        }
    );
    Item::Note(if tally.disagree.is_empty() {
        Note::info(
            "Models",
            format!(
                "All {} model checks agree with the measurements.",
                tally.checks
            ),
        )
    } else {
        Note::warning(
            "Models disagree with measurements",
            format!(
                "{} of {} model checks disagree (highlighted in the model-vs-measurement \
                 tables below):\n{}",
                tally.disagree.len(),
                tally.checks,
                tally.disagree.join("\n")
            ),
        )
    })
}

/// The overview's warnings that concern the whole experiment: parts with only two
/// repetitions (wide intervals) and systems skipped.
pub(super) fn caveats(exp: &Experiment, meta: &Meta, ci: &str) -> Vec<Item> {
    let mut notes = Vec::new();
    let few: Vec<String> = exp
        .parts
        .iter()
        .filter(|p| p.repetitions == 2)
        .map(|p| p.name.clone())
        .collect();
    if !few.is_empty() {
        notes.push(Item::Note(Note::warning(
            "Wide confidence intervals",
            format!(
                "Part(s) {} have 2 repetitions per point: their {ci}s use t = 12.7 (1 degree of \
                 freedom) and are wide, so a model that \"agrees (inside the interval)\" there is \
                 weak evidence; compare the model error column, or raise repetitions.",
                few.join(", ")
            ),
        )));
    }
    for (s, why) in &meta.skipped {
        notes.push(Item::Note(Note::warning(
            format!("System {s} skipped"),
            why.clone(),
        )));
    }
    notes
}

/// The overview section: what was run and how it was measured, then `items` (the notes).
pub(super) fn overview_section(
    exp: &Experiment,
    meta: &Meta,
    runs: usize,
    ci: &str,
    items: Vec<Item>,
) -> Section {
    Section {
        title: "Overview".into(),
        text: vec![
            exp.description.clone().unwrap_or_default(),
            format!(
                "{} runs in {} part(s); each point was repeated and is shown with its {ci} \
                 (Student t over repetitions). Latencies are measured by the load generator \
                 from each request's planned send time (µs); server CPU is read from \
                 /proc/<pid>/stat over each run's measured time (utilization law: U = CPU \
                 seconds per second, service demand D = U / X).",
                runs,
                exp.parts.len()
            ),
            format!(
                "The load generator and the servers share this machine's {} core(s): at high \
                 load they compete for CPU, which the single-resource queueing models below do \
                 not capture; where a model disagrees, the report says so.",
                meta.cores
            ),
        ],
        items,
    }
}

/// The report's metadata: the version, the machine, the command, the runs and the systems.
pub(super) fn metadata(meta: &Meta, raws: &[RawRun]) -> Vec<(String, String)> {
    let mut rows = vec![
        ("kvlab version".to_string(), meta.kvlab_version.clone()),
        ("commit".into(), meta.commit.clone()),
        ("date".into(), meta.date.clone()),
        (
            "machine".into(),
            format!(
                "{} cores{}, {:.1} GiB, Linux {}{}",
                meta.cores,
                if meta.cpu_model.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", meta.cpu_model)
                },
                meta.memory_bytes as f64 / (1u64 << 30) as f64,
                meta.kernel,
                if meta.host.is_empty() {
                    String::new()
                } else {
                    format!(", host {}", meta.host)
                }
            ),
        ),
        ("command".into(), meta.command.join(" ")),
        ("experiment".into(), meta.experiment_file.clone()),
        (
            "overrides".into(),
            if meta.overrides.is_empty() {
                "none".into()
            } else {
                meta.overrides.flags()
            },
        ),
        (
            "runs".into(),
            format!(
                "{} stored of {} planned, {:.0} s",
                raws.len(),
                meta.runs,
                meta.elapsed_s
            ),
        ),
    ];
    let mut systems: Vec<(String, String)> = Vec::new();
    for r in raws {
        let key = format!("system {}", r.system);
        let val = format!("{} — {}", r.version, r.command.join(" "));
        if !systems.iter().any(|(k, v)| *k == key && *v == val) {
            systems.push((key, val));
        }
    }
    systems.truncate(12);
    rows.extend(systems);
    rows
}
