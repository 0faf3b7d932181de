//! The report's data model: plain, serde-serialisable structures that the lab runner fills
//! and the renderers read. Nothing here knows about HTML or SVG.
//!
//! Data that cannot be drawn as given (a histogram with too few buckets, a series with a
//! NaN, a table row of the wrong width) is not an error: the report is still written, and
//! the renderer shows the [`problems`](LinePlot::problems) in a warning callout next to the
//! item, so nothing is hidden and nothing is lost.

use serde::{Deserialize, Serialize};

/// The fewest buckets a latency histogram may have (issue 4: "at least 10 buckets").
pub const MIN_HISTOGRAM_BUCKETS: usize = 10;

/// A whole report: a title, facts about the run, and sections in reading order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The page title.
    pub title: String,
    #[serde(default)]
    /// A line under the title.
    pub subtitle: Option<String>,
    /// Facts about the run, shown as a table at the top, in this order: kvlab version,
    /// commit, date, machine (cores, memory), command line...
    #[serde(default)]
    pub metadata: Vec<(String, String)>,
    #[serde(default)]
    /// The sections, in reading order.
    pub sections: Vec<Section>,
}

/// A titled part of the report: paragraphs of plain text, then items.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Section {
    /// The heading.
    pub title: String,
    /// Plain-text paragraphs (escaped when rendered; no markup).
    #[serde(default)]
    pub text: Vec<String>,
    #[serde(default)]
    /// Plots, histograms, tables and notes, in reading order.
    pub items: Vec<Item>,
}

/// One thing shown in a section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Item {
    /// A line plot.
    LinePlot(LinePlot),
    /// A histogram.
    Histogram(Histogram),
    /// Stacked bars.
    StackedBars(StackedBars),
    /// A table.
    Table(Table),
    /// A note.
    Note(Note),
}

/// How the x axis maps values to positions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scale {
    #[default]
    /// Linear.
    Linear,
    /// Base-10 logarithmic; points with x <= 0 cannot be drawn and are reported.
    Log10,
}

/// How a series' line is drawn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LineStyle {
    /// Measured data.
    #[default]
    Solid,
    /// Predicted by a model, beside the measured line of the same colour.
    Dashed,
}

/// Lines (one per series) of y against x, with optional confidence-interval error bars.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LinePlot {
    /// The title (also names its files).
    pub title: String,
    /// With its unit, e.g. "clients (N)".
    pub x_label: String,
    /// With its unit, e.g. "throughput (req/s)".
    pub y_label: String,
    #[serde(default)]
    /// How the x axis is scaled.
    pub x_scale: Scale,
    /// Fixed x range (e.g. to align stacked time-series plots); from the data if `None`.
    #[serde(default)]
    pub x_range: Option<(f64, f64)>,
    /// Start the y axis at zero (true for throughput and latency; false zooms on the data).
    #[serde(default = "yes")]
    pub y_from_zero: bool,
    /// Named ticks instead of numeric ones, e.g. a categorical factor drawn at x = 0, 1, 2.
    #[serde(default)]
    pub x_ticks: Option<Vec<(f64, String)>>,
    /// What the error bars mean, shown in the legend, e.g. "95% confidence interval".
    #[serde(default)]
    pub error_bars: Option<String>,
    /// The lines.
    pub series: Vec<Series>,
    /// A sentence under the plot.
    #[serde(default)]
    pub caption: Option<String>,
    /// A second y axis on the right, with its own lines (e.g. the offered rate beside a
    /// latency over time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub y2: Option<Y2>,
    /// Vertical marks with a short label (events on a time axis).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub marks: Vec<Mark>,
}

/// The right-hand y axis of a [`LinePlot`]: from zero, its own scale.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Y2 {
    /// With its unit, e.g. "offered rate (req/s)".
    pub label: String,
    /// Its lines (thin, in the palette after the left axis' lines unless coloured).
    pub series: Vec<Series>,
}

/// A vertical mark across a plot at `x`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Mark {
    /// Where.
    pub x: f64,
    /// A short label (a few characters; drawn above the frame).
    pub label: String,
}

fn yes() -> bool {
    true
}

/// One line of a [`LinePlot`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Series {
    /// The name in the legend.
    pub name: String,
    #[serde(default)]
    /// Solid or dashed.
    pub style: LineStyle,
    /// Palette index; series with the same index share a colour and marker (a measured line
    /// and its model's prediction). Defaults to the series' position in the plot.
    #[serde(default)]
    pub color: Option<usize>,
    /// The points, in x order.
    pub points: Vec<Point>,
}

/// A point, with an optional confidence interval `[ci_low, ci_high]` around `y` (absolute
/// values, not offsets).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// x.
    pub x: f64,
    /// y.
    pub y: f64,
    #[serde(default)]
    /// Lower end of y's confidence interval.
    pub ci_low: Option<f64>,
    #[serde(default)]
    /// Upper end of y's confidence interval.
    pub ci_high: Option<f64>,
}

impl Point {
    /// A point without an interval.
    pub fn new(x: f64, y: f64) -> Point {
        Point {
            x,
            y,
            ci_low: None,
            ci_high: None,
        }
    }

    /// A point with its confidence interval.
    pub fn with_ci(x: f64, y: f64, low: f64, high: f64) -> Point {
        Point {
            x,
            y,
            ci_low: Some(low),
            ci_high: Some(high),
        }
    }

    /// The point at `x` for an estimate (its confidence interval becomes the error bar).
    pub fn at(x: f64, e: Estimate) -> Point {
        Point {
            x,
            y: e.value,
            ci_low: e.ci_low,
            ci_high: e.ci_high,
        }
    }
}

/// A measured value with an optional confidence interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// The estimate.
    pub value: f64,
    #[serde(default)]
    /// Lower end of its confidence interval.
    pub ci_low: Option<f64>,
    #[serde(default)]
    /// Upper end of its confidence interval.
    pub ci_high: Option<f64>,
}

impl Estimate {
    /// A value known exactly (no interval).
    pub fn exact(value: f64) -> Estimate {
        Estimate {
            value,
            ci_low: None,
            ci_high: None,
        }
    }

    /// A value with its confidence interval.
    pub fn with_ci(value: f64, low: f64, high: f64) -> Estimate {
        Estimate {
            value,
            ci_low: Some(low),
            ci_high: Some(high),
        }
    }

    /// Whether `v` lies inside the confidence interval (or equals the value, with none).
    pub fn contains(&self, v: f64) -> bool {
        match (self.ci_low, self.ci_high) {
            (Some(lo), Some(hi)) => lo <= v && v <= hi,
            _ => v == self.value,
        }
    }
}

/// How histogram bars are scaled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HistogramY {
    /// Raw counts.
    Count,
    /// Percent of each series' total (including samples outside the edges), so cases with
    /// different sample counts compare.
    #[default]
    Percent,
}

/// Grouped bars: every series is counted in the same buckets, so cases compare.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    /// The title (also names its files).
    pub title: String,
    /// The bucketed quantity with its unit, e.g. "latency (µs)".
    pub x_label: String,
    /// Bucket `i` is `[edges[i], edges[i+1])`: `edges.len()` = buckets + 1, increasing.
    pub edges: Vec<f64>,
    #[serde(default)]
    /// Counts or percentages.
    pub y: HistogramY,
    /// One set of bars per series.
    pub series: Vec<HistogramSeries>,
    #[serde(default)]
    /// A caption under it.
    pub caption: Option<String>,
}

/// One case's counts in a [`Histogram`]'s buckets.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HistogramSeries {
    /// The name in the legend.
    pub name: String,
    /// One count per bucket.
    pub counts: Vec<u64>,
    /// Samples below the first edge (not drawn, but said).
    #[serde(default)]
    pub below: u64,
    /// Samples at or above the last edge (not drawn, but said).
    #[serde(default)]
    pub above: u64,
}

/// Bars of stacked segments: one bar per case (e.g. a configuration), one segment per
/// stage, the stages in the same order in every bar from the bottom up, so a bar's height
/// is its stages' sum (e.g. where a request's time goes).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StackedBars {
    /// The title (also names its files).
    pub title: String,
    /// What a bar is, e.g. "configuration".
    pub x_label: String,
    /// With its unit, e.g. "time per request (µs)".
    pub y_label: String,
    /// The values' unit for the bars' labels, e.g. "µs" (may be empty).
    #[serde(default)]
    pub unit: String,
    /// The stages' names, the bottom segment first (the legend's order too).
    pub stages: Vec<String>,
    /// The bars, left to right.
    pub bars: Vec<StackedBar>,
    #[serde(default)]
    /// A caption under it.
    pub caption: Option<String>,
}

/// One bar of [`StackedBars`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StackedBar {
    /// The name under the bar.
    pub name: String,
    /// One value per stage, in the stages' order.
    pub values: Vec<f64>,
}

impl StackedBar {
    /// The segments' heights as drawn: a value that is negative or not finite cannot be
    /// stacked and is drawn as 0 (and reported by [`StackedBars::problems`]).
    pub fn drawn(&self) -> Vec<f64> {
        self.values
            .iter()
            .map(|v| if v.is_finite() && *v > 0.0 { *v } else { 0.0 })
            .collect()
    }
}

/// A table of text cells; highlighted rows (e.g. a model that disagrees with the
/// measurement) are drawn in red.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Table {
    /// The title (also names its CSV file).
    pub title: String,
    /// Header cells, with units.
    pub columns: Vec<String>,
    /// The rows.
    pub rows: Vec<Row>,
    #[serde(default)]
    /// A caption under it.
    pub caption: Option<String>,
}

/// One table row.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// One cell per column.
    pub cells: Vec<String>,
    #[serde(default)]
    /// Shown highlighted (e.g. a model that disagrees with a measurement).
    pub highlight: bool,
}

impl Row {
    /// A row of these cells.
    pub fn new<S: Into<String>>(cells: impl IntoIterator<Item = S>) -> Row {
        Row {
            cells: cells.into_iter().map(Into::into).collect(),
            highlight: false,
        }
    }

    /// Highlights the row when `on`.
    pub fn highlighted(mut self, on: bool) -> Row {
        self.highlight = on;
        self
    }
}

/// How loudly a [`Note`] speaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    #[default]
    /// Information.
    Info,
    /// Drawn as a red callout and listed at the top of the report (model disagreements,
    /// data that could not be drawn).
    Warning,
}

/// A callout.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Note {
    /// Information or warning.
    pub level: Level,
    /// The title.
    pub title: String,
    /// The text.
    pub text: String,
}

impl Note {
    /// An information note.
    pub fn info(title: impl Into<String>, text: impl Into<String>) -> Note {
        Note {
            level: Level::Info,
            title: title.into(),
            text: text.into(),
        }
    }

    /// A warning note.
    pub fn warning(title: impl Into<String>, text: impl Into<String>) -> Note {
        Note {
            level: Level::Warning,
            title: title.into(),
            text: text.into(),
        }
    }
}

impl Item {
    /// The item's title (a note's title for a note).
    pub fn title(&self) -> &str {
        match self {
            Item::LinePlot(p) => &p.title,
            Item::Histogram(h) => &h.title,
            Item::StackedBars(b) => &b.title,
            Item::Table(t) => &t.title,
            Item::Note(n) => &n.title,
        }
    }

    /// Whether it is drawn as a plot (an SVG, with its data as CSV).
    pub fn is_plot(&self) -> bool {
        matches!(
            self,
            Item::LinePlot(_) | Item::Histogram(_) | Item::StackedBars(_)
        )
    }

    /// What cannot be drawn as given; empty when all is well.
    pub fn problems(&self) -> Vec<String> {
        match self {
            Item::LinePlot(p) => p.problems(),
            Item::Histogram(h) => h.problems(),
            Item::StackedBars(b) => b.problems(),
            Item::Table(t) => t.problems(),
            Item::Note(_) => Vec::new(),
        }
    }
}

impl LinePlot {
    /// What cannot be drawn as given (non-finite values, x <= 0 on a log axis, an error bar
    /// that does not contain its point); empty when all is well.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.series.iter().all(|s| s.points.is_empty()) {
            out.push("no data points".to_string());
        }
        if let Some((lo, hi)) = self.x_range {
            if !(lo.is_finite() && hi.is_finite() && lo < hi) {
                out.push(format!(
                    "x range [{lo}, {hi}] is empty or not finite; ignored"
                ));
            }
        }
        for s in &self.series {
            let mut bad = 0;
            let mut nonpositive = 0;
            let mut inverted = 0;
            for p in &s.points {
                let ci_ok = p.ci_low.iter().chain(&p.ci_high).all(|v| v.is_finite());
                if !(p.x.is_finite() && p.y.is_finite() && ci_ok) {
                    bad += 1;
                } else if self.x_scale == Scale::Log10 && p.x <= 0.0 {
                    nonpositive += 1;
                }
                if p.ci_low.is_some_and(|l| l > p.y) || p.ci_high.is_some_and(|h| h < p.y) {
                    inverted += 1;
                }
            }
            if bad > 0 {
                out.push(format!(
                    "series \"{}\": {bad} point(s) with a non-finite value not drawn",
                    s.name
                ));
            }
            if nonpositive > 0 {
                out.push(format!(
                    "series \"{}\": {nonpositive} point(s) with x <= 0 not drawn on the log axis",
                    s.name
                ));
            }
            if inverted > 0 {
                out.push(format!(
                    "series \"{}\": {inverted} error bar(s) do not contain their point",
                    s.name
                ));
            }
        }
        out
    }
}

impl Histogram {
    /// Number of buckets the edges define.
    pub fn buckets(&self) -> usize {
        self.edges.len().saturating_sub(1)
    }

    /// What cannot be drawn as given (too few buckets, edges not increasing, counts that do
    /// not match the buckets); empty when all is well.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let n = self.buckets();
        if n < MIN_HISTOGRAM_BUCKETS {
            out.push(format!(
                "{n} bucket(s): a latency histogram needs at least {MIN_HISTOGRAM_BUCKETS}"
            ));
        }
        if !self.edges.iter().all(|e| e.is_finite()) || self.edges.windows(2).any(|w| w[0] >= w[1])
        {
            out.push("bucket edges are not finite and strictly increasing".to_string());
        }
        if self.series.is_empty() {
            out.push("no series".to_string());
        }
        for s in &self.series {
            if s.counts.len() != n {
                out.push(format!(
                    "series \"{}\" has {} count(s) for {n} bucket(s): not drawn",
                    s.name,
                    s.counts.len()
                ));
            }
        }
        out
    }
}

impl StackedBars {
    /// What cannot be drawn as given (no bars, a bar whose values do not match the stages,
    /// values that are negative or not finite); empty when all is well.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.bars.is_empty() {
            out.push("no bars".to_string());
        }
        let n = self.stages.len();
        for b in &self.bars {
            if b.values.len() != n {
                out.push(format!(
                    "bar \"{}\" has {} value(s) for {n} stage(s): not drawn",
                    b.name,
                    b.values.len()
                ));
                continue;
            }
            for (stage, v) in self.stages.iter().zip(&b.values) {
                if !(v.is_finite() && *v >= 0.0) {
                    out.push(format!(
                        "bar \"{}\": {stage} is {v}, drawn as 0 (the bar's total leaves it out)",
                        b.name
                    ));
                }
            }
        }
        out
    }
}

impl Table {
    /// Rows whose width differs from the header's; empty when all is well.
    pub fn problems(&self) -> Vec<String> {
        let w = self.columns.len();
        self.rows
            .iter()
            .enumerate()
            .filter(|(_, r)| r.cells.len() != w)
            .map(|(i, r)| {
                format!(
                    "row {} has {} cell(s) for {w} column(s)",
                    i + 1,
                    r.cells.len()
                )
            })
            .collect()
    }
}

impl Report {
    /// Every item's problems, each prefixed with where it is ("section / item: problem").
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        for s in &self.sections {
            for it in &s.items {
                for p in it.problems() {
                    out.push(format!("{} / {}: {p}", s.title, it.title()));
                }
            }
        }
        out
    }

    /// Every warning note, with the title of the section that holds it.
    pub fn warnings(&self) -> Vec<(&str, &Note)> {
        self.sections
            .iter()
            .flat_map(|s| {
                s.items.iter().filter_map(move |it| match it {
                    Item::Note(n) if n.level == Level::Warning => Some((s.title.as_str(), n)),
                    _ => None,
                })
            })
            .collect()
    }
}
