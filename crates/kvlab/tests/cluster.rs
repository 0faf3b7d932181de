//! `kvlab cluster` with real nodes (`kvlab server --cluster`, each its own process) on the
//! embedded topology store: a node is added and another removed while `kvlab bench
//! --cluster --verify` loads the cluster and a checker writes and reads back versions of
//! its own keys. Nothing may be lost, no read may be stale, no error may reach a
//! cluster-aware client. And a migration left half-way is rolled back or resumed from the
//! topology alone.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use common::cluster::*;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvlab_client::ClusterClient;
use kvlab_cluster::coordinator::node_status;
use kvlab_cluster::{FileStore, Migration, Phase, Topology, TopologyStore};
use kvlab_etcd::open_store;
use kvlab_process::Etcd;
use kvlab_process::{free_ports, Probe, Process, Spawn};
use kvlab_testkit::Memcached;

/// Three nodes on a topology file in a fresh directory, the first two in the ring.
fn two_of_three() -> (tempfile::TempDir, Vec<String>, Vec<Process>) {
    let dir = tempfile::tempdir().unwrap();
    let topology = dir.path().join("topology.json").display().to_string();
    let ports = free_ports(3).unwrap();
    let names: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    cluster(&topology, &["create", &names[0], &names[1]]);
    let nodes = ports.iter().map(|&p| node(&topology, p)).collect();
    (dir, names, nodes)
}

#[test]
fn add_and_remove_under_verified_load_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let topology = dir.path().join("topology.json");
    add_and_remove(dir.path(), &topology.display().to_string());
}

/// The same with the topology in a real etcd (nodes watch it and hold leases).
#[test]
fn add_and_remove_with_the_topology_in_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(&dir.path().join("etcd")).expect("etcd starts (.ci/run installs it)");
    add_and_remove(dir.path(), &etcd.spec("loaded"));
}

/// Unmodified clients through `kvlab proxy --cluster`: the proxy follows the ring and the
/// redirects; the clients see no error, no stale or lost value.
#[test]
fn add_and_remove_behind_the_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let topology = dir.path().join("topology.json");
    add_and_remove_via(dir.path(), &topology.display().to_string(), true);
}

fn add_and_remove(dir: &Path, topology: &str) {
    add_and_remove_via(dir, topology, false);
}

fn add_and_remove_via(dir: &Path, topology: &str, proxied: bool) {
    let ports = free_ports(4).unwrap();
    let names: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let mut args = vec!["create"];
    args.extend(names[..3].iter().map(String::as_str));
    cluster(topology, &args);
    let _nodes: Vec<Process> = ports.iter().map(|&p| node(topology, p)).collect();

    let proxy = proxied.then(|| {
        let port = free_ports(1).unwrap()[0];
        Spawn::new(KVLAB)
            .args([
                "proxy",
                "-l",
                "127.0.0.1",
                "-t",
                "2",
                "--cluster",
                &names[1],
            ])
            .args(["-p".to_string(), port.to_string()])
            .ready(Probe::Version(SocketAddr::from(([127, 0, 0, 1], port))))
            .start()
            .unwrap()
    });
    let target = proxy.as_ref().map(|p| p.addr().unwrap());
    let GrowShrink { run, redirects } = grow_and_shrink_under_load(dir, topology, &names, target);
    let n = |f: &str| run["counters"][f].as_u64().unwrap();
    if let Some(addr) = target {
        // The proxy took up the new rings (one per epoch it saw).
        let stats = kvlab_process::stats(addr, None, Duration::from_secs(2)).unwrap();
        let reloads: u64 = stats
            .iter()
            .find(|(k, _)| k == "proxy_reloads")
            .map(|(_, v)| v.parse().unwrap())
            .unwrap();
        assert!(reloads >= 2, "the proxy followed {reloads} rings");
    }
    if !proxied {
        assert!(
            redirects + n("redirects") > 0,
            "no client was redirected: did the ring change under the load?"
        );
    }

    // The ring is the new one; the removed node hands everything over and empties.
    let t = open_store(topology).unwrap().load().unwrap().unwrap();
    let mut want = names[1..].to_vec();
    want.sort();
    let mut got = t.nodes.clone();
    got.sort();
    assert_eq!((got, t.migration), (want, None));
    until("the removed node to drop its items", || {
        items(&names[0]) == 0
    });
    assert!(items(&names[3]) > 1000, "the added node holds its share");
}

#[test]
fn a_migration_left_half_way_is_rolled_back_or_resumed_from_the_topology() {
    let (dir, names, _nodes) = two_of_three();
    let path = dir.path().join("topology.json");
    let topology = path.display().to_string();
    let topology = topology.as_str();
    let seed: SocketAddr = names[0].parse().unwrap();
    let mut c = ClusterClient::connect(&[seed], Duration::from_secs(2)).unwrap();
    for i in 0..3000 {
        assert!(c
            .set(format!("k{i}").as_bytes(), format!("v{i}").as_bytes())
            .unwrap());
    }

    // A coordinator that began adding the third node and died during the copy: the
    // topology says so, and the nodes copy.
    let store = FileStore::new(&path);
    let begin = |store: &FileStore| {
        let t = store.load().unwrap().unwrap();
        let mut next = t.next();
        next.migration = Some(Migration {
            id: next.epoch,
            to: names.clone(),
            phase: Phase::Copy,
            started_ms: 0,
        });
        assert!(store.swap(Some(t.epoch), &next).unwrap());
    };
    begin(&store);
    until("the copy to reach the new node", || items(&names[2]) > 500);
    // Abort: the old ring stays, the new node drops what it got, nothing is lost.
    cluster(topology, &["abort"]);
    until("the new node to drop the copy", || items(&names[2]) == 0);
    for i in 0..3000 {
        let v = c.get(format!("k{i}").as_bytes()).unwrap();
        assert_eq!(v.as_deref(), Some(format!("v{i}").as_bytes()), "k{i}");
    }

    // Again, and this time another coordinator resumes it to the end.
    begin(&store);
    let out = cluster(topology, &["resume"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("done"));
    let t = store.load().unwrap().unwrap();
    assert_eq!((t.nodes.len(), t.migration), (3, None));
    for i in 0..3000 {
        let v = c.get(format!("k{i}").as_bytes()).unwrap();
        assert_eq!(v.as_deref(), Some(format!("v{i}").as_bytes()), "k{i}");
    }
    assert!(items(&names[2]) > 500, "the third node serves its share");
    // A migration in its hand-off cannot be rolled back.
    let status = Command::new(KVLAB)
        .args(["cluster", "--topology", topology])
        .arg("abort")
        .output()
        .unwrap();
    assert!(!status.status.success(), "no migration to abort");
}

/// Begins migration `to` on a topology file as a coordinator would, and returns its id;
/// the test then drives it by hand (`enter_handoff`) and `resume` ends it.
fn begin_migration(store: &FileStore, to: &[String]) -> u64 {
    let t = store.load().unwrap().unwrap();
    let mut next = t.next();
    next.migration = Some(Migration {
        id: next.epoch,
        to: to.to_vec(),
        phase: Phase::Copy,
        started_ms: 0,
    });
    assert!(store.swap(Some(t.epoch), &next).unwrap());
    next.epoch
}

/// Waits until every node in `sources` shows `field` of migration `id` done, then (for the
/// snapshots) moves the migration to its hand-off.
fn await_progress(sources: &[String], id: u64, field: &str) {
    until(&format!("every source's {field}"), || {
        sources.iter().all(|n| {
            let p = &node_status(n).unwrap()["progress"];
            p["migration"].as_u64() == Some(id)
                && match field {
                    "snapshot_done" => p[field].as_bool() == Some(true),
                    _ => p[field].as_u64() == Some(id),
                }
        })
    });
}

fn enter_handoff(store: &FileStore) {
    let t = store.load().unwrap().unwrap();
    let mut next = t.next();
    next.migration.as_mut().unwrap().phase = Phase::Handoff;
    assert!(store.swap(Some(t.epoch), &next).unwrap());
}

fn port_of(name: &str) -> u16 {
    name.rsplit(':').next().unwrap().parse().unwrap()
}

/// A new owner killed (`kill -9`) and restarted empty after its sources copied to it: their
/// streams to it fail at the hand-off, when they say `drained`. The hand-off cannot go back,
/// so each source sends the restarted node all its keys again on a new stream, and `resume`
/// ends the migration with every key where the new ring puts it.
#[test]
fn a_new_owner_restarted_in_the_hand_off_is_sent_its_keys_again() {
    let mut m = NewOwnerRestarted::after_the_copy();
    assert!(m.copied > 500, "the new node got {} keys", m.copied);
    assert_eq!(items(&m.names[2]), 0, "restarted empty");
    enter_handoff(&m.store);
    let out = cluster(&m.topology, &["resume"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("done"));
    assert_eq!(
        items(&m.names[2]),
        m.copied,
        "the new owner has its keys again"
    );
    assert_every_key(&mut m.client, "v");
}

/// Three nodes, the first two in the ring holding 3000 keys (`k{i}` = `v{i}`), a migration
/// adding the third begun by hand and copied, and then the third killed and restarted
/// empty.
struct NewOwnerRestarted {
    _dir: tempfile::TempDir,
    names: Vec<String>,
    _nodes: Vec<Process>,
    topology: String,
    store: FileStore,
    client: ClusterClient,
    /// What the third node had been sent before it was killed.
    copied: u64,
}

impl NewOwnerRestarted {
    fn after_the_copy() -> NewOwnerRestarted {
        let (dir, names, mut nodes) = two_of_three();
        let path = dir.path().join("topology.json");
        let topology = path.display().to_string();
        let seed: SocketAddr = names[0].parse().unwrap();
        let mut client = ClusterClient::connect(&[seed], Duration::from_secs(2)).unwrap();
        set_every_key(&mut client, "v");
        let store = FileStore::new(&path);
        let id = begin_migration(&store, &names);
        await_progress(&names[..2], id, "snapshot_done");
        let copied = items(&names[2]);
        nodes[2].kill();
        nodes[2] = node(&topology, port_of(&names[2]));
        NewOwnerRestarted {
            _dir: dir,
            names,
            _nodes: nodes,
            topology,
            store,
            client,
            copied,
        }
    }
}

/// `n` nodes with two copies of every key on a topology file in a fresh directory, every
/// one of the 3000 keys set (`k{i}` = `v{i}`).
struct TwoCopies {
    _dir: tempfile::TempDir,
    topology: String,
    ports: Vec<u16>,
    names: Vec<String>,
    nodes: Vec<Process>,
    client: ClusterClient,
}

impl TwoCopies {
    fn on_file(n: usize) -> TwoCopies {
        let dir = tempfile::tempdir().unwrap();
        let topology = dir.path().join("topology.json").display().to_string();
        let ports = free_ports(n).unwrap();
        let names: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let mut args = vec!["create", "--replicas", "2"];
        args.extend(names.iter().map(String::as_str));
        cluster(&topology, &args);
        let nodes = ports.iter().map(|&p| node(&topology, p)).collect();
        let seed: SocketAddr = names[0].parse().unwrap();
        let mut client = ClusterClient::connect(&[seed], Duration::from_secs(2)).unwrap();
        set_every_key(&mut client, "v");
        TwoCopies {
            _dir: dir,
            topology,
            ports,
            names,
            nodes,
            client,
        }
    }

    /// Begins a migration of the ring `names` to `to` on the topology file and drives it
    /// through its copy to the end of its hand-off (the migration is still on): the store.
    fn hand_off(topology: &str, names: &[String], to: &[String]) -> FileStore {
        let store = FileStore::new(topology);
        let id = begin_migration(&store, to);
        await_progress(names, id, "snapshot_done");
        enter_handoff(&store);
        await_progress(names, id, "handed_off");
        store
    }

    /// Ends the migration in its hand-off by hand: the ring becomes `nodes`, with no
    /// migration; the topology written.
    fn end_with(store: &FileStore, nodes: &[String]) -> Topology {
        let t = store.load().unwrap().unwrap();
        let mut end = t.next();
        end.nodes = nodes.to_vec();
        end.migration = None;
        assert!(store.swap(Some(t.epoch), &end).unwrap());
        end
    }

    /// Kills the first node, restarts it empty, waits for its catch-up and reads every key
    /// back (through the second node).
    fn restart_first_empty(topology: &str, ports: &[u16], names: &[String], nodes: &mut [Process]) {
        nodes[0].kill();
        nodes[0] = node(topology, ports[0]);
        until("A to catch up", || {
            node_status(&names[0]).unwrap()["recovering"] == false
        });
        let mut c =
            ClusterClient::connect(&[names[1].parse().unwrap()], Duration::from_secs(2)).unwrap();
        assert_every_key(&mut c, "v");
    }
}

/// Sets `k{i}` to `{value}{i}` for the 3000 keys of these tests, each acknowledged.
fn set_every_key(c: &mut ClusterClient, value: &str) {
    for i in 0..3000 {
        assert!(c
            .set(format!("k{i}").as_bytes(), format!("{value}{i}").as_bytes())
            .unwrap());
    }
}

/// Every one of the 3000 keys reads `{value}{i}`.
fn assert_every_key(c: &mut ClusterClient, value: &str) {
    for i in 0..3000 {
        let v = c.get(format!("k{i}").as_bytes()).unwrap();
        assert_eq!(v.as_deref(), Some(format!("{value}{i}").as_bytes()), "k{i}");
    }
}

/// The same, but the sources find the stream broken while still copying (writes to the
/// leaving keys are streamed to the restarted node): their copiers stop with an error. The
/// migration then goes on to its hand-off anyway (here by hand; a coordinator does when it
/// saw every snapshot done first) and cannot go back: each source copies again, and `resume`
/// ends it with the newest values on the new owner.
#[test]
fn a_copier_that_failed_just_before_the_hand_off_copies_again_in_it() {
    let mut m = NewOwnerRestarted::after_the_copy();
    set_every_key(&mut m.client, "w");
    until("a source's copier to fail", || {
        m.names[..2]
            .iter()
            .any(|n| node_status(n).unwrap()["progress"]["error"].is_string())
    });
    enter_handoff(&m.store);
    let out = cluster(&m.topology, &["resume"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("done"));
    assert_every_key(&mut m.client, "w");
}

/// Two copies of every key; a node is removed, so some keys get a holder that did not hold
/// them before — one that may still keep an older item of such a key from an earlier ring
/// (a stray its clean-up had not removed yet: a faults run saw one taken for the key's copy,
/// and the key's owner, restarted empty, catch up from it). The migration sends such a
/// holder the key as it is now: by the end of the hand-off, before any clean-up, every new
/// holder has the current value, and an owner restarted after it finds every key.
#[test]
fn a_new_holder_of_a_keys_copies_gets_the_key_over_an_older_item() {
    use std::io::Write;
    let TwoCopies {
        _dir,
        topology,
        ports,
        names,
        mut nodes,
        ..
    } = TwoCopies::on_file(4);
    let t = FileStore::new(&topology).load().unwrap().unwrap();
    let before = t.serving();
    let after = kvlab_ring::Ring::new(t.epoch + 1, t.vnodes, &names[..3]);
    let holders = |ring: &kvlab_ring::Ring, key: &str| -> Vec<String> {
        let mut owners = Vec::new();
        ring.owners_of_hash(kvlab_ring::key_hash(key.as_bytes()), 2, &mut owners);
        owners.iter().map(|&i| ring.nodes()[i].clone()).collect()
    };
    // An older item of each key at every node that holds its copies only after the removal,
    // written there as a stray would be (a copy stream's `set`, which a node that does not
    // own the key takes).
    let mut planted: Vec<(usize, String)> = Vec::new();
    let mut streams: Vec<TcpStream> = names.iter().map(|n| connect_to(n)).collect();
    for s in &mut streams {
        s.write_all(b"cluster import 0 127.0.0.1:1\r\n").unwrap();
        assert_eq!(reply_line(s), "OK\r\n");
    }
    for i in 0..3000 {
        let key = format!("k{i}");
        let now = holders(&before, &key);
        for (rank, h) in holders(&after, &key).into_iter().enumerate() {
            if rank > 0 && !now.contains(&h) {
                let n = names.iter().position(|x| *x == h).unwrap();
                let old = format!("old{i}");
                let s = &mut streams[n];
                write!(s, "set {key} 0 0 {}\r\n{old}\r\n", old.len()).unwrap();
                assert_eq!(reply_line(s), "STORED\r\n", "{key} at {h}");
                planted.push((n, key.clone()));
            }
        }
    }
    assert!(planted.len() > 100, "{} keys gain a holder", planted.len());
    TwoCopies::hand_off(&topology, &names, &names[..3]);
    let mut stale = Vec::new();
    for (n, key) in &planted {
        let value = get_line(&mut streams[*n], key).unwrap_or_else(|line| line);
        let value = value.trim_end();
        let i = &key[1..];
        if value != format!("v{i}") {
            stale.push(format!("{key} at {}: {value}", names[*n]));
        }
    }
    assert!(
        stale.is_empty(),
        "{} of {} new holders kept an older item: {:?}",
        stale.len(),
        planted.len(),
        &stale[..stale.len().min(5)]
    );
    let out = cluster(&topology, &["resume"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("done"));
    TwoCopies::restart_first_empty(&topology, &ports, &names, &mut nodes);
}

/// Two copies of every key; a node is removed, and one of the nodes that keep its keys is
/// killed and restarted empty at the end of the hand-off, before it copied the keys it
/// took from the leaving node to their other holder. The leaving node then holds the only
/// other copy of those: `remove` (here `resume`) returns only once it has handed them
/// over, the restarted node asks it for them before it serves, and the leaving node can be
/// stopped as soon as `remove` returns.
#[test]
fn a_node_restarted_empty_as_another_leaves_gets_the_leavers_items() {
    let TwoCopies {
        _dir,
        topology,
        ports,
        names,
        mut nodes,
        client: mut c,
        ..
    } = TwoCopies::on_file(3);
    TwoCopies::hand_off(&topology, &names, &names[..2]);
    nodes[1].kill();
    nodes[1] = node(&topology, ports[1]);
    let out = cluster(&topology, &["resume"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("done"));
    nodes[2].kill(); // the operator stops the node that left
    until("the restarted node to catch up", || {
        node_status(&names[1]).unwrap()["recovering"] == false
    });
    let mut lost = Vec::new();
    for i in 0..3000 {
        let v = c.get(format!("k{i}").as_bytes()).unwrap();
        if v.as_deref() != Some(format!("v{i}").as_bytes()) {
            lost.push(i);
        }
    }
    assert!(
        lost.is_empty(),
        "{} of 3000 keys lost, e.g. k{}",
        lost.len(),
        lost.first().copied().unwrap_or(0)
    );
}

/// A holder paused as the ring changes: four nodes with two copies, the fourth removed
/// (driven by hand on the topology file). Keys owned by A whose copy was on the leaver
/// now have C as their holder (A sent them to C down its copy link during the copy), and
/// C is paused when the ring changes, so the copies A's clean-up sends again fail. The
/// leaver is stopped before C answers (its hand-over to C cannot finish), and C is
/// continued: A must have C confirm those copies before it reports its clean-up done. Then
/// A is killed and restarts empty: it catches up from B and C, and every key reads back.
#[test]
fn a_holder_paused_as_the_ring_changes_gets_its_copies_once_it_answers() {
    let TwoCopies {
        _dir,
        topology,
        ports,
        names,
        mut nodes,
        ..
    } = TwoCopies::on_file(4);
    let store = TwoCopies::hand_off(&topology, &names, &names[..3]);
    signal(&nodes[2], libc::SIGSTOP);
    let end = TwoCopies::end_with(&store, &names[..3]);
    // A's copies to C time out (1 s); then the leaver is stopped for good.
    until("A's copy to the paused holder to fail", || {
        node_status(&names[0]).unwrap()["progress"]["replica_errors"]
            .as_u64()
            .unwrap_or(0)
            > 0
    });
    signal(&nodes[3], libc::SIGTERM);
    until("the leaver to exit", || nodes[3].exited());
    signal(&nodes[2], libc::SIGCONT);
    until("A's clean-up to end", || {
        node_status(&names[0]).unwrap()["progress"]["handover_epoch"].as_u64() >= Some(end.epoch)
    });
    TwoCopies::restart_first_empty(&topology, &ports, &names, &mut nodes);
}

/// The leaver stopped at once, the new owner dead before its re-copy (the soak's seed 3004):
/// four nodes with two copies, the fourth (D) removed by hand on the topology file. Keys D
/// owned with their copy on A are A's now, with their second copy due on another node, X
/// (D's migration stream gave it to X during the copy; A's clean-up re-copies them, D's
/// hand-over sends them again). A is paused as the ring changes, so it cannot; D is
/// stopped (SIGTERM) as soon as it sees the new ring — as the harness stops a leaver when
/// it killed the `cluster remove` that waited for its hand-over — and must finish handing
/// over to X before it exits. Then A is killed and restarts empty: it catches up from B
/// and C, and every key reads back.
#[test]
fn a_leaver_stopped_as_it_leaves_hands_over_before_it_exits() {
    let TwoCopies {
        _dir,
        topology,
        ports,
        names,
        mut nodes,
        ..
    } = TwoCopies::on_file(4);
    let store = TwoCopies::hand_off(&topology, &names, &names[..3]);
    signal(&nodes[0], libc::SIGSTOP);
    let end = TwoCopies::end_with(&store, &names[..3]);
    until("the leaver to see the new ring", || {
        node_status(&names[3]).unwrap()["epoch"].as_u64() == Some(end.epoch)
    });
    signal(&nodes[3], libc::SIGTERM);
    until("the leaver to exit", || nodes[3].exited());
    TwoCopies::restart_first_empty(&topology, &ports, &names, &mut nodes);
}

/// Three nodes with two copies of every key, topology in etcd: one node is killed with
/// `kill -9` while a writer-reader runs. Its lease lapses, a live node takes it out of the
/// ring, its keys are served from their copies: no acknowledged write is lost, no read is
/// stale.
#[test]
fn kill_9_with_two_copies_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(&dir.path().join("etcd")).expect("etcd starts (.ci/run installs it)");
    let topology = etcd.spec("copies");
    let topology = topology.as_str();
    let ports = free_ports(3).unwrap();
    let names: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let mut args = vec!["create", "--replicas", "2"];
    args.extend(names.iter().map(String::as_str));
    cluster(topology, &args);
    let mut nodes: Vec<Process> = ports.iter().map(|&p| node(topology, p)).collect();
    let seed: SocketAddr = names[1].parse().unwrap();

    // Keys whose owner is the node to be killed are the interesting ones: seed many.
    let mut c = ClusterClient::connect(&[seed], Duration::from_secs(2)).unwrap();
    for i in 0..2000 {
        assert!(c
            .set(format!("pre:{i}").as_bytes(), format!("p{i}").as_bytes())
            .unwrap());
    }
    let stop = Arc::new(AtomicBool::new(false));
    let check = std::thread::spawn({
        let stop = stop.clone();
        move || checker(seed, None, stop)
    });
    let base = served(&names);
    until("the checker to write and read", || {
        served(&names) >= base + 500
    });
    nodes[0].kill(); // SIGKILL
    let store = open_store(topology).unwrap();
    until("the dead node to leave the ring", || {
        store.load().unwrap().unwrap().nodes.len() == 2
    });
    // The checker goes on against the healed ring before it stops.
    let live = &names[1..];
    let base = served(live);
    until("the checker to run on the healed ring", || {
        served(live) >= base + 500
    });
    stop.store(true, Ordering::Relaxed);
    let (writes, stale, errors, _) = check.join().unwrap();
    assert!(writes > 100, "the checker wrote {writes}");
    assert!(
        stale.is_empty(),
        "stale or lost: {:?}",
        &stale[..stale.len().min(5)]
    );
    // Requests in flight to the killed node may fail; none that was acknowledged is lost.
    eprintln!(
        "{} errors while the node died: {:?}",
        errors.len(),
        errors.first()
    );
    let mut lost = Vec::new();
    for i in 0..2000 {
        let v = c.get(format!("pre:{i}").as_bytes()).unwrap();
        if v.as_deref() != Some(format!("p{i}").as_bytes()) {
            lost.push(i);
        }
    }
    assert!(
        lost.is_empty(),
        "{} of 2000 keys lost, e.g. pre:{}",
        lost.len(),
        lost[0]
    );
}

/// A new node that dies (`kill -9`) while a migration to it copies: the migration is rolled
/// back, never half-applied — the old ring serves every key as it was.
#[test]
fn a_node_that_dies_during_the_copy_rolls_the_migration_back() {
    let (dir, names, mut nodes) = two_of_three();
    let path = dir.path().join("topology.json");
    let topology = path.display().to_string();
    let topology = topology.as_str();
    let keys = "100000";
    let bench = |args: &[&str]| bench_cluster(&names[0], keys, 4, args);
    bench(&["--load", "--requests", "1"]);
    // The coordinator runs in the background; the new node dies once its copy is arriving.
    let add = std::thread::spawn({
        let (topology, node) = (topology.to_string(), names[2].clone());
        move || {
            Command::new(KVLAB)
                .args(["cluster", "--topology", &topology, "add", &node])
                .output()
                .unwrap()
        }
    });
    until("the copy to start", || {
        add.is_finished() || items(&names[2]) > 0
    });
    nodes[2].kill();
    let out = add.join().unwrap();
    let t = FileStore::new(&path).load().unwrap().unwrap();
    assert!(
        !out.status.success(),
        "the migration finished before the kill (the copy outran the test): {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("rolled back"), "{said}");
    assert_eq!(
        (t.nodes.len(), t.migration),
        (2, None),
        "the old ring, no migration"
    );
    // Every key, once each, verified: none missing, none wrong.
    let report = bench(&[
        "--verify",
        "--mix",
        "get=1",
        "--key-dist",
        "sequential",
        "--requests",
        keys,
    ]);
    assert!(
        report.contains("misses 0)") && report.contains("errors 0 (verification 0)"),
        "{report}"
    );
}

/// Three nodes with two copies of every key, eight writers at once through `kvlab bench
/// --cluster`: each node both sends copies of its own writes and takes its peers' copies,
/// and no node's write ever waits on a peer that waits on it. Every set is acknowledged,
/// and every key ends on two nodes.
#[test]
fn two_copies_with_concurrent_writers_never_stall() {
    concurrent_writers_leave_two_copies("all");
}

/// The same under write policy `owner`: each set is acknowledged once its owner applied it,
/// and its copy follows — every key still ends on two nodes.
#[test]
fn two_copies_under_write_policy_owner_follow_every_write() {
    concurrent_writers_leave_two_copies("owner");
}

fn concurrent_writers_leave_two_copies(policy: &str) {
    let dir = tempfile::tempdir().unwrap();
    let topology = dir.path().join("topology.json").display().to_string();
    let ports = free_ports(3).unwrap();
    let names: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let mut args = vec!["create", "--replicas", "2", "--write-policy", policy];
    args.extend(names.iter().map(String::as_str));
    cluster(&topology, &args);
    let _nodes: Vec<Process> = ports.iter().map(|&p| node(&topology, p)).collect();
    let keys = 2000;
    let json = dir.path().join("bench.json");
    let out = Command::new(KVLAB)
        .args(["bench", "--cluster", &names[0], "--keys", &keys.to_string()])
        .args([
            "--key-dist",
            "sequential",
            "--mix",
            "set=1",
            "-T",
            "1",
            "-c",
            "8",
        ])
        .args([
            "--requests",
            "4000",
            "--duration",
            "60",
            "--timeout-ms",
            "5000",
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bench: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let c = &report["runs"][0]["counters"];
    assert_eq!(c["errors"].as_u64(), Some(0), "errors: {c}");
    assert_eq!(c["timeouts"].as_u64(), Some(0), "timeouts: {c}");
    assert_eq!(c["sets"].as_u64(), Some(4000), "sets: {c}");
    // Under `owner` the last copies may still be on their way.
    until("every write's copy", || {
        names.iter().map(|n| items(n)).sum::<u64>() >= 2 * keys
    });
    let copies: u64 = names.iter().map(|n| items(n)).sum();
    assert_eq!(
        copies,
        2 * keys,
        "items on the nodes: two copies of each of {keys} keys"
    );
}

/// Two nodes with two copies of every key, one worker loop each (`-t 1`), and a
/// connection to the first with a key it owns stored (so its copy stream is open).
fn two_copies_on_one_loop() -> (tempfile::TempDir, Vec<Process>, TcpStream, String) {
    two_copies_on_one_loop_with("all", false)
}

/// [`two_copies_on_one_loop`] under write policy `policy`; `durable`: each node over a
/// data directory of its own with `--durability sync`.
fn two_copies_on_one_loop_with(
    policy: &str,
    durable: bool,
) -> (tempfile::TempDir, Vec<Process>, TcpStream, String) {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let topology = dir.path().join("topology.json").display().to_string();
    let ports = free_ports(2).unwrap();
    let names: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    cluster(
        &topology,
        &[
            "create",
            "--replicas",
            "2",
            "--write-policy",
            policy,
            &names[0],
            &names[1],
        ],
    );
    let nodes: Vec<Process> = ports
        .iter()
        .map(|&port| {
            Spawn::new(KVLAB)
                .args(["server", "-l", "127.0.0.1", "-t", "1", "-m", "64"])
                .args(["-p".to_string(), port.to_string()])
                .args(["--cluster".to_string(), topology.clone()])
                .args(["--cluster-node".to_string(), format!("127.0.0.1:{port}")])
                .args(if durable {
                    let data = dir.path().join(format!("node-{port}"));
                    vec![
                        "--data-dir".to_string(),
                        data.display().to_string(),
                        "--durability".to_string(),
                        "sync".to_string(),
                    ]
                } else {
                    Vec::new()
                })
                .ready(Probe::Version(SocketAddr::from(([127, 0, 0, 1], port))))
                .start()
                .unwrap()
        })
        .collect();
    // A key the first node owns (it stores it once its copy is confirmed), once the
    // nodes serve.
    let mut writer = connect_to(&names[0]);
    let mut key = None;
    until("a key stored by the first node", || {
        key = (0..200).map(|i| format!("k{i}")).find(|k| {
            writer
                .write_all(format!("set {k} 0 0 1\r\nx\r\n").as_bytes())
                .unwrap();
            reply_line(&mut writer) == "STORED\r\n"
        });
        key.is_some()
    });
    (dir, nodes, writer, key.unwrap())
}

fn connect_to(name: &str) -> TcpStream {
    let s = TcpStream::connect(name).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// One reply line (read byte by byte: nothing after it is consumed).
fn reply_line(s: &mut TcpStream) -> String {
    use std::io::Read;
    let mut buf = Vec::new();
    let mut b = [0u8; 1];
    while !buf.ends_with(b"\r\n") {
        assert_eq!(s.read(&mut b).unwrap(), 1, "connection closed");
        buf.push(b[0]);
    }
    String::from_utf8(buf).unwrap()
}

/// Sends `sig` to `p`; for `SIGSTOP`, returns once the process is stopped (the signal takes
/// effect asynchronously: a busy process may still answer a request meanwhile).
fn signal(p: &Process, sig: i32) {
    assert_eq!(unsafe { libc::kill(p.pid() as i32, sig) }, 0);
    if sig == libc::SIGSTOP {
        until("the process stopped", || {
            std::fs::read_to_string(format!("/proc/{}/stat", p.pid()))
                .ok()
                .and_then(|s| s.rsplit(") ").next().map(|r| r.starts_with('T')))
                .unwrap_or(false)
        });
    }
}

/// A write waiting for its copy holds back only its own reply: the other clients of the
/// same worker loop (`-t 1`) are answered meanwhile. The holder is paused (`SIGSTOP`), so
/// the copy is never confirmed and the write fails after the copy timeout; a `version` sent
/// on another connection after the write must be answered before it.
#[test]
fn a_write_waiting_for_its_copy_holds_up_no_other_client() {
    use std::io::Write;
    let (_dir, nodes, mut writer, key) = two_copies_on_one_loop();
    let owner = writer.peer_addr().unwrap().to_string();
    let sets = || -> u64 {
        let addr: SocketAddr = owner.parse().unwrap();
        kvlab_process::stats(addr, None, Duration::from_secs(5))
            .unwrap()
            .into_iter()
            .find(|(k, _)| k == "cmd_set")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap()
    };
    let before = sets();
    signal(&nodes[1], libc::SIGSTOP);
    writer
        .write_all(format!("set {key} 0 0 1\r\ny\r\n").as_bytes())
        .unwrap();
    // The write is read (and applied) in a round of its own before the other client speaks.
    until("the owner took the write", || sets() > before);
    let mut other = connect_to(&owner);
    other.write_all(b"version\r\n").unwrap();
    let answered = reply_line(&mut other);
    writer.set_nonblocking(true).unwrap();
    let mut peek = [0u8; 1];
    let write_done =
        !matches!(writer.peek(&mut peek), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    writer.set_nonblocking(false).unwrap();
    let failed = reply_line(&mut writer);
    signal(&nodes[1], libc::SIGCONT);
    assert!(answered.starts_with("VERSION"), "{answered:?}");
    assert!(
        !write_done,
        "the write's reply ({failed:?}) came before another client's version: the loop waited \
         for the copy"
    );
    assert!(
        failed.starts_with("SERVER_ERROR copy to"),
        "a write whose copy holder is paused: {failed:?}"
    );
}

/// A write whose copy failed is applied on its owner but not on the holder: no read may
/// return it until the holder has it too (were the owner to die, the holder would serve
/// the older value — a value seen and then undone). While the holder is paused a read
/// fails; once it answers again, a read copies the key to it and returns the value.
#[test]
fn a_value_whose_copy_failed_is_read_only_once_its_holder_has_it() {
    use std::io::Write;
    let (_dir, nodes, mut writer, key) = two_copies_on_one_loop();
    signal(&nodes[1], libc::SIGSTOP);
    writer
        .write_all(format!("set {key} 0 0 1\r\ny\r\n").as_bytes())
        .unwrap();
    let failed = reply_line(&mut writer);
    writer
        .write_all(format!("get {key}\r\n").as_bytes())
        .unwrap();
    let read = reply_line(&mut writer);
    signal(&nodes[1], libc::SIGCONT);
    assert!(failed.starts_with("SERVER_ERROR copy to"), "{failed:?}");
    assert!(
        read.starts_with("SERVER_ERROR copy to"),
        "a read of a value its holder lacks: {read:?}"
    );
    // The holder answers again (its back-off over): the read's copy reaches it.
    assert_eq!(read_once_held(&mut writer, &key), "y\r\n");
}

/// Under write policy `owner` a write is acknowledged once its owner applied it, even with
/// its copy holder paused; a read of it still waits for the holder's confirmation (it fails
/// while the holder is paused), and returns the value once the holder has it.
#[test]
fn under_write_policy_owner_a_write_is_acknowledged_before_its_copy() {
    owner_acknowledges_before_the_copy(false);
}

/// The same with durable nodes under `--durability sync`: the write is acknowledged once it
/// is on its owner's disk, not held until its copy holder confirms it.
#[test]
fn under_write_policy_owner_a_synced_write_is_acknowledged_before_its_copy() {
    owner_acknowledges_before_the_copy(true);
}

fn owner_acknowledges_before_the_copy(durable: bool) {
    use std::io::Write;
    let (_dir, nodes, mut writer, key) = two_copies_on_one_loop_with("owner", durable);
    signal(&nodes[1], libc::SIGSTOP);
    let t = Instant::now();
    writer
        .write_all(format!("set {key} 0 0 1\r\ny\r\n").as_bytes())
        .unwrap();
    let stored = reply_line(&mut writer);
    let acknowledged_in = t.elapsed();
    writer
        .write_all(format!("get {key}\r\n").as_bytes())
        .unwrap();
    let read = reply_line(&mut writer);
    signal(&nodes[1], libc::SIGCONT);
    assert_eq!(stored, "STORED\r\n", "a write whose copy holder is paused");
    assert!(
        acknowledged_in < kvlab_cluster::node::REPLICA_TIMEOUT,
        "acknowledged after {acknowledged_in:?}: it waited for its copy"
    );
    assert!(
        read.starts_with("SERVER_ERROR copy to"),
        "a read of a value its holder lacks: {read:?}"
    );
    assert_eq!(read_once_held(&mut writer, &key), "y\r\n");
}

/// Reads `key` on `writer` until the read succeeds (its copy holder has the value and
/// confirmed it): the value's data line.
fn read_once_held(writer: &mut TcpStream, key: &str) -> String {
    let mut value = String::new();
    until("a read of the value once its holder has it", || {
        match get_line(writer, key) {
            Ok(v) => value = v,
            Err(line) if line.starts_with("SERVER_ERROR") => return false,
            Err(line) => panic!("get {key}: {line}"),
        }
        true
    });
    value
}

/// `get KEY` on `s`: the value's line (with its `\r\n`), or the reply's first line when
/// it is no value.
fn get_line(s: &mut TcpStream, key: &str) -> Result<String, String> {
    use std::io::Write;
    s.write_all(format!("get {key}\r\n").as_bytes()).unwrap();
    let first = reply_line(s);
    if !first.starts_with("VALUE") {
        return Err(first);
    }
    let value = reply_line(s);
    assert_eq!(reply_line(s), "END\r\n");
    Ok(value)
}

/// `kvlab cluster ARGS`, expected to fail: its stderr.
fn cluster_fails(topology: &str, args: &[&str]) -> String {
    let out = Command::new(KVLAB)
        .args(["cluster", "--topology", topology])
        .args(args)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "kvlab cluster {args:?} succeeded: {}{said}",
        String::from_utf8_lossy(&out.stdout)
    );
    said
}

/// Whether process `pid` still runs (a zombie has exited).
fn running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command's closing parenthesis.
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .map(|(_, r)| r.trim_start().as_bytes().first()),
            Some(Some(b'Z' | b'X'))
        ),
        Err(_) => false,
    }
}

/// Whether anything accepts connections at 127.0.0.1:`port`.
fn listening(port: u16) -> bool {
    TcpStream::connect_timeout(
        &SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(1),
    )
    .is_ok()
}

/// Kills, when a test ends, the nodes a pids file written by `up` lists (so that a test
/// that fails leaves no node behind).
struct Reap(std::path::PathBuf);

impl Reap {
    fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(&self.0)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_whitespace().next()?.parse().ok())
            .collect()
    }
}

impl Drop for Reap {
    fn drop(&mut self) {
        for pid in self.pids() {
            if running(pid) {
                // SAFETY: kill(2) of a node this test's `up` started and still runs.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

/// `add` of a server that is no cluster node says what it is and why it cannot join; of a
/// node of another cluster, what it follows; of an address where nothing listens, that it
/// cannot be reached and why. None of them changes the topology.
#[test]
fn add_of_a_server_that_is_no_cluster_node_says_what_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let topology = dir.path().join("topology.json").display().to_string();
    let ports = free_ports(4).unwrap();
    cluster(&topology, &["create", &format!("127.0.0.1:{}", ports[0])]);

    let memcached = Memcached::start_with(&["-m", "64"]).unwrap();
    let name = memcached.addr.to_string();
    let said = cluster_fails(&topology, &["add", &name]);
    assert!(
        said.contains(&format!("{name} is not a kvlab cluster node")),
        "{said}"
    );
    assert!(said.contains("memcached 1."), "names what answers: {said}");
    assert!(
        said.contains("--cluster"),
        "says how to start a node: {said}"
    );
    assert!(!said.contains("Line(["), "{said}");

    let plain = Spawn::new(KVLAB)
        .args(["server", "-l", "127.0.0.1", "-t", "1", "-m", "64"])
        .args(["-p".to_string(), ports[1].to_string()])
        .ready(Probe::Version(SocketAddr::from(([127, 0, 0, 1], ports[1]))))
        .start()
        .unwrap();
    let name = plain.addr().unwrap().to_string();
    let said = cluster_fails(&topology, &["add", &name]);
    assert!(
        said.contains(&format!("{name} is not a kvlab cluster node"))
            && said.contains("kvlab")
            && said.contains("without --cluster"),
        "{said}"
    );

    // A node of another cluster (its own topology file): it would take keys that this
    // cluster's clients never look for there.
    let other = dir.path().join("other.json").display().to_string();
    let stranger = format!("127.0.0.1:{}", ports[3]);
    cluster(&other, &["create", &stranger]);
    let _stranger = node(&other, ports[3]);
    let said = cluster_fails(&topology, &["add", &stranger]);
    assert!(
        said.contains(&format!("{stranger} follows another topology"))
            && said.contains(&format!("[{stranger}]"))
            && said.contains("--cluster"),
        "{said}"
    );

    let nothing = format!("127.0.0.1:{}", ports[2]);
    let said = cluster_fails(&topology, &["add", &nothing]);
    assert!(
        said.contains(&format!("cannot reach {nothing}")) && said.contains("refused"),
        "{said}"
    );
    let t = FileStore::new(dir.path().join("topology.json"))
        .load()
        .unwrap()
        .unwrap();
    assert_eq!(
        (t.epoch, t.nodes.len()),
        (1, 1),
        "the topology is unchanged"
    );
}

/// `up` with one of its ports taken starts nothing, names the port, and leaves no
/// topology.
#[test]
fn up_with_a_port_taken_names_it_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("topology.json");
    let topology = path.display().to_string();
    let _reap = Reap(dir.path().join("pids"));
    let base = consecutive_free_ports(3);
    let _taken = TcpListener::bind(("127.0.0.1", base + 1)).unwrap();
    let begun = Instant::now();
    let said = cluster_fails(
        &topology,
        &["up", "--nodes", "3", "--base-port", &base.to_string()],
    );
    // Not a speed: `up` must see the port taken before it starts anything, rather than
    // wait out a node's start-up timeout (10 s).
    assert!(begun.elapsed() < Duration::from_secs(8), "{said}");
    assert!(
        said.contains(&format!("address 127.0.0.1:{} is in use", base + 1)),
        "{said}"
    );
    assert!(
        !listening(base) && !listening(base + 2),
        "a node was left running: {said}"
    );
    assert_eq!(FileStore::new(&path).load().unwrap(), None, "{said}");
}

/// `up` whose nodes exit at once (a flag `kvlab server` rejects) says why, stops what it
/// started and removes the topology it created.
#[test]
fn up_whose_nodes_fail_says_why_and_removes_the_topology() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("topology.json");
    let topology = path.display().to_string();
    let _reap = Reap(dir.path().join("pids"));
    let base = consecutive_free_ports(2);
    let said = cluster_fails(
        &topology,
        &[
            "up",
            "--nodes",
            "2",
            "--base-port",
            &base.to_string(),
            "--",
            "--no-such-flag",
        ],
    );
    assert!(
        said.contains(&format!("127.0.0.1:{base}")) && said.contains("--no-such-flag"),
        "names the node and quotes its log: {said}"
    );
    assert!(!listening(base) && !listening(base + 1), "{said}");
    assert_eq!(FileStore::new(&path).load().unwrap(), None, "{said}");
}

/// `down` of a cluster in etcd, run from another directory than `up`: it finds the nodes
/// from the topology and stops every one.
#[test]
fn down_of_an_etcd_cluster_from_another_directory_stops_its_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(&dir.path().join("etcd")).expect("etcd starts (.ci/run installs it)");
    let topology = etcd.spec("downed");
    let (here, there) = (dir.path().join("here"), dir.path().join("there"));
    std::fs::create_dir_all(&here).unwrap();
    std::fs::create_dir_all(&there).unwrap();
    let reap = Reap(here.join("kvlab-cluster/downed/pids"));
    let base = consecutive_free_ports(2);
    let run = |cwd: &Path, args: &[&str]| {
        let out = Command::new(KVLAB)
            .current_dir(cwd)
            .args(["cluster", "--topology", &topology])
            .args(args)
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "kvlab cluster {args:?}: {said}");
        said
    };
    run(
        &here,
        &[
            "up",
            "--nodes",
            "2",
            "--base-port",
            &base.to_string(),
            "--",
            "-t",
            "1",
            "-m",
            "64",
        ],
    );
    let pids = reap.pids();
    assert_eq!(pids.len(), 2);
    let said = run(&there, &["down"]);
    for pid in &pids {
        assert!(!running(*pid), "node pid {pid} still runs: {said}");
    }
    assert!(!listening(base) && !listening(base + 1), "{said}");
    assert_eq!(open_store(&topology).unwrap().load().unwrap(), None);
}

/// Restarting a durable member: `up -- --data-dir D` gives each node `D/node-PORT`. A node
/// killed with -9 and started by hand over `D` would come back empty and lose a third of
/// the keys: it refuses, naming the directory it should use; `kvlab cluster start ADDR`
/// restarts it with its own flags over its own directory, and every key reads back.
#[test]
fn a_killed_durable_member_is_started_again_over_its_own_directory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("topology.json");
    let topology = path.display().to_string();
    let data = dir.path().join("D");
    let _reap = Reap(dir.path().join("pids"));
    let base = consecutive_free_ports(3);
    let names: Vec<String> = (0..3).map(|i| format!("127.0.0.1:{}", base + i)).collect();
    cluster(
        &topology,
        &[
            "up",
            "--nodes",
            "3",
            "--base-port",
            &base.to_string(),
            "--",
            "-m",
            "64",
            "--data-dir",
            data.to_str().unwrap(),
            "--durability",
            "sync",
        ],
    );
    let keys = "3000";
    let bench = |args: &[&str]| bench_cluster(&names[0], keys, 2, args);
    bench(&["--load", "--requests", "1"]);
    let pid = node_status(&names[1]).unwrap()["pid"].as_u64().unwrap() as i32;
    // SAFETY: kill(2) of the node this test's `up` started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    until("the node to die", || !running(pid));
    // By hand over the cluster's directory: refused, with the node's own path.
    let port = (base + 1).to_string();
    let out = Command::new(KVLAB)
        .args(["server", "-l", "127.0.0.1", "-p", &port, "--data-dir"])
        .arg(&data)
        .args(["--cluster", &topology, "--cluster-node", &names[1]])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    let own = data.join(format!("node-{port}"));
    assert!(said.contains(&own.display().to_string()), "{said}");
    // Started again by the cluster: with its own directory, so nothing reads as a miss.
    let out = cluster(&topology, &["start", &names[1]]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("started again"),
        "{out:?}"
    );
    let said = cluster_fails(&topology, &["start", &names[1]]);
    assert!(said.contains("running already"), "{said}");
    let report = bench(&[
        "--mix",
        "get=1",
        "--key-dist",
        "sequential",
        "--requests",
        keys,
        "--verify",
    ]);
    assert!(
        report.contains("misses 0)") && report.contains("errors 0 (verification 0)"),
        "{report}"
    );
    cluster(&topology, &["down"]);
}

/// An operator's mistakes get messages that name the cause: a file that is not a topology
/// (and what one looks like), a member to remove or start that is not one (and the
/// members), a `down` with no cluster (the absolute path it looked at).
#[test]
fn an_operators_mistakes_name_their_cause() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{not json").unwrap();
    let said = cluster_fails(bad.to_str().unwrap(), &["status"]);
    assert!(
        said.contains("is not a kvlab cluster topology") && said.contains("\"nodes\""),
        "{said}"
    );
    let (dir2, names, _nodes) = two_of_three();
    let topology = dir2.path().join("topology.json").display().to_string();
    let said = cluster_fails(&topology, &["remove", &names[2]]);
    let members = format!(
        "not a member of the ring (members: {} {})",
        names[0], names[1]
    );
    assert!(said.contains(&members), "{said}");
    let said = cluster_fails(&topology, &["start", &names[2]]);
    assert!(said.contains(&members), "{said}");
    let elsewhere = tempfile::tempdir().unwrap();
    let out = Command::new(KVLAB)
        .args(["cluster", "down"])
        .current_dir(elsewhere.path())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    let looked = elsewhere.path().join("kvlab-cluster").join("topology.json");
    assert!(
        !out.status.success() && said.contains(&looked.display().to_string()),
        "{said}"
    );
}

/// `kvlab bench --cluster SEED --keys KEYS -T 1 -c CONNS ARGS`, which must succeed; its
/// report.
fn bench_cluster(seed: &str, keys: &str, conns: u32, args: &[&str]) -> String {
    let out = Command::new(KVLAB)
        .args(["bench", "--cluster", seed, "--keys", keys, "-T", "1"])
        .args(["-c", &conns.to_string()])
        .args(args)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    said
}
