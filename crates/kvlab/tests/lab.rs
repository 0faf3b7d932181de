//! `kvlab lab` end to end through the real binary: a tiny experiment (2 points × 2
//! repetitions × 1 s, kvlab's server, and memcached beside it when installed) writes raw
//! results, metadata and a report with the expected sections; `lab analyse` rewrites the
//! same report from the raw data; a bad experiment file is a clear error. A tiny experiment
//! with `protocol` as a factor loads one kvlab server over memcached and HTTP (memcached,
//! which cannot serve HTTP, runs only the memcached points). Command-line overrides shrink a
//! two-part file for every part, are recorded and re-analysed, and fail like the file. An
//! external system (a server the test started) is loaded at its address, its CPU read from
//! its pid, and left running. The storage ring runs its clients and nodes on namespace hosts
//! over ssh, memcached behind the same client ring beside its durable nodes; and its scale
//! part there, a node added on a host and one removed, the topology in an etcd here.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kvlab_process::{self as process, free_port, Probe, Spawn};

fn kvlab(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvlab"))
        .args(args)
        .current_dir(cwd)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("kvlab runs")
}

/// `kvlab lab run FILE --out OUT` in `cwd`.
fn lab_run(file: &Path, out: &Path, cwd: &Path) -> Output {
    let (file, out) = (
        file.to_str().expect("utf-8 path"),
        out.to_str().expect("utf-8 path"),
    );
    kvlab(&["lab", "run", file, "--out", out], cwd)
}

/// Runs the storage-ring experiment `file` into `out`; its `ring.json`, which must have no
/// notes (nothing the run had to say was wrong), and what it printed.
fn run_ring(file: &Path, out: &Path, cwd: &Path) -> (serde_json::Value, String) {
    let o = lab_run(file, out, cwd);
    assert!(o.status.success(), "{}", text(&o));
    let res = read_json(&out.join("ring.json"));
    assert_eq!(
        res["notes"].as_array().map(Vec::len),
        Some(0),
        "{}",
        res["notes"]
    );
    (res, String::from_utf8_lossy(&o.stdout).into_owned())
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Writes the experiment [`experiment`]`(head, tail)` into a new temporary directory and runs
/// `kvlab lab run FILE --out DIR/out` and `extra` there; returns the directory, the results
/// directory and the outcome.
fn run_tiny(head: &str, tail: &str, extra: &[&str]) -> (tempfile::TempDir, PathBuf, Output) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let path = dir.join("tiny.toml");
    std::fs::write(&path, experiment(head, tail)).expect("write experiment");
    let out = dir.join("out");
    let mut args = vec![
        "lab",
        "run",
        path.to_str().expect("utf-8 path"),
        "--out",
        out.to_str().expect("utf-8 path"),
    ];
    args.extend(extra);
    let o = kvlab(&args, dir);
    (tmp, out, o)
}

fn read_json(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).expect("read json")).expect("json")
}

/// The stored runs of a results directory, in measurement order.
fn raw_runs(out: &Path) -> Vec<serde_json::Value> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(out.join("raw"))
        .expect("raw dir")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    files.iter().map(|f| read_json(f)).collect()
}

fn memcached_installed() -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("memcached").is_file()))
}

/// The systems of every tiny experiment: kvlab's server, and memcached beside it with the
/// same threads and memory when it is installed.
const SYSTEMS: &str = r#"
[[system]]
name = "kvlab"
args = ["-t", "1", "-m", "16"]

[[system]]
name = "memcached"
args = ["-t", "1", "-m", "16"]
optional = true
"#;

/// An experiment file: `head` (top-level keys), [`SYSTEMS`], then `tail` (tables).
fn experiment(head: &str, tail: &str) -> String {
    format!("{head}\n{SYSTEMS}\n{tail}")
}

const TINY_HEAD: &str = r#"
name = "tiny"
description = "two client counts, two repetitions"
repetitions = 2
duration = 1.0
warmup = 0.3
"#;

/// Ends inside `[factors]`, so a test can add a factor by appending a line.
const TINY_TAIL: &str = r#"
[workload]
keys = 1000
value_size = 64

[factors]
clients = [1, 2]
"#;

#[test]
fn tiny_experiment_runs_stores_reports_and_reanalyses() {
    let (dir, out, o) = run_tiny(TINY_HEAD, TINY_TAIL, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("max throughput"), "{}", text(&o));
    assert!(stdout.contains("report: "), "{}", text(&o));

    let systems = if memcached_installed() { 2 } else { 1 };
    let raws = raw_runs(&out);
    assert_eq!(raws.len(), 2 * 2 * systems, "{}", text(&o));
    for v in &raws {
        let r = &v["index"];
        assert!(v["error"].is_null(), "{r:?}: {}", v["error"]);
        assert!(v["result"]["throughput_qps"].as_f64().expect("throughput") > 0.0);
        assert!(
            v["cpu"]["utilization"].as_f64().is_some(),
            "{r:?}: no CPU reading"
        );
        assert!(v["latency_hist"].is_string(), "{r:?}: no histogram");
        assert!(v["args"].as_array().is_some_and(|a| !a.is_empty()));
    }
    let meta = read_json(&out.join("meta.json"));
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
fn external_system_is_loaded_at_its_address_and_its_cpu_read_from_its_pid() {
    // A server the lab neither starts nor stops: on a port picked here, readiness awaited
    // by probing `version`.
    let port = free_port().expect("free port");
    let server = Spawn::new(env!("CARGO_BIN_EXE_kvlab"))
        .args(["server", "-p", &port.to_string(), "-t", "1", "-m", "16"])
        .ready(Probe::Version(([127, 0, 0, 1], port).into()))
        .start()
        .expect("start kvlab server");
    let addr = format!("127.0.0.1:{port}");
    let pid = server.pid();
    let file = format!(
        r#"
name = "outside"
repetitions = 1
duration = 0.5
warmup = 0.2

[[system]]
name = "theirs"
kind = "external"
address = "{addr}"
pid = {pid}

[workload]
keys = 1000
value_size = 64

[factors]
clients = [1, 2]
"#
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join("outside.toml");
    std::fs::write(&path, file).expect("write experiment");
    let out = tmp.path().join("out");
    let o = lab_run(&path, &out, tmp.path());
    assert!(o.status.success(), "{}", text(&o));
    let raws = raw_runs(&out);
    assert_eq!(raws.len(), 2, "{}", text(&o));
    for v in &raws {
        assert_eq!(v["system"], "theirs");
        assert!(v["error"].is_null(), "{}", v["error"]);
        assert_eq!(v["result"]["target"], addr.as_str());
        assert!(
            v["result"]["counters"]["completed"]
                .as_u64()
                .expect("completed")
                > 0
        );
        assert!(
            v["cpu"]["utilization"].as_f64().is_some_and(|u| u > 0.0),
            "no CPU reading from pid {pid}: {}",
            v["cpu"]
        );
    }
    // The lab left the server running: it still answers.
    let mut s = std::net::TcpStream::connect(&addr).expect("still up");
    use std::io::{Read, Write};
    s.write_all(b"version\r\n").expect("write");
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).expect("read");
    assert!(buf[..n].starts_with(b"VERSION "), "{:?}", &buf[..n]);
}

#[test]
fn http_experiment_loads_kvlab_over_http() {
    // The tiny experiment with the protocol as a second factor, one short repetition.
    let tail = format!("{TINY_TAIL}protocol = [\"memcached\", \"http\"]\n");
    let quick = ["--repetitions", "1", "--duration", "0.5", "--warmup", "0.2"];
    let (_dir, out, o) = run_tiny(TINY_HEAD, &tail, &quick);
    assert!(o.status.success(), "{}", text(&o));
    let raws = raw_runs(&out);
    let (http, other): (Vec<_>, Vec<_>) = raws.iter().partition(|v| v["protocol"] == "http");
    // kvlab: 2 clients x 2 protocols; memcached (when installed): the 2 memcached points only.
    let systems = if memcached_installed() { 2 } else { 1 };
    assert_eq!(http.len(), 2, "{}", text(&o));
    assert_eq!(other.len(), 2 * systems, "{}", text(&o));
    for v in &http {
        assert_eq!(v["system"], "kvlab");
        assert!(v["error"].is_null(), "{}", v["error"]);
        let res = &v["result"];
        assert_eq!(res["config"]["protocol"], "http");
        let c = &res["counters"];
        assert!(c["completed"].as_u64().expect("completed") > 0, "{c}");
        assert!(
            c["hits"].as_u64().expect("hits") > 0,
            "no get found its key: {c}"
        );
        assert_eq!(c["errors"], 0, "{c}");
        assert_eq!(c["timeouts"], 0, "{c}");
        let command: Vec<&str> = v["command"]
            .as_array()
            .expect("command")
            .iter()
            .filter_map(|a| a.as_str())
            .collect();
        let i = command
            .iter()
            .position(|a| *a == "--http-port")
            .expect("started with --http-port");
        // The generator spoke HTTP to that port, not to the memcached one.
        let port = command[i + 1];
        assert!(
            res["target"]
                .as_str()
                .is_some_and(|t| t.ends_with(&format!(":{port}"))),
            "target {} vs --http-port {port}",
            res["target"]
        );
    }
    for v in &other {
        assert_eq!(v["protocol"], "memcached");
        assert_eq!(v["result"]["config"]["protocol"], "memcached");
        assert!(v["error"].is_null(), "{}", v["error"]);
    }
    // memcached's HTTP points are left out with a note, kept in meta.json.
    let meta = read_json(&out.join("meta.json"));
    let skipped = meta["skipped"].to_string();
    assert!(
        skipped.contains("memcached") && skipped.contains("http"),
        "{skipped}"
    );
    let html =
        std::fs::read_to_string(out.join("report").join("index.html")).expect("report/index.html");
    assert!(
        html.contains("kvlab (protocol=http)"),
        "report lacks the HTTP curve"
    );
}

/// Two parts over [`TINY_HEAD`]'s 2 repetitions of 1 s: one with 4 repetitions, one with 8 s
/// runs and larger values.
const PARTS_TAIL: &str = r#"
[workload]
keys = 100000
value_size = 64

[[part]]
name = "sweep"
repetitions = 4
[part.factors]
clients = [1, 2]

[[part]]
name = "single"
duration = 8.0
[part.workload]
clients = 1
value_size = 1000
"#;

/// The innermost cause of a failed run's error (`Caused by:` … last line).
fn root_cause(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr);
    let last = err
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    let last = last.trim();
    match last.split_once(": ") {
        Some((n, rest)) if n.chars().all(|c| c.is_ascii_digit()) => rest.to_string(),
        _ => last.to_string(),
    }
}

#[test]
fn command_line_overrides_apply_to_every_part_and_are_recorded() {
    let flags = [
        "--repetitions",
        "1",
        "--duration",
        "0.3",
        "--warmup",
        "0.1",
        "--set",
        "keys=300",
        "--set",
        "value_size=16",
    ];
    let (dir, out, o) = run_tiny(TINY_HEAD, PARTS_TAIL, &flags);
    assert!(o.status.success(), "{}", text(&o));
    let systems = if memcached_installed() { 2 } else { 1 };
    let raws = raw_runs(&out);
    // Part sweep: 2 points, part single: 1 point; one repetition each, not 4 and 2.
    assert_eq!(raws.len(), 3 * systems, "{}", text(&o));
    for v in &raws {
        assert!(v["error"].is_null(), "{}", v["error"]);
        assert_eq!(v["repetition"], 0);
        let c = &v["result"]["config"];
        assert_eq!(c["plan"]["segments"][0]["duration_ns"], 300_000_000, "{c}");
        assert_eq!(c["warmup_s"], 0.1);
        assert_eq!(c["workload"]["keys"], 300);
        assert_eq!(c["workload"]["value_size"]["n"], 16, "part {}", v["part"]);
    }
    let meta = read_json(&out.join("meta.json"));
    assert_eq!(
        meta["overrides"],
        serde_json::json!({
            "repetitions": 1,
            "duration": 0.3,
            "warmup": 0.1,
            "set": ["keys=300", "value_size=16"],
        })
    );
    let index = out.join("report").join("index.html");
    let html = std::fs::read_to_string(&index).expect("report/index.html");
    for needle in [
        "--repetitions 1 --duration 0.3 --warmup 0.1 --set keys=300 --set value_size=16",
        "keys = 300",
    ] {
        assert!(html.contains(needle), "report lacks {needle:?}");
    }
    // Re-analysis resolves the experiment with the same overrides.
    let report_json = out.join("report").join("report.json");
    let before = std::fs::read(&report_json).expect("report.json");
    let o = kvlab(
        &["lab", "analyse", out.to_str().expect("utf-8")],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(before == std::fs::read(&report_json).expect("report.json"));

    // A bad override fails as the same value in the file does (file: top-level keys, tables),
    // before anything starts.
    let cases: [(&[&str], &str, &str); 6] = [
        (&["--set", "clinets=4"], "", "[workload]\nclinets = 4"),
        (
            &["--set", "value_size=abc"],
            "",
            "[workload]\nvalue_size = \"abc\"",
        ),
        (&["--set", "keys=0.5"], "", "[workload]\nkeys = 0.5"),
        (
            &["--set", "mix=get=1,put=1"],
            "",
            "[workload]\nmix = \"get=1,put=1\"",
        ),
        (&["--repetitions", "0"], "repetitions = 0", ""),
        (&["--duration=-1"], "duration = -1.0", ""),
    ];
    for (flags, head, tail) in cases {
        let (_d, _, by_flag) = run_tiny("", "", flags);
        let (_d, _, by_file) = run_tiny(head, tail, &[]);
        assert!(!by_flag.status.success(), "{flags:?}: {}", text(&by_flag));
        assert!(
            !by_file.status.success(),
            "{head}{tail}: {}",
            text(&by_file)
        );
        let cause = root_cause(&by_file);
        assert!(!cause.is_empty(), "{}", text(&by_file));
        assert_eq!(root_cause(&by_flag), cause, "{flags:?}");
    }
    for (args, expect) in [
        (&["--set", "keys"][..], "expected KEY=VALUE"),
        (&["--set", "clients=4"][..], "varies clients as a factor"),
    ] {
        let (_d, _, o) = run_tiny(TINY_HEAD, PARTS_TAIL, args);
        assert!(!o.status.success(), "{args:?}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(expect),
            "{args:?}: {}",
            text(&o)
        );
    }
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
        (
            "http-memcached.toml",
            "[[system]]\nname = \"memcached\"\n[workload]\nprotocol = \"http\"\n",
            "cannot serve protocol = \"http\"",
        ),
        (
            "protocol.toml",
            "[[system]]\nname = \"kvlab\"\n[workload]\nprotocol = \"gopher\"\n",
            "expected one of `memcached`, `http`, `meta`",
        ),
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
    for name in [
        "quick",
        "baseline-clients",
        "rate-scan",
        "factorial-2k",
        "protocols",
        "io-models",
        "proxy-middleware",
        "proxy-replication",
        "proxy-multiget",
        "proxy-2k",
        "proxy-vs-twemproxy",
        "compare-regimes",
        "compare-memcached",
        "bench-vs-memcaslap",
        "sustained-ab",
        "sustained-etc",
        "cluster-failure",
        "cluster-scaling-hosts",
        "storage-ring-hosts",
        "faults-quick",
        "faults-soak",
    ] {
        assert!(s.contains(name), "{s}");
    }
    let o = kvlab(&["lab", "show", "factorial-2k"], dir.path());
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("design = \"2k\""));
}

/// A twemproxy system: the lab starts two memcached backends, writes nutcracker's pool over
/// them, loads it, and records every process's CPU — the proxy's, the generator's and the
/// backends' — in the run and the report's table.
#[test]
fn a_twemproxy_system_runs_over_its_backends_with_every_process_cpu() {
    if process::which("nutcracker").is_none() || !memcached_installed() {
        eprintln!("skipped: nutcracker or memcached not installed");
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join("twem.toml");
    std::fs::write(
        &path,
        r#"
name = "twem"
description = "twemproxy over two memcached backends"
repetitions = 1
duration = 1.0
warmup = 0.3

[[system]]
name = "twemproxy"
kind = "twemproxy"
backends = 2
backend = "memcached"
backend_args = ["-t", "1", "-m", "16"]

[workload]
keys = 1000
value_size = 64
mix = "get=9,set=1"
clients = 4
"#,
    )
    .expect("write experiment");
    let out = tmp.path().join("out");
    let o = lab_run(&path, &out, tmp.path());
    assert!(o.status.success(), "{}", text(&o));
    let runs = raw_runs(&out);
    assert_eq!(runs.len(), 1);
    let r = &runs[0];
    assert_eq!(r["error"], serde_json::Value::Null, "{r}");
    let command = r["command"].to_string();
    assert!(
        command.contains("nutcracker") && command.contains("-c"),
        "{command}"
    );
    assert_eq!(r["backends"].as_array().map(Vec::len), Some(2), "{r}");
    assert!(r["result"]["throughput_qps"].as_f64().unwrap() > 0.0);
    assert_eq!(r["result"]["counters"]["errors"].as_u64(), Some(0), "{r}");
    assert!(
        r["cpu"]["utilization"].as_f64().unwrap() > 0.0,
        "the proxy's CPU: {r}"
    );
    assert!(
        r["backend_cpu"].as_f64().unwrap() > 0.0,
        "the backends' CPU: {r}"
    );
    let table = std::fs::read_dir(out.join("report"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().contains("all-points"))
        .expect("an all-points table");
    let table = std::fs::read_to_string(table).unwrap();
    let header = table.lines().next().unwrap();
    for column in [
        "server CPU (cores)",
        "generator CPU (cores)",
        "backends' CPU (cores)",
    ] {
        assert!(header.contains(column), "{header}");
    }
}

/// A scaling experiment through the real binary: a 3-node cluster, a node added and one
/// removed under a verified load; the events succeed, nothing is lost, the report has the
/// time series and the events table.
#[test]
fn a_scaling_experiment_adds_and_removes_under_verified_load() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("scale.toml");
    std::fs::write(
        &file,
        r#"kind = "scaling"
nodes = 3
duration = 7.0
interval = 0.5
node_args = ["-t", "1", "-m", "64"]
[workload]
keys = 5000
qps = 2000
threads = 1
connections = 4
[[event]]
at = 2.0
action = "add"
[[event]]
at = 4.5
action = "remove"
node = 0
"#,
    )
    .unwrap();
    let out = dir.path().join("out");
    let run = Command::new(env!("CARGO_BIN_EXE_kvlab"))
        .args(["lab", "run"])
        .arg(&file)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let res: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("scaling.json")).unwrap()).unwrap();
    let events = res["events"].as_array().unwrap();
    assert_eq!(events.len(), 2, "{res}");
    for e in events {
        assert!(e["error"].is_null(), "{e}");
        let m = &e["migration"];
        assert!(m["keys_copied"].as_u64().unwrap() > 500, "{e}");
    }
    let t = &res["totals"];
    assert!(t["completed"].as_u64().unwrap() > 1000, "{t}");
    for k in ["errors", "verify_errors", "misses", "timeouts"] {
        assert_eq!(t[k].as_u64(), Some(0), "{k}: {t}");
    }
    let html = std::fs::read_to_string(out.join("report/index.html")).unwrap();
    for want in [
        "Throughput and errors over time",
        "p99 latency",
        "Events",
        "share moved",
        "errors seen for",
        "class=\"mark\"",
        "add done",
    ] {
        assert!(html.contains(want), "report lacks {want}");
    }
}

/// The fault-injection harness as an experiment: the shipped `faults-quick` shrunk by
/// overrides to two seeds of 10 s over few keys. Every run is stored with its history and
/// the checker's files, the report has the anomalies section at its top, a table of the
/// runs and a timeline per seed with the nemesis's actions marked, and `lab analyse`
/// rewrites it byte for byte. What the checker found is the runs' output, not asserted.
#[test]
fn a_faults_experiment_stores_its_runs_and_reports_their_timelines() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("out");
    let o = kvlab(
        &[
            "lab",
            "run",
            "faults-quick",
            "--out",
            out.to_str().expect("utf-8 path"),
            "--repetitions",
            "2",
            "--duration",
            "10",
            "--set",
            "keys=40",
            "--set",
            "clients=2",
        ],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    eprintln!("{}", text(&o));
    let res = read_json(&out.join("faults.json"));
    assert_eq!(res["spec"]["duration"].as_f64(), Some(10.0), "{res}");
    assert_eq!(res["overrides"]["repetitions"].as_u64(), Some(2), "{res}");
    let runs = res["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2, "{res}");
    for (r, seed) in runs.iter().zip([1, 2]) {
        assert_eq!(r["seed"].as_u64(), Some(seed), "{r}");
        let s = &r["summary"];
        assert!(s["error"].is_null(), "{s}");
        let n = |f: &str| s[f].as_u64().expect("a count");
        assert!(n("ops") >= 100, "{s}");
        assert_eq!(n("ops"), n("ok") + n("failed") + n("unknown"), "{s}");
        let run_dir = out.join(r["dir"].as_str().expect("dir"));
        for f in [
            "history.jsonl",
            "anomalies.json",
            "summary.json",
            "timeline.txt",
        ] {
            assert!(run_dir.join(f).is_file(), "{} lacks {f}", run_dir.display());
        }
    }
    let html = std::fs::read_to_string(out.join("report/index.html")).expect("report");
    let anomalies = html.find(">Anomalies</h2>").expect("an anomalies section");
    let table = html.find(">Faults: runs</h2>").expect("the runs' section");
    assert!(anomalies < table, "anomalies come first");
    for want in [
        "Runs: file, 1 copy, cluster-aware clients",
        "Timeline: seed 1, file-r1-cluster",
        "Timeline: seed 2, file-r1-cluster",
        "class=\"mark\"",
        "heal",
    ] {
        assert!(html.contains(want), "the report lacks {want}");
    }
    let o = kvlab(
        &["lab", "analyse", out.to_str().expect("utf-8 path")],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let again = std::fs::read_to_string(out.join("report/index.html")).expect("report");
    assert_eq!(html, again, "lab analyse rewrites the same report");
}

/// The storage-ring experiment, small: 150 synthetic messages on 3 durable nodes with a
/// 40-entry cache each, one node added and one removed, every message read back after each
/// (nothing lost); throughput the original's way and kvlab bench's on 2 servers; one
/// node's hit ratio for two policies; the report has every table and the original's
/// figures beside kvlab's.
#[test]
fn a_storage_ring_experiment_scales_durable_nodes_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ring.toml");
    std::fs::write(
        &file,
        r#"kind = "storage-ring"
messages = 150
node_args = ["-t", "1", "-m", "64", "--cache-items", "40", "--eviction", "lru"]
[original]
scale_down_s = 15.6
scale_up_s = 17.8
get_ops_per_client = 756.0
[scale]
nodes = 3
[throughput]
servers = [2]
clients = [2]
ops_per_client = 50
repetitions = 2
bench_duration = 0.5
[cache]
sizes = [20]
policies = ["lru", "fifo"]
clients = 2
ops_per_client = 50
repetitions = 1
"#,
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = lab_run(&file, &out, dir.path());
    assert!(o.status.success(), "{}", text(&o));
    let res: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("ring.json")).unwrap()).unwrap();
    assert_eq!(
        res["notes"].as_array().map(Vec::len),
        Some(0),
        "{}",
        res["notes"]
    );
    let scale = &res["scale"];
    assert_eq!(scale["fill_errors"], 0, "{scale}");
    let events = scale["events"].as_array().unwrap();
    assert_eq!(events.len(), 2, "{scale}");
    for e in events {
        assert!(e["error"].is_null(), "{e}");
        let rb = &e["read_back"];
        assert_eq!(rb["read"], 150, "{e}");
        for k in ["missing", "wrong", "errors"] {
            assert_eq!(rb[k], 0, "{k}: {e}");
        }
        assert!(e["expected_keys"].as_u64().unwrap() > 0, "{e}");
        assert!(e["migration"]["keys_copied"].as_u64().unwrap() > 0, "{e}");
    }
    let method = res["method"].as_array().unwrap();
    assert_eq!(method.len(), 4, "2 repetitions of PUT and GET: {res}");
    for r in method.iter().chain(res["cache"].as_array().unwrap()) {
        assert_eq!(r["errors"], 0, "{r}");
        assert!(r["per_client"][1].as_f64().unwrap() > 0.0, "{r}");
    }
    assert_eq!(res["bench"].as_array().map(Vec::len), Some(2), "{res}");
    let cache = res["cache"].as_array().unwrap();
    assert_eq!(cache.len(), 2, "{res}");
    for r in cache {
        // 20 of 150 messages cached, gets uniform: most miss the cache and read the store.
        let h = r["hit_ratio"].as_f64().unwrap();
        assert!((0.0..0.6).contains(&h), "{r}");
    }
    let html = std::fs::read_to_string(out.join("report/index.html")).unwrap();
    for want in [
        "The original&#39;s figures beside kvlab&#39;s",
        "Scale up and down by one server",
        "Throughput, the original&#39;s method",
        "kvlab bench (closed loop)",
        "GET throughput and hit ratio",
        "17.8",
        "756",
    ] {
        assert!(html.contains(want), "report lacks {want}");
    }
    let again = kvlab(&["lab", "analyse", out.to_str().unwrap()], dir.path());
    assert!(again.status.success(), "{}", text(&again));
}

/// The storage ring across hosts, over real ssh to namespace hosts (root only — skipped,
/// saying why, elsewhere): its clients split over two client hosts (a `kvlab lab
/// ring-clients` on each), its 2 durable nodes and 2 memcached on a third; both systems
/// measured the same way, every process in its host's namespace, each host's CPU read, the
/// report's comparison and hosts tables written, nothing left running on any host.
#[test]
fn a_storage_ring_runs_its_clients_and_nodes_on_their_hosts_against_memcached() {
    use kvlab_testkit::hosts::NetnsHosts;
    let Some(net) = NetnsHosts::for_test("storage_ring_on_hosts", 3) else {
        return;
    };
    let mut table = format!(
        "[ssh]\nidentity = {:?}\nknown_hosts = {:?}\nconnect_timeout = 3\n",
        net.identity().display().to_string(),
        net.known_hosts().display().to_string()
    );
    for (i, name) in ["c1", "c2", "s1"].iter().enumerate() {
        table.push_str(&format!(
            "[[host]]\nname = \"{name}\"\nssh = \"{}\"\ndir = \"{}\"\n",
            net.ssh_target(i),
            net.scratch().join(name).display()
        ));
    }
    let file = net.scratch().join("ring-hosts.toml");
    std::fs::write(
        &file,
        format!(
            r#"kind = "storage-ring"
messages = 120
node_args = ["-t", "1", "-m", "64", "--cache-items", "40", "--eviction", "lru"]
memcached = true
memcached_args = ["-t", "1", "-m", "64"]
node_hosts = ["s1"]
client_hosts = ["c1", "c2"]
[scale]
nodes = 0
[cache]
sizes = []
[throughput]
servers = [2]
clients = [3]
ops_per_client = 300
repetitions = 2
bench_duration = 0.0
{table}"#
        ),
    )
    .unwrap();
    let out = net.scratch().join("results");
    let (res, summary) = run_ring(&file, &out, &net.scratch());
    let inode = |host: &str| {
        let i = ["c1", "c2", "s1"].iter().position(|h| *h == host).unwrap();
        net.netns_inode(i).unwrap()
    };
    let runs = res["method"].as_array().unwrap();
    // 2 repetitions × PUT and GET × the two systems, alternated.
    assert_eq!(runs.len(), 8, "{res}");
    let (mut node_cpu, mut client_cpu) = ([0.0f64; 2], [0.0f64; 2]);
    for r in runs {
        let system = r["system"].as_str().unwrap();
        assert!(["kvlab", "memcached"].contains(&system), "{r}");
        assert_eq!(r["errors"], 0, "{r}");
        let per = r["per_client"].as_array().unwrap();
        assert_eq!(per.len(), 3, "{r}");
        assert!(per.iter().all(|x| x.as_f64().unwrap() > 0.0), "{r}");
        // The nodes of the system measured on s1, the clients on c1 (2) and c2 (1), each in
        // its host's namespace.
        let placed = r["placed"].as_array().unwrap();
        let names: Vec<(&str, &str)> = placed
            .iter()
            .map(|p| (p["name"].as_str().unwrap(), p["host"].as_str().unwrap()))
            .collect();
        assert_eq!(names.len(), 4, "{names:?}");
        for (name, host) in &names[..2] {
            assert!(name.starts_with(system) && *host == "s1", "{names:?}");
        }
        assert!(
            names[2].0.starts_with("clients-") && names[2].1 == "c1",
            "{names:?}"
        );
        assert!(
            names[3].0.starts_with("clients-") && names[3].1 == "c2",
            "{names:?}"
        );
        for p in placed {
            let host = p["host"].as_str().unwrap();
            assert_eq!(
                p["netns"].as_u64(),
                Some(inode(host)),
                "{p}: not in its host"
            );
        }
        // Every host's machine read; the clients' CPU from their processes.
        let hosts: Vec<&str> = r["hosts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["host"].as_str().unwrap())
            .collect();
        assert_eq!(hosts, ["c1", "c2", "s1"], "{r}");
        // On s1, both systems' nodes read (every ring is up while either is measured).
        let on_s1 = &r["hosts"][2]["processes"];
        assert_eq!(on_s1.as_array().map(Vec::len), Some(4), "{r}");
        // CPU is read in clock ticks: a small run's may round to none; over a system's
        // runs, its nodes' and its clients' are some.
        let k = usize::from(system == "memcached");
        node_cpu[k] += r["cpu"]["nodes"].as_f64().unwrap();
        client_cpu[k] += r["cpu"]["client"].as_f64().unwrap();
    }
    // The clients read their own CPU to the nanosecond; the nodes' is read from /proc in
    // ticks (10 ms, charged to whoever runs when one falls). With 60 requests per client a
    // system's clients, then read in ticks, twice read none over their runs beside other
    // tests; with 300, kvlab's nodes read 0.11 (quiet) to 0.26 (loaded) cores summed over
    // their runs, memcached's 0.05–0.09, which may still be none.
    assert!(node_cpu[0] > 0.0, "{node_cpu:?}");
    assert!(client_cpu.iter().all(|&c| c > 0.0), "{client_cpu:?}");
    let html = std::fs::read_to_string(out.join("report/index.html")).unwrap();
    for want in [
        "Against memcached",
        "kvlab / memcached",
        "Hosts",
        "c1",
        "s1",
    ] {
        assert!(html.contains(want), "the report lacks {want:?}");
    }
    assert!(
        summary.contains("GET, 2 servers, 3 clients: kvlab"),
        "{summary}"
    );
    // Nothing left running on any host, no port but sshd's.
    for i in 0..3 {
        net.wait_quiet(i, std::time::Duration::from_secs(10))
            .unwrap_or_else(|left| panic!("left on host {}: {left:?}", i + 1));
        assert_eq!(net.listening(i), vec![22], "host {} still listens", i + 1);
    }
}

/// Two namespace hosts s1, s2 (ssh) and this machine as `lab` (local, at the bridge's
/// address, where etcd runs for them), with their `[[host]]` table and `[ssh]`; `None`
/// (the test skipped, saying why) without root or without etcd.
fn two_hosts_and_etcd_here(test: &str) -> Option<(kvlab_testkit::hosts::NetnsHosts, String)> {
    let net = kvlab_testkit::hosts::NetnsHosts::for_test(test, 2)?;
    if kvlab_process::which("etcd").is_none() {
        eprintln!("skipped: no etcd (apt-get install etcd-server)");
        return None;
    }
    let scratch = net.scratch();
    let mut table = format!(
        "[ssh]\nidentity = {:?}\nknown_hosts = {:?}\nconnect_timeout = 3\n",
        net.identity().display().to_string(),
        net.known_hosts().display().to_string()
    );
    for (i, name) in ["s1", "s2"].iter().enumerate() {
        table.push_str(&format!(
            "[[host]]\nname = \"{name}\"\nssh = \"{}\"\ndir = \"{}\"\n",
            net.ssh_target(i),
            scratch.join(name).display()
        ));
    }
    table.push_str(&format!(
        "[[host]]\nname = \"lab\"\nlocal = true\naddress = \"{}\"\ndir = \"{}\"\n",
        net.bridge(),
        scratch.join("lab").display()
    ));
    Some((net, table))
}

/// No process or port but sshd's on either of `two_hosts_and_etcd_here`'s hosts, and the
/// etcd the run started here (`etcd`: its record, with its pid) gone — stopped, it may stay
/// a zombie until this machine's init reaps it.
fn nothing_left_and_etcd_gone(net: &kvlab_testkit::hosts::NetnsHosts, etcd: &serde_json::Value) {
    for i in 0..2 {
        net.wait_quiet(i, std::time::Duration::from_secs(10))
            .unwrap_or_else(|left| panic!("left on host {}: {left:?}", i + 1));
        assert_eq!(net.listening(i), vec![22], "host {} still listens", i + 1);
    }
    let pid = etcd["pid"].as_u64().expect("etcd's pid in the result");
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.rsplit_once(") ").map(|(_, rest)| &rest[..1]);
    assert!(
        !stat.contains("(etcd)") || state == Some("Z"),
        "etcd (pid {pid}) still runs: {stat}"
    );
}

/// The storage ring's scale part with its nodes on two namespace hosts, its topology in an
/// etcd the lab starts here (a local host at the bridge's address, where the hosts reach
/// this machine): a node added on a host, one removed and stopped there, every message read
/// back after each; the cache part's node on a host too; nothing left anywhere.
#[test]
fn a_storage_ring_adds_and_removes_nodes_on_hosts_over_etcd() {
    use std::os::unix::fs::MetadataExt;
    let Some((net, table)) = two_hosts_and_etcd_here("storage_ring_scales_on_hosts") else {
        return;
    };
    let scratch = net.scratch();
    let file = scratch.join("ring-scale.toml");
    std::fs::write(
        &file,
        format!(
            r#"kind = "storage-ring"
messages = 150
node_args = ["-t", "1", "-m", "64", "--cache-items", "40", "--eviction", "lru"]
node_hosts = ["s1", "s2"]
[scale]
nodes = 2
[throughput]
servers = []
[cache]
sizes = [20]
policies = ["lru"]
clients = 2
ops_per_client = 30
repetitions = 1
{table}"#
        ),
    )
    .unwrap();
    let out = scratch.join("results");
    let (res, summary) = run_ring(&file, &out, &scratch);
    let inode = |host: &str| match host {
        "s1" => net.netns_inode(0).unwrap(),
        "s2" => net.netns_inode(1).unwrap(),
        _ => std::fs::metadata("/proc/self/ns/net").unwrap().ino(),
    };
    // etcd here, on the bridge's address: the hosts' nodes and the lab's coordinator
    // shared it.
    let topology = res["topology"].as_str().unwrap();
    assert!(
        topology.starts_with(&format!("etcd {}:", net.bridge())) && topology.ends_with("lab"),
        "{topology}"
    );
    let etcd = &res["etcd"];
    assert_eq!(etcd["host"], "lab", "{etcd}");
    assert_eq!(etcd["netns"].as_u64(), Some(inode("lab")), "{etcd}");
    let scale = &res["scale"];
    let events = scale["events"].as_array().unwrap();
    assert_eq!(events.len(), 2, "{scale}");
    for (e, action) in events.iter().zip(["add", "remove"]) {
        assert_eq!(e["action"], action, "{e}");
        assert!(e["error"].is_null(), "{e}");
        let m = &e["migration"];
        assert!(m["keys_copied"].as_u64().unwrap() > 0, "{e}");
        assert_eq!(m["keys_copied"], e["expected_keys"], "{e}");
        // Every message read back after it: none lost, no errors.
        let r = &e["read_back"];
        assert_eq!(r["read"], 150, "{e}");
        assert_eq!(
            (
                r["missing"].as_u64(),
                r["wrong"].as_u64(),
                r["errors"].as_u64()
            ),
            (Some(0), Some(0), Some(0)),
            "{e}"
        );
    }
    // Nodes 0 and 1 on s1 and s2, the added node 2 on s1 again; the removed one was on a
    // host too. Each ran in its host's namespace.
    assert_eq!(events[0]["host"], "s1", "{scale}");
    assert_eq!(events[0]["nodes_before"], 2, "{scale}");
    assert!(events[1]["host"].is_string(), "{scale}");
    let placed = scale["placed"].as_array().unwrap();
    let hosts: Vec<&str> = placed.iter().map(|p| p["host"].as_str().unwrap()).collect();
    assert_eq!(hosts, ["s1", "s2", "s1"], "{scale}");
    for p in placed {
        assert!(p["name"].as_str().unwrap().starts_with("kvlab-"), "{p}");
        let host = p["host"].as_str().unwrap();
        assert_eq!(
            p["netns"].as_u64(),
            Some(inode(host)),
            "{p}: not in its host"
        );
    }
    let added = events[0]["node"].as_str().unwrap();
    assert!(
        added.starts_with(&net.hosts()[0].addr.to_string()),
        "{added}: not at s1's address"
    );
    // The cache part's node on the first node host.
    let cache = res["cache"].as_array().unwrap();
    assert_eq!(cache.len(), 1, "{res}");
    assert_eq!(cache[0]["errors"], 0, "{}", cache[0]);
    assert!(cache[0]["hit_ratio"].as_f64().is_some(), "{}", cache[0]);
    let node = &cache[0]["placed"][0];
    assert_eq!(node["host"], "s1", "{}", cache[0]);
    assert_eq!(node["netns"].as_u64(), Some(inode("s1")), "{node}");
    assert!(
        summary.contains(&format!("add {added} on s1 (2 nodes)")),
        "{summary}"
    );
    let html = std::fs::read_to_string(out.join("report/index.html")).unwrap();
    for want in ["Scale up and down", " on s1", "Hosts", "etcd"] {
        assert!(html.contains(want), "the report lacks {want:?}");
    }
    // Nothing left: no process or port but sshd's on either host, etcd gone here, the
    // nodes' data and etcd's removed.
    nothing_left_and_etcd_gone(&net, etcd);
    for dir in [
        "s1/runs/results/scale/data",
        "s2/runs/results/scale/data",
        "lab/runs/results/etcd",
    ] {
        assert!(!scratch.join(dir).exists(), "{dir} is left");
    }
}

/// The scaling kind across hosts (namespace hosts over ssh): a cluster of 3 nodes with two
/// copies on s1 and s2 (node i on `node_hosts[i % 2]`), its topology in an etcd here at the
/// bridge's address, under the verified load from the lab's process; a node added (on s2,
/// the next in turn), one removed (stopped on its host) and one killed with kill -9 through
/// the placement. Every node ran in its host's namespace, no acknowledged write was lost,
/// and nothing is left on the hosts afterwards.
#[test]
fn a_scaling_experiment_adds_removes_and_kills_nodes_on_hosts() {
    use std::os::unix::fs::MetadataExt;
    let Some((net, table)) = two_hosts_and_etcd_here("scaling_on_hosts") else {
        return;
    };
    let scratch = net.scratch();
    let file = scratch.join("scale-hosts.toml");
    std::fs::write(
        &file,
        format!(
            r#"kind = "scaling"
nodes = 3
replicas = 2
node_hosts = ["s1", "s2"]
duration = 13.0
interval = 0.5
node_args = ["-t", "1", "-m", "64"]
[workload]
keys = 4000
qps = 1000
threads = 1
connections = 4
[[event]]
at = 1.5
action = "add"
[[event]]
at = 4.0
action = "remove"
node = 0
[[event]]
at = 6.0
action = "kill"
node = 1
{table}"#
        ),
    )
    .unwrap();
    let out = scratch.join("results");
    let started = std::time::Instant::now();
    let o = lab_run(&file, &out, &scratch);
    eprintln!("the run took {:.1} s", started.elapsed().as_secs_f64());
    assert!(o.status.success(), "{}", text(&o));
    let res = read_json(&out.join("scaling.json"));
    let inode = |host: &str| match host {
        "s1" => net.netns_inode(0).unwrap(),
        "s2" => net.netns_inode(1).unwrap(),
        _ => std::fs::metadata("/proc/self/ns/net").unwrap().ino(),
    };
    // etcd here (the local host "lab"), on the bridge's address.
    let topology = res["topology"].as_str().unwrap();
    assert!(
        topology.starts_with(&format!("etcd {}:", net.bridge())) && topology.ends_with("lab"),
        "{topology}"
    );
    let etcd = &res["etcd"];
    assert_eq!(etcd["host"], "lab", "{etcd}");
    assert_eq!(etcd["netns"].as_u64(), Some(inode("lab")), "{etcd}");
    let events = res["events"].as_array().unwrap();
    assert_eq!(events.len(), 3, "{res}");
    for (e, action) in events.iter().zip(["add", "remove", "kill"]) {
        assert_eq!(e["action"], action, "{e}");
        assert!(e["error"].is_null(), "{e}");
        // Each event's node ran on a host, in its namespace.
        let host = e["host"].as_str().unwrap_or_else(|| panic!("no host: {e}"));
        assert_eq!(e["placed"]["host"], host, "{e}");
        assert_eq!(e["placed"]["netns"].as_u64(), Some(inode(host)), "{e}");
        if action != "kill" {
            assert!(e["migration"]["keys_copied"].as_u64().unwrap() > 0, "{e}");
        }
    }
    // The added node is the 4th: on s2, at its address.
    assert_eq!(events[0]["host"], "s2", "{res}");
    let added = events[0]["node"].as_str().unwrap();
    assert!(
        added.starts_with(&format!("{}:", net.hosts()[1].addr)),
        "{added}: not at s2's address"
    );
    let placed = res["placed"].as_array().unwrap();
    let hosts: Vec<&str> = placed.iter().map(|p| p["host"].as_str().unwrap()).collect();
    assert_eq!(hosts, ["s1", "s2", "s1", "s2"], "{res}");
    for p in placed {
        assert!(p["name"].as_str().unwrap().starts_with("kvlab-"), "{p}");
        let host = p["host"].as_str().unwrap();
        assert_eq!(
            p["netns"].as_u64(),
            Some(inode(host)),
            "{p}: not in its host"
        );
    }
    // The verified load saw every acknowledged write.
    let t = &res["totals"];
    assert!(t["completed"].as_u64().unwrap() > 1000, "{t}");
    for k in ["verify_errors", "misses"] {
        assert_eq!(t[k].as_u64(), Some(0), "{k}: {t}");
    }
    let summary = String::from_utf8_lossy(&o.stdout);
    assert!(summary.contains(&format!("add {added} on s2")), "{summary}");
    assert!(summary.contains(" 0 lost writes"), "{summary}");
    let html = std::fs::read_to_string(out.join("report/index.html")).unwrap();
    for want in ["Events", "Hosts: where the nodes ran", " on s2"] {
        assert!(html.contains(want), "the report lacks {want:?}");
    }
    // Nothing left: no process or port but sshd's on either host, etcd gone here, its data
    // removed.
    nothing_left_and_etcd_gone(&net, etcd);
    assert!(
        !scratch.join("lab/runs/results/etcd").exists(),
        "etcd's data is left"
    );
}
