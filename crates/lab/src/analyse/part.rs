//! What every part's section holds, whatever its design: its text, the load generator's
//! warnings, where a proxy's time goes, the table of all points, percentiles and latency
//! histograms; and the small builders of lines, plots and tables the sections share.

use std::fmt::Write as _;

use hdrhistogram::Histogram as Hdr;
use kvlab_analysis::Summary;
use kvlab_report::helpers::{self as h, Curve};
use kvlab_report::{
    format_value, Estimate, Histogram, HistogramSeries, Item, LinePlot, LineStyle, Note, Point,
    Row, Section, Series, StackedBar, StackedBars, Table,
};

use super::points::{by_config, ci_text, systems_of, ProxyPt, Pt};
use super::summary::summary_row;
use super::Analyser;
use crate::generator::Generator;
use crate::runner::RawRun;
use crate::spec::{Design, Experiment, Part};

/// Where a stage's figure is in a point's proxy figures.
type StageOf = fn(&ProxyPt) -> &Summary;

/// The stages a client-measured mean through a proxy adds up from, in the order of the
/// stages table's columns and the chart's segments (bottom up).
const STAGES: [(&str, StageOf); 5] = [
    ("net", |x| &x.net),
    ("queue", |x| &x.queue),
    ("worker without backend", |x| &x.worker_own),
    ("backend", |x| &x.backend),
    ("outside the proxy", |x| &x.outside),
];

/// Where a proxy's requests spend their time as stacked bars, one per point that has the
/// proxy's figures (the stages table's rows); `None` when no point has them.
fn stages_chart(pts: &[Pt]) -> Option<StackedBars> {
    let bars: Vec<StackedBar> = pts
        .iter()
        .filter_map(|p| {
            let x = p.proxy.as_ref()?;
            Some(StackedBar {
                name: p.describe(),
                values: STAGES.iter().map(|(_, stage)| stage(x).mean).collect(),
            })
        })
        .collect();
    if bars.is_empty() {
        return None;
    }
    Some(StackedBars {
        title: "Where a request's time goes, per configuration".into(),
        x_label: "configuration".into(),
        y_label: "time per request (µs)".into(),
        unit: "µs".into(),
        stages: STAGES.iter().map(|(name, _)| (*name).to_string()).collect(),
        bars,
        caption: Some(
            "µs per request, means over repetitions, stacked from the bottom in the legend's \
             order; a bar's total is the client-measured mean (up to the rounding of the \
             proxy's total). The table below gives each stage's confidence interval and what \
             it measures."
                .into(),
        ),
    })
}

/// Where a proxy's requests spend their time, one row per point that has the proxy's
/// figures; `None` when no point has them.
fn stages_table(pts: &[Pt], ci: &str) -> Option<Table> {
    let rows: Vec<Row> = pts
        .iter()
        .filter_map(|p| {
            let x = p.proxy.as_ref()?;
            let mut cells = vec![p.describe(), ci_text(&p.mean)];
            cells.extend(STAGES.iter().map(|(_, stage)| ci_text(stage(x))));
            cells.extend([
                ci_text(&x.total),
                ci_text(&x.queue_len),
                ci_text(&x.backend_requests),
                x.backend_cpu.as_ref().map(ci_text).unwrap_or("—".into()),
            ]);
            Some(Row::new(cells))
        })
        .collect();
    if rows.is_empty() {
        return None;
    }
    let approximate = pts
        .iter()
        .any(|p| p.proxy.as_ref().is_some_and(|x| !x.exact));
    let mut caption = format!(
        "µs per request, means over repetitions ± the half-width of the {ci}. The proxy's \
         stages come from its own stats over each run's measured time: net (its network \
         thread's parse and hand-off, before the queue), queue (waiting for a worker), worker \
         without backend (the worker's own work), backend (the worker waiting for backend \
         replies); proxy total = queue + worker. Outside the proxy = client-measured mean − \
         net − proxy total: the client's, the kernel's and the network's share. So the client \
         mean = net + queue + worker without backend + backend + outside. The mean queue \
         length is the queue's time average (Little's law: throughput × queue time). Backend \
         requests per request: the replicas a write goes to, the parts of a split multi-get \
         (the backend stage waits for the slowest). The backends' CPU is their sum; the server \
         CPU of the other tables is the proxy's own."
    );
    if approximate {
        caption.push_str(
            " Some runs' stage means are approximate: the proxy's stats had no \
             proxy_<stage>_sum_us and proxy_<stage>_count, so they were reconstructed from its \
             cumulative means (rounded to 0.1 µs) times proxy_requests.",
        );
    }
    Some(Table {
        title: "Where a request's time goes".into(),
        columns: ["configuration", "client-measured mean"]
            .into_iter()
            .chain(STAGES.iter().map(|(name, _)| *name))
            .chain([
                "proxy total",
                "mean queue length",
                "backend requests per request",
                "backends' CPU (cores)",
            ])
            .map(String::from)
            .collect(),
        rows,
        caption: Some(caption),
    })
}

fn part_text(exp: &Experiment, part: &Part, pts: &[Pt]) -> Vec<String> {
    let mut t = Vec::new();
    if let Some(d) = &part.description {
        t.push(d.clone());
    }
    let factors: Vec<String> = part
        .factors
        .iter()
        .map(|(f, ls)| {
            format!(
                "{f} ∈ {{{}}}",
                ls.iter()
                    .map(|l| l.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
        .collect();
    let systems: Vec<&str> = part
        .systems
        .iter()
        .map(|&s| exp.systems[s].name.as_str())
        .collect();
    let wl: Vec<String> = part
        .workload
        .iter()
        .map(|(k, v)| format!("{k} = {v}"))
        .collect();
    t.push(format!(
        "Systems: {}. Design: {}{}. {} repetition(s), {} s warm-up + {} s measured per run{}.",
        systems.join(", "),
        match part.design {
            Design::Full => "full factorial",
            Design::TwoK => "2^k factorial",
            Design::Points => "listed points",
        },
        if factors.is_empty() {
            String::new()
        } else {
            format!(" over {}", factors.join(" × "))
        },
        part.repetitions,
        part.warmup,
        part.duration,
        if part.is_trace() {
            " (a trace lasts its rate list)"
        } else {
            ""
        }
    ));
    if !wl.is_empty() {
        t.push(format!("Workload: {}.", wl.join(", ")));
    }
    let n: usize = pts.iter().map(|p| p.runs.len()).sum();
    t.push(format!("{} successful runs.", n));
    t
}

/// The load generator's self-check warnings, one line per kind (the message with its numbers
/// masked): how often it came and its first occurrence, in order of first appearance.
fn bench_warnings(pts: &[Pt]) -> Vec<String> {
    let mut kinds: Vec<(String, usize, String)> = Vec::new();
    for p in pts {
        for res in p.runs.iter().filter_map(|r| r.result.as_ref()) {
            for w in &res.warnings {
                let kind: String = w
                    .chars()
                    .map(|c| if c.is_ascii_digit() { '#' } else { c })
                    .collect();
                match kinds.iter_mut().find(|(k, _, _)| *k == kind) {
                    Some((_, n, _)) => *n += 1,
                    None => kinds.push((kind, 1, format!("at {}: {w}", p.describe()))),
                }
            }
        }
    }
    kinds
        .into_iter()
        .take(12)
        .map(|(_, n, first)| match n {
            1 => format!("1 run {first}"),
            n => format!("{n} runs, e.g. {first}"),
        })
        .collect()
}

fn all_points_table(part: &Part, pts: &[Pt], ci: &str) -> Table {
    let mut columns: Vec<String> = vec!["system".into()];
    columns.extend(part.factors.iter().map(|(f, _)| f.clone()));
    columns.extend(
        [
            "runs",
            &format!("throughput (req/s), mean ± {ci} half-width"),
            "mean latency (µs)",
            "p50 (µs)",
            "p95 (µs)",
            "p99 (µs)",
            "server CPU (cores)",
            "server CPU per request (µs)",
            "generator CPU (cores)",
        ]
        .map(String::from),
    );
    // The regime: every process's CPU (a proxy's backends' too, when the part has any).
    let backends = pts.iter().any(|p| p.backend_cpu.is_some());
    if backends {
        columns.push("backends' CPU (cores)".into());
    }
    let machine = pts.iter().any(|p| p.machine_us.is_some());
    if machine {
        columns.push("machine busy CPU per request (µs)".into());
        columns.push("steal (%)".into());
    }
    let rows = pts
        .iter()
        .map(|p| {
            let mut cells = vec![p.system.clone()];
            for (f, _) in &part.factors {
                cells.push(p.level(f).map(|l| l.to_string()).unwrap_or_default());
            }
            cells.push(format!(
                "{}{}",
                p.runs.len(),
                if p.failed > 0 {
                    format!(" ({} failed)", p.failed)
                } else {
                    String::new()
                }
            ));
            cells.push(ci_text(&p.x));
            let shown = |s: &Summary, absent: bool| match absent {
                true => "–".to_string(),
                false => ci_text(s),
            };
            let (no_mean, no_pcts) = p.absent.as_ref().map_or((false, false), |a| (a.mean, true));
            cells.push(shown(&p.mean, no_mean));
            cells.push(shown(&p.p50, no_pcts));
            cells.push(shown(&p.p95, no_pcts));
            cells.push(shown(&p.p99, no_pcts));
            cells.push(p.cpu.as_ref().map(ci_text).unwrap_or_else(|| "—".into()));
            cells.push(
                p.s_cpu
                    .as_ref()
                    .map(|s| format_value(s.mean * 1e6))
                    .unwrap_or_else(|| "—".into()),
            );
            let cores = |s: &Option<Summary>| s.as_ref().map(ci_text).unwrap_or_else(|| "—".into());
            cells.push(cores(&p.gen_cpu));
            if backends {
                cells.push(cores(&p.backend_cpu));
            }
            if machine {
                cells.push(cores(&p.machine_us));
                cells.push(cores(&p.steal_pct));
            }
            Row::new(cells).highlighted(p.failed > 0)
        })
        .collect();
    Table {
        title: format!("All points of part {}", part.name),
        columns,
        rows,
        caption: Some(
            "Means over repetitions; ± is the half-width of the confidence interval. Latency \
             from the planned send time. Server CPU from /proc/<pid>/stat over the measured \
             time (1 = one core busy; a proxy's own); the generator's, its threads' CPU over \
             the run (an external generator's: its process' over its measured run); a proxy's \
             backends', summed. Together they say which process was the bottleneck: a ratio \
             between systems holds for that regime. The machine's busy CPU per request is \
             every core's user, system, irq and softirq time (/proc/stat) over the requests: \
             what a request costs all processes and the kernel together; steal is the share \
             of time the hypervisor gave the cores to others (runs with much of it are noise). \"–\": the generator does not report \
             that figure (memcaslap: a mean timed from its send, no percentiles)."
                .into(),
        ),
    }
}

/// What the report says about the points an external generator measured: they are in the
/// all-points table only, and which figures their generators leave out.
fn external_note(ext: &[Pt]) -> Option<Note> {
    let mut gens: Vec<Generator> = Vec::new();
    for g in ext.iter().filter_map(|p| p.generator) {
        if !gens.contains(&g) {
            gens.push(g);
        }
    }
    if gens.is_empty() {
        return None;
    }
    let mut text = format!(
        "{} point(s) measured by {} are in the all-points table only: the curves, models, \
         percentile plots and histograms read kvlab bench's latency histograms, which an \
         external generator does not give. Their latency is the generator's own, timed from \
         its send (in closed loop at depth 1, the same moment as the planned one).",
        ext.len(),
        gens.iter()
            .map(|g| g.name())
            .collect::<Vec<_>>()
            .join(" and ")
    );
    for p in ext {
        if let Some(a) = &p.absent {
            if !text.contains(&a.why) {
                text.push_str(&format!(" \"–\" in the table: {}.", a.why));
            }
        }
    }
    Some(Note::info("External load generators", text))
}

/// Histogram buckets shared by every histogram of the report: 24 log-spaced buckets from
/// the smallest 0.1th to the largest 99.9th percentile of all runs.
pub(super) fn common_edges(raws: &[RawRun]) -> Vec<f64> {
    let mut lo = f64::INFINITY;
    let mut hi: f64 = 0.0;
    for r in raws {
        if let Some(hh) = &r.latency_hist {
            if hh.0.is_empty() {
                continue;
            }
            lo = lo.min(hh.0.value_at_quantile(0.001) as f64 / 1000.0);
            hi = hi.max(hh.0.value_at_quantile(0.999) as f64 / 1000.0);
        }
    }
    if !(lo.is_finite() && lo > 0.0 && hi > lo) {
        return h::log_edges(1.0, 10_000.0, 24);
    }
    // Round outwards to "nice" bounds so small changes in data keep the same buckets.
    let lo = 10f64.powf((lo.log10() * 4.0).floor() / 4.0);
    let hi = 10f64.powf((hi.log10() * 4.0).ceil() / 4.0);
    h::log_edges(lo, hi, 24)
}

pub(super) fn series_of(name: &str, edges: &[f64], hist: &Hdr<u64>) -> HistogramSeries {
    HistogramSeries::from_weighted(
        name,
        edges,
        hist.iter_recorded()
            .map(|v| (v.value_iterated_to() as f64 / 1000.0, v.count_at_value())),
    )
}

pub(super) fn line(name: String, style: LineStyle, color: usize, points: Vec<Point>) -> Series {
    Series {
        name,
        style,
        color: Some(color),
        points,
    }
}

/// A configuration's measured line (solid, colour `k`) and two model lines (dashed: the first
/// in the same colour, the second in the paired colour `k + 4`).
pub(super) fn measured_and_models(
    cfg: &str,
    k: usize,
    measured: Vec<Point>,
    [(m1, p1), (m2, p2)]: [(&str, Vec<Point>); 2],
) -> [Series; 3] {
    [
        line(format!("{cfg}: measured"), LineStyle::Solid, k, measured),
        line(format!("{cfg}: {m1}"), LineStyle::Dashed, k, p1),
        line(format!("{cfg}: {m2}"), LineStyle::Dashed, k + 4, p2),
    ]
}

/// A curve over clients (N): `y` of each point, `ps` sorted by N.
pub(super) fn curve(name: String, ps: &[&Pt], y: impl Fn(&Pt) -> Estimate) -> Curve {
    Curve {
        name,
        points: ps.iter().map(|p| (p.population as f64, y(p))).collect(),
    }
}

/// A line plot from zero with error bars of `ci`.
pub(super) fn ci_plot(
    title: &str,
    x_label: &str,
    y_label: &str,
    ci: &str,
    series: Vec<Series>,
) -> LinePlot {
    LinePlot {
        title: title.into(),
        x_label: x_label.into(),
        y_label: y_label.into(),
        y_from_zero: true,
        error_bars: Some(ci.into()),
        series,
        ..LinePlot::default()
    }
}

/// A table with fixed columns.
pub(super) fn table(title: &str, columns: &[&str], rows: Vec<Row>, caption: Option<&str>) -> Table {
    Table {
        title: title.into(),
        columns: columns.iter().map(|c| c.to_string()).collect(),
        rows,
        caption: caption.map(String::from),
    }
}

impl Analyser<'_> {
    /// A part's section: its description, notes on failed runs and generator warnings, the
    /// analysis its factors call for, and the table and distributions of all its points.
    /// Points measured by an external generator go to the all-points table only (see
    /// [`external_note`]); the rest of the analysis reads kvlab bench's histograms.
    pub(super) fn part_section(
        &mut self,
        part: &Part,
        mut all: Vec<Pt>,
        problems: &[String],
    ) -> Section {
        let mut sec = Section {
            title: format!("Part {}", part.name),
            text: part_text(self.exp, part, &all),
            items: Vec::new(),
        };
        // kvlab bench's points first (a stable sort keeps each group's order).
        all.sort_by_key(|p| p.generator.is_some());
        let n = all.iter().take_while(|p| p.generator.is_none()).count();
        let pts = &all[..n];
        if let Some(note) = external_note(&all[n..]) {
            sec.items.push(Item::Note(note));
        }
        if !problems.is_empty() {
            sec.items.push(Item::Note(Note::warning(
                "Failed runs",
                problems.join("\n"),
            )));
        }
        let warns = bench_warnings(pts);
        if !warns.is_empty() {
            sec.items.push(Item::Note(Note::warning(
                "Load generator self-checks",
                warns.join("\n"),
            )));
        }
        if pts.is_empty() {
            self.points_summary(part, &all);
            sec.items
                .push(Item::Table(all_points_table(part, &all, &self.ci)));
            return sec;
        }
        let open = pts.iter().all(|p| p.population == 0);
        let has = |f: &str| part.factors.iter().any(|(n, ls)| n == f && ls.len() > 1);
        if part.is_trace() {
            self.trace_section(part, pts, &mut sec);
        } else if part.design == Design::TwoK {
            self.twok_section(part, pts, &mut sec);
        } else if has("clients") && !open {
            self.clients_section(part, pts, &mut sec);
        } else if has("qps") && open {
            self.rates_section(part, pts, &mut sec);
        } else {
            self.points_summary(part, &all);
        }
        if let Some(chart) = stages_chart(pts) {
            sec.items.push(Item::StackedBars(chart));
        }
        if let Some(t) = stages_table(pts, &self.ci) {
            sec.items.push(Item::Table(t));
        }
        if !part.is_trace() {
            sec.items
                .push(Item::Table(all_points_table(part, &all, &self.ci)));
            self.percentile_items(part, pts, &mut sec);
        }
        sec
    }

    /// A part no analysis of its factors applies to (a comparison of systems or generators
    /// at a few points): every point in the terminal summary with its regime — the
    /// system's CPU and the generator's, in cores.
    fn points_summary(&mut self, part: &Part, all: &[Pt]) {
        const WIDTHS: [usize; 5] = [10, 9, 9, 8, 8];
        let _ = writeln!(self.summary, "part {} — every point", part.name);
        summary_row(
            &mut self.summary,
            "system (levels)",
            &["req/s", "mean µs", "p99 µs", "CPU", "gen CPU"],
            &WIDTHS,
        );
        for p in all {
            let (no_mean, no_pcts) = p.absent.as_ref().map_or((false, false), |a| (a.mean, true));
            let fig = |v: f64, absent: bool| match absent {
                true => "–".to_string(),
                false => format_value(v),
            };
            let cores = |s: &Option<Summary>| {
                s.as_ref()
                    .map_or("—".to_string(), |s| format!("{:.2}", s.mean))
            };
            summary_row(
                &mut self.summary,
                &p.describe(),
                &[
                    format_value(p.x.mean),
                    fig(p.mean.mean, no_mean),
                    fig(p.p99.mean, no_pcts),
                    cores(&p.cpu),
                    cores(&p.gen_cpu),
                ],
                &WIDTHS,
            );
        }
    }

    /// A latency histogram over the report's shared buckets.
    pub(super) fn histogram(&self, title: &str, cases: Vec<HistogramSeries>) -> Histogram {
        h::latency_histogram(title, "µs", self.edges.clone(), cases)
    }

    /// The latency histograms of `pts`, each named by its system.
    fn system_cases<'p, 'a: 'p>(
        &self,
        pts: impl Iterator<Item = &'p Pt<'a>>,
    ) -> Vec<HistogramSeries> {
        pts.filter_map(|p| {
            p.hist
                .as_ref()
                .map(|hh| series_of(&p.system, &self.edges, hh))
        })
        .collect()
    }

    /// Percentiles vs the first factor and latency histograms (same buckets everywhere).
    fn percentile_items(&self, part: &Part, pts: &[Pt], sec: &mut Section) {
        let Some((axis, levels)) = part.factors.first() else {
            // A single point: one histogram comparing the systems.
            let cases = self.system_cases(pts.iter());
            if !cases.is_empty() {
                sec.items.push(Item::Histogram(
                    self.histogram("Latency distribution", cases),
                ));
            }
            return;
        };
        if part.design == Design::TwoK || levels.len() < 2 {
            return;
        }
        let groups = by_config(pts, Some(axis));
        for (cfg, ps) in groups.iter().take(4) {
            let lv: Vec<(String, h::Percentiles)> = ps
                .iter()
                .map(|p| {
                    (
                        p.level(axis).map(|l| l.to_string()).unwrap_or_default(),
                        p.pct,
                    )
                })
                .collect();
            sec.items.push(Item::LinePlot(h::percentiles_vs_factor(
                &format!("Latency percentiles vs {axis}: {cfg}"),
                axis,
                &lv,
                "µs",
            )));
            // One histogram per configuration over (at most 6) levels of the axis.
            let n = ps.len();
            let pick: Vec<usize> = if n <= 6 {
                (0..n).collect()
            } else {
                let mut v: Vec<usize> = (0..6).map(|i| i * (n - 1) / 5).collect();
                v.dedup();
                v
            };
            let cases: Vec<HistogramSeries> = pick
                .iter()
                .filter_map(|&i| {
                    let p = ps[i];
                    let l = p.level(axis)?;
                    p.hist
                        .as_ref()
                        .map(|hh| series_of(&format!("{axis}={l}"), &self.edges, hh))
                })
                .collect();
            if cases.len() >= 2 {
                let mut hg =
                    self.histogram(&format!("Latency distribution by {axis}: {cfg}"), cases);
                hg.caption = Some(
                    "Percent of each case's requests per bucket; every histogram in this report \
                     uses the same buckets."
                        .into(),
                );
                sec.items.push(Item::Histogram(hg));
            }
        }
        // The systems side by side at the middle level of the axis.
        if systems_of(pts).len() >= 2 {
            let mid = &levels[levels.len() / 2];
            let others = &pts[0].levels;
            let cases = self.system_cases(pts.iter().filter(|p| {
                p.level(axis) == Some(mid)
                    && p.levels
                        .iter()
                        .zip(others)
                        .all(|((f, l), (_, o))| f == axis || l == o)
            }));
            if cases.len() >= 2 {
                sec.items.push(Item::Histogram(self.histogram(
                    &format!("Latency distribution at {axis}={mid}: systems compared"),
                    cases,
                )));
            }
        }
    }
}
