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
