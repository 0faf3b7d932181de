//! The report opens in a real browser: writes the example report (every item kind) and
//! loads it in headless Chromium (Debian package `chromium`), checking the parsed DOM, the
//! laid-out page (sizes of plots, text that renders, styles that apply) and a screenshot.
//!
//! Chromium is required, not optional: CI installs it, and a missing browser fails this test
//! with a message saying what to install. `KVLAB_CHROMIUM=/path` picks another binary;
//! `KVLAB_UPDATE_SCREENSHOT=1` copies the screenshot to `docs/report-screenshot.png`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kvlab_report::example::example_report;
use kvlab_report::{write_report, Item};

fn chromium() -> PathBuf {
    if let Some(p) = std::env::var_os("KVLAB_CHROMIUM") {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "KVLAB_CHROMIUM={} is not a file", p.display());
        return p;
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("chromium"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "headless Chromium is needed to test the HTML report but `chromium` is not on \
                 PATH: install Debian's package with `apt-get install -y chromium` (or set \
                 KVLAB_CHROMIUM to a Chromium binary)"
            )
        })
}

/// Runs Chromium headless on `url` with `extra` flags, bounded by coreutils' `timeout` so a
/// hung browser fails the test instead of hanging CI.
fn run_chromium(extra: &[String], url: &str) -> Output {
    let profile = tempfile::tempdir().expect("temp profile dir");
    let mut cmd = Command::new("timeout");
    cmd.args(["--kill-after=10", "120"])
        .arg(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(url);
    let out = cmd.output().expect("cannot start `timeout chromium`");
    assert!(
        out.status.success(),
        "chromium failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn file_url(p: &Path) -> String {
    format!(
        "file://{}",
        p.canonicalize().expect("canonical path").display()
    )
}

fn count_items(pred: impl Fn(&Item) -> bool) -> usize {
    example_report()
        .sections
        .iter()
        .flat_map(|s| &s.items)
        .filter(|i| pred(i))
        .count()
}

/// Appended to a copy of the page: measures what the browser laid out and writes it as JSON
/// into the DOM, which `--dump-dom` then prints. (The report itself has no script.)
const PROBE: &str = r#"<script>
const q = s => [...document.querySelectorAll(s)];
const box = e => { const b = e.getBoundingClientRect(); return [Math.round(b.width), Math.round(b.height)]; };
const r = {
  plots: q('svg.plot').map(box),
  titleWidths: q('svg.plot text.plot-title').map(t => Math.round(t.getComputedTextLength())),
  tickLabels: q('svg.plot g.x-axis text').filter(t => t.getComputedTextLength() > 0).length,
  legends: q('svg.plot g.legend').map(box),
  errorbars: q('svg.plot path.errorbar').map(box).filter(([w, h]) => h > 0).length,
  dashed: q('svg.plot path.line[stroke-dasharray]').length,
  bars: q('svg.plot rect.bar').length,
  segments: q('svg.plot rect.segment').map(box).filter(([w, h]) => w > 0 && h > 0).length,
  described: q('svg.plot[aria-describedby]').filter(s => s.querySelector('desc')).length,
  tables: q('table.data').map(t => [t.rows.length, box(t)[0]]),
  highlightBg: getComputedStyle(q('tr.highlight td')[0]).backgroundColor,
  warningBorder: getComputedStyle(q('aside.note.warning')[0]).borderTopColor,
  warningBox: box(q('aside.note.warning')[0]),
  summary: q('.note.warning.summary li').length,
};
const pre = document.createElement('pre');
pre.id = 'probe';
pre.textContent = JSON.stringify(r);
document.body.appendChild(pre);
</script>"#;

#[test]
fn report_renders_in_headless_chromium() {
    let dir = tempfile::tempdir().expect("temp dir");
    let files = write_report(dir.path(), &example_report()).expect("write report");
    let plots = count_items(Item::is_plot);
    let tables = count_items(|i| matches!(i, Item::Table(_)));

    // 1. The page as the browser parsed it, without any script.
    let dom = String::from_utf8_lossy(
        &run_chromium(&["--dump-dom".into()], &file_url(&files.index)).stdout,
    )
    .into_owned();
    assert!(
        dom.contains("<h1>kvlab lab: example report</h1>"),
        "no title in the DOM:\n{dom:.2000}"
    );
    assert_eq!(
        dom.matches("<svg ").count(),
        plots,
        "inline SVG plots in the DOM"
    );
    assert_eq!(
        dom.matches("<table class=\"data\"").count(),
        tables,
        "tables in the DOM"
    );
    assert!(
        dom.contains("class=\"note warning\""),
        "no warning callout in the DOM"
    );
    assert!(
        dom.contains("DISAGREES"),
        "the model disagreement is not in the DOM"
    );

    // 2. The laid-out page: plots have a size, text renders (fonts found), styles apply.
    let html = std::fs::read_to_string(&files.index).expect("read index");
    let probe_page = dir.path().join("probe.html");
    std::fs::write(
        &probe_page,
        html.replace("</body>", &format!("{PROBE}</body>")),
    )
    .expect("write probe");
    let dom = String::from_utf8_lossy(
        &run_chromium(&["--dump-dom".into()], &file_url(&probe_page)).stdout,
    )
    .into_owned();
    let json = dom
        .split("<pre id=\"probe\">")
        .nth(1)
        .and_then(|s| s.split("</pre>").next())
        .unwrap_or_else(|| panic!("the probe did not run:\n{dom:.2000}"));
    let r: serde_json::Value =
        serde_json::from_str(&json.replace("&quot;", "\"")).expect("probe JSON");
    eprintln!("layout probe: {r}");
    let plot_boxes = r["plots"].as_array().expect("plots");
    assert_eq!(plot_boxes.len(), plots);
    for b in plot_boxes {
        let (w, h) = (b[0].as_f64().unwrap_or(0.0), b[1].as_f64().unwrap_or(0.0));
        assert!(w >= 600.0 && h >= 300.0, "a plot is laid out at {w}x{h}");
    }
    for w in r["titleWidths"].as_array().expect("titles") {
        assert!(
            w.as_f64().unwrap_or(0.0) > 50.0,
            "plot title text has no width: no font?"
        );
    }
    assert!(
        r["tickLabels"].as_u64().unwrap_or(0) >= 5 * plots as u64,
        "tick labels do not render"
    );
    for b in r["legends"].as_array().expect("legends") {
        assert!(b[0].as_f64().unwrap_or(0.0) > 50.0, "an empty legend");
    }
    assert!(
        r["errorbars"].as_u64().unwrap_or(0) >= 20,
        "error bars not drawn"
    );
    assert!(
        r["dashed"].as_u64().unwrap_or(0) >= 3,
        "predicted (dashed) lines not drawn"
    );
    assert!(
        r["bars"].as_u64().unwrap_or(0) >= 30,
        "histogram bars not drawn"
    );
    let segments = example_report()
        .sections
        .iter()
        .flat_map(|s| &s.items)
        .filter_map(|i| match i {
            Item::StackedBars(sb) => Some(
                sb.bars
                    .iter()
                    .flat_map(|b| b.drawn())
                    .filter(|v| *v > 0.0)
                    .count(),
            ),
            _ => None,
        })
        .sum::<usize>();
    assert!(segments >= 10, "the example has too few stacked segments");
    assert_eq!(
        r["segments"].as_u64().unwrap_or(0),
        segments as u64,
        "stacked segments not laid out"
    );
    assert!(
        r["described"].as_u64().unwrap_or(0) >= 1,
        "the stacked bars have no description"
    );
    for t in r["tables"].as_array().expect("tables") {
        assert!(
            t[0].as_u64().unwrap_or(0) >= 2 && t[1].as_f64().unwrap_or(0.0) > 200.0,
            "table {t}"
        );
    }
    assert_eq!(
        r["highlightBg"], "rgb(253, 232, 232)",
        "highlighted rows are not red"
    );
    assert_eq!(
        r["warningBorder"], "rgb(198, 40, 40)",
        "the warning callout is not red"
    );
    assert!(
        r["warningBox"][1].as_f64().unwrap_or(0.0) > 30.0,
        "the warning callout is not visible"
    );
    assert!(
        r["summary"].as_u64().unwrap_or(0) >= 1,
        "warnings are not summarised at the top"
    );

    // 3. A screenshot: a real PNG of the requested size, with something on it.
    let shot = dir.path().join("report.png");
    run_chromium(
        &[
            format!("--screenshot={}", shot.display()),
            "--window-size=1280,2400".into(),
        ],
        &file_url(&files.index),
    );
    let png = std::fs::read(&shot).expect("chromium wrote no screenshot");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    let be32 = |at: usize| u32::from_be_bytes([png[at], png[at + 1], png[at + 2], png[at + 3]]);
    assert_eq!(&png[12..16], b"IHDR");
    assert_eq!((be32(16), be32(20)), (1280, 2400), "screenshot size");
    assert!(
        png.len() > 40_000,
        "screenshot of {} bytes: is the page blank?",
        png.len()
    );
    if std::env::var_os("KVLAB_UPDATE_SCREENSHOT").is_some() {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/report-screenshot.png");
        std::fs::copy(&shot, &docs).expect("copy screenshot to docs/");
    }
}
