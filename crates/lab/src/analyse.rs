//! From raw runs to the report: statistics over repetitions, the knee, operational laws and
//! queueing models beside the measurements, 2^k effects, and the terminal summary.
//!
//! Everything here is a pure function of the experiment text, `meta.json` and `raw/*.json`,
//! so `kvlab lab analyse DIR` rewrites the same report from the same data.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use hdrhistogram::Histogram as Hdr;
use kvlab_analysis::queueing::{self, Center};
use kvlab_analysis::saturation::{find_knee, KneeOptions, LoadPoint};
use kvlab_analysis::{factorial, summarize, Summary};
use kvlab_report::helpers::{self as h, Curve};
use kvlab_report::{
    format_value, Estimate, Histogram, HistogramSeries, Item, LinePlot, LineStyle, Note, Point,
    Report, Row, Section, Series, StackedBar, StackedBars, Table,
};

use crate::runner::{Meta, ProxyFigures, RawRun};
use crate::spec::{Design, Experiment, Level, Part};

/// The report and the terminal summary.
pub struct Analysis {
    /// The report.
    pub report: Report,
    /// What `kvlab lab` prints at the end.
    pub summary: String,
}

/// Writes the report into `dir/report`; returns the path of `index.html`.
pub fn write(dir: &Path, a: &Analysis) -> anyhow::Result<PathBuf> {
    let files = kvlab_report::write_report(dir.join("report"), &a.report)
        .with_context(|| format!("writing the report in {}", dir.display()))?;
    Ok(files.index)
}

/// Statistics of one point of one part against one system, over its repetitions.
struct Pt<'a> {
    system: String,
    levels: Vec<(String, Level)>,
    runs: Vec<&'a RawRun>,
    failed: usize,
    x: Summary,
    mean: Summary,
    p50: Summary,
    p95: Summary,
    p99: Summary,
    pct: h::Percentiles,
    cpu: Option<Summary>,
    s_cpu: Option<Summary>,
    gen_d: Option<f64>,
    population: usize,
    think_s: f64,
    server_threads: u32,
    hist: Option<Hdr<u64>>,
    proxy: Option<ProxyPt>,
}

/// A proxy's stage means (µs per request) over a point's repetitions, when every successful
/// run has them ([`crate::runner::ProxyFigures`]).
struct ProxyPt {
    /// Proxy total: queue + worker.
    total: Summary,
    net: Summary,
    queue: Summary,
    worker: Summary,
    /// The worker's own time: worker − backend.
    worker_own: Summary,
    backend: Summary,
    /// Client-measured mean − net − total: the client's, kernel's and network's share.
    outside: Summary,
    /// Time-averaged queue length.
    queue_len: Summary,
    /// Backend requests per request.
    backend_requests: Summary,
    /// The backends' CPU, summed (cores).
    backend_cpu: Option<Summary>,
    backends: usize,
    /// Every run's means from exact sums (else reconstructed from rounded means).
    exact: bool,
}

impl ProxyPt {
    fn of(runs: &[&RawRun], conf: f64) -> Option<ProxyPt> {
        let figs: Vec<(&ProxyFigures, f64)> = runs
            .iter()
            .filter_map(|r| Some((r.proxy.as_ref()?, r.result.as_ref()?.latency.mean_us)))
            .collect();
        if figs.is_empty() || figs.len() != runs.len() {
            return None;
        }
        let s = |f: &dyn Fn(&ProxyFigures, f64) -> f64| -> Option<Summary> {
            summ(
                &figs.iter().map(|(p, c)| f(p, *c)).collect::<Vec<_>>(),
                conf,
            )
        };
        let cpus: Vec<f64> = figs.iter().filter_map(|(p, _)| p.backend_cpu).collect();
        Some(ProxyPt {
            total: s(&|p, _| p.total_us)?,
            net: s(&|p, _| p.net_us)?,
            queue: s(&|p, _| p.queue_us)?,
            worker: s(&|p, _| p.worker_us)?,
            worker_own: s(&|p, _| p.worker_us - p.backend_us)?,
            backend: s(&|p, _| p.backend_us)?,
            outside: s(&|p, c| c - p.net_us - p.total_us)?,
            queue_len: s(&|p, _| p.queue_len)?,
            backend_requests: s(&|p, _| p.backend_requests)?,
            backend_cpu: if cpus.len() == figs.len() {
                summ(&cpus, conf)
            } else {
                None
            },
            backends: figs[0].0.backends,
            exact: figs.iter().all(|(p, _)| p.exact),
        })
    }
}

impl Pt<'_> {
    /// The interactive law's R = N/X − Z (s), averaged over repetitions (each with its own
    /// X, so a mean of R is compared with a mean of R).
    fn law_r(&self) -> f64 {
        let v: Vec<f64> = self
            .each_run(|r| r.throughput_qps)
            .into_iter()
            .filter(|x| *x > 0.0)
            .map(|x| h::interactive_law(self.population as f64, x, self.think_s))
            .collect();
        if v.is_empty() {
            f64::NAN
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    }

    /// `f` of each successful repetition's result.
    fn each_run(&self, f: impl Fn(&kvlab_bench::RunResult) -> f64) -> Vec<f64> {
        self.runs
            .iter()
            .filter_map(|r| r.result.as_ref())
            .map(f)
            .collect()
    }

    fn level(&self, f: &str) -> Option<&Level> {
        self.levels.iter().find(|(n, _)| n == f).map(|(_, l)| l)
    }

    /// `factor=level` for every factor but `axis`.
    fn levels_text(&self, axis: Option<&str>) -> Vec<String> {
        self.levels
            .iter()
            .filter(|(f, _)| Some(f.as_str()) != axis)
            .map(|(f, l)| format!("{f}={l}"))
            .collect()
    }

    /// System and the levels of every factor but `axis`.
    fn config(&self, axis: Option<&str>) -> String {
        let rest = self.levels_text(axis);
        if rest.is_empty() {
            self.system.clone()
        } else {
            format!("{} ({})", self.system, rest.join(", "))
        }
    }

    fn describe(&self) -> String {
        let lv = self.levels_text(None);
        if lv.is_empty() {
            self.system.clone()
        } else {
            format!("{} {}", self.system, lv.join(" "))
        }
    }
}

fn est(s: &Summary) -> Estimate {
    match s.ci() {
        Some((l, h)) => Estimate::with_ci(s.mean, l, h),
        None => Estimate::exact(s.mean),
    }
}

fn ci_text(s: &Summary) -> String {
    match s.ci_half_width {
        Some(h) => format!("{} ± {}", format_value(s.mean), format_value(h)),
        None => format_value(s.mean),
    }
}

fn summ(v: &[f64], conf: f64) -> Option<Summary> {
    let v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    summarize(&v, conf).ok()
}

fn points<'a>(exp: &Experiment, part: &Part, raws: &'a [RawRun]) -> (Vec<Pt<'a>>, Vec<String>) {
    let conf = exp.confidence;
    let mut out = Vec::new();
    let mut problems = Vec::new();
    for (k, levels) in part.points.iter().enumerate() {
        for &s in &part.systems {
            let name = &exp.systems[s].name;
            let all: Vec<&RawRun> = raws
                .iter()
                .filter(|r| r.part == part.name && r.point == k && &r.system == name)
                .collect();
            if all.is_empty() {
                continue;
            }
            let ok: Vec<&RawRun> = all
                .iter()
                .copied()
                .filter(|r| r.error.is_none() && r.result.is_some())
                .collect();
            for r in &all {
                if let Some(e) = &r.error {
                    problems.push(format!("run {} ({}) failed: {e}", r.index, r.system));
                }
            }
            let res = |f: &dyn Fn(&kvlab_bench::RunResult) -> f64| -> Vec<f64> {
                ok.iter().filter_map(|r| r.result.as_ref()).map(f).collect()
            };
            let xs = res(&|r| r.throughput_qps);
            let Some(x) = summ(&xs, conf) else {
                problems.push(format!("{name} at point {}: no successful run", k + 1));
                continue;
            };
            let zero = || summ(&[0.0], conf);
            let mean = summ(&res(&|r| r.latency.mean_us), conf).or_else(zero);
            let p50 = summ(&res(&|r| r.latency.p50_us), conf).or_else(zero);
            let p95 = summ(&res(&|r| r.latency.p95_us), conf).or_else(zero);
            let p99 = summ(&res(&|r| r.latency.p99_us), conf).or_else(zero);
            let (Some(mean), Some(p50), Some(p95), Some(p99)) = (mean, p50, p95, p99) else {
                continue;
            };
            let avg = |v: Vec<f64>| v.iter().sum::<f64>() / v.len().max(1) as f64;
            let pct = h::Percentiles {
                p25: avg(res(&|r| r.latency.p25_us)),
                p50: avg(res(&|r| r.latency.p50_us)),
                p75: avg(res(&|r| r.latency.p75_us)),
                p90: avg(res(&|r| r.latency.p90_us)),
                p99: avg(res(&|r| r.latency.p99_us)),
            };
            let cpus: Vec<f64> = ok
                .iter()
                .filter_map(|r| r.cpu.as_ref().map(|c| c.utilization))
                .collect();
            let s_cpus: Vec<f64> = ok
                .iter()
                .filter_map(|r| {
                    let c = r.cpu.as_ref()?;
                    let x = r.result.as_ref()?.throughput_qps;
                    (x > 0.0).then(|| c.utilization / x)
                })
                .collect();
            let gen: Vec<f64> = ok
                .iter()
                .filter_map(|r| {
                    let res = r.result.as_ref()?;
                    (res.throughput_qps > 0.0)
                        .then(|| res.thread_cpu.iter().sum::<f64>() / res.throughput_qps)
                })
                .collect();
            let mut hist: Option<Hdr<u64>> = None;
            for r in &ok {
                if let Some(hh) = &r.latency_hist {
                    match &mut hist {
                        None => hist = Some(hh.0.clone()),
                        Some(acc) => {
                            let _ = acc.add(&hh.0);
                        }
                    }
                }
            }
            let first = ok.first().copied().unwrap_or(all[0]);
            out.push(Pt {
                system: name.clone(),
                levels: levels.clone(),
                failed: all.len() - ok.len(),
                x,
                mean,
                p50,
                p95,
                p99,
                pct,
                cpu: if cpus.len() == ok.len() {
                    summ(&cpus, conf)
                } else {
                    None
                },
                s_cpu: if s_cpus.len() == ok.len() {
                    summ(&s_cpus, conf)
                } else {
                    None
                },
                gen_d: (!gen.is_empty()).then(|| avg(gen.clone())),
                population: first.population,
                think_s: first.think_s,
                server_threads: first.server_threads,
                hist,
                proxy: ProxyPt::of(&ok, conf),
                runs: ok,
            });
        }
    }
    (out, problems)
}

/// Points grouped by configuration (system + levels other than `axis`), in first-seen order.
fn by_config<'p, 'a>(pts: &'p [Pt<'a>], axis: Option<&str>) -> Vec<(String, Vec<&'p Pt<'a>>)> {
    let mut out: Vec<(String, Vec<&Pt>)> = Vec::new();
    for p in pts {
        let c = p.config(axis);
        match out.iter_mut().find(|(n, _)| *n == c) {
            Some((_, v)) => v.push(p),
            None => out.push((c, vec![p])),
        }
    }
    out
}

/// The run's checks collected for the summary.
#[derive(Default)]
struct Tally {
    checks: usize,
    disagree: Vec<String>,
}

impl Tally {
    fn add(&mut self, cs: &[h::ModelCheck]) {
        self.checks += cs.len();
        for c in cs.iter().filter(|c| c.disagrees()) {
            self.disagree.push(format!("{} ({})", c.quantity, c.model));
        }
    }
}

const CI: &str = "95% confidence interval";

fn ci_label(conf: f64) -> String {
    if (conf - 0.95).abs() < 1e-9 {
        CI.into()
    } else {
        format!("{:.0}% confidence interval", conf * 100.0)
    }
}

/// The analysis under way: what every part's builders read (the experiment, the machine, the
/// confidence-interval label, the histogram buckets shared by the whole report) and what they
/// add to besides their own section (the terminal summary, the tally of model checks).
struct Analyser<'a> {
    exp: &'a Experiment,
    meta: &'a Meta,
    ci: String,
    edges: Vec<f64>,
    summary: String,
    tally: Tally,
}

/// Analyses an experiment's raw runs.
pub fn analyse(exp: &Experiment, meta: &Meta, raws: &[RawRun]) -> anyhow::Result<Analysis> {
    let mut an = Analyser {
        exp,
        meta,
        ci: ci_label(exp.confidence),
        edges: common_edges(raws),
        summary: String::new(),
        tally: Tally::default(),
    };
    let mut sections = Vec::new();
    let mut overview = Vec::new();
    for part in &exp.parts {
        let (pts, problems) = points(exp, part, raws);
        if pts.is_empty() {
            overview.push(Item::Note(Note::warning(
                format!("Part {}: no results", part.name),
                if problems.is_empty() {
                    "No run of this part was stored.".to_string()
                } else {
                    problems.join("\n")
                },
            )));
            continue;
        }
        sections.push(an.part_section(part, &pts, &problems));
    }
    let Analyser {
        ci,
        mut summary,
        tally,
        ..
    } = an;
    if tally.checks > 0 {
        let _ = writeln!(
            summary,
            "\nmodel checks: {} of {} disagree with the measurement{}",
            tally.disagree.len(),
            tally.checks,
            if tally.disagree.is_empty() {
                String::new()
            } else {
                format!(
                    " (see the report), e.g. {}",
                    tally
                        .disagree
                        .iter()
                        .take(3)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join("; ")
                )
            }
        );
        overview.push(Item::Note(if tally.disagree.is_empty() {
            Note::info(
                "Models",
                format!(
                    "All {} model checks agree with the measurements.",
                    tally.checks
                ),
            )
        } else {
            Note::warning(
                "Models disagree with measurements",
                format!(
                    "{} of {} model checks disagree (highlighted in the model-vs-measurement \
                     tables below):\n{}",
                    tally.disagree.len(),
                    tally.checks,
                    tally.disagree.join("\n")
                ),
            )
        }));
    }
    let few: Vec<String> = exp
        .parts
        .iter()
        .filter(|p| p.repetitions == 2)
        .map(|p| p.name.clone())
        .collect();
    if !few.is_empty() {
        overview.push(Item::Note(Note::warning(
            "Wide confidence intervals",
            format!(
                "Part(s) {} have 2 repetitions per point: their {ci}s use t = 12.7 (1 degree of \
                 freedom) and are wide, so a model that \"agrees (inside the interval)\" there is \
                 weak evidence; compare the model error column, or raise repetitions.",
                few.join(", ")
            ),
        )));
    }
    for (s, why) in &meta.skipped {
        overview.push(Item::Note(Note::warning(
            format!("System {s} skipped"),
            why.clone(),
        )));
    }
    let mut all = Vec::new();
    all.push(Section {
        title: "Overview".into(),
        text: vec![
            exp.description.clone().unwrap_or_default(),
            format!(
                "{} runs in {} part(s); each point was repeated and is shown with its {ci} \
                 (Student t over repetitions). Latencies are measured by the load generator \
                 from each request's planned send time (µs); server CPU is read from \
                 /proc/<pid>/stat over each run's measured time (utilization law: U = CPU \
                 seconds per second, service demand D = U / X).",
                raws.len(),
                exp.parts.len()
            ),
            format!(
                "The load generator and the servers share this machine's {} core(s): at high \
                 load they compete for CPU, which the single-resource queueing models below do \
                 not capture; where a model disagrees, the report says so.",
                meta.cores
            ),
        ],
        items: overview,
    });
    all.extend(sections);
    let mut metadata = vec![
        ("kvlab version".to_string(), meta.kvlab_version.clone()),
        ("commit".into(), meta.commit.clone()),
        ("date".into(), meta.date.clone()),
        (
            "machine".into(),
            format!(
                "{} cores{}, {:.1} GiB, Linux {}{}",
                meta.cores,
                if meta.cpu_model.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", meta.cpu_model)
                },
                meta.memory_bytes as f64 / (1u64 << 30) as f64,
                meta.kernel,
                if meta.host.is_empty() {
                    String::new()
                } else {
                    format!(", host {}", meta.host)
                }
            ),
        ),
        ("command".into(), meta.command.join(" ")),
        ("experiment".into(), meta.experiment_file.clone()),
        (
            "overrides".into(),
            if meta.overrides.is_empty() {
                "none".into()
            } else {
                meta.overrides.flags()
            },
        ),
        (
            "runs".into(),
            format!(
                "{} stored of {} planned, {:.0} s",
                raws.len(),
                meta.runs,
                meta.elapsed_s
            ),
        ),
    ];
    let mut systems: Vec<(String, String)> = Vec::new();
    for r in raws {
        let key = format!("system {}", r.system);
        let val = format!("{} — {}", r.version, r.command.join(" "));
        if !systems.iter().any(|(k, v)| *k == key && *v == val) {
            systems.push((key, val));
        }
    }
    systems.truncate(12);
    metadata.extend(systems);
    let report = Report {
        title: format!("kvlab lab: {}", exp.name),
        subtitle: exp.description.clone(),
        metadata,
        sections: all,
    };
    Ok(Analysis { report, summary })
}

impl Analyser<'_> {
    /// A part's section: its description, notes on failed runs and generator warnings, the
    /// analysis its factors call for, and the table and distributions of all its points.
    fn part_section(&mut self, part: &Part, pts: &[Pt], problems: &[String]) -> Section {
        let mut sec = Section {
            title: format!("Part {}", part.name),
            text: part_text(self.exp, part, pts),
            items: Vec::new(),
        };
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
        }
        if let Some(chart) = stages_chart(pts) {
            sec.items.push(Item::StackedBars(chart));
        }
        if let Some(t) = stages_table(pts, &self.ci) {
            sec.items.push(Item::Table(t));
        }
        if !part.is_trace() {
            sec.items
                .push(Item::Table(all_points_table(part, pts, &self.ci)));
            self.percentile_items(part, pts, &mut sec);
        }
        sec
    }

    /// A model check at the experiment's tolerance.
    fn check(
        &self,
        quantity: String,
        model: &str,
        unit: &str,
        predicted: f64,
        measured: Estimate,
    ) -> h::ModelCheck {
        h::ModelCheck {
            quantity,
            model: model.into(),
            unit: unit.into(),
            predicted,
            measured,
            tolerance: self.exp.tolerance,
        }
    }

    /// Tallies `checks` and returns their model-vs-measurement table (with `title` and
    /// `caption` when given) and notes.
    fn model_items(
        &mut self,
        checks: &[h::ModelCheck],
        title: Option<&str>,
        caption: Option<&str>,
    ) -> Vec<Item> {
        self.tally.add(checks);
        let mut items = h::model_vs_measurement(checks, &self.ci);
        if let Some(Item::Table(t)) = items.first_mut() {
            if let Some(title) = title {
                t.title = title.into();
            }
            if let Some(caption) = caption {
                t.caption = Some(caption.into());
            }
        }
        items
    }
}

/// The closed network an MVA section models.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mva {
    /// The server as its CPU, the load generator's CPU and a delay.
    Server,
    /// A proxy as the stages it measures: network thread, workers, backends, and a delay.
    Proxy,
}

impl Mva {
    /// Its name in model checks.
    fn name(self) -> &'static str {
        match self {
            Mva::Server => "MVA",
            Mva::Proxy => "proxy MVA",
        }
    }

    fn inputs_note_title(self) -> &'static str {
        match self {
            Mva::Server => "MVA inputs",
            Mva::Proxy => "Proxy MVA inputs",
        }
    }

    fn note(self) -> &'static str {
        match self {
            Mva::Server => {
                "Exact MVA of a closed network whose service demands are measured at the lowest \
                 load: the server's CPU seconds per request D = U/X (utilization law, U from \
                 /proc/<pid>/stat), split for m worker threads into a queueing center D/m and a \
                 delay D(m−1)/m (Seidmann's approximation of an m-server center); the load \
                 generator's CPU seconds per request as a queueing center; and the rest of the \
                 measured response time at that load (network stack, scheduling) as a delay \
                 center. The generator and the server share the machine's cores, which this \
                 network does not model. For a proxy, the server's CPU is the proxy's own \
                 (its backends' is not included)."
            }
            Mva::Proxy => {
                "Exact MVA of the proxy as a network of queues, with demands from the proxy's \
                 own stage times at the lowest load: its network thread (a queueing center, D = \
                 the net stage's mean); its m worker threads (D = worker − backend time, as a \
                 queueing center D/m and a delay D(m−1)/m, Seidmann's approximation of an \
                 m-server center); each of its B backends (a queueing center with D = the \
                 backend stage's mean / B: a request waits for one backend); and the rest of \
                 the client-measured response time (client, kernel, network, and the hand-off \
                 to a worker at that load) as a delay. It leaves out that the generator, the \
                 proxy and the backends share the machine's cores, that a worker takes up to \
                 64 requests at once, and that a replicated write or a split multi-get waits \
                 for several backends."
            }
        }
    }
}

/// An m-server center with demand `d` (s) as Seidmann's pair: a queueing center D/m and,
/// for m > 1, a delay D(m−1)/m; `what` names both (its parenthesis left open).
fn m_servers(what: String, d: f64, m: u32) -> Vec<Center> {
    let mut out = vec![Center::queueing(
        format!("{what}: D/m queueing)"),
        d / f64::from(m),
    )];
    if m > 1 {
        out.push(Center::delay(
            format!("{what}: D·(m−1)/m delay)"),
            d * f64::from(m - 1) / f64::from(m),
        ));
    }
    out
}

/// A proxy's network of queues from a configuration's lowest load (see [`Mva::note`]);
/// `None` without the proxy's figures. Centers with no demand are left out.
fn proxy_centers(low: &Pt) -> Option<Vec<Center>> {
    let px = low.proxy.as_ref()?;
    let us = 1e-6;
    let m = low.server_threads.max(1);
    let mut centers = vec![Center::queueing("proxy network thread", px.net.mean * us)];
    centers.extend(m_servers(
        format!("proxy workers ({m} thread(s)"),
        px.worker_own.mean * us,
        m,
    ));
    let b = px.backends.max(1);
    for i in 0..b {
        centers.push(Center::queueing(
            format!("backend {} of {b}", i + 1),
            px.backend.mean * us / b as f64,
        ));
    }
    centers.push(Center::delay(
        "outside the proxy (client, kernel, network) and hand-off",
        (low.mean.mean - px.net.mean - px.worker.mean) * us,
    ));
    centers.retain(|c| c.demand > 0.0);
    Some(centers)
}

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
        ]
        .map(String::from),
    );
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
            cells.push(ci_text(&p.mean));
            cells.push(ci_text(&p.p50));
            cells.push(ci_text(&p.p95));
            cells.push(ci_text(&p.p99));
            cells.push(p.cpu.as_ref().map(ci_text).unwrap_or_else(|| "—".into()));
            cells.push(
                p.s_cpu
                    .as_ref()
                    .map(|s| format_value(s.mean * 1e6))
                    .unwrap_or_else(|| "—".into()),
            );
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
             time (1 = one core busy)."
                .into(),
        ),
    }
}

/// Histogram buckets shared by every histogram of the report: 24 log-spaced buckets from
/// the smallest 0.1th to the largest 99.9th percentile of all runs.
fn common_edges(raws: &[RawRun]) -> Vec<f64> {
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

fn series_of(name: &str, edges: &[f64], hist: &Hdr<u64>) -> HistogramSeries {
    HistogramSeries::from_weighted(
        name,
        edges,
        hist.iter_recorded()
            .map(|v| (v.value_iterated_to() as f64 / 1000.0, v.count_at_value())),
    )
}

/// The systems of `pts`, in order of first appearance.
fn systems_of<'p>(pts: &'p [Pt]) -> Vec<&'p str> {
    let mut v: Vec<&str> = Vec::new();
    for p in pts {
        if !v.contains(&p.system.as_str()) {
            v.push(&p.system);
        }
    }
    v
}

fn line(name: String, style: LineStyle, color: usize, points: Vec<Point>) -> Series {
    Series {
        name,
        style,
        color: Some(color),
        points,
    }
}

/// A configuration's measured line (solid, colour `k`) and two model lines (dashed: the first
/// in the same colour, the second in the paired colour `k + 4`).
fn measured_and_models(
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

/// Appends a row of a terminal summary table: `first` left-aligned in 34 columns, then each
/// cell right-aligned in its column's width (a table's header and rows share `widths`).
fn summary_row(out: &mut String, first: &str, cells: &[impl AsRef<str>], widths: &[usize]) {
    let _ = write!(out, "  {first:<34}");
    for (c, w) in cells.iter().zip(widths) {
        let _ = write!(out, " {:>w$}", c.as_ref());
    }
    out.push('\n');
}

/// A curve over clients (N): `y` of each point, `ps` sorted by N.
fn curve(name: String, ps: &[&Pt], y: impl Fn(&Pt) -> Estimate) -> Curve {
    Curve {
        name,
        points: ps.iter().map(|p| (p.population as f64, y(p))).collect(),
    }
}

/// A line plot from zero with error bars of `ci`.
fn ci_plot(title: &str, x_label: &str, y_label: &str, ci: &str, series: Vec<Series>) -> LinePlot {
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
fn table(title: &str, columns: &[&str], rows: Vec<Row>, caption: Option<&str>) -> Table {
    Table {
        title: title.into(),
        columns: columns.iter().map(|c| c.to_string()).collect(),
        rows,
        caption: caption.map(String::from),
    }
}

impl Analyser<'_> {
    /// A latency histogram over the report's shared buckets.
    fn histogram(&self, title: &str, cases: Vec<HistogramSeries>) -> Histogram {
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

    /// Closed loop over clients: throughput and response time vs clients, the maximum and the
    /// knee of each configuration, the interactive response-time law, then MVA.
    fn clients_section(&mut self, part: &Part, pts: &[Pt], sec: &mut Section) {
        let mut groups = by_config(pts, Some("clients"));
        for (_, ps) in &mut groups {
            ps.sort_by_key(|p| p.population);
        }
        let tput: Vec<Curve> = groups
            .iter()
            .map(|(cfg, ps)| curve(cfg.clone(), ps, |p| est(&p.x)))
            .collect();
        let resp: Vec<Curve> = groups
            .iter()
            .map(|(cfg, ps)| curve(cfg.clone(), ps, |p| est(&p.mean)))
            .collect();
        let pred: Vec<Curve> = groups
            .iter()
            .map(|(cfg, ps)| {
                curve(format!("{cfg} (interactive law)"), ps, |p| {
                    Estimate::exact(p.law_r() * 1e6)
                })
            })
            .collect();
        const WIDTHS: [usize; 4] = [24, 6, 7, 14];
        let _ = writeln!(
            self.summary,
            "part {} — closed loop, throughput vs clients",
            part.name
        );
        summary_row(
            &mut self.summary,
            "system",
            &["max throughput (req/s)", "at N", "knee N", "p99 at knee"],
            &WIDTHS,
        );
        let mut checks = Vec::new();
        let mut maxes = Vec::new();
        let mut knee_rows = Vec::new();
        for (cfg, ps) in &groups {
            for p in ps {
                checks.push(self.check(
                    format!("{cfg}: mean response time at N = {}", p.population),
                    "interactive law R = N/X − Z",
                    "µs",
                    p.law_r() * 1e6,
                    est(&p.mean),
                ));
            }
            let Some(best) = ps.iter().max_by(|a, b| a.x.mean.total_cmp(&b.x.mean)) else {
                continue;
            };
            maxes.push(h::MaxThroughput {
                config: cfg.clone(),
                max: est(&best.x),
                at_clients: best.population as f64,
            });
            let lps: Vec<LoadPoint> = ps
                .iter()
                .map(|p| LoadPoint {
                    clients: p.population as f64,
                    throughput: p.x.mean,
                    ci_half_width: p.x.ci_half_width,
                })
                .collect();
            let knee = find_knee(&lps, KneeOptions::default()).ok();
            let knee_p99 = knee
                .as_ref()
                .and_then(|k| {
                    ps.iter()
                        .find(|p| (p.population as f64 - k.clients).abs() < 1e-9)
                })
                .map(|p| p.p99.mean);
            summary_row(
                &mut self.summary,
                cfg,
                &[
                    ci_text(&best.x),
                    best.population.to_string(),
                    knee.as_ref()
                        .map(|k| format_value(k.clients))
                        .unwrap_or("—".into()),
                    knee_p99
                        .map(|v| format!("{} µs", format_value(v)))
                        .unwrap_or("—".into()),
                ],
                &WIDTHS,
            );
            if let Some(k) = &knee {
                knee_rows.push(Row::new([
                    cfg.clone(),
                    format_value(k.clients),
                    format_value(k.throughput),
                    knee_p99.map(format_value).unwrap_or("—".into()),
                    format!("{:?}", k.rule),
                    if k.saturated {
                        "yes"
                    } else {
                        "no (still rising)"
                    }
                    .into(),
                ]));
            }
        }
        let mut tp = h::throughput_vs_clients(&tput, &self.ci);
        let mut rp = h::response_time_vs_clients(&resp, &pred, "µs", &self.ci);
        if tput.iter().flat_map(|c| &c.points).all(|p| p.0 > 0.0) {
            tp.x_scale = kvlab_report::Scale::Log10;
            rp.x_scale = kvlab_report::Scale::Log10;
        }
        sec.items.push(Item::LinePlot(tp));
        sec.items
            .push(Item::Table(h::max_throughput_table(&maxes, &self.ci)));
        sec.items.push(Item::Table(table(
            "Knee of throughput vs clients",
            &[
                "configuration",
                "knee (clients N)",
                "throughput at knee (req/s)",
                "p99 at knee (µs)",
                "rule",
                "saturated",
            ],
            knee_rows,
            Some(
                "The knee: the last N before the throughput gain per added client falls below \
                 10 % of the initial slope, or the first N reaching 95 % of the maximum.",
            ),
        )));
        sec.items.push(Item::LinePlot(rp));
        let items = self.model_items(&checks, None, None);
        sec.items.extend(items);
        self.mva_items(&groups, sec, Mva::Server);
        if groups
            .iter()
            .any(|(_, ps)| ps.iter().any(|p| p.proxy.is_some()))
        {
            self.mva_items(&groups, sec, Mva::Proxy);
        }
    }

    /// The server model's centers from a configuration's lowest load: the server's CPU
    /// (m worker threads, at most the cores: a queueing center D/m and a delay D(m−1)/m), the
    /// load generator's CPU, and the rest of the measured response time as a delay.
    fn server_centers(&self, low: &Pt) -> Vec<Center> {
        // R at the lowest load, from the interactive law's measured side.
        let r1 = low.mean.mean / 1e6;
        let m = low.server_threads.clamp(1, self.meta.cores.max(1) as u32);
        let mut centers = Vec::new();
        let mut rest = r1;
        match &low.s_cpu {
            Some(d) if d.mean > 0.0 => {
                centers.extend(m_servers(format!("server CPU ({m} thread(s)"), d.mean, m));
                rest -= d.mean;
            }
            _ => {}
        }
        if let Some(g) = low.gen_d {
            if g > 0.0 {
                centers.push(Center::queueing("load generator CPU", g));
                rest -= g;
            }
        }
        if centers.is_empty() {
            centers.push(Center::queueing("server (D = R at the lowest load)", r1));
            rest = 0.0;
        }
        if rest > 0.0 {
            centers.push(Center::delay("network, kernel and wake-ups", rest));
        }
        centers
    }

    /// MVA with measured demands, and its asymptotic bounds, beside the measured curves
    /// (`groups`: each configuration's points sorted by clients), for the `model`'s closed
    /// network; configurations it has no centers for are left out.
    fn mva_items(&mut self, groups: &[(String, Vec<&Pt>)], sec: &mut Section, model: Mva) {
        let mut xs = Vec::new();
        let mut rs = Vec::new();
        let mut checks = Vec::new();
        let mut inputs = Vec::new();
        for (k, (cfg, ps)) in groups.iter().enumerate() {
            let Some(low) = ps.first().copied() else {
                continue;
            };
            let z = low.think_s;
            let centers = match model {
                Mva::Server => self.server_centers(low),
                Mva::Proxy => match proxy_centers(low) {
                    Some(c) => c,
                    None => continue,
                },
            };
            let max_n = ps.last().map_or(1, |p| p.population.max(1)) as u32;
            let Ok(sol) = queueing::mva_centers(&centers, z, max_n.min(100_000)) else {
                continue;
            };
            for c in &centers {
                inputs.push(Row::new([
                    cfg.clone(),
                    c.name.clone(),
                    format!("{:?}", c.kind),
                    format_value(c.demand * 1e6),
                ]));
            }
            inputs.push(Row::new([
                cfg.clone(),
                "think time Z".into(),
                "Delay".into(),
                format_value(z * 1e6),
            ]));
            let mut mx = Vec::new();
            let mut mr = Vec::new();
            let mut px = Vec::new();
            let mut pr = Vec::new();
            let mut bx = Vec::new();
            let mut br = Vec::new();
            for p in ps {
                let n = p.population.max(1);
                let Some(s) = sol.get(n - 1) else { continue };
                let nf = n as f64;
                mx.push(Point::at(nf, est(&p.x)));
                mr.push(Point::at(nf, est(&p.mean)));
                px.push(Point::new(nf, s.throughput));
                pr.push(Point::new(nf, s.response_time * 1e6));
                if let Ok(b) = queueing::asymptotic_bounds_centers(&centers, z, nf) {
                    bx.push(Point::new(nf, b.throughput_upper));
                    br.push(Point::new(nf, b.response_time_lower * 1e6));
                }
                checks.push(self.check(
                    format!("{cfg}: throughput at N = {n}"),
                    model.name(),
                    "req/s",
                    s.throughput,
                    est(&p.x),
                ));
                checks.push(self.check(
                    format!("{cfg}: mean response time at N = {n}"),
                    model.name(),
                    "µs",
                    s.response_time * 1e6,
                    est(&p.mean),
                ));
            }
            xs.extend(measured_and_models(
                cfg,
                k,
                mx,
                [("MVA", px), ("upper bound min(N/(D+Z), 1/Dmax)", bx)],
            ));
            rs.extend(measured_and_models(
                cfg,
                k,
                mr,
                [("MVA", pr), ("lower bound max(D, N·Dmax − Z)", br)],
            ));
        }
        if xs.is_empty() {
            return;
        }
        let log = groups
            .iter()
            .flat_map(|(_, ps)| ps.iter())
            .all(|p| p.population > 0);
        let x_scale = if log {
            kvlab_report::Scale::Log10
        } else {
            kvlab_report::Scale::Linear
        };
        let (inputs_title, what) = match model {
            Mva::Server => ("MVA service demands (measured)", ""),
            Mva::Proxy => (
                "Proxy MVA service demands (measured)",
                " through the proxy's network of queues",
            ),
        };
        sec.items.push(Item::Note(Note::info(
            model.inputs_note_title(),
            model.note(),
        )));
        sec.items.push(Item::Table(table(
            inputs_title,
            &["configuration", "center", "kind", "demand (µs per request)"],
            inputs,
            None,
        )));
        for (title, y_label, series) in [
            (
                format!("Throughput vs clients{what}: measured, MVA and asymptotic bound"),
                "throughput (req/s)",
                xs,
            ),
            (
                format!("Response time vs clients{what}: measured, MVA and asymptotic bound"),
                "mean response time (µs)",
                rs,
            ),
        ] {
            sec.items.push(Item::LinePlot(LinePlot {
                x_scale,
                ..ci_plot(&title, "clients (N)", y_label, &self.ci, series)
            }));
        }
        let title = format!("Model vs measurement: {}", model.name());
        let items = self.model_items(&checks, Some(&title), None);
        sec.items.extend(items);
    }

    /// Open loop over offered rates: p95, server CPU and achieved rate vs offered rate, and
    /// M/M/1, M/M/m and the utilization law from the lowest rate's measurements.
    fn rates_section(&mut self, part: &Part, pts: &[Pt], sec: &mut Section) {
        let offered = |p: &Pt| p.level("qps").and_then(Level::number).unwrap_or(0.0);
        let mut groups = by_config(pts, Some("qps"));
        for (_, ps) in &mut groups {
            ps.sort_by(|a, b| offered(a).total_cmp(&offered(b)));
        }
        // One measured line per configuration: `y` of each point vs its offered rate.
        let measured = |y: &dyn Fn(&Pt) -> Option<Estimate>| -> Vec<Series> {
            groups
                .iter()
                .enumerate()
                .map(|(k, (cfg, ps))| {
                    let points = ps
                        .iter()
                        .filter_map(|p| Some(Point::at(offered(p), y(p)?)))
                        .collect();
                    line(cfg.clone(), LineStyle::Solid, k, points)
                })
                .collect()
        };
        let p95s = measured(&|p| Some(est(&p.p95)));
        let achieved = measured(&|p| Some(est(&p.x)));
        let cpus = measured(&|p| p.cpu.as_ref().map(est));
        const WIDTHS: [usize; 4] = [10, 12, 12, 12];
        let _ = writeln!(self.summary, "part {} — open loop, rate scan", part.name);
        summary_row(
            &mut self.summary,
            "system",
            &["offered", "achieved", "p95 (µs)", "server CPU"],
            &WIDTHS,
        );
        for (cfg, ps) in &groups {
            for p in ps {
                summary_row(
                    &mut self.summary,
                    cfg,
                    &[
                        format_value(offered(p)),
                        format_value(p.x.mean),
                        format_value(p.p95.mean),
                        p.cpu
                            .as_ref()
                            .map(|c| format!("{:.2} cores", c.mean))
                            .unwrap_or("—".into()),
                    ],
                    &WIDTHS,
                );
            }
        }
        sec.items
            .push(Item::Table(self.sustained_table(&groups, offered)));
        let mut means = Vec::new();
        let mut checks = Vec::new();
        let mut util_checks = Vec::new();
        let mut inputs = Vec::new();
        for (k, (cfg, ps)) in groups.iter().enumerate() {
            // Queueing models from the lowest rate's measurements.
            let Some(low) = ps.first().copied() else {
                continue;
            };
            let Some(s) = low.s_cpu.as_ref().map(|s| s.mean).filter(|s| *s > 0.0) else {
                continue;
            };
            let m = low.server_threads.max(1);
            let delay = (low.mean.mean / 1e6 - s).max(0.0);
            inputs.push(Row::new([
                cfg.clone(),
                format_value(s * 1e6),
                m.to_string(),
                format_value(delay * 1e6),
                format_value(offered(low)),
            ]));
            let mut m1 = Vec::new();
            let mut mm = Vec::new();
            let mut meas = Vec::new();
            for p in ps {
                let lambda = p.x.mean;
                let r1 = queueing::mm1(lambda, s)
                    .map(|q| (q.response_time + delay) * 1e6)
                    .unwrap_or(f64::INFINITY);
                let rm = queueing::mmm(lambda, s, m)
                    .map(|q| (q.response_time + delay) * 1e6)
                    .unwrap_or(f64::INFINITY);
                let o = offered(p);
                meas.push(Point::at(o, est(&p.mean)));
                if r1.is_finite() {
                    m1.push(Point::new(o, r1));
                }
                if rm.is_finite() {
                    mm.push(Point::new(o, rm));
                }
                for (model, v) in [("M/M/1", r1), (format!("M/M/{m} (Erlang C)").as_str(), rm)] {
                    checks.push(self.check(
                        format!("{cfg}: mean response time at {} req/s", format_value(o)),
                        model,
                        "µs",
                        v,
                        est(&p.mean),
                    ));
                }
                if let Some(c) = &p.cpu {
                    util_checks.push(self.check(
                        format!("{cfg}: server CPU at {} req/s", format_value(o)),
                        "utilization law U = X·S",
                        "cores",
                        lambda * s,
                        est(c),
                    ));
                }
            }
            means.extend(measured_and_models(
                cfg,
                k,
                meas,
                [("M/M/1", m1), (&format!("M/M/{m}"), mm)],
            ));
        }
        let plot = |title: &str, y_label: &str, series: Vec<Series>| {
            Item::LinePlot(ci_plot(
                title,
                "offered rate (req/s)",
                y_label,
                &self.ci,
                series,
            ))
        };
        sec.items.push(plot(
            "p95 latency vs offered rate",
            "p95 latency (µs)",
            p95s,
        ));
        sec.items.push(plot(
            "Server CPU vs offered rate",
            "server CPU (cores busy)",
            cpus,
        ));
        sec.items.push(plot(
            "Achieved vs offered rate",
            "throughput (req/s)",
            achieved,
        ));
        if inputs.is_empty() {
            sec.items.push(Item::Note(Note::warning(
                "No queueing models",
                "The server's CPU time was not measured (an external system without pid), so \
                 the service time S = U/X is unknown.",
            )));
            return;
        }
        sec.items.push(Item::Note(Note::info(
            "Queueing models",
            "Service time S = U/X: the server's CPU seconds per request at the lowest rate \
             (utilization law, U from /proc/<pid>/stat). M/M/1 treats the server as one queue \
             with that service time; M/M/m as m worker threads (Erlang C). Both are given the \
             measured arrival rate λ = X and add a fixed delay d = R − S measured at the lowest \
             rate (network stack, client). An unstable queue (λS/m ≥ 1) predicts an infinite \
             response time.",
        )));
        sec.items.push(Item::Table(table(
            "Queueing model inputs (measured)",
            &[
                "configuration",
                "service time S (µs CPU per request)",
                "servers m (worker threads)",
                "fixed delay d (µs)",
                "measured at (req/s)",
            ],
            inputs,
            None,
        )));
        sec.items.push(plot(
            "Mean response time vs offered rate: measured, M/M/1, M/M/m",
            "mean response time (µs)",
            means,
        ));
        let items = self.model_items(&checks, Some("Model vs measurement: M/M/1 and M/M/m"), None);
        sec.items.extend(items);
        let items = self.model_items(
            &util_checks,
            Some("Model vs measurement: utilization law with S from the lowest rate"),
            Some(
                "Whether the CPU cost per request stays what it was at the lowest rate. Model \
                 error = (predicted − measured) / measured.",
            ),
        );
        sec.items.extend(items);
    }

    /// The sustained rate of each configuration of a rate scan: the largest offered rate whose
    /// mean p95 over repetitions is below the experiment's `slo_p95_us` with at least 99 % of
    /// it achieved and no failed run, every lower rate passing too (so one lucky point above a
    /// failing one does not count). Also added to the terminal summary.
    fn sustained_table(
        &mut self,
        groups: &[(String, Vec<&Pt>)],
        offered: impl Fn(&Pt) -> f64,
    ) -> Table {
        let bound = self.exp.slo_p95_us;
        let passes = |p: &Pt| p.failed == 0 && p.p95.mean < bound && p.x.mean >= 0.99 * offered(p);
        let mut rows = Vec::new();
        let _ = writeln!(
            self.summary,
            "  sustained with p95 < {} µs:",
            format_value(bound)
        );
        for (cfg, ps) in groups {
            let good = ps.iter().take_while(|p| passes(p)).last();
            let bad = ps.iter().find(|p| !passes(p));
            let why = bad.map(|p| {
                let mut w = Vec::new();
                if p.failed > 0 {
                    w.push(format!("{} failed runs", p.failed));
                }
                if p.p95.mean >= bound {
                    w.push(format!("p95 {} µs", format_value(p.p95.mean)));
                }
                if p.x.mean < 0.99 * offered(p) {
                    w.push(format!("achieved {}", format_value(p.x.mean)));
                }
                format!("{} ({})", format_value(offered(p)), w.join(", "))
            });
            let rate = good.map(|p| format_value(offered(p)));
            let _ = writeln!(
                self.summary,
                "    {cfg}: {}",
                rate.clone().unwrap_or("none of the scanned rates".into())
            );
            rows.push(Row::new([
                cfg.clone(),
                rate.unwrap_or("—".into()),
                good.map(|p| ci_text(&p.p95)).unwrap_or("—".into()),
                good.and_then(|p| p.p95.ci())
                    .map(|(_, hi)| {
                        if hi < bound {
                            "yes"
                        } else {
                            "no: within noise"
                        }
                        .to_string()
                    })
                    .unwrap_or("—".into()),
                good.map(|p| ci_text(&p.x)).unwrap_or("—".into()),
                why.unwrap_or("none up to the highest scanned rate".into()),
            ]));
        }
        table(
            &format!(
                "Sustained rate: largest offered rate with p95 < {} µs",
                format_value(bound)
            ),
            &[
                "configuration",
                "sustained (req/s)",
                "p95 there (µs)",
                "p95's CI below the bound",
                "achieved there (req/s)",
                "first failing rate",
            ],
            rows,
            Some(
                "A rate passes when the p95 (mean over repetitions, from the planned send time) \
                 is below the bound, at least 99 % of the offered rate is achieved and no run \
                 failed; the sustained rate is the last of an unbroken run of passing rates from \
                 the lowest. Its precision is the scan's step.",
            ),
        )
    }

    /// A 2^k design: per system, the runs in standard order and the effects and allocation
    /// of variation of throughput and mean latency.
    fn twok_section(&mut self, part: &Part, pts: &[Pt], sec: &mut Section) {
        let ci = &self.ci;
        let names: Vec<&str> = part.factors.iter().map(|(f, _)| f.as_str()).collect();
        let letters: Vec<String> = (0..names.len())
            .map(|i| char::from(b'A' + i as u8).to_string())
            .collect();
        let letter_refs: Vec<&str> = letters.iter().map(String::as_str).collect();
        let legend: Vec<String> = part
            .factors
            .iter()
            .zip(&letters)
            .map(|((f, ls), l)| format!("{l} = {f} ({} / {})", ls[0], ls[1]))
            .collect();
        sec.items.push(Item::Note(Note::info(
            "2^k design",
            format!(
                "{} factors, {} runs, r = {} repetitions each; effects with {ci}s. Factors: {}.",
                names.len(),
                part.points.len(),
                part.repetitions,
                legend.join("; ")
            ),
        )));
        let _ = writeln!(self.summary, "part {} — 2^k design", part.name);
        for sys in systems_of(pts) {
            let mut runs_x: Vec<Vec<f64>> = Vec::new();
            let mut runs_r: Vec<Vec<f64>> = Vec::new();
            let mut rows = Vec::new();
            for lv in &part.points {
                let Some(p) = pts.iter().find(|p| p.system == sys && &p.levels == lv) else {
                    continue;
                };
                runs_x.push(p.each_run(|r| r.throughput_qps));
                runs_r.push(p.each_run(|r| r.latency.mean_us));
                let mut cells: Vec<String> = lv.iter().map(|(_, l)| l.to_string()).collect();
                cells.push(ci_text(&p.x));
                cells.push(ci_text(&p.mean));
                rows.push(Row::new(cells));
            }
            if runs_x.len() != part.points.len() {
                sec.items.push(Item::Note(Note::warning(
                    format!("{sys}: design incomplete"),
                    "Some points of the design have no successful run; effects are not computed.",
                )));
                continue;
            }
            // Equal replications: keep the first r of each (a failed run shortens all).
            let r = runs_x.iter().map(Vec::len).min().unwrap_or(0);
            for v in runs_x.iter_mut().chain(runs_r.iter_mut()) {
                v.truncate(r);
            }
            let mut cols: Vec<String> = names.iter().map(|s| s.to_string()).collect();
            cols.push(format!("throughput (req/s) ± {ci} half-width"));
            cols.push("mean latency (µs)".into());
            sec.items.push(Item::Table(Table {
                title: format!("2^k runs (standard order): {sys}"),
                columns: cols,
                rows,
                caption: None,
            }));
            for (resp, unit, runs) in [
                ("throughput", "req/s", &runs_x),
                ("mean latency", "µs", &runs_r),
            ] {
                match factorial::analyze(&letter_refs, runs, self.exp.confidence) {
                    Ok(fa) => {
                        let mut effects: Vec<h::Effect> = fa
                            .effects
                            .iter()
                            .filter(|e| e.mask != 0)
                            .map(|e| h::Effect {
                                name: e.label.clone(),
                                description: if e.factors.len() == 1 {
                                    let j = e.mask.trailing_zeros() as usize;
                                    legend.get(j).cloned().unwrap_or_default()
                                } else {
                                    format!(
                                        "interaction {}",
                                        e.factors
                                            .iter()
                                            .filter_map(|l| letters.iter().position(|x| x == l))
                                            .map(|j| names[j])
                                            .collect::<Vec<_>>()
                                            .join(" × ")
                                    )
                                },
                                effect: Some(match (e.ci_low, e.ci_high) {
                                    (Some(l), Some(hh)) => Estimate::with_ci(e.estimate, l, hh),
                                    _ => Estimate::exact(e.estimate),
                                }),
                                fraction: e.percent_variation.unwrap_or(0.0) / 100.0,
                            })
                            .collect();
                        if let Some(err) = fa.error_percent_variation {
                            effects.push(h::Effect {
                                name: "error".into(),
                                description: format!("residuals (r = {r} repetitions)"),
                                effect: None,
                                fraction: err / 100.0,
                            });
                        }
                        let mut t = h::allocation_of_variation_table(
                            &format!("{resp}, {sys}"),
                            unit,
                            &effects,
                        );
                        t.caption = Some(format!(
                        "Mean {} {unit}. Effect q: half the change of the response from the low \
                         to the high level. Variation explained: SS of the term / SST.",
                        format_value(fa.mean())
                    ));
                        if resp == "throughput" {
                            let mut top: Vec<&h::Effect> = effects.iter().collect();
                            top.sort_by(|a, b| b.fraction.total_cmp(&a.fraction));
                            let _ = writeln!(
                                self.summary,
                                "  {sys}: mean {} req/s; variation explained: {}",
                                format_value(fa.mean()),
                                top.iter()
                                    .take(4)
                                    .map(|e| format!("{} {:.1}%", e.name, e.fraction * 100.0))
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            );
                        }
                        sec.items.push(Item::Table(t));
                    }
                    Err(e) => sec.items.push(Item::Note(Note::warning(
                        format!("{sys}: no 2^k analysis of {resp}"),
                        e.to_string(),
                    ))),
                }
            }
        }
        let _ = writeln!(self.summary, "  ({})", legend.join("; "));
    }

    /// A trace (changing rate): p95, rate and server CPU over time, latency distributions.
    fn trace_section(&mut self, part: &Part, pts: &[Pt], sec: &mut Section) {
        let _ = writeln!(self.summary, "part {} — trace (changing rate)", part.name);
        let mut cases = Vec::new();
        for (k, p) in pts.iter().enumerate() {
            let Some(run) = p.runs.first() else { continue };
            let Some(res) = &run.result else { continue };
            let measured: Vec<&kvlab_bench::run::IntervalRow> =
                res.intervals.iter().filter(|i| !i.warmup).collect();
            let Some(first) = measured.first().map(|i| i.ts_start) else {
                continue;
            };
            let tp: Vec<h::TracePoint> = measured
                .iter()
                .map(|i| h::TracePoint {
                    t: i.ts_end.saturating_sub(first) as f64 / 1000.0,
                    p95: i.latency.p95_us,
                    rate: i.achieved_qps,
                })
                .collect();
            let name = p.describe();
            let [mut p95, mut rate] = h::trace_plots(&name, &tp, "µs");
            rate.series.push(line(
                "target rate".into(),
                LineStyle::Dashed,
                2,
                measured
                    .iter()
                    .filter_map(|i| {
                        i.target_qps
                            .map(|q| Point::new(i.ts_end.saturating_sub(first) as f64 / 1000.0, q))
                    })
                    .collect(),
            ));
            p95.caption = Some(format!(
                "Repetition 1; {} intervals of {} s.",
                tp.len(),
                res.config.interval_s
            ));
            sec.items.push(Item::LinePlot(p95));
            sec.items.push(Item::LinePlot(rate));
            if let Some(c) = &run.cpu {
                sec.items.push(Item::LinePlot(LinePlot {
                    title: format!("Server CPU over time: {name}"),
                    x_label: "time (s)".into(),
                    y_label: "server CPU (cores busy)".into(),
                    y_from_zero: true,
                    series: vec![line(
                        name.clone(),
                        LineStyle::Solid,
                        k,
                        c.intervals
                            .iter()
                            .map(|(t, u)| Point::new(*t, *u))
                            .collect(),
                    )],
                    ..LinePlot::default()
                }));
            }
            if let Some(hh) = &p.hist {
                cases.push(series_of(&p.system, &self.edges, hh));
            }
            let max_p95 = tp.iter().map(|t| t.p95).fold(0.0, f64::max);
            let _ = writeln!(
                self.summary,
                "  {:<34} mean {} req/s, p95 over the run {} µs, worst interval p95 {} µs",
                name,
                format_value(res.throughput_qps),
                format_value(res.latency.p95_us),
                format_value(max_p95)
            );
        }
        if !cases.is_empty() {
            sec.items.push(Item::Histogram(
                self.histogram("Latency distribution over the trace", cases),
            ));
        }
    }
}
