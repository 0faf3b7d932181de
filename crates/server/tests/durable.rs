//! The server over a durable store: restart recovery, durable deletes, an event loop
//! that keeps serving while the disk is slow, and the `durable_*` figures of `stats`.

mod common;

use std::collections::HashMap;
use std::io::Read;
use std::time::{Duration, Instant};

use common::*;
use kvlab_server::IoModel;
use kvlab_store::{Durability, DurableConfig};

fn durable(dir: &std::path::Path, durability: Durability) -> Option<DurableConfig> {
    Some(DurableConfig {
        dir: dir.to_path_buf(),
        durability,
        flush_interval: Duration::from_millis(100),
    })
}

#[test]
fn restart_recovers_data_and_deletes_stay_deleted() {
    for &io in IoModel::ALL {
        for durability in [Durability::None, Durability::Interval, Durability::Sync] {
            let dir = tempfile::tempdir().expect("tempdir");
            {
                let (server, _clock) = start(io, |c| c.durable = durable(dir.path(), durability));
                let mut s = connect(server.addr());
                let req = b"set a 1 0 2\r\naa\r\nset b 2 0 2\r\nbb\r\nset gone 0 0 1\r\nx\r\ndelete gone\r\nincr a 1\r\nset n 0 0 2\r\n41\r\nincr n 1\r\n";
                let got = exchange(&mut s, req, b"42\r\n");
                assert!(
                    got.ends_with(b"STORED\r\n42\r\n"),
                    "{}",
                    String::from_utf8_lossy(&got)
                );
                server.shutdown();
            }
            let (server, _clock) = start(io, |c| c.durable = durable(dir.path(), durability));
            let mut s = connect(server.addr());
            // `incr a` failed (not a number), so `a` is unchanged; `gone` stays deleted.
            let got = exchange(&mut s, b"get a b gone n\r\n", b"END\r\n");
            assert_eq!(
                String::from_utf8_lossy(&got),
                "VALUE a 1 2\r\naa\r\nVALUE b 2 2\r\nbb\r\nVALUE n 0 2\r\n42\r\nEND\r\n",
                "io {} durability {durability}",
                io.name()
            );
        }
    }
}

/// With the disk made slow, a write that must be fsynced before its reply (sync) and a
/// read-through of a key only on disk both wait on helper threads; meanwhile the single
/// event loop keeps answering cache hits on other connections.
#[test]
fn a_slow_disk_does_not_stall_the_event_loop() {
    for io in [IoModel::Epoll, IoModel::Signal] {
        let dir = tempfile::tempdir().expect("tempdir");
        // First life: put `cold` on disk.
        {
            let (server, _clock) = start(io, |c| c.durable = durable(dir.path(), Durability::Sync));
            let mut s = connect(server.addr());
            assert_eq!(
                exchange(&mut s, b"set cold 0 0 4\r\ncold\r\n", b"\r\n"),
                b"STORED\r\n"
            );
            server.shutdown();
        }
        let (server, _clock) = start(io, |c| c.durable = durable(dir.path(), Durability::Sync));
        let mut hot = connect(server.addr());
        assert_eq!(
            exchange(&mut hot, b"set hot 0 0 3\r\nhot\r\n", b"\r\n"),
            b"STORED\r\n"
        );
        assert_eq!(
            exchange(&mut hot, b"get hot\r\n", b"END\r\n"),
            b"VALUE hot 0 3\r\nhot\r\nEND\r\n"
        );

        server.store().set_backend_delay(Duration::from_secs(3));
        let mut writer = connect(server.addr());
        let mut reader = connect(server.addr());
        std::io::Write::write_all(&mut writer, b"set slow 0 0 4\r\nslow\r\n").expect("write");
        std::io::Write::write_all(&mut reader, b"get cold\r\n").expect("write");
        // Both now wait on the disk. The loop still serves hits, many round trips of them.
        for i in 0..20 {
            let got = exchange(&mut hot, b"get hot\r\n", b"END\r\n");
            assert_eq!(
                String::from_utf8_lossy(&got),
                "VALUE hot 0 3\r\nhot\r\nEND\r\n",
                "io {}: hit {i} while the disk is slow",
                io.name()
            );
        }
        // ...and the slow requests have not been answered yet (they are on the disk's time).
        for s in [&mut writer, &mut reader] {
            s.set_nonblocking(true).expect("nonblocking");
            let mut buf = [0u8; 64];
            let early = s.read(&mut buf);
            assert!(
                matches!(&early, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
                "io {}: a disk-bound reply came before the hits finished: {early:?}",
                io.name()
            );
            s.set_nonblocking(false).expect("blocking");
        }
        // Then they complete, in order, with the right answers.
        assert_eq!(read_until(&mut writer, b"\r\n"), b"STORED\r\n");
        assert_eq!(
            read_until(&mut reader, b"END\r\n"),
            b"VALUE cold 0 4\r\ncold\r\nEND\r\n"
        );
        server.store().set_backend_delay(Duration::ZERO);
    }
}

const DURABLE_FIELDS: [&str; 10] = [
    "durable_reads",
    "durable_commits",
    "durable_fsyncs",
    "durable_items_written",
    "durable_persists",
    "durable_queued_bytes",
    "durable_flush_errors",
    "durable_purged",
    "durable_purge_scanned",
    "durable_purge_passes",
];

/// `stats` as numbers (non-numeric fields left out).
fn stats_numbers(s: &mut std::net::TcpStream) -> HashMap<String, u64> {
    let text = String::from_utf8(exchange(s, b"stats\r\n", b"END\r\n")).expect("utf8");
    text.lines()
        .filter_map(|l| l.strip_prefix("STAT "))
        .filter_map(|l| l.split_once(' '))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        .collect()
}

/// `stats` shows the durable store's engine figures, and they move: persisted sets are
/// committed, fsynced and written; a `flush_all` has the flusher purge the old records;
/// a restart reads through.
#[test]
fn stats_show_durable_figures_that_move() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let (server, _clock) = start(IoModel::Reactor, |c| {
            c.durable = durable(dir.path(), Durability::Sync)
        });
        let mut s = connect(server.addr());
        let before = stats_numbers(&mut s);
        for f in DURABLE_FIELDS {
            assert!(before.contains_key(f), "{f} missing: {before:?}");
        }
        let req = b"set a 0 0 1\r\n1\r\nset b 0 0 1\r\n2\r\nflush_all\r\nset c 0 0 1\r\n3\r\n";
        exchange(&mut s, req, b"OK\r\nSTORED\r\n");
        // The flusher purges `a` and `b` in the background: wait for it (bounded).
        let deadline = Instant::now() + Duration::from_secs(20);
        let after = loop {
            let st = stats_numbers(&mut s);
            if st["durable_purged"] >= 2 && st["durable_purge_passes"] >= 1 {
                break st;
            }
            assert!(Instant::now() < deadline, "no purge: {st:?}");
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        let moved = |f: &str| after[f] - before[f];
        assert!(moved("durable_persists") >= 3, "{after:?}");
        assert!(moved("durable_commits") >= 3, "{after:?}");
        assert!(moved("durable_fsyncs") >= 3, "{after:?}");
        // Three puts and two purge deletes.
        assert!(moved("durable_items_written") >= 5, "{after:?}");
        assert_eq!(moved("durable_purged"), 2, "{after:?}");
        assert!(moved("durable_purge_scanned") >= 2, "{after:?}");
        assert_eq!(after["durable_flush_errors"], 0);
        server.shutdown();
    }
    let (server, _clock) = start(IoModel::Reactor, |c| {
        c.durable = durable(dir.path(), Durability::Sync)
    });
    let mut s = connect(server.addr());
    assert_eq!(stats_numbers(&mut s)["durable_reads"], 0);
    assert_eq!(
        exchange(&mut s, b"get c\r\n", b"END\r\n"),
        b"VALUE c 0 1\r\n3\r\nEND\r\n"
    );
    assert_eq!(stats_numbers(&mut s)["durable_reads"], 1);
}
