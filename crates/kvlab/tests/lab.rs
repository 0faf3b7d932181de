//! `kvlab lab` end to end through the real binary: a tiny experiment (2 points × 2
//! repetitions × 1 s, kvlab's server, and memcached beside it when installed) writes raw
//! results, metadata and a report with the expected sections; `lab analyse` rewrites the
//! same report from the raw data; a bad experiment file is a clear error.

use std::path::Path;
use std::process::{Command, Output};

fn kvlab(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvlab"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("kvlab runs")
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn memcached_installed() -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("memcached").is_file()))
}

const TINY: &str = r#"
name = "tiny"
description = "two client counts, two repetitions"
repetitions = 2
duration = 1.0
warmup = 0.3

[[system]]
name = "kvlab"
args = ["-t", "1", "-m", "16"]

[[system]]
name = "memcached"
args = ["-t", "1", "-m", "16"]
optional = true

[workload]
keys = 1000
value_size = 64

[factors]
clients = [1, 2]
"#;

#[test]
fn tiny_experiment_runs_stores_reports_and_reanalyses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("tiny.toml");
    std::fs::write(&file, TINY).expect("write experiment");
    let out = dir.path().join("out");
    let o = kvlab(
        &[
            "lab",
            "run",
            file.to_str().expect("utf-8 path"),
            "--out",
            out.to_str().expect("utf-8 path"),
        ],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("max throughput"), "{}", text(&o));
    assert!(stdout.contains("report: "), "{}", text(&o));

    let systems = if memcached_installed() { 2 } else { 1 };
    let raws: Vec<_> = std::fs::read_dir(out.join("raw"))
        .expect("raw dir")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(raws.len(), 2 * 2 * systems, "{raws:?}");
    for r in &raws {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(r).expect("read raw")).expect("json");
        assert!(v["error"].is_null(), "{r:?}: {}", v["error"]);
        assert!(v["result"]["throughput_qps"].as_f64().expect("throughput") > 0.0);
        assert!(
            v["cpu"]["utilization"].as_f64().is_some(),
            "{r:?}: no CPU reading"
        );
        assert!(v["latency_hist"].is_string(), "{r:?}: no histogram");
        assert!(v["args"].as_array().is_some_and(|a| !a.is_empty()));
    }
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("meta.json")).expect("meta.json"))
            .expect("meta json");
    for key in ["kvlab_version", "commit", "date", "experiment_text"] {
        assert!(
            meta[key].as_str().is_some_and(|s| !s.is_empty()),
            "meta {key}"
        );
    }
    assert!(meta["cores"].as_u64().is_some_and(|c| c >= 1));
    assert!(meta["memory_bytes"].as_u64().is_some_and(|m| m > 0));

    let index = out.join("report").join("index.html");
    let html = std::fs::read_to_string(&index).expect("report/index.html");
    for needle in [
        "Throughput vs clients",
        "Maximum throughput per configuration",
        "interactive law",
        "Model vs measurement",
        "MVA",
        "Latency percentiles vs clients",
        "Latency distribution",
        "All points of part main",
        "95% confidence interval",
        "kvlab version",
    ] {
        assert!(html.contains(needle), "report lacks {needle:?}");
    }
    if systems == 2 {
        assert!(html.contains("memcached"), "report lacks memcached");
    }

    // Re-analysis of the raw data rewrites the same report.
    let json_before = std::fs::read(out.join("report").join("report.json")).expect("report.json");
    std::fs::remove_dir_all(out.join("report")).expect("remove report");
    let o = kvlab(
        &["lab", "analyse", out.to_str().expect("utf-8 path")],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let html_after = std::fs::read_to_string(&index).expect("rewritten index.html");
    let json_after = std::fs::read(out.join("report").join("report.json")).expect("report.json");
    assert!(html == html_after, "analyse wrote a different index.html");
    assert!(
        json_before == json_after,
        "analyse wrote a different report.json"
    );
}

#[test]
fn bad_experiment_files_are_clear_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        (
            "typo.toml",
            "[[system]]\nname = \"kvlab\"\n[workload]\nclinets = 4\n",
            "clinets",
        ),
        ("nosys.toml", "repetitions = 2\n", "system"),
        (
            "twok.toml",
            "design = \"2k\"\n[[system]]\nname = \"kvlab\"\n[factors]\nclients = [1, 2, 4]\n",
            "exactly two",
        ),
        ("syntax.toml", "[[system]\nname = \"kvlab\"\n", "TOML"),
    ];
    for (name, body, expect) in cases {
        let f = dir.path().join(name);
        std::fs::write(&f, body).expect("write");
        let o = kvlab(&["lab", "run", f.to_str().expect("utf-8 path")], dir.path());
        assert!(!o.status.success(), "{name}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.to_lowercase().contains(&expect.to_lowercase()),
            "{name}: error does not mention {expect:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{name}: {err}");
    }
    let o = kvlab(&["lab", "run", "no-such-experiment"], dir.path());
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no such file"));
    let o = kvlab(
        &["lab", "analyse", dir.path().to_str().expect("utf-8")],
        dir.path(),
    );
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("meta.json"));
}

#[test]
fn shipped_experiments_are_listed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let o = kvlab(&["lab", "list"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    let s = String::from_utf8_lossy(&o.stdout);
    for name in ["quick", "baseline-clients", "rate-scan", "factorial-2k"] {
        assert!(s.contains(name), "{s}");
    }
    let o = kvlab(&["lab", "show", "factorial-2k"], dir.path());
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("design = \"2k\""));
}
