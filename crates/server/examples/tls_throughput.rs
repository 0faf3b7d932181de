//! Throughput over TLS, kvlab `-Z` vs memcached `-Z`, with the same client, A B A B.
//!
//! ```sh
//! cargo build --release -p kvlab
//! cargo run --release -p kvlab-server --example tls_throughput -- \
//!     [--kvlab target/release/kvlab] [--memcached /usr/bin/memcached] \
//!     [--clients 2] [--depth 16] [--seconds 5] [--rounds 2] [--value 100] [--threads 2]
//! ```
//!
//! Each client thread holds one TLS connection (rustls) and, in a closed loop, writes
//! `depth` pipelined `get k` in one write and reads their `depth` replies; the figure is
//! gets per second over all clients. Both servers get the same certificate (a self-signed
//! one made here), the same `-t`, and run on 127.0.0.1.

#[path = "../tests/common/tls_client.rs"]
mod tls_client;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tls_client::tls_client;

struct Args {
    kvlab: String,
    memcached: String,
    clients: usize,
    depth: usize,
    seconds: u64,
    rounds: usize,
    value: usize,
    threads: usize,
}

fn args() -> Args {
    let mut a = Args {
        kvlab: "target/release/kvlab".into(),
        memcached: "/usr/bin/memcached".into(),
        clients: 2,
        depth: 16,
        seconds: 5,
        rounds: 2,
        value: 100,
        threads: 2,
    };
    let v: Vec<String> = std::env::args().skip(1).collect();
    for pair in v.chunks(2) {
        let (k, val) = (pair[0].as_str(), pair.get(1).cloned().unwrap_or_default());
        let num = || val.parse::<usize>().expect("a number");
        match k {
            "--kvlab" => a.kvlab = val,
            "--memcached" => a.memcached = val,
            "--clients" => a.clients = num(),
            "--depth" => a.depth = num(),
            "--seconds" => a.seconds = num() as u64,
            "--rounds" => a.rounds = num(),
            "--value" => a.value = num(),
            "--threads" => a.threads = num(),
            other => panic!("unknown flag {other}"),
        }
    }
    a
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

fn read_until<R: Read>(s: &mut R, buf: &mut Vec<u8>, ends: &[u8], count: usize) {
    let mut chunk = [0u8; 64 * 1024];
    let mut seen = 0;
    buf.clear();
    while seen < count {
        let n = s.read(&mut chunk).expect("read");
        assert!(n > 0, "server closed");
        let start = buf.len().saturating_sub(ends.len() - 1);
        buf.extend_from_slice(&chunk[..n]);
        seen += buf[start..]
            .windows(ends.len())
            .filter(|w| *w == ends)
            .count();
    }
}

fn wait_listening(addr: SocketAddr) {
    for _ in 0..200 {
        if TcpStream::connect(addr).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{addr} does not listen");
}

fn run(name: &str, mut child: Child, addr: SocketAddr, der: &[u8], a: &Args) -> f64 {
    wait_listening(addr);
    let mut c = tls_client(addr, der);
    let mut req = format!("set k 0 0 {}\r\n", a.value).into_bytes();
    req.extend(std::iter::repeat_n(b'v', a.value));
    req.extend_from_slice(b"\r\n");
    c.write_all(&req).expect("write");
    let mut buf = Vec::new();
    read_until(&mut c, &mut buf, b"STORED\r\n", 1);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let batch: Vec<u8> = b"get k\r\n".repeat(a.depth);
    let threads: Vec<_> = (0..a.clients)
        .map(|_| {
            let (stop, done, batch, der) =
                (stop.clone(), done.clone(), batch.clone(), der.to_vec());
            let depth = a.depth;
            std::thread::spawn(move || {
                let mut c = tls_client(addr, &der);
                let mut buf = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    c.write_all(&batch).expect("write");
                    read_until(&mut c, &mut buf, b"END\r\n", depth);
                    done.fetch_add(depth as u64, Ordering::Relaxed);
                }
            })
        })
        .collect();
    // Warm-up, then the measured interval.
    std::thread::sleep(Duration::from_secs(1));
    let (t0, n0) = (Instant::now(), done.load(Ordering::Relaxed));
    std::thread::sleep(Duration::from_secs(a.seconds));
    let (t1, n1) = (Instant::now(), done.load(Ordering::Relaxed));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("client");
    }
    let _ = child.kill();
    let _ = child.wait();
    let rate = (n1 - n0) as f64 / (t1 - t0).as_secs_f64();
    println!("{name:9} {rate:>10.0} gets/s over TLS");
    rate
}

fn main() {
    let a = args();
    let dir = tempfile::tempdir().expect("tempdir");
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).expect("cert");
    let (chain, key) = (dir.path().join("chain.pem"), dir.path().join("key.pem"));
    std::fs::write(&chain, cert.cert.pem()).expect("write");
    std::fs::write(&key, cert.key_pair.serialize_pem()).expect("write");
    let der = cert.cert.der().to_vec();
    let opts = format!(
        "ssl_chain_cert={},ssl_key={}",
        chain.display(),
        key.display()
    );
    let threads = a.threads.to_string();
    println!(
        "{} clients x depth {}, {} B values, server -t {}, {} s per run",
        a.clients, a.depth, a.value, a.threads, a.seconds
    );
    let (mut k, mut m) = (Vec::new(), Vec::new());
    for _ in 0..a.rounds {
        let port = free_port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let child = Command::new(&a.kvlab)
            .args([
                "server",
                "-p",
                &port.to_string(),
                "-t",
                &threads,
                "-Z",
                "-o",
                &opts,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("kvlab starts");
        k.push(run("kvlab", child, addr, &der, &a));
        let port = free_port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let child = Command::new(&a.memcached)
            .args([
                "-u",
                "root",
                "-U",
                "0",
                "-l",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .args(["-t", &threads, "-Z", "-o", &opts])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("memcached starts");
        m.push(run("memcached", child, addr, &der, &a));
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!(
        "mean: kvlab {:.0}, memcached {:.0} gets/s; kvlab / memcached = {:.2}",
        mean(&k),
        mean(&m),
        mean(&k) / mean(&m)
    );
}
