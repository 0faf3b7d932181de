//! The lab across hosts, over real ssh to network namespaces with an sshd each
//! (`kvlab_testkit::hosts`; root only — skipped, saying why, elsewhere): a two-part
//! experiment with its servers on two hosts and its load from agents on two others — every
//! process in its host's namespace, the merged histogram the sum of the agents', each host's
//! CPU read, the clocks in the report, nothing left on any host afterwards; and the refusals
//! before any run: a host that lacks a program, a host whose sshd is stopped.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::Path;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use kvlab_lab::runner::RawRun;
use kvlab_lab::{Lab, Overrides, Source};
use kvlab_testkit::hosts::NetnsHosts;
use kvlab_testkit::kvlab_bin;

/// The `[[host]]` table and `[ssh]` of namespace hosts `h1`…: each with a directory of its
/// own (they share one filesystem).
fn host_table(net: &NetnsHosts) -> String {
    let mut t = format!(
        "[ssh]\nidentity = {:?}\nknown_hosts = {:?}\nconnect_timeout = 3\n",
        net.identity().display().to_string(),
        net.known_hosts().display().to_string()
    );
    for i in 0..net.hosts().len() {
        t.push_str(&format!(
            "[[host]]\nname = \"h{n}\"\nssh = \"{}\"\ndir = \"{}\"\n",
            net.ssh_target(i),
            net.scratch().join(format!("h{}", i + 1)).display(),
            n = i + 1
        ));
    }
    t
}

fn source(text: String) -> Source {
    Source {
        label: "hosts-test.toml".into(),
        text,
        stem: "hosts-test".into(),
    }
}

/// Files under `dir` (recursively), as paths relative to it.
fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    out
}

const TWO_PARTS: &str = r#"
name = "hosts-test"
repetitions = 1
duration = 1.0
warmup = 0.5
agents = ["h3", "h4"]

[[system]]
name = "near"
kind = "kvlab"
host = "h1"
args = ["-t", "1", "-m", "16"]

[[system]]
name = "far"
kind = "kvlab"
host = "h2"
args = ["-t", "1", "-m", "16"]

[workload]
keys = 1000
value_size = 64
threads = 1

[[part]]
name = "one"
systems = ["near"]
[part.factors]
clients = [2, 4]

[[part]]
name = "two"
systems = ["far"]
[part.workload]
clients = 4
"#;

#[test]
fn a_two_part_experiment_runs_on_its_hosts_and_leaves_nothing() {
    let Some(net) = NetnsHosts::for_test("lab_on_hosts", 4) else {
        return;
    };
    let t0 = Instant::now();
    let out = net.scratch().join("results");
    let done = Lab::with_kvlab_bin(kvlab_bin())
        .run(
            &source(format!("{TWO_PARTS}\n{}", host_table(&net))),
            &Overrides::default(),
            Some(out.clone()),
        )
        .unwrap();
    let took = t0.elapsed();
    let (meta, raws) = kvlab_lab::runner::load(&done.dir).unwrap();
    assert_eq!(raws.len(), 3, "two points of part one, one of part two");
    let inode = |host: &str| {
        let i: usize = host.trim_start_matches('h').parse().unwrap();
        net.netns_inode(i - 1).unwrap()
    };
    for raw in &raws {
        assert!(raw.error.is_none(), "run {}: {:?}", raw.index, raw.error);
        // Every process in its host's namespace: the server where the system says, one
        // agent on each agent host.
        let server_host = if raw.part == "one" { "h1" } else { "h2" };
        let placed: Vec<(&str, &str)> = raw
            .placed
            .iter()
            .map(|p| (p.name.as_str(), p.host.as_str()))
            .collect();
        assert_eq!(placed.len(), 3, "{placed:?}");
        assert_eq!(placed[0].1, server_host, "{placed:?}");
        assert!(placed[1..].iter().any(|(_, h)| *h == "h3"), "{placed:?}");
        assert!(placed[1..].iter().any(|(_, h)| *h == "h4"), "{placed:?}");
        for p in &raw.placed {
            assert_eq!(
                p.netns,
                Some(inode(&p.host)),
                "{p:?} is not in its host's namespace"
            );
        }
        // The merged histogram is the sum of the agents'.
        check_merge(raw);
        // Each host's CPU read, the agents' and the server's busy.
        let hosts: Vec<&str> = raw.hosts.iter().map(|h| h.host.as_str()).collect();
        assert_eq!(hosts, ["h1", "h2", "h3", "h4"], "{:?}", raw.hosts);
        for h in &raw.hosts {
            assert!(
                h.busy_cores >= 0.0 && h.steal >= 0.0 && h.load1 >= 0.0,
                "{h:?}"
            );
            if h.host == server_host || h.host == "h3" || h.host == "h4" {
                assert_eq!(h.processes.len(), 1, "{h:?}");
                assert!(h.processes[0].1 > 0.0, "{h:?}: its process used no CPU");
            }
        }
        assert!(raw.cpu.as_ref().unwrap().utilization > 0.0);
    }
    // The population is the part's clients, split over the agents.
    assert_eq!(raws[1].population, 4);
    assert_eq!(
        raws[1].agents.iter().map(|a| a.population).sum::<usize>(),
        4
    );
    // Clocks at the start and the end, in meta.json and the report.
    assert_eq!(meta.hosts.len(), 4);
    for h in &meta.hosts {
        let (s, e) = (h.clock_start.unwrap(), h.clock_end.unwrap());
        // One machine: one clock; the estimate is within its bound of the truth (0).
        assert!(s.offset_ns.unsigned_abs() <= s.bound_ns, "{h:?}");
        assert!(e.offset_ns.unsigned_abs() <= e.bound_ns, "{h:?}");
    }
    check_hosts_reported(&done, "h3", &["near-", "agent-h3-0"]);
    // Nothing left: no process but sshd, no port but 22, no file outside the binary and
    // the run directory.
    let run = out.file_name().unwrap().to_string_lossy().into_owned();
    for i in 0..4 {
        net.wait_quiet(i, Duration::from_secs(10))
            .unwrap_or_else(|left| panic!("left on h{}: {left:?}", i + 1));
        assert_eq!(net.listening(i), vec![22], "h{} still listens", i + 1);
        let dir = net.scratch().join(format!("h{}", i + 1));
        for f in files_under(&dir) {
            assert!(
                f.starts_with("bin/kvlab-") || f.starts_with(&format!("runs/{run}/")),
                "h{}: {f} is outside the run directory",
                i + 1
            );
        }
    }
    eprintln!("{} runs on 4 hosts in {took:?}", raws.len());
}

/// The report has the hosts' table, the summary names `host`, and a log of each of `logs`
/// (name prefixes) was brought back.
fn check_hosts_reported(done: &kvlab_lab::Finished, host: &str, logs: &[&str]) {
    let report = std::fs::read_to_string(&done.report).unwrap();
    assert!(
        report.contains("Hosts") && report.contains("± "),
        "no hosts table"
    );
    assert!(done.summary.contains(host), "{}", done.summary);
    let fetched = files_under(&done.dir.join("logs"));
    for l in logs {
        assert!(fetched.iter().any(|f| f.starts_with(l)), "{l}: {fetched:?}");
    }
}

/// The run's histogram equals its agents' added up, and its count is theirs.
fn check_merge(raw: &RawRun) {
    assert_eq!(raw.agents.len(), 2, "{:?}", raw.agents);
    let mut sum: Histogram<u64> = Histogram::new_from(&raw.latency_hist.as_ref().unwrap().0);
    for a in &raw.agents {
        sum.add(&a.latency_hist.as_ref().unwrap().0).unwrap();
    }
    let merged = &raw.latency_hist.as_ref().unwrap().0;
    assert_eq!(&sum, merged, "run {}: merged != the agents' sum", raw.index);
    let completed: u64 = raw.agents.iter().map(|a| a.completed).sum();
    assert_eq!(
        completed,
        raw.result.as_ref().unwrap().counters.completed,
        "run {}",
        raw.index
    );
    assert!(
        raw.agents.iter().all(|a| a.completed > 0),
        "{:?}",
        raw.agents
    );
}

#[test]
fn hosts_that_cannot_serve_are_refused_before_any_run() {
    let Some(net) = NetnsHosts::for_test("lab_refusals", 3) else {
        return;
    };
    let lab = Lab::with_kvlab_bin(kvlab_bin());
    let run = |text: &str| {
        let t0 = Instant::now();
        let e = lab
            .run(
                &source(format!("{text}\n{}", host_table(&net))),
                &Overrides::default(),
                Some(
                    net.scratch()
                        .join(format!("results-{}", t0.elapsed().as_nanos())),
                ),
            )
            .unwrap_err();
        (format!("{e:#}"), t0.elapsed())
    };
    // The namespaces share one filesystem: a memcached binary that none has stands for a
    // host without memcached.
    let (e, took) = run(r#"
        agents = ["h1"]
        [[system]]
        name = "memcached"
        host = "h2"
        binary = "memcached-absent-on-h2"
        [[system]]
        name = "kvlab"
        host = "h3"
        "#);
    assert!(
        e.contains("missing on hosts: host h2 lacks memcached-absent-on-h2"),
        "{e}"
    );
    for i in 0..3 {
        assert!(net.others(i).is_empty(), "h{}: {:?}", i + 1, net.others(i));
    }
    eprintln!("missing tool refused in {took:?}: {e}");
    // A host whose sshd is stopped: named, and nothing started on the others.
    net.kill_sshd(2);
    let (e, took) = run(r#"
        agents = ["h1"]
        [[system]]
        name = "kvlab"
        host = "h2"
        [[system]]
        name = "other"
        kind = "kvlab"
        host = "h3"
        "#);
    assert!(e.contains("host h3: unreachable"), "{e}");
    assert!(!e.contains("host h1") && !e.contains("host h2"), "{e}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    for i in 0..3 {
        assert!(net.others(i).is_empty(), "h{}: {:?}", i + 1, net.others(i));
    }
    eprintln!("unreachable host refused in {took:?}: {e}");
}

/// Writes a tiny control experiment to `dir` (its job file `jobs`, as `jobs.toml`): one
/// 3 s trace at 500–1,000 req/s, the kvlab server on host `server`, a static-1 policy;
/// `head` adds top-level keys, `tail` more tables (policies, hosts). Returns its path.
fn control_experiment(
    dir: &Path,
    jobs: &str,
    head: &str,
    server: &str,
    tail: &str,
) -> std::path::PathBuf {
    std::fs::write(dir.join("jobs.toml"), jobs).unwrap();
    let file = dir.join("control-test.toml");
    std::fs::write(
        &file,
        format!(
            r#"
name = "control-test"
jobs = "jobs.toml"
seeds = [1]
qps_min = 500
qps_max = 1000
qps_intervals = [1]
duration = 3
grace = 5
slo_p95_us = 50000
{head}
[workload]
keys = 1000
value_size = 32
threads = 1
connections = 2
[[system]]
name = "kvlab"
host = "{server}"
args = ["-t", "1", "-m", "16"]
[[policy]]
name = "static-1"
policy = "static"
cores = 1
{tail}"#
        ),
    )
    .unwrap();
    file
}

/// The control workflow with its load from an agent on a namespace host (h1) and the
/// server, the controller and a tiny job here, on a local host at the bridge's address: the
/// run completes, the agent runs in h1's namespace and the server in this one, each host's
/// CPU is read, the hosts' clocks are in meta.json and the report, and nothing is left on
/// h1.
#[test]
fn the_control_workflow_is_loaded_from_another_host() {
    let Some(net) = NetnsHosts::for_test("control_on_hosts", 1) else {
        return;
    };
    let t0 = Instant::now();
    let dir = net.scratch();
    let file = control_experiment(
        &dir,
        "[[job]]\nname = \"nap\"\ncommand = \"sleep 1\"\nthreads = 1\ncores = [1]\n",
        "baseline = false\nagents = [\"h1\"]",
        "here",
        &format!(
            "[[host]]\nname = \"here\"\nlocal = true\naddress = \"{}\"\ndir = \"{}\"\n{}",
            net.bridge(),
            dir.join("here").display(),
            host_table(&net)
        ),
    );
    let out = dir.join("results");
    let done = Lab::with_kvlab_bin(kvlab_bin())
        .run(
            &Source::open(&file.display().to_string()).unwrap(),
            &Overrides::default(),
            Some(out.clone()),
        )
        .unwrap();
    let raw: kvlab_lab::workflow::WorkflowRun =
        serde_json::from_str(&std::fs::read_to_string(done.dir.join("raw/0001.json")).unwrap())
            .unwrap();
    assert!(raw.error.is_none(), "{:?}", raw.error);
    let outcome = raw.outcome.as_ref().unwrap();
    assert!(outcome.summary.intervals > 0, "{:?}", outcome.summary);
    // The server here, in this namespace; the agent on h1, in its.
    let here = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self/ns/net").unwrap().ino()
    };
    let placed: Vec<(&str, &str, Option<u64>)> = raw
        .placed
        .iter()
        .map(|p| (p.name.as_str(), p.host.as_str(), p.netns))
        .collect();
    assert_eq!(placed.len(), 2, "{placed:?}");
    assert_eq!(
        (placed[0].1, placed[0].2),
        ("here", Some(here)),
        "{placed:?}"
    );
    assert_eq!(
        (placed[1].0, placed[1].1, placed[1].2),
        ("agent-h1-0", "h1", Some(net.netns_inode(0).unwrap())),
        "{placed:?}"
    );
    // Each host's CPU, each busy with its process.
    let hosts: Vec<&str> = raw.hosts.iter().map(|h| h.host.as_str()).collect();
    assert_eq!(hosts, ["here", "h1"], "{:?}", raw.hosts);
    for h in &raw.hosts {
        assert_eq!(h.processes.len(), 1, "{h:?}");
        assert!(h.processes[0].1 > 0.0, "{h:?}: its process used no CPU");
    }
    let meta: kvlab_lab::workflow::WorkflowMeta =
        serde_json::from_str(&std::fs::read_to_string(done.dir.join("meta.json")).unwrap())
            .unwrap();
    assert_eq!(meta.hosts.len(), 2);
    assert!(
        meta.hosts.iter().all(|h| h.clock_end.is_some()),
        "{:?}",
        meta.hosts
    );
    check_hosts_reported(&done, "h1 (ssh", &["agent-h1-0"]);
    net.wait_quiet(0, Duration::from_secs(10))
        .unwrap_or_else(|left| panic!("left on h1: {left:?}"));
    assert_eq!(net.listening(0), vec![22], "h1 still listens");
    eprintln!("the control workflow on 2 hosts in {:?}", t0.elapsed());
}

/// The control workflow with the server, the controller and its jobs on an ssh host (h1)
/// and the load from an agent on another (h2): the calibration, the jobs alone on one core
/// and every run's `kvlab control` run on h1 (each process in h1's namespace), the load's
/// rows streamed to it; its events come back in the lab's clock (the jobs ran inside the
/// load's rows' span), and nothing is left on either host.
#[test]
fn the_controller_and_its_jobs_run_on_the_server_s_ssh_host() {
    let Some(net) = NetnsHosts::for_test("control_there", 2) else {
        return;
    };
    let t0 = Instant::now();
    let dir = net.scratch();
    let file = control_experiment(
        &dir,
        "prepare = [\"echo made > {work}/input\"]\n\
         [[job]]\nname = \"nap\"\ncommand = \"cat {work}/input && sleep 1\"\nthreads = 1\ncores = [1]\n",
        "calibrate_time = 1\ncalibrate_from = 1000\ncpus = \"0-1\"\nagents = [\"h2\"]",
        "h1",
        &format!("[[policy]]\npolicy = \"predictive\"\n{}", host_table(&net)),
    );
    // A job whose program h1 lacks: refused before anything starts, naming host and program.
    let jobs = std::fs::read_to_string(dir.join("jobs.toml")).unwrap();
    std::fs::write(
        dir.join("jobs.toml"),
        jobs.replace("sleep 1", "kvlab-no-such-program 1"),
    )
    .unwrap();
    let refused = Lab::with_kvlab_bin(kvlab_bin())
        .run(
            &Source::open(&file.display().to_string()).unwrap(),
            &Overrides::default(),
            Some(dir.join("refused")),
        )
        .unwrap_err();
    let e = format!("{refused:#}");
    assert!(
        e.contains("h1") && e.contains("kvlab-no-such-program"),
        "{e}"
    );
    assert!(!dir.join("refused/raw/0001.json").exists());
    assert!(net.others(0).is_empty(), "{:?}", net.others(0));
    std::fs::write(dir.join("jobs.toml"), jobs).unwrap();
    let out = dir.join("results");
    let done = Lab::with_kvlab_bin(kvlab_bin())
        .run(
            &Source::open(&file.display().to_string()).unwrap(),
            &Overrides::default(),
            Some(out.clone()),
        )
        .unwrap();
    let h1 = net.netns_inode(0).unwrap();
    // The calibration and the jobs' work alone were measured on h1.
    assert!(done.dir.join("calibration-kvlab.json").exists());
    assert!(done.dir.join("jobs-alone-h1.json").exists());
    assert!(!done.dir.join("jobs-alone.json").exists());
    let mut runs: Vec<kvlab_lab::workflow::WorkflowRun> = Vec::new();
    for i in 1..=3 {
        let Ok(text) = std::fs::read_to_string(done.dir.join(format!("raw/{i:04}.json"))) else {
            break;
        };
        runs.push(serde_json::from_str(&text).unwrap());
    }
    // Where each run's jobs ran against its load's rows (the lab's clock), said before any
    // assertion.
    for raw in &runs {
        let events = kvlab_control::event::read_log(&done.dir.join(&raw.control_log)).unwrap();
        let rows = kvlab_control::sensor::LiveFile::new(done.dir.join(&raw.live)).poll();
        let (from, to) = kvlab_control::summary::job_span(&events);
        let (first, last) = (
            rows.first().map_or(0, |r| r.ts_start),
            rows.last().map_or(0, |r| r.ts_end),
        );
        let (started, ended) = (
            events.first().map_or(0, |e| e.unix_ms),
            events.last().map_or(0, |e| e.unix_ms),
        );
        let jobs = match (from, to) {
            (0, _) => "no job".to_string(),
            (f, u64::MAX) => format!("jobs from {} ms, not ended", f as i64 - first as i64),
            (f, t) => format!(
                "jobs {} to {} ms",
                f as i64 - first as i64,
                t as i64 - first as i64
            ),
        };
        eprintln!(
            "run {} {}: rows {first}..{last}; from the first row: controller {} to {} ms, {jobs}; error {:?}",
            raw.index,
            raw.policy,
            started as i64 - first as i64,
            ended as i64 - first as i64,
            raw.error
        );
    }
    assert_eq!(runs.len(), 3, "the runs and their baseline");
    for (i, raw) in runs.iter().enumerate() {
        assert!(raw.error.is_none(), "run {}: {:?}", i + 1, raw.error);
    }
    let policies: Vec<&str> = runs.iter().map(|r| r.policy.as_str()).collect();
    assert_eq!(policies, ["static-1", "predictive", "no jobs"]);
    for raw in &runs {
        let outcome = raw.outcome.as_ref().unwrap();
        // The server and the controller on h1, the agent on h2.
        let placed: Vec<(&str, &str, Option<u64>)> = raw
            .placed
            .iter()
            .map(|p| (p.name.as_str(), p.host.as_str(), p.netns))
            .collect();
        assert_eq!(placed.len(), 3, "{placed:?}");
        assert_eq!((placed[0].1, placed[0].2), ("h1", Some(h1)), "{placed:?}");
        assert_eq!(placed[1].1, "h2", "{placed:?}");
        assert_eq!(
            (placed[2].0, placed[2].1, placed[2].2),
            (format!("control-{:04}", raw.index).as_str(), "h1", Some(h1)),
            "{placed:?}"
        );
        let events = kvlab_control::event::read_log(&done.dir.join(&raw.control_log)).unwrap();
        let rows = kvlab_control::sensor::LiveFile::new(done.dir.join(&raw.live)).poll();
        let (first, last) = (rows.first().unwrap().ts_start, rows.last().unwrap().ts_end);
        let (from, to) = kvlab_control::summary::job_span(&events);
        if raw.policy == "no jobs" {
            assert!(outcome.summary.jobs.is_empty());
            assert!(outcome.summary.intervals > 0, "{:?}", outcome.summary);
            continue;
        }
        // The job ran there (its input made there), after the load began: the controller
        // starts with the load's first row.
        let job = &outcome.summary.jobs[0];
        assert_eq!(job.exit, Some(0), "{job:?}");
        assert!(
            first <= from && from <= to,
            "jobs {from}..{to}, rows {first}..{last}"
        );
        assert!(raw.cost.is_some(), "{raw:?}");
        // With one core for the server, the other is the job's at once: it ran within the
        // load's rows (the controller's clock is the lab's) and the SLO was judged over it.
        // (The predictive policy may keep both cores for the server until the trace ends.)
        if raw.policy == "static-1" {
            assert!(to <= last + 1000, "jobs {from}..{to}, rows {first}..{last}");
            assert!(outcome.summary.intervals > 0, "{:?}", outcome.summary);
            assert!(raw.idle_bound.is_some(), "{raw:?}");
        }
    }
    let predictive = runs[1].outcome.as_ref().unwrap();
    assert_eq!(
        predictive.capacity.as_ref().map(|c| c.1.as_str()),
        Some("calibrated here"),
        "{:?}",
        predictive.capacity
    );
    assert!(predictive.calibration.is_some());
    for i in 0..2 {
        net.wait_quiet(i, Duration::from_secs(10))
            .unwrap_or_else(|left| panic!("left on h{}: {left:?}", i + 1));
        assert_eq!(net.listening(i), vec![22], "h{} still listens", i + 1);
    }
    eprintln!("the controller on its server's host in {:?}", t0.elapsed());
}
