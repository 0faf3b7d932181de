//! Table-driven wire tests: request bytes → exact reply bytes, against a server on
//! 127.0.0.1:0, for every I/O model. Each case runs on a fresh connection after
//! a `flush_all`, and ends with a sync request so that "no reply" is checked too (the next bytes
//! must be the sync reply). Cases marked `SAME` are also run against the real memcached by
//! `table_matches_memcached`, which keeps the table honest.

mod common;

use common::*;
use kvlab_server::IoModel;
use kvlab_testkit::wire::{run_closing, run_table};
use kvlab_testkit::Memcached;

/// The crawler thread runs (`lru_crawler` rows need it), but only when asked: its own
/// passes are an hour apart.
fn with_crawler(c: &mut kvlab_server::ServerConfig) {
    c.crawler = Some(kvlab_server::CrawlerConfig {
        interval: std::time::Duration::from_secs(3600),
        ..kvlab_server::CrawlerConfig::default()
    });
}

#[test]
fn table_passes_under_every_io_model() {
    for &io in IoModel::ALL {
        let (server, _clock) = start(io, with_crawler);
        let failures = run_table(server.addr(), false);
        assert!(
            failures.is_empty(),
            "io model {}:\n{}",
            io.name(),
            failures.join("\n")
        );
    }
}

/// The same table over a unix-domain socket (`-s PATH`), under every I/O model.
#[test]
fn table_passes_over_a_unix_socket_under_every_io_model() {
    for &io in IoModel::ALL {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("kvlab.sock");
        let (_server, _clock) = start(io, |c| {
            with_crawler(c);
            c.unix_socket = Some(kvlab_server::UnixSocket {
                path: path.clone(),
                mask: 0o700,
            });
        });
        let failures = kvlab_testkit::wire::run_table_unix(&path, false);
        assert!(
            failures.is_empty(),
            "io model {} (unix socket):\n{}",
            io.name(),
            failures.join("\n")
        );
    }
}

/// The same table over a durable store with `--durability sync`: every miss reads through
/// from disk and every write is fsynced before its reply, on helper threads in the
/// event-loop models, inline in the others. Replies must not change.
#[test]
fn table_passes_over_a_durable_store_under_every_io_model() {
    for &io in IoModel::ALL {
        let dir = tempfile::tempdir().expect("tempdir");
        let (server, _clock) = start(io, |c| {
            with_crawler(c);
            c.durable = Some(kvlab_store::DurableConfig {
                dir: dir.path().to_path_buf(),
                durability: kvlab_store::Durability::Sync,
                flush_interval: std::time::Duration::from_millis(200),
            })
        });
        let failures = run_table(server.addr(), false);
        assert!(
            failures.is_empty(),
            "io model {} (durable):\n{}",
            io.name(),
            failures.join("\n")
        );
    }
}

/// The table's claim that a reply is memcached's own is checked against memcached itself.
#[test]
fn table_matches_memcached() {
    let mc = Memcached::start_with(&[])
        .unwrap_or_else(|e| panic!("{e} (.ci/run installs Debian's memcached)"));
    let mut failures = run_table(mc.addr, true);
    failures.extend(run_closing(mc.addr, true));
    assert!(
        failures.is_empty(),
        "memcached disagrees:\n{}",
        failures.join("\n")
    );
}

/// Lines that close the connection: checked separately since nothing follows them.
#[test]
fn closing_cases() {
    for &io in IoModel::ALL {
        let (server, _clock) = start(io, |_| {});
        let failures = run_closing(server.addr(), false);
        assert!(
            failures.is_empty(),
            "io model {}:\n{}",
            io.name(),
            failures.join("\n")
        );
        let mut s = connect(server.addr());
        assert_eq!(
            exchange(&mut s, b"version\r\nquit\r\nversion\r\n", b"<EOF>"),
            format!("VERSION {}\r\n<EOF>", kvlab_server::stats::VERSION).as_bytes()
        );
        // A multi-get line may be long; memcached closes other long lines.
        let mut s = connect(server.addr());
        let keys: Vec<String> = (0..1500).map(|i| format!("k{i}")).collect();
        assert_eq!(
            exchange(
                &mut s,
                format!("get {}\r\n", keys.join(" ")).as_bytes(),
                b"END\r\n"
            ),
            b"END\r\n"
        );
        // A get line past the bound is refused and the connection closed: memory stays bounded.
        let mut s = connect(server.addr());
        let mut huge = b"get ".to_vec();
        huge.extend(std::iter::repeat_n(b'k', 300 * 1024));
        // The server closes with our bytes unread, so the kernel may reset the connection
        // before its error line is read: closed, either way, is what counts.
        let _ = std::io::Write::write_all(&mut s, &huge);
        let got = read_until(&mut s, b"<EOF>");
        assert!(
            got.ends_with(b"<EOF>") || got.ends_with(b"<RESET>"),
            "{:?}",
            String::from_utf8_lossy(&got)
        );
    }
}
