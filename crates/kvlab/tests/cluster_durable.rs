//! Durable cluster nodes (`kvlab server --cluster … --data-dir DIR`): a node's memory is a
//! write-back cache over its disk, bounded small here (`--cache-items`) so that most keys
//! live on disk only. A durable cluster grows and shrinks under `kvlab bench --cluster
//! --verify` and the checker with nothing lost or stale, every key is read back afterwards,
//! and the removed node's disk no longer holds the keys it gave away; a node killed with
//! `kill -9` under `--durability sync` and restarted loses no acknowledged write, without
//! copies (from its own disk) and with two (a clean re-copy from the holders).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use common::cluster::*;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use kvlab_client::{Client, ClusterClient};
use kvlab_cluster::coordinator::node_status;
use kvlab_process::{free_ports, Probe, Process, Spawn};

/// Items each node's cache holds: a small share of its keys.
const CACHE_ITEMS: &str = "300";

/// A durable node's flags: its own data directory under `dir`.
fn durable(dir: &Path, port: u16, durability: &str) -> Vec<String> {
    let data = dir.join(format!("node-{port}"));
    [
        "--data-dir",
        &data.display().to_string(),
        "--durability",
        durability,
        "--cache-items",
        CACHE_ITEMS,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn cached(name: &str) -> u64 {
    items(name)
}

fn set_all(c: &mut ClusterClient, keys: std::ops::Range<usize>, value: impl Fn(usize) -> String) {
    for i in keys {
        let key = format!("cold:{i}");
        assert_eq!(
            c.set(key.as_bytes(), value(i).as_bytes())
                .map_err(|e| e.to_string()),
            Ok(true),
            "set {key}"
        );
    }
}

#[test]
fn a_durable_cluster_grows_and_shrinks_with_most_keys_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let topology = dir.path().join("topology.json").display().to_string();
    let ports = free_ports(4).unwrap();
    let names: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let mut args = vec!["create"];
    args.extend(names[..3].iter().map(String::as_str));
    cluster(&topology, &args);
    let mut nodes: Vec<Process> = ports
        .iter()
        .map(|&p| node_with(&topology, p, &durable(dir.path(), p, "interval")))
        .collect();
    let seed: SocketAddr = names[1].parse().unwrap();

    // Keys written before the load: most of them leave the caches for the disks.
    let cold = 6000;
    let mut c = ClusterClient::connect(&[seed], Duration::from_secs(5)).unwrap();
    set_all(&mut c, 0..cold, |i| format!("v{i}"));
    for n in &names[..3] {
        let cached = cached(n);
        assert!(cached <= 300, "{n} caches {cached} items");
    }

    grow_and_shrink_under_load(dir.path(), &topology, &names, None);

    // Every key written before the changes is read back from the cluster, cold or not.
    let mut lost = Vec::new();
    for i in 0..cold {
        let key = format!("cold:{i}");
        match c.get(key.as_bytes()) {
            Ok(Some(v)) if v == format!("v{i}").as_bytes() => {}
            other => lost.push(format!("{key}: {other:?}")),
        }
    }
    assert!(
        lost.is_empty(),
        "{} lost: {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    for n in &names[1..] {
        let cached = cached(n);
        assert!(cached <= 300, "{n} caches {cached} items");
    }

    // The removed node deleted what it gave away from its disk too: once its clean-up
    // ended, killed and started alone over its data directory, it holds none of it.
    until("the removed node's clean-up", || {
        let s = node_status(&names[0]).unwrap();
        s["progress"]["handover_epoch"].as_u64() >= s["epoch"].as_u64()
    });
    nodes[0].kill();
    let port = free_ports(1).unwrap()[0];
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let data = dir.path().join(format!("node-{}", ports[0]));
    let alone = Spawn::new(KVLAB)
        .args([
            "server",
            "-l",
            "127.0.0.1",
            "-t",
            "1",
            "-p",
            &port.to_string(),
        ])
        .arg("--data-dir")
        .arg(&data)
        .ready(Probe::Version(addr))
        .start()
        .unwrap();
    let mut plain = Client::connect(addr, Duration::from_secs(5)).unwrap();
    let kept: Vec<usize> = (0..cold)
        .filter(|i| plain.get(format!("cold:{i}").as_bytes()).unwrap().is_some())
        .collect();
    assert!(
        kept.is_empty(),
        "{} moved keys still on the removed node's disk",
        kept.len()
    );
    drop(alone);
}

/// `kill -9` of a durable node under `--durability sync`, and its restart: every
/// acknowledged write (sets, overwrites, deletes) is read back from the cluster — without
/// copies from the node's own disk, with two from the holders it re-copies from.
#[test]
fn kill_9_of_a_durable_node_loses_no_acknowledged_write() {
    for replicas in ["1", "2"] {
        let dir = tempfile::tempdir().unwrap();
        let topology = dir.path().join("topology.json").display().to_string();
        let ports = free_ports(3).unwrap();
        let names: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let mut args = vec!["create", "--replicas", replicas];
        args.extend(names.iter().map(String::as_str));
        cluster(&topology, &args);
        let start = |p: u16| node_with(&topology, p, &durable(dir.path(), p, "sync"));
        let mut nodes: Vec<Process> = ports.iter().map(|&p| start(p)).collect();
        let seed: SocketAddr = names[0].parse().unwrap();
        let mut c = ClusterClient::connect(&[seed], Duration::from_secs(5)).unwrap();
        let keys = 2000;
        set_all(&mut c, 0..keys, |i| format!("a{i}"));
        let want = |i: usize| -> Option<String> {
            if i.is_multiple_of(5) {
                None
            } else if i.is_multiple_of(3) {
                Some(format!("b{i}"))
            } else {
                Some(format!("a{i}"))
            }
        };
        for i in 0..keys {
            let key = format!("cold:{i}");
            let done = match want(i) {
                Some(v) if i.is_multiple_of(3) => c.set(key.as_bytes(), v.as_bytes()),
                Some(_) => Ok(true),
                None => c.delete(key.as_bytes()),
            };
            assert_eq!(
                done.map_err(|e| e.to_string()),
                Ok(true),
                "{replicas}: {key}"
            );
        }

        nodes[1].kill(); // kill -9, reaped
        nodes[1] = start(ports[1]);
        until("the restarted node to serve", || {
            node_status(&names[1]).is_ok_and(|s| s["recovering"] == false)
        });
        let mut c = ClusterClient::connect(&[seed], Duration::from_secs(5)).unwrap();
        let mut wrong = Vec::new();
        for i in 0..keys {
            let key = format!("cold:{i}");
            let got = c
                .get(key.as_bytes())
                .map(|v| v.map(|v| String::from_utf8_lossy(&v).into_owned()));
            match got {
                Ok(got) if got == want(i) => {}
                other => wrong.push(format!("{key}: {other:?}, want {:?}", want(i))),
            }
        }
        assert!(
            wrong.is_empty(),
            "replicas {replicas}: {} wrong after kill -9: {:?}",
            wrong.len(),
            &wrong[..wrong.len().min(5)]
        );
        let restarted = cached(&names[1]);
        assert!(restarted <= 300, "{restarted} cached");
    }
}
