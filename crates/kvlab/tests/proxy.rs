//! `kvlab proxy` (the binary) in front of three memcached processes with every key on all
//! three: one is killed with `kill -9` in the middle of a `kvlab bench --verify` run and
//! started again empty. No verification error, no hung client, errors bounded, and the
//! backend rejoins (flushed) before the run ends.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use kvlab_client::process::{free_ports, Probe, Process, Spawn};
use kvlab_client::testing::wire::{connect, exchange};
use kvlab_client::testing::Memcached;

fn memcached_on(port: u16) -> Process {
    Spawn::new(Memcached::program())
        .args(["-U", "0", "-l", "127.0.0.1", "-m", "64", "-u", "root"])
        .args(["-p".to_string(), port.to_string()])
        .ready(Probe::Version(SocketAddr::from(([127, 0, 0, 1], port))))
        .start()
        .expect("memcached starts (.ci/run installs it)")
}

fn stats_backends(addr: SocketAddr) -> String {
    let mut s = connect(addr);
    String::from_utf8_lossy(&exchange(&mut s, b"stats backends\r\n", b"END\r\n")).into_owned()
}

fn stat(addr: SocketAddr, name: &str) -> u64 {
    let mut s = connect(addr);
    let text = String::from_utf8_lossy(&exchange(&mut s, b"stats\r\n", b"END\r\n")).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("STAT {name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Asks until `f` holds (at most 15 s).
fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::yield_now();
    }
}

#[test]
fn a_backend_killed_during_a_verified_run_costs_no_wrong_value_and_rejoins() {
    let ports = free_ports(4).unwrap();
    let mut backends: Vec<Process> = ports[..3].iter().map(|&p| memcached_on(p)).collect();
    let proxy_addr = SocketAddr::from(([127, 0, 0, 1], ports[3]));
    let mut proxy = Spawn::new(env!("CARGO_BIN_EXE_kvlab"))
        .args(["proxy", "-p", &ports[3].to_string(), "-t", "2"])
        .args(
            ports[..3]
                .iter()
                .flat_map(|p| ["--backend".to_string(), format!("127.0.0.1:{p}")]),
        )
        .args(["--replicas", "3", "--write-policy", "majority"])
        .args([
            "--timeout-ms",
            "300",
            "--failure-limit",
            "1",
            "--retry-timeout-ms",
            "100",
        ])
        .ready(Probe::Version(proxy_addr))
        .start()
        .expect("kvlab proxy starts");

    let started = Instant::now();
    let bench = std::thread::spawn(move || {
        Command::new(env!("CARGO_BIN_EXE_kvlab"))
            .args([
                "bench",
                "-s",
                &proxy_addr.to_string(),
                "-T",
                "1",
                "-c",
                "8",
                "-d",
                "2",
            ])
            .args([
                "--mix",
                "get=9,set=1",
                "--keys",
                "2000",
                "--value-size",
                "100",
            ])
            .args(["--verify", "--duration", "4", "--timeout-ms", "2000", "-q"])
            .output()
            .expect("kvlab bench runs")
    });
    // Well into the run (the keys loaded, thousands of requests served): kill -9; once the
    // proxy has ejected it, the same port again, empty.
    until("the run is under way", || {
        stat(proxy_addr, "proxy_requests") >= 20_000
    });
    backends[1].kill();
    until("the killed backend is ejected", || {
        stats_backends(proxy_addr).contains("STAT backend:1:ejected 1")
    });
    backends[1] = memcached_on(ports[1]);
    let out = bench.join().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the run hung: {text}"
    );
    let line = text
        .lines()
        .find(|l| l.contains("errors "))
        .expect("an errors line");
    assert!(line.contains("(verification 0)"), "{line}\n{text}");
    let errors: u64 = line
        .split_whitespace()
        .nth(1)
        .unwrap()
        .trim_end_matches(',')
        .parse()
        .unwrap();
    let measured = text.lines().find(|l| l.contains("measured")).unwrap();
    let requests: u64 = measured.split_whitespace().nth(3).unwrap().parse().unwrap();
    assert!(
        errors * 100 <= requests,
        "errors not bounded: {errors} of {requests}\n{text}"
    );
    assert!(line.contains("timeouts 0"), "{line}");
    let stats = stats_backends(proxy_addr);
    // Once: after the rejoin no worker uses a connection to the killed process.
    assert!(stats.contains("STAT backend:1:ejections 1"), "{stats}");
    assert!(stats.contains("STAT backend:1:rejoins 1"), "{stats}");
    assert!(stats.contains("STAT backend:1:ejected 0"), "{stats}");
    proxy.kill();
}
