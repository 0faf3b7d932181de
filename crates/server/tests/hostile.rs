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

/// Descriptors this process holds for TCP sockets whose local port is `port`: the
/// connections a server on `port` has accepted (not those waiting in its backlog, nor the
/// clients' ends, nor other tests' sockets).
fn accepted_on(port: u16) -> usize {
    let tcp = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    let inodes: std::collections::HashSet<String> = tcp
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let local_port = f.get(1)?.rsplit(':').next()?;
            (u16::from_str_radix(local_port, 16).ok()? == port)
                .then(|| f.get(9).map(|i| i.to_string()))?
        })
        .collect();
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|t| {
            let t = t.to_string_lossy().into_owned();
            Some(t.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .filter(|inode| inodes.contains(inode))
        .count()
}

/// Partial HTTP requests (a header never finished) to the REST port and `/metrics` hold at
/// most the endpoint's connection limit of descriptors, are closed after the idle timeout,
/// and never stop the memcached port from accepting; afterwards HTTP serves again.
#[test]
fn partial_http_requests_are_bounded_and_timed_out() {
    let limits = kvlab_server::http::HttpLimits {
        max_connections: 8,
        idle_timeout: Duration::from_millis(500),
    };
    let (server, _clock) = start(IoModel::Reactor, |c| {
        c.http = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
        c.metrics = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
        c.http_limits = limits;
    });
    let ports = [
        server.http_addr().expect("REST port"),
        server.metrics_addr().expect("metrics port"),
    ];
    let clients = 20;
    let mut partial = Vec::new();
    for addr in ports {
        for _ in 0..clients {
            let mut s = TcpStream::connect(addr).expect("connect (the backlog takes it)");
            s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").expect("send");
            s.set_read_timeout(Some(Duration::from_secs(10)))
                .expect("read timeout");
            partial.push(s);
        }
    }
    // The server holds at most the limit of each endpoint (the listener included).
    for addr in ports {
        // Wait (bounded) until the endpoint has taken as many as it may.
        let deadline = Instant::now() + Duration::from_secs(5);
        while accepted_on(addr.port()) <= limits.max_connections && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let held = accepted_on(addr.port());
        assert!(
            held <= limits.max_connections + 1,
            "{held} descriptors held on port {} for {clients} partial requests",
            addr.port()
        );
    }
    // The memcached port accepts meanwhile.
    let mut m = connect(server.addr());
    assert!(exchange(&mut m, b"version\r\n", b"\r\n").starts_with(b"VERSION "));
    // Each partial request is closed by the server in time: the first ones after the idle
    // timeout, the ones waiting in the backlog after those made room.
    for s in &mut partial {
        let mut buf = [0u8; 512];
        let mut reply = Vec::new();
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => reply.extend_from_slice(&buf[..n]),
                Err(e) => panic!("a partial request still open after 10 s: {e}"),
            }
        }
    }
    drop(partial);
    // HTTP serves again.
    let mut h = TcpStream::connect(ports[1]).expect("connect");
    h.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("send");
    let mut reply = Vec::new();
    h.read_to_end(&mut reply).expect("reply");
    assert!(
        reply.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&reply)
    );
}

/// The soft open-file limit is raised to what `-c` and the HTTP endpoints need (as
/// memcached raises it for `-c`), so the memcached port keeps descriptors for its `-c`
/// connections whatever HTTP clients hold.
#[test]
fn the_open_file_limit_makes_room_for_every_connection() {
    let get = || {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit with a valid rlimit struct.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        lim
    };
    let original = get();
    let hard = original.rlim_max as usize;
    // Start below what the server needs (4096 still covers the other tests of this file,
    // which run beside it).
    let low = libc::rlimit {
        rlim_cur: original.rlim_cur.min(4096),
        rlim_max: original.rlim_max,
    };
    // SAFETY: setrlimit with a valid rlimit struct.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &low) }, 0);
    let mut config = None;
    let (server, _clock) = start(IoModel::Reactor, |c| {
        c.http = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
        c.max_connections = 6000;
        config = Some(c.clone());
    });
    let needed = kvlab_server::descriptors_needed(&config.expect("config"));
    assert!(needed >= 6000 + 256, "{needed}");
    assert!(
        get().rlim_cur as usize >= needed.min(hard),
        "soft limit {} for {needed} descriptors (hard {hard})",
        get().rlim_cur
    );
    drop(server);
    // SAFETY: setrlimit with a valid rlimit struct (the limit this test found).
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &original) };
}
