//! What the tests of a cluster of real nodes share: starting a node and running `kvlab
//! cluster`, waiting on a condition, the requests the nodes served, and the checker — a
//! writer-reader of its own keys that finds any stale or lost read. Each test binary that
//! includes `common` uses some of it.
#![allow(dead_code)]
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvlab_client::{Client, ClusterClient};
use kvlab_cluster::coordinator::node_status;
use kvlab_process::{Probe, Process, Spawn};

pub const KVLAB: &str = env!("CARGO_BIN_EXE_kvlab");

/// A node (`kvlab server --cluster`, 2 threads, 256 MiB) on `127.0.0.1:port`, once it
/// answers.
pub fn node(topology: &str, port: u16) -> Process {
    node_with(topology, port, &[])
}

/// [`node`] with more flags (`--data-dir`, `--cache-items`, …).
pub fn node_with(topology: &str, port: u16, extra: &[String]) -> Process {
    let name = format!("127.0.0.1:{port}");
    Spawn::new(KVLAB)
        .args(["server", "-l", "127.0.0.1", "-t", "2", "-m", "256"])
        .args(["-p".to_string(), port.to_string()])
        .args(["--cluster".to_string(), topology.to_string()])
        .args(["--cluster-node".to_string(), name])
        .args(extra)
        .ready(Probe::Version(SocketAddr::from(([127, 0, 0, 1], port))))
        .start()
        .unwrap()
}

pub fn cluster(topology: &str, args: &[&str]) -> Output {
    let out = Command::new(KVLAB)
        .arg("cluster")
        .arg("--topology")
        .arg(topology)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kvlab cluster {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn items(name: &str) -> u64 {
    node_status(name).unwrap()["items"].as_u64().unwrap()
}

/// Requests the nodes among `names` that answer have served (gets and stores).
pub fn served(names: &[String]) -> u64 {
    names
        .iter()
        .filter_map(|n| {
            let addr: SocketAddr = n.parse().ok()?;
            kvlab_process::stats(addr, None, Duration::from_secs(1)).ok()
        })
        .flat_map(|stats| stats.into_iter())
        .filter(|(k, _)| k == "cmd_get" || k == "cmd_set")
        .filter_map(|(_, v)| v.parse::<u64>().ok())
        .sum()
}

/// Asks until `f` holds (at most 15 s).
pub fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One writer-reader of its own keys through a cluster-aware client: every read must
/// return the last acknowledged write of that key. Returns (writes, stale or lost reads,
/// errors, redirects followed).
pub fn checker(
    seed: SocketAddr,
    proxy: Option<SocketAddr>,
    stop: Arc<AtomicBool>,
) -> (u64, Vec<String>, Vec<String>, u64) {
    let mut c = match proxy {
        Some(p) => Kv::Plain(Client::connect(p, Duration::from_secs(5)).unwrap(), p),
        None => Kv::Cluster(ClusterClient::connect(&[seed], Duration::from_secs(2)).unwrap()),
    };
    let keys = 200usize;
    let mut acked: Vec<Option<u64>> = vec![None; keys];
    // Writes since a key's last acknowledged one that failed (a timeout, a lost connection):
    // of unknown effect, so a read may find any of them.
    let mut maybe: Vec<Vec<u64>> = vec![Vec::new(); keys];
    let fits = |got: &[u8], want: u64, maybe: &[u64]| {
        std::iter::once(want)
            .chain(maybe.iter().copied())
            .any(|v| got == v.to_string().as_bytes())
    };
    let (mut writes, mut stale, mut errors) = (0u64, Vec::new(), Vec::new());
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut i = 0usize;
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        let k = i % keys;
        let key = format!("chk:{k}");
        let v = i as u64;
        match c.set(key.as_bytes(), v.to_string().as_bytes()) {
            Ok(true) => {
                acked[k] = Some(v);
                maybe[k].clear();
                writes += 1;
            }
            Ok(false) => errors.push(format!("set {key}: not stored")),
            Err(e) => {
                maybe[k].push(v);
                errors.push(format!("set {key}: {e}"));
            }
        }
        // Read back an earlier key: it must hold its last acknowledged version.
        let j = (i * 7 + 3) % keys;
        if let Some(want) = acked[j] {
            let key = format!("chk:{j}");
            match c.get(key.as_bytes()) {
                Ok(Some(got)) if fits(&got, want, &maybe[j]) => {}
                Ok(got) => stale.push(format!(
                    "{key}: read {:?}, last acknowledged {want}",
                    got.map(|g| String::from_utf8_lossy(&g).into_owned())
                )),
                Err(e) => errors.push(format!("get {key}: {e}")),
            }
        }
        i += 1;
    }
    // After the changes: every key holds its last acknowledged version.
    for (k, want) in acked.iter().enumerate() {
        let key = format!("chk:{k}");
        if let Some(want) = want {
            match c.get(key.as_bytes()) {
                Ok(Some(got)) if fits(&got, *want, &maybe[k]) => {}
                other => stale.push(format!("at the end {key}: {other:?}, want {want}")),
            }
        }
    }
    let redirects = match &c {
        Kv::Cluster(c) => c.redirects,
        Kv::Plain(..) => 0,
    };
    (writes, stale, errors, redirects)
}

/// The checker's client: cluster-aware, or a plain memcached client (through a proxy).
pub enum Kv {
    /// A cluster-aware client.
    Cluster(ClusterClient),
    /// A plain client of one address (a proxy), reconnected after a failure.
    Plain(Client, SocketAddr),
}

impl Kv {
    pub fn set(&mut self, key: &[u8], value: &[u8]) -> Result<bool, String> {
        match self {
            Kv::Cluster(c) => c.set(key, value).map_err(|e| e.to_string()),
            Kv::Plain(c, addr) => Self::retry(c, *addr, |c| c.set(key, value)),
        }
    }

    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, String> {
        match self {
            Kv::Cluster(c) => c.get(key).map_err(|e| e.to_string()),
            Kv::Plain(c, addr) => Self::retry(c, *addr, |c| c.get(key)),
        }
    }

    /// A plain client reconnects after a broken connection (and reports the error).
    fn retry<T>(
        c: &mut Client,
        addr: SocketAddr,
        f: impl Fn(&mut Client) -> Result<T, kvlab_client::ConnError>,
    ) -> Result<T, String> {
        f(c).map_err(|e| {
            if let Ok(n) = Client::connect(addr, Duration::from_secs(2)) {
                *c = n;
            }
            e.to_string()
        })
    }
}

/// What [`grow_and_shrink_under_load`] saw: the load's run (its JSON) and the redirects
/// the checker followed.
pub struct GrowShrink {
    pub run: serde_json::Value,
    pub redirects: u64,
}

/// The cluster of `names[..3]` grows by `names[3]` and then loses `names[0]`, each change
/// once the load has run a while on the ring before it, under `kvlab bench --load --verify`
/// (through the proxy at `proxy`, or as a cluster-aware client) and the checker. Asserts
/// what every such test asserts: the load ran clean, the checker wrote, and read nothing
/// stale or lost and met no error.
pub fn grow_and_shrink_under_load(
    dir: &std::path::Path,
    topology: &str,
    names: &[String],
    proxy: Option<SocketAddr>,
) -> GrowShrink {
    let seed: SocketAddr = names[1].parse().unwrap();
    let json = dir.join("bench.json");
    let bench = std::thread::spawn({
        let json = json.clone();
        let how = match proxy {
            Some(proxy) => ["-s".to_string(), proxy.to_string()],
            None => ["--cluster".to_string(), names[1].clone()],
        };
        move || {
            Command::new(KVLAB)
                .arg("bench")
                .args(&how)
                .args(["--keys", "20000", "--load", "--verify"])
                .args(["--duration", "8", "-T", "1", "-c", "4"])
                .args(["--mix", "get=8,set=2", "--json"])
                .arg(&json)
                .output()
                .unwrap()
        }
    });
    let stop = Arc::new(AtomicBool::new(false));
    let check = std::thread::spawn({
        let stop = stop.clone();
        move || checker(seed, proxy, stop)
    });

    let ring = &names[..3];
    let base = served(ring);
    until("the load to run", || served(ring) >= base + 20_000);
    let added = cluster(topology, &["add", &names[3]]);
    assert!(String::from_utf8_lossy(&added.stdout).contains("done"));
    let base = served(names);
    until("the load to run on four nodes", || {
        served(names) >= base + 10_000
    });
    cluster(topology, &["remove", &names[0]]);

    let out = bench.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    let (writes, stale, errors, redirects) = check.join().unwrap();
    assert!(
        out.status.success(),
        "bench: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let run = report["runs"][0].clone();
    super::assert_clean(&run);
    assert!(writes > 100, "the checker wrote {writes}");
    assert!(
        stale.is_empty(),
        "stale or lost: {:?}",
        &stale[..stale.len().min(5)]
    );
    assert!(
        errors.is_empty(),
        "errors: {:?}",
        &errors[..errors.len().min(5)]
    );
    GrowShrink { run, redirects }
}

/// The first of `n` consecutive free 127.0.0.1 ports (for `up --base-port`).
pub fn consecutive_free_ports(n: u16) -> u16 {
    kvlab_process::free_consecutive_ports(n).unwrap()
}
