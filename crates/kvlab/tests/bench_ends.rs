//! Every `kvlab bench` run ends: a request-count run against a cluster whose node is killed
//! mid-run finishes and says what failed, and Ctrl-C ends any run with what it measured so
//! far. Each run here is waited for with a deadline: past it the test fails as a hang
//! instead of hanging itself.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use common::cluster::*;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use kvlab_process::{free_ports, Process};
use kvlab_testkit::Memcached;

/// Waits for `child` at most `limit` (on a thread blocked in its wait); kills it and fails
/// the test past that.
fn wait_bounded(child: Child, limit: Duration, what: &str) -> Output {
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(limit) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            // SAFETY: kill(2) of the child this test started, still unreaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let out = rx.recv().unwrap().unwrap();
            panic!(
                "{what} still running after {limit:?} (a hang): {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

fn counters(json: &Path) -> serde_json::Value {
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    report["runs"][0].clone()
}

/// `--requests N` against three nodes, one killed with -9 once the run is under way: the
/// run ends, every one of the N requests is sent, and the ones the dead node could not
/// answer are counted as errors (before, the generator waited for good).
#[test]
fn a_request_count_run_ends_when_a_cluster_node_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let topology = dir.path().join("topology.json").display().to_string();
    let ports = free_ports(3).unwrap();
    let names: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let mut args = vec!["create"];
    args.extend(names.iter().map(String::as_str));
    cluster(&topology, &args);
    let mut nodes: Vec<Process> = ports.iter().map(|&p| node(&topology, p)).collect();
    let json = dir.path().join("bench.json");
    let requests = 300_000u64;
    let child = Command::new(KVLAB)
        .args(["bench", "--cluster", &names[0], "--keys", "2000"])
        .args(["-T", "1", "-c", "8", "--timeout-ms", "2000"])
        .args(["--requests", &requests.to_string(), "--json"])
        .arg(&json)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Past the load phase (2,000 sets) and well into the run.
    until("the run to be under way", || served(&names) > 20_000);
    nodes[1].kill();
    let out = wait_bounded(child, Duration::from_secs(120), "the bench");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = counters(&json);
    let c = &run["counters"];
    assert_eq!(c["sent"].as_u64(), Some(requests), "{c}");
    let (completed, errors) = (
        c["completed"].as_u64().unwrap(),
        c["errors"].as_u64().unwrap(),
    );
    assert!(completed > 0 && errors > 0, "{c}");
    assert!(
        completed + errors >= requests,
        "every request answered or counted as failed: {c}"
    );
}

/// Ctrl-C (SIGINT) ends a run that would go on for hours: the partial result is printed and
/// written, its last interval cut at the interrupt, and the exit status is 130.
#[test]
fn ctrl_c_ends_a_run_with_its_partial_result() {
    let mc = Memcached::start_with(&[])
        .unwrap_or_else(|e| panic!("{e} (.ci/run installs Debian's memcached)"));
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let live = dir.path().join("live.jsonl");
    let child = Command::new(KVLAB)
        .args(["bench", "-s", &mc.addr.to_string(), "-T", "1", "-c", "4"])
        .args([
            "--keys",
            "1000",
            "--requests",
            "10000000000",
            "--interval",
            "0.2",
        ])
        .arg("--json")
        .arg(&json)
        .arg("--live")
        .arg(&live)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    until("two intervals measured", || {
        std::fs::read_to_string(&live).is_ok_and(|s| s.lines().count() >= 2)
    });
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    assert_eq!(rc, 0);
    let out = wait_bounded(child, Duration::from_secs(30), "the interrupted bench");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(130), "{stdout}{stderr}");
    assert!(stdout.contains("measured"), "{stdout}");
    assert!(stderr.contains("partial"), "{stderr}");
    let run = counters(&json);
    let c = &run["counters"];
    assert!(c["completed"].as_u64().unwrap() > 0, "{c}");
    assert_eq!(
        c["sent"], c["completed"],
        "replies in flight waited for: {c}"
    );
    assert!(
        run["notes"].to_string().contains("stopped early"),
        "{}",
        run["notes"]
    );
}
