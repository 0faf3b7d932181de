//! Data points: each point of a part (its system and factor levels) summarised over its
//! repetitions — throughput, latency percentiles, CPU, the proxy's stage times — and grouped
//! by configuration.

use hdrhistogram::Histogram as Hdr;
use kvlab_analysis::{summarize, Summary};
use kvlab_report::helpers::{self as h};
use kvlab_report::{format_value, Estimate};

use crate::generator::{Generator, Measured};
use crate::runner::{ProxyFigures, RawRun};
use crate::spec::{Experiment, Level, Part};

/// Statistics of one point of one part against one system, over its repetitions.
pub(super) struct Pt<'a> {
    pub(super) system: String,
    pub(super) levels: Vec<(String, Level)>,
    pub(super) runs: Vec<&'a RawRun>,
    pub(super) failed: usize,
    pub(super) x: Summary,
    pub(super) mean: Summary,
    pub(super) p50: Summary,
    pub(super) p95: Summary,
    pub(super) p99: Summary,
    pub(super) pct: h::Percentiles,
    pub(super) cpu: Option<Summary>,
    pub(super) s_cpu: Option<Summary>,
    pub(super) gen_d: Option<f64>,
    /// The external generator that measured the point (none: kvlab bench).
    pub(super) generator: Option<Generator>,
    /// Latency figures the generator does not report ([`Latency::absent`]): their fields
    /// above hold a placeholder 0 that only the all-points table sees, as "–".
    pub(super) absent: Option<Absent>,
    /// The load generator's CPU (cores busy, its threads summed).
    pub(super) gen_cpu: Option<Summary>,
    /// A proxy's backends' CPU (cores busy, summed).
    pub(super) backend_cpu: Option<Summary>,
    /// The whole machine's busy CPU per request (µs), and its stolen time (%).
    pub(super) machine_us: Option<Summary>,
    pub(super) steal_pct: Option<Summary>,
    pub(super) population: usize,
    pub(super) think_s: f64,
    pub(super) server_threads: u32,
    pub(super) hist: Option<Hdr<u64>>,
    pub(super) proxy: Option<ProxyPt>,
}

/// A proxy's stage means (µs per request) over a point's repetitions, when every successful
/// run has them ([`crate::runner::ProxyFigures`]).
pub(super) struct ProxyPt {
    /// Proxy total: queue + worker.
    pub(super) total: Summary,
    pub(super) net: Summary,
    pub(super) queue: Summary,
    pub(super) worker: Summary,
    /// The worker's own time: worker − backend.
    pub(super) worker_own: Summary,
    pub(super) backend: Summary,
    /// Client-measured mean − net − total: the client's, kernel's and network's share.
    pub(super) outside: Summary,
    /// Time-averaged queue length.
    pub(super) queue_len: Summary,
    /// Backend requests per request.
    pub(super) backend_requests: Summary,
    /// The backends' CPU, summed (cores).
    pub(super) backend_cpu: Option<Summary>,
    pub(super) backends: usize,
    /// Every run's means from exact sums (else reconstructed from rounded means).
    pub(super) exact: bool,
}

impl ProxyPt {
    pub(super) fn of(runs: &[&RawRun], conf: f64) -> Option<ProxyPt> {
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
    pub(super) fn law_r(&self) -> f64 {
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
    pub(super) fn each_run(&self, f: impl Fn(&kvlab_bench::RunResult) -> f64) -> Vec<f64> {
        self.runs
            .iter()
            .filter_map(|r| r.result.as_ref())
            .map(f)
            .collect()
    }

    pub(super) fn level(&self, f: &str) -> Option<&Level> {
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
    pub(super) fn config(&self, axis: Option<&str>) -> String {
        let rest = self.levels_text(axis);
        if rest.is_empty() {
            self.system.clone()
        } else {
            format!("{} ({})", self.system, rest.join(", "))
        }
    }

    pub(super) fn describe(&self) -> String {
        let lv = self.levels_text(None);
        if lv.is_empty() {
            self.system.clone()
        } else {
            format!("{} {}", self.system, lv.join(" "))
        }
    }
}

pub(super) fn est(s: &Summary) -> Estimate {
    match s.ci() {
        Some((l, h)) => Estimate::with_ci(s.mean, l, h),
        None => Estimate::exact(s.mean),
    }
}

pub(super) fn ci_text(s: &Summary) -> String {
    match s.ci_half_width {
        Some(h) => format!("{} ± {}", format_value(s.mean), format_value(h)),
        None => format_value(s.mean),
    }
}

fn summ(v: &[f64], conf: f64) -> Option<Summary> {
    let v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    summarize(&v, conf).ok()
}

/// A run's throughput, req/s: kvlab bench's or an external generator's.
fn throughput(r: &RawRun) -> Option<f64> {
    match (&r.result, &r.external) {
        (Some(res), _) => Some(res.throughput_qps),
        (None, Some(x)) => Some(x.measured.throughput_qps),
        (None, None) => None,
    }
}

/// A run's load generator's CPU (cores busy): kvlab bench's threads' summed, or an external
/// generator's process'.
fn generator_cpu(r: &RawRun) -> Option<f64> {
    match (&r.result, &r.external) {
        (Some(res), _) => Some(res.thread_cpu.iter().sum()),
        (None, Some(x)) => x.cpu,
        (None, None) => None,
    }
}

/// Latency figures a point's generator does not report, and why.
pub(super) struct Absent {
    /// No mean either.
    pub(super) mean: bool,
    /// Why (the generator's own words in [`Generator::no_percentiles`]).
    pub(super) why: String,
}

/// A point's latency over its runs.
struct Latency {
    mean: Summary,
    p50: Summary,
    p95: Summary,
    p99: Summary,
    pct: h::Percentiles,
    absent: Option<Absent>,
}

impl Latency {
    /// kvlab bench's percentiles (from the planned send), or an external generator's figures
    /// when every run has them; a figure some run lacks is absent (a placeholder 0 that
    /// [`Pt::absent`] marks).
    fn of(ok: &[&RawRun], conf: f64) -> Option<Latency> {
        let avg = |v: Vec<f64>| v.iter().sum::<f64>() / v.len().max(1) as f64;
        let zero = || summ(&[0.0], conf);
        if ok.iter().all(|r| r.result.is_some()) {
            let res = |f: &dyn Fn(&kvlab_bench::RunResult) -> f64| -> Vec<f64> {
                ok.iter().filter_map(|r| r.result.as_ref()).map(f).collect()
            };
            return Some(Latency {
                mean: summ(&res(&|r| r.latency.mean_us), conf).or_else(zero)?,
                p50: summ(&res(&|r| r.latency.p50_us), conf).or_else(zero)?,
                p95: summ(&res(&|r| r.latency.p95_us), conf).or_else(zero)?,
                p99: summ(&res(&|r| r.latency.p99_us), conf).or_else(zero)?,
                pct: h::Percentiles {
                    p25: avg(res(&|r| r.latency.p25_us)),
                    p50: avg(res(&|r| r.latency.p50_us)),
                    p75: avg(res(&|r| r.latency.p75_us)),
                    p90: avg(res(&|r| r.latency.p90_us)),
                    p99: avg(res(&|r| r.latency.p99_us)),
                },
                absent: None,
            });
        }
        let ext: Vec<(Generator, &Measured)> = ok
            .iter()
            .filter_map(|r| r.external.as_ref().map(|x| (x.generator, &x.measured)))
            .collect();
        if ext.len() != ok.len() {
            return None; // a point measured by two generators: not one point
        }
        let every = |f: &dyn Fn(&Measured) -> Option<f64>| -> Option<Vec<f64>> {
            ext.iter().map(|(_, m)| f(m)).collect()
        };
        let fig = |f: &dyn Fn(&Measured) -> Option<f64>| every(f).and_then(|v| summ(&v, conf));
        let (mean, p50, p95, p99) = (
            fig(&|m| m.mean_us),
            fig(&|m| m.p50_us),
            fig(&|m| m.p95_us),
            fig(&|m| m.p99_us),
        );
        let g = ext[0].0;
        let absent =
            (mean.is_none() || p50.is_none() || p95.is_none() || p99.is_none()).then(|| Absent {
                mean: mean.is_none(),
                why: g.no_percentiles().map_or_else(
                    || format!("{} reported no latency percentiles in every run", g.name()),
                    str::to_string,
                ),
            });
        let p = |s: &Option<Summary>| s.as_ref().map_or(0.0, |s| s.mean);
        let pct = h::Percentiles {
            p25: 0.0,
            p50: p(&p50),
            p75: 0.0,
            p90: 0.0,
            p99: p(&p99),
        };
        Some(Latency {
            mean: mean.or_else(zero)?,
            p50: p50.or_else(zero)?,
            p95: p95.or_else(zero)?,
            p99: p99.or_else(zero)?,
            pct,
            absent,
        })
    }
}

pub(super) fn points<'a>(
    exp: &Experiment,
    part: &Part,
    raws: &'a [RawRun],
) -> (Vec<Pt<'a>>, Vec<String>) {
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
                .filter(|r| r.error.is_none() && (r.result.is_some() || r.external.is_some()))
                .collect();
            for r in &all {
                if let Some(e) = &r.error {
                    problems.push(format!("run {} ({}) failed: {e}", r.index, r.system));
                }
            }
            let xs: Vec<f64> = ok.iter().filter_map(|r| throughput(r)).collect();
            let Some(x) = summ(&xs, conf) else {
                problems.push(format!("{name} at point {}: no successful run", k + 1));
                continue;
            };
            let Some(lat) = Latency::of(&ok, conf) else {
                continue;
            };
            let cpus: Vec<f64> = ok
                .iter()
                .filter_map(|r| r.cpu.as_ref().map(|c| c.utilization))
                .collect();
            let s_cpus: Vec<f64> = ok
                .iter()
                .filter_map(|r| {
                    let c = r.cpu.as_ref()?;
                    let x = throughput(r)?;
                    (x > 0.0).then(|| c.utilization / x)
                })
                .collect();
            let gen: Vec<f64> = ok
                .iter()
                .filter_map(|r| {
                    let x = throughput(r)?;
                    (x > 0.0).then(|| generator_cpu(r).map(|c| c / x)).flatten()
                })
                .collect();
            let gen_cpu: Vec<f64> = ok.iter().filter_map(|r| generator_cpu(r)).collect();
            let avg = |v: Vec<f64>| v.iter().sum::<f64>() / v.len().max(1) as f64;
            let backend_cpu: Vec<f64> = ok.iter().filter_map(|r| r.backend_cpu).collect();
            let machine_us: Vec<f64> = ok
                .iter()
                .filter_map(|r| {
                    let x = throughput(r).filter(|x| *x > 0.0)?;
                    Some(r.machine?.busy_cores / x * 1e6)
                })
                .collect();
            let steal: Vec<f64> = ok
                .iter()
                .filter_map(|r| Some(r.machine?.steal * 100.0))
                .collect();
            let every = |v: &[f64]| (v.len() == ok.len()).then(|| summ(v, conf)).flatten();
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
                mean: lat.mean,
                p50: lat.p50,
                p95: lat.p95,
                p99: lat.p99,
                pct: lat.pct,
                generator: first.external.as_ref().map(|e| e.generator),
                absent: lat.absent,
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
                gen_cpu: if gen_cpu.len() == ok.len() {
                    summ(&gen_cpu, conf)
                } else {
                    None
                },
                backend_cpu: if backend_cpu.len() == ok.len() {
                    summ(&backend_cpu, conf)
                } else {
                    None
                },
                machine_us: every(&machine_us),
                steal_pct: every(&steal),
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
pub(super) fn by_config<'p, 'a>(
    pts: &'p [Pt<'a>],
    axis: Option<&str>,
) -> Vec<(String, Vec<&'p Pt<'a>>)> {
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

/// The systems of `pts`, in order of first appearance.
pub(super) fn systems_of<'p>(pts: &'p [Pt]) -> Vec<&'p str> {
    let mut v: Vec<&str> = Vec::new();
    for p in pts {
        if !v.contains(&p.system.as_str()) {
            v.push(&p.system);
        }
    }
    v
}
