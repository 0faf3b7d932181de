//! Line plots: series with error bars and markers on a linear or log x axis, an optional
//! second y axis on the right, and vertical marks.

use std::fmt::Write;

use super::{
    close_svg, color, frame, marker, open_svg_wide, y_axis, Legend, Swatch, LEFT, PLOT_H, RIGHT,
    TOP, WIDTH, Y2_EXTRA,
};
use crate::axis::Axis;
use crate::escape::escape;
use crate::model::{LinePlot, LineStyle, Mark, Scale, Series};

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
    let (xlo, xhi, ylo, yhi) = data_bounds(plot, &drawable, &clamp);
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
    x_ticks(&mut out, &xa, log, &px, &plot.x_label);
    frame(&mut out);

    let mut legend = Legend {
        entries: Vec::new(),
    };
    let _ = write!(out, r#"<g clip-path="url(#{clip})">"#);
    for (i, s) in plot.series.iter().enumerate() {
        let swatch = series_line(
            &mut out,
            s,
            s.color.unwrap_or(i),
            &px,
            &py,
            &drawable,
            &clamp,
        );
        legend.entries.push((s.name.clone(), swatch));
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
    marks(&mut out, &plot.marks, &xa, &px);
    if let Some(e) = &plot.error_bars {
        legend.entries.push((e.clone(), Swatch::ErrorBar));
    }
    let h = legend.write(&mut out, b + 62.0);
    close_svg(out, h)
}

/// The data's extent (x low, x high, y low, y high) over the drawable points and their
/// intervals (the low ends clamped), with a default for none and y from zero if asked.
fn data_bounds(
    plot: &LinePlot,
    drawable: &dyn Fn(f64, f64) -> bool,
    clamp: &dyn Fn(f64) -> f64,
) -> (f64, f64, f64, f64) {
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
        (xlo, xhi, ylo, yhi) = if plot.x_scale == Scale::Log10 {
            (1.0, 10.0, 0.0, 1.0)
        } else {
            (0.0, 1.0, 0.0, 1.0)
        };
    }
    if plot.y_from_zero {
        ylo = ylo.min(0.0);
        yhi = yhi.max(0.0);
    }
    (xlo, xhi, ylo, yhi)
}

/// The vertical grid, the x ticks and their labels, and the x axis' label.
fn x_ticks(out: &mut String, xa: &Axis, log: bool, px: &dyn Fn(f64) -> f64, x_label: &str) {
    let (x0, x1, b) = (LEFT, WIDTH - RIGHT, TOP + PLOT_H);
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
        escape(x_label)
    );
}

/// One series on the left axis in colour slot `c`: its error bars, its line and (when short)
/// its markers; returns its legend swatch.
fn series_line(
    out: &mut String,
    s: &Series,
    c: usize,
    px: &dyn Fn(f64) -> f64,
    py: &dyn Fn(f64) -> f64,
    drawable: &dyn Fn(f64, f64) -> bool,
    clamp: &dyn Fn(f64) -> f64,
) -> Swatch {
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
            marker(out, c, px(p.x), py(p.y), col, fill);
        }
    }
    out.push_str("</g>");
    Swatch::Line {
        color: c,
        style: s.style,
    }
}

/// The marks inside the x range: a dashed vertical line each, its label running down along
/// it.
fn marks(out: &mut String, marks: &[Mark], xa: &Axis, px: &dyn Fn(f64) -> f64) {
    let b = TOP + PLOT_H;
    for m in marks {
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
