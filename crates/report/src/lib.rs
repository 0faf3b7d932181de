//! The report of `kvlab lab`: plain data in, a self-contained HTML page, SVG plots, CSV and
//! JSON out.
//!
//! The lab runner fills a [`Report`] (sections of plots, histograms, stacked bars, tables
//! and notes; the [`helpers`] build the ones issue 4 asks for) and calls [`write_report`].
//! The page needs no network and no script: CSS and SVG are inline. Where a model disagrees
//! with a measurement, [`helpers::model_vs_measurement`] highlights the row and adds a
//! warning note; warnings and data that cannot be drawn as given are listed at the top of
//! the page.
//!
//! ```text
//! lab runner ──► Report (serde) ──► render_html ──► index.html (inline SVG + tables)
//!                                └─► write_report ──► plot-NN-*.svg|csv, table-NN-*.csv,
//!                                                     report.json, index.html
//! ```

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod axis;
mod escape;
pub mod example;
mod files;
pub mod helpers;
mod html;
mod layout;
pub mod model;
mod svg;

pub use axis::format_value;
pub use escape::{escape, slug};
pub use files::{write_report, ReportError, ReportFiles};
pub use html::render_html;
pub use model::*;

/// Renders one line plot as a standalone SVG document (without the XML declaration).
pub fn line_plot_svg(plot: &LinePlot) -> String {
    svg::line_plot(plot, "plot")
}

/// Renders one histogram as a standalone SVG document (without the XML declaration).
pub fn histogram_svg(h: &Histogram) -> String {
    svg::histogram(h)
}

/// Renders stacked bars as a standalone SVG document (without the XML declaration).
pub fn stacked_bars_svg(sb: &StackedBars) -> String {
    svg::stacked_bars(sb, "plot")
}
