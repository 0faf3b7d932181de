//! A report with every item kind, made from synthetic numbers: for tests, the browser test
//! and the screenshot in the docs. It also shows how the lab runner is meant to use the
//! builders in [`crate::helpers`].

use crate::helpers::*;
use crate::model::*;

/// A deterministic pseudo-random value in [0, 1) (no RNG dependency for an example).
fn noise(i: u64) -> f64 {
    let x = i
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// The systems compared: (name, peak throughput in req/s, clients at the knee).
const SYSTEMS: [(&str, f64, f64); 3] = [
    ("kvlab (epoll)", 95_000.0, 8.0),
    ("kvlab (threads)", 70_000.0, 6.0),
    ("memcached 1.6", 90_000.0, 8.0),
];

/// The example report.
pub fn example_report() -> Report {
    let (tput, resp, pred) = closed_loop_curves();
    let ci = "95% confidence interval";
    let mut tp = throughput_vs_clients(&tput, ci);
    tp.x_scale = Scale::Log10;
    let mut rp = response_time_vs_clients(&resp, &pred, "µs", ci);
    rp.x_scale = Scale::Log10;
    let checks = model_checks(&resp, &pred);
    let levels = size_percentiles();
    let hist = latency_histogram_example();
    let [p95, rate] = trace_plots("kvlab (epoll), trace replay", &trace(), "µs");
    let maxes = max_throughputs(&tput);
    let effects = design_effects();
    let stage_bars = proxy_stages();

    let mut model_items = vec![Item::LinePlot(rp)];
    model_items.extend(model_vs_measurement(&checks, ci));

    Report {
        title: "kvlab lab: example report".into(),
        subtitle: Some("Synthetic numbers that exercise every item kind of the report.".into()),
        metadata: vec![
            ("kvlab version".into(), env!("CARGO_PKG_VERSION").into()),
            ("commit".into(), "0000000 (example)".into()),
            ("date".into(), "2025-01-01T00:00:00Z".into()),
            ("machine".into(), "2 cores, 24 GiB".into()),
            ("command".into(), "kvlab lab --example <none>".into()),
        ],
        sections: vec![
            Section {
                title: "Throughput".into(),
                text: vec!["Closed-loop clients without think time; 5 repetitions per point.".into()],
                items: vec![Item::LinePlot(tp), Item::Table(max_throughput_table(&maxes, ci))],
            },
            Section {
                title: "Response time and the interactive law".into(),
                text: vec!["The dashed lines are R = N/X − Z computed from the measured throughput.".into()],
                items: model_items,
            },
            Section {
                title: "Latency".into(),
                text: vec![],
                items: vec![
                    Item::LinePlot(percentiles_vs_factor("Latency percentiles vs value size", "value size", &levels, "µs")),
                    Item::Histogram(hist),
                ],
            },
            Section {
                title: "Trace run".into(),
                text: vec!["A 30-second burst starts at t = 40 s.".into()],
                items: vec![Item::LinePlot(p95), Item::LinePlot(rate)],
            },
            Section {
                title: "Proxy".into(),
                text: vec!["A proxy's own stage times, with the rest of the client-measured mean outside it.".into()],
                items: vec![Item::StackedBars(stage_bars)],
            },
            Section {
                title: "2^k design".into(),
                text: vec![],
                items: vec![
                    Item::Table(allocation_of_variation_table("throughput", "req/s", &effects)),
                    Item::Note(Note::info("Reading the table", "Effects whose confidence interval contains zero are not significant at this level.")),
                ],
            },
        ],
    }
}

/// Each system's throughput and mean response time against the closed-loop clients (no
/// think time), and the response time the interactive law predicts from the throughput.
fn closed_loop_curves() -> (Vec<Curve>, Vec<Curve>, Vec<Curve>) {
    let clients = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0];
    let think = 0.0; // closed loop without think time
    let mut tput = Vec::new();
    let mut resp = Vec::new();
    let mut pred = Vec::new();
    for (k, (name, xmax, nstar)) in SYSTEMS.iter().enumerate() {
        let mut t = Curve {
            name: (*name).into(),
            points: vec![],
        };
        let mut r = Curve {
            name: (*name).into(),
            points: vec![],
        };
        let mut p = Curve {
            name: format!("{name} (interactive law)"),
            points: vec![],
        };
        for (i, n) in clients.iter().enumerate() {
            let x = xmax
                * (n / nstar).min(1.0)
                * (1.0 - 0.3 * (-n / nstar).exp())
                * (0.97 + 0.06 * noise((k * 10 + i) as u64));
            let half = x * (0.02 + 0.03 * noise((k * 10 + i + 100) as u64));
            t.points
                .push((*n, Estimate::with_ci(x, x - half, x + half)));
            let r_us = 1e6 * interactive_law(*n, x, think);
            // The threaded server's measured latency runs above the law at high N
            // (the example's deliberate disagreement).
            let drift = if k == 1 && *n >= 32.0 {
                1.35
            } else {
                1.0 + 0.04 * (noise(i as u64 + 7) - 0.5)
            };
            let m = r_us * drift;
            r.points
                .push((*n, Estimate::with_ci(m, m * 0.95, m * 1.05)));
            p.points.push((*n, Estimate::exact(r_us)));
        }
        tput.push(t);
        resp.push(r);
        pred.push(p);
    }
    (tput, resp, pred)
}

/// The measured mean response times at N = 8 and N = 64 against the interactive law's.
fn model_checks(resp: &[Curve], pred: &[Curve]) -> Vec<ModelCheck> {
    resp.iter()
        .zip(pred)
        .flat_map(|(m, p)| {
            m.points
                .iter()
                .zip(&p.points)
                .filter(|((n, _), _)| *n == 8.0 || *n == 64.0)
                .map(|((n, e), (_, q))| ModelCheck {
                    quantity: format!("{}: mean R at N = {n}", m.name),
                    model: "interactive law".into(),
                    unit: "µs".into(),
                    predicted: q.value,
                    measured: *e,
                    tolerance: 0.0,
                })
        })
        .collect()
}

/// Latency percentiles at four value sizes.
fn size_percentiles() -> Vec<(String, Percentiles)> {
    let sizes = ["100 B", "1 KiB", "10 KiB", "100 KiB"];
    sizes
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let b = 40.0 * 1.8f64.powi(i as i32);
            (
                (*s).to_string(),
                Percentiles {
                    p25: b,
                    p50: b * 1.3,
                    p75: b * 1.8,
                    p90: b * 2.6,
                    p99: b * 5.5,
                },
            )
        })
        .collect()
}

/// Each system's latency distribution at N = 16 (log-normal-ish samples).
fn latency_histogram_example() -> Histogram {
    let edges = log_edges(30.0, 1_000.0, 14);
    let cases = SYSTEMS
        .iter()
        .enumerate()
        .map(|(k, (name, _, _))| {
            let samples = (0..5_000u64).map(move |i| {
                // A log-normal-ish latency: exp of a sum of uniforms.
                let z: f64 = (0..4)
                    .map(|j| noise(i * 4 + j + 7_919 * k as u64))
                    .sum::<f64>()
                    - 2.0;
                (4.6 + 0.25 * k as f64 + 0.9 * z).exp()
            });
            HistogramSeries::from_samples(*name, &edges, samples)
        })
        .collect();
    latency_histogram("Latency distribution at N = 16", "µs", edges, cases)
}

/// A two-minute trace replay with a 30-second burst from t = 40 s.
fn trace() -> Vec<TracePoint> {
    (1..=120)
        .map(|s| {
            let t = s as f64;
            let burst = if (40.0..70.0).contains(&t) { 1.0 } else { 0.0 };
            TracePoint {
                t,
                rate: 40_000.0 + 35_000.0 * burst + 3_000.0 * noise(s),
                p95: 180.0 + 420.0 * burst + 40.0 * noise(s + 500),
            }
        })
        .collect()
}

/// Each system's highest throughput and the clients it was reached at.
fn max_throughputs(tput: &[Curve]) -> Vec<MaxThroughput> {
    tput.iter()
        .map(|c| {
            let (n, e) = c
                .points
                .iter()
                .max_by(|a, b| a.1.value.total_cmp(&b.1.value))
                .copied()
                .unwrap_or_default();
            MaxThroughput {
                config: c.name.clone(),
                max: e,
                at_clients: n,
            }
        })
        .collect()
}

/// A 2^k design's effects and their shares of the variation.
fn design_effects() -> Vec<Effect> {
    vec![
        Effect {
            name: "A".into(),
            description: "I/O model (threads / epoll)".into(),
            effect: Some(Estimate::with_ci(11_800.0, 10_900.0, 12_700.0)),
            fraction: 0.62,
        },
        Effect {
            name: "B".into(),
            description: "value size (100 B / 10 KiB)".into(),
            effect: Some(Estimate::with_ci(-8_100.0, -9_000.0, -7_200.0)),
            fraction: 0.29,
        },
        Effect {
            name: "AB".into(),
            description: "interaction".into(),
            effect: Some(Estimate::with_ci(2_300.0, 1_400.0, 3_200.0)),
            fraction: 0.024,
        },
        Effect {
            name: "C".into(),
            description: "pipelining (off / on)".into(),
            effect: Some(Estimate::with_ci(400.0, -500.0, 1_300.0)),
            fraction: 0.001,
        },
        Effect {
            name: "error".into(),
            description: "residuals (r = 5 repetitions)".into(),
            effect: None,
            fraction: 0.065,
        },
    ]
}

/// A proxy's stage means at four configurations: its queue grows with the clients.
fn proxy_stages() -> StackedBars {
    let stages = [
        "net",
        "queue",
        "worker without backend",
        "backend",
        "outside the proxy",
    ];
    StackedBars {
        title: "Where a request's time goes, per configuration".into(),
        x_label: "configuration".into(),
        y_label: "time per request (µs)".into(),
        unit: "µs".into(),
        stages: stages.iter().map(|s| (*s).to_string()).collect(),
        bars: [1.0, 4.0, 16.0, 64.0]
            .iter()
            .enumerate()
            .map(|(i, n): (usize, &f64)| StackedBar {
                name: format!("proxy clients={n}"),
                values: vec![
                    4.0 + noise(i as u64 + 900),
                    2.0 * n.sqrt() + n * 0.8,
                    6.0 + noise(i as u64 + 901),
                    31.0 + 2.0 * noise(i as u64 + 902),
                    24.0 + 3.0 * noise(i as u64 + 903),
                ],
            })
            .collect(),
        caption: Some(
            "Means over repetitions, µs per request; bottom to top as in the legend.".into(),
        ),
    }
}
