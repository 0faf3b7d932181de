//! Models beside the measurements: the closed networks that exact MVA solves (the server,
//! or a proxy as its stages) and the open-loop queues (M/M/1, M/M/m) of a rate scan, each
//! fitted from the lowest load's measurements and checked against every point.

use kvlab_analysis::queueing::{self, Center};
use kvlab_report::helpers as h;
use kvlab_report::{format_value, Item, LinePlot, Note, Point, Row, Section, Series};

use super::part::{ci_plot, measured_and_models, table};
use super::points::{est, Pt};
use super::Analyser;

/// The closed network an MVA section models.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Mva {
    /// The server as its CPU, the load generator's CPU and a delay.
    Server,
    /// A proxy as the stages it measures: network thread, workers, backends, and a delay.
    Proxy,
}

impl Mva {
    /// Its name in model checks.
    pub(super) fn name(self) -> &'static str {
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

impl Analyser<'_> {
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
    pub(super) fn mva_items(
        &mut self,
        groups: &[(String, Vec<&Pt>)],
        sec: &mut Section,
        model: Mva,
    ) {
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
}

/// A rate scan's open-loop queues, fitted from each configuration's lowest rate: the mean
/// response time measured and modelled (lines), the model checks (M/M/1 and M/M/m; the
/// utilization law) and the models' inputs, one row per configuration fitted.
pub(super) struct RateModels {
    pub(super) means: Vec<Series>,
    pub(super) checks: Vec<h::ModelCheck>,
    pub(super) util_checks: Vec<h::ModelCheck>,
    pub(super) inputs: Vec<Row>,
}

impl Analyser<'_> {
    /// M/M/1, M/M/m and the utilization law for each configuration of a rate scan (points
    /// sorted by offered rate), with the service time S = U/X and the fixed delay measured at
    /// its lowest rate; a configuration without the server's CPU time is left out.
    pub(super) fn rate_models(
        &self,
        groups: &[(String, Vec<&Pt>)],
        offered: impl Fn(&Pt) -> f64,
    ) -> RateModels {
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
        RateModels {
            means,
            checks,
            util_checks,
            inputs,
        }
    }
}
