//! The proxy's figures as text: memcached-style `stats` (general, `backends`, `settings`)
//! on its own port, and Prometheus `/metrics` with latency histograms.

use std::fmt::Write as _;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use kvlab_net::http::{HttpLimits, HttpServer};

use crate::stats::{Recorder, Stage};
use crate::ProxyState;

/// Percentiles shown for each stage.
const QUANTILES: [(&str, f64); 3] = [("p50", 0.5), ("p95", 0.95), ("p99", 0.99)];
/// Upper bounds (seconds) of the Prometheus histogram buckets.
const BUCKETS: [f64; 14] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0,
];

fn line(out: &mut Vec<u8>, name: &str, value: impl std::fmt::Display) {
    kvlab_protocol::response::stat(out, name, value);
}

/// The stages of a request, by the name they carry in `stats`, CSV and `/metrics`.
pub fn stages<'a>(r: &'a Recorder, net: &'a Stage) -> [(&'static str, &'a Stage); 5] {
    [
        ("net", net),
        ("queue", &r.queue),
        ("worker", &r.worker),
        ("backend", &r.backend),
        ("total", &r.total),
    ]
}

/// Writes `stats [group]`; false for a group the proxy does not know (memcached answers
/// `ERROR`).
pub fn stats(shared: &ProxyState, group: Option<&[u8]>, out: &mut Vec<u8>) -> bool {
    match group {
        None => general(shared, out),
        Some(b"backends") => backends(shared, out),
        Some(b"settings") => settings(shared, out),
        // As memcached without `stats sizes_enable`: the proxy keeps no size histogram.
        Some(b"sizes") => line(out, "sizes_status", "disabled"),
        Some(_) => return false,
    }
    out.extend_from_slice(b"END\r\n");
    true
}

fn general(shared: &ProxyState, out: &mut Vec<u8>) {
    let r = shared.totals();
    let net = shared.net.lock().stage.clone();
    let (routing, _) = shared.routing();
    let uptime = shared.epoch.elapsed().as_secs();
    line(out, "pid", std::process::id());
    line(out, "uptime", uptime);
    line(out, "time", shared.epoch_unix as u64 + uptime);
    line(out, "version", crate::VERSION);
    let counters = [
        ("curr_connections", &shared.curr_connections),
        ("total_connections", &shared.total_connections),
        ("rejected_connections", &shared.rejected_connections),
        ("bytes_read", &shared.bytes_read),
        ("bytes_written", &shared.bytes_written),
    ];
    for (name, c) in counters {
        line(out, name, c.load(Ordering::Relaxed));
    }
    line(out, "cmd_get", r.keys);
    line(out, "get_hits", r.hits);
    line(out, "get_misses", r.keys - r.hits.min(r.keys));
    line(out, "proxy_requests", r.requests);
    line(out, "proxy_reads", r.reads);
    line(out, "proxy_writes", r.requests - r.reads);
    line(out, "proxy_errors", r.errors);
    line(out, "proxy_retries", r.retries);
    line(out, "proxy_backend_requests", r.parts);
    line(
        out,
        "proxy_protocol_errors",
        shared.protocol_errors.load(Ordering::Relaxed),
    );
    line(out, "proxy_queued", shared.queue.queued());
    line(
        out,
        "proxy_queue_len_on_arrival",
        format!("{:.3}", r.mean_queue_len()),
    );
    // The queue length's time integral since the start: its change over an interval,
    // divided by the interval, is that interval's mean queue length.
    let area = shared.queue.total_area(std::time::Instant::now());
    line(out, "proxy_queue_area_us", area / 1000);
    line(out, "threads", routing.config.workers);
    line(out, "proxy_workers", routing.config.workers);
    line(out, "proxy_backends", routing.backends.len());
    line(
        out,
        "proxy_backends_ejected",
        routing.backends.iter().filter(|h| h.is_ejected()).count(),
    );
    line(out, "proxy_reloads", shared.reloads.load(Ordering::Relaxed));
    line(
        out,
        "proxy_reload_failures",
        shared.reload_failures.load(Ordering::Relaxed),
    );
    for (stage, s) in stages(&r, &net) {
        // Sums and counts, so that any interval's mean is the change of one over the other.
        line(out, &format!("proxy_{stage}_count"), s.count);
        line(out, &format!("proxy_{stage}_sum_us"), s.sum_ns / 1000);
        line(
            out,
            &format!("proxy_{stage}_mean_us"),
            format!("{:.1}", s.mean_us()),
        );
        for (q, v) in QUANTILES {
            line(
                out,
                &format!("proxy_{stage}_{q}_us"),
                format!("{:.1}", s.quantile_us(v)),
            );
        }
    }
}

fn backends(shared: &ProxyState, out: &mut Vec<u8>) {
    let r = shared.totals();
    let (routing, _) = shared.routing();
    let mut i = 0;
    for pool in routing.config.pools.iter() {
        for _ in &pool.backends {
            let h = &routing.backends[i];
            let f = r.backends.get(i).cloned().unwrap_or_default();
            let p = format!("backend:{i}:");
            line(out, &format!("{p}name"), &h.name);
            line(out, &format!("{p}pool"), &pool.name);
            line(out, &format!("{p}ejected"), u8::from(h.is_ejected()));
            line(
                out,
                &format!("{p}failures_in_a_row"),
                h.failures.load(Ordering::Relaxed),
            );
            line(
                out,
                &format!("{p}outstanding"),
                h.outstanding.load(Ordering::Relaxed).max(0),
            );
            line(out, &format!("{p}requests"), f.requests);
            line(out, &format!("{p}errors"), f.errors);
            line(out, &format!("{p}timeouts"), f.timeouts);
            line(
                out,
                &format!("{p}mean_us"),
                format!("{:.1}", f.time.mean_us()),
            );
            line(
                out,
                &format!("{p}p99_us"),
                format!("{:.1}", f.time.quantile_us(0.99)),
            );
            line(
                out,
                &format!("{p}ejections"),
                h.ejections.load(Ordering::Relaxed),
            );
            line(
                out,
                &format!("{p}rejoins"),
                h.rejoins.load(Ordering::Relaxed),
            );
            line(
                out,
                &format!("{p}rejoin_waits"),
                h.rejoin_waits.load(Ordering::Relaxed),
            );
            // A backend of a replicated pool: keys whose writes it missed (to repair before
            // it rejoins), keys repaired, flushes when it came back.
            line(out, &format!("{p}missed_keys"), h.missed.lock().keys.len());
            line(
                out,
                &format!("{p}repaired_keys"),
                h.repaired.load(Ordering::Relaxed),
            );
            line(
                out,
                &format!("{p}flushes"),
                h.flushes.load(Ordering::Relaxed),
            );
            i += 1;
        }
    }
}

fn settings(shared: &ProxyState, out: &mut Vec<u8>) {
    let (routing, version) = shared.routing();
    let c = &routing.config;
    line(out, "workers", c.workers);
    line(out, "timeout_ms", c.timeout.as_millis());
    line(out, "failure_limit", c.failure_limit);
    line(out, "retry_timeout_ms", c.retry_timeout.as_millis());
    line(out, "item_size_max", shared.limits.item_size_max);
    line(out, "config_version", version);
    for (i, p) in c.pools.iter().enumerate() {
        let pre = format!("pool:{i}:");
        line(out, &format!("{pre}name"), &p.name);
        line(out, &format!("{pre}prefix"), format!("{:?}", p.prefix));
        line(out, &format!("{pre}backends"), p.backends.len());
        line(
            out,
            &format!("{pre}distribution"),
            format!("{:?}", p.distribution).to_lowercase(),
        );
        line(out, &format!("{pre}replicas"), p.replicas);
        line(
            out,
            &format!("{pre}write_policy"),
            format!("{:?}", p.write_policy).to_lowercase(),
        );
        line(
            out,
            &format!("{pre}read_policy"),
            format!("{:?}", p.read_policy).to_lowercase(),
        );
        line(
            out,
            &format!("{pre}multiget"),
            format!("{:?}", p.multiget).to_lowercase(),
        );
    }
}

/// Prometheus text: counters, gauges, and a histogram per stage and per backend.
pub fn prometheus(shared: &ProxyState) -> String {
    let r = shared.totals();
    let net = shared.net.lock().stage.clone();
    let (routing, _) = shared.routing();
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, value: u64| {
        let _ = writeln!(
            out,
            "# TYPE kvlab_proxy_{name} {kind}\nkvlab_proxy_{name} {value}"
        );
    };
    metric("requests_total", "counter", r.requests);
    metric("reads_total", "counter", r.reads);
    metric("keys_total", "counter", r.keys);
    metric("hits_total", "counter", r.hits);
    metric("errors_total", "counter", r.errors);
    metric("retries_total", "counter", r.retries);
    metric("backend_requests_total", "counter", r.parts);
    metric(
        "connections",
        "gauge",
        shared.curr_connections.load(Ordering::Relaxed),
    );
    metric("queued", "gauge", shared.queue.queued());
    metric(
        "reloads_total",
        "counter",
        shared.reloads.load(Ordering::Relaxed),
    );
    metric(
        "reload_failures_total",
        "counter",
        shared.reload_failures.load(Ordering::Relaxed),
    );
    let _ = writeln!(out, "# TYPE kvlab_proxy_stage_seconds histogram");
    for (stage, s) in stages(&r, &net) {
        histogram(
            &mut out,
            "kvlab_proxy_stage_seconds",
            &format!("stage=\"{stage}\""),
            s,
        );
    }
    let _ = writeln!(out, "# TYPE kvlab_proxy_backend_seconds histogram");
    for (i, h) in routing.backends.iter().enumerate() {
        let f = r.backends.get(i).cloned().unwrap_or_default();
        let label = format!("backend=\"{}\"", h.name);
        histogram(&mut out, "kvlab_proxy_backend_seconds", &label, &f.time);
        let _ = writeln!(
            out,
            "kvlab_proxy_backend_errors_total{{{label}}} {}",
            f.errors
        );
        let _ = writeln!(
            out,
            "kvlab_proxy_backend_timeouts_total{{{label}}} {}",
            f.timeouts
        );
        let _ = writeln!(
            out,
            "kvlab_proxy_backend_ejected{{{label}}} {}",
            u8::from(h.is_ejected())
        );
        let _ = writeln!(
            out,
            "kvlab_proxy_backend_rejoins_total{{{label}}} {}",
            h.rejoins.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "kvlab_proxy_backend_repaired_keys_total{{{label}}} {}",
            h.repaired.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "kvlab_proxy_backend_flushes_total{{{label}}} {}",
            h.flushes.load(Ordering::Relaxed)
        );
    }
    out
}

fn histogram(out: &mut String, name: &str, label: &str, s: &Stage) {
    let mut counts = [0u64; BUCKETS.len()];
    for v in s.hist.iter_recorded() {
        let secs = v.value_iterated_to() as f64 / 1e9;
        for (b, le) in BUCKETS.iter().enumerate() {
            if secs <= *le {
                counts[b] += v.count_at_value();
            }
        }
    }
    for (b, le) in BUCKETS.iter().enumerate() {
        let _ = writeln!(out, "{name}_bucket{{{label},le=\"{le}\"}} {}", counts[b]);
    }
    let _ = writeln!(out, "{name}_bucket{{{label},le=\"+Inf\"}} {}", s.count);
    let _ = writeln!(out, "{name}_sum{{{label}}} {}", s.sum_ns as f64 / 1e9);
    let _ = writeln!(out, "{name}_count{{{label}}} {}", s.count);
}

/// Serves `/metrics` on `at` (axum, its own thread) until stopped.
pub fn serve_metrics(at: SocketAddr, shared: Arc<ProxyState>) -> io::Result<HttpServer> {
    kvlab_net::http::serve_metrics(
        at,
        "kvlab-proxy-metrics",
        HttpLimits::default(),
        move || prometheus(&shared),
    )
}
