//! Hostile connection patterns: clients that half-close, under every I/O model.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use common::*;
use kvlab_server::{IoModel, Server};

/// How a half-closing client sends its request and its FIN.
#[derive(Clone, Copy, Debug)]
enum HalfClose {
    /// Request and FIN in one segment (the socket corked while both are queued).
    OneSegment,
    /// Request, then FIN, as `printf 'version\r\n' | nc -N` sends them.
    Back2Back,
    /// Connect, wait 5 ms (the server has adopted the connection and waits in epoll or
    /// for a signal), then request and FIN.
    AfterPause,
}

fn cork(s: &TcpStream, on: bool) {
    let v: libc::c_int = on.into();
    // SAFETY: setsockopt on a valid socket with an int option.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CORK,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "TCP_CORK");
}

/// One client: `version\r\n` and a shut-down write side, then the reply. The socket stays
/// open (as `nc -N` keeps it until the server closes), so only the server can end it.
fn half_close(server: &Server, how: HalfClose) -> (TcpStream, Vec<u8>) {
    let mut s = TcpStream::connect(server.addr()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("read timeout");
    match how {
        HalfClose::OneSegment => cork(&s, true),
        HalfClose::Back2Back => {}
        HalfClose::AfterPause => std::thread::sleep(Duration::from_millis(5)),
    }
    // A refused client (`-c`) may be closed already: its reply says so.
    let _ = s.write_all(b"version\r\n");
    let _ = s.shutdown(Shutdown::Write);
    let mut reply = Vec::new();
    let mut buf = [0u8; 64];
    while !reply.ends_with(b"\r\n") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => reply.extend_from_slice(&buf[..n]),
        }
    }
    (s, reply)
}

/// Waits (bounded) until the server counts `want` open connections; returns the count.
fn settle(server: &Server, want: usize) -> usize {
    let stats = &server.shared().stats;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = stats.curr_connections.load(Relaxed);
        if now == want || Instant::now() > deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A client that sends a request and shuts down its write side is answered and closed,
/// whatever else came with its FIN: none stays counted in `curr_connections` (nor in
/// CLOSE-WAIT), and with `-c 64` new clients are still served after hundreds of them.
#[test]
fn half_closed_connections_are_answered_and_closed_under_every_io_model() {
    let patterns = [
        (HalfClose::OneSegment, 300),
        (HalfClose::Back2Back, 300),
        (HalfClose::AfterPause, 100),
    ];
    let mut failures = Vec::new();
    for &io in IoModel::ALL {
        let (server, _clock) = start(io, |c| c.max_connections = 64);
        for (how, n) in patterns {
            let mut clients = Vec::with_capacity(n);
            for _ in 0..n {
                let (s, reply) = half_close(&server, how);
                if !reply.starts_with(b"VERSION ") {
                    failures.push(format!(
                        "{} {how:?}: reply {:?}",
                        io.name(),
                        String::from_utf8_lossy(&reply)
                    ));
                    break;
                }
                // Kept open: only the server may end it (it holds one or two at a time).
                clients.push(s);
            }
            let left = settle(&server, 0);
            if left != 0 {
                failures.push(format!(
                    "{} {how:?}: {left} of {n} half-closed connections still open",
                    io.name()
                ));
            }
            drop(clients);
        }
        let mut s = connect(server.addr());
        let reply = exchange(&mut s, b"version\r\n", b"\r\n");
        if !reply.starts_with(b"VERSION ") {
            failures.push(format!(
                "{}: a new client after them got {:?}",
                io.name(),
                String::from_utf8_lossy(&reply)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The listen backlog of the socket listening on `port`, as `ss` reads it (a listening
/// socket's Send-Q is its backlog).
fn backlog_of(port: u16) -> u32 {
    let out = std::process::Command::new("ss")
        .args(["-ltnH", &format!("sport = :{port}")])
        .output()
        .expect("ss (iproute2) runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .next()
        .unwrap_or_else(|| panic!("no listener: {text}"));
    // State Recv-Q Send-Q Local Peer
    let send_q = line.split_whitespace().nth(2).expect("Send-Q column");
    send_q.parse().expect("Send-Q is a number")
}

/// `-b` sets the listen backlog under every I/O model; the default is memcached's 1024
/// (std's listeners bind with 128).
#[test]
fn the_listen_backlog_is_taken_from_the_config() {
    let somaxconn: u32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(4096);
    for &io in IoModel::ALL {
        let (server, _clock) = start(io, |_| {});
        assert_eq!(
            backlog_of(server.addr().port()),
            1024.min(somaxconn),
            "{} default",
            io.name()
        );
        let (server, _clock) = start(io, |c| c.backlog = 700);
        assert_eq!(
            backlog_of(server.addr().port()),
            700.min(somaxconn),
            "{} -b 700",
            io.name()
        );
    }
}
