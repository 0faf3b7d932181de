//! The topology in a real etcd (Debian's `etcd-server`, started here): compare-and-swap on
//! the epoch, a watch that wakes a waiting node, and node liveness by leases; with three
//! members, a store that opens while one is dead, and one that outlives the death of any
//! one of them (its calls, its watch and its lease carry on through the others).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvlab_cluster::{Migration, Phase, Topology, TopologyStore};
use kvlab_etcd::{EtcdStore, LEASE_TTL_S};
use kvlab_process::Etcd;
use kvlab_process::{free_ports, Output, Probe, Process, Spawn};

#[test]
fn etcd_keeps_the_topology_watches_it_and_leases_liveness() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(dir.path()).expect("etcd starts (.ci/run installs etcd-server)");
    let store = EtcdStore::open(&etcd.spec("t1")).unwrap();
    let other = EtcdStore::open(&etcd.spec("t1")).unwrap();
    assert_eq!(store.load().unwrap(), None);

    let t = Topology::new(16, vec!["a:1".into(), "b:2".into()]);
    assert!(!store.swap(Some(1), &t).unwrap(), "nothing stored yet");
    assert!(store.swap(None, &t).unwrap());
    assert!(!other.swap(None, &t).unwrap(), "created once");
    assert_eq!(other.load().unwrap(), Some(t.clone()));

    // Two coordinators race from the same epoch: exactly one wins.
    let mut a = t.next();
    a.migration = Some(Migration {
        id: a.epoch,
        to: vec!["a:1".into(), "b:2".into(), "c:3".into()],
        phase: Phase::Copy,
        started_ms: 0,
    });
    let mut b = t.next();
    b.nodes = vec!["a:1".into()];
    let wins = [
        store.swap(Some(1), &a).unwrap(),
        other.swap(Some(1), &b).unwrap(),
    ];
    assert_eq!(wins, [true, false]);
    assert_eq!(other.load().unwrap(), Some(a.clone()));

    // A waiting node wakes on a change, well before its timeout.
    store.wait(Duration::from_millis(10)); // sets the watch up
    let waiter = std::thread::spawn(move || {
        let t0 = Instant::now();
        store.wait(Duration::from_secs(20));
        (t0.elapsed(), store)
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(other.swap(Some(2), &a.next()).unwrap());
    let (waited, store) = waiter.join().unwrap();
    assert!(
        waited < Duration::from_secs(10),
        "the watch did not fire ({waited:?})"
    );

    // Liveness: a node's key lives while it beats and goes after the lease's TTL.
    store.heartbeat("a:1").unwrap();
    other.heartbeat("b:2").unwrap();
    assert_eq!(
        store.alive().unwrap(),
        Some(vec!["a:1".to_string(), "b:2".to_string()])
    );
    let deadline = Instant::now() + Duration::from_secs(LEASE_TTL_S as u64 * 4);
    loop {
        store.heartbeat("a:1").unwrap(); // a keeps beating, b has stopped
        if store.alive().unwrap() == Some(vec!["a:1".to_string()]) {
            break;
        }
        assert!(Instant::now() < deadline, "b's lease did not expire");
        std::thread::sleep(Duration::from_millis(500));
    }
    store.clear().unwrap();
    assert_eq!(other.load().unwrap(), None);
}

/// An etcd of three members on 127.0.0.1, each restartable on its ports and data.
struct Three {
    dir: PathBuf,
    members: Vec<(SocketAddr, Vec<String>, Option<Process>)>,
}

impl Three {
    fn start(dir: &Path) -> Three {
        let ports = free_ports(6).unwrap();
        let peer = |i: usize| format!("http://127.0.0.1:{}", ports[2 * i + 1]);
        let cluster: Vec<String> = (0..3).map(|i| format!("m{i}={}", peer(i))).collect();
        let mut three = Three {
            dir: dir.to_path_buf(),
            members: Vec::new(),
        };
        for i in 0..3 {
            let client = SocketAddr::from(([127, 0, 0, 1], ports[2 * i]));
            let args = [
                "--name",
                &format!("m{i}"),
                "--data-dir",
                &dir.join(format!("m{i}")).display().to_string(),
                "--listen-client-urls",
                &format!("http://{client}"),
                "--advertise-client-urls",
                &format!("http://{client}"),
                "--listen-peer-urls",
                &peer(i),
                "--initial-advertise-peer-urls",
                &peer(i),
                "--initial-cluster",
                &cluster.join(","),
                "--initial-cluster-token",
                "kvlab-test",
                "--log-level",
                "warn",
            ]
            .map(String::from)
            .to_vec();
            three.members.push((client, args, None));
        }
        // Together: one member alone has no quorum and never becomes healthy.
        for i in 0..3 {
            three.spawn(i);
        }
        for i in 0..3 {
            three.ready(i);
        }
        three
    }

    fn spawn(&mut self, i: usize) {
        let (_, args, process) = &mut self.members[i];
        let p = Spawn::new(Etcd::program())
            .args(args.iter())
            .output(Output::File(self.dir.join(format!("m{i}.log"))))
            .start()
            .expect("etcd starts (.ci/run installs etcd-server)");
        *process = Some(p);
    }

    fn ready(&self, i: usize) {
        let probe = Probe::HttpGetPath(self.members[i].0, "/health");
        kvlab_process::wait_ready(&probe, Duration::from_secs(15)).unwrap();
    }

    /// `kill -9` member `i`.
    fn kill(&mut self, i: usize) {
        self.members[i].2.take().unwrap().kill();
    }

    /// Starts member `i` again on its ports and data; returns once it is healthy.
    fn restart(&mut self, i: usize) {
        self.spawn(i);
        self.ready(i);
    }

    /// The topology spec naming all three members, member 0 first.
    fn spec(&self, name: &str) -> String {
        let hosts: Vec<String> = self.members.iter().map(|m| m.0.to_string()).collect();
        format!("etcd://{}/{name}", hosts.join(","))
    }
}

/// A node started while the first member of three is dead opens its store and works: every
/// call goes to a live member.
#[test]
fn a_store_opens_and_works_while_one_member_of_three_is_dead() {
    let dir = tempfile::tempdir().unwrap();
    let mut etcd = Three::start(dir.path());
    etcd.kill(0);
    let store = EtcdStore::open(&etcd.spec("dead0")).unwrap();
    let t = Topology::new(16, vec!["a:1".into(), "b:2".into()]);
    assert!(store.swap(None, &t).unwrap());
    for i in 0..20 {
        assert_eq!(store.load().unwrap(), Some(t.clone()), "load {i}");
    }
    store.heartbeat("a:1").unwrap();
    store.heartbeat("a:1").unwrap();
    assert_eq!(store.alive().unwrap(), Some(vec!["a:1".to_string()]));
    assert!(store.swap(Some(1), &t.next()).unwrap());
}

/// Calls `wait` (short) until one passes without an event: the store's watch is set up
/// and quiet. At most 40 tries.
fn quiet(store: &EtcdStore) {
    for _ in 0..40 {
        let t0 = Instant::now();
        store.wait(Duration::from_millis(200));
        if t0.elapsed() >= Duration::from_millis(150) {
            return;
        }
    }
    panic!("the watch never settled");
}

/// A running node's store outlives the death of whichever member it talks to: each member
/// is killed in turn (and brought back before the next); meanwhile every heartbeat
/// succeeds, the node's liveness key never lapses, and its watch still wakes it on a change.
#[test]
fn a_running_store_outlives_the_death_of_any_one_member_of_three() {
    let dir = tempfile::tempdir().unwrap();
    let mut etcd = Three::start(dir.path());
    let store = Arc::new(EtcdStore::open(&etcd.spec("survive")).unwrap());
    let other = EtcdStore::open(&etcd.spec("survive")).unwrap();
    let mut t = Topology::new(16, vec!["a:1".into(), "b:2".into()]);
    assert!(store.swap(None, &t).unwrap());
    store.heartbeat("a:1").unwrap();
    quiet(&store);
    for dead in 0..3 {
        etcd.kill(dead);
        // Two lease TTLs of heartbeats at a node's pace: each succeeds, the key stays.
        let until = Instant::now() + Duration::from_secs(2 * LEASE_TTL_S as u64);
        while Instant::now() < until {
            if let Err(e) = store.heartbeat("a:1") {
                panic!("member {dead} dead: heartbeat: {e}");
            }
            let alive = other.alive().unwrap();
            assert_eq!(alive, Some(vec!["a:1".to_string()]), "member {dead} dead");
            std::thread::sleep(Duration::from_millis(500));
        }
        // The watch is set up again on a live member and wakes a waiting node.
        quiet(&store);
        // As a node waits: woken, it reads the topology, and waits again until it changed
        // (a wake-up with nothing new — the watch set up again late — is allowed).
        let epoch = t.epoch;
        let waiter = std::thread::spawn({
            let store = Arc::clone(&store);
            move || {
                let t0 = Instant::now();
                let deadline = t0 + Duration::from_secs(20);
                while store.load().unwrap().is_some_and(|now| now.epoch == epoch) {
                    let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                        break;
                    };
                    store.wait(left);
                }
                t0.elapsed()
            }
        });
        std::thread::sleep(Duration::from_millis(300));
        let next = t.next();
        assert!(
            other.swap(Some(t.epoch), &next).unwrap(),
            "member {dead} dead"
        );
        t = next;
        let waited = waiter.join().unwrap();
        assert!(
            waited >= Duration::from_millis(250) && waited < Duration::from_secs(10),
            "member {dead} dead: the watch woke after {waited:?} (the change came at 300 ms)"
        );
        assert_eq!(store.load().unwrap(), Some(t.clone()));
        etcd.restart(dead);
        store.heartbeat("a:1").unwrap();
        quiet(&store);
    }
}
