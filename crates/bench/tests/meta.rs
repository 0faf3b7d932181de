//! The load generator over memcached's meta protocol (`--protocol meta`), against kvlab's own
//! server and against Debian's memcached (skipped, with a note, when it is not installed).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::{closed, run};
use kvlab_bench::dist::SizeDist;
use kvlab_bench::workload::Mix;
use kvlab_bench::{BenchConfig, Protocol};
use kvlab_testkit::Memcached;

/// A server under test, stopped on drop.
enum Target {
    Kvlab(kvlab_server::Server),
    Memcached(Memcached),
}

impl Target {
    fn addr(&self) -> SocketAddr {
        match self {
            Target::Kvlab(s) => s.addr(),
            Target::Memcached(m) => m.addr,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Target::Kvlab(_) => "kvlab",
            Target::Memcached(_) => "memcached",
        }
    }
}

/// A fresh kvlab server, and a fresh memcached when it is installed.
fn targets() -> Vec<Target> {
    let kvlab = kvlab_server::Server::start(kvlab_server::ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        threads: 1,
        ..Default::default()
    })
    .unwrap();
    let mut t = vec![Target::Kvlab(kvlab)];
    if std::path::Path::new(&Memcached::program()).exists() {
        t.push(Target::Memcached(Memcached::start(1).expect("memcached")));
    } else {
        eprintln!(
            "note: {} not found (set MEMCACHED): meta runs against memcached skipped",
            Memcached::program()
        );
    }
    t
}

fn meta(target: SocketAddr, requests: u64) -> BenchConfig {
    let mut cfg = closed(target, requests);
    cfg.protocol = Protocol::Meta;
    cfg.depth = 8;
    cfg.load = true;
    cfg.workload.verify = true;
    cfg.workload.value_size = SizeDist::Uniform { min: 10, max: 3000 };
    cfg.workload.mix = Mix {
        get: 7,
        set: 2,
        delete: 1,
    };
    cfg
}

/// What meta sets stored reads back over the text protocol under the plain key, verified.
fn readable_over_text(t: &Target, cfg: &BenchConfig) -> usize {
    let wl = &cfg.workload;
    let mut buf = [0u8; 256];
    let mut client = kvlab_client::Client::connect(t.addr(), Duration::from_secs(5)).unwrap();
    (0..wl.keys)
        .filter_map(|k| {
            let key = wl.key(k, &mut buf).to_vec();
            client.get(&key).unwrap().map(|v| (key, v))
        })
        .inspect(|(key, v)| {
            assert!(wl.check_value(key, v), "{}: {key:?}", t.name());
        })
        .count()
}

#[test]
fn meta_get_set_delete_with_verify() {
    for t in targets() {
        let cfg = meta(t.addr(), 4000);
        let r = run(&cfg);
        let c = r.counters;
        let name = t.name();
        assert_eq!(r.load.map(|l| l.completed), Some(1000), "{name}: ms fills");
        assert_eq!(c.completed, 4000, "{name}: {c:?}");
        assert_eq!(c.gets + c.sets + c.deletes, c.completed, "{name}");
        assert_eq!(c.hits + c.misses, c.gets, "{name}");
        assert!(c.hits > 0 && c.misses > 0 && c.deletes > 0, "{name}: {c:?}");
        assert_eq!(c.errors + c.timeouts, 0, "{name}: {:?} {c:?}", r.notes);
        assert_eq!(c.verify_errors, 0, "{name}");
        assert!(readable_over_text(&t, &cfg) > 0, "{name}");
        if let Target::Kvlab(s) = t {
            s.shutdown();
        }
    }
}

#[test]
fn meta_with_base64_keys() {
    for t in targets() {
        let mut cfg = meta(t.addr(), 3000);
        cfg.meta_base64 = true;
        // Keys with bytes that base64 changes beyond recognition, at the longest length a
        // base64 key may have (186 bytes: 248 encoded).
        cfg.workload.key_prefix = "b64/key:".into();
        cfg.workload.key_size = SizeDist::Uniform { min: 12, max: 186 };
        let r = run(&cfg);
        let c = r.counters;
        let name = t.name();
        assert_eq!(r.load.map(|l| l.completed), Some(1000), "{name}");
        assert_eq!(c.completed, 3000, "{name}: {c:?}");
        assert!(c.hits > 0 && c.misses > 0, "{name}: {c:?}");
        assert_eq!(c.errors + c.timeouts, 0, "{name}: {:?} {c:?}", r.notes);
        // The server decoded the keys: the plain keys hold the values over the text protocol.
        assert!(readable_over_text(&t, &cfg) > 0, "{name}");
        if let Target::Kvlab(s) = t {
            s.shutdown();
        }
    }
    // A key too long to encode within 250 bytes is refused up front.
    let mut cfg = meta(([127, 0, 0, 1], 1).into(), 1);
    cfg.meta_base64 = true;
    cfg.workload.key_size = SizeDist::Fixed { n: 187 };
    let e = cfg.validate().unwrap_err().to_string();
    assert!(e.contains("at most 186 bytes"), "{e}");
    cfg.workload.key_size = SizeDist::Fixed { n: 16 };
    cfg.protocol = Protocol::Memcached;
    let e = cfg.validate().unwrap_err().to_string();
    assert!(e.contains("needs protocol = \"meta\""), "{e}");
}

#[test]
fn quiet_multi_gets_end_at_mn_and_misses_send_nothing() {
    for t in targets() {
        let name = t.name();
        // On the wire: quiet misses produce no line at all, hits a VA, `mn` an MN.
        let mut s = TcpStream::connect(t.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(
            b"ms hit 2 F5 T0\r\nhi\r\nmg miss1 v f q\r\nmg hit v f q\r\nmg miss2 v f q\r\nmn\r\n",
        )
        .unwrap();
        let want = b"HD\r\nVA 2 f5\r\nhi\r\nMN\r\n";
        let mut got = vec![0u8; want.len()];
        s.read_exact(&mut got).unwrap();
        assert_eq!(String::from_utf8_lossy(&got), String::from_utf8_lossy(want));

        // An empty cache: every key of every multi-get misses, silently; each request still
        // completes, at its MN.
        let mut cfg = meta(t.addr(), 2000);
        cfg.load = false;
        cfg.workload.multiget = 5;
        cfg.workload.mix = Mix {
            get: 1,
            set: 0,
            delete: 0,
        };
        cfg.workload.key_prefix = "empty:".into();
        let r = run(&cfg);
        let c = r.counters;
        assert_eq!((c.completed, c.gets), (2000, 2000), "{name}: {c:?}");
        assert_eq!((c.hits, c.misses), (0, 5 * 2000), "{name}: {c:?}");
        assert_eq!(c.errors + c.timeouts, 0, "{name}: {:?} {c:?}", r.notes);

        // Multi-gets among sets and deletes: hits and misses, verified.
        let mut cfg = meta(t.addr(), 3000);
        cfg.workload.multiget = 4;
        let r = run(&cfg);
        let c = r.counters;
        assert_eq!(c.completed, 3000, "{name}: {c:?}");
        assert_eq!(
            c.hits + c.misses,
            4 * c.gets,
            "{name}: four keys per multi-get"
        );
        assert!(c.hits > 0 && c.misses > 0, "{name}: {c:?}");
        assert_eq!(c.errors + c.timeouts, 0, "{name}: {:?} {c:?}", r.notes);
        if let Target::Kvlab(s) = t {
            s.shutdown();
        }
    }
}
