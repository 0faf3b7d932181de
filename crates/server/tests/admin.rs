//! Administration commands that need a server of their own (`-A`'s `shutdown` stops it;
//! `lru_crawler metadump`'s lines carry times and CAS values), each compared with
//! Debian's memcached started with the same flags.

mod common;

use std::collections::BTreeSet;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use kvlab_server::IoModel;
use kvlab_testkit::Memcached;

fn memcached(args: &[&str]) -> Memcached {
    Memcached::start_with(args).unwrap_or_else(|e| panic!("{e} (.ci/run installs memcached)"))
}

/// `shutdown` with `-A`: a bad mode is refused; `shutdown` closes the asking connection
/// without a reply and stops the server, in memcached and in kvlab (every I/O model).
#[test]
fn shutdown_with_dash_a_stops_the_server_as_memcached_does() {
    let before = b"shutdown foo\r\nshutdown graceful x\r\nshutdown noreply\r\nmn\r\n";
    let want_before: &[u8] = b"CLIENT_ERROR invalid shutdown mode\r\nCLIENT_ERROR invalid shutdown mode\r\nCLIENT_ERROR invalid shutdown mode\r\nMN\r\n";

    for mode in ["shutdown\r\n", "shutdown graceful\r\n"] {
        let mut mc = memcached(&["-A"]);
        let mut s = connect(mc.addr);
        assert_eq!(exchange(&mut s, before, b"MN\r\n"), want_before);
        let got = exchange(&mut s, mode.as_bytes(), b"<EOF>");
        assert!(
            got == b"<EOF>" || got == b"<RESET>",
            "memcached {mode:?}: {got:?}"
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while !mc.process.exited() {
            assert!(
                Instant::now() < deadline,
                "memcached still runs after {mode:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }

        for &io in IoModel::ALL {
            let (server, _clock) = start(io, |c| c.shutdown_command = true);
            let addr = server.addr();
            let mut s = connect(addr);
            assert_eq!(exchange(&mut s, before, b"MN\r\n"), want_before);
            let (tx, rx) = mpsc::channel();
            let waiter = std::thread::spawn(move || {
                server.wait();
                server.shutdown();
                let _ = tx.send(());
            });
            let got = exchange(&mut s, mode.as_bytes(), b"<EOF>");
            assert!(
                got == b"<EOF>" || got == b"<RESET>",
                "{} {mode:?}: {got:?}",
                io.name()
            );
            rx.recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("{}: the server did not stop on {mode:?}", io.name()));
            waiter.join().expect("waiter");
            assert!(
                std::net::TcpStream::connect(addr).is_err(),
                "still listening"
            );
        }
    }
}

/// Replaces every run of digits after `exp=`, `la=` and `cas=` with `N`: those are the
/// moment and the server's own counter.
fn mask(line: &str) -> String {
    line.split(' ')
        .map(|field| match field.split_once('=') {
            Some((k @ ("la" | "cas"), _)) => format!("{k}=N"),
            Some(("exp", v)) if v != "-1" => "exp=N".to_string(),
            _ => field.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn metadump(addr: std::net::SocketAddr, classes: &str) -> (BTreeSet<String>, Vec<u8>) {
    let mut s = connect(addr);
    let setup = b"set a:b 0 0 1\r\nx\r\nset big 5 100 1000\r\n".to_vec();
    let mut setup = setup;
    setup.extend(std::iter::repeat_n(b'v', 1000));
    setup.extend_from_slice(b"\r\nset k%20 0 0 300\r\n");
    setup.extend(std::iter::repeat_n(b'w', 300));
    setup.extend_from_slice(b"\r\nget a:b\r\n");
    assert_eq!(
        exchange(&mut s, &setup, b"END\r\n"),
        b"STORED\r\nSTORED\r\nSTORED\r\nVALUE a:b 0 1\r\nx\r\nEND\r\n"
    );
    // A fresh connection: memcached refuses a metadump behind replies not yet sent.
    let mut s = connect(addr);
    let got = exchange(
        &mut s,
        format!("lru_crawler metadump {classes}\r\n").as_bytes(),
        b"END\r\n",
    );
    let text = String::from_utf8_lossy(&got).into_owned();
    let body = text
        .strip_suffix("END\r\n")
        .unwrap_or_else(|| panic!("{text:?}"));
    let lines = body.split_terminator('\n').map(mask).collect();
    (lines, got)
}

/// `lru_crawler metadump`: one `key=… exp=… la=… cas=… fetch=… cls=… size=…` line per
/// item (`\n`-ended, keys URI-encoded), classes and sizes as memcached's, then `END`.
#[test]
fn metadump_lists_items_as_memcached_does() {
    let mc = memcached(&[]);
    let (server, clock) = start(IoModel::Reactor, |c| {
        c.crawler = Some(kvlab_server::CrawlerConfig {
            interval: Duration::from_secs(3600),
            ..kvlab_server::CrawlerConfig::default()
        })
    });
    for classes in ["all", "hash", "1,9", "1", "9", "12"] {
        let (got, raw) = metadump(server.addr(), classes);
        // memcached's crawler can pass over an item its LRU maintainer is moving at that
        // moment (the one just fetched): asked again, it lists it.
        let mut want = metadump(mc.addr, classes).0;
        for _ in 0..50 {
            if want == got {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
            want = metadump(mc.addr, classes).0;
        }
        assert_eq!(got, want, "metadump {classes}");
        if classes == "all" {
            assert_eq!(want.len(), 3, "{want:?}");
            // Times are the store clock's, absolute.
            let raw = String::from_utf8_lossy(&raw).into_owned();
            assert!(raw.contains(&format!("la={T0} ")), "{raw}");
            assert!(raw.contains(&format!("exp={} ", T0 + 100)), "{raw}");
        }
    }
    let _ = clock;
    // With the crawler off, both refuse.
    let mc = memcached(&["-o", "no_lru_crawler"]);
    let (server, _clock) = start(IoModel::Reactor, |c| c.crawler = None);
    for addr in [mc.addr, server.addr()] {
        let mut s = connect(addr);
        assert_eq!(
            exchange(
                &mut s,
                b"lru_crawler metadump all\r\nlru_crawler crawl all\r\n",
                b"disabled\r\nCLIENT_ERROR lru crawler disabled\r\n"
            ),
            b"CLIENT_ERROR lru crawler disabled\r\nCLIENT_ERROR lru crawler disabled\r\n"
        );
    }
}

/// `cache_memlimit` changes `limit_maxbytes` and `stats settings`' `maxbytes` at once,
/// and a lower limit evicts down to it.
#[test]
fn cache_memlimit_changes_the_limit_at_run_time() {
    let (server, _clock) = start(IoModel::Reactor, |c| c.memory_limit = 64 << 20);
    let mut s = connect(server.addr());
    let value = vec![b'v'; 100_000];
    for i in 0..300 {
        let mut req = format!("set k{i} 0 0 {}\r\n", value.len()).into_bytes();
        req.extend_from_slice(&value);
        req.extend_from_slice(b"\r\n");
        assert_eq!(exchange(&mut s, &req, b"\r\n"), b"STORED\r\n");
    }
    let stats = server.store().stats();
    assert_eq!(stats.curr_items, 300);
    assert_eq!(
        exchange(&mut s, b"cache_memlimit 8\r\n", b"\r\n"),
        b"OK\r\n"
    );
    let stats = server.store().stats();
    assert_eq!(stats.limit_maxbytes, 8 << 20);
    assert!(stats.bytes <= 8 << 20, "{}", stats.bytes);
    assert!(
        stats.curr_items <= 84 && stats.evictions >= 216,
        "{stats:?}"
    );
    let settings = exchange(&mut s, b"stats settings\r\n", b"END\r\n");
    let settings = String::from_utf8_lossy(&settings);
    assert!(settings.contains("STAT maxbytes 8388608\r\n"), "{settings}");
    let all = exchange(&mut s, b"stats\r\n", b"END\r\n");
    assert!(String::from_utf8_lossy(&all).contains("STAT limit_maxbytes 8388608\r\n"));
}

/// Reads `stat`'s value from `stats`.
fn stat(addr: std::net::SocketAddr, name: &str) -> Option<String> {
    let mut s = connect(addr);
    let all = exchange(&mut s, b"stats\r\n", b"END\r\n");
    let all = String::from_utf8_lossy(&all).into_owned();
    all.lines()
        .find_map(|l| l.strip_prefix(&format!("STAT {name} ")).map(str::to_string))
}

/// `-o idle_timeout=1`: a connection holding half a command is closed without a word and
/// counted in `idle_kicks`; the server goes on serving others. As memcached, under every
/// I/O model.
#[test]
fn idle_connections_are_closed_after_the_idle_timeout() {
    let mc = memcached(&["-o", "idle_timeout=1"]);
    let servers = every_model(|c| c.idle_timeout = Some(Duration::from_secs(1)));
    let addrs = beside_memcached(mc.addr, &servers);
    for (name, addr) in addrs {
        assert_eq!(stat(addr, "idle_kicks").as_deref(), Some("0"), "{name}");
        let mut idle = connect(addr);
        idle.set_read_timeout(Some(Duration::from_secs(15)))
            .expect("timeout");
        // Half a command, then nothing: closed after a second or two.
        let got = exchange(&mut idle, b"get k", b"<EOF>");
        assert!(got == b"<EOF>" || got == b"<RESET>", "{name}: {got:?}");
        assert_eq!(stat(addr, "idle_kicks").as_deref(), Some("1"), "{name}");
        let mut s = connect(addr);
        let settings = exchange(&mut s, b"stats settings\r\n", b"END\r\n");
        assert!(
            String::from_utf8_lossy(&settings).contains("STAT idle_timeout 1\r\n"),
            "{name}"
        );
    }
}

/// `-o read_buf_mem_limit=1` (MB): a multi-get whose reply would pass the limit is
/// answered `SERVER_ERROR out of memory writing get response` and counted in
/// `response_obj_oom`, and the connection serves on; a connection whose stacked replies pass
/// it is closed. As memcached (whose limit is on response objects, one a key or a request:
/// 500 keys of 4 KB, or 500 values of 40 KB, pass it in both), under every I/O model.
#[test]
fn replies_past_read_buf_mem_limit_are_refused_as_memcached_does() {
    let mc = memcached(&["-o", "read_buf_mem_limit=1", "-R", "500"]);
    let servers = every_model(|c| {
        c.accepted.read_buf_mem_limit = 1 << 20;
        c.accepted.reqs_per_event = Some(500);
    });
    let mut setup = Vec::new();
    for (prefix, len) in [("k", 4_000), ("w", 40_000)] {
        let value = "v".repeat(len);
        for i in 0..500 {
            setup.extend(format!("set {prefix}{i} 0 0 {len} noreply\r\n{value}\r\n").bytes());
        }
    }
    setup.extend(b"mn\r\n");
    let keys: String = (0..500).map(|i| format!(" k{i}")).collect();
    let big_get = format!("get{keys}\r\n");
    let value = "v".repeat(4_000);
    let small = format!("VALUE k1 0 4000\r\n{value}\r\nVALUE k2 0 4000\r\n{value}\r\nEND\r\n");
    let stacked: Vec<u8> = (0..500)
        .flat_map(|i| format!("mg w{i} v\r\n").into_bytes())
        .collect();
    for (name, addr) in beside_memcached(mc.addr, &servers) {
        let mut s = connect(addr);
        assert_eq!(exchange(&mut s, &setup, b"MN\r\n"), b"MN\r\n", "{name}");
        let got = exchange(&mut s, big_get.as_bytes(), b"\r\n");
        assert!(
            got == b"SERVER_ERROR out of memory writing get response\r\n",
            "{name}: {} bytes: {:?}…",
            got.len(),
            String::from_utf8_lossy(&got[..got.len().min(60)])
        );
        assert_eq!(
            exchange(&mut s, b"get k1 k2\r\n", b"END\r\n"),
            small.as_bytes(),
            "{name}"
        );
        assert_eq!(
            stat(addr, "response_obj_oom").as_deref(),
            Some("1"),
            "{name}"
        );
        let held = stat(addr, "read_buf_bytes").and_then(|v| v.parse::<u64>().ok());
        assert!(
            held.is_some_and(|b| b > 0),
            "{name}: read_buf_bytes {held:?}"
        );
        // memcached closes at once; kvlab writes the replies before the refused one.
        let mut t = connect(addr);
        t.set_read_timeout(Some(Duration::from_secs(15)))
            .expect("timeout");
        let got = exchange(&mut t, &stacked, b"<EOF>");
        // Closed with requests unread: the close may come as a reset.
        let closed = got.ends_with(b"<EOF>") || got.ends_with(b"<RESET>");
        assert!(closed, "{name}: {:?}", &got[got.len().saturating_sub(40)..]);
        let served = got.windows(9).filter(|w| w == b"VA 40000 ").count();
        assert!(
            served < 100,
            "{name}: {served} of 500 served before the close"
        );
        assert_eq!(
            stat(addr, "response_obj_oom").as_deref(),
            Some("2"),
            "{name}"
        );
        // The connection that asked first still serves.
        assert_eq!(exchange(&mut s, b"mn\r\n", b"MN\r\n"), b"MN\r\n", "{name}");
    }
}

/// Masks what differs by moment and socket: `ts=`, `gid=`, `cfd=`.
fn mask_log(line: &str) -> String {
    line.split(' ')
        .map(|field| match field.split_once('=') {
            Some((k @ ("ts" | "gid" | "cfd"), _)) => format!("{k}=N"),
            _ => field.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Starts a watcher of `streams` on `addr`, runs `commands` on another connection (their
/// replies ending with `MN`), and returns the watcher's lines (masked) once `lines` came.
fn watch(
    addr: std::net::SocketAddr,
    streams: &str,
    setup: &[u8],
    commands: &[u8],
    lines: usize,
) -> Vec<String> {
    let mut c = connect(addr);
    let mut setup = setup.to_vec();
    setup.extend_from_slice(b"mn\r\n");
    exchange(&mut c, &setup, b"MN\r\n");
    let mut w = connect(addr);
    assert_eq!(
        exchange(&mut w, format!("watch {streams}\r\n").as_bytes(), b"\r\n"),
        b"OK\r\n"
    );
    let mut commands = commands.to_vec();
    commands.extend_from_slice(b"mn\r\n");
    exchange(&mut c, &commands, b"MN\r\n");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while got.iter().filter(|&&b| b == b'\n').count() < lines {
        use std::io::Read;
        match w.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&got)
        .lines()
        .map(mask_log)
        .collect()
}

/// `watch fetchers` and `watch mutations`: memcached's line for each item fetch and each
/// store, under every I/O model; `watch` behind an unsent reply and an unknown stream are
/// refused as memcached refuses them.
#[test]
fn watch_streams_log_lines_as_memcached_does() {
    let mc = memcached(&[]);
    let servers = every_model(|_| {});
    let addrs = beside_memcached(mc.addr, &servers);
    let setup = b"set w:k 5 0 3\r\nabc\r\nset big 0 0 500\r\n"
        .iter()
        .copied()
        .chain(std::iter::repeat_n(b'b', 500))
        .chain(*b"\r\n")
        .collect::<Vec<u8>>();
    let mut want = None;
    for (name, addr) in &addrs {
        let fetches = watch(
            *addr,
            "fetchers",
            &setup,
            b"get w:k nokey big\r\nmg w:k v\r\nmg nope v\r\n",
            5,
        );
        let stores = watch(
            *addr,
            "mutations",
            b"",
            b"set w:n 0 100 2\r\nhi\r\nadd w:n 3 0 1\r\nx\r\nms w:m 4 T0 F9\r\nabcd\r\ncas w:n 0 0 1 1\r\ny\r\nreplace nope 0 0 1\r\nz\r\n",
            5,
        );
        let got = (fetches, stores);
        match &want {
            None => want = Some(got),
            Some(w) => assert_eq!(&got, w, "{name}"),
        }
        let mut c = connect(*addr);
        assert_eq!(
            exchange(&mut c, b"watch bogus\r\nmn\r\n", b"MN\r\n"),
            b"ERROR\r\nMN\r\n",
            "{name}"
        );
        if *name != "memcached" {
            // memcached refuses a `watch` behind replies it has not sent yet; kvlab sends
            // them first, then turns the connection into the stream.
            let mut c = connect(*addr);
            let got = exchange(&mut c, b"version\r\nwatch fetchers\r\n", b"OK\r\n");
            assert!(got.starts_with(b"VERSION "), "{name}: {got:?}");
        }
    }
    let (fetches, stores) = want.expect("lines");
    assert_eq!(
        fetches,
        [
            "ts=N gid=N type=item_get key=w%3Ak status=found clsid=1 cfd=N size=3",
            "ts=N gid=N type=item_get key=nokey status=not_found clsid=0 cfd=N size=0",
            "ts=N gid=N type=item_get key=big status=found clsid=9 cfd=N size=500",
            "ts=N gid=N type=item_get key=w%3Ak status=found clsid=1 cfd=N size=3",
            "ts=N gid=N type=item_get key=nope status=not_found clsid=0 cfd=N size=0",
        ]
    );
    assert_eq!(stores.len(), 5, "{stores:?}");
    assert!(
        stores[0].contains("key=w%3An status=stored cmd=set ttl=100 clsid=1"),
        "{stores:?}"
    );
}

/// The `items:<class>:<name>` (or `<class>:<name>`) lines of `stats <group>` whose name is
/// in `names`.
fn class_lines(addr: std::net::SocketAddr, group: &str, names: &[&str]) -> BTreeSet<String> {
    let mut s = connect(addr);
    let all = exchange(&mut s, format!("stats {group}\r\n").as_bytes(), b"END\r\n");
    String::from_utf8_lossy(&all)
        .lines()
        .filter(|l| {
            l.rsplit_once(' ')
                .and_then(|(head, _)| head.rsplit(':').next())
                .is_some_and(|name| names.contains(&name))
        })
        .map(str::to_string)
        .collect()
}

fn store_sizes(addr: std::net::SocketAddr) {
    let mut s = connect(addr);
    let mut req = Vec::new();
    for (i, len) in [1usize, 10, 40, 41, 100, 500, 1000, 5000, 70_000]
        .into_iter()
        .enumerate()
    {
        for copy in 0..=i % 3 {
            let flags = if copy == 1 { 7 } else { 0 };
            req.extend_from_slice(format!("set key{i}:{copy} {flags} 0 {len}\r\n").as_bytes());
            req.extend(std::iter::repeat_n(b'v', len));
            req.extend_from_slice(b"\r\n");
        }
    }
    req.extend_from_slice(b"mn\r\n");
    let got = exchange(&mut s, &req, b"MN\r\n");
    assert!(!String::from_utf8_lossy(&got).contains("ERROR"));
}

/// `stats items` and `stats slabs` count each item in memcached's class for its size
/// (with `-f` and `-n` too): the same classes, numbers, requested bytes and chunk sizes.
#[test]
fn per_class_stats_name_memcacheds_classes() {
    for (f, n) in [(1.25, 48u32), (2.0, 100)] {
        let (fs, ns) = (f.to_string(), n.to_string());
        let mc = memcached(&["-f", &fs, "-n", &ns]);
        let (server, _clock) = start(IoModel::Reactor, |c| {
            c.growth_factor = f;
            c.chunk_size = n;
        });
        store_sizes(mc.addr);
        store_sizes(server.addr());
        // (`number_cold` follows memcached's LRU maintainer thread: a matter of timing.)
        let items = ["number", "mem_requested", "evicted"];
        let slabs = [
            "chunk_size",
            "chunks_per_page",
            "used_chunks",
            "total_pages",
        ];
        let want = class_lines(mc.addr, "items", &items);
        assert!(want.len() >= 6 * 3, "{want:?}");
        assert_eq!(
            class_lines(server.addr(), "items", &items),
            want,
            "-f {f} -n {n}"
        );
        let want = class_lines(mc.addr, "slabs", &slabs);
        assert_eq!(
            class_lines(server.addr(), "slabs", &slabs),
            want,
            "-f {f} -n {n}"
        );
        let mut s = connect(server.addr());
        let settings = exchange(&mut s, b"stats settings\r\n", b"END\r\n");
        let settings = String::from_utf8_lossy(&settings);
        assert!(
            settings.contains(&format!("STAT chunk_size {n}\r\n")),
            "{settings}"
        );
        assert!(
            settings.contains(&format!("STAT growth_factor {f:.2}\r\n")),
            "{settings}"
        );
    }
}

/// Evictions are counted in the class of the evicted item (`items:<class>:evicted`), as
/// in memcached, and `watch evictions` logs each one.
#[test]
fn evictions_are_counted_in_the_evicted_items_class() {
    let mc = memcached(&["-m", "8"]);
    let (server, _clock) = start(IoModel::Reactor, |c| c.memory_limit = 8 << 20);
    let mut w = connect(server.addr());
    assert_eq!(exchange(&mut w, b"watch evictions\r\n", b"\r\n"), b"OK\r\n");
    for addr in [mc.addr, server.addr()] {
        let mut s = connect(addr);
        let value = vec![b'e'; 2000];
        for i in 0..6000 {
            let mut req = format!("set ev{i} 0 0 {}\r\n", value.len()).into_bytes();
            req.extend_from_slice(&value);
            req.extend_from_slice(b"\r\n");
            assert_eq!(exchange(&mut s, &req, b"\r\n"), b"STORED\r\n");
        }
        let evicted = class_lines(addr, "items", &["evicted"]);
        // 2000-byte values (2065-byte items) are class 15's (2320-byte chunks) only.
        assert_eq!(evicted.len(), 1, "{evicted:?}");
        let line = evicted.iter().next().expect("a line");
        assert!(line.starts_with("STAT items:15:evicted "), "{line}");
        let n: u64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .expect("n");
        assert!(n > 1000, "{line}");
    }
    let total = server.store().stats().evictions;
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    while got.iter().filter(|&&b| b == b'\n').count() < total as usize {
        use std::io::Read;
        match w.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&got);
    let first = text.lines().next().expect("an eviction line");
    assert_eq!(
        mask_log(first).split(" key=").next(),
        Some("ts=N gid=N type=eviction"),
        "{first}"
    );
    assert!(
        first.ends_with(" fetch=no ttl=-1 la=0 clsid=15 size=2000"),
        "{first}"
    );
    assert_eq!(text.lines().count() as u64, total);
}

/// Opens connections (at most 64) until one is refused; returns how many were served and
/// the refused one's bytes.
fn fill(addr: std::net::SocketAddr) -> (usize, Vec<u8>) {
    let mut open = Vec::new();
    for _ in 0..64 {
        let mut s = connect(addr);
        let got = exchange(&mut s, b"version\r\n", b"\r\n");
        if got.starts_with(b"VERSION ") {
            open.push(s);
            continue;
        }
        let mut got = got;
        got.extend(read_until(&mut s, b"<EOF>"));
        return (open.len(), got);
    }
    (open.len(), Vec::new())
}

/// Over `-c`: `ERROR Too many open connections`, then the close, as memcached answers.
/// (memcached counts its own descriptors against `-c` too, so it serves fewer clients
/// than the number; kvlab serves exactly `-c` clients.)
#[test]
fn connections_over_the_limit_are_refused_as_memcached_refuses_them() {
    let mc = memcached(&["-c", "30"]);
    let (served, refused) = fill(mc.addr);
    assert!(served >= 1, "{served}");
    // The close may come as a reset: the refused client's request is left unread.
    let refusal = |got: &[u8]| {
        got == b"ERROR Too many open connections\r\n<EOF>"
            || got == b"ERROR Too many open connections\r\n<RESET>"
    };
    assert!(refusal(&refused), "{:?}", String::from_utf8_lossy(&refused));
    for &io in IoModel::ALL {
        let (server, _clock) = start(io, |c| c.max_connections = 5);
        let (served, refused) = fill(server.addr());
        assert_eq!(served, 5, "{}", io.name());
        assert!(
            refusal(&refused),
            "{}: {:?}",
            io.name(),
            String::from_utf8_lossy(&refused)
        );
    }
}

/// `-Y`: before a `set` with `user password` as its data, every request is refused with
/// memcached's words (bad input too) and changes nothing; a wrong password is refused and
/// counted; afterwards everything works. Compared with memcached `-Y`, every I/O model.
#[test]
fn ascii_auth_refuses_everything_until_a_user_authenticates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("auth");
    std::fs::write(&file, "alice:s3cret\nbob:hunter2\n").expect("write");
    let mc = memcached(&["-Y", file.to_str().expect("utf-8")]);
    let users = kvlab_server::auth::AuthFile::load(&file).expect("loads");
    let servers = every_model(|c| c.auth = Some(users.clone()));
    let addrs = beside_memcached(mc.addr, &servers);
    // One at a time: memcached loses all but the last of several refusals pipelined in one
    // read (they overwrite each other); kvlab answers each.
    let before: [(&[u8], &[u8]); 7] = [
        (b"get k\r\n", b"CLIENT_ERROR unauthenticated\r\n"),
        (b"version\r\n", b"CLIENT_ERROR unauthenticated\r\n"),
        (b"bogus\r\n", b"CLIENT_ERROR unauthenticated\r\n"),
        (b"delete k noreply\r\n", b"CLIENT_ERROR unauthenticated\r\n"),
        (
            b"set k 0 0 12\r\nalice wrong!\r\n",
            b"CLIENT_ERROR authentication failure\r\n",
        ),
        (
            b"set k 0 0 5\r\nalice\r\n",
            b"CLIENT_ERROR bad authentication token format\r\n",
        ),
        (
            b"set k 0 0 1 noreply\r\nx\r\n",
            b"CLIENT_ERROR bad authentication token format\r\n",
        ),
    ];
    let login: &[u8] = b"set anykey 0 0 11\r\nbob hunter2\r\n";
    for (name, addr) in addrs {
        let mut s = connect(addr);
        for (req, want) in before {
            let got = exchange(&mut s, req, b"\r\n");
            assert_eq!(
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(want),
                "{name}: {}",
                String::from_utf8_lossy(req)
            );
        }
        assert_eq!(exchange(&mut s, login, b"\r\n"), b"STORED\r\n", "{name}");
        assert_eq!(
            exchange(&mut s, b"set k 0 0 1\r\nv\r\nget k anykey\r\n", b"END\r\n"),
            b"STORED\r\nVALUE k 0 1\r\nv\r\nEND\r\n",
            "{name}: the auth set stored nothing"
        );
        let stats = exchange(&mut s, b"stats\r\n", b"END\r\n");
        let stats = String::from_utf8_lossy(&stats);
        assert!(stats.contains("STAT auth_cmds 2\r\n"), "{name}: {stats}");
        assert!(stats.contains("STAT auth_errors 1\r\n"), "{name}: {stats}");
    }
}

/// `stats conns` as memcached lists it: the listening socket, then each connection by
/// descriptor (`addr`, `listen_addr`, `state`, `secs_since_last_cmd`), the asking one
/// `conn_parse_cmd`, a watcher `conn_watch`; and the descriptor it gives a connection is
/// the `cfd=` of that connection's `watch` lines, where a `set` logs its lookup first.
#[test]
fn stats_conns_lists_connections_by_descriptor_as_memcached_does() {
    let mc = memcached(&[]);
    let servers = every_model(|_| {});
    let addrs = beside_memcached(mc.addr, &servers);
    for (name, addr) in addrs {
        // `stats conns` on `c`: its lines, and the descriptor of the asking connection (the
        // last one listed in a server of its own, as memcached's tests read it; here the
        // test's other servers share the process's descriptors).
        let conns = |c: &mut std::net::TcpStream| -> (Vec<String>, String) {
            let reply = exchange(c, b"stats conns\r\n", b"END\r\n");
            let lines: Vec<String> = String::from_utf8_lossy(&reply)
                .lines()
                .filter_map(|l| l.strip_prefix("STAT "))
                .map(str::to_string)
                .collect();
            let asking = lines
                .iter()
                .find_map(|l| l.strip_suffix(":state conn_parse_cmd"))
                .expect("the asking connection")
                .to_string();
            (lines, asking)
        };
        let mut first = connect(addr);
        let (lines, fd1) = conns(&mut first);
        let port = first.local_addr().expect("local").port();
        let listen = format!("tcp:127.0.0.1:{}", addr.port());
        // The listener, by its descriptor: lines are in descriptor order, and in this
        // process a connection may have a lower descriptor than a server's listener (the
        // test's servers share the descriptors, and reuse those freed).
        let listener = lines
            .iter()
            .position(|l| l.ends_with(&format!(":addr {listen}")))
            .unwrap_or_else(|| panic!("{name}: no listener in {lines:?}"));
        let lfd = lines[listener].split(':').next().expect("a descriptor");
        assert_eq!(
            lines.get(listener + 1),
            Some(&format!("{lfd}:state conn_listening")),
            "{name}: {lines:?}"
        );
        let mine: Vec<&String> = lines
            .iter()
            .filter(|l| l.starts_with(&format!("{fd1}:")))
            .collect();
        assert_eq!(
            mine,
            [
                &format!("{fd1}:addr tcp:127.0.0.1:{port}"),
                &format!("{fd1}:listen_addr {listen}"),
                &format!("{fd1}:state conn_parse_cmd"),
                &format!("{fd1}:secs_since_last_cmd 0"),
            ],
            "{name}"
        );
        let mut watcher = connect(addr);
        assert_eq!(
            exchange(&mut watcher, b"watch fetchers mutations\r\n", b"\r\n"),
            b"OK\r\n",
            "{name}"
        );
        assert_eq!(
            exchange(
                &mut first,
                b"set foo 0 0 5 noreply\r\nhello\r\nmn\r\n",
                b"MN\r\n"
            ),
            b"MN\r\n"
        );
        let mut second = connect(addr);
        let (lines, fd2) = conns(&mut second);
        assert!(
            lines.iter().any(|l| l.ends_with(":state conn_watch")),
            "{name}: {lines:?}"
        );
        exchange(&mut second, b"get foo\r\n", b"END\r\n");
        let mut got = Vec::new();
        while got.iter().filter(|&&b| b == b'\n').count() < 3 {
            use std::io::Read;
            let mut buf = [0u8; 4096];
            match watcher.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        let logged = String::from_utf8_lossy(&got)
            .lines()
            .map(|l| {
                let kept: Vec<&str> = l
                    .split(' ')
                    .filter(|f| {
                        ["type=", "key=", "status=", "cfd="]
                            .iter()
                            .any(|p| f.starts_with(p))
                    })
                    .collect();
                kept.join(" ")
            })
            .collect::<Vec<_>>();
        // Each connection's lines in order (memcached's worker threads log to buffers of
        // their own, so two connections' lines may come in either order).
        let of = |fd: &str| -> Vec<&String> {
            let cfd = format!("cfd={fd}");
            logged.iter().filter(|l| l.ends_with(&cfd)).collect()
        };
        assert_eq!(
            of(&fd1),
            [
                &format!("type=item_get key=foo status=not_found cfd={fd1}"),
                &format!("type=item_store key=foo status=stored cfd={fd1}"),
            ],
            "{name}: {logged:?}"
        );
        assert_eq!(
            of(&fd2),
            [&format!("type=item_get key=foo status=found cfd={fd2}")],
            "{name}: {logged:?}"
        );
    }
}
