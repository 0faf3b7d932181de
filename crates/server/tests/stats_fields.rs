//! `stats`, `stats settings`, `stats cachedump` and `stats slabs`' `total_malloced`
//! against memcached 1.6 itself: every field memcached lists, kvlab lists, in its order
//! (extstore's `ext_*` settings aside: kvlab has no extstore), `cachedump`
//! answers and refuses as memcached does, and `total_malloced` counts slab pages.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;

use common::*;
use kvlab_server::IoModel;
use kvlab_testkit::wire::{case, run_cases, SAME};
use kvlab_testkit::Memcached;

fn memcached() -> Memcached {
    Memcached::start_with(&["-m", "64"])
        .unwrap_or_else(|e| panic!("{e} (.ci/run installs Debian's memcached)"))
}

/// The names of a `stats …` reply's `STAT <name> <value>` lines.
fn names(addr: SocketAddr, request: &str) -> BTreeSet<String> {
    ordered_names(addr, request).into_iter().collect()
}

fn stat(addr: SocketAddr, request: &str, name: &str) -> String {
    let mut s = connect(addr);
    let reply = exchange(&mut s, request.as_bytes(), b"END\r\n");
    String::from_utf8_lossy(&reply)
        .lines()
        .find_map(|l| l.strip_prefix(&format!("STAT {name} ")))
        .unwrap_or_else(|| panic!("no {name}"))
        .to_owned()
}

/// The names of a `stats …` reply's lines, in order.
fn ordered_names(addr: SocketAddr, request: &str) -> Vec<String> {
    let mut s = connect(addr);
    let reply = exchange(&mut s, request.as_bytes(), b"END\r\n");
    String::from_utf8_lossy(&reply)
        .lines()
        .filter_map(|l| l.strip_prefix("STAT "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_owned)
        .collect()
}

/// `stats` lists memcached's fields in memcached's order, those of the crawler and the
/// LRU maintainer only while memcached would list them; kvlab's own are in `stats kvlab`.
#[test]
fn stats_lists_memcached_s_fields_in_its_order() {
    // memcached's defaults (crawler and LRU maintainer on), and what its stats.t runs
    // with.
    let configs: [(&[&str], bool, bool); 2] = [
        (&["-m", "64"], true, true),
        (
            &["-m", "64", "-o", "no_lru_crawler,no_lru_maintainer"],
            false,
            false,
        ),
    ];
    for (args, crawler, maintainer) in configs {
        let mc = Memcached::start_with(args)
            .unwrap_or_else(|e| panic!("{e} (.ci/run installs Debian's memcached)"));
        let (server, _clock) = start(IoModel::Reactor, |c| {
            c.crawler = crawler.then(kvlab_server::CrawlerConfig::default);
            c.accepted.lru_maintainer = maintainer;
        });
        assert_eq!(
            ordered_names(server.addr(), "stats\r\n"),
            ordered_names(mc.addr, "stats\r\n"),
            "memcached {args:?}"
        );
        let maintainer_thread = |addr| stat(addr, "stats settings\r\n", "lru_maintainer_thread");
        assert_eq!(
            maintainer_thread(server.addr()),
            maintainer_thread(mc.addr),
            "memcached {args:?}"
        );
    }
    let (server, _clock) = start(IoModel::Reactor, |_| {});
    assert_eq!(
        ordered_names(server.addr(), "stats kvlab\r\n"),
        [
            "protocol_errors",
            "cluster_redirects",
            "service_time_samples",
            "service_time_p50_us",
            "service_time_p90_us",
            "service_time_p99_us",
            "service_time_p999_us",
            "service_time_max_us"
        ]
    );
}

#[test]
fn stats_and_settings_list_every_field_memcached_lists() {
    let mc = memcached();
    let (server, _clock) = start(IoModel::Reactor, |c| {
        c.crawler = Some(kvlab_server::CrawlerConfig::default());
    });
    let (ours, theirs) = (
        names(server.addr(), "stats\r\n"),
        names(mc.addr, "stats\r\n"),
    );
    let missing: Vec<_> = theirs.difference(&ours).collect();
    assert!(missing.is_empty(), "stats lacks {missing:?}");
    let ours = names(server.addr(), "stats settings\r\n");
    let theirs = names(mc.addr, "stats settings\r\n");
    let missing: Vec<_> = theirs
        .difference(&ours)
        .filter(|n| !n.starts_with("ext_"))
        .collect();
    assert!(missing.is_empty(), "stats settings lacks {missing:?}");
    assert_eq!(
        stat(server.addr(), "stats settings\r\n", "tcp_backlog"),
        "1024"
    );
}

#[test]
fn cachedump_answers_as_memcached() {
    let table = || {
        vec![
        case(
            "cachedump: a missing argument",
            b"stats cachedump 1\r\nstats cachedump\r\n",
            b"CLIENT_ERROR bad command line\r\nCLIENT_ERROR bad command line\r\n",
            SAME,
        ),
        case(
            "cachedump: not unsigned numbers",
            b"stats cachedump x 1\r\nstats cachedump -1 1\r\nstats cachedump 1 -1\r\nstats cachedump 1.5 1\r\n",
            b"CLIENT_ERROR bad command line format\r\nCLIENT_ERROR bad command line format\r\nCLIENT_ERROR bad command line format\r\nCLIENT_ERROR bad command line format\r\n",
            SAME,
        ),
        case(
            "cachedump: a class past 63",
            b"stats cachedump 64 1\r\nstats cachedump 99999999999 0\r\n",
            b"CLIENT_ERROR Illegal slab id\r\nCLIENT_ERROR Illegal slab id\r\n",
            SAME,
        ),
        case(
            "cachedump: an empty class",
            b"stats cachedump 0 1\r\nstats cachedump 63 0 extra\r\n",
            b"END\r\nEND\r\n",
            SAME,
        ),
        ]
    };
    let (server, _clock) = start(IoModel::Reactor, |_| {});
    let failures = run_cases(server.addr(), table(), false);
    assert!(failures.is_empty(), "kvlab: {failures:#?}");
    let mc = memcached();
    let failures = run_cases(mc.addr, table(), true);
    assert!(failures.is_empty(), "memcached: {failures:#?}");

    // memcached lists its class's cold LRU (items reach it only when its LRU maintainer
    // moves them), so the listing is checked on kvlab alone: every item of the class, in
    // the store's order.
    let mut s = connect(server.addr());
    exchange(
        &mut s,
        b"set a 0 0 1\r\nx\r\nset b 0 0 1\r\ny\r\nset c 0 1900000000 2\r\nzz\r\n",
        b"STORED\r\nSTORED\r\nSTORED\r\n",
    );
    let reply = exchange(&mut s, b"stats cachedump 1 0\r\n", b"END\r\n");
    let mut lines: Vec<_> = String::from_utf8_lossy(&reply)
        .lines()
        .map(str::to_owned)
        .collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "END",
            "ITEM a [1 b; 0 s]",
            "ITEM b [1 b; 0 s]",
            "ITEM c [2 b; 1900000000 s]"
        ]
    );
    let reply = exchange(&mut s, b"stats cachedump 1 1\r\n", b"END\r\n");
    assert_eq!(String::from_utf8_lossy(&reply).lines().count(), 2);
}

#[test]
fn total_malloced_counts_slab_pages_as_memcached() {
    let value = "x".repeat(5000);
    let req =
        format!("set a 0 0 1\r\nx\r\nset b 0 0 5000\r\n{value}\r\nset c 0 0 5000\r\n{value}\r\n");
    let mc = memcached();
    let (server, _clock) = start(IoModel::Reactor, |_| {});
    for addr in [server.addr(), mc.addr] {
        let mut s = connect(addr);
        exchange(&mut s, req.as_bytes(), b"STORED\r\nSTORED\r\nSTORED\r\n");
    }
    let ours = stat(server.addr(), "stats slabs\r\n", "total_malloced");
    let theirs = stat(mc.addr, "stats slabs\r\n", "total_malloced");
    assert_eq!(ours, theirs, "two classes with items: two 1 MiB pages");
    assert_eq!(ours, "2097152");
}

/// Stores the same items in both servers: classes 1, 5, 12 and 17 (flags or not).
fn store_classes(addr: SocketAddr) {
    let mut s = connect(addr);
    let mut req = Vec::new();
    for (key, flags, len) in [("a", 0, 1), ("b", 3, 200), ("c", 0, 900), ("d", 9, 3000)] {
        req.extend_from_slice(format!("set {key} {flags} 0 {len}\r\n").as_bytes());
        req.extend(std::iter::repeat_n(b'v', len));
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"mn\r\n");
    let got = exchange(&mut s, &req, b"MN\r\n");
    assert_eq!(got, [&b"STORED\r\n".repeat(4)[..], b"MN\r\n"].concat());
}

/// `stats items` lists memcached 1.6's fields per class in its order (28 with the LRU
/// maintainer, memcached's default; 14 without), and `stats slabs` its per-class fields
/// (the command counters included) and totals, for the same items.
#[test]
fn stats_items_and_slabs_list_memcacheds_fields_in_its_order() {
    let configs: [(&[&str], bool); 2] = [
        (&["-m", "64"], true),
        (&["-m", "64", "-o", "no_lru_maintainer"], false),
    ];
    for (args, maintainer) in configs {
        let mc = Memcached::start_with(args)
            .unwrap_or_else(|e| panic!("{e} (.ci/run installs Debian's memcached)"));
        let (server, _clock) = start(IoModel::Reactor, |c| {
            c.accepted.lru_maintainer = maintainer;
        });
        store_classes(mc.addr);
        store_classes(server.addr());
        for group in ["stats items\r\n", "stats slabs\r\n"] {
            let theirs = ordered_names(mc.addr, group);
            assert_eq!(
                ordered_names(server.addr(), group),
                theirs,
                "memcached {args:?}: {group}"
            );
            if group == "stats items\r\n" {
                let per_class = if maintainer { 28 } else { 14 };
                assert_eq!(theirs.len(), 4 * per_class, "{theirs:?}");
            }
        }
    }
}

/// The `STAT <name> <value>` lines of a reply whose name ends in one of `names`
/// (`<class>:get_hits`, `active_slabs`, …), as a sorted list.
fn lines_named(addr: SocketAddr, request: &str, names: &[&str]) -> Vec<String> {
    let mut s = connect(addr);
    let reply = exchange(&mut s, request.as_bytes(), b"END\r\n");
    let mut lines: Vec<String> = String::from_utf8_lossy(&reply)
        .lines()
        .filter(|l| {
            let name = l.split(' ').nth(1).unwrap_or("");
            names.iter().any(|n| name.rsplit(':').next() == Some(n))
        })
        .map(str::to_owned)
        .collect();
    lines.sort();
    lines
}

/// `items:<class>:hits_to_<segment>` summed per class: memcached counts a hit in the
/// segment the item is in (fresh items are hot), kvlab in its one LRU (cold).
fn lru_hits(addr: SocketAddr) -> Vec<(String, u64)> {
    let mut s = connect(addr);
    let reply = exchange(&mut s, b"stats items\r\n", b"END\r\n");
    let mut hits = std::collections::BTreeMap::new();
    for l in String::from_utf8_lossy(&reply).lines() {
        let mut words = l.split(' ').skip(1);
        let (Some(name), Some(v)) = (words.next(), words.next()) else {
            continue;
        };
        let mut parts = name.split(':');
        let (Some("items"), Some(class), Some(field)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if field.starts_with("hits_to_") {
            *hits.entry(class.to_owned()).or_insert(0) += v.parse::<u64>().expect("a number");
        }
    }
    hits.into_iter().collect()
}

/// The same requests move `stats slabs`' per-class counters (`get_hits` … `touch_hits`)
/// and the totals as memcached's, and `stats items`' hits by class: text and meta
/// commands, hits and misses, a compare that matches and one that does not, a storage
/// command that stores nothing (still an item made: `cmd_set`), one over the item size
/// (none made), a stale-marking `md I` (no delete hit).
#[test]
fn per_class_counters_move_as_memcacheds() {
    let mc = memcached();
    let (server, _clock) = start(IoModel::Reactor, |_| {});
    let big = "x".repeat(2000);
    let huge = "h".repeat(1024 * 1024 + 1);
    let steps: Vec<(String, &[u8])> = vec![
        ("set a 0 0 1\r\n1\r\n".into(), b"STORED\r\n"),
        (format!("set b 5 0 2000\r\n{big}\r\n"), b"STORED\r\n"),
        ("add a 0 0 1\r\n2\r\n".into(), b"NOT_STORED\r\n"),
        ("get a b zz\r\n".into(), b"END\r\n"),
        ("gets a\r\n".into(), b"END\r\n"),
        ("gat 100 b\r\n".into(), b"END\r\n"),
        ("touch a 100\r\n".into(), b"TOUCHED\r\n"),
        ("touch zz 100\r\n".into(), b"NOT_FOUND\r\n"),
        ("incr a 5\r\n".into(), b"6\r\n"),
        ("decr a 2\r\n".into(), b"4\r\n"),
        ("incr zz 1\r\n".into(), b"NOT_FOUND\r\n"),
        ("cas b 0 0 1 1\r\nz\r\n".into(), b"EXISTS\r\n"),
        ("mg a v\r\n".into(), b"\r\n4\r\n"),
        ("mg b T30 s\r\n".into(), b"\r\n"),
        ("ma a\r\n".into(), b"HD\r\n"),
        ("ma a MD D2\r\n".into(), b"HD\r\n"),
        ("ms c 3 T0\r\nabc\r\n".into(), b"HD\r\n"),
        ("append c 0 0 2\r\nde\r\n".into(), b"STORED\r\n"),
        ("md c\r\n".into(), b"HD\r\n"),
        ("md c\r\n".into(), b"NF\r\n"),
        ("delete a\r\n".into(), b"DELETED\r\n"),
        ("delete a\r\n".into(), b"NOT_FOUND\r\n"),
        (format!("set h 0 0 {}\r\n{huge}\r\n", huge.len()), b"\r\n"),
        ("ms d 1 T0\r\nq\r\n".into(), b"HD\r\n"),
        ("md d I\r\n".into(), b"HD\r\n"),
    ];
    for addr in [mc.addr, server.addr()] {
        let mut s = connect(addr);
        for (req, end) in &steps {
            exchange(&mut s, req.as_bytes(), end);
        }
        // `gets b` for its CAS, then a compare that matches.
        let reply = exchange(&mut s, b"gets b\r\n", b"END\r\n");
        let reply = String::from_utf8_lossy(&reply);
        let cas = reply
            .lines()
            .next()
            .and_then(|l| l.split(' ').nth(4))
            .expect("a CAS");
        let req = format!("cas b 0 0 1 {cas}\r\ny\r\n");
        assert_eq!(exchange(&mut s, req.as_bytes(), b"\r\n"), b"STORED\r\n");
        let req = format!("ms b 1 C{cas}\r\nw\r\n");
        assert_eq!(exchange(&mut s, req.as_bytes(), b"\r\n"), b"EX\r\n");
    }
    let counters = [
        "get_hits",
        "cmd_set",
        "delete_hits",
        "incr_hits",
        "decr_hits",
        "cas_hits",
        "cas_badval",
        "touch_hits",
        "active_slabs",
        "total_malloced",
        "used_chunks",
    ];
    let theirs = lines_named(mc.addr, "stats slabs\r\n", &counters);
    let ours = lines_named(server.addr(), "stats slabs\r\n", &counters);
    assert_eq!(ours, theirs);
    // Something moved in every counter.
    for name in &counters[..8] {
        assert!(
            theirs
                .iter()
                .any(|l| l.contains(&format!(":{name} ")) && !l.ends_with(" 0")),
            "{name}: {theirs:?}"
        );
    }
    assert_eq!(lru_hits(server.addr()), lru_hits(mc.addr));
    let items = ["number", "mem_requested", "outofmemory", "evicted"];
    assert_eq!(
        lines_named(server.addr(), "stats items\r\n", &items),
        lines_named(mc.addr, "stats items\r\n", &items)
    );
    // `stats reset` zeroes them, as memcached's.
    for addr in [mc.addr, server.addr()] {
        let mut s = connect(addr);
        assert_eq!(exchange(&mut s, b"stats reset\r\n", b"\r\n"), b"RESET\r\n");
    }
    assert_eq!(
        lines_named(server.addr(), "stats slabs\r\n", &counters[..8]),
        lines_named(mc.addr, "stats slabs\r\n", &counters[..8])
    );
}

/// `stats items`' `outofmemory`: a store refused for want of memory under `-M`, counted
/// in the class of the refused item, as memcached counts it.
#[test]
fn outofmemory_is_counted_in_the_refused_items_class() {
    let (server, _clock) = start(IoModel::Reactor, |c| {
        c.memory_limit = 2 << 20;
        c.policy = kvlab_store::Policy::None;
    });
    let mut s = connect(server.addr());
    let value = vec![b'm'; 10_000];
    let mut refused = 0;
    for i in 0..400 {
        let mut req = format!("set k{i} 0 0 {}\r\n", value.len()).into_bytes();
        req.extend_from_slice(&value);
        req.extend_from_slice(b"\r\n");
        if exchange(&mut s, &req, b"\r\n") != b"STORED\r\n" {
            refused += 1;
        }
    }
    assert!(refused > 0);
    // 10,000-byte values (10,068-byte items) are class 22's (11,104-byte chunks).
    assert_eq!(
        lines_named(server.addr(), "stats items\r\n", &["outofmemory"]),
        [format!("STAT items:22:outofmemory {refused}")]
    );
}

/// `stats cachedump` lists a class's items newest first, as memcached lists its cold
/// LRU (all of a class's items without the LRU maintainer). kvlab's "newest" is the
/// last store or read to the second (docs/server.md), so its clock moves a second
/// between writes; memcached orders by the writes alone.
#[test]
fn cachedump_lists_newest_first_as_memcached() {
    let mc = Memcached::start_with(&["-m", "64", "-o", "no_lru_maintainer"])
        .unwrap_or_else(|e| panic!("{e} (.ci/run installs Debian's memcached)"));
    let (server, clock) = start(IoModel::Reactor, |_| {});
    let writes: [&[u8]; 6] = [
        b"set a 0 0 1\r\nx\r\n",
        b"set b 0 0 1\r\ny\r\n",
        b"set c 0 1900000000 2\r\nzz\r\n",
        b"set big 0 0 3000\r\n",
        b"set d 0 0 1\r\nw\r\n",
        // Stored again: the newest.
        b"set a 0 0 3\r\nabc\r\n",
    ];
    let mut big = b"set big 0 0 3000\r\n".to_vec();
    big.extend_from_slice(&[b'B'; 3000]);
    big.extend_from_slice(b"\r\n");
    let mut s = connect(mc.addr);
    let mut k = connect(server.addr());
    for w in writes {
        let w = if w.starts_with(b"set big") {
            &big[..]
        } else {
            w
        };
        assert_eq!(exchange(&mut s, w, b"\r\n"), b"STORED\r\n");
        assert_eq!(exchange(&mut k, w, b"\r\n"), b"STORED\r\n");
        clock.advance(1);
    }
    for req in [
        "stats cachedump 1 0\r\n",
        "stats cachedump 1 2\r\n",
        "stats cachedump 17 0\r\n",
    ] {
        let theirs = exchange(&mut s, req.as_bytes(), b"END\r\n");
        let ours = exchange(&mut k, req.as_bytes(), b"END\r\n");
        assert_eq!(
            String::from_utf8_lossy(&ours),
            String::from_utf8_lossy(&theirs),
            "{req}"
        );
    }
    let all = exchange(&mut k, b"stats cachedump 1 0\r\n", b"END\r\n");
    assert_eq!(
        String::from_utf8_lossy(&all),
        "ITEM a [3 b; 0 s]\r\nITEM d [1 b; 0 s]\r\nITEM c [2 b; 1900000000 s]\r\n\
         ITEM b [1 b; 0 s]\r\nEND\r\n"
    );
}

/// `me` reports the item's class and whole size as memcached does (`ITEM_ntotal`:
/// header, key, suffix and value), with and without client flags, across classes.
#[test]
fn me_reports_the_whole_item_size_as_memcached() {
    let mc = memcached();
    let (server, _clock) = start(IoModel::Reactor, |_| {});
    let items: [(&str, u32, usize); 5] = [
        ("a", 0, 1),
        ("flagged", 7, 10),
        ("mid", 0, 700),
        ("large-key-of-some-length", 1, 5000),
        ("huge", 0, 600_000),
    ];
    // `la`, `cas` (and `exp` for an item with a TTL) are the server's own; `fetch`, `cls`
    // and `size` must agree.
    let debug = |addr: SocketAddr| -> Vec<String> {
        let mut s = connect(addr);
        let mut out = Vec::new();
        for (key, flags, len) in items {
            let mut req = format!("set {key} {flags} 0 {len}\r\n").into_bytes();
            req.extend(std::iter::repeat_n(b'v', len));
            req.extend_from_slice(b"\r\n");
            assert_eq!(exchange(&mut s, &req, b"\r\n"), b"STORED\r\n");
            if flags != 0 {
                exchange(&mut s, format!("get {key}\r\n").as_bytes(), b"END\r\n");
            }
            let line = exchange(&mut s, format!("me {key}\r\n").as_bytes(), b"\r\n");
            let line = String::from_utf8_lossy(&line);
            out.push(
                line.split(' ')
                    .filter(|w| !w.starts_with("la=") && !w.starts_with("cas="))
                    .collect::<Vec<_>>()
                    .join(" "),
            );
        }
        out.push(String::from_utf8_lossy(&exchange(&mut s, b"me nope\r\n", b"\r\n")).into());
        out
    };
    let theirs = debug(mc.addr);
    assert_eq!(debug(server.addr()), theirs);
    assert_eq!(theirs[0], "ME a exp=-1 fetch=no cls=1 size=61\r\n");
}
