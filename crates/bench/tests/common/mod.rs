//! Shared test support: small memcached-text and HTTP/1.1 (kvlab REST) test servers with
//! injectable faults, and configuration helpers.
#![allow(dead_code, clippy::unwrap_used)] // helpers of tests: a failed unwrap fails the test

use std::collections::HashMap;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvlab_bench::schedule::RatePlan;
use kvlab_bench::workload::{Mix, Workload};
use kvlab_bench::BenchConfig;

/// Faults the test server can inject.
#[derive(Default, Clone)]
pub struct Faults {
    /// After this many requests (all connections), stall every connection for the duration once.
    pub stall: Option<(u64, Duration)>,
    /// Flip one byte in the value of the n-th hit (1-based).
    pub corrupt_hit: Option<u64>,
    /// Read requests, never answer.
    pub blackhole: bool,
    /// (rate, delay, offered): while the offered rate (f64 bits in `offered`, set by the test
    /// before each run) exceeds `rate` req/s, every request is answered `delay` late — a server
    /// whose latency jumps past a throughput threshold. The test tells the server the offer
    /// rather than the server estimating it from arrivals: on a loaded machine a descheduled
    /// generator catches up in bursts that no estimate could tell from a higher rate.
    pub slow_above: Option<(f64, Duration, Arc<AtomicU64>)>,
    /// Answer every set this late (gets and deletes are not delayed).
    pub slow_sets: Option<Duration>,
}

struct FakeServer {
    data: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
    /// Held by the stalling handler; every handler passes through it per request.
    gate: Mutex<()>,
    requests: AtomicU64,
    hits: AtomicU64,
    faults: Faults,
}

impl FakeServer {
    fn new(faults: Faults) -> Arc<FakeServer> {
        Arc::new(FakeServer {
            data: Mutex::new(HashMap::new()),
            gate: Mutex::new(()),
            requests: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            faults,
        })
    }

    /// Per request: counts it, applies the stall and slow-above faults.
    fn pace(&self) {
        let n = self.requests.fetch_add(1, Ordering::SeqCst) + 1;
        match self.faults.stall {
            Some((at, d)) if n == at => {
                let _g = self.gate.lock().unwrap();
                // The fault under test: the whole server stops answering for `d`.
                std::thread::sleep(d);
            }
            _ => drop(self.gate.lock().unwrap()),
        }
        if let Some((rate, delay, offered)) = &self.faults.slow_above {
            if f64::from_bits(offered.load(Ordering::SeqCst)) > *rate {
                // The fault under test: service slows down above the threshold.
                std::thread::sleep(*delay);
            }
        }
    }

    /// A get: the value (corrupted if this hit is the chosen one).
    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        let mut v = self.data.lock().unwrap().get(key).cloned()?;
        let h = self.hits.fetch_add(1, Ordering::SeqCst) + 1;
        if self.faults.corrupt_hit == Some(h) && !v.is_empty() {
            let last = v.len() - 1;
            v[last] ^= 0x01;
        }
        Some(v)
    }
}

/// Starts the test server on 127.0.0.1:0 (ready when this returns: the socket is bound and
/// listening). Threads live until the test process ends.
pub fn test_server(faults: Faults) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let shared = FakeServer::new(faults);
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { return };
            let shared = shared.clone();
            std::thread::spawn(move || {
                let _ = handle(s, &shared);
            });
        }
    });
    addr
}

/// Starts an HTTP/1.1 test server speaking kvlab's REST interface (`GET`/`PUT`/`DELETE
/// /key/{k}`, percent-encoded keys, raw values with `Accept: application/octet-stream`,
/// keep-alive, pipelining) on 127.0.0.1:0. Its 404s have chunked JSON bodies, to exercise
/// that framing too. Threads live until the test process ends.
pub fn http_test_server(faults: Faults) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let shared = FakeServer::new(faults);
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { return };
            let shared = shared.clone();
            std::thread::spawn(move || {
                let _ = handle_http(s, &shared);
            });
        }
    });
    addr
}

fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

fn handle_http(s: TcpStream, sh: &FakeServer) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    let mut r = BufReader::new(s.try_clone()?);
    let mut w = BufWriter::new(s);
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let mut parts = line.split_whitespace();
        let (method, target) = (
            parts.next().unwrap_or("").to_string(),
            parts.next().unwrap_or("").to_string(),
        );
        assert_eq!(parts.next(), Some("HTTP/1.1"), "request line {line:?}");
        let (mut len, mut host, mut raw) = (0usize, false, false);
        loop {
            line.clear();
            r.read_line(&mut line)?;
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            let (k, v) = l.split_once(':').unwrap();
            match k.to_ascii_lowercase().as_str() {
                "content-length" => len = v.trim().parse().unwrap(),
                "host" => host = true,
                "accept" => raw = v.contains("application/octet-stream"),
                _ => {}
            }
        }
        let mut body = vec![0u8; len];
        r.read_exact(&mut body)?;
        sh.pace();
        let path = target.split('?').next().unwrap_or("");
        let key = path.strip_prefix("/key/").and_then(percent_decode);
        let reply = |w: &mut BufWriter<TcpStream>, status: &str, body: &[u8]| {
            write!(
                w,
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )?;
            w.write_all(body)
        };
        match (method.as_str(), key) {
            _ if !host => reply(&mut w, "400 Bad Request", b"{\"error\":\"no Host\"}")?,
            ("GET", Some(k)) => match sh.get(&k) {
                Some(v) => {
                    assert!(raw, "the generator asks for raw values");
                    write!(
                        w,
                        "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nFlags: 0\r\nContent-Length: {}\r\n\r\n",
                        v.len()
                    )?;
                    w.write_all(&v)?;
                }
                None => {
                    let b = b"{\"error\":\"no such key\",\"status\":404}";
                    write!(
                        w,
                        "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n",
                        b.len()
                    )?;
                    w.write_all(b)?;
                    w.write_all(b"\r\n0\r\n\r\n")?;
                }
            },
            ("PUT", Some(k)) => {
                let created = sh.data.lock().unwrap().insert(k, body).is_none();
                if created {
                    reply(&mut w, "201 Created", b"{\"created\":true}")?
                } else {
                    reply(&mut w, "200 OK", b"{\"created\":false}")?
                }
            }
            ("DELETE", Some(k)) => {
                if sh.data.lock().unwrap().remove(&k).is_some() {
                    reply(&mut w, "200 OK", b"{\"deleted\":true}")?
                } else {
                    reply(&mut w, "404 Not Found", b"{\"error\":\"no such key\"}")?
                }
            }
            _ => reply(&mut w, "400 Bad Request", b"{\"error\":\"bad request\"}")?,
        }
        if r.buffer().is_empty() {
            w.flush()?;
        }
    }
}

fn handle(s: TcpStream, sh: &FakeServer) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    let mut r = BufReader::new(s.try_clone()?);
    let mut w = BufWriter::new(s);
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        sh.pace();
        match words.first().copied() {
            Some("get") | Some("gets") => {
                for k in &words[1..] {
                    if let Some(v) = sh.get(k.as_bytes()) {
                        write!(w, "VALUE {k} 0 {}\r\n", v.len())?;
                        w.write_all(&v)?;
                        w.write_all(b"\r\n")?;
                    }
                }
                w.write_all(b"END\r\n")?;
            }
            Some("set") => {
                let len: usize = words[4].parse().unwrap();
                let mut data = vec![0u8; len + 2];
                r.read_exact(&mut data)?;
                data.truncate(len);
                if let Some(d) = sh.faults.slow_sets {
                    // The fault under test: only sets are slow.
                    std::thread::sleep(d);
                }
                sh.data
                    .lock()
                    .unwrap()
                    .insert(words[1].as_bytes().to_vec(), data);
                w.write_all(b"STORED\r\n")?;
            }
            Some("delete") => {
                let gone = sh
                    .data
                    .lock()
                    .unwrap()
                    .remove(words[1].as_bytes())
                    .is_some();
                w.write_all(if gone {
                    b"DELETED\r\n"
                } else {
                    b"NOT_FOUND\r\n"
                })?;
            }
            Some("version") => w.write_all(b"VERSION test\r\n")?,
            _ => w.write_all(b"ERROR\r\n")?,
        }
        if sh.faults.blackhole {
            // Replies stay in the (8 KiB) buffer: a test sending little never sees one.
            continue;
        }
        if r.buffer().is_empty() {
            w.flush()?;
        }
    }
}

/// A closed-loop configuration for `target`, bounded by `requests`.
pub fn closed(target: SocketAddr, requests: u64) -> BenchConfig {
    BenchConfig {
        target,
        protocol: Default::default(),
        meta_base64: false,
        cluster: false,
        threads: 1,
        connections: 2,
        depth: 4,
        think_us: 0,
        open: None,
        plan: RatePlan::fixed(0.0, 30.0).unwrap(),
        requests: Some(requests),
        warmup_s: 0.0,
        interval_s: 1.0,
        timeout_ms: 5000,
        workload: Workload {
            keys: 1000,
            mix: Mix {
                get: 9,
                set: 1,
                delete: 0,
            },
            ..Workload::default()
        },
        seed: 7,
        load: false,
        stop: Default::default(),
    }
}

/// Runs without progress output, one run at a time in this test binary.
pub fn run(cfg: &BenchConfig) -> kvlab_bench::RunResult {
    let _one = serial();
    kvlab_bench::run(cfg, &[], &mut |_| {}).unwrap()
}

/// Load runs of one test binary take turns: the tests check rates and latencies, and runs
/// sharing the machine's two cores with each other would measure each other.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    // A failed test poisons the lock; the next run is still valid.
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}
