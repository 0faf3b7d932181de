//! Server behaviour beyond single replies: stats, the connection limit, TTL driven by the
//! manual clock, the crawler reclaiming what that clock expired, the Prometheus endpoint,
//! eviction under `-m`, and shutdown.

mod common;

use std::collections::HashMap;

use std::time::{Duration, Instant};

use common::*;
use kvlab_server::{CrawlerConfig, IoModel};
use kvlab_store::{Policy, ITEM_OVERHEAD};

fn stats_map(
    s: &mut std::net::TcpStream,
    group: &str,
) -> std::collections::HashMap<String, String> {
    let req = if group.is_empty() {
        "stats\r\n".to_string()
    } else {
        format!("stats {group}\r\n")
    };
    let text = String::from_utf8(exchange(s, req.as_bytes(), b"END\r\n")).expect("utf8");
    text.lines()
        .filter_map(|l| l.strip_prefix("STAT "))
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn refused_stores_are_counted_as_memcached_counts_them() {
    let (server, _clock) = start(IoModel::Reactor, |c| {
        c.memory_limit = 64 << 10;
        c.item_size_max = 4 << 10;
        c.policy = Policy::None;
    });
    let mut s = connect(server.addr());
    let big = vec![b'x'; 8 << 10];
    let mut req = format!("set big 0 0 {}\r\n", big.len()).into_bytes();
    req.extend_from_slice(&big);
    req.extend_from_slice(b"\r\n");
    assert_eq!(
        exchange(&mut s, &req, b"\r\n"),
        b"SERVER_ERROR object too large for cache\r\n"
    );
    // `-M`: fill the 64 KiB until a store is refused.
    let value = vec![b'v'; 3 << 10];
    let mut refused = 0;
    for i in 0..64 {
        let mut req = format!("set k{i} 0 0 {}\r\n", value.len()).into_bytes();
        req.extend_from_slice(&value);
        req.extend_from_slice(b"\r\n");
        if exchange(&mut s, &req, b"\r\n") != b"STORED\r\n" {
            refused += 1;
        }
    }
    assert!(refused > 0, "64 KiB never filled");
    let st = stats_map(&mut s, "");
    assert_eq!(st["store_too_large"], "1");
    assert_eq!(st["store_no_memory"], refused.to_string());
}

#[test]
fn stats_has_memcached_fields_and_service_times() {
    for &io in IoModel::ALL {
        let (server, _clock) = start(io, |c| c.memory_limit = 8 << 20);
        let mut s = connect(server.addr());
        exchange(
            &mut s,
            b"set a 0 0 1\r\n1\r\nget a\r\nget b\r\ndelete b\r\nincr a 1\r\ntouch a 1\r\n",
            b"TOUCHED\r\n",
        );
        let st = stats_map(&mut s, "");
        for field in [
            "pid",
            "uptime",
            "time",
            "version",
            "curr_connections",
            "total_connections",
            "cmd_get",
            "cmd_set",
            "cmd_touch",
            "get_hits",
            "get_misses",
            "get_expired",
            "delete_hits",
            "delete_misses",
            "incr_hits",
            "incr_misses",
            "cas_hits",
            "cas_badval",
            "curr_items",
            "total_items",
            "bytes",
            "limit_maxbytes",
            "evictions",
            "threads",
        ] {
            assert!(st.contains_key(field), "{} lacks {field}", io.name());
        }
        // kvlab's own figures are in `stats kvlab`, not among memcached's.
        assert!(!st.contains_key("service_time_p50_us"));
        let own = stats_map(&mut s, "kvlab");
        assert_eq!(st["cmd_get"], "2");
        assert_eq!(st["cmd_set"], "1");
        assert_eq!(st["get_hits"], "1");
        assert_eq!(st["get_misses"], "1");
        assert_eq!(st["delete_misses"], "1");
        assert_eq!(st["incr_hits"], "1");
        assert_eq!(st["curr_items"], "1");
        assert_eq!(st["limit_maxbytes"], (8u64 << 20).to_string());
        assert_eq!(st["threads"], "2");
        assert_eq!(st["curr_connections"], "1");
        assert!(own["service_time_p50_us"].parse::<f64>().expect("number") > 0.0);
        assert!(own.contains_key("service_time_p99_us"));
        assert_eq!(own["protocol_errors"], "0");
        let settings = stats_map(&mut s, "settings");
        assert_eq!(settings["item_size_max"], "1048576");
        assert_eq!(exchange(&mut s, b"stats reset\r\n", b"\r\n"), b"RESET\r\n");
        assert_eq!(stats_map(&mut s, "")["cmd_get"], "0");
    }
}

#[test]
fn stats_latency_counts_every_request_in_cumulative_buckets() {
    for &io in IoModel::ALL {
        let (server, _clock) = start(io, |c| c.memory_limit = 8 << 20);
        let mut s = connect(server.addr());
        let num = |m: &std::collections::HashMap<String, String>, k: &str| -> u64 {
            m[k].parse().expect("number")
        };
        let before = stats_map(&mut s, "latency");
        exchange(&mut s, b"set a 0 0 1\r\n1\r\n", b"STORED\r\n");
        for _ in 0..50 {
            exchange(&mut s, b"get a\r\n", b"END\r\n");
        }
        let after = stats_map(&mut s, "latency");
        // The set and the 50 gets were served in between (`stats` is not timed).
        let served = num(&after, "service_time_count") - num(&before, "service_time_count");
        assert_eq!(served, 51, "{}", io.name());
        let mut last = 0;
        for bound in kvlab_server::stats::LATENCY_BOUNDS_US {
            let n = num(&after, &format!("service_time_le_{bound}"));
            assert!(n >= last, "{}: le_{bound} {n} < {last}", io.name());
            last = n;
        }
        assert!(last <= num(&after, "service_time_count"));
        // Every request waited (for no time, or a little) for an event loop under the event
        // loop models; the others have none.
        let waits = num(&after, "loop_wait_count") - num(&before, "loop_wait_count");
        match io.name() {
            "reactor" | "epoll" => assert!(waits >= 51, "{}: {waits} waits", io.name()),
            _ => assert_eq!(waits, 0, "{}", io.name()),
        }
    }
}

#[test]
fn connection_limit_is_refused_cleanly() {
    for &io in IoModel::ALL {
        let (server, _clock) = start(io, |c| c.max_connections = 2);
        let mut a = connect(server.addr());
        let mut b = connect(server.addr());
        // Both admitted connections work (and are counted before the third arrives).
        assert_eq!(exchange(&mut a, b"mn\r\n", b"MN\r\n"), b"MN\r\n");
        assert_eq!(exchange(&mut b, b"mn\r\n", b"MN\r\n"), b"MN\r\n");
        let mut c = connect(server.addr());
        assert_eq!(
            read_until(&mut c, b"<EOF>"),
            b"ERROR Too many open connections\r\n<EOF>"
        );
        drop(a);
        // The freed slot is usable again (the close is noticed asynchronously: probe).
        let mut ok = false;
        for _ in 0..1000 {
            let mut d = connect(server.addr());
            if exchange(&mut d, b"mn\r\n", b"MN\r\n") == b"MN\r\n" {
                ok = true;
                break;
            }
        }
        assert!(ok, "slot never freed");
        let rejected: u64 = stats_map(&mut b, "")["rejected_connections"]
            .parse()
            .expect("n");
        assert!(rejected >= 1, "rejected_connections {rejected}");
    }
}

#[test]
fn ttl_follows_the_clock() {
    for &io in IoModel::ALL {
        let (server, clock) = start(io, |_| {});
        let mut s = connect(server.addr());
        let abs = T0 + 100;
        let req =
            format!("set rel 0 10 1\r\nx\r\nset abs 0 {abs} 1\r\ny\r\nset never 0 0 1\r\nz\r\n");
        exchange(&mut s, req.as_bytes(), b"STORED\r\nSTORED\r\nSTORED\r\n");
        clock.advance(9);
        assert_eq!(
            exchange(&mut s, b"get rel\r\n", b"END\r\n"),
            b"VALUE rel 0 1\r\nx\r\nEND\r\n"
        );
        clock.advance(2);
        assert_eq!(exchange(&mut s, b"get rel\r\n", b"END\r\n"), b"END\r\n");
        assert_eq!(
            exchange(&mut s, b"get abs\r\n", b"END\r\n"),
            b"VALUE abs 0 1\r\ny\r\nEND\r\n"
        );
        clock.advance(100);
        assert_eq!(
            exchange(&mut s, b"get abs never\r\n", b"END\r\n"),
            b"VALUE never 0 1\r\nz\r\nEND\r\n"
        );
        // touch extends, gat too; flush_all with a delay takes effect when the clock gets there.
        exchange(
            &mut s,
            b"set t 0 5 1\r\nt\r\ntouch t 50\r\n",
            b"TOUCHED\r\n",
        );
        clock.advance(20);
        assert_eq!(
            exchange(&mut s, b"mg t t v\r\n", b"\r\nt\r\n"),
            b"VA 1 t30\r\nt\r\n"
        );
        assert_eq!(
            exchange(&mut s, b"flush_all 10\r\nget t\r\n", b"END\r\n"),
            b"OK\r\nVALUE t 0 1\r\nt\r\nEND\r\n"
        );
        clock.advance(11);
        assert_eq!(exchange(&mut s, b"get t never\r\n", b"END\r\n"), b"END\r\n");
        let st = stats_map(&mut s, "");
        assert!(
            st["get_expired"].parse::<u64>().expect("n") >= 2,
            "{:?}",
            st["get_expired"]
        );
    }
}

#[test]
fn memory_limit_evicts_or_refuses() {
    for &io in IoModel::ALL {
        let (server, _clock) = start(io, |c| c.memory_limit = 2 << 20);
        let mut s = connect(server.addr());
        let value = vec![b'v'; 10_000];
        for i in 0..1000 {
            let mut req = format!("set key{i} 0 0 {}\r\n", value.len()).into_bytes();
            req.extend_from_slice(&value);
            req.extend_from_slice(b"\r\n");
            assert_eq!(exchange(&mut s, &req, b"\r\n"), b"STORED\r\n");
        }
        let st = stats_map(&mut s, "");
        assert!(st["bytes"].parse::<u64>().expect("n") <= 2 << 20);
        assert!(st["evictions"].parse::<u64>().expect("n") > 0);
        // The most recent key survived, the first was evicted (LRU).
        assert_eq!(exchange(&mut s, b"get key0\r\n", b"END\r\n"), b"END\r\n");
        assert!(exchange(&mut s, b"get key999\r\n", b"END\r\n").starts_with(b"VALUE key999"));

        let (server, _clock) = start(io, |c| {
            c.memory_limit = 2 << 20;
            c.policy = Policy::None;
        });
        let mut s = connect(server.addr());
        let mut refused = false;
        for i in 0..1000 {
            let mut req = format!("set key{i} 0 0 {}\r\n", value.len()).into_bytes();
            req.extend_from_slice(&value);
            req.extend_from_slice(b"\r\n");
            let reply = exchange(&mut s, &req, b"\r\n");
            if reply == b"SERVER_ERROR out of memory storing object\r\n" {
                refused = true;
                break;
            }
            assert_eq!(reply, b"STORED\r\n");
        }
        assert!(refused, "-M never refused");
        assert!(exchange(&mut s, b"get key0\r\n", b"END\r\n").starts_with(b"VALUE key0"));
    }
}

#[test]
fn shutdown_closes_connections_and_stops() {
    for &io in IoModel::ALL {
        let (server, _clock) = start(io, |_| {});
        let addr = server.addr();
        let mut s = connect(addr);
        assert_eq!(exchange(&mut s, b"mn\r\n", b"MN\r\n"), b"MN\r\n");
        server.shutdown();
        assert!(read_until(&mut s, b"<EOF>").ends_with(b"<EOF>"));
        assert!(
            std::net::TcpStream::connect(addr).is_err(),
            "still accepting after shutdown"
        );
    }
}

/// Polls `stats` (bounded to 10 s, no sleeps) until `field` satisfies `ok`.
fn wait_for_stat(
    s: &mut std::net::TcpStream,
    field: &str,
    ok: impl Fn(u64) -> bool,
) -> HashMap<String, String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = stats_map(s, "");
        if ok(st[field].parse::<u64>().expect("number")) {
            return st;
        }
        assert!(Instant::now() < deadline, "{field} never got there: {st:?}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn crawler_reclaims_expired_and_flushed_items_nobody_asks_for() {
    for &io in IoModel::ALL {
        let (server, clock) = start(io, |c| {
            c.crawler = Some(CrawlerConfig {
                interval: Duration::from_millis(1),
                step_slots: 64,
                pause: Duration::from_micros(10),
            });
        });
        let mut s = connect(server.addr());
        let mut req = Vec::new();
        for i in 0..150 {
            let ttl = if i < 100 { 10 } else { 0 };
            req.extend_from_slice(format!("set k{i:03} 0 {ttl} 1\r\nv\r\n").as_bytes());
        }
        let replies = exchange(&mut s, &req, &b"STORED\r\n".repeat(150));
        assert_eq!(replies, b"STORED\r\n".repeat(150));
        let settings = stats_map(&mut s, "settings");
        assert_eq!(settings["lru_crawler"], "yes");
        // Nothing is dead yet, so passes (at least two) reclaim nothing.
        let st = wait_for_stat(&mut s, "lru_crawler_starts", |n| n >= 2);
        assert_eq!(
            (st["curr_items"].as_str(), st["crawler_reclaimed"].as_str()),
            ("150", "0")
        );
        clock.advance(10);
        let st = wait_for_stat(&mut s, "curr_items", |n| n == 50);
        let charge = 4 + 1 + ITEM_OVERHEAD;
        assert_eq!(st["bytes"], (50 * charge).to_string(), "{}", io.name());
        assert_eq!(st["crawler_reclaimed"], "100");
        assert_eq!(st["expired_unfetched"], "100");
        assert_eq!(
            (st["get_expired"].as_str(), st["get_misses"].as_str()),
            ("0", "0")
        );
        assert!(st["crawler_items_checked"].parse::<u64>().expect("n") >= 150);
        let items = stats_map(&mut s, "items");
        assert_eq!(items["items:1:crawler_reclaimed"], "100");
        assert_eq!(
            exchange(&mut s, b"get k099 k100\r\n", b"END\r\n"),
            b"VALUE k100 0 1\r\nv\r\nEND\r\n"
        );
        exchange(&mut s, b"flush_all\r\n", b"OK\r\n");
        let st = wait_for_stat(&mut s, "curr_items", |n| n == 0);
        assert_eq!(
            (st["bytes"].as_str(), st["crawler_reclaimed"].as_str()),
            ("0", "150")
        );
        // Prometheus says the same, as counters.
        let body = kvlab_server::stats::prometheus(&server.shared().stats.snapshot(server.store()));
        assert!(
            body.contains("# TYPE kvlab_crawler_reclaimed counter\nkvlab_crawler_reclaimed 150\n"),
            "{body}"
        );
        assert!(
            body.contains("# TYPE kvlab_lru_crawler_starts counter\n"),
            "{body}"
        );
        server.shutdown();
    }
    // Off: `stats settings` says so, and `stats` leaves the crawler's fields out, as
    // memcached does.
    let (server, _clock) = start(IoModel::Reactor, |c| c.crawler = None);
    let mut s = connect(server.addr());
    assert_eq!(stats_map(&mut s, "settings")["lru_crawler"], "no");
    let st = stats_map(&mut s, "");
    assert!(!st.contains_key("lru_crawler_starts"), "{st:?}");
    assert!(!st.contains_key("lru_crawler_running"), "{st:?}");
}
