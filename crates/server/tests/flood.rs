//! Memory after pipelined floods (issue 25, item 10): clients pipeline many 10 KB sets
//! and close without reading a reply. The server must give the memory of those
//! connections back: its RSS may not grow flood over flood, and stays within a bound
//! of the bytes it stores. And an idle connection of the threaded model stays cheap.
//!
//! RSS is a process's (`VmRSS`), so each I/O model's server runs in a process of its
//! own: this test (`harness = false`: a plain `main` on the main thread, so that, as in
//! `kvlab server`, the allocator is set up before any other thread allocates) runs
//! itself once per model with `KVLAB_FLOOD_IO` set.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

use common::*;
use kvlab_server::{IoModel, Server};

const MIB: f64 = 1024.0 * 1024.0;
const LIMIT: usize = 32 << 20;
const CLIENTS: usize = 50;
const SETS: usize = 300;
const SIZE: usize = 10 * 1024;

fn rss() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kb * 1024.0
}

fn stat(addr: SocketAddr, name: &str) -> u64 {
    let mut s = connect(addr);
    let out = exchange(&mut s, b"stats\r\n", b"END\r\n");
    let out = String::from_utf8_lossy(&out).into_owned();
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("STAT {name} ")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in stats"))
}

/// Waits until the server counts no connection but the asking one.
fn settle(addr: SocketAddr) {
    for _ in 0..3000 {
        if stat(addr, "curr_connections") <= 1 {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("flood connections not closed");
}

/// One flood: every client sends its sets (keys of flood `round`) and closes.
fn flood(addr: SocketAddr, round: usize, value: &Arc<Vec<u8>>) {
    let threads: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let value = value.clone();
            std::thread::spawn(move || {
                let Ok(mut s) = TcpStream::connect(addr) else {
                    return;
                };
                let mut req = Vec::with_capacity(64);
                for i in 0..SETS {
                    req.clear();
                    write!(req, "set f{round}:{c}:{i} 0 0 {SIZE}\r\n").expect("format");
                    if s.write_all(&req).is_err()
                        || s.write_all(&value).is_err()
                        || s.write_all(b"\r\n").is_err()
                    {
                        return;
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("client thread");
    }
    settle(addr);
}

/// Fills the server to its memory limit first (floods whose connections are reset on
/// their first reply store only part of what they send), so every flood churns a full
/// cache.
fn prefill(addr: SocketAddr) {
    let mut s = connect(addr);
    let value = vec![b'p'; SIZE];
    for i in 0..2 * LIMIT / SIZE {
        write!(s, "set p{i} 0 0 {SIZE} noreply\r\n").expect("write");
        s.write_all(&value).expect("write");
        s.write_all(b"\r\n").expect("write");
    }
    exchange(&mut s, b"mn\r\n", b"MN\r\n");
}

/// RSS after each of four floods, in bytes.
fn floods(server: &Server) -> Vec<f64> {
    prefill(server.addr());
    let value = Arc::new(vec![b'v'; SIZE]);
    (0..4)
        .map(|round| {
            flood(server.addr(), round, &value);
            rss()
        })
        .collect()
}

/// Runs [`one_model`] in a child process (this test binary again): the RSS is then
/// that model's alone.
fn in_child(io: &str) -> String {
    let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .env("KVLAB_FLOOD_IO", io)
        .output()
        .expect("child runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{io}: {text}");
    text.lines()
        .find(|l| l.starts_with("FLOOD "))
        .unwrap_or_else(|| panic!("{io}: no report in {text}"))
        .to_owned()
}

/// One I/O model's floods, in the child process [`in_child`] started.
fn one_model(io: &str) {
    let io = match io {
        "reactor" => IoModel::Reactor,
        "threaded" => IoModel::Threaded,
        "epoll" => IoModel::Epoll,
        "signal" => IoModel::Signal,
        other => panic!("no I/O model {other}"),
    };
    let base = rss();
    let (server, _clock) = start(io, |c| {
        c.memory_limit = LIMIT;
        c.max_connections = 1024;
    });
    let after = floods(&server);
    let stored = stat(server.addr(), "bytes") as f64;
    let line = format!(
        "FLOOD {io:?}: RSS after each flood {} MiB (process before the server {:.0} MiB), stored {:.0} MiB",
        after
            .iter()
            .map(|r| format!("{:.0}", r / MIB))
            .collect::<Vec<_>>()
            .join(" "),
        base / MIB,
        stored / MIB
    );
    println!("{line}");
    // No growth flood over flood beyond 4 MiB (an eighth of the stored bytes).
    let growth = after[3] - after[0];
    assert!(growth <= 4.0 * MIB, "{line}: grew {:.1} MiB", growth / MIB);
    // At most the stored bytes plus 25% and 16 MiB over the process before the server.
    let bound = base + stored * 1.25 + 16.0 * MIB;
    assert!(
        after.iter().all(|&r| r <= bound),
        "{line}: over the bound {:.0} MiB",
        bound / MIB
    );
}

fn main() {
    // What `kvlab server` does first thing.
    kvlab_server::limit_malloc_arenas();
    if let Ok(io) = std::env::var("KVLAB_FLOOD_IO") {
        one_model(&io);
        return;
    }
    pipelined_floods_leave_memory_bounded_and_idle_threaded_connections_cheap();
    println!("flood: ok");
}

fn pipelined_floods_leave_memory_bounded_and_idle_threaded_connections_cheap() {
    for io in ["reactor", "threaded", "epoll", "signal"] {
        eprintln!("{}", in_child(io));
    }

    // Idle connections of the threaded model: each holds half a command.
    let (server, _clock) = start(IoModel::Threaded, |c| c.max_connections = 1024);
    let addr = server.addr();
    let mut warm = connect(addr);
    exchange(&mut warm, b"set k 0 0 1\r\nx\r\nget k\r\n", b"END\r\n");
    let n = 400;
    let before = rss();
    let mut conns: Vec<TcpStream> = (0..n).map(|_| connect(addr)).collect();
    for c in &mut conns {
        c.write_all(b"get k").expect("half a command");
    }
    for _ in 0..3000 {
        if stat(addr, "curr_connections") as usize > n + 1 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // Every connection's thread has read its half command: a request after them is answered.
    exchange(&mut warm, b"get k\r\n", b"END\r\n");
    let per_conn = (rss() - before) / n as f64;
    eprintln!("threaded: {:.1} kB per idle connection", per_conn / 1024.0);
    // A thread per connection: its stack's touched pages, its TLS and its session.
    // Measured 29 kB in a debug build (15.9 kB in release, memcached 0.6 kB: the
    // model's cost, not reduced here); the bound catches a regression such as a buffer
    // kept per idle connection.
    assert!(
        per_conn <= 48.0 * 1024.0,
        "threaded idle connection costs {:.1} kB",
        per_conn / 1024.0
    );
    drop(conns);
}
