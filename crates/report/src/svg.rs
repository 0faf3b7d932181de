//! Plots as SVG text, written by hand.
//!
//! Why not plotters: a plot here is a handful of lines, markers, error bars and labels, and
//! the browser lays out the text, so no font metrics are needed at build or run time. The
//! output is small, deterministic, well-formed XML (tested), uses no ids that could clash
//! when several plots are inlined into one HTML page (each plot gets a prefix), and escapes
//! every piece of text.
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

use crate::axis::{format_value, Axis};
use crate::escape::escape;
use crate::model::{Histogram, HistogramY, LinePlot, LineStyle, Scale, StackedBar, StackedBars};

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

/// A plot's x axis from its data, fixed range or named ticks.
fn x_axis(plot: &LinePlot, lo: f64, hi: f64) -> Axis {
    if let Some((a, b)) = plot
        .x_range
        .filter(|(a, b)| a.is_finite() && b.is_finite() && a < b)
    {
        if plot.x_scale == Scale::Linear || a > 0.0 {
            return Axis::fixed(plot.x_scale, a, b, 8);
        }
    }
    if let Some(ticks) = &plot.x_ticks {
        let finite: Vec<f64> = ticks
            .iter()
            .map(|t| t.0)
            .filter(|v| v.is_finite())
            .collect();
        let tlo = finite.iter().copied().fold(lo, f64::min);
        let thi = finite.iter().copied().fold(hi, f64::max);
        let (a, b) = match plot.x_scale {
            Scale::Linear => {
                let pad = if thi > tlo { (thi - tlo) * 0.06 } else { 0.5 };
                (tlo - pad, thi + pad)
            }
            Scale::Log10 => (tlo / 1.25, thi * 1.25),
        };
        return Axis {
            scale: plot.x_scale,
            lo: a,
            hi: b,
            ticks: ticks.clone(),
        };
    }
    match plot.x_scale {
        Scale::Linear => Axis::new(Scale::Linear, lo, hi, 8),
        // A little room so end markers are not cut in half by the frame.
        Scale::Log10 => Axis::fixed(Scale::Log10, lo / 1.15, hi * 1.15, 8),
    }
}

/// Renders a line plot. `id` must be unique within the page (it prefixes the clip path).
pub fn line_plot(plot: &LinePlot, id: &str) -> String {
    let log = plot.x_scale == Scale::Log10;
    let drawable = |x: f64, y: f64| x.is_finite() && y.is_finite() && (!log || x > 0.0);
    // A plot from zero of values that are never negative (rates, latencies): a t-interval
    // reaching below zero (few repetitions, wide intervals) is drawn down to zero only.
    // The data files keep the interval as computed.
    let floor = (plot.y_from_zero
        && plot
            .series
            .iter()
            .flat_map(|s| &s.points)
            .all(|p| !p.y.is_finite() || p.y >= 0.0))
    .then_some(0.0);
    let clamp = |v: f64| floor.map_or(v, |f: f64| v.max(f));
    let (mut xlo, mut xhi, mut ylo, mut yhi) = (
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::INFINITY,
        f64::NEG_INFINITY,
    );
    for p in plot.series.iter().flat_map(|s| &s.points) {
        if !drawable(p.x, p.y) {
            continue;
        }
        xlo = xlo.min(p.x);
        xhi = xhi.max(p.x);
        for v in [Some(p.y), p.ci_low.map(clamp), p.ci_high]
            .into_iter()
            .flatten()
        {
            if v.is_finite() {
                ylo = ylo.min(v);
                yhi = yhi.max(v);
            }
        }
    }
    if !xlo.is_finite() {
        (xlo, xhi, ylo, yhi) = if log {
            (1.0, 10.0, 0.0, 1.0)
        } else {
            (0.0, 1.0, 0.0, 1.0)
        };
    }
    if plot.y_from_zero {
        ylo = ylo.min(0.0);
        yhi = yhi.max(0.0);
    }
    let xa = x_axis(plot, xlo, xhi);
    let ya = Axis::new(Scale::Linear, ylo, yhi, 6);
    let (x0, x1, b) = (LEFT, WIDTH - RIGHT, TOP + PLOT_H);
    let px = |x: f64| x0 + xa.frac(x) * (x1 - x0);
    let py = |y: f64| b - ya.frac(y) * PLOT_H;

    let mut out = String::new();
    let extra = if plot.y2.is_some() { Y2_EXTRA } else { 0.0 };
    open_svg_wide(&mut out, &plot.title, extra, None);
    let clip = format!("{}-clip", crate::escape::slug(id));
    let _ = write!(
        out,
        r#"<defs><clipPath id="{clip}"><rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}"/></clipPath></defs>"#,
        x0 - 6.0,
        TOP - 6.0,
        x1 - x0 + 12.0,
        PLOT_H + 12.0
    );
    y_axis(&mut out, &ya, &plot.y_label);
    // Vertical grid and x ticks.
    out.push_str(r#"<g class="x-axis" font-size="11">"#);
    for (v, label) in &xa.ticks {
        if !(v.is_finite() && (!log || *v > 0.0)) {
            continue;
        }
        let f = xa.frac(*v);
        if !(-1e-9..=1.0 + 1e-9).contains(&f) {
            continue;
        }
        let x = px(*v);
        let _ = write!(
            out,
            r##"<line x1="{x:.1}" y1="{TOP:.1}" x2="{x:.1}" y2="{b:.1}" stroke="#e4e4e4"/><line x1="{x:.1}" y1="{b:.1}" x2="{x:.1}" y2="{:.1}" stroke="#333"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            b + 5.0,
            b + 18.0,
            escape(label)
        );
    }
    let _ = write!(
        out,
        r#"<text class="axis-label" x="{:.1}" y="{:.1}" text-anchor="middle" font-size="13">{}</text></g>"#,
        (x0 + x1) / 2.0,
        b + 38.0,
        escape(&plot.x_label)
    );
    frame(&mut out);

    let mut legend = Legend {
        entries: Vec::new(),
    };
    let _ = write!(out, r#"<g clip-path="url(#{clip})">"#);
    for (i, s) in plot.series.iter().enumerate() {
        let c = s.color.unwrap_or(i);
        let col = color(c);
        let mut pts: Vec<_> = s.points.iter().filter(|p| drawable(p.x, p.y)).collect();
        pts.sort_by(|a, b| a.x.total_cmp(&b.x));
        let _ = write!(out, r#"<g class="series" data-name="{}">"#, escape(&s.name));
        // Error bars first, so lines and markers sit on top of them.
        for p in &pts {
            let (lo, hi) = (clamp(p.ci_low.unwrap_or(p.y)), p.ci_high.unwrap_or(p.y));
            if (p.ci_low.is_none() && p.ci_high.is_none()) || !lo.is_finite() || !hi.is_finite() {
                continue;
            }
            let (x, ylo, yhi) = (px(p.x), py(lo), py(hi));
            let _ = write!(
                out,
                r#"<path class="errorbar" d="M{x:.1},{ylo:.1} V{yhi:.1} M{:.1},{ylo:.1} H{:.1} M{:.1},{yhi:.1} H{:.1}" stroke="{col}" stroke-width="1.3" fill="none"/>"#,
                x - 4.0,
                x + 4.0,
                x - 4.0,
                x + 4.0
            );
        }
        if pts.len() > 1 {
            let d: Vec<String> = pts
                .iter()
                .enumerate()
                .map(|(k, p)| {
                    format!(
                        "{}{:.1},{:.1}",
                        if k == 0 { 'M' } else { 'L' },
                        px(p.x),
                        py(p.y)
                    )
                })
                .collect();
            let dash = match s.style {
                LineStyle::Solid => "",
                LineStyle::Dashed => r#" stroke-dasharray="6 4""#,
            };
            let _ = write!(
                out,
                r#"<path class="line" d="{}" stroke="{col}" stroke-width="2" fill="none"{dash}/>"#,
                d.join(" ")
            );
        }
        // Markers on every point of short series; long ones (time series) are lines only.
        if pts.len() <= 60 {
            let fill = match s.style {
                LineStyle::Solid => col,
                LineStyle::Dashed => "#ffffff",
            };
            for p in &pts {
                marker(&mut out, c, px(p.x), py(p.y), col, fill);
            }
        }
        out.push_str("</g>");
        legend.entries.push((
            s.name.clone(),
            Swatch::Line {
                color: c,
                style: s.style,
            },
        ));
    }
    out.push_str("</g>");
    if let Some(y2) = &plot.y2 {
        second_axis(
            &mut out,
            y2,
            plot.series.len(),
            &clip,
            &px,
            &drawable,
            &mut legend,
        );
    }
    for m in &plot.marks {
        let f = xa.frac(m.x);
        if !m.x.is_finite() || !(-1e-9..=1.0 + 1e-9).contains(&f) {
            continue;
        }
        let x = px(m.x);
        // The label runs down along the line, inside the frame, clear of the title.
        let _ = write!(
            out,
            r##"<g class="mark"><line x1="{x:.1}" y1="{TOP:.1}" x2="{x:.1}" y2="{b:.1}" stroke="#777" stroke-width="0.8" stroke-dasharray="3 3"/><text x="{:.1}" y="{:.1}" font-size="9" fill="#555" transform="rotate(90 {:.1} {:.1})">{}</text></g>"##,
            x + 2.0,
            TOP + 4.0,
            x + 2.0,
            TOP + 4.0,
            escape(&m.label)
        );
    }
    if let Some(e) = &plot.error_bars {
        legend.entries.push((e.clone(), Swatch::ErrorBar));
    }
    let h = legend.write(&mut out, b + 62.0);
    close_svg(out, h)
}

/// The right-hand axis (from zero) and its lines; colours continue after the left
/// axis' `left` series.
fn second_axis(
    out: &mut String,
    y2: &crate::model::Y2,
    left: usize,
    clip: &str,
    px: &dyn Fn(f64) -> f64,
    drawable: &dyn Fn(f64, f64) -> bool,
    legend: &mut Legend,
) {
    let (x1, b) = (WIDTH - RIGHT, TOP + PLOT_H);
    let hi = y2
        .series
        .iter()
        .flat_map(|s| &s.points)
        .filter(|p| drawable(p.x, p.y))
        .map(|p| p.y)
        .fold(0.0f64, f64::max);
    let ya = Axis::new(Scale::Linear, 0.0, if hi > 0.0 { hi } else { 1.0 }, 6);
    let py = |y: f64| b - ya.frac(y) * PLOT_H;
    out.push_str(r#"<g class="y2-axis" font-size="11">"#);
    for (v, label) in &ya.ticks {
        let y = py(*v);
        let _ = write!(
            out,
            r##"<line x1="{x1:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#333"/><text x="{:.1}" y="{:.1}" text-anchor="start">{}</text>"##,
            x1 + 5.0,
            x1 + 8.0,
            y + 4.0,
            escape(label)
        );
    }
    let _ = write!(
        out,
        r#"<text class="axis-label" transform="translate({:.1},{:.1}) rotate(90)" text-anchor="middle" font-size="13">{}</text></g>"#,
        WIDTH - RIGHT + Y2_EXTRA + 8.0,
        TOP + PLOT_H / 2.0,
        escape(&y2.label)
    );
    let _ = write!(out, r#"<g clip-path="url(#{clip})">"#);
    for (i, s) in y2.series.iter().enumerate() {
        let c = s.color.unwrap_or(left + i);
        let mut pts: Vec<_> = s.points.iter().filter(|p| drawable(p.x, p.y)).collect();
        pts.sort_by(|a, b| a.x.total_cmp(&b.x));
        if pts.len() > 1 {
            let d: Vec<String> = pts
                .iter()
                .enumerate()
                .map(|(k, p)| {
                    format!(
                        "{}{:.1},{:.1}",
                        if k == 0 { 'M' } else { 'L' },
                        px(p.x),
                        py(p.y)
                    )
                })
                .collect();
            let dash = match s.style {
                LineStyle::Solid => "",
                LineStyle::Dashed => r#" stroke-dasharray="6 4""#,
            };
            let _ = write!(
                out,
                r#"<path class="line y2" data-name="{}" d="{}" stroke="{}" stroke-width="1.3" fill="none" opacity="0.8"{dash}/>"#,
                escape(&s.name),
                d.join(" "),
                color(c)
            );
        }
        legend.entries.push((
            format!("{} (right axis)", s.name),
            Swatch::Line {
                color: c,
                style: s.style,
            },
        ));
    }
    out.push_str("</g>");
}

/// A short edge label: about 3 significant digits, k/M/G for large values.
fn edge_label(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let (div, suffix) = match v.abs() {
        a if a >= 1e9 => (1e9, "G"),
        a if a >= 1e6 => (1e6, "M"),
        a if a >= 1e4 => (1e3, "k"),
        _ => (1.0, ""),
    };
    let x = v / div;
    let decimals = (2 - x.abs().log10().floor() as i32).clamp(0, 12) as usize;
    let mut s = format!("{x:.decimals$}");
    if s.contains('.') {
        s = s.trim_end_matches('0').trim_end_matches('.').to_string();
    }
    s + suffix
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

/// Renders a histogram as grouped bars over equal-width buckets labelled by their edges.
pub fn histogram(h: &Histogram) -> String {
    let n = h.buckets();
    let drawn: Vec<(usize, &crate::model::HistogramSeries)> = h
        .series
        .iter()
        .enumerate()
        .filter(|(_, s)| s.counts.len() == n && n > 0)
        .collect();
    let value = |s: &crate::model::HistogramSeries, c: u64| -> f64 {
        match h.y {
            HistogramY::Count => c as f64,
            HistogramY::Percent => {
                let total = s.counts.iter().sum::<u64>() + s.below + s.above;
                if total == 0 {
                    0.0
                } else {
                    100.0 * c as f64 / total as f64
                }
            }
        }
    };
    let ymax = drawn
        .iter()
        .flat_map(|(_, s)| s.counts.iter().map(|c| value(s, *c)))
        .fold(0.0, f64::max);
    let ya = Axis::new(Scale::Linear, 0.0, if ymax > 0.0 { ymax } else { 1.0 }, 6);
    let (x0, x1, b) = (LEFT, WIDTH - RIGHT, TOP + PLOT_H);
    let bw = (x1 - x0) / n.max(1) as f64;

    let mut out = String::new();
    open_svg(&mut out, &h.title);
    let ylab = match h.y {
        HistogramY::Count => "count",
        HistogramY::Percent => "share of requests (%)",
    };
    y_axis(&mut out, &ya, ylab);

    let k = drawn.len().max(1) as f64;
    let inner = bw * 0.84;
    for (i, s) in &drawn {
        let _ = write!(
            out,
            r#"<g class="series" data-name="{}" fill="{}">"#,
            escape(&s.name),
            color(*i)
        );
        for (j, c) in s.counts.iter().enumerate() {
            let v = value(s, *c);
            let pos = drawn.iter().position(|(q, _)| q == i).unwrap_or(0) as f64;
            let x = x0 + bw * j as f64 + (bw - inner) / 2.0 + inner / k * pos;
            let top = b - ya.frac(v) * PLOT_H;
            let _ = write!(
                out,
                r#"<rect class="bar" x="{x:.1}" y="{top:.1}" width="{:.1}" height="{:.1}"><title>{}: [{}, {}) {}</title></rect>"#,
                (inner / k - 0.5).max(0.5),
                (b - top).max(0.0),
                escape(&s.name),
                escape(&edge_label(h.edges[j])),
                escape(&edge_label(h.edges[j + 1])),
                match h.y {
                    HistogramY::Count => format!("{c}"),
                    HistogramY::Percent => format!("{v:.2}% ({c})"),
                }
            );
        }
        out.push_str("</g>");
    }
    // Edge labels at bucket boundaries.
    let labels: Vec<(f64, String)> = h
        .edges
        .iter()
        .enumerate()
        .map(|(j, e)| (x0 + bw * j as f64, edge_label(*e)))
        .collect();
    let label_y = category_axis(
        &mut out,
        &labels,
        bw,
        &format!("{} — {n} buckets [low, high)", h.x_label),
    );
    frame(&mut out);

    let mut legend = Legend {
        entries: Vec::new(),
    };
    for (i, s) in &drawn {
        let total: u64 = s.counts.iter().sum::<u64>() + s.below + s.above;
        let mut label = format!("{} (n = {total}", s.name);
        if s.below > 0 {
            let _ = write!(label, "; {} below {}", s.below, edge_label(h.edges[0]));
        }
        if s.above > 0 {
            let _ = write!(
                label,
                "; {} at or above {}",
                s.above,
                edge_label(h.edges[n])
            );
        }
        label.push(')');
        legend.entries.push((label, Swatch::Bar { color: *i }));
    }
    let hgt = legend.write(&mut out, label_y + 24.0);
    close_svg(out, hgt)
}

/// Renders stacked bars: one bar per case, its stages stacked from the bottom in the stages'
/// order, its total above it. `id` must be unique within the page (it names the
/// description, which says every bar's numbers in words).
pub fn stacked_bars(sb: &StackedBars, id: &str) -> String {
    let drawn: Vec<(&StackedBar, Vec<f64>)> = sb
        .bars
        .iter()
        .filter(|b| b.values.len() == sb.stages.len())
        .map(|b| (b, b.drawn()))
        .collect();
    let sum = |v: &[f64]| v.iter().sum::<f64>();
    let ymax = drawn.iter().map(|(_, v)| sum(v)).fold(0.0, f64::max);
    // Room above the tallest bar for its total.
    let ya = Axis::new(
        Scale::Linear,
        0.0,
        if ymax > 0.0 { ymax * 1.08 } else { 1.0 },
        6,
    );
    let (x0, x1, b) = (LEFT, WIDTH - RIGHT, TOP + PLOT_H);
    let slot = (x1 - x0) / drawn.len().max(1) as f64;
    let bw = (slot * 0.6).min(96.0);
    // Rows rounded to the tenth of a pixel written, so a bar's segments add up to it exactly.
    let py = |v: f64| ((b - ya.frac(v) * PLOT_H) * 10.0).round() / 10.0;
    let unit = if sb.unit.is_empty() {
        String::new()
    } else {
        format!(" {}", sb.unit)
    };

    let mut desc = format!(
        "{}: one bar each, stacked from the bottom: {}.",
        sb.x_label,
        sb.stages.join(", ")
    );
    for (bar, values) in &drawn {
        let parts: Vec<String> = sb
            .stages
            .iter()
            .zip(values)
            .map(|(s, v)| format!("{s} {}", format_value(*v)))
            .collect();
        let _ = write!(
            desc,
            " {}: {}{unit} ({}).",
            bar.name,
            format_value(sum(values)),
            parts.join(", ")
        );
    }
    let mut out = String::new();
    open_svg_wide(
        &mut out,
        &sb.title,
        0.0,
        Some((&format!("{}-desc", crate::escape::slug(id)), &desc)),
    );
    y_axis(&mut out, &ya, &sb.y_label);
    let mut labels = Vec::new();
    for (k, (bar, values)) in drawn.iter().enumerate() {
        let cx = x0 + slot * (k as f64 + 0.5);
        let total = sum(values);
        let _ = write!(
            out,
            r#"<g class="stack" data-name="{}" data-total="{total}">"#,
            escape(&bar.name)
        );
        let mut base = 0.0;
        for (i, (stage, v)) in sb.stages.iter().zip(values).enumerate() {
            if *v <= 0.0 {
                continue;
            }
            let (bottom, top) = (py(base), py(base + v));
            base += v;
            let _ = write!(
                out,
                r#"<rect class="segment" data-stage="{}" data-value="{v}" x="{:.1}" y="{top:.1}" width="{bw:.1}" height="{:.1}" fill="{}"><title>{}: {} {}{unit}</title></rect>"#,
                escape(stage),
                cx - bw / 2.0,
                bottom - top,
                color(i),
                escape(&bar.name),
                escape(stage),
                format_value(*v)
            );
        }
        let _ = write!(
            out,
            r#"<text class="total" x="{cx:.1}" y="{:.1}" text-anchor="middle">{}</text></g>"#,
            py(total) - 5.0,
            escape(&format_value(total))
        );
        labels.push((cx, bar.name.clone()));
    }
    let label_y = category_axis(&mut out, &labels, slot, &sb.x_label);
    frame(&mut out);
    let legend = Legend {
        entries: sb
            .stages
            .iter()
            .enumerate()
            .map(|(i, s)| (s.clone(), Swatch::Bar { color: i }))
            .collect(),
    };
    let h = legend.write(&mut out, label_y + 24.0);
    close_svg(out, h)
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
