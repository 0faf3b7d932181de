//! `kvlab bench --data`: real data sets as load against a real `kvlab server`. A maildir of
//! synthetic messages, a JSON-lines file and a CSV file are loaded with `--verify`; then an
//! independent client reads every key back and compares the bytes with the source. A value
//! changed on the server behind the bench's back is a verification failure.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use kvlab_bench::data::wire_key;
use kvlab_client::Client;
use kvlab_process::{free_ports, Probe, Process, Spawn};

const KVLAB: &str = env!("CARGO_BIN_EXE_kvlab");

fn server() -> Process {
    let port = free_ports(1).unwrap()[0];
    Spawn::new(KVLAB)
        .args(["server", "-l", "127.0.0.1", "-t", "2", "-m", "256"])
        .args(["-p".to_string(), port.to_string()])
        .ready(Probe::Version(SocketAddr::from(([127, 0, 0, 1], port))))
        .start()
        .expect("kvlab server starts")
}

/// Runs `kvlab bench -s addr ARGS --json`; returns its stdout and the run's JSON.
fn bench(addr: SocketAddr, args: &[&str], dir: &Path) -> (String, serde_json::Value) {
    let json = dir.join("run.json");
    let out = Command::new(KVLAB)
        .args(["bench", "-s", &addr.to_string(), "-T", "1", "-q"])
        .args(["--timeout-ms", "5000"])
        .args(args)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("kvlab bench runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "kvlab bench {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (stdout, doc["runs"][0].clone())
}

/// `kvlab bench --data DATA --mix MIX --verify --requests N EXTRA…`, which must be clean
/// ([`assert_clean`]); its stdout and the run's JSON.
fn verified(
    addr: SocketAddr,
    data: &Path,
    mix: &str,
    requests: u64,
    extra: &[&str],
    dir: &Path,
) -> (String, serde_json::Value) {
    let n = requests.to_string();
    let mut args = vec!["--data", data.to_str().unwrap(), "--mix", mix, "--verify"];
    args.extend(["--requests", &n]);
    args.extend(extra);
    let (stdout, run) = bench(addr, &args, dir);
    assert_clean(&run, requests);
    (stdout, run)
}

fn count(run: &serde_json::Value, field: &str) -> u64 {
    run["counters"][field].as_u64().unwrap()
}

/// Every request answered, no error, every checked value its record's.
fn assert_clean(run: &serde_json::Value, requests: u64) {
    assert_eq!(count(run, "completed"), requests, "{}", run["counters"]);
    assert_eq!(
        (
            count(run, "errors"),
            count(run, "verify_errors"),
            count(run, "timeouts")
        ),
        (0, 0, 0),
        "{}",
        run["counters"]
    );
    assert!(count(run, "gets") > 0 && count(run, "hits") > 0);
    assert_eq!(count(run, "misses"), 0, "the load phase set every record");
}

fn client(addr: SocketAddr) -> Client {
    Client::connect(addr, Duration::from_secs(5)).unwrap()
}

/// A maildir tree of `n` synthetic messages (seeded: the same bytes every run).
fn write_maildir(root: &Path, n: usize) -> Vec<String> {
    kvlab_bench::maildir::write_synthetic_maildir(root, n, 7).unwrap()
}

#[test]
fn a_maildir_loads_and_every_message_reads_back_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("maildir");
    let files = write_maildir(&root, 300);
    let mut srv = server();
    let addr = srv.addr().unwrap();
    let (stdout, run) = verified(addr, &root, "set=1,get=1", 3000, &[], dir.path());
    let data = &run["config"]["workload"]["data_set"];
    assert_eq!(data["format"], "maildir", "{data}");
    assert_eq!(data["records"], 300, "{data}");
    assert_eq!(data["mapped_keys"], 0, "{data}");
    assert_eq!(count(&run, "sets") + count(&run, "gets"), 3000);
    assert!(stdout.contains("data: maildir"), "{stdout}");
    assert_eq!(
        run["load"]["completed"], 300,
        "the load phase set each record once"
    );

    let mut c = client(addr);
    for rel in &files {
        let want = std::fs::read(root.join(rel)).unwrap();
        let got = c.get(rel.as_bytes()).unwrap();
        assert_eq!(got.as_deref(), Some(&want[..]), "{rel}");
    }

    // Keyed by Message-ID: the same messages under their ids.
    let key_by_id = ["--data-key", "message-id"];
    verified(addr, &root, "get=1", 600, &key_by_id, dir.path());
    let mut c = client(addr);
    for rel in files.iter().step_by(7) {
        let want = std::fs::read(root.join(rel)).unwrap();
        let id = kvlab_bench::data::message_id(&want).unwrap();
        assert_eq!(c.get(&id).unwrap().as_deref(), Some(&want[..]), "{rel}");
    }
    srv.kill();
}

#[test]
fn json_lines_and_csv_load_with_mapped_keys_and_binary_values() {
    let dir = tempfile::tempdir().unwrap();
    let mut srv = server();
    let addr = srv.addr().unwrap();

    // JSON lines: text values, one binary value in base64, a key with a space, a key longer
    // than 250 bytes, and a value over the item size limit given (64 KiB).
    let binary: Vec<u8> = (0..=255u8).chain(*b"\r\nEND\r\n").collect();
    let long_key = "k".repeat(300);
    let mut records: Vec<(String, Vec<u8>)> = (0..100)
        .map(|i| {
            (
                format!("user:{i}"),
                format!("{{\"n\": {i}, \"é\": \"ü\"}}").into_bytes(),
            )
        })
        .collect();
    records.push(("blob".into(), binary.clone()));
    records.push(("user 42 profile".into(), b"spaced out".to_vec()));
    records.push((long_key.clone(), b"long".to_vec()));
    let mut text = String::new();
    for (k, v) in &records {
        let line = if k == "blob" {
            use base64::Engine as _;
            serde_json::json!({"key": k, "value_base64":
                base64::engine::general_purpose::STANDARD.encode(v)})
        } else {
            serde_json::json!({"key": k, "value": String::from_utf8(v.clone()).unwrap()})
        };
        text.push_str(&line.to_string());
        text.push('\n');
    }
    text.push_str(&serde_json::json!({"key": "huge", "value": "h".repeat(100_000)}).to_string());
    text.push('\n');
    let jsonl = dir.path().join("records.jsonl");
    std::fs::write(&jsonl, text).unwrap();
    let limit = ["--max-item-size", "64k"];
    let (stdout, run) = verified(addr, &jsonl, "set=1,get=1", 2000, &limit, dir.path());
    let data = &run["config"]["workload"]["data_set"];
    assert_eq!(data["records"], 103, "{data}");
    assert_eq!(data["mapped_keys"], 2, "{data}");
    assert_eq!(
        data["mapped_example"]["original"], "user 42 profile",
        "{data}"
    );
    assert_eq!(
        (&data["skipped_oversize"], &data["largest_skipped"]),
        (&serde_json::json!(1), &serde_json::json!(100_000)),
        "{data}"
    );
    assert!(stdout.contains("keys mapped: 2"), "{stdout}");
    assert!(stdout.contains("skipped 1"), "{stdout}");
    let mut c = client(addr);
    for (k, v) in &records {
        let key = wire_key(k.as_bytes(), false);
        assert_eq!(c.get(&key).unwrap().as_deref(), Some(&v[..]), "{k}");
    }
    assert_eq!(c.get(b"huge").unwrap(), None, "skipped");

    // The same records through the meta protocol: values checked from `VA` replies.
    let meta = ["--max-item-size", "64k", "--protocol", "meta"];
    verified(addr, &jsonl, "get=3,set=1", 1000, &meta, dir.path());

    // CSV: a header row, a quoted value with a comma and a newline, doubled quotes.
    let mut csv = String::from("key,value\n");
    let mut rows: Vec<(String, String)> = (0..100)
        .map(|i| (format!("row:{i}"), format!("plain value {i}")))
        .collect();
    rows.push(("quoted".into(), "hello, world\nsecond line".into()));
    rows.push(("quotes".into(), "she said \"hi\", twice".into()));
    for (k, v) in &rows {
        let v = if v.contains([',', '\n', '"']) {
            format!("\"{}\"", v.replace('"', "\"\""))
        } else {
            v.clone()
        };
        csv.push_str(&format!("{k},{v}\n"));
    }
    let path = dir.path().join("table.csv");
    std::fs::write(&path, csv).unwrap();
    let (_, run) = verified(addr, &path, "set=1,get=1", 2000, &[], dir.path());
    assert_eq!(run["config"]["workload"]["data_set"]["records"], 102);
    let mut c = client(addr);
    for (k, v) in &rows {
        assert_eq!(
            c.get(k.as_bytes()).unwrap().as_deref(),
            Some(v.as_bytes()),
            "{k}"
        );
    }
    srv.kill();
}

#[test]
fn verify_catches_a_value_changed_on_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("maildir");
    let files = write_maildir(&root, 60);
    let mut srv = server();
    let addr = srv.addr().unwrap();
    let data = root.to_str().unwrap();
    let get_all = [
        "--data",
        data,
        "--mix",
        "get=1",
        "--key-dist",
        "sequential",
        "--verify",
        "--noload",
        "-c",
        "1",
        "--requests",
        "120",
    ];
    // Filled by the load phase, every read checks.
    let (_, run) = bench(
        addr,
        &["--data", data, "--mix", "get=1", "--requests", "60"],
        dir.path(),
    );
    assert_eq!(count(&run, "misses"), 0);
    let (_, run) = bench(addr, &get_all, dir.path());
    assert_clean(&run, 120);
    // One message's value is replaced by one of the same length but a changed byte, and
    // another's by another message (a stale or misplaced value).
    let mut c = client(addr);
    let mut bad = std::fs::read(root.join(&files[5])).unwrap();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x20;
    assert!(c.set(files[5].as_bytes(), &bad).unwrap());
    let other = std::fs::read(root.join(&files[6])).unwrap();
    assert!(c.set(files[7].as_bytes(), &other).unwrap());
    let (stdout, run) = bench(addr, &get_all, dir.path());
    // Each of the two keys is read twice by the sequential walk over 60 keys.
    assert_eq!(count(&run, "verify_errors"), 4, "{stdout}");
    assert_eq!(count(&run, "misses"), 0);
    srv.kill();
}
