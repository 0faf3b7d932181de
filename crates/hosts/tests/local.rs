//! The engine on a `local` host (no ssh, no root): the same scripts as over ssh — start under
//! a run directory, CPU and machine readings, fetch, tools, clock, stop (TERM, and KILL for
//! a process that ignores it), and teardown on drop.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::time::{Duration, Instant};

use kvlab_hosts::{Fleet, Host, HostError, Settings, Stopped};

fn fleet(dir: &std::path::Path, grace: Duration) -> Fleet {
    let host = Host::local("here").with_dir(dir.join("root").display().to_string());
    let settings = Settings {
        stop_grace: grace,
        ..Settings::default()
    };
    Fleet::connect(&[host], settings).unwrap()
}

fn alive(pid: u32) -> bool {
    // Zombies (no reaper in some containers) count as gone.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.rsplit(") ").next().unwrap_or("").starts_with('Z'))
        .unwrap_or(false)
}

#[test]
fn a_local_host_starts_reads_fetches_and_stops() {
    let tmp = tempfile::tempdir().unwrap();
    let fleet = fleet(tmp.path(), Duration::from_millis(300));
    let run = fleet.make_run_dirs("r1").unwrap()["here"].clone();
    assert!(run.ends_with("/root/runs/r1"), "{run}");
    let here = fleet.get("here").unwrap();
    // A busy loop, to have CPU time to read.
    let busy = here
        .start(
            "busy",
            &[
                "sh".into(),
                "-c".into(),
                "echo started; while :; do :; done".into(),
            ],
        )
        .unwrap();
    let stubborn = here
        .start(
            "stubborn",
            &[
                "sh".into(),
                "-c".into(),
                "trap '' TERM; echo up; sleep 60".into(),
            ],
        )
        .unwrap();
    assert!(here.running(&busy).unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    while here.cpu_seconds(&busy).unwrap() == 0.0 {
        assert!(Instant::now() < deadline, "no CPU time in 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let m = here.machine().unwrap();
    assert!(m.ticks.total > 0 && m.clk_tck > 0, "{m:?}");
    let log = tmp.path().join("busy.log");
    let n = here.fetch(&busy.log, &log).unwrap();
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "started\n");
    assert_eq!(n, 8);
    assert_eq!(
        here.missing_tools(&["sh", "kvlab-no-such-tool"]).unwrap(),
        vec!["kvlab-no-such-tool".to_string()]
    );
    let clock = fleet.clock_offsets(5).unwrap();
    let offset = clock[0].1;
    assert!(
        offset.offset_ns.unsigned_abs() <= offset.bound_ns,
        "{offset}"
    );
    assert_eq!(here.stop(&busy).unwrap(), Stopped::Terminated);
    assert!(!alive(busy.pid));
    // The stubborn one is killed after the grace period, by the teardown.
    let stopped = fleet.teardown().unwrap();
    assert_eq!(stopped.len(), 1);
    assert_eq!(stopped[0].1, Stopped::Killed);
    assert!(!alive(stubborn.pid));
    // A process that lives until it is stopped: one that exits at once (`true`) may be gone
    // before its start time is read, which is a failed start, not a dead host.
    let again = fleet.get("here").unwrap();
    let e = again.start("x", &["sleep".into(), "30".into()]);
    assert!(
        e.is_ok(),
        "a local host still works after a teardown: {e:?}"
    );
    if let Ok(p) = e {
        again.stop(&p).unwrap();
    }
    fleet.teardown().unwrap();
}

#[test]
fn dropping_a_fleet_stops_what_it_started() {
    let tmp = tempfile::tempdir().unwrap();
    let pid = {
        let fleet = fleet(tmp.path(), Duration::from_secs(2));
        fleet.make_run_dirs("r2").unwrap();
        let p = fleet
            .get("here")
            .unwrap()
            .start("sleeper", &["sleep".into(), "60".into()])
            .unwrap();
        assert!(alive(p.pid));
        p.pid
    };
    assert!(!alive(pid), "pid {pid} outlived its fleet");
}

#[test]
fn hosts_named_twice_or_badly_are_refused() {
    let e = Fleet::connect(&[Host::local("a"), Host::local("a")], Settings::default()).unwrap_err();
    assert!(
        matches!(e, HostError::Config { .. }) && e.to_string().contains("host a: named twice"),
        "{e}"
    );
    let e = Fleet::connect(&[Host::local("no good")], Settings::default()).unwrap_err();
    assert!(e.to_string().starts_with("host no good:"), "{e}");
}
