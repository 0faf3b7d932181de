//! kvlab server's HTTP front ends under load they must bound: partial requests to the REST
//! port and `/metrics` (descriptors held, idle timeout, the memcached port still
//! accepting), the open-file limit raised for them beside `-c`, and `/metrics` against
//! `stats`.

#[path = "../../server/tests/common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use kvlab_rest::{metrics_addr, rest_addr, HttpLimits, Metrics, Rest};
use kvlab_server::IoModel;

/// Any free port on the loopback.
const ANY: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

#[test]
fn prometheus_endpoint_serves_the_same_figures() {
    let (server, _clock) = start(IoModel::Reactor, |c| {
        c.front_ends = vec![Arc::new(Metrics::on(ANY))];
    });
    let mut s = connect(server.addr());
    exchange(&mut s, b"set a 0 0 1\r\n1\r\nget a\r\n", b"END\r\n");
    let mut http = connect(metrics_addr(&server).expect("metrics on"));
    http.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("write");
    let mut body = String::new();
    http.read_to_string(&mut body).expect("read");
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert!(
        body.contains("# TYPE kvlab_cmd_get counter\nkvlab_cmd_get 1\n"),
        "{body}"
    );
    assert!(body.contains("kvlab_get_hits 1\n"), "{body}");
    assert!(body.contains("kvlab_service_time_p99_us "), "{body}");
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
    let limits = HttpLimits {
        max_connections: 8,
        idle_timeout: Duration::from_millis(500),
    };
    let (server, _clock) = start(IoModel::Reactor, |c| {
        c.front_ends = vec![
            Arc::new(Rest {
                limits,
                ..Rest::on(ANY)
            }),
            Arc::new(Metrics {
                limits,
                ..Metrics::on(ANY)
            }),
        ];
    });
    let ports = [
        rest_addr(&server).expect("REST port"),
        metrics_addr(&server).expect("metrics port"),
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
        c.front_ends = vec![Arc::new(Rest::on(ANY))];
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
