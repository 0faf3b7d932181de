//! From raw runs to the report: statistics over repetitions, the knee, operational laws and
//! queueing models beside the measurements, 2^k effects, and the terminal summary.
//!
//! Everything here is a pure function of the experiment text, `meta.json` and `raw/*.json`,
//! so `kvlab lab analyse DIR` rewrites the same report from the same data.
//!
//! Here: [`analyse`], [`write`] and the model checks every section uses; `points` (each
//! point over its repetitions), `models` (the MVA networks, a rate scan's queues), `part`
//! (what every part's section holds, and the line, plot and table builders), `sections`
//! (the sections a part's factors call for), `summary` (the overview, the metadata, the
//! models' verdict, the terminal summary's rows).

use std::path::{Path, PathBuf};

use anyhow::Context;
use kvlab_report::helpers as h;
use kvlab_report::{Estimate, Item, Note, Report};

use crate::runner::{Meta, RawRun};
use crate::spec::Experiment;

pub(crate) mod hosts;
mod models;
mod part;
mod points;
mod sections;
mod summary;

use part::common_edges;
use points::points;
use summary::{caveats, metadata, model_checks_verdict, overview_section};

/// The report and the terminal summary.
pub struct Analysis {
    /// The report.
    pub report: Report,
    /// What `kvlab lab` prints at the end.
    pub summary: String,
}

/// Writes the report into `dir/report`; returns the path of `index.html`.
pub fn write(dir: &Path, a: &Analysis) -> anyhow::Result<PathBuf> {
    let files = kvlab_report::write_report(dir.join("report"), &a.report)
        .with_context(|| format!("writing the report in {}", dir.display()))?;
    Ok(files.index)
}

/// The run's checks collected for the summary.
#[derive(Default)]
struct Tally {
    checks: usize,
    disagree: Vec<String>,
}

impl Tally {
    fn add(&mut self, cs: &[h::ModelCheck]) {
        self.checks += cs.len();
        for c in cs.iter().filter(|c| c.disagrees()) {
            self.disagree.push(format!("{} ({})", c.quantity, c.model));
        }
    }
}

const CI: &str = "95% confidence interval";

fn ci_label(conf: f64) -> String {
    if (conf - 0.95).abs() < 1e-9 {
        CI.into()
    } else {
        format!("{:.0}% confidence interval", conf * 100.0)
    }
}

/// The analysis under way: what every part's builders read (the experiment, the machine, the
/// confidence-interval label, the histogram buckets shared by the whole report) and what they
/// add to besides their own section (the terminal summary, the tally of model checks).
struct Analyser<'a> {
    exp: &'a Experiment,
    meta: &'a Meta,
    ci: String,
    edges: Vec<f64>,
    summary: String,
    tally: Tally,
}

/// Analyses an experiment's raw runs.
pub fn analyse(exp: &Experiment, meta: &Meta, raws: &[RawRun]) -> anyhow::Result<Analysis> {
    let mut an = Analyser {
        exp,
        meta,
        ci: ci_label(exp.confidence),
        edges: common_edges(raws),
        summary: String::new(),
        tally: Tally::default(),
    };
    let mut sections = Vec::new();
    let mut overview = Vec::new();
    for part in &exp.parts {
        let (pts, problems) = points(exp, part, raws);
        if pts.is_empty() {
            overview.push(Item::Note(Note::warning(
                format!("Part {}: no results", part.name),
                if problems.is_empty() {
                    "No run of this part was stored.".to_string()
                } else {
                    problems.join("\n")
                },
            )));
            continue;
        }
        sections.push(an.part_section(part, pts, &problems));
    }
    let Analyser {
        ci,
        mut summary,
        tally,
        ..
    } = an;
    if tally.checks > 0 {
        overview.push(model_checks_verdict(&tally, &mut summary));
    }
    overview.extend(caveats(exp, meta, &ci));
    let mut all = vec![overview_section(exp, meta, raws.len(), &ci, overview)];
    all.extend(sections);
    all.extend(hosts::hosts_section(
        meta,
        raws,
        exp.tolerance,
        &mut summary,
    ));
    let report = Report {
        title: format!("kvlab lab: {}", exp.name),
        subtitle: exp.description.clone(),
        metadata: metadata(meta, raws),
        sections: all,
    };
    Ok(Analysis { report, summary })
}

impl Analyser<'_> {
    /// A model check at the experiment's tolerance.
    fn check(
        &self,
        quantity: String,
        model: &str,
        unit: &str,
        predicted: f64,
        measured: Estimate,
    ) -> h::ModelCheck {
        h::ModelCheck {
            quantity,
            model: model.into(),
            unit: unit.into(),
            predicted,
            measured,
            tolerance: self.exp.tolerance,
        }
    }

    /// Tallies `checks` and returns their model-vs-measurement table (with `title` and
    /// `caption` when given) and notes.
    fn model_items(
        &mut self,
        checks: &[h::ModelCheck],
        title: Option<&str>,
        caption: Option<&str>,
    ) -> Vec<Item> {
        self.tally.add(checks);
        let mut items = h::model_vs_measurement(checks, &self.ci);
        if let Some(Item::Table(t)) = items.first_mut() {
            if let Some(title) = title {
                t.title = title.into();
            }
            if let Some(caption) = caption {
                t.caption = Some(caption.into());
            }
        }
        items
    }
}
