//! `kvlab control` calibrating where it runs: the predictive policy without `--capacity`
//! against a server throttled to a known rate, checked against a separate rate scan
//! (`kvlab bench --find-sustained`) of the same server at each core count.
//!
//! The server is this test binary run again in a child mode: a memcached-text server with a
//! thread per connection whose gets and sets each take a slot of 1/PER_CPU s on one of as
//! many virtual servers as it may use CPUs (its own affinity, which the controller and
//! `taskset` set), so its capacity is CPUs × PER_CPU requests/s whatever else runs on
//! the machine (a CPU-bound throttle measured 1.2k–1.8k req/s a core for the same work as
//! other builds came and went). A test binary of its own, so that no sibling
//! test competes for the CPU while it measures. No timed assertion but the ratio.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvlab_process::{free_port, wait_ready, Probe};

const KVLAB: &str = env!("CARGO_BIN_EXE_kvlab");
const CHILD: &str = "KVLAB_CONTROL_THROTTLED_PORT";
/// Requests/s the throttled server answers per CPU it may run on.
const PER_CPU: f64 = 1500.0;
/// The SLO both scans search against: far above the scheduling noise of a shared machine,
/// so the throttle decides.
const SLO: &str = "100000";

/// The CPUs the calling thread may run on (what the controller and taskset change).
fn allowed_cpus() -> usize {
    // SAFETY: cpu_set_t is plain data; pid 0 is the calling thread.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) } != 0 {
        return 1;
    }
    // SAFETY: set is a valid cpu_set_t.
    (unsafe { libc::CPU_COUNT(&set) } as usize).max(1)
}

/// The throttle: as many servers as the thread may use CPUs, each answering one request
/// every 1/PER_CPU s (a slot on the one free soonest); the reply is due at its slot's end.
/// Its capacity is CPUs × PER_CPU whatever else the machine runs.
fn slot(free: &Mutex<Vec<Instant>>) -> Instant {
    let k = allowed_cpus();
    let service = Duration::from_secs_f64(1.0 / PER_CPU);
    let now = Instant::now();
    let mut free = free.lock().unwrap();
    let n = free.len().max(k);
    free.resize(n, now);
    let (i, start) = free[..k]
        .iter()
        .enumerate()
        .map(|(i, &t)| (i, t.max(now)))
        .min_by_key(|&(_, t)| t)
        .unwrap();
    free[i] = start + service;
    free[i]
}

/// One connection: its reader takes each request's slot and hands the reply, due at the
/// slot's end, to its writer (so a late wake-up delays replies but does not cut the rate);
/// gets miss, sets are stored nowhere; `stats` counts them (`counts`: gets, sets, open
/// connections).
fn serve(
    conn: TcpStream,
    counts: Arc<[AtomicU64; 3]>,
    free: Arc<Mutex<Vec<Instant>>>,
) -> std::io::Result<()> {
    conn.set_nodelay(true)?;
    let mut r = BufReader::new(conn.try_clone()?);
    let (tx, rx) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
    let mut w = BufWriter::new(conn);
    std::thread::spawn(move || -> std::io::Result<()> {
        while let Ok((due, reply)) = rx.recv() {
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            w.write_all(&reply)?;
            while let Ok((due, reply)) = rx.try_recv() {
                std::thread::sleep(due.saturating_duration_since(Instant::now()));
                w.write_all(&reply)?;
            }
            w.flush()?;
        }
        Ok(())
    });
    let mut line = String::new();
    counts[2].fetch_add(1, Ordering::SeqCst);
    loop {
        line.clear();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            // The last connection gone: what it left queued is dropped, as a server drops
            // a closed connection's requests (the bench opens new ones for every rate).
            if counts[2].fetch_sub(1, Ordering::SeqCst) == 1 {
                let now = Instant::now();
                free.lock().unwrap().iter_mut().for_each(|t| *t = now);
            }
            return Ok(());
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let now = Instant::now();
        let reply = match words.first().copied() {
            Some("get" | "gets") => {
                counts[0].fetch_add(1, Ordering::Relaxed);
                (slot(&free), b"END\r\n".to_vec())
            }
            Some("set") => {
                let n: usize = words.get(4).and_then(|n| n.parse().ok()).unwrap_or(0);
                let mut data = vec![0; n + 2];
                r.read_exact(&mut data)?;
                counts[1].fetch_add(1, Ordering::Relaxed);
                let due = slot(&free);
                if words.last() == Some(&"noreply") {
                    continue;
                }
                (due, b"STORED\r\n".to_vec())
            }
            Some("version") => (now, b"VERSION throttled\r\n".to_vec()),
            Some("stats") if words.len() == 1 => {
                let (g, s) = (
                    counts[0].load(Ordering::Relaxed),
                    counts[1].load(Ordering::Relaxed),
                );
                let text = format!(
                    "STAT cmd_get {g}\r\nSTAT cmd_set {s}\r\nSTAT curr_connections 1\r\nEND\r\n"
                );
                (now, text.into_bytes())
            }
            _ => (now, b"ERROR\r\n".to_vec()),
        };
        if tx.send(reply).is_err() {
            return Ok(());
        }
    }
}

/// The child: the throttled server on the port in `$KVLAB_CONTROL_THROTTLED_PORT`, for at
/// most 5 minutes.
#[test]
fn throttled_server() {
    let Some(port) = std::env::var_os(CHILD) else {
        return;
    };
    let port: u16 = port.to_str().unwrap().parse().unwrap();
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(300));
        std::process::exit(1);
    });
    let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
    let counts: Arc<[AtomicU64; 3]> =
        Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let free = Arc::new(Mutex::new(Vec::new()));
    for conn in listener.incoming().flatten() {
        let (counts, free) = (counts.clone(), free.clone());
        std::thread::spawn(move || serve(conn, counts, free));
    }
}

/// Kills the child server when dropped.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn cpus() -> &'static str {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    if n >= 2 {
        "0-1"
    } else {
        "0"
    }
}

/// The separate scan: the server's threads pinned to `server_cpus`, `kvlab bench
/// --find-sustained` with the calibration's steps and workload; its sustained rate.
fn bench_scan(pid: u32, addr: SocketAddr, server_cpus: &str, generator: &str) -> f64 {
    // `taskset -a` sets each thread's mask in turn and fails on a thread that ended
    // meanwhile (the server's connection threads come and go): tried again, a few times.
    let pinned = (0..10).any(|_| {
        Command::new("taskset")
            .args(["-a", "-p", "-c", server_cpus, &pid.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success()
    });
    assert!(
        pinned,
        "taskset -a -p -c {server_cpus} {pid} failed 10 times"
    );
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("scan.json");
    let out = Command::new("taskset")
        .args([
            "-c",
            generator,
            KVLAB,
            "bench",
            "-q",
            "-s",
            &addr.to_string(),
        ])
        .args(["--find-sustained", "--p95-below", &format!("{SLO}us")])
        .args(["--qps-min", "5000", "--duration", "1", "--warmup", "0.3"])
        .args([
            "--max-time",
            "30",
            "-c",
            "8",
            "--keys",
            "1000",
            "--mix",
            "get=9,set=1",
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    v["searches"][0]["sustained_qps"]
        .as_f64()
        .expect("the scan found a rate")
}

#[test]
fn calibrated_capacity_matches_a_separate_rate_scan_at_each_core_count() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let port = free_port().unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let child = Child(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "throttled_server",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CHILD, port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_ready(&Probe::Version(addr), Duration::from_secs(20)).unwrap();
    let pid = child.0.id();
    let cpus = cpus();
    let generator = cpus.rsplit('-').next().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let n = if cpus == "0" { 1 } else { 2 };
    // The controller with no --capacity and no jobs: it calibrates, then runs 1 s. Its
    // figures per core count, from its summary.
    let calibrate = |run: usize| -> Vec<f64> {
        let summary = dir.path().join(format!("run-{run}.json"));
        let out = Command::new(KVLAB)
            .args([
                "control",
                "--pid",
                &pid.to_string(),
                "--addr",
                &addr.to_string(),
            ])
            .args([
                "--policy",
                "predictive",
                "--slo-p95-us",
                SLO,
                "--cpus",
                cpus,
            ])
            .args(["--generator-cpus", generator, "--calibrate-time", "30"])
            .args([
                "--calibrate-load",
                "connections=8",
                "--calibrate-load",
                "keys=1000",
            ])
            .args(["--calibrate-load", "mix=get=9,set=1", "--duration", "1"])
            .args(["--cpu-method", "affinity", "--pause-method", "signal"])
            .arg("--work-dir")
            .arg(dir.path().join("work"))
            .arg("--summary")
            .arg(&summary)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("capacity calibrated here: 1 core "),
            "{stdout}"
        );
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
        assert_eq!(v["capacity"][1], "calibrated here", "{v}");
        let calibrated: Vec<f64> = v["capacity"][0]
            .as_array()
            .unwrap()
            .iter()
            .map(|q| q.as_f64().unwrap())
            .collect();
        assert_eq!(calibrated.len(), n, "{v}");
        assert_eq!(
            v["calibration"]["capacity"][0].as_f64(),
            Some(calibrated[0])
        );
        calibrated
    };
    let mut calibrations = vec![calibrate(0)];
    let calibrated = calibrations[0].clone();
    for (k, &cal) in calibrated.iter().enumerate() {
        let server_cpus = if k == 0 { "0" } else { cpus };
        // The separate scan is itself a bisection over 1 s steps, and one step that misses
        // the SLO on a busy machine halves it: out of the band, it is scanned twice more
        // and the median of the three is the reference.
        let mut scan = bench_scan(pid, addr, server_cpus, generator);
        if !(0.85..=1.15).contains(&(cal / scan)) {
            let mut three = [
                scan,
                bench_scan(pid, addr, server_cpus, generator),
                bench_scan(pid, addr, server_cpus, generator),
            ];
            three.sort_by(f64::total_cmp);
            eprintln!("{} core(s): separate scans {three:.0?}", k + 1);
            scan = three[1];
        }
        // The calibration is the same kind of bisection: out of the band, it too is run
        // twice more and the median of three is compared.
        let mut cal = cal;
        if !(0.85..=1.15).contains(&(cal / scan)) {
            while calibrations.len() < 3 {
                calibrations.push(calibrate(calibrations.len()));
            }
            let mut three = [calibrations[0][k], calibrations[1][k], calibrations[2][k]];
            three.sort_by(f64::total_cmp);
            eprintln!("{} core(s): calibrations {three:.0?}", k + 1);
            cal = three[1];
        }
        let ratio = cal / scan;
        eprintln!("{} core(s): calibrated {cal:.0} req/s, separate scan {scan:.0} req/s, ratio {ratio:.3}", k + 1);
        assert!(
            (0.85..=1.15).contains(&ratio),
            "{} core(s): calibrated {cal:.0} req/s against a separate scan's {scan:.0} req/s",
            k + 1
        );
    }
}
