//! Plots as SVG text, written by hand.
//!
//! Why not plotters: a plot here is a handful of lines, markers, error bars and labels, and
//! the browser lays out the text, so no font metrics are needed at build or run time. The
//! output is small, deterministic, well-formed XML (tested), uses no ids that could clash
//! when several plots are inlined into one HTML page (each plot gets a prefix), and escapes
//! every piece of text.
//!
//! Here: the frame every plot shares (sizes, colours, markers, the legend, the y axis, a
//! category x axis); `line.rs` draws line plots, `bars.rs` histograms and stacked bars.
//!
//! Layout (pixels):
//!
//! ```text
//!  ┌──────────────────── WIDTH ─────────────────────┐
//!  │ title                                          │
//!  │     ┌──────────────────────────────────────┐   │
//!  │ y   │ plot area: grid, error bars, lines,  │   │
//!  │ lbl │ markers (clipped), or bars (grouped  │   │
//!  │     │ or stacked)                          │   │
//!  │     └──────────────────────────────────────┘   │
//!  │       tick labels / x label                    │
//!  │ legend rows (wrapping)                         │
//!  └────────────────────────────────────────────────┘
//! ```

use std::fmt::Write;

use crate::axis::Axis;
use crate::escape::escape;
use crate::model::LineStyle;

mod bars;
mod line;

#[cfg(test)]
use crate::model::{Histogram, LinePlot, Scale, StackedBar, StackedBars};
#[cfg(test)]
use bars::edge_label;
pub use bars::{histogram, stacked_bars};
pub use line::line_plot;

const WIDTH: f64 = 760.0;
const LEFT: f64 = 76.0;
const RIGHT: f64 = 24.0;
const TOP: f64 = 44.0;
const PLOT_H: f64 = 300.0;
const FONT: &str = "DejaVu Sans, Liberation Sans, Arial, Helvetica, sans-serif";
/// A rough width of one character at 12 px, for wrapping legends (the browser does the real
/// layout; this only has to avoid overlaps).
const CHAR_W: f64 = 7.0;

/// Okabe–Ito colours: distinguishable with the common colour-vision deficiencies, and
/// readable on white (their yellow is left out for that reason).
const PALETTE: [&str; 7] = [
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000",
];

fn color(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// One marker shape per colour slot, so series differ by more than colour.
fn marker(out: &mut String, i: usize, x: f64, y: f64, stroke: &str, fill: &str) {
    let r = 3.6;
    let _ = match i % 4 {
        0 => write!(
            out,
            r#"<circle cx="{x:.1}" cy="{y:.1}" r="{r}" fill="{fill}" stroke="{stroke}" stroke-width="1.5"/>"#
        ),
        1 => write!(
            out,
            r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{fill}" stroke="{stroke}" stroke-width="1.5"/>"#,
            x - r,
            y - r,
            2.0 * r,
            2.0 * r
        ),
        2 => write!(
            out,
            r#"<path d="M{x:.1},{:.1} L{:.1},{:.1} L{:.1},{:.1} Z" fill="{fill}" stroke="{stroke}" stroke-width="1.5"/>"#,
            y - r - 0.8,
            x + r + 0.6,
            y + r,
            x - r - 0.6,
            y + r
        ),
        _ => write!(
            out,
            r#"<path d="M{x:.1},{:.1} L{:.1},{y:.1} L{x:.1},{:.1} L{:.1},{y:.1} Z" fill="{fill}" stroke="{stroke}" stroke-width="1.5"/>"#,
            y - r - 0.8,
            x + r + 0.8,
            y + r + 0.8,
            x - r - 0.8
        ),
    };
}

/// Legend entries laid out in rows under the plot.
struct Legend {
    entries: Vec<(String, Swatch)>,
}

enum Swatch {
    Line { color: usize, style: LineStyle },
    Bar { color: usize },
    ErrorBar,
}

impl Legend {
    /// Writes the legend starting at `y`; returns the y below it.
    fn write(&self, out: &mut String, y: f64) -> f64 {
        let (x0, x1) = (LEFT, WIDTH - RIGHT);
        let (mut x, mut y) = (x0, y);
        out.push_str(r#"<g class="legend" font-size="12">"#);
        for (label, swatch) in &self.entries {
            let w = 34.0 + CHAR_W * label.chars().count() as f64 + 18.0;
            if x > x0 && x + w > x1 {
                x = x0;
                y += 20.0;
            }
            match swatch {
                Swatch::Line { color: c, style } => {
                    let dash = match style {
                        LineStyle::Solid => "",
                        LineStyle::Dashed => r#" stroke-dasharray="6 4""#,
                    };
                    let _ = write!(
                        out,
                        r#"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{}" stroke-width="2"{dash}/>"#,
                        x,
                        x + 28.0,
                        color(*c)
                    );
                    let fill = match style {
                        LineStyle::Solid => color(*c),
                        LineStyle::Dashed => "#ffffff",
                    };
                    marker(out, *c, x + 14.0, y, color(*c), fill);
                }
                Swatch::Bar { color: c } => {
                    let _ = write!(
                        out,
                        r#"<rect x="{:.1}" y="{:.1}" width="22" height="11" fill="{}"/>"#,
                        x + 3.0,
                        y - 5.5,
                        color(*c)
                    );
                }
                Swatch::ErrorBar => {
                    let cx = x + 14.0;
                    let _ = write!(
                        out,
                        r##"<path d="M{cx:.1},{:.1} V{:.1} M{:.1},{:.1} H{:.1} M{:.1},{:.1} H{:.1}" stroke="#444" stroke-width="1.3" fill="none"/>"##,
                        y - 7.0,
                        y + 7.0,
                        cx - 4.0,
                        y - 7.0,
                        cx + 4.0,
                        cx - 4.0,
                        y + 7.0,
                        cx + 4.0
                    );
                }
            }
            let _ = write!(
                out,
                r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
                x + 34.0,
                y + 4.0,
                escape(label)
            );
            x += w;
        }
        out.push_str("</g>");
        y + 18.0
    }
}

fn open_svg(out: &mut String, title: &str) {
    open_svg_wide(out, title, 0.0, None);
}

/// Opens an SVG `extra` px wider than the others on the right (room for a second y axis),
/// with `desc` = (id, text) as the description that screen readers read after the title.
fn open_svg_wide(out: &mut String, title: &str, extra: f64, desc: Option<(&str, &str)>) {
    let w = WIDTH + extra;
    let (described_by, desc) = match desc {
        Some((id, text)) => (
            format!(r#" aria-describedby="{}""#, escape(id)),
            format!(r#"<desc id="{}">{}</desc>"#, escape(id), escape(text)),
        ),
        None => (String::new(), String::new()),
    };
    let _ = write!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" class="plot" role="img" aria-label="{t}"{described_by} width="{w}" height="@@HEIGHT@@" viewBox="0 0 {w} @@HEIGHT@@" font-family="{FONT}" font-size="12" fill="#222"><title>{t}</title>{desc}<rect width="100%" height="100%" fill="#ffffff"/><text class="plot-title" x="{:.1}" y="24" font-size="15" font-weight="bold" text-anchor="middle">{t}</text>"##,
        WIDTH / 2.0,
        t = escape(title)
    );
}

/// Room right of the frame for a second y axis' ticks and label.
const Y2_EXTRA: f64 = 64.0;

fn close_svg(mut out: String, height: f64) -> String {
    out.push_str("</svg>\n");
    out.replace("@@HEIGHT@@", &format!("{height:.0}"))
}

/// Frame, grid, y ticks and labels of a plot area; `ylab` is rotated on the left.
fn y_axis(out: &mut String, y: &Axis, ylab: &str) {
    let (x0, x1, b) = (LEFT, WIDTH - RIGHT, TOP + PLOT_H);
    out.push_str(r##"<g class="y-axis" font-size="11">"##);
    for (v, label) in &y.ticks {
        let py = b - y.frac(*v) * PLOT_H;
        let _ = write!(
            out,
            r##"<line x1="{x0:.1}" y1="{py:.1}" x2="{x1:.1}" y2="{py:.1}" stroke="#e4e4e4"/><line x1="{:.1}" y1="{py:.1}" x2="{x0:.1}" y2="{py:.1}" stroke="#333"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            x0 - 5.0,
            x0 - 8.0,
            py + 4.0,
            escape(label)
        );
    }
    let _ = write!(
        out,
        r#"<text class="axis-label" transform="translate(18,{:.1}) rotate(-90)" text-anchor="middle" font-size="13">{}</text></g>"#,
        TOP + PLOT_H / 2.0,
        escape(ylab)
    );
}

fn frame(out: &mut String) {
    let _ = write!(
        out,
        r##"<rect x="{LEFT}" y="{TOP}" width="{:.1}" height="{PLOT_H}" fill="none" stroke="#333"/>"##,
        WIDTH - LEFT - RIGHT
    );
}

/// An x axis of named places: a tick and a label at each x (`spacing` px apart; the labels
/// rotated when they would not fit side by side), and the axis label `label` under them.
/// Returns the axis label's y.
fn category_axis(out: &mut String, labels: &[(f64, String)], spacing: f64, label: &str) -> f64 {
    let b = TOP + PLOT_H;
    let longest = labels
        .iter()
        .map(|(_, l)| l.chars().count())
        .max()
        .unwrap_or(1) as f64;
    let rotate = longest * 6.5 > spacing - 4.0;
    out.push_str(r#"<g class="x-axis" font-size="11">"#);
    for (x, l) in labels {
        let _ = write!(
            out,
            r##"<line x1="{x:.1}" y1="{b:.1}" x2="{x:.1}" y2="{:.1}" stroke="#333"/>"##,
            b + 5.0
        );
        if rotate {
            let _ = write!(
                out,
                r#"<text transform="translate({:.1},{:.1}) rotate(-40)" text-anchor="end">{}</text>"#,
                x + 3.0,
                b + 16.0,
                escape(l)
            );
        } else {
            let _ = write!(
                out,
                r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                b + 18.0,
                escape(l)
            );
        }
    }
    let label_y = if rotate {
        b + 22.0 + longest * 5.0
    } else {
        b + 38.0
    };
    let _ = write!(
        out,
        r#"<text class="axis-label" x="{:.1}" y="{label_y:.1}" text-anchor="middle" font-size="13">{}</text></g>"#,
        (LEFT + WIDTH - RIGHT) / 2.0,
        escape(label)
    );
    label_y
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{HistogramSeries, Point, Series};

    fn sample_plot() -> LinePlot {
        LinePlot {
            title: "Throughput <vs> clients & \"friends\"".into(),
            x_label: "clients (N)".into(),
            y_label: "throughput (req/s)".into(),
            y_from_zero: true,
            error_bars: Some("95% CI".into()),
            series: vec![
                Series {
                    name: "kvlab <epoll>".into(),
                    points: vec![
                        Point::with_ci(1.0, 10.0, 9.0, 11.0),
                        Point::with_ci(4.0, 35.0, 33.0, 37.0),
                        Point::new(f64::NAN, 1.0),
                    ],
                    ..Series::default()
                },
                Series {
                    name: "model".into(),
                    style: LineStyle::Dashed,
                    color: Some(0),
                    points: vec![Point::new(1.0, 10.5), Point::new(4.0, 40.0)],
                },
            ],
            ..LinePlot::default()
        }
    }

    fn parse(svg: &str) -> roxmltree::Document<'_> {
        roxmltree::Document::parse(svg).unwrap_or_else(|e| panic!("malformed SVG: {e}\n{svg}"))
    }

    #[test]
    fn a_second_axis_and_marks_are_drawn() {
        let mut p = sample_plot();
        assert!(!line_plot(&p, "a").contains("y2-axis"));
        p.y2 = Some(crate::model::Y2 {
            label: "rate (req/s)".into(),
            series: vec![Series {
                name: "offered".into(),
                points: vec![Point::new(1.0, 1000.0), Point::new(4.0, 3000.0)],
                ..Series::default()
            }],
        });
        p.marks = vec![
            crate::model::Mark {
                x: 2.0,
                label: "start <xz>".into(),
            },
            crate::model::Mark {
                x: 99.0,
                label: "outside".into(),
            },
        ];
        let svg = line_plot(&p, "b");
        assert!(svg.contains(r#"class="y2-axis""#) && svg.contains("rate (req/s)"));
        assert!(svg.contains("offered (right axis)"));
        assert!(svg.contains(&format!(r#"width="{}""#, WIDTH + Y2_EXTRA)));
        assert!(svg.contains("start &lt;xz&gt;") && !svg.contains("outside"));
    }

    #[test]
    fn line_plot_is_well_formed_and_escaped() {
        let svg = line_plot(&sample_plot(), "p1");
        let doc = parse(&svg);
        let root = doc.root_element();
        assert_eq!(root.tag_name().name(), "svg");
        assert!(!svg.contains("@@HEIGHT@@"));
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
        let texts: Vec<&str> = doc.descendants().filter_map(|n| n.text()).collect();
        assert!(texts.contains(&"Throughput <vs> clients & \"friends\""));
        assert!(texts.contains(&"kvlab <epoll>"));
        assert!(texts.contains(&"95% CI"));
        let class = |c: &str| {
            doc.descendants()
                .filter(|n| n.attribute("class") == Some(c))
                .count()
        };
        assert_eq!(class("series"), 2);
        assert_eq!(class("errorbar"), 2);
        assert_eq!(class("line"), 2);
        assert!(svg.contains("stroke-dasharray"));
    }

    #[test]
    fn intervals_of_non_negative_values_are_drawn_down_to_zero_only() {
        let negative = |svg: &str| {
            parse(svg)
                .descendants()
                .filter_map(|n| n.text())
                .filter(|t| t.trim_start().starts_with(['-', '\u{2212}']))
                .count()
        };
        let mut plot = sample_plot();
        // Two repetitions: the t-interval of a throughput reaches far below zero.
        plot.series[0].points[0] = Point::with_ci(1.0, 10.0, -40.0, 60.0);
        let svg = line_plot(&plot, "p1");
        assert_eq!(negative(&svg), 0, "no axis below zero: {svg}");
        // A quantity that may be negative keeps its whole interval.
        plot.y_from_zero = false;
        assert!(negative(&line_plot(&plot, "p1")) > 0);
    }

    #[test]
    fn points_lie_inside_the_plot_area() {
        let svg = line_plot(&sample_plot(), "p1");
        let doc = parse(&svg);
        for c in doc.descendants().filter(|n| n.has_tag_name("circle")) {
            let cx: f64 = c
                .attribute("cx")
                .and_then(|v| v.parse().ok())
                .unwrap_or(-1.0);
            let cy: f64 = c
                .attribute("cy")
                .and_then(|v| v.parse().ok())
                .unwrap_or(-1.0);
            // Legend markers sit below the plot area; data markers inside it.
            assert!((LEFT..=WIDTH - RIGHT).contains(&cx), "cx {cx}");
            assert!(cy >= TOP, "cy {cy}");
        }
    }

    #[test]
    fn empty_and_log_plots_render() {
        let mut p = sample_plot();
        p.series.clear();
        parse(&line_plot(&p, "e"));
        let mut p = sample_plot();
        p.x_scale = Scale::Log10;
        p.series[0].points.push(Point::new(0.0, 3.0));
        let svg = line_plot(&p, "l");
        parse(&svg);
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }

    #[test]
    fn histogram_is_well_formed_with_one_bar_per_bucket_and_series() {
        let edges: Vec<f64> = (0..=12).map(|i| 50.0 * 1.5f64.powi(i)).collect();
        let h = Histogram {
            title: "Latency".into(),
            x_label: "latency (µs)".into(),
            edges,
            series: vec![
                HistogramSeries {
                    name: "a".into(),
                    counts: (0..12).collect(),
                    above: 3,
                    ..HistogramSeries::default()
                },
                HistogramSeries {
                    name: "b & c".into(),
                    counts: (0..12).rev().collect(),
                    ..HistogramSeries::default()
                },
                HistogramSeries {
                    name: "wrong length".into(),
                    counts: vec![1, 2],
                    ..HistogramSeries::default()
                },
            ],
            ..Histogram::default()
        };
        let svg = histogram(&h);
        let doc = parse(&svg);
        let bars = doc
            .descendants()
            .filter(|n| n.attribute("class") == Some("bar"))
            .count();
        assert_eq!(bars, 24);
        assert!(svg.contains("3 at or above"));
        assert!(svg.contains("b &amp; c"));
    }

    fn stages_sample() -> StackedBars {
        StackedBars {
            title: "Where <time> goes".into(),
            x_label: "configuration".into(),
            y_label: "time per request (µs)".into(),
            unit: "µs".into(),
            stages: ["net", "queue & wait", "backend"]
                .map(String::from)
                .to_vec(),
            bars: vec![
                StackedBar {
                    name: "proxy <t=1>".into(),
                    values: vec![3.3, 10.0, 41.7],
                },
                StackedBar {
                    name: "proxy \"t=2\"".into(),
                    values: vec![2.9, 0.0, 38.4],
                },
                StackedBar {
                    name: "one too few".into(),
                    values: vec![1.0, 2.0],
                },
            ],
            caption: None,
        }
    }

    fn attr(n: roxmltree::Node<'_, '_>, a: &str) -> f64 {
        n.attribute(a)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no number in {a} of {n:?}"))
    }

    #[test]
    fn stacked_segments_add_up_to_their_bar_in_the_stages_order() {
        let sb = stages_sample();
        let svg = stacked_bars(&sb, "s1-item1");
        let doc = parse(&svg);
        let stacks: Vec<_> = doc
            .descendants()
            .filter(|n| n.attribute("class") == Some("stack"))
            .collect();
        // The bar whose values do not match the stages is not drawn.
        assert_eq!(stacks.len(), 2);
        // Pixels per µs, the same in every segment.
        let mut scale = None;
        for (stack, bar) in stacks.iter().zip(&sb.bars) {
            assert_eq!(stack.attribute("data-name"), Some(bar.name.as_str()));
            let segs: Vec<_> = stack
                .children()
                .filter(|n| n.attribute("class") == Some("segment"))
                .collect();
            // Bottom up in the stages' order; a zero stage has no segment.
            let order: Vec<&str> = segs
                .iter()
                .filter_map(|n| n.attribute("data-stage"))
                .collect();
            let want: Vec<&str> = sb
                .stages
                .iter()
                .zip(&bar.values)
                .filter(|(_, v)| **v > 0.0)
                .map(|(s, _)| s.as_str())
                .collect();
            assert_eq!(order, want);
            let mut bottom = TOP + PLOT_H;
            let mut height = 0.0;
            for seg in &segs {
                let (y, h, v) = (
                    attr(*seg, "y"),
                    attr(*seg, "height"),
                    attr(*seg, "data-value"),
                );
                assert!(
                    (y + h - bottom).abs() < 0.11,
                    "segment not on the one below it"
                );
                bottom = y;
                height += h;
                let k = h / v;
                let s = *scale.get_or_insert(k);
                assert!((k - s).abs() * v < 0.11, "{k} px/µs vs {s}");
            }
            let total = attr(*stack, "data-total");
            let sum: f64 = bar.values.iter().sum();
            assert!((total - sum).abs() < 1e-9);
            // The segments' heights add up to the total's, within the written rounding.
            let s = scale.unwrap_or(0.0);
            assert!(
                (height - total * s).abs() <= 0.05 * segs.len() as f64 + 0.06,
                "{height} px for {total} µs at {s} px/µs"
            );
            let label = stack
                .children()
                .find(|n| n.attribute("class") == Some("total"))
                .and_then(|n| n.text());
            assert_eq!(label, Some(crate::axis::format_value(total).as_str()));
        }
        // The legend names the stages in order, each once.
        let legend: Vec<&str> = doc
            .descendants()
            .filter(|n| n.attribute("class") == Some("legend"))
            .flat_map(|g| g.descendants().filter(|n| n.has_tag_name("text")))
            .filter_map(|n| n.text())
            .collect();
        assert_eq!(legend, ["net", "queue & wait", "backend"]);
    }

    #[test]
    fn stacked_bars_escape_text_and_describe_themselves() {
        let svg = stacked_bars(&stages_sample(), "s2-item3");
        let doc = parse(&svg);
        for raw in ["<time>", "<t=1>", "queue & wait"] {
            assert!(!svg.contains(raw), "unescaped {raw:?}");
        }
        let root = doc.root_element();
        assert_eq!(root.attribute("aria-label"), Some("Where <time> goes"));
        assert_eq!(root.attribute("aria-describedby"), Some("s2-item3-desc"));
        let desc = doc
            .descendants()
            .find(|n| n.has_tag_name("desc"))
            .and_then(|n| n.text())
            .unwrap_or_default();
        assert!(
            desc.contains("stacked from the bottom: net, queue & wait, backend"),
            "{desc}"
        );
        assert!(
            desc.contains("proxy <t=1>: 55 µs (net 3.30, queue & wait 10, backend 41.7)"),
            "{desc}"
        );
        let titles: Vec<&str> = doc
            .descendants()
            .filter(|n| n.has_tag_name("title"))
            .filter_map(|n| n.text())
            .collect();
        assert!(
            titles.contains(&"proxy \"t=2\": backend 38.4 µs"),
            "{titles:?}"
        );
    }

    #[test]
    fn empty_zero_and_bad_stacks_render_without_nan() {
        let mut cases = vec![
            StackedBars::default(),
            StackedBars {
                bars: vec![StackedBar {
                    name: "no stages".into(),
                    values: vec![],
                }],
                ..StackedBars::default()
            },
        ];
        let mut zeros = stages_sample();
        zeros.bars.truncate(2);
        for b in &mut zeros.bars {
            b.values.iter_mut().for_each(|v| *v = 0.0);
        }
        cases.push(zeros);
        let mut bad = stages_sample();
        bad.bars[0].values = vec![f64::NAN, -4.0, f64::INFINITY];
        cases.push(bad);
        for sb in &cases {
            let svg = stacked_bars(sb, "e");
            parse(&svg);
            for bad in ["NaN", "inf", "@@HEIGHT@@"] {
                assert!(!svg.contains(bad), "{bad} in {svg}");
            }
        }
        let problems = cases[3].problems();
        assert!(
            problems
                .iter()
                .any(|p| p.contains("queue & wait is -4, drawn as 0")),
            "{problems:?}"
        );
        assert!(problems
            .iter()
            .any(|p| p.contains("has 2 value(s) for 3 stage(s)")));
        assert_eq!(cases[0].problems(), ["no bars"]);
        assert!(cases[2].problems().is_empty());
    }

    #[test]
    fn edge_labels_are_short() {
        assert_eq!(edge_label(50.0), "50");
        assert_eq!(edge_label(75.0), "75");
        assert_eq!(edge_label(112.4), "112");
        assert_eq!(edge_label(100.0), "100");
        assert_eq!(edge_label(1_281.0), "1281");
        assert_eq!(edge_label(12_345.0), "12.3k");
        assert_eq!(edge_label(0.25), "0.25");
        assert_eq!(edge_label(0.0), "0");
    }
}
