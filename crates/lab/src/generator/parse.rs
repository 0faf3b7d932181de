//! Reading what an external generator printed: memcaslap's text, memtier's JSON file and text.

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
    /// Requests per second over its run time (see each parser for its source).
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

/// memtier_benchmark's figures, from its `--json-out-file` (`json`) and what it printed
/// (`text`, stdout and stderr), over a run of `duration_s` (its `--test-time`). Checked
/// against memtier 2.0.0 and 2.3.0 (fixtures in `tests/fixtures/`); older versions' `Latency`
/// key and table column are read too.
///
/// - Requests: the JSON's `"ALL STATS"."Totals"."Count"`.
/// - Throughput: that count over `duration_s`, as memtier's progress line averages it. The
///   JSON's and the table's `Ops/sec` divide by the client's start-to-end time, which ran
///   1 s past a 2 s test here (2.3.0: 45,626 requests, `Ops/sec` 15,204 where the progress
///   line says 22,803), so they are not taken.
/// - Mean: the `Totals` row of the printed `ALL STATS` table (`Avg. Latency`, five decimals
///   of a millisecond). The JSON's `Average Latency` is not a precise source: 2.3.0 divides
///   whole microseconds of total latency by the count in integers and prints 0.000 for a
///   0.437 ms mean. Without the table: `Accumulated Latency` (ms) over `Count`, else
///   `Average Latency`.
/// - Percentiles (`p50.00`, `p95.00`, `p99.00`, `p99.90`) and the largest: the JSON, in
///   milliseconds with three decimals, as the table prints them.
pub fn parse_memtier(json: &str, text: &str, duration_s: f64) -> anyhow::Result<Measured> {
    let v: serde_json::Value = serde_json::from_str(json).context("memtier's JSON")?;
    let totals = v
        .get("ALL STATS")
        .and_then(|s| s.get("Totals"))
        .context("no \"ALL STATS\".\"Totals\" in memtier's JSON")?;
    let num = |k: &str| totals.get(k).and_then(serde_json::Value::as_f64);
    let table = memtier_totals_row(text);
    let column = |names: &[&str]| {
        table
            .iter()
            .find(|(name, _)| names.contains(&name.as_str()))
            .and_then(|(_, v)| *v)
    };
    let ops = match num("Count") {
        Some(c) => c as u64,
        // Versions without a count: their own rate over the run.
        None => {
            let qps =
                num("Ops/sec").context("no Totals.\"Count\" or \"Ops/sec\" in memtier's JSON")?;
            (qps * duration_s).round() as u64
        }
    };
    let ms = |v: Option<f64>| v.map(|x| x * 1000.0);
    let pct = |k: &str| {
        ms(totals
            .get("Percentile Latencies")
            .and_then(|p| p.get(k))
            .and_then(serde_json::Value::as_f64))
    };
    let accumulated = match (num("Accumulated Latency"), num("Count")) {
        (Some(total_ms), Some(n)) if n > 0.0 => Some(total_ms / n),
        _ => None,
    };
    let mean_ms = column(&["Avg. Latency", "Latency"])
        .or(accumulated)
        .or_else(|| num("Average Latency").or_else(|| num("Latency")));
    Ok(Measured {
        ops,
        duration_s,
        throughput_qps: ops as f64 / duration_s,
        mean_us: ms(mean_ms),
        p50_us: pct("p50.00"),
        p95_us: pct("p95.00"),
        p99_us: pct("p99.00"),
        p99_9_us: pct("p99.90"),
        max_us: ms(num("Max Latency")),
    })
}

/// The `Totals` row of the last `ALL STATS` table memtier printed, as (column, value) pairs:
/// columns are named by the header line (`Type  Ops/sec  …  Avg. Latency  p50 Latency …`,
/// names apart by two spaces or more); `---` and `-nan` read as absent. Empty without a table.
fn memtier_totals_row(text: &str) -> Vec<(String, Option<f64>)> {
    let Some(start) = text.rfind("ALL STATS") else {
        return Vec::new();
    };
    let mut lines = text[start..].lines();
    let Some(header) = lines.find(|l| l.starts_with("Type ")) else {
        return Vec::new();
    };
    let Some(row) = lines.find(|l| l.starts_with("Totals ")) else {
        return Vec::new();
    };
    let names = header
        .split("  ")
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .skip(1);
    let values = row
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse::<f64>().ok().filter(|x| x.is_finite()));
    names.map(String::from).zip(values).collect()
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

    /// Real outputs of `memtier_benchmark` against memcached 1.6 (1 thread × 10 connections,
    /// get:set 10:1, `--test-time=2`, the lab's flags): its JSON file and what it printed.
    const MEMTIER_2_0: (&str, &str) = (
        include_str!("../../tests/fixtures/memtier-2.0.0.json"),
        include_str!("../../tests/fixtures/memtier-2.0.0.txt"),
    );
    const MEMTIER_2_3: (&str, &str) = (
        include_str!("../../tests/fixtures/memtier-2.3.0.json"),
        include_str!("../../tests/fixtures/memtier-2.3.0.txt"),
    );

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-6)
    }

    #[test]
    fn memtier_2_3_mean_from_its_table_not_its_truncated_json() {
        let (json, text) = MEMTIER_2_3;
        // What the JSON says: a mean of 0.000 ms, Ops/sec over 3 s for a 2 s run.
        assert!(
            json.contains("\"Average Latency\": 0.000"),
            "fixture changed"
        );
        let m = parse_memtier(json, text, 2.0).unwrap();
        assert_eq!(m.ops, 45_626);
        assert_eq!(m.throughput_qps, 22_813.0);
        // The table's Totals row: 0.43749 ms; its progress line: avg 0.44 ms, 22,803/s.
        assert!(close(m.mean_us, 437.49), "{:?}", m.mean_us);
        assert!(close(m.p50_us, 183.0) && close(m.p95_us, 407.0), "{m:?}");
        assert!(
            close(m.p99_us, 8_447.0) && close(m.p99_9_us, 13_503.0),
            "{m:?}"
        );
        assert!(close(m.max_us, 24_319.0), "{m:?}");
        // Without the printed table: the accumulated latency over the count (within 0.2 %).
        let m = parse_memtier(json, "", 2.0).unwrap();
        assert!(close(m.mean_us, 19_939_000.0 / 45_626.0), "{:?}", m.mean_us);
    }

    #[test]
    fn memtier_2_0_mean_from_its_table() {
        let (json, text) = MEMTIER_2_0;
        let m = parse_memtier(json, text, 2.0).unwrap();
        assert_eq!((m.ops, m.throughput_qps), (77_881, 38_940.5));
        assert!(close(m.mean_us, 256.35), "{:?}", m.mean_us);
        assert!(close(m.p99_us, 463.0) && close(m.max_us, 14_271.0), "{m:?}");
        // 2.0.0 has no accumulated latency: without the table, its Average Latency.
        let m = parse_memtier(json, "", 2.0).unwrap();
        assert!(close(m.mean_us, 256.0), "{:?}", m.mean_us);
    }

    #[test]
    fn memtier_table_columns_by_name() {
        let text = "ALL STATS\n=====\n\
            Type         Ops/sec     Hits/sec   Misses/sec    Avg. Latency     p50 Latency       KB/sec \n\
            -----\n\
            Sets            0.00          ---          ---             ---             ---         0.00 \n\
            Totals      33951.26     10796.87     20066.42         0.19631         0.18300      2404.68 \n";
        let row = memtier_totals_row(text);
        let names: Vec<&str> = row.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "Ops/sec",
                "Hits/sec",
                "Misses/sec",
                "Avg. Latency",
                "p50 Latency",
                "KB/sec"
            ]
        );
        assert_eq!(row[3].1, Some(0.19631));
        // No samples: memtier prints -nan, which is no mean.
        let nan = text.replace("0.19631", "   -nan");
        assert_eq!(memtier_totals_row(&nan)[3].1, None);
        assert!(memtier_totals_row("no table").is_empty());
    }

    #[test]
    fn memtier_older_json_without_count_or_table() {
        // Older versions: "Latency", no Count, no percentiles.
        let m = parse_memtier(
            r#"{"ALL STATS": {"Totals": {"Ops/sec": 50.0, "Latency": 1.0}}}"#,
            "",
            4.0,
        )
        .unwrap();
        assert_eq!((m.ops, m.mean_us, m.p99_us), (200, Some(1000.0), None));
        assert!(!m.has_percentiles());
        assert!(parse_memtier("{}", "", 1.0).is_err());
    }
}
