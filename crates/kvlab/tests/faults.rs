//! `kvlab faults` end to end: short seeded runs against real clusters (nodes, proxy,
//! coordinators and etcd are processes), their histories checked. These tests assert that
//! the harness ran and that its checker judged a real history — not that the cluster
//! passed: what a run finds is the harness's output, printed here. One test makes sure the
//! checker can fail: a nemesis that flushes nodes must be caught losing writes. With
//! `--netns` (as root) a run's nodes and etcd sit in network namespaces of their own and the
//! nemesis partitions and delays them; the namespaces are gone afterwards. With `--durable`
//! every node keeps its keys on disk under `--durability sync`, and a node killed with
//! `kill -9` comes back over its data directory: with one copy nothing acknowledged may be
//! missing afterwards.
//!
//! The runs take turns: each loads the machine's two cores with a cluster of its own.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

const KVLAB: &str = env!("CARGO_BIN_EXE_kvlab");

static TURNS: Mutex<()> = Mutex::new(());

/// Runs `kvlab faults run --seed SEED` with `args` (bounded: 5 minutes) and returns its
/// summary and exit status.
fn run(dir: &Path, seed: u64, args: &[&str]) -> (serde_json::Value, i32) {
    let _turn = TURNS.lock().unwrap_or_else(|e| e.into_inner());
    let out = Command::new("timeout")
        .args(["300", KVLAB, "faults", "run", "--seed", &seed.to_string()])
        .arg("--out")
        .arg(dir)
        .args(args)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("kvlab faults run --seed {seed} {args:?}: {said}");
    let code = out.status.code().unwrap_or(-1);
    assert!([0, 1, 2].contains(&code), "exit {code}: {said}");
    let summary = dir.join(format!("seed-{seed}")).join("summary.json");
    let summary = std::fs::read(&summary).unwrap_or_else(|e| panic!("{e}: {said}"));
    (serde_json::from_slice(&summary).unwrap(), code)
}

/// The run checked a history of at least `min_ops` operations, and checking the recorded
/// history again finds what the run found. `min_ops` says the history is not trivial, not
/// how fast the cluster is: set well below what a run does on a loaded machine (a durable
/// run with two copies did 781 in a CI run beside other tests).
fn checked(dir: &Path, seed: u64, summary: &serde_json::Value, min_ops: u64) {
    checked_as(dir, seed, summary, min_ops, "all");
}

/// [`checked`] for a cluster under write policy `policy`.
fn checked_as(dir: &Path, seed: u64, summary: &serde_json::Value, min_ops: u64, policy: &str) {
    let n = |f: &str| summary[f].as_u64().unwrap();
    assert!(n("ops") >= min_ops, "{summary}");
    assert_eq!(n("ops"), n("ok") + n("failed") + n("unknown"), "{summary}");
    let history = dir.join(format!("seed-{seed}")).join("history.jsonl");
    let out = Command::new(KVLAB)
        .args(["faults", "check", "--json", "--write-policy", policy])
        .arg(&history)
        .output()
        .unwrap();
    let again: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(again["ops"].as_u64(), Some(n("ops")));
    assert_eq!(again["lost_writes"].as_u64(), Some(n("lost_writes")));
    assert_eq!(again["stale_reads"].as_u64(), Some(n("stale_reads")));
    assert_eq!(again["never_written"].as_u64(), Some(n("never_written")));
    let timeline = std::fs::read_to_string(history.with_file_name("timeline.txt")).unwrap();
    assert!(timeline.contains("heal"), "{timeline}");
}

/// One copy of every key: nodes paused, added and removed under cluster-aware clients.
#[test]
fn one_copy_paused_added_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--duration", "12", "--faults", "pause,add,remove,add-two"];
    let (summary, _) = run(dir.path(), 11, &args);
    checked(dir.path(), 11, &summary, 2000);
    assert!(summary["actions"].as_u64().unwrap() >= 3, "{summary}");
}

/// The same through `kvlab proxy --cluster` with plain memcached clients.
#[test]
fn one_copy_behind_the_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--duration",
        "12",
        "--client",
        "proxy",
        "--faults",
        "pause,add,remove",
    ];
    let (summary, _) = run(dir.path(), 12, &args);
    checked(dir.path(), 12, &summary, 2000);
}

/// A plain pool of three servers behind `kvlab proxy --replicas 3`, no cluster: backends
/// paused (each is ejected, and a replica that missed writes is repaired before it serves
/// again, never flushed) under plain memcached clients.
#[test]
fn three_replicas_in_a_plain_pool_behind_the_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--duration", "10", "--client", "pool", "--replicas", "3"];
    let (summary, _) = run(dir.path(), 15, &args);
    checked(dir.path(), 15, &summary, 1000);
    assert!(
        summary["mix"].as_str().unwrap().contains("pause"),
        "{summary}"
    );
}

/// Two copies, topology in etcd, nodes killed (`kill -9`) and paused.
const KILLS_IN_ETCD: [&str; 8] = [
    "--duration",
    "12",
    "--replicas",
    "2",
    "--topology",
    "etcd",
    "--faults",
    "kill,pause",
];

/// Two copies, topology in etcd: one node at a time killed with `kill -9` and restarted.
/// (A run may stall on the cluster's own faults; it must still end, clean up and check
/// what it has.)
#[test]
fn two_copies_with_kill_9_in_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let (summary, _) = run(dir.path(), 13, &KILLS_IN_ETCD);
    checked(dir.path(), 13, &summary, 100);
}

/// The same under write policy `owner`: an acknowledged write nobody read may be lost with
/// its owner, and is set aside; no value read may be undone, and none is.
#[test]
fn two_copies_under_write_policy_owner_with_kill_9_in_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let args = [&KILLS_IN_ETCD[..], &["--write-policy", "owner"]].concat();
    let (summary, _) = run(dir.path(), 16, &args);
    checked_as(dir.path(), 16, &summary, 100, "owner");
    no_anomalies(dir.path(), 16, &summary);
}

/// A nemesis that flushes nodes loses acknowledged writes behind the cluster's back: the
/// checker must see it (misses after acknowledged writes, or lost writes at the end).
#[test]
fn the_checker_sees_a_flushed_node() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--duration", "8", "--faults", "flush"];
    let (summary, code) = run(dir.path(), 14, &args);
    checked(dir.path(), 14, &summary, 1000);
    let n = |f: &str| summary[f].as_u64().unwrap();
    assert!(n("stale_reads") + n("lost_writes") > 0, "{summary}");
    assert!(n("anomalies") > 0 && code != 0, "{summary}");
    // What a failed run prints: the evidence of its anomalies.
    let said = std::panic::catch_unwind(|| no_anomalies(dir.path(), 14, &summary))
        .expect_err("anomalies were found");
    let said = said.downcast_ref::<String>().expect("a message");
    for part in [
        "== timeline",
        "flush",
        "== anomalies",
        "== history of fk:",
        "== topology.json",
        "(last lines)",
    ] {
        assert!(said.contains(part), "lacks {part}: {said}");
    }
}

/// The run found no anomaly; if it did, the assertion prints what a reader needs to find
/// out why, since the run's directory goes with the test: the nemesis's timeline, the
/// anomalies, each anomalous key's history (the first four keys), the topology at the end
/// and the last lines of every node's log.
fn no_anomalies(dir: &Path, seed: u64, summary: &serde_json::Value) {
    if summary["anomalies"].as_u64() == Some(0) {
        return;
    }
    let run = dir.join(format!("seed-{seed}"));
    let read =
        |f: &str| std::fs::read_to_string(run.join(f)).unwrap_or_else(|e| format!("({f}: {e})"));
    let mut said = format!("{summary}\n\n== timeline (nemesis)\n");
    for l in read("timeline.txt")
        .lines()
        .filter(|l| !l.contains("ops in this second"))
    {
        said.push_str(l);
        said.push('\n');
    }
    let anomalies: serde_json::Value =
        serde_json::from_str(&read("anomalies.json")).unwrap_or_default();
    let listed = anomalies["anomalies"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    said.push_str("\n== anomalies\n");
    for a in &listed {
        said.push_str(&format!("{a}\n"));
    }
    let mut keys: Vec<&str> = listed.iter().filter_map(|a| a["key"].as_str()).collect();
    keys.dedup();
    let history = read("history.jsonl");
    for key in keys.iter().take(4) {
        said.push_str(&format!("\n== history of {key}\n"));
        let quoted = format!("\"key\":\"{key}\"");
        for l in history.lines().filter(|l| l.contains(&quoted)).take(200) {
            said.push_str(l);
            said.push('\n');
        }
    }
    said.push_str(&format!("\n== topology.json\n{}\n", read("topology.json")));
    let mut logs: Vec<_> = std::fs::read_dir(run.join("nodes"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    logs.sort();
    for log in logs {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        said.push_str(&format!("\n== {} (last lines)\n", log.display()));
        for l in &lines[lines.len().saturating_sub(12)..] {
            said.push_str(l);
            said.push('\n');
        }
    }
    panic!("anomalies found:\n{said}");
}

/// The kills a run's timeline records as made and restarted (`kill -9, restarted after`).
fn kills_restarted(dir: &Path, seed: u64) -> usize {
    let timeline =
        std::fs::read_to_string(dir.join(format!("seed-{seed}")).join("timeline.txt")).unwrap();
    timeline
        .lines()
        .filter(|l| l.contains("kill -9, restarted after") && !l.contains("etcd"))
        .count()
}

/// Every node of the run kept its keys in a data directory of its own under
/// `--durability sync`, and a restarted node opened the one it had before: its second log
/// names the first log's directory.
fn durable_nodes_restarted_over_their_data(dir: &Path, seed: u64) {
    let run = dir.join(format!("seed-{seed}"));
    let logs = run.join("nodes");
    let data_of = |log: &Path| {
        let text = std::fs::read_to_string(log).unwrap();
        let line = text.lines().find(|l| l.contains("listening on")).unwrap();
        assert!(line.contains("durability sync"), "{line}");
        let at = line.find(", data ").unwrap() + ", data ".len();
        line[at..].split(" durability").next().unwrap().to_string()
    };
    let mut restarted = 0;
    for e in std::fs::read_dir(&logs).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let Some(node) = name.strip_suffix(".2.log") else {
            continue;
        };
        let first = data_of(&logs.join(format!("{node}.1.log")));
        assert!(
            first.starts_with(&run.join("data").display().to_string()),
            "{first}"
        );
        assert_eq!(data_of(&path), first, "{name}");
        restarted += 1;
    }
    assert!(restarted >= 1, "no node was restarted");
}

/// Durable nodes with one copy of every key, topology in a file: nodes killed with
/// `kill -9` (and paused). A killed node is restarted over its data directory and serves
/// every acknowledged write from its disk — with a cache of 64 entries most of them were
/// on disk only — so nothing acknowledged may be lost or read stale.
#[test]
fn durable_nodes_one_copy_with_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--duration", "12", "--durable", "--faults", "kill,pause"];
    let (summary, _) = run(dir.path(), DURABLE_ONE_COPY_SEED, &args);
    checked(dir.path(), DURABLE_ONE_COPY_SEED, &summary, 500);
    assert!(
        kills_restarted(dir.path(), DURABLE_ONE_COPY_SEED) >= 1,
        "{summary}"
    );
    durable_nodes_restarted_over_their_data(dir.path(), DURABLE_ONE_COPY_SEED);
    no_anomalies(dir.path(), DURABLE_ONE_COPY_SEED, &summary);
    assert_eq!(summary["unverified_keys"].as_u64(), Some(0), "{summary}");
}

/// Its seed: three kills of three nodes (at 1.2, 5.4 and 6.5 s), each restarted.
const DURABLE_ONE_COPY_SEED: u64 = 34;

/// Durable nodes with two copies: a killed node drops its disk and re-copies its keys from
/// their holders; nodes killed, paused, added and removed.
#[test]
fn durable_nodes_two_copies_with_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--duration",
        "12",
        "--durable",
        "--replicas",
        "2",
        "--faults",
        "kill,pause,add,remove",
    ];
    let (summary, _) = run(dir.path(), DURABLE_TWO_COPIES_SEED, &args);
    checked(dir.path(), DURABLE_TWO_COPIES_SEED, &summary, 500);
    assert!(
        kills_restarted(dir.path(), DURABLE_TWO_COPIES_SEED) >= 1,
        "{summary}"
    );
    no_anomalies(dir.path(), DURABLE_TWO_COPIES_SEED, &summary);
}

/// Its seed: three kills (at 1.2, 7.6 and 9.5 s), two adds and two removals.
const DURABLE_TWO_COPIES_SEED: u64 = 34;

/// Without `ip` on PATH a `--netns` run cannot have its namespaces: it says so (or that it
/// needs root, when not root) and exits 2, having started nothing.
#[test]
fn a_netns_run_without_what_namespaces_need_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(KVLAB)
        .args(["faults", "run", "--netns", "--duration", "5", "--out"])
        .arg(dir.path())
        .env("PATH", dir.path())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("--netns: no `ip` on PATH")
            || said.contains("--netns: network namespaces need root"),
        "{said}"
    );
    assert!(!dir.path().join("seed-1").exists(), "a run began");
}

/// The network a run made, by the name its timeline gives (`kvfN-H on 10.77.X.0/24`).
fn network_of(timeline: &str) -> String {
    let line = timeline.lines().find(|l| l.contains(" netns ")).unwrap();
    let at = line.find("(kvf").unwrap() + 1;
    line[at..].split('-').next().unwrap().to_string()
}

/// Nodes and etcd in namespaces of their own: nodes cut off from everything, from a node or
/// from etcd, and delayed, each healed after a while; two copies, so a cut-off node's keys
/// are still served. The run is checked like the others, every partition was made and
/// healed, and nothing of its network is left. 16 s: seed 21 delays a node twice (up to
/// 7 s with its clearing) before its first partition, which a busy machine pushed past 12 s.
#[test]
fn partitions_and_delays_in_network_namespaces() {
    if let Err(why) = kvlab_faults::netns::preflight() {
        eprintln!("SKIPPED: no network namespaces here: {why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--netns",
        "--duration",
        "16",
        "--replicas",
        "2",
        "--topology",
        "etcd",
        "--faults",
        "partition,delay",
    ];
    let (summary, _) = run(dir.path(), 21, &args);
    checked(dir.path(), 21, &summary, 500);
    let timeline =
        std::fs::read_to_string(dir.path().join("seed-21").join("timeline.txt")).unwrap();
    let made = |what: &str| {
        timeline
            .lines()
            .filter(|l| l.contains(&format!(" {what} 10.77.")) && !l.contains("FAILED"))
            .count()
    };
    assert!(made("partition") >= 1, "{timeline}");
    assert!(timeline.contains("healed after"), "{timeline}");
    let net = network_of(&timeline);
    let namespaces = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let namespaces = String::from_utf8_lossy(&namespaces.stdout);
    assert!(
        !namespaces.contains(&format!("{net}-")),
        "namespaces left: {namespaces}"
    );
    let links = Command::new("ip").args(["-o", "link"]).output().unwrap();
    let links = String::from_utf8_lossy(&links.stdout);
    assert!(!links.contains(&format!("{net}-")), "links left: {links}");
}

/// The checker may not shrug: a key written (acknowledged) whose final read did not answer
/// could have lost its write unseen, so `kvlab faults check` fails with exit status 2 and
/// says how many keys it could not verify; the same history with the read answered passes.
#[test]
fn a_key_never_read_back_fails_the_check() {
    let dir = tempfile::tempdir().unwrap();
    let op = |key: &str, kind: &str, value: &str, at: u64, outcome: &str, last: bool| {
        format!(
            r#"{{"type":"op","client":0,"key":"{key}","kind":"{kind}","value":{value},"invoke_ns":{at},"complete_ns":{},"outcome":"{outcome}","final_read":{last}}}"#,
            at + 1000
        )
    };
    let check = |lines: &[String]| {
        let path = dir.path().join("history.jsonl");
        std::fs::write(&path, lines.join("\n")).unwrap();
        let out = Command::new(KVLAB)
            .args(["faults", "check"])
            .arg(&path)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let mut lines = vec![
        op("a", "write", "\"v1\"", 1_000, "ok", false),
        op("b", "write", "\"w1\"", 2_000, "ok", false),
        op("a", "read", "\"v1\"", 10_000, "ok", true),
        op("b", "read", "\"w1\"", 11_000, "ok", true),
    ];
    let (code, said) = check(&lines);
    assert_eq!(code, Some(0), "{said}");
    // b's final read failed: its write may be lost, and nothing in the history says.
    lines[3] = op("b", "read", "null", 11_000, "failed", true);
    let (code, said) = check(&lines);
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("could not verify 1 keys"), "{said}");
}
