//! kvlab's distributions against twemproxy's: for 10,000 keys and pools of 3 and 5 backends,
//! equal and unequal weights, ketama and modula, each key set through Debian's `nutcracker`
//! lands on the backend that `PoolRing::backend_of` names, and set through a `kvlab proxy` on
//! the same backend as through nutcracker. The backends are real memcached
//! processes; which one holds a key is read back from each of them.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use kvlab_process::{free_port, free_ports, Probe, Process, Spawn};
use kvlab_proxy::{Backend, Distribution, PoolRing, Proxy, ProxyConfig, ProxyOptions};

const KEYS: usize = 10_000;

fn have(program: &str) -> bool {
    std::process::Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn memcached(port: u16) -> Process {
    let mut args = vec!["-U", "0", "-l", "127.0.0.1", "-m", "64"];
    // memcached refuses to run as root without -u
    let as_root = std::env::var("USER").map(|u| u == "root").unwrap_or(true);
    if as_root {
        args.extend(["-u", "root"]);
    }
    Spawn::new("memcached")
        .args(args)
        .args(["-p".to_string(), port.to_string()])
        .ready(Probe::Version(SocketAddr::from(([127, 0, 0, 1], port))))
        .start()
        .expect("memcached starts (apt-get install memcached; .ci/run does it)")
}

/// Starts nutcracker for `backends` and waits until its pool answers.
fn nutcracker(dir: &Path, backends: &[Backend], dist: Distribution) -> (Process, SocketAddr) {
    let [listen, stats] = free_ports(2).expect("free ports")[..] else {
        unreachable!()
    };
    let servers: String = backends
        .iter()
        .map(|b| match &b.name {
            Some(name) => format!("   - {}:{}:{} {name}\n", b.host, b.port, b.weight),
            None => format!("   - {}:{}:{}\n", b.host, b.port, b.weight),
        })
        .collect();
    let distribution = match dist {
        Distribution::Ketama => "ketama",
        Distribution::Modula => "modula",
    };
    let conf = dir.join(format!("nutcracker-{listen}.yml"));
    std::fs::write(
        &conf,
        format!(
            "pool:\n  listen: 127.0.0.1:{listen}\n  hash: md5\n  distribution: {distribution}\n  \
             timeout: 2000\n  servers:\n{servers}"
        ),
    )
    .expect("write the config");
    let addr = SocketAddr::from(([127, 0, 0, 1], listen));
    // nutcracker forwards `version` to a backend: the answer says the pool is serving.
    let process = Spawn::new("nutcracker")
        .arg("-c")
        .arg(conf.as_os_str())
        .args(["-s", &stats.to_string(), "-a", "127.0.0.1"])
        .ready(Probe::Version(addr))
        .start()
        .expect("nutcracker starts (apt-get install nutcracker; .ci/run does it)");
    (process, addr)
}

fn connect(addr: SocketAddr) -> (BufReader<TcpStream>, TcpStream) {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    (BufReader::new(s.try_clone().expect("clone")), s)
}

fn line(r: &mut BufReader<TcpStream>) -> String {
    let mut l = String::new();
    r.read_line(&mut l).expect("read a reply line");
    l
}

/// Sets every key through `addr`, pipelined in batches.
fn set_all(addr: SocketAddr, keys: &[String]) {
    let (mut r, mut w) = connect(addr);
    for batch in keys.chunks(500) {
        let mut out = Vec::new();
        for k in batch {
            out.extend_from_slice(format!("set {k} 0 0 1\r\nx\r\n").as_bytes());
        }
        w.write_all(&out).expect("send sets");
        for k in batch {
            assert_eq!(line(&mut r), "STORED\r\n", "set {k} through the proxy");
        }
    }
}

/// Which of `keys` the server at `addr` holds.
fn held(addr: SocketAddr, keys: &[String]) -> Vec<bool> {
    let (mut r, mut w) = connect(addr);
    let mut found = std::collections::HashSet::new();
    for batch in keys.chunks(100) {
        w.write_all(format!("get {}\r\n", batch.join(" ")).as_bytes())
            .expect("send get");
        loop {
            let l = line(&mut r);
            if l == "END\r\n" {
                break;
            }
            let key = l.split(' ').nth(1).expect("VALUE line").to_string();
            line(&mut r); // the data
            found.insert(key);
        }
    }
    keys.iter().map(|k| found.contains(k)).collect()
}

fn flush(addr: SocketAddr) {
    let (mut r, mut w) = connect(addr);
    w.write_all(b"flush_all\r\n").expect("flush");
    assert_eq!(line(&mut r), "OK\r\n");
}

#[test]
fn every_key_lands_where_twemproxy_puts_it() {
    assert!(
        have("nutcracker") && have("memcached"),
        "needs nutcracker and memcached (apt-get install nutcracker memcached; .ci/run does it)"
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let ports: Vec<u16> = (0..5).map(|_| free_port().expect("port")).collect();
    let _servers: Vec<Process> = ports.iter().map(|&p| memcached(p)).collect();
    let addrs: Vec<SocketAddr> = ports
        .iter()
        .map(|&p| SocketAddr::from(([127, 0, 0, 1], p)))
        .collect();
    let keys: Vec<String> = (0..KEYS).map(|i| format!("key:{i}:{}", i * 7919)).collect();
    // Server names (twemproxy's `host:port:weight name`) replace the address in the hash and
    // in the modula order; these sort unlike the ports.
    let named: &[&str] = &["web-7", "cache-a", "zeta", "b", "cache-10"];
    let cases: [(&[u32], Distribution, bool); 9] = [
        (&[1, 1, 1], Distribution::Ketama, false),
        (&[1, 2, 3], Distribution::Ketama, false),
        (&[1, 1, 1, 1, 1], Distribution::Ketama, false),
        (&[1, 1, 2, 3, 5], Distribution::Ketama, false),
        (&[1, 1, 1], Distribution::Modula, false),
        (&[2, 1, 3, 1, 1], Distribution::Modula, false),
        (&[1, 1, 1], Distribution::Ketama, true),
        (&[1, 1, 2, 3, 5], Distribution::Ketama, true),
        (&[2, 1, 3, 1, 1], Distribution::Modula, true),
    ];
    for (weights, dist, with_names) in cases {
        let backends: Vec<Backend> = weights
            .iter()
            .zip(&ports)
            .zip(named)
            .map(|((&weight, &port), &name)| Backend {
                host: "127.0.0.1".into(),
                port,
                weight,
                name: with_names.then(|| name.to_string()),
            })
            .collect();
        for &a in &addrs {
            flush(a);
        }
        let (_proxy, at) = nutcracker(dir.path(), &backends, dist);
        set_all(at, &keys);
        let ring = PoolRing::new(&backends, dist).expect("ring");
        if with_names {
            // The names matter: without them the same servers place keys otherwise.
            let unnamed: Vec<Backend> = backends
                .iter()
                .map(|b| Backend {
                    name: None,
                    ..b.clone()
                })
                .collect();
            let plain = PoolRing::new(&unnamed, dist).expect("ring");
            assert!(
                keys.iter()
                    .any(|k| plain.backend_of(k.as_bytes()) != ring.backend_of(k.as_bytes())),
                "{dist:?} weights {weights:?}: names changed no key's server"
            );
        }
        let holders: Vec<Vec<bool>> = addrs[..backends.len()]
            .iter()
            .map(|&a| held(a, &keys))
            .collect();
        let mut wrong = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            let on: Vec<usize> = (0..backends.len()).filter(|&b| holders[b][i]).collect();
            let ours = ring.backend_of(k.as_bytes());
            if on != [ours] {
                wrong.push(format!("{k}: nutcracker {on:?}, kvlab {ours}"));
            }
        }
        assert!(
            wrong.is_empty(),
            "{dist:?} weights {weights:?} (names: {with_names}): {} of {KEYS} keys differ, e.g. {:?}",
            wrong.len(),
            &wrong[..wrong.len().min(5)]
        );
        // The same keys set through a kvlab proxy in front of the same backends land on the
        // same servers.
        for &a in &addrs {
            flush(a);
        }
        let mut config = ProxyConfig::new(backends.clone());
        config.pools[0].distribution = dist;
        config.workers = 2;
        let proxy = Proxy::start(
            config,
            ProxyOptions::new(SocketAddr::from(([127, 0, 0, 1], 0))),
        )
        .expect("kvlab proxy starts");
        set_all(proxy.addr(), &keys);
        let through_kvlab: Vec<Vec<bool>> = addrs[..backends.len()]
            .iter()
            .map(|&a| held(a, &keys))
            .collect();
        assert!(
            through_kvlab == holders,
            "{dist:?} weights {weights:?} (names: {with_names}): kvlab proxy and nutcracker place keys differently"
        );
    }
}
