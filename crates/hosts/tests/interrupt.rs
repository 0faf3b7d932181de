//! Ctrl-C: a program that placed processes on its hosts and registered
//! `teardown_on_interrupt` stops them when it gets SIGINT, then exits with 130. The program is
//! this test binary itself, run again in a child mode.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kvlab_hosts::{teardown_on_interrupt, Fleet, Host, Settings};

const CHILD: &str = "KVLAB_HOSTS_INTERRUPT_CHILD";

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.rsplit(") ").next().unwrap_or("").starts_with('Z'))
        .unwrap_or(false)
}

/// The child: places a sleeper on a local host, says its pid, waits (at most 30 s) for the
/// signal.
#[test]
fn interrupt_child() {
    let Some(dir) = std::env::var_os(CHILD) else {
        return;
    };
    let host = Host::local("here").with_dir(std::path::Path::new(&dir).display().to_string());
    let fleet = Fleet::connect(&[host], Settings::default()).unwrap();
    teardown_on_interrupt(fleet.teardown_handle()).unwrap();
    fleet.make_run_dirs("r").unwrap();
    let p = fleet
        .get("here")
        .unwrap()
        .start("sleeper", &["sleep".into(), "60".into()])
        .unwrap();
    println!("SLEEPER {}", p.pid);
    std::thread::sleep(Duration::from_secs(30));
    panic!("no signal in 30 s");
}

#[test]
fn ctrl_c_stops_what_was_started_and_exits_130() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "interrupt_child",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD, tmp.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let pid: u32 = loop {
        let line = lines
            .next()
            .expect("the child ended before placing its sleeper")
            .unwrap();
        // libtest prints "test interrupt_child ... " first, on the same line.
        if let Some((_, p)) = line.split_once("SLEEPER ") {
            break p.trim().parse().unwrap();
        }
    };
    assert!(alive(pid));
    // SAFETY: kill has no memory preconditions; the pid is our child's.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the child did not exit in 20 s after SIGINT"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(130), "{status}");
    assert!(!alive(pid), "the sleeper (pid {pid}) outlived the Ctrl-C");
}
