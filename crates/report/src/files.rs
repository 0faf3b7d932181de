//! Writing a report directory: `index.html`, one SVG and one CSV per plot, one CSV per table,
//! and `report.json` (the whole [`Report`], which reads back with serde).
//!
//! File names are `plot-NN-<slug>.svg|csv` and `table-NN-<slug>.csv`, numbered in reading
//! order, so they sort like the page and never collide whatever the titles are.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::escape::csv_line;
use crate::layout::plan;
use crate::model::{Histogram, Item, LinePlot, Report, StackedBars, Table};
use crate::svg;

/// Errors writing a report.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("cannot write {path}: {source}")]
    /// A file or directory could not be written.
    Io {
        /// Which.
        path: PathBuf,
        #[source]
        /// Why.
        source: std::io::Error,
    },
    #[error("cannot serialise the report to JSON: {0}")]
    /// The report could not be turned into JSON.
    Json(#[from] serde_json::Error),
}

/// What [`write_report`] wrote (absolute or relative as `dir` was given).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReportFiles {
    /// The directory.
    pub dir: PathBuf,
    /// `index.html`.
    pub index: PathBuf,
    /// `report.json`.
    pub json: PathBuf,
    /// One SVG per plot, in reading order.
    pub plots: Vec<PathBuf>,
    /// One CSV per plot (its data) and per table, in reading order.
    pub csv: Vec<PathBuf>,
}

impl ReportFiles {
    /// Every file written.
    pub fn all(&self) -> Vec<&Path> {
        let mut v = vec![self.index.as_path(), self.json.as_path()];
        v.extend(self.plots.iter().map(PathBuf::as_path));
        v.extend(self.csv.iter().map(PathBuf::as_path));
        v
    }
}

/// Writes the report into `dir` (created if missing; files of the same names replaced).
pub fn write_report(dir: impl AsRef<Path>, report: &Report) -> Result<ReportFiles, ReportError> {
    let dir = dir.as_ref();
    std::fs::create_dir_all(dir).map_err(|source| ReportError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let write = |name: &str, data: &str| -> Result<PathBuf, ReportError> {
        let path = dir.join(name);
        std::fs::write(&path, data).map_err(|source| ReportError::Io {
            path: path.clone(),
            source,
        })?;
        Ok(path)
    };
    let planned = plan(report);
    let mut files = ReportFiles {
        dir: dir.to_path_buf(),
        ..ReportFiles::default()
    };
    let items = report
        .sections
        .iter()
        .enumerate()
        .flat_map(|(si, s)| s.items.iter().enumerate().map(move |(ii, it)| (si, ii, it)));
    for ((si, ii, it), p) in items.zip(&planned) {
        // The page's id of the item, so a plot's inner ids are the same on the page.
        let id = format!("s{}-item{}", si + 1, ii + 1);
        let (svg_text, csv_text) = match it {
            Item::LinePlot(lp) => (Some(svg::line_plot(lp, &id)), Some(line_plot_csv(lp))),
            Item::Histogram(h) => (Some(svg::histogram(h)), Some(histogram_csv(h))),
            Item::StackedBars(sb) => (Some(svg::stacked_bars(sb, &id)), Some(stacked_bars_csv(sb))),
            Item::Table(t) => (None, Some(table_csv(t))),
            Item::Note(_) => (None, None),
        };
        if let (Some(name), Some(text)) = (&p.svg, svg_text) {
            let mut doc = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
            doc.push_str(&text);
            files.plots.push(write(name, &doc)?);
        }
        if let (Some(name), Some(text)) = (&p.csv, csv_text) {
            files.csv.push(write(name, &text)?);
        }
    }
    files.json = write("report.json", &serde_json::to_string_pretty(report)?)?;
    files.index = write("index.html", &crate::html::render(report, Some(&planned)))?;
    Ok(files)
}

fn opt(v: Option<f64>) -> String {
    v.map(|v| v.to_string()).unwrap_or_default()
}

/// Long format: one row per point. The header names the axes with their units.
pub(crate) fn line_plot_csv(p: &LinePlot) -> String {
    let mut out = csv_line([
        "series", "style", &p.x_label, &p.y_label, "ci_low", "ci_high",
    ]);
    for s in &p.series {
        let style = match s.style {
            crate::model::LineStyle::Solid => "solid",
            crate::model::LineStyle::Dashed => "dashed",
        };
        for pt in &s.points {
            out.push_str(&csv_line([
                s.name.clone(),
                style.to_string(),
                pt.x.to_string(),
                pt.y.to_string(),
                opt(pt.ci_low),
                opt(pt.ci_high),
            ]));
        }
    }
    out
}

/// Long format: one row per series and bucket, plus the samples below and above the edges
/// as buckets from `-inf` and to `inf`.
pub(crate) fn histogram_csv(h: &Histogram) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "{}",
        csv_line(["series", &format!("low ({})", h.x_label), "high", "count"])
    );
    let n = h.buckets();
    for s in &h.series {
        let first = h.edges.first().map(|e| e.to_string()).unwrap_or_default();
        let last = h.edges.last().map(|e| e.to_string()).unwrap_or_default();
        out.push_str(&csv_line([
            s.name.as_str(),
            "-inf",
            &first,
            &s.below.to_string(),
        ]));
        for (j, c) in s.counts.iter().enumerate() {
            let lo = h.edges.get(j).map(|e| e.to_string()).unwrap_or_default();
            let hi = if j < n {
                h.edges[j + 1].to_string()
            } else {
                String::new()
            };
            out.push_str(&csv_line([s.name.clone(), lo, hi, c.to_string()]));
        }
        out.push_str(&csv_line([
            s.name.as_str(),
            &last,
            "inf",
            &s.above.to_string(),
        ]));
    }
    out
}

/// Long format: one row per bar and stage, the values as given (the SVG draws a negative
/// or non-finite one as 0).
pub(crate) fn stacked_bars_csv(sb: &StackedBars) -> String {
    let mut out = csv_line([sb.x_label.as_str(), "stage", &sb.y_label]);
    for b in &sb.bars {
        for (stage, v) in sb.stages.iter().zip(&b.values) {
            out.push_str(&csv_line([b.name.as_str(), stage, &v.to_string()]));
        }
    }
    out
}

/// The table as shown; a `flagged` column is added when some rows are highlighted.
pub(crate) fn table_csv(t: &Table) -> String {
    let flag = t.rows.iter().any(|r| r.highlight);
    let mut head = t.columns.clone();
    if flag {
        head.push("flagged".into());
    }
    let mut out = csv_line(head);
    for r in &t.rows {
        let mut cells = r.cells.clone();
        if flag {
            cells.push(if r.highlight { "yes" } else { "" }.into());
        }
        out.push_str(&csv_line(cells));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::example::example_report;

    #[test]
    fn writes_every_file_and_json_round_trips() {
        let dir = tempfile::tempdir().expect("temp dir");
        let r = example_report();
        let f = write_report(dir.path(), &r).expect("write");
        for p in f.all() {
            assert!(p.is_file(), "{} missing", p.display());
        }
        let plots = r
            .sections
            .iter()
            .flat_map(|s| &s.items)
            .filter(|i| i.is_plot())
            .count();
        assert_eq!(f.plots.len(), plots);
        for svg in &f.plots {
            let text = std::fs::read_to_string(svg).expect("read svg");
            roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", svg.display()));
            let name = svg.file_name().and_then(|n| n.to_str()).unwrap_or("");
            assert!(
                name.starts_with("plot-") && name.ends_with(".svg"),
                "{name}"
            );
        }
        let back: Report =
            serde_json::from_str(&std::fs::read_to_string(&f.json).expect("read json"))
                .expect("parse json");
        assert_eq!(back, r);
        let index = std::fs::read_to_string(&f.index).expect("read index");
        for p in f.plots.iter().chain(&f.csv) {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            assert!(
                index.contains(&format!("href=\"{name}\"")),
                "index does not link {name}"
            );
        }
    }

    #[test]
    fn csv_shapes() {
        let t = Table {
            title: "t".into(),
            columns: vec!["a".into(), "b, with comma".into()],
            rows: vec![
                crate::model::Row::new(["1", "x"]),
                crate::model::Row::new(["2", "y"]).highlighted(true),
            ],
            caption: None,
        };
        assert_eq!(
            table_csv(&t),
            "a,\"b, with comma\",flagged\n1,x,\n2,y,yes\n"
        );
        let h = Histogram {
            edges: vec![0.0, 1.0, 2.0],
            series: vec![crate::model::HistogramSeries {
                name: "s".into(),
                counts: vec![3, 4],
                below: 0,
                above: 1,
            }],
            x_label: "ms".into(),
            ..Histogram::default()
        };
        assert_eq!(
            histogram_csv(&h),
            "series,low (ms),high,count\ns,-inf,0,0\ns,0,1,3\ns,1,2,4\ns,2,inf,1\n"
        );
        let sb = StackedBars {
            x_label: "configuration".into(),
            y_label: "time (µs)".into(),
            stages: vec!["net".into(), "queue, waiting".into()],
            bars: vec![crate::model::StackedBar {
                name: "a".into(),
                values: vec![1.5, -0.5],
            }],
            ..StackedBars::default()
        };
        assert_eq!(
            stacked_bars_csv(&sb),
            "configuration,stage,time (µs)\na,net,1.5\na,\"queue, waiting\",-0.5\n"
        );
    }
}
