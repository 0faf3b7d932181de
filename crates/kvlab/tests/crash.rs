//! Crash test: under `--durability sync`, every acknowledged write survives `kill -9` and no
//! acknowledged delete comes back — for every I/O model, with requests sent one at a time
//! and pipelined.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use kvlab_process::{free_port, Probe, Process, Spawn};

/// A `kvlab server --durability sync` over `dir` on a free port, once it answers `version`.
fn start(dir: &std::path::Path, io: &str) -> (Process, SocketAddr) {
    let port = free_port().expect("free port");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let server = Spawn::new(env!("CARGO_BIN_EXE_kvlab"))
        .args(["server", "-p", &port.to_string(), "-t", "2", "--io", io])
        .args(["--durability", "sync"])
        .arg("--data-dir")
        .arg(dir)
        .ready(Probe::Version(addr))
        .timeout(Duration::from_secs(20))
        .start()
        .expect("kvlab server starts");
    (server, addr)
}

fn read_until(s: &mut TcpStream, end: &[u8]) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    while !got.ends_with(end) {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    got
}

fn value(i: usize) -> String {
    format!("value-{i}-{}", "x".repeat(i % 50))
}

#[test]
fn acknowledged_writes_survive_kill_9() {
    for io in ["reactor", "threaded", "epoll", "signal"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut server, addr) = start(dir.path(), io);
        let mut s = TcpStream::connect(addr).expect("connect");
        let mut acked = Vec::new();
        // One at a time: each STORED is an acknowledgement.
        for i in 0..100 {
            let v = value(i);
            s.write_all(format!("set k{i} {i} 0 {}\r\n{v}\r\n", v.len()).as_bytes())
                .expect("write");
            assert_eq!(read_until(&mut s, b"\r\n"), b"STORED\r\n", "{io}: set k{i}");
            acked.push(i);
        }
        // Pipelined: 100 sets in one write, 100 acknowledgements.
        let mut batch = Vec::new();
        for i in 100..200 {
            let v = value(i);
            batch.extend_from_slice(format!("set k{i} {i} 0 {}\r\n{v}\r\n", v.len()).as_bytes());
        }
        s.write_all(&batch).expect("write");
        assert_eq!(
            read_until(&mut s, &b"STORED\r\n".repeat(100)),
            b"STORED\r\n".repeat(100),
            "{io}"
        );
        acked.extend(100..200);
        // Deletes and an overwrite, acknowledged.
        for i in (0..200).step_by(4) {
            s.write_all(format!("delete k{i}\r\n").as_bytes())
                .expect("write");
            assert_eq!(
                read_until(&mut s, b"\r\n"),
                b"DELETED\r\n",
                "{io}: delete k{i}"
            );
        }
        s.write_all(b"set k1 0 0 9\r\noverwrite\r\nincr n 1\r\nset n 0 0 1\r\n7\r\nincr n 5\r\n")
            .expect("write");
        assert_eq!(
            read_until(&mut s, b"12\r\n"),
            b"STORED\r\nNOT_FOUND\r\nSTORED\r\n12\r\n",
            "{io}"
        );
        // A TTL change is a write too, and a delete may be the last thing acknowledged.
        s.write_all(b"touch k2 -1\r\ngat -1 k5 k6\r\ndelete k3\r\n")
            .expect("write");
        let tail = read_until(&mut s, b"DELETED\r\n");
        assert!(
            tail.starts_with(b"TOUCHED\r\nVALUE k5 ") && tail.ends_with(b"END\r\nDELETED\r\n"),
            "{io}: {}",
            String::from_utf8_lossy(&tail)
        );

        server.kill(); // kill -9, reaped

        let (server, addr) = start(dir.path(), io);
        let mut s = TcpStream::connect(addr).expect("connect");
        for &i in &acked {
            s.write_all(format!("get k{i}\r\n").as_bytes())
                .expect("write");
            let got = String::from_utf8(read_until(&mut s, b"END\r\n")).expect("utf8");
            let want = if i % 4 == 0 || [2, 3, 5, 6].contains(&i) {
                "END\r\n".to_string()
            } else if i == 1 {
                "VALUE k1 0 9\r\noverwrite\r\nEND\r\n".to_string()
            } else {
                let v = value(i);
                format!("VALUE k{i} {i} {}\r\n{v}\r\nEND\r\n", v.len())
            };
            assert_eq!(got, want, "{io}: k{i} after kill -9");
        }
        s.write_all(b"get n\r\n").expect("write");
        assert_eq!(
            read_until(&mut s, b"END\r\n"),
            b"VALUE n 0 2\r\n12\r\nEND\r\n",
            "{io}"
        );
        drop(server);
    }
}
