//! Bar plots: histograms (grouped bars over buckets labelled by their edges) and stacked
//! bars (one bar per case, its stages stacked, its total above it).

use std::fmt::Write;

use super::{
    category_axis, close_svg, color, frame, open_svg, open_svg_wide, y_axis, Legend, Swatch, LEFT,
    PLOT_H, RIGHT, TOP, WIDTH,
};
use crate::axis::{format_value, Axis};
use crate::escape::escape;
use crate::model::{Histogram, HistogramY, Scale, StackedBar, StackedBars};

/// A short edge label: about 3 significant digits, k/M/G for large values.
pub(super) fn edge_label(v: f64) -> String {
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
