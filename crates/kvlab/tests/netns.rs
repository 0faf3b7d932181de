//! A kvlab cluster over a real network: `scripts/cluster-netns.sh` starts every node in its
//! own network namespace with its own address (veth pairs on a bridge), and the load comes
//! from the root namespace through that bridge. On either topology store (a shared file;
//! etcd in a namespace of its own) a node is added under `kvlab bench --cluster --verify`
//! (nothing lost, no error). On the file: a delay on one node's link raises the latency of
//! the requests that node serves, and only theirs; a partitioned node answers nothing until
//! it is healed, and then serves its keys again. On etcd: a node cut off from etcd alone
//! stops taking writes once its lease has lapsed (the others go on), and takes them again
//! when healed.
//!
//! Needs root (network namespaces), iproute2, iptables and etcd (`.ci/run` installs them).
//! On a machine where namespaces cannot be created the tests say so and pass without
//! running. Whatever happens, the namespaces, veths and bridge they made are removed (a
//! guard runs the script's `down` when a test ends, panics included). The tests take turns:
//! each loads the machine's two cores, and the latency comparisons want them.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kvlab_client::{Answer, Client, ClusterClient};
use kvlab_cluster::coordinator::node_status;
use kvlab_etcd::open_store;

const KVLAB: &str = env!("CARGO_BIN_EXE_kvlab");

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/cluster-netns.sh")
}

static TURNS: Mutex<()> = Mutex::new(());

/// One network of namespaces, named after this process and test (`n`) so that concurrent
/// runs (another checkout's tests, a hand-started cluster on the default 10.77.0.0/24) do
/// not meet.
struct Net {
    name: String,
    subnet: String,
    store: &'static str,
    dir: tempfile::TempDir,
}

impl Net {
    fn new(n: u32, store: &'static str) -> Net {
        let pid = std::process::id();
        Net {
            name: format!("kv{n}{}", pid % 100_000),
            subnet: format!("10.77.{}", 100 + (pid * 2 + n) % 150),
            store,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn run(&self, args: &[&str]) -> Output {
        let out = Command::new("timeout")
            .arg("120")
            .arg("bash")
            .arg(script())
            .args(args)
            .env("KVNET", &self.name)
            .env("KVNET_SUBNET", &self.subnet)
            .env("KVNET_DIR", self.dir.path().join("state"))
            .env("KVNET_STORE", self.store)
            .env("KVLAB", KVLAB)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "cluster-netns.sh {args:?}: {text}\n{}",
            self.logs()
        );
        eprint!("{text}");
        out
    }

    fn addr(&self, k: usize) -> String {
        format!("{}.{}:11211", self.subnet, 10 + k)
    }

    /// The `--topology` value (a file or an etcd address).
    fn topology(&self) -> String {
        let out = self.run(&["topology"]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// The nodes' logs, for a failure's message.
    fn logs(&self) -> String {
        let mut s = String::new();
        if let Ok(dir) = std::fs::read_dir(self.dir.path().join("state")) {
            for e in dir.flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "log") {
                    let text = std::fs::read_to_string(&p).unwrap_or_default();
                    let tail: Vec<&str> = text.lines().rev().take(5).collect();
                    s += &format!("--- {}: {:?}\n", p.display(), tail);
                }
            }
        }
        s
    }

    fn namespaces_left(&self) -> Vec<String> {
        let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|n| n.starts_with(&format!("{}-", self.name)))
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = Command::new("timeout")
            .arg("60")
            .arg("bash")
            .arg(script())
            .arg("down")
            .env("KVNET", &self.name)
            .env("KVNET_SUBNET", &self.subnet)
            .env("KVNET_DIR", self.dir.path().join("state"))
            .output();
    }
}

/// Whether this machine lets us make a network namespace (root, iproute2, a kernel with
/// them); the reason if not.
fn can_make_namespaces() -> Result<(), String> {
    let name = format!("kvtprobe{}", std::process::id());
    let add = Command::new("ip")
        .args(["netns", "add", &name])
        .output()
        .map_err(|e| format!("no `ip` (iproute2): {e}"))?;
    if !add.status.success() {
        return Err(String::from_utf8_lossy(&add.stderr).trim().to_string());
    }
    let _ = Command::new("ip").args(["netns", "del", &name]).output();
    Ok(())
}

fn bench(seed: &str, json: &Path, args: &[&str]) -> serde_json::Value {
    let out = Command::new("timeout")
        .arg("60")
        .arg(KVLAB)
        .args(["bench", "--cluster", seed, "--keys", "10000", "--verify"])
        .args(["-T", "1", "-c", "4", "--mix", "get=8,set=2", "-q"])
        .args(args)
        .arg("--json")
        .arg(json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bench: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprint!("{}", String::from_utf8_lossy(&out.stdout));
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    report["runs"][0].clone()
}

/// The median of the round-trip times of `get`s of `keys` (each key owned by one node).
fn p50_of_gets(c: &mut ClusterClient, keys: &[String]) -> Duration {
    let mut t: Vec<Duration> = keys
        .iter()
        .map(|k| {
            let start = Instant::now();
            let v = c.get(k.as_bytes()).unwrap();
            assert_eq!(v.as_deref(), Some(k.as_bytes()), "{k}");
            start.elapsed()
        })
        .collect();
    t.sort();
    t[t.len() / 2]
}

/// Takes this test's turn and checks that namespaces can be made; `None` (after saying why)
/// if they cannot.
fn begin() -> Option<std::sync::MutexGuard<'static, ()>> {
    let turn = TURNS.lock().unwrap_or_else(|e| e.into_inner());
    match can_make_namespaces() {
        Ok(()) => Some(turn),
        Err(why) => {
            eprintln!("SKIPPED: this machine cannot create network namespaces ({why})");
            None
        }
    }
}

/// Three nodes up; a fourth added while `kvlab bench --cluster --verify` loads them from the
/// root namespace: no error, no miss, the new node holds its share.
fn grow(net: &Net) {
    net.run(&["up", "3", "--", "-t", "1", "-m", "128"]);
    let seed = net.addr(1);
    let bench_thread = std::thread::spawn({
        let (seed, json) = (seed.clone(), net.dir.path().join("grow.json"));
        move || bench(&seed, &json, &["--load", "--duration", "6"])
    });
    std::thread::sleep(Duration::from_secs(2));
    net.run(&["start", "4", "--", "-t", "1", "-m", "128"]);
    let added = Command::new("timeout")
        .arg("60")
        .arg(KVLAB)
        .args(["cluster", "--topology", &net.topology()])
        .args(["add", &net.addr(4)])
        .output()
        .unwrap();
    assert!(
        added.status.success() && String::from_utf8_lossy(&added.stdout).contains("done"),
        "cluster add: {}{}",
        String::from_utf8_lossy(&added.stdout),
        String::from_utf8_lossy(&added.stderr)
    );
    eprint!("{}", String::from_utf8_lossy(&added.stdout));
    let grow = bench_thread.join().unwrap();
    common::assert_clean(&grow);
    let t = open_store(&net.topology())
        .unwrap()
        .load()
        .unwrap()
        .unwrap();
    assert_eq!((t.nodes.len(), t.migration), (4, None));
    let items = node_status(&net.addr(4)).unwrap()["items"]
        .as_u64()
        .unwrap();
    assert!(items > 10_000 / 4 / 2, "the added node holds {items} items");
}

/// `down` leaves nothing behind.
fn down(net: &Net) {
    net.run(&["down"]);
    assert_eq!(net.namespaces_left(), Vec::<String>::new());
    let links = Command::new("ip").args(["-o", "link"]).output().unwrap();
    let links = String::from_utf8_lossy(&links.stdout);
    assert!(
        !links.contains(&format!(" {}-", net.name)),
        "links left: {links}"
    );
}

/// Up to `n` keys `prefix:i` that node `k` owns, set through the cluster.
fn keys_of(c: &mut ClusterClient, net: &Net, k: usize, prefix: &str, n: usize) -> Vec<String> {
    let mut keys = Vec::new();
    for i in 0..(n * 40) {
        let key = format!("{prefix}:{i}");
        if c.ring().owner(key.as_bytes()) == Some(net.addr(k).as_str()) {
            assert!(c.set(key.as_bytes(), key.as_bytes()).unwrap());
            keys.push(key);
            if keys.len() == n {
                break;
            }
        }
    }
    assert_eq!(keys.len(), n, "node {k} owns too few keys");
    keys
}

#[test]
fn a_cluster_across_network_namespaces_grows_under_load_and_feels_its_links() {
    let Some(_turn) = begin() else { return };
    let net = Net::new(1, "file");
    grow(&net);
    let seed = net.addr(1);
    let dir = net.dir.path();

    // A delay on node 2's link: its keys' gets slow down by it, the others' do not.
    let seeds: Vec<SocketAddr> = vec![seed.parse().unwrap()];
    let mut c = ClusterClient::connect(&seeds, Duration::from_secs(2)).unwrap();
    let on1 = keys_of(&mut c, &net, 1, "lat", 100);
    let on2 = keys_of(&mut c, &net, 2, "lat", 100);
    let on3 = keys_of(&mut c, &net, 3, "lat", 100);
    let before2 = p50_of_gets(&mut c, &on2);
    let base = bench(
        &seed,
        &dir.join("base.json"),
        &["--noload", "--duration", "2"],
    );
    common::assert_clean(&base);

    let delay = Duration::from_millis(20);
    net.run(&["netem", "2", "delay", "20ms"]);
    let during2 = p50_of_gets(&mut c, &on2);
    let during1 = p50_of_gets(&mut c, &on1);
    let slow = bench(
        &seed,
        &dir.join("delay.json"),
        &["--noload", "--duration", "2"],
    );
    net.run(&["netem", "2", "clear"]);
    let after2 = p50_of_gets(&mut c, &on2);
    eprintln!(
        "node 2's keys: get p50 {before2:?} before, {during2:?} with +{delay:?} on its link, \
         {after2:?} after; node 1's keys meanwhile {during1:?}"
    );
    assert!(
        during2 >= before2 + delay / 2,
        "the delay did not show: p50 {before2:?} -> {during2:?}"
    );
    assert!(
        during1 + delay / 2 <= during2,
        "node 1 slowed too: {during1:?} vs node 2 {during2:?}"
    );
    assert!(
        after2 + delay / 2 <= during2,
        "clear left a delay: {after2:?}"
    );
    // Through the cluster-aware load: a quarter of the requests go to node 2, so p90 (not
    // p50) carries the delay; no request is lost or wrong meanwhile.
    assert_eq!(slow["counters"]["errors"].as_u64(), Some(0), "{slow}");
    assert_eq!(slow["counters"]["verify_errors"].as_u64(), Some(0));
    let p90 = |r: &serde_json::Value| r["latency"]["p90_us"].as_f64().unwrap();
    eprintln!(
        "bench --cluster p90: {:.0} µs without, {:.0} µs with the delay on node 2; {:.0} vs {:.0} req/s",
        p90(&base),
        p90(&slow),
        base["throughput_qps"].as_f64().unwrap(),
        slow["throughput_qps"].as_f64().unwrap()
    );
    assert!(
        p90(&slow) >= p90(&base) + delay.as_micros() as f64 / 2.0,
        "bench p90 {} -> {} µs",
        p90(&base),
        p90(&slow)
    );

    // A partition: node 3 answers nothing, not even on a connection opened before; healed,
    // it serves its keys again.
    let n3: SocketAddr = net.addr(3).parse().unwrap();
    let timeout = Duration::from_millis(500);
    let mut open = Client::connect(n3, timeout).unwrap();
    assert!(open.call(b"version\r\n").is_ok());
    net.run(&["partition", "3"]);
    assert!(
        open.call(b"version\r\n").is_err(),
        "a partitioned node answered"
    );
    assert!(
        Client::connect(n3, timeout).is_err(),
        "connected through a partition"
    );
    let n1: SocketAddr = seed.parse().unwrap();
    assert!(Client::connect(n1, timeout)
        .unwrap()
        .call(b"version\r\n")
        .is_ok());
    net.run(&["heal", "3"]);
    assert!(Client::connect(n3, timeout)
        .unwrap()
        .call(b"version\r\n")
        .is_ok());
    let mut fresh = ClusterClient::connect(&seeds, Duration::from_secs(2)).unwrap();
    for k in &on3 {
        assert_eq!(
            fresh.get(k.as_bytes()).unwrap().as_deref(),
            Some(k.as_bytes())
        );
    }

    down(&net);
}

/// `set key` straight to one node: its reply line (`STORED`, `SERVER_ERROR TRYAGAIN …`).
fn set_on(node: &str, key: &str) -> String {
    let mut c = Client::connect(node.parse().unwrap(), Duration::from_secs(2)).unwrap();
    let req = format!("set {key} 0 0 {}\r\n{key}\r\n", key.len());
    match c.call(req.as_bytes()).unwrap() {
        Answer::Line(l) => String::from_utf8_lossy(&l).trim_end().to_string(),
        other => panic!("set {key}: {other:?}"),
    }
}

fn writable(net: &Net, k: usize) -> bool {
    node_status(&net.addr(k)).unwrap()["writable"]
        .as_bool()
        .unwrap()
}

/// Asks until `f` holds (at most 20 s); returns how long it took.
fn until(what: &str, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    start.elapsed()
}

#[test]
fn on_etcd_a_node_cut_off_from_etcd_stops_taking_writes_once_its_lease_lapses() {
    let Some(_turn) = begin() else { return };
    let net = Net::new(2, "etcd");
    grow(&net);
    let seeds: Vec<SocketAddr> = vec![net.addr(1).parse().unwrap()];
    let mut c = ClusterClient::connect(&seeds, Duration::from_secs(2)).unwrap();
    let on3 = keys_of(&mut c, &net, 3, "cut", 20);
    let on1 = keys_of(&mut c, &net, 1, "cut", 20);
    assert!(writable(&net, 3));
    assert_eq!(set_on(&net.addr(3), &on3[0]), "STORED");

    // Node 3 loses etcd but not its clients: once its lease may have lapsed it refuses
    // writes (a successor may own its keys by then), and keeps refusing them.
    net.run(&["partition", "3", "etcd"]);
    let took = until("node 3 to stop taking writes", || !writable(&net, 3));
    eprintln!("node 3 cut off from etcd: writes refused after {took:?}");
    for k in &on3 {
        let reply = set_on(&net.addr(3), k);
        assert!(
            reply.starts_with("SERVER_ERROR TRYAGAIN"),
            "{k} written on a node cut off from etcd: {reply}"
        );
    }
    // The rest of the cluster still reaches etcd and takes writes.
    for k in &on1 {
        assert_eq!(set_on(&net.addr(1), k), "STORED");
    }
    assert!(writable(&net, 1) && writable(&net, 2) && writable(&net, 4));

    // Healed: its lease renewed, it takes writes again.
    net.run(&["heal", "3"]);
    let took = until("node 3 to take writes again", || writable(&net, 3));
    eprintln!("node 3 healed: writes taken again after {took:?}");
    for k in &on3 {
        assert_eq!(set_on(&net.addr(3), k), "STORED");
    }
    down(&net);
}
