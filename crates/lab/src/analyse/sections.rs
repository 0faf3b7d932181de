//! The sections a part's factors call for: clients (closed loop), a rate scan (open loop),
//! a 2^k design, a trace of a changing rate; each also writes its lines of the terminal
//! summary.

use std::fmt::Write as _;

use kvlab_analysis::factorial;
use kvlab_analysis::saturation::{find_knee, KneeOptions, LoadPoint};
use kvlab_analysis::Summary;
use kvlab_report::helpers::{self as h, Curve};
use kvlab_report::{
    format_value, Estimate, Item, LinePlot, LineStyle, Note, Point, Row, Section, Series, Table,
};

use super::models::{Mva, RateModels};
use super::part::{ci_plot, curve, line, series_of, table};
use super::points::{by_config, ci_text, est, systems_of, Pt};
use super::summary::summary_row;
use super::Analyser;
use crate::spec::{Level, Part};

impl Analyser<'_> {
    /// Closed loop over clients: throughput and response time vs clients, the maximum and the
    /// knee of each configuration, the interactive response-time law, then MVA.
    pub(super) fn clients_section(&mut self, part: &Part, pts: &[Pt], sec: &mut Section) {
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

    /// Open loop over offered rates: p95, server CPU and achieved rate vs offered rate, and
    /// M/M/1, M/M/m and the utilization law from the lowest rate's measurements.
    pub(super) fn rates_section(&mut self, part: &Part, pts: &[Pt], sec: &mut Section) {
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
        self.rates_summary(part, &groups, offered);
        sec.items
            .push(Item::Table(self.sustained_table(&groups, offered)));
        let RateModels {
            means,
            checks,
            util_checks,
            inputs,
        } = self.rate_models(&groups, offered);
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

    /// A rate scan's lines of the terminal summary: each point's offered and achieved rate,
    /// p95 and server CPU, by configuration.
    fn rates_summary(
        &mut self,
        part: &Part,
        groups: &[(String, Vec<&Pt>)],
        offered: impl Fn(&Pt) -> f64,
    ) {
        const WIDTHS: [usize; 4] = [10, 12, 12, 12];
        let _ = writeln!(self.summary, "part {} — open loop, rate scan", part.name);
        summary_row(
            &mut self.summary,
            "system",
            &["offered", "achieved", "p95 (µs)", "server CPU"],
            &WIDTHS,
        );
        for (cfg, ps) in groups {
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
    }

    /// The sustained rate of each configuration of a rate scan: the largest offered rate whose
    /// p95 (mean over repetitions) is below the experiment's `slo_p95_us` — or its mean
    /// latency below `slo_mean_us` — with at least 99 % of it achieved and no failed run,
    /// every lower rate passing too (so one lucky point above a failing one does not count).
    /// Also added to the terminal summary.
    fn sustained_table(
        &mut self,
        groups: &[(String, Vec<&Pt>)],
        offered: impl Fn(&Pt) -> f64,
    ) -> Table {
        let (stat, bound): (&str, f64) = match self.exp.slo_mean_us {
            Some(m) => ("mean latency", m),
            None => ("p95", self.exp.slo_p95_us),
        };
        let lat = |p: &Pt| -> Summary {
            match self.exp.slo_mean_us {
                Some(_) => p.mean.clone(),
                None => p.p95.clone(),
            }
        };
        let passes = |p: &Pt| p.failed == 0 && lat(p).mean < bound && p.x.mean >= 0.99 * offered(p);
        let mut rows = Vec::new();
        let _ = writeln!(
            self.summary,
            "  sustained with {stat} < {} µs:",
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
                if lat(p).mean >= bound {
                    w.push(format!("{stat} {} µs", format_value(lat(p).mean)));
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
                good.map(|p| ci_text(&lat(p))).unwrap_or("—".into()),
                good.and_then(|p| lat(p).ci())
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
                "Sustained rate: largest offered rate with {stat} < {} µs",
                format_value(bound)
            ),
            &[
                "configuration",
                "sustained (req/s)",
                &format!("{stat} there (µs)"),
                &format!("{stat}'s CI below the bound"),
                "achieved there (req/s)",
                "first failing rate",
            ],
            rows,
            Some(&format!(
                "A rate passes when the {stat} (mean over repetitions, from the planned send \
                 time) is below the bound, at least 99 % of the offered rate is achieved and no \
                 run failed; the sustained rate is the last of an unbroken run of passing rates \
                 from the lowest. Its precision is the scan's step."
            )),
        )
    }

    /// A 2^k design: per system, the runs in standard order and the effects and allocation
    /// of variation of throughput and mean latency.
    pub(super) fn twok_section(&mut self, part: &Part, pts: &[Pt], sec: &mut Section) {
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
    pub(super) fn trace_section(&mut self, part: &Part, pts: &[Pt], sec: &mut Section) {
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
