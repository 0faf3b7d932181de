//! The report as one self-contained HTML page: inline CSS, inline SVG plots, HTML tables; no
//! script, no external font, image or URL, so it opens offline in any browser.

use std::fmt::Write;

use crate::escape::{escape, slug};
use crate::layout::Planned;
use crate::model::{Item, Level, Note, Report, Table};
use crate::svg;

const CSS: &str = r#"
:root { color-scheme: light; }
body { font-family: "DejaVu Sans", "Liberation Sans", Arial, Helvetica, sans-serif; color: #222;
  background: #fff; margin: 0 auto; max-width: 1000px; padding: 24px 32px 48px; line-height: 1.45; }
h1 { font-size: 28px; margin: 0 0 4px; }
h2 { font-size: 21px; margin: 36px 0 8px; padding-top: 8px; border-top: 2px solid #ddd; }
.subtitle { color: #555; margin: 0 0 12px; font-size: 16px; }
table { border-collapse: collapse; margin: 8px 0 4px; font-size: 14px; }
th, td { border: 1px solid #ccc; padding: 4px 10px; text-align: left; vertical-align: top; }
th { background: #f0f3f7; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.highlight td { background: #fde8e8; color: #8a1010; font-weight: bold; }
tr.highlight td:first-child { border-left: 4px solid #c62828; }
caption { caption-side: top; text-align: left; font-weight: bold; padding: 4px 0; font-size: 15px; }
table.meta th { background: #f7f7f7; font-weight: normal; color: #555; }
figure { margin: 16px 0 20px; }
figure svg { width: 100%; height: auto; border: 1px solid #e6e6e6; }
figcaption { font-size: 14px; color: #444; margin-top: 4px; }
.files { font-size: 13px; color: #666; }
.files a { color: #0b5cad; }
.note { border: 1px solid #9bb7d6; border-left: 6px solid #0072B2; background: #f2f7fc;
  padding: 8px 14px; margin: 14px 0; }
.note.warning { border: 2px solid #c62828; border-left: 8px solid #c62828; background: #fdecea; }
.note .note-title { font-weight: bold; display: block; margin-bottom: 2px; }
.note.warning .note-title { color: #b71c1c; }
.note.warning .note-title::before { content: "\26A0  "; }
.note p { margin: 4px 0; }
nav.toc ol { margin: 4px 0 0; }
footer { margin-top: 40px; color: #777; font-size: 12px; }
"#;

/// Renders the report as a self-contained HTML page.
pub fn render_html(report: &Report) -> String {
    render(report, None)
}

/// Renders the page; with `files`, each plot and table links to its SVG/CSV file.
pub(crate) fn render(report: &Report, files: Option<&[Planned]>) -> String {
    let mut o = String::new();
    let title = escape(&report.title);
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<meta name=\"generator\" content=\"kvlab-report {}\">\n<title>{title}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<header>\n<h1>{title}</h1>\n",
        env!("CARGO_PKG_VERSION")
    );
    if let Some(s) = &report.subtitle {
        let _ = writeln!(o, "<p class=\"subtitle\">{}</p>", escape(s));
    }
    if !report.metadata.is_empty() {
        o.push_str("<table class=\"meta\">\n");
        for (k, v) in &report.metadata {
            let _ = writeln!(
                o,
                "<tr><th scope=\"row\">{}</th><td>{}</td></tr>",
                escape(k),
                escape(v)
            );
        }
        o.push_str("</table>\n");
    }
    o.push_str("</header>\n");

    // Everything that needs a reader's attention, at the top, linked to where it is.
    let mut alerts: Vec<(String, String)> = Vec::new();
    for (si, s) in report.sections.iter().enumerate() {
        for (ii, it) in s.items.iter().enumerate() {
            let anchor = item_id(si, ii);
            if let Item::Note(n) = it {
                if n.level == Level::Warning {
                    alerts.push((anchor.clone(), format!("{}: {}", s.title, n.title)));
                }
            }
            for p in it.problems() {
                alerts.push((anchor.clone(), format!("{} / {}: {p}", s.title, it.title())));
            }
        }
    }
    if !alerts.is_empty() {
        let _ = writeln!(
            o,
            "<div class=\"note warning summary\" role=\"alert\"><span class=\"note-title\">{} warning{} in this report</span><ul>",
            alerts.len(),
            if alerts.len() == 1 { "" } else { "s" }
        );
        for (a, t) in &alerts {
            let _ = writeln!(o, "<li><a href=\"#{a}\">{}</a></li>", escape(t));
        }
        o.push_str("</ul></div>\n");
    }

    if report.sections.len() > 1 {
        o.push_str("<nav class=\"toc\"><strong>Contents</strong><ol>\n");
        for (si, s) in report.sections.iter().enumerate() {
            let _ = writeln!(
                o,
                "<li><a href=\"#{}\">{}</a></li>",
                section_id(si, &s.title),
                escape(&s.title)
            );
        }
        o.push_str("</ol></nav>\n");
    }

    let mut k = 0;
    for (si, s) in report.sections.iter().enumerate() {
        let _ = writeln!(
            o,
            "<section id=\"{}\">\n<h2>{}</h2>",
            section_id(si, &s.title),
            escape(&s.title)
        );
        for para in &s.text {
            let _ = writeln!(o, "<p>{}</p>", escape(para));
        }
        for (ii, it) in s.items.iter().enumerate() {
            let id = item_id(si, ii);
            let links = files
                .and_then(|f| f.get(k))
                .filter(|p| p.svg.is_some() || p.csv.is_some());
            k += 1;
            match it {
                Item::LinePlot(p) => {
                    let svg = svg::line_plot(p, &id);
                    figure(&mut o, "plot", &id, &svg, p.caption.as_deref(), links);
                }
                Item::Histogram(h) => {
                    let svg = svg::histogram(h);
                    figure(
                        &mut o,
                        "plot histogram",
                        &id,
                        &svg,
                        h.caption.as_deref(),
                        links,
                    );
                }
                Item::StackedBars(sb) => {
                    let svg = svg::stacked_bars(sb, &id);
                    figure(
                        &mut o,
                        "plot stacked",
                        &id,
                        &svg,
                        sb.caption.as_deref(),
                        links,
                    );
                }
                Item::Table(t) => table(&mut o, t, &id, links),
                Item::Note(n) => note(&mut o, n, &id),
            }
            let problems = it.problems();
            if !problems.is_empty() {
                let _ = write!(
                    o,
                    "<div class=\"note warning problems\" role=\"alert\"><span class=\"note-title\">{} cannot be shown exactly as given</span><ul>",
                    escape(it.title())
                );
                for p in problems {
                    let _ = write!(o, "<li>{}</li>", escape(&p));
                }
                o.push_str("</ul></div>\n");
            }
        }
        o.push_str("</section>\n");
    }
    let _ = write!(
        o,
        "<footer>Written by kvlab-report {}. Plots are inline SVG; the data behind every plot and table is also in CSV and in report.json beside this page.</footer>\n</body>\n</html>\n",
        env!("CARGO_PKG_VERSION")
    );
    o
}

fn section_id(si: usize, title: &str) -> String {
    format!("s{}-{}", si + 1, slug(title))
}

fn item_id(si: usize, ii: usize) -> String {
    format!("s{}-item{}", si + 1, ii + 1)
}

/// A plot's figure: its inline SVG, then its caption and file links.
fn figure(
    o: &mut String,
    class: &str,
    id: &str,
    svg: &str,
    caption: Option<&str>,
    links: Option<&Planned>,
) {
    let _ = write!(o, "<figure class=\"{class}\" id=\"{id}\">\n{svg}");
    figcaption(o, caption, links);
    o.push_str("</figure>\n");
}

fn figcaption(o: &mut String, caption: Option<&str>, links: Option<&Planned>) {
    if caption.is_none() && links.is_none() {
        return;
    }
    o.push_str("<figcaption>");
    if let Some(c) = caption {
        o.push_str(&escape(c));
    }
    if let Some(l) = links {
        file_links(o, l);
    }
    o.push_str("</figcaption>\n");
}

fn file_links(o: &mut String, l: &Planned) {
    o.push_str(" <span class=\"files\">[");
    let mut first = true;
    for (what, f) in [("SVG", &l.svg), ("CSV", &l.csv)] {
        if let Some(f) = f {
            if !first {
                o.push_str(" · ");
            }
            first = false;
            let _ = write!(o, "<a href=\"{}\">{what}</a>", escape(f));
        }
    }
    o.push_str("]</span>");
}

/// Whether a cell reads as a number (right-aligned).
fn numeric(cell: &str) -> bool {
    let c = cell.trim().trim_end_matches('%').trim();
    !c.is_empty() && c.parse::<f64>().is_ok()
}

fn table(o: &mut String, t: &Table, id: &str, links: Option<&Planned>) {
    let _ = write!(
        o,
        "<table class=\"data\" id=\"{id}\">\n<caption>{}</caption>\n<thead><tr>",
        escape(&t.title)
    );
    for c in &t.columns {
        let _ = write!(o, "<th scope=\"col\">{}</th>", escape(c));
    }
    o.push_str("</tr></thead>\n<tbody>\n");
    for r in &t.rows {
        o.push_str(if r.highlight {
            "<tr class=\"highlight\">"
        } else {
            "<tr>"
        });
        for c in &r.cells {
            let class = if numeric(c) { " class=\"num\"" } else { "" };
            let _ = write!(o, "<td{class}>{}</td>", escape(c));
        }
        o.push_str("</tr>\n");
    }
    o.push_str("</tbody>\n</table>\n");
    if t.caption.is_some() || links.is_some() {
        o.push_str("<p class=\"table-caption\"><small>");
        if let Some(c) = &t.caption {
            o.push_str(&escape(c));
        }
        if let Some(l) = links {
            file_links(o, l);
        }
        o.push_str("</small></p>\n");
    }
}

fn note(o: &mut String, n: &Note, id: &str) {
    let (class, role) = match n.level {
        Level::Info => ("note info", "note"),
        Level::Warning => ("note warning", "alert"),
    };
    let _ = write!(
        o,
        "<aside class=\"{class}\" role=\"{role}\" id=\"{id}\"><span class=\"note-title\">{}</span>",
        escape(&n.title)
    );
    for p in n.text.split("\n\n").filter(|p| !p.trim().is_empty()) {
        let _ = write!(o, "<p>{}</p>", escape(p));
    }
    o.push_str("</aside>\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::example::example_report;

    #[test]
    fn page_is_self_contained() {
        let html = render_html(&example_report());
        // No way to reach the network: no scripts, external resources or absolute URLs
        // (the SVG namespace is an identifier, not a fetch).
        let without_ns = html.replace("xmlns=\"http://www.w3.org/2000/svg\"", "");
        for bad in [
            "<script", "http://", "https://", "src=", "@import", "url(http", "<link",
        ] {
            assert!(!without_ns.contains(bad), "found {bad:?}");
        }
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.trim_end().ends_with("</html>"));
    }

    #[test]
    fn every_item_is_rendered_and_warnings_are_summarised() {
        let r = example_report();
        let html = render_html(&r);
        let plots = r
            .sections
            .iter()
            .flat_map(|s| &s.items)
            .filter(|i| i.is_plot())
            .count();
        assert_eq!(html.matches("<svg ").count(), plots);
        let tables = r
            .sections
            .iter()
            .flat_map(|s| &s.items)
            .filter(|i| matches!(i, Item::Table(_)))
            .count();
        assert_eq!(html.matches("<table class=\"data\"").count(), tables);
        assert!(html.contains("class=\"note warning summary\""));
        assert!(html.contains("<tr class=\"highlight\">"));
        for (_, n) in r.warnings() {
            assert!(html.contains(&escape(&n.title)));
        }
    }

    #[test]
    fn text_is_escaped_everywhere() {
        let r = Report {
            title: "<b>t</b>".into(),
            subtitle: Some("a & b".into()),
            metadata: vec![("<k>".into(), "\"v\"".into())],
            sections: vec![crate::model::Section {
                title: "<s>".into(),
                text: vec!["<p>".into()],
                items: vec![
                    Item::Note(Note::warning("<w>", "<x>")),
                    Item::Table(Table {
                        title: "<t>".into(),
                        columns: vec!["<c>".into()],
                        rows: vec![crate::model::Row::new(["<r>"])],
                        caption: Some("<cap>".into()),
                    }),
                ],
            }],
        };
        let html = render_html(&r);
        for raw in [
            "<b>", "<k>", "<s>", "<p><p>", "<w>", "<x>", "<t>", "<c>", "<r>", "<cap>", "\"v\"",
        ] {
            assert!(!html.contains(raw), "unescaped {raw:?}");
        }
        assert!(html.contains("&lt;b&gt;t&lt;/b&gt;"));
    }

    #[test]
    fn problems_are_shown_not_hidden() {
        let mut r = example_report();
        if let Some(Item::Table(t)) = r.sections[0]
            .items
            .iter_mut()
            .find(|i| matches!(i, Item::Table(_)))
        {
            t.rows.push(crate::model::Row::new(["only one cell"]));
        }
        let html = render_html(&r);
        assert!(html.contains("cannot be shown exactly as given"));
        assert!(html.contains("has 1 cell(s)"));
    }

    #[test]
    fn numeric_cells() {
        assert!(numeric("12.5"));
        assert!(numeric(" 40 % "));
        assert!(numeric("-3e4"));
        assert!(!numeric("epoll"));
        assert!(!numeric(""));
    }
}
