//! External load generators through the lab's library API: a tiny experiment against
//! memcached whose points are loaded by kvlab bench, memcaslap and (when it is on PATH)
//! memtier_benchmark. memcaslap's point has its throughput and its own mean but no
//! percentiles: the raw run says so (absent, not 0) and the report shows "–"; each run
//! records the generator's CPU, memcached's and the whole machine's. memtier_benchmark's points are left out with
//! a note when it is missing. Skipped when memcached or memcaslap is not installed.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use kvlab_lab::{Lab, Overrides, Source};
use kvlab_process::which;

const TINY: &str = r#"
name = "generators"
repetitions = 1
duration = 1.0
warmup = 0.0

[[system]]
name = "memcached"
args = ["-t", "1", "-m", "16"]

[workload]
clients = 2
keys = 2000
value_size = 64
mix = "get=9,set=1"
generator_cpus = "0"

[factors]
generator = ["kvlab", "memcaslap", "memtier_benchmark"]
"#;

#[test]
fn memcaslap_point_has_throughput_and_no_percentiles() {
    if which("memcached").is_none() || which("memcaslap").is_none() {
        eprintln!("skipped: memcached or memcaslap (libmemcached-tools) not installed");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let source = Source {
        label: "generators.toml".into(),
        text: TINY.into(),
        stem: "generators".into(),
    };
    let done = Lab { kvlab_bin: None }
        .run(&source, &Overrides::default(), Some(out.clone()))
        .unwrap();
    let raws: Vec<serde_json::Value> = std::fs::read_dir(out.join("raw"))
        .unwrap()
        .map(|e| {
            serde_json::from_str(&std::fs::read_to_string(e.unwrap().path()).unwrap()).unwrap()
        })
        .collect();
    let memtier = which("memtier_benchmark").is_some();
    assert_eq!(raws.len(), if memtier { 3 } else { 2 });
    let caslap = raws
        .iter()
        .find(|v| v["external"]["generator"] == "memcaslap")
        .unwrap_or_else(|| panic!("no memcaslap run: {raws:#?}"));
    assert!(caslap["error"].is_null(), "{}", caslap["error"]);
    assert!(caslap["result"].is_null());
    let m = &caslap["external"]["measured"];
    assert!(m["throughput_qps"].as_f64().unwrap() > 0.0, "{m}");
    assert!(m["ops"].as_u64().unwrap() > 0, "{m}");
    // Percentiles are absent, not invented; memcaslap's own mean is there.
    for p in ["p50_us", "p95_us", "p99_us"] {
        assert!(m[p].is_null(), "{p}: {m}");
    }
    assert!(m["mean_us"].as_f64().unwrap() > 0.0, "{m}");
    // The regime: the generator's CPU and memcached's.
    assert!(caslap["external"]["cpu"].as_f64().unwrap() > 0.0);
    assert!(caslap["cpu"]["utilization"].as_f64().unwrap() > 0.0);
    assert!(caslap["machine"]["busy_cores"].as_f64().unwrap() > 0.0);
    let cmd: Vec<&str> = caslap["external"]["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(cmd[0], "memcaslap");
    assert!(cmd.windows(2).any(|w| w == ["-c", "2"]), "{cmd:?}");
    let kvlab = raws.iter().find(|v| v["external"].is_null()).unwrap();
    assert!(kvlab["result"]["latency"]["p99_us"].as_f64().unwrap() > 0.0);

    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("meta.json")).unwrap()).unwrap();
    let skipped = meta["skipped"].to_string();
    assert_eq!(
        !memtier,
        skipped.contains("memtier_benchmark is not on PATH"),
        "{skipped}"
    );
    // The terminal summary lists every point with its regime; memcaslap's p99 is "–".
    let line = done
        .summary
        .lines()
        .find(|l| l.contains("generator=memcaslap"))
        .unwrap_or_else(|| panic!("{}", done.summary));
    assert!(line.contains('–'), "{line}");
    let html = std::fs::read_to_string(&done.report).unwrap();
    assert!(html.contains("External load generators"), "no note");
    assert!(
        html.contains("memcaslap reports no percentiles"),
        "no reason"
    );
    assert!(html.contains("–"), "no dash for the absent percentiles");
    assert!(
        html.contains("machine busy CPU per request"),
        "no machine column"
    );
}
