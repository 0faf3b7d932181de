//! The topology in a real etcd (Debian's `etcd-server`, started here): compare-and-swap on
//! the epoch, a watch that wakes a waiting node, and node liveness by leases.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::time::{Duration, Instant};

use kvlab_client::testing::Etcd;
use kvlab_cluster::etcd::{EtcdStore, LEASE_TTL_S};
use kvlab_cluster::{Migration, Phase, Topology, TopologyStore};

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
