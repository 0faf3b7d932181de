//! The proxy with real backends: the wire table through it (kvlab and memcached backends),
//! replicated writes under each write policy with a backend stopped, reads that still hit,
//! ejection and rejoin without stale data (a returning replica repaired from its peers, or
//! flushed when it missed a `flush_all`), and the honesty of its stage times (they add up;
//! Little's law holds per window within 10%).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use kvlab_proxy::config::parse_backend;
use kvlab_proxy::{Proxy, ProxyConfig, ProxyIo, ProxyOptions, ReplicaWritePolicy};
use kvlab_server::{Server, ServerConfig};
use kvlab_testkit::wire::{connect, exchange, run_closing, run_table_proxied};
use kvlab_testkit::Memcached;

fn kvlab_backend() -> Server {
    Server::start(ServerConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        threads: 2,
        crawler: None,
        ..ServerConfig::default()
    })
    .expect("kvlab server starts")
}

fn memcached() -> Memcached {
    Memcached::start_with(&["-m", "64"])
        .unwrap_or_else(|e| panic!("{e} (.ci/run installs Debian's memcached)"))
}

fn config(addrs: &[SocketAddr]) -> ProxyConfig {
    let mut c = ProxyConfig::new(
        addrs
            .iter()
            .map(|a| parse_backend(&a.to_string()).expect("backend"))
            .collect(),
    );
    c.workers = 4;
    c.timeout = Duration::from_millis(500);
    c.retry_timeout = Duration::from_millis(100);
    c
}

fn proxy(config: ProxyConfig) -> Proxy {
    proxy_io(config, ProxyIo::Reactor)
}

fn proxy_io(config: ProxyConfig, io: ProxyIo) -> Proxy {
    let mut options = ProxyOptions::new(SocketAddr::from(([127, 0, 0, 1], 0)));
    options.io = io;
    Proxy::start(config, options).expect("proxy starts")
}

/// Both thread models.
const BOTH: [ProxyIo; 2] = [ProxyIo::Reactor, ProxyIo::Epoll];

/// One request, its reply up to `until`.
fn ask(addr: SocketAddr, req: &str, until: &str) -> String {
    let mut s = connect(addr);
    String::from_utf8_lossy(&exchange(&mut s, req.as_bytes(), until.as_bytes())).into_owned()
}

/// Waits (at most 10 s) until `f` holds (each try is a request to the proxy).
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn the_wire_table_passes_through_the_proxy_to_kvlab_backends() {
    let backends: Vec<Server> = (0..3).map(|_| kvlab_backend()).collect();
    let addrs: Vec<SocketAddr> = backends.iter().map(|s| s.addr()).collect();
    for io in BOTH {
        let p = proxy_io(config(&addrs), io);
        let mut failures = run_table_proxied(p.addr(), false);
        failures.extend(run_closing(p.addr(), false));
        assert!(failures.is_empty(), "{io:?}:\n{}", failures.join("\n"));
    }
}

#[test]
fn the_wire_table_passes_through_the_proxy_to_memcached_backends() {
    let backends: Vec<Memcached> = (0..3).map(|_| memcached()).collect();
    let addrs: Vec<SocketAddr> = backends.iter().map(|m| m.addr).collect();
    for (multiget, io) in [
        ("sharded", ProxyIo::Reactor),
        ("sharded", ProxyIo::Epoll),
        ("single", ProxyIo::Reactor),
    ] {
        let mut c = config(&addrs);
        c.pools[0].multiget = multiget.parse().expect("mode");
        if multiget == "single" {
            // `single` needs every key on every backend.
            c.pools[0].replicas = 3;
        }
        let p = proxy_io(c, io);
        let mut failures = run_table_proxied(p.addr(), true);
        if multiget == "single" {
            // Reads spread over replicas: a read of an invalidated item hands out its win
            // token on each replica it reaches (each replica's own state, as in any
            // replicated memcached setup). Checked above with one copy.
            failures.retain(|f| !f.starts_with("invalidate gives stale and one win"));
        }
        assert!(
            failures.is_empty(),
            "{multiget} {io:?}:\n{}",
            failures.join("\n")
        );
    }
}

#[test]
fn a_multi_get_is_split_by_backend_and_merged_in_key_order() {
    let backends: Vec<Memcached> = (0..3).map(|_| memcached()).collect();
    let addrs: Vec<SocketAddr> = backends.iter().map(|m| m.addr).collect();
    let p = proxy(config(&addrs));
    let keys: Vec<String> = (0..30).map(|i| format!("key:{i}")).collect();
    let mut s = connect(p.addr());
    for (i, k) in keys.iter().enumerate() {
        if i % 3 != 2 {
            let v = format!("v{i}");
            let req = format!("set {k} {i} 0 {}\r\n{v}\r\n", v.len());
            assert_eq!(exchange(&mut s, req.as_bytes(), b"\r\n"), b"STORED\r\n");
        }
    }
    // The keys are spread (where depends on the backends' ports, which vary): at least two
    // backends hold some, so the multi-get below has parts on several.
    let holding = backends
        .iter()
        .filter(|m| {
            let got = ask(m.addr, &format!("get {}\r\n", keys.join(" ")), "END\r\n");
            got.contains("VALUE")
        })
        .count();
    assert!(holding >= 2, "{holding} backend(s) hold the keys");
    let mut asked = keys.clone();
    asked.push("key:0".into());
    asked.reverse();
    let got = ask(p.addr(), &format!("get {}\r\n", asked.join(" ")), "END\r\n");
    let want: String = asked
        .iter()
        .filter_map(|k| {
            let i: usize = k[4..].parse().unwrap();
            (i % 3 != 2).then(|| format!("VALUE {k} {i} {}\r\nv{i}\r\n", format!("v{i}").len()))
        })
        .collect::<String>()
        + "END\r\n";
    assert_eq!(got, want);
    // The proxy counted one request, 31 keys, 21 hits, over 3 backend requests.
    let stats = ask(p.addr(), "stats\r\n", "END\r\n");
    assert!(stats.contains("STAT cmd_get 31\r\n"), "{stats}");
    assert!(stats.contains("STAT get_hits 21\r\n"), "{stats}");
}

#[test]
fn pipelined_one_key_gets_are_coalesced_and_each_answered_as_if_alone() {
    let backends: Vec<Memcached> = (0..2).map(|_| memcached()).collect();
    let addrs: Vec<SocketAddr> = backends.iter().map(|m| m.addr).collect();
    let value = |i: usize| format!("VALUE c{i} {i} {}\r\nv{i}\r\n", format!("v{i}").len());
    for io in BOTH {
        let p = proxy_io(config(&addrs), io);
        let mut fill = String::new();
        for i in (0..60).step_by(2) {
            fill += &format!("set c{i} {i} 0 {}\r\nv{i}\r\n", format!("v{i}").len());
        }
        fill += "mn\r\n";
        assert_eq!(
            ask(p.addr(), &fill, "MN\r\n"),
            "STORED\r\n".repeat(30) + "MN\r\n"
        );
        // One write of many one-key gets (hits, misses, the same key twice), a set of a
        // missing key between two gets of it, a delete between two gets of a key, and a
        // multi-get among them: each reply is what the request alone gets, in request
        // order (a client's write never passes its own earlier get, though the proxy sends
        // other writes ahead of a coalesced get line).
        let (mut req, mut want) = (String::new(), String::new());
        for i in 0..60 {
            req += &format!("get c{i}\r\n");
            if i % 2 == 0 || i == 21 {
                want += &value(i);
            }
            want += "END\r\n";
            if i == 20 {
                req += "get c20\r\nget c21\r\nset c21 21 0 3\r\nv21\r\nget c21\r\nget c4 c5 c6\r\n";
                want += &(value(20) + "END\r\nEND\r\nSTORED\r\n" + &value(21) + "END\r\n");
                want += &(value(4) + &value(6) + "END\r\n");
                req += "get c22\r\ndelete c22\r\nget c22\r\nset c22 22 0 3\r\nv22\r\n";
                want += &(value(22) + "END\r\nDELETED\r\nEND\r\nSTORED\r\n");
            }
        }
        req += "mn\r\n";
        want += "MN\r\n";
        assert_eq!(ask(p.addr(), &req, "MN\r\n"), want, "{io:?}");
        assert_eq!(ask(p.addr(), "delete c21\r\n", "\r\n"), "DELETED\r\n");
    }
}

#[test]
fn replicated_writes_follow_the_write_policy_and_reads_still_hit() {
    let mut backends: Vec<Memcached> = (0..3).map(|_| memcached()).collect();
    let addrs: Vec<SocketAddr> = backends.iter().map(|m| m.addr).collect();
    let mut all = config(&addrs);
    all.pools[0].replicas = 3;
    let mut majority = all.clone();
    majority.pools[0].write_policy = ReplicaWritePolicy::Majority;
    let (all, majority) = (proxy_io(all, ProxyIo::Epoll), proxy(majority));

    // R = 3: a set lands on all three.
    assert_eq!(
        ask(all.addr(), "set k 0 0 2\r\nhi\r\n", "\r\n"),
        "STORED\r\n"
    );
    for m in &backends {
        assert_eq!(
            ask(m.addr, "get k\r\n", "END\r\n"),
            "VALUE k 0 2\r\nhi\r\nEND\r\n"
        );
    }
    // `add` of an existing key fails on every replica: the first failure comes back.
    assert_eq!(
        ask(all.addr(), "add k 0 0 1\r\nx\r\n", "\r\n"),
        "NOT_STORED\r\n"
    );

    // One backend stopped.
    let stopped = backends.remove(1);
    let name = stopped.addr.to_string();
    drop(stopped);
    let reply = ask(all.addr(), "set k 0 0 3\r\nnew\r\n", "\r\n");
    assert!(
        reply.starts_with(&format!("SERVER_ERROR backend {name}")),
        "all: {reply}"
    );
    assert_eq!(
        ask(majority.addr(), "set k 0 0 3\r\nnew\r\n", "\r\n"),
        "STORED\r\n"
    );
    // Gets still hit, whichever replica they are sent to (retried on the next one).
    for _ in 0..20 {
        assert_eq!(
            ask(majority.addr(), "get k\r\n", "END\r\n"),
            "VALUE k 0 3\r\nnew\r\nEND\r\n"
        );
        assert_eq!(
            ask(majority.addr(), "mg k v\r\n", "\r\nnew\r\n"),
            "VA 3\r\nnew\r\n"
        );
    }
    let stats = ask(majority.addr(), "stats backends\r\n", "END\r\n");
    assert!(
        stats.contains(&format!(
            "name {name}\r\nSTAT backend:1:pool pool0\r\nSTAT backend:1:ejected 1"
        )),
        "the stopped backend is ejected: {stats}"
    );
}

/// memcached on `port` (as root, `-u root`), waited for.
fn memcached_on(port: u16) -> kvlab_process::Process {
    kvlab_process::Spawn::new(Memcached::program())
        .args(["-U", "0", "-l", "127.0.0.1", "-m", "64", "-u", "root"])
        .args(["-p".to_string(), port.to_string()])
        .ready(kvlab_process::Probe::Version(SocketAddr::from((
            [127, 0, 0, 1],
            port,
        ))))
        .start()
        .expect("memcached starts")
}

fn signal(process: &kvlab_process::Process, sig: i32) {
    // SAFETY: sending a signal to our own child process.
    assert_eq!(unsafe { libc::kill(process.pid() as i32, sig) }, 0);
}

#[test]
fn a_returning_replica_is_repaired_before_it_serves_again() {
    let ports = kvlab_process::free_ports(3).unwrap();
    let backends: Vec<_> = ports.iter().map(|&p| memcached_on(p)).collect();
    let addrs: Vec<SocketAddr> = ports
        .iter()
        .map(|&p| SocketAddr::from(([127, 0, 0, 1], p)))
        .collect();
    let mut c = config(&addrs);
    c.pools[0].replicas = 3;
    c.pools[0].write_policy = ReplicaWritePolicy::Majority;
    c.failure_limit = 1;
    c.timeout = Duration::from_millis(200);
    let p = proxy(c);
    for k in ["k", "gone"] {
        assert_eq!(
            ask(p.addr(), &format!("set {k} 0 0 3\r\nold\r\n"), "\r\n"),
            "STORED\r\n"
        );
    }
    // Backend 0 stops answering (a pause, a partition) with the old values in memory. Reads
    // that reach it time out and are retried elsewhere; it is ejected.
    signal(&backends[0], libc::SIGSTOP);
    eventually("the backend is ejected", || {
        assert_eq!(
            ask(p.addr(), "get k\r\n", "END\r\n"),
            "VALUE k 0 3\r\nold\r\nEND\r\n"
        );
        ask(p.addr(), "stats backends\r\n", "END\r\n").contains("STAT backend:0:ejected 1")
    });
    // The writes it misses land on the other two (a majority) and are recorded for it.
    assert_eq!(
        ask(p.addr(), "set k 5 0 3\r\nnew\r\n", "\r\n"),
        "STORED\r\n"
    );
    assert_eq!(ask(p.addr(), "delete gone\r\n", "\r\n"), "DELETED\r\n");
    let stats = ask(p.addr(), "stats backends\r\n", "END\r\n");
    assert!(stats.contains("STAT backend:0:missed_keys 2"), "{stats}");
    // It answers again; the prober copies what it missed from its peers before putting it
    // back: the new value, and the delete.
    signal(&backends[0], libc::SIGCONT);
    eventually("the backend rejoins", || {
        ask(p.addr(), "stats backends\r\n", "END\r\n").contains("STAT backend:0:rejoins 1")
    });
    assert_eq!(
        ask(addrs[0], "get k gone\r\n", "END\r\n"),
        "VALUE k 5 3\r\nnew\r\nEND\r\n"
    );
    let stats = ask(p.addr(), "stats backends\r\n", "END\r\n");
    for want in [
        "STAT backend:0:missed_keys 0",
        "STAT backend:0:repaired_keys 2",
        "STAT backend:0:flushes 0",
    ] {
        assert!(stats.contains(want), "{want}: {stats}");
    }
    // Every read hits the new value, whichever replica serves it; never the old one.
    for _ in 0..30 {
        assert_eq!(
            ask(p.addr(), "get k\r\n", "END\r\n"),
            "VALUE k 5 3\r\nnew\r\nEND\r\n"
        );
    }
}

#[test]
fn a_replica_that_missed_a_flush_all_is_flushed_before_it_serves_again() {
    let ports = kvlab_process::free_ports(2).unwrap();
    let backends: Vec<_> = ports.iter().map(|&p| memcached_on(p)).collect();
    let addrs: Vec<SocketAddr> = ports
        .iter()
        .map(|&p| SocketAddr::from(([127, 0, 0, 1], p)))
        .collect();
    let mut c = config(&addrs);
    c.pools[0].replicas = 2;
    c.failure_limit = 1;
    c.timeout = Duration::from_millis(200);
    let p = proxy(c);
    assert_eq!(
        ask(p.addr(), "set k 0 0 3\r\nold\r\n", "\r\n"),
        "STORED\r\n"
    );
    signal(&backends[1], libc::SIGSTOP);
    eventually("the backend is ejected", || {
        ask(p.addr(), "get k\r\n", "END\r\n");
        ask(p.addr(), "stats backends\r\n", "END\r\n").contains("STAT backend:1:ejected 1")
    });
    // Every replica must take a flush_all: it fails, but the live one is flushed, and a
    // key written after it lands there alone.
    let reply = ask(p.addr(), "flush_all\r\n", "\r\n");
    assert!(reply.starts_with("SERVER_ERROR backend"), "{reply}");
    assert!(ask(p.addr(), "set n 0 0 1\r\nx\r\n", "\r\n").starts_with("SERVER_ERROR"));
    signal(&backends[1], libc::SIGCONT);
    eventually("the backend rejoins", || {
        ask(p.addr(), "stats backends\r\n", "END\r\n").contains("STAT backend:1:rejoins 1")
    });
    // Flushed, then the key written meanwhile copied from its peer.
    assert_eq!(
        ask(addrs[1], "get k n\r\n", "END\r\n"),
        "VALUE n 0 1\r\nx\r\nEND\r\n"
    );
    let stats = ask(p.addr(), "stats backends\r\n", "END\r\n");
    assert!(stats.contains("STAT backend:1:flushes 1"), "{stats}");
}

#[test]
fn a_hung_backend_times_out_and_no_client_hangs() {
    // A listener that accepts and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let m = memcached();
    let mut c = config(&[silent.local_addr().unwrap(), m.addr]);
    c.pools[0].replicas = 2;
    c.pools[0].write_policy = ReplicaWritePolicy::Majority;
    c.timeout = Duration::from_millis(200);
    let p = proxy(c);
    let started = Instant::now();
    // The majority is 2 of 2: the silent replica's timeout decides.
    let reply = ask(p.addr(), "set k 0 0 1\r\nx\r\n", "\r\n");
    assert!(reply.contains("timed out"), "{reply}");
    // Reads go to the answering replica, retried there after a timeout.
    for _ in 0..4 {
        assert_eq!(
            ask(p.addr(), "get k\r\n", "END\r\n"),
            "VALUE k 0 1\r\nx\r\nEND\r\n"
        );
    }
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn stage_times_add_up_and_littles_law_holds_per_window() {
    let m = memcached();
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(&[m.addr]);
    // One worker and many clients: requests queue.
    c.workers = 1;
    let mut options = ProxyOptions::new(SocketAddr::from(([127, 0, 0, 1], 0)));
    // The classic middleware: a network thread, a queue, the worker.
    options.io = ProxyIo::Epoll;
    options.log_dir = Some(dir.path().to_path_buf());
    // Windows long beside the waits: a request queued across a window's edge counts its
    // area in two windows but its wait in one, an error of about W/T (a loaded machine
    // can stall the worker for tens of ms).
    options.log_interval = Duration::from_millis(1000);
    options.log_sample = 10;
    let p = Proxy::start(c, options).unwrap();
    let addr = p.addr();
    let value = "x".repeat(100);
    assert_eq!(
        ask(addr, &format!("set k 0 0 100\r\n{value}\r\n"), "\r\n"),
        "STORED\r\n"
    );
    let deadline = Instant::now() + Duration::from_millis(3500);
    let clients: Vec<_> = (0..32)
        .map(|_| {
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut buf = vec![0u8; 64 * 1024];
                let mut n = 0;
                while Instant::now() < deadline && n < 200_000 {
                    s.write_all(b"get k\r\nget k\r\n").unwrap();
                    let mut got = 0;
                    while got < 2 * 122 {
                        got += s.read(&mut buf).unwrap();
                    }
                    n += 2;
                }
                n
            })
        })
        .collect();
    let sent: usize = clients.into_iter().map(|c| c.join().unwrap()).sum();
    p.stop();
    let windows = std::fs::read_to_string(dir.path().join("windows.csv")).unwrap();
    let mut lines = windows.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let mut checked = 0;
    for line in lines {
        let f: Vec<f64> = line.split(',').map(|x| x.parse().unwrap()).collect();
        let (rate, l, wq) = (
            f[col("throughput_rps")],
            f[col("queue_len_mean")],
            f[col("queue_mean_us")] / 1e6,
        );
        if f[col("requests")] < 1000.0 || l < 0.5 {
            continue; // the edges of the run
        }
        let little = rate * wq;
        assert!(
            (l - little).abs() <= 0.1 * l,
            "L = {l:.2} but λW = {rate:.0}/s × {:.1} µs = {little:.2}\n{windows}",
            wq * 1e6
        );
        checked += 1;
    }
    assert!(
        checked >= 2,
        "too few loaded windows ({sent} requests):\n{windows}"
    );
    // Per request: queue + worker = total; the backend's time lies within the worker's.
    let requests = std::fs::read_to_string(dir.path().join("requests.csv")).unwrap();
    let mut n = 0;
    for line in requests.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let us = |i: usize| f[i].parse::<i64>().unwrap();
        let (queue, worker, backend, total) = (us(5), us(6), us(7), us(8));
        assert!((queue + worker - total).abs() <= 1, "{line}");
        assert!(backend <= worker, "{line}");
        n += 1;
    }
    assert!(n > 100, "{n} sampled requests");
}

#[test]
fn a_changed_config_file_reloads_without_dropping_clients_and_a_bad_one_is_refused() {
    let a = memcached();
    let b = memcached();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("proxy.toml");
    let write = |backends: &[SocketAddr], extra: &str| {
        let list: Vec<String> = backends.iter().map(|a| format!("\"{a}\"")).collect();
        std::fs::write(
            &file,
            format!(
                "workers = 2\n[[pool]]\nbackends = [{}]\n{extra}",
                list.join(", ")
            ),
        )
        .unwrap();
    };
    write(&[a.addr], "");
    let mut options = ProxyOptions::new(SocketAddr::from(([127, 0, 0, 1], 0)));
    options.config_file = Some(file.clone());
    let p = Proxy::start(ProxyConfig::load(&file).unwrap(), options).unwrap();
    let mut client = connect(p.addr());
    assert_eq!(
        exchange(&mut client, b"set k 0 0 1\r\nx\r\n", b"\r\n"),
        b"STORED\r\n"
    );
    let setting = |name: &str| {
        let s = ask(p.addr(), "stats settings\r\n", "END\r\n");
        s.lines()
            .find_map(|l| l.strip_prefix(&format!("STAT {name} ")).map(str::to_string))
            .unwrap_or_default()
    };
    // A second backend: the file changes and is picked up (SIGHUP sets the same flag).
    write(&[a.addr, b.addr], "replicas = 2\n");
    p.shared()
        .reload_requested
        .store(true, std::sync::atomic::Ordering::Relaxed);
    eventually("the new configuration is in force", || {
        setting("config_version") == "1"
    });
    assert_eq!(setting("pool:0:backends"), "2");
    // The client connection from before still works, through the new routing.
    assert_eq!(
        exchange(&mut client, b"set k 0 0 1\r\ny\r\n", b"\r\n"),
        b"STORED\r\n"
    );
    assert_eq!(
        ask(b.addr, "get k\r\n", "END\r\n"),
        "VALUE k 0 1\r\ny\r\nEND\r\n"
    );
    // A bad file is refused; the running configuration stays, the refusal is counted.
    std::fs::write(&file, "workers = 2\n[[pool]]\nbackends = [\"nohost\"]\n").unwrap();
    p.shared()
        .reload_requested
        .store(true, std::sync::atomic::Ordering::Relaxed);
    eventually("the bad file is refused", || {
        ask(p.addr(), "stats\r\n", "END\r\n").contains("STAT proxy_reload_failures 1\r\n")
    });
    assert!(p.shared().last_reload_error.lock().contains("HOST:PORT"));
    assert_eq!(setting("config_version"), "1");
    assert_eq!(
        exchange(&mut client, b"get k\r\n", b"END\r\n"),
        b"VALUE k 0 1\r\ny\r\nEND\r\n"
    );
}

#[test]
fn metrics_are_served_as_prometheus_text_with_histograms() {
    let m = memcached();
    let mut options = ProxyOptions::new(SocketAddr::from(([127, 0, 0, 1], 0)));
    options.metrics = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    let p = Proxy::start(config(&[m.addr]), options).unwrap();
    assert_eq!(ask(p.addr(), "get nope\r\n", "END\r\n"), "END\r\n");
    let mut s = TcpStream::connect(p.metrics_addr().unwrap()).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    for want in [
        "kvlab_proxy_requests_total 1",
        "kvlab_proxy_stage_seconds_bucket{stage=\"total\",le=\"+Inf\"} 1",
        "kvlab_proxy_stage_seconds_count{stage=\"queue\"} 1",
        &format!("kvlab_proxy_backend_ejected{{backend=\"{}\"}} 0", m.addr),
    ] {
        assert!(body.contains(want), "{want} missing:\n{body}");
    }
}
