//! Reading what an external generator printed: memcaslap's text, memtier's JSON file.

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

/// An external generator's own figures over its measured invocation. A figure it does not
/// report is absent, never filled in.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    /// Requests completed.
    pub ops: u64,
    /// Its run time, s.
    pub duration_s: f64,
    /// Requests per second, as it reports them.
    pub throughput_qps: f64,
    /// Mean latency, µs (timed from its send).
    pub mean_us: Option<f64>,
    /// Median, µs.
    pub p50_us: Option<f64>,
    /// 95th percentile, µs.
    pub p95_us: Option<f64>,
    /// 99th percentile, µs.
    pub p99_us: Option<f64>,
    /// 99.9th percentile, µs.
    pub p99_9_us: Option<f64>,
    /// Largest, µs.
    pub max_us: Option<f64>,
}

impl Measured {
    /// Whether it reports latency percentiles (else at most a mean).
    pub fn has_percentiles(&self) -> bool {
        self.p50_us.is_some() && self.p95_us.is_some() && self.p99_us.is_some()
    }
}

/// memcaslap's output: the last "Run time: 10.0s Ops: N TPS: X …" line, and the mean and
/// maximum of the final "Total Statistics (N events)" block (printed with `-S`).
pub fn parse_memcaslap(text: &str) -> anyhow::Result<Measured> {
    let Some(line) = text
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with("Run time:"))
    else {
        bail!("no \"Run time: … Ops: … TPS: …\" line (did memcaslap reach its end?)");
    };
    let field = |name: &str| -> anyhow::Result<&str> {
        let mut words = line.split_whitespace();
        words
            .find(|w| *w == name)
            .and_then(|_| words.next())
            .with_context(|| format!("no {name} in {line:?}"))
    };
    let duration_s: f64 = field("time:")?
        .trim_end_matches('s')
        .parse()
        .with_context(|| format!("run time in {line:?}"))?;
    let ops: u64 = field("Ops:")?
        .parse()
        .with_context(|| format!("Ops in {line:?}"))?;
    let throughput_qps: f64 = field("TPS:")?
        .parse()
        .with_context(|| format!("TPS in {line:?}"))?;
    // The final block "Total Statistics (N events)" with "Avg:" and "Max:" lines (the
    // periodic tables are headed "Total Statistics" without a count).
    let mut mean_us = None;
    let mut max_us = None;
    if let Some(start) = text.rfind("Total Statistics (") {
        for l in text[start..].lines().skip(1) {
            let mut w = l.split_whitespace();
            match (w.next(), w.next().and_then(|v| v.parse::<f64>().ok())) {
                (Some("Avg:"), Some(v)) => mean_us = Some(v),
                (Some("Max:"), Some(v)) => max_us = Some(v),
                (Some("Log2"), _) | (None, _) => break,
                _ => {}
            }
        }
    }
    Ok(Measured {
        ops,
        duration_s,
        throughput_qps,
        mean_us,
        max_us,
        ..Measured::default()
    })
}

/// memtier_benchmark's `--json-out-file`: `"ALL STATS"."Totals"` — `Ops/sec`, the mean
/// (`Average Latency`, or `Latency` in older versions) and `Percentile Latencies`
/// (`p50.00`, …), all in milliseconds; `Count` (newer versions), else Ops/sec × `duration_s`.
pub fn parse_memtier(text: &str, duration_s: f64) -> anyhow::Result<Measured> {
    let v: serde_json::Value = serde_json::from_str(text).context("memtier's JSON")?;
    let totals = v
        .get("ALL STATS")
        .and_then(|s| s.get("Totals"))
        .context("no \"ALL STATS\".\"Totals\" in memtier's JSON")?;
    let num = |k: &str| totals.get(k).and_then(serde_json::Value::as_f64);
    let throughput_qps = num("Ops/sec").context("no Totals.\"Ops/sec\" in memtier's JSON")?;
    let ms = |v: Option<f64>| v.map(|x| x * 1000.0);
    let pct = |k: &str| {
        ms(totals
            .get("Percentile Latencies")
            .and_then(|p| p.get(k))
            .and_then(serde_json::Value::as_f64))
    };
    Ok(Measured {
        ops: num("Count").map_or((throughput_qps * duration_s).round() as u64, |c| c as u64),
        duration_s,
        throughput_qps,
        mean_us: ms(num("Average Latency").or_else(|| num("Latency"))),
        p50_us: pct("p50.00"),
        p95_us: pct("p95.00"),
        p99_us: pct("p99.00"),
        p99_9_us: pct("p99.90"),
        max_us: ms(num("Max Latency")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CASLAP: &str = "servers: 127.0.0.1:29911\nthreads count: 1\n\
        \x1b[1;1H\x1b[2J\nTotal Statistics\n\
        Type     Time(s)  Ops          TPS(ops/s)   Net(M/s)   Get_miss   Min(us)  Max(us)    Avg(us)\n\
        Period   2        135506       67753        7.5        0          9        23213      58\n\n\
        Total Statistics (135510 events)\n   Min:         9\n   Max:     23213\n   Avg:        58\n\
           Geo:     32.87\n   Log2 Dist:\n       4:      867    83440    37258     8686\n\n\
        cmd_get: 121961\n\nRun time: 2.0s Ops: 135514 TPS: 67747 Net_rate: 10.1M/s\n";

    #[test]
    fn memcaslap_throughput_and_mean_without_percentiles() {
        let m = parse_memcaslap(CASLAP).unwrap();
        assert_eq!(
            (m.ops, m.duration_s, m.throughput_qps),
            (135_514, 2.0, 67_747.0)
        );
        assert_eq!((m.mean_us, m.max_us), (Some(58.0), Some(23213.0)));
        assert!(!m.has_percentiles());
        // Without -S there is no statistics block: throughput only.
        let m =
            parse_memcaslap("Run time: 1.0s Ops: 141632 TPS: 140764 Net_rate: 21.1M/s\n").unwrap();
        assert_eq!((m.throughput_qps, m.mean_us), (140_764.0, None));
        let e = parse_memcaslap("servers: x\n").unwrap_err();
        assert!(format!("{e:#}").contains("Run time"), "{e:#}");
    }

    #[test]
    fn memtier_totals_in_milliseconds() {
        let text = r#"{"ALL STATS": {"Totals": {"Count": 1000, "Ops/sec": 100.5,
            "Average Latency": 0.25, "Max Latency": 3.0,
            "Percentile Latencies": {"p50.00": 0.2, "p95.00": 0.4, "p99.00": 0.9, "p99.90": 1.5}}}}"#;
        let m = parse_memtier(text, 10.0).unwrap();
        assert_eq!((m.ops, m.throughput_qps), (1000, 100.5));
        assert_eq!(
            (m.mean_us, m.p50_us, m.p99_us),
            (Some(250.0), Some(200.0), Some(900.0))
        );
        assert!(m.has_percentiles());
        // Older versions: "Latency", no Count, no percentiles.
        let m = parse_memtier(
            r#"{"ALL STATS": {"Totals": {"Ops/sec": 50.0, "Latency": 1.0}}}"#,
            4.0,
        )
        .unwrap();
        assert_eq!((m.ops, m.mean_us, m.p99_us), (200, Some(1000.0), None));
        assert!(parse_memtier("{}", 1.0).is_err());
    }
}
