//! Shared test support: a small memcached-text test server with injectable faults, and
//! configuration helpers.
#![allow(dead_code, clippy::unwrap_used)] // helpers of tests: a failed unwrap fails the test

use std::collections::HashMap;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvlab_bench::schedule::RatePlan;
use kvlab_bench::workload::{Mix, Workload};
use kvlab_bench::Config;

/// Faults the test server can inject.
#[derive(Default, Clone)]
pub struct Faults {
    /// After this many requests (all connections), stall every connection for the duration once.
    pub stall: Option<(u64, Duration)>,
    /// Flip one byte in the value of the n-th hit (1-based).
    pub corrupt_hit: Option<u64>,
    /// Read requests, never answer.
    pub blackhole: bool,
}

struct Shared {
    data: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
    /// Held by the stalling handler; every handler passes through it per request.
    gate: Mutex<()>,
    requests: AtomicU64,
    hits: AtomicU64,
    faults: Faults,
}

/// Starts the test server on 127.0.0.1:0 (ready when this returns: the socket is bound and
/// listening). Threads live until the test process ends.
pub fn test_server(faults: Faults) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let shared = Arc::new(Shared {
        data: Mutex::new(HashMap::new()),
        gate: Mutex::new(()),
        requests: AtomicU64::new(0),
        hits: AtomicU64::new(0),
        faults,
    });
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

fn handle(s: TcpStream, sh: &Shared) -> std::io::Result<()> {
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
        let n = sh.requests.fetch_add(1, Ordering::SeqCst) + 1;
        match sh.faults.stall {
            Some((at, d)) if n == at => {
                let _g = sh.gate.lock().unwrap();
                // The fault under test: the whole server stops answering for `d`.
                std::thread::sleep(d);
            }
            _ => drop(sh.gate.lock().unwrap()),
        }
        match words.first().copied() {
            Some("get") | Some("gets") => {
                for k in &words[1..] {
                    let v = sh.data.lock().unwrap().get(k.as_bytes()).cloned();
                    if let Some(mut v) = v {
                        let h = sh.hits.fetch_add(1, Ordering::SeqCst) + 1;
                        if sh.faults.corrupt_hit == Some(h) && !v.is_empty() {
                            let last = v.len() - 1;
                            v[last] ^= 0x01;
                        }
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
pub fn closed(target: SocketAddr, requests: u64) -> Config {
    Config {
        target,
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
    }
}

/// Runs without progress output.
pub fn run(cfg: &Config) -> kvlab_bench::RunResult {
    kvlab_bench::run(cfg, &[], &mut |_| {}).unwrap()
}
