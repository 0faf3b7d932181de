//! The real machine on this one: CPUs really move (read back from `/proc/PID/status`),
//! jobs are really stopped and continued, by every method this machine offers.

use std::process::{Command, Stdio};

use kvlab_control::machine::{
    cpus_allowed, processes_in_group, sched_idle, state, CpuMethod, PauseMethod, System,
};
use kvlab_control::{CpuSet, JobFile, Machine};

fn methods() -> Vec<(CpuMethod, PauseMethod)> {
    let mut m = vec![(CpuMethod::Affinity, PauseMethod::Signal)];
    // cgroups need root and a mounted hierarchy.
    if std::path::Path::new("/sys/fs/cgroup/cpuset/cpuset.cpus").exists()
        && unsafe { libc::geteuid() } == 0
    {
        m.push((CpuMethod::CgroupV1, PauseMethod::Freezer));
    } else {
        eprintln!("note: no writable cgroup v1 cpuset here; only affinity and signals tested");
    }
    m
}

#[test]
fn cpus_move_and_jobs_stop_and_continue() {
    let all = CpuSet::allowed_now().unwrap();
    if all.len() < 2 {
        eprintln!("note: one CPU only, nothing to move");
        return;
    }
    let two = CpuSet::of(all.iter().take(2));
    let (c0, c1) = two.split(1);
    for (cpu, pause) in methods() {
        let work = tempfile::tempdir().unwrap();
        // The "server": any process with threads of its own would do; sleep has one.
        let mut server = Command::new("sleep")
            .arg("60")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let mut m = System::new(server.id(), &two, cpu, pause, work.path()).unwrap();
        eprintln!("{}", m.describe());
        let jobs = JobFile::parse(
            "[[job]]\nname = \"spin\"\ncommand = \"sh -c 'sleep 30' & sleep 30; wait\"",
        )
        .unwrap()
        .jobs;
        m.set_cpus(&c0, &c1).unwrap();
        let pid = m.start(0, &jobs[0]).unwrap().unwrap();
        // Wait until the job has settled: both its sleeps run (every fork has exec'd). A
        // shell stopped between its vfork and the child's exec stays in D, waiting for the
        // exec, until it is continued, so a pause taken earlier never shows every process
        // in T.
        until(|| {
            let group = processes_in_group(pid as i32);
            group.len() >= 3 && group.iter().filter(|&&p| is_sleep(p)).count() >= 2
        });
        // The child and the grandchildren it forks all carry the jobs' CPUs.
        let group = processes_in_group(pid as i32);
        assert!(group.len() >= 3, "{group:?}");
        for p in &group {
            assert_eq!(
                cpus_allowed(*p),
                Some(c1.clone()),
                "{cpu:?}: job process {p}"
            );
        }
        assert_eq!(cpus_allowed(server.id()), Some(c0.clone()), "{cpu:?}");
        // The server takes both: the job is paused first (its CPUs stay as they were).
        m.pause(0).unwrap();
        let readback = m.set_cpus(&two, &CpuSet::default()).unwrap();
        assert_eq!(readback, two.to_string());
        assert_eq!(cpus_allowed(server.id()), Some(two.clone()));
        // Stopping completes asynchronously (a freezer says FREEZING, a signal waits for
        // the process to run): wait for it, bounded.
        until(|| m.job_stopped(0) == Some(true));
        assert_eq!(m.job_stopped(0), Some(true), "{cpu:?} {pause:?}");
        if pause == PauseMethod::Signal {
            // SIGSTOP takes effect when the process next runs (one in the middle of an
            // uninterruptible read shows `D` until then): wait for it, bounded.
            for p in &group {
                until(|| state(*p) == Some('T'));
                assert_eq!(state(*p), Some('T'), "process {p}");
            }
        }
        m.set_cpus(&c0, &c1).unwrap();
        m.resume(0).unwrap();
        assert_eq!(m.job_stopped(0), Some(false));
        assert_eq!(cpus_allowed(server.id()), Some(c0.clone()));
        assert!(m.ended().is_empty());
        m.stop_all();
        drop(m);
        // Moved back out of the controller's cgroup, which is gone.
        let cg = std::fs::read_to_string(format!("/proc/{}/cgroup", server.id())).unwrap();
        assert!(!cg.contains("kvlab-control"), "{cg}");
        server.kill().unwrap();
        server.wait().unwrap();
    }
}

#[test]
fn idle_jobs_and_everything_they_fork_run_at_sched_idle() {
    let all = CpuSet::allowed_now().unwrap();
    let work = tempfile::tempdir().unwrap();
    let mut server = Command::new("sleep")
        .arg("60")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let mut m = System::new(
        server.id(),
        &all,
        CpuMethod::Affinity,
        PauseMethod::Signal,
        work.path(),
    )
    .unwrap();
    m.idle_jobs().unwrap();
    let jobs = JobFile::parse("[[job]]\nname = \"j\"\ncommand = \"sleep 30 & sleep 30; wait\"")
        .unwrap()
        .jobs;
    m.set_cpus(&all, &all).unwrap();
    let pid = m.start(0, &jobs[0]).unwrap().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while processes_in_group(pid as i32).len() < 3 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let group = processes_in_group(pid as i32);
    assert!(group.len() >= 3, "{group:?}");
    for p in &group {
        assert_eq!(sched_idle(*p), Some(true), "job process {p}");
    }
    // The server is left alone.
    assert_eq!(sched_idle(server.id()), Some(false));
    m.stop_all();
    drop(m);
    server.kill().unwrap();
    server.wait().unwrap();
}

/// Whether process `pid` runs `sleep` (it has exec'd: a forked child keeps its parent's name
/// until then).
fn is_sleep(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep")
}

/// Waits (at most 5 s) until `done` holds; the assertion after it says what did not.
fn until(mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !done() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
