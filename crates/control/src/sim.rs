//! A simulated server and machine for the policies' tests: the server's p95 follows from
//! the offered rate and its cores (an M/M/1-like curve per core), jobs are amounts of work
//! that progress only while they run, and time is whatever the test says.

use std::time::Duration;

use crate::controller::{Controller, Machine, Share};
use crate::cpus::CpuSet;
use crate::event::{EventLog, What};
use crate::jobs::{JobFile, JobSpec};
use crate::policy::{Policy, PolicySpec, Signal, Slack};

/// Requests/s one core serves.
const PER_CORE: f64 = 50_000.0;
/// p95 of an idle server, µs.
const BASE_US: f64 = 100.0;

fn p95_us(qps: f64, cores: usize) -> f64 {
    let rho = qps / (cores as f64 * PER_CORE);
    if rho >= 1.0 {
        100_000.0
    } else {
        BASE_US / (1.0 - rho)
    }
}

#[derive(Default)]
struct SimJob {
    work: f64,
    done: f64,
    running: bool,
    started: bool,
    reported: bool,
}

#[derive(Default)]
struct Sim {
    server: CpuSet,
    jobs_cpus: CpuSet,
    jobs: Vec<SimJob>,
    work: Vec<f64>,
    starts: Vec<usize>,
    /// Jobs run at idle priority and may share the server's CPUs.
    idle: bool,
}

impl Sim {
    /// Whether running jobs are on the server's CPUs (at idle priority).
    fn sharing(&self) -> bool {
        self.idle
            && self.jobs.iter().any(|j| j.running)
            && self.jobs_cpus.iter().any(|c| self.server.contains(c))
    }

    /// Advances running jobs by `dt` while the server is busy `rho` of each of its cores:
    /// the running jobs share their own CPUs and, at idle priority, what the server leaves
    /// of its own; a job goes at most at one core's speed.
    fn advance(&mut self, dt: f64, rho: f64) {
        let own = self
            .jobs_cpus
            .iter()
            .filter(|&c| !self.server.contains(c))
            .count() as f64;
        let idle = if self.idle {
            self.jobs_cpus
                .iter()
                .filter(|&c| self.server.contains(c))
                .count() as f64
                * (1.0 - rho.min(1.0))
        } else {
            0.0
        };
        let running = self.jobs.iter().filter(|j| j.running).count() as f64;
        let speed = ((own + idle) / running.max(1.0)).min(1.0);
        for j in &mut self.jobs {
            if j.running && j.done < j.work {
                j.done = (j.done + dt * speed).min(j.work);
            }
        }
    }
}

impl Machine for Sim {
    fn set_cpus(&mut self, server: &CpuSet, jobs: &CpuSet) -> Result<String, crate::ControlError> {
        self.server = server.clone();
        if !jobs.is_empty() {
            self.jobs_cpus = jobs.clone();
        }
        Ok(server.to_string())
    }
    fn start(&mut self, i: usize, _job: &JobSpec) -> Result<Option<u32>, crate::ControlError> {
        if self.jobs.len() <= i {
            self.jobs.resize_with(i + 1, SimJob::default);
        }
        let j = &mut self.jobs[i];
        assert!(!j.started, "job {i} started twice");
        j.work = self.work[i];
        j.running = true;
        j.started = true;
        self.starts.push(i);
        Ok(None)
    }
    fn pause(&mut self, i: usize) -> Result<(), crate::ControlError> {
        assert!(self.jobs[i].running);
        self.jobs[i].running = false;
        Ok(())
    }
    fn resume(&mut self, i: usize) -> Result<(), crate::ControlError> {
        assert!(!self.jobs[i].running);
        self.jobs[i].running = true;
        Ok(())
    }
    fn ended(&mut self) -> Vec<(usize, Option<i32>)> {
        let mut out = Vec::new();
        for (i, j) in self.jobs.iter_mut().enumerate() {
            if j.started && !j.reported && j.done >= j.work {
                j.reported = true;
                j.running = false;
                out.push((i, Some(0)));
            }
        }
        out
    }
    fn stop_all(&mut self) {}
    fn idle_jobs(&mut self) -> Result<(), crate::ControlError> {
        self.idle = true;
        Ok(())
    }
}

const SLACK: Slack = Slack {
    slo_p95_us: 1000.0,
    grow_slack: 0.05,
    shrink_slack: 0.20,
    hold: 10,
    latency: crate::policy::LatencySource::Auto,
    max_queued: None,
    latency_window_ms: 0,
    segment_budget: None,
};

fn reactive() -> PolicySpec {
    PolicySpec::Reactive { slack: SLACK }
}

fn predictive() -> PolicySpec {
    PolicySpec::Predictive {
        slack: SLACK,
        // Within the SLO (p95 < 1 ms) up to ρ = 0.9 per core.
        capacity: vec![45_000.0, 90_000.0],
        headroom: 0.1,
    }
}

/// What the controller sees of the simulated server.
#[derive(Clone, Copy, PartialEq)]
enum View {
    /// The load's p95 (a `--live` file) and the server's `stats` rate.
    Client,
    /// No load figures: the server's own p95 and queue (kvlab's `stats latency`), attached
    /// to a server under someone else's load.
    Server,
}

/// A run: `load(t)` the offered rate; jobs of `work` seconds each; 100 ms samples up to
/// `secs`. Returns the controller and the server's cores after every sample.
fn drive(
    spec: PolicySpec,
    jobs: &str,
    work: &[f64],
    load: impl Fn(f64) -> f64,
    secs: f64,
) -> (Controller<Sim>, Vec<(f64, usize)>) {
    drive_seen(spec, jobs, work, load, secs, View::Client, false)
}

/// [`drive`], seeing the server through `view`.
fn drive_seen(
    spec: PolicySpec,
    jobs: &str,
    work: &[f64],
    load: impl Fn(f64) -> f64,
    secs: f64,
    view: View,
    idle_jobs: bool,
) -> (Controller<Sim>, Vec<(f64, usize)>) {
    drive_on(spec, jobs, work, load, secs, view, idle_jobs, |_| 0.0)
}

/// [`drive_seen`] on a machine that adds `machine_us(t)` to every p95, whatever runs (a
/// virtual CPU's wake-ups: no share of cores takes it away).
#[allow(clippy::too_many_arguments)]
fn drive_on(
    spec: PolicySpec,
    jobs: &str,
    work: &[f64],
    load: impl Fn(f64) -> f64,
    secs: f64,
    view: View,
    idle_jobs: bool,
    machine_us: impl Fn(f64) -> f64,
) -> (Controller<Sim>, Vec<(f64, usize)>) {
    let jobs: Vec<JobSpec> = JobFile::parse(jobs).unwrap().jobs;
    let sim = Sim {
        work: work.to_vec(),
        ..Sim::default()
    };
    let share = Share {
        cpus: CpuSet::first(2),
        min_server: 1,
        idle_jobs,
    };
    let mut c = Controller::new(sim, Policy::new(spec), jobs, share, EventLog::memory()).unwrap();
    let mut cores = Vec::new();
    let dt = 0.1;
    let mut t = 0.0;
    while t < secs {
        t += dt;
        let qps = load(t);
        let cores_now = c.server_cores();
        let rho = (qps / (cores_now as f64 * PER_CORE)).min(0.999);
        // Idle-priority jobs on the server's CPUs are preempted at once, but they share its
        // caches: 15% on its latency while they run there.
        let shared = if c.machine.sharing() { 1.15 } else { 1.0 };
        c.machine.advance(dt, rho);
        let p95 = p95_us(qps, cores_now) * shared + machine_us(t);
        let s = Signal {
            t: Duration::from_secs_f64(t),
            p95_us: (view == View::Client).then_some(p95),
            qps: Some(qps),
            cpu: Some((qps / PER_CORE).min(cores_now as f64)),
            conns: Some(4),
            // Inside the server: the same curve less the network's 50 µs; the mean queue
            // of an M/M/1 at that load.
            server_p95_us: (view == View::Server).then_some(p95 - 50.0),
            queued: (view == View::Server).then_some(rho * rho / (1.0 - rho)),
            segment: None,
            idle_cores: None,
        };
        c.step(&s).unwrap();
        assert_eq!(c.machine.server.len(), c.server_cores());
        cores.push((t, c.server_cores()));
    }
    (c, cores)
}

fn at(cores: &[(f64, usize)], t: f64) -> usize {
    cores
        .iter()
        .find(|(x, _)| (x - t).abs() < 1e-6)
        .map(|&(_, c)| c)
        .unwrap()
}

const ONE_JOB: &str = "[[job]]\nname = \"batch\"\ncommand = \"x\"";

fn step_load(t: f64) -> f64 {
    // 88k on two cores: p95 ≈ 830 µs, slack 0.17: no calm to give a core back.
    if (3.0..6.0).contains(&t) {
        88_000.0
    } else {
        10_000.0
    }
}

#[test]
fn every_policy_grants_cores_within_one_sample_of_a_load_step_and_returns_them() {
    for spec in [reactive(), predictive()] {
        let name = spec.name();
        let (c, cores) = drive(spec, ONE_JOB, &[100.0], step_load, 10.0);
        // Calm low load: one core given back within the hold.
        assert_eq!(at(&cores, 2.9), 1, "{name}: {cores:?}");
        // The load steps up at 3.0: the sample at 3.0 already grants the second core.
        assert_eq!(at(&cores, 3.0), 2, "{name}");
        assert!(cores
            .iter()
            .filter(|(t, _)| (3.0..6.0).contains(t))
            .all(|&(_, c)| c == 2));
        // It steps down at 6.0: the core goes back (within a few holds), and stays back.
        assert_eq!(at(&cores, 9.0), 1, "{name}: {cores:?}");
        // The job was paused for the step and resumed after it.
        let ev: Vec<&What> = c.log.events.iter().map(|e| &e.what).collect();
        assert!(ev.iter().any(|w| matches!(w, What::Pause { .. })), "{name}");
        assert!(
            ev.iter().any(|w| matches!(w, What::Resume { .. })),
            "{name}"
        );
    }
}

#[test]
fn the_predictive_policy_acts_before_the_latency_moves() {
    // 43k req/s on one core: p95 ≈ 714 µs, inside the SLO with slack 0.29, so the reactive
    // policy keeps one core; with 10% headroom the prediction (45k per core) asks for two.
    let load = |t: f64| if t >= 3.0 { 43_000.0 } else { 10_000.0 };
    let (_, r) = drive(reactive(), ONE_JOB, &[100.0], load, 5.0);
    let (_, p) = drive(predictive(), ONE_JOB, &[100.0], load, 5.0);
    assert_eq!((at(&r, 2.9), at(&p, 2.9)), (1, 1));
    assert_eq!(at(&r, 4.0), 1);
    assert_eq!(at(&p, 3.0), 2);
}

#[test]
fn a_static_split_never_moves_and_the_jobs_use_the_rest() {
    let (c, cores) = drive(
        PolicySpec::Static { cores: 1 },
        ONE_JOB,
        &[2.0],
        step_load,
        4.0,
    );
    assert!(cores.iter().all(|&(_, c)| c == 1));
    let e = &c.queue.entries[0];
    assert_eq!(e.pauses, 0);
    assert!(c.queue.all_done());
}

#[test]
fn paused_time_is_excluded_from_runtime() {
    // 4 s of work; the step at 3 s pauses it for 3 s and more.
    let (c, _) = drive(reactive(), ONE_JOB, &[4.0], step_load, 12.0);
    let e = &c.queue.entries[0];
    assert!(c.queue.all_done());
    let runtime = e.runtime(Duration::ZERO).as_secs_f64();
    let wall = (e.ended.unwrap() - e.started.unwrap()).as_secs_f64();
    assert!(e.pauses >= 1 && e.paused.as_secs_f64() >= 3.0, "{e:?}");
    // Work advances before the sample that sees it end: the end is seen within a sample.
    assert!((4.0..=4.1 + 1e-9).contains(&runtime), "{runtime}");
    assert!((wall - runtime - e.paused.as_secs_f64()).abs() < 1e-9);
    let end = c.log.events.iter().find_map(|ev| match &ev.what {
        What::End { runtime_s, .. } => Some(*runtime_s),
        _ => None,
    });
    assert_eq!(end, Some(runtime));
}

#[test]
fn the_job_order_and_dependencies_hold_under_a_policy() {
    let jobs = r#"
        [[job]]
        name = "a"
        command = "x"
        [[job]]
        name = "b"
        command = "x"
        after = ["a"]
        [[job]]
        name = "c"
        command = "x"
        order = 5
        [[job]]
        name = "d"
        command = "x"
        order = 3
        "#;
    let (c, _) = drive(reactive(), jobs, &[1.0, 1.0, 1.0, 1.0], step_load, 12.0);
    assert!(c.queue.all_done());
    let names: Vec<&str> = c
        .machine
        .starts
        .iter()
        .map(|&i| c.queue.entries[i].spec.name.as_str())
        .collect();
    assert_eq!(names, ["a", "b", "d", "c"]);
    let e = |n: &str| c.queue.entries.iter().find(|e| e.spec.name == n).unwrap();
    assert!(e("b").started >= e("a").ended);
}

#[test]
fn without_the_load_s_p95_the_guard_reacts_to_the_server_s_own() {
    // Attached to a server under someone else's load: no --live file, only `stats latency`.
    for spec in [reactive(), predictive()] {
        let name = spec.name();
        let (c, cores) = drive_seen(
            spec,
            ONE_JOB,
            &[100.0],
            step_load,
            10.0,
            View::Server,
            false,
        );
        assert_eq!(at(&cores, 2.9), 1, "{name}: {cores:?}");
        assert_eq!(at(&cores, 3.0), 2, "{name}: {cores:?}");
        assert_eq!(at(&cores, 9.0), 1, "{name}: {cores:?}");
        let grown = c.log.events.iter().find_map(|e| match e.what {
            What::Cores { from: 1, to: 2, .. } => Some(e.reason.clone()),
            _ => None,
        });
        if name == "reactive" {
            assert!(grown.unwrap().contains("server p95"), "{name}");
        }
    }
    // Told to use only the load's p95, the reactive policy has no latency and holds.
    let client_only = PolicySpec::Reactive {
        slack: Slack {
            latency: crate::policy::LatencySource::Client,
            ..SLACK
        },
    };
    let (_, cores) = drive_seen(
        client_only,
        ONE_JOB,
        &[100.0],
        step_load,
        4.0,
        View::Server,
        false,
    );
    assert!(cores.iter().all(|&(_, c)| c == 2), "{cores:?}");
}

#[test]
fn a_queue_past_its_bound_grants_a_core_although_the_latency_is_within_the_slo() {
    // 40k req/s on one core: ρ 0.8, p95 500 µs (slack 0.5), 3.2 connections queued.
    let load = |t: f64| if t >= 3.0 { 40_000.0 } else { 10_000.0 };
    let queue_bound = PolicySpec::Reactive {
        slack: Slack {
            max_queued: Some(2.0),
            ..SLACK
        },
    };
    let (_, plain) = drive_seen(
        reactive(),
        ONE_JOB,
        &[100.0],
        load,
        5.0,
        View::Server,
        false,
    );
    let (c, bound) = drive_seen(
        queue_bound,
        ONE_JOB,
        &[100.0],
        load,
        5.0,
        View::Server,
        false,
    );
    assert_eq!((at(&plain, 2.9), at(&bound, 2.9)), (1, 1));
    assert_eq!(at(&plain, 4.0), 1);
    assert_eq!(at(&bound, 3.0), 2);
    let why = c.log.events.iter().find_map(|e| match e.what {
        What::Cores { from: 1, to: 2, .. } => Some(e.reason.clone()),
        _ => None,
    });
    assert!(why.unwrap().contains("connections queued > 2.0"));
}

#[test]
fn idle_jobs_run_on_the_server_s_cores_of_a_static_split_that_leaves_them_none() {
    // static-2 on two cores: without idle jobs the job never starts; with them it runs on
    // the server's idle time (10k req/s: 90% of two cores) and finishes, the server keeping
    // both cores all along.
    let calm = |_: f64| 10_000.0;
    let (plain, _) = drive(PolicySpec::Static { cores: 2 }, ONE_JOB, &[2.0], calm, 5.0);
    assert!(plain.queue.entries[0].started.is_none());
    let (c, cores) = drive_seen(
        PolicySpec::Static { cores: 2 },
        ONE_JOB,
        &[2.0],
        calm,
        5.0,
        View::Client,
        true,
    );
    assert!(cores.iter().all(|&(_, n)| n == 2));
    assert!(c.queue.all_done(), "{:?}", c.queue.entries[0]);
    assert!(c.log.events.iter().any(|e| matches!(
        &e.what,
        What::Idle { on: true, job_cpus } if job_cpus == "0-1"
    )));
    // The job processes are at idle priority: the machine was told before the start.
    assert!(c.machine.idle);
}

#[test]
fn with_idle_jobs_the_reactive_policy_pauses_only_when_slack_runs_out() {
    let spec = reactive();
    let (c, cores) = drive_seen(spec, ONE_JOB, &[100.0], step_load, 10.0, View::Client, true);
    let ev = &c.log.events;
    let at_t = |e: &crate::event::Event| e.t_s;
    // The first pause comes only with the step at 3 s: before it the job ran throughout,
    // on its own core and the server's idle time.
    let first_pause = ev
        .iter()
        .find(|e| matches!(e.what, What::Pause { .. }))
        .map(at_t)
        .expect("a pause");
    assert!(
        first_pause >= 3.0 - 1e-9,
        "{first_pause}: {:#?}",
        ev.iter()
            .filter(|e| !matches!(e.what, What::Sample { .. }))
            .collect::<Vec<_>>()
    );
    // At the step: both cores to the server (1.15 × 830 µs leaves slack < 5%), then the
    // jobs off its cores too (idle off) and paused; after it, back on.
    assert_eq!(at(&cores, 3.1), 2);
    // (The initial share, at 0, is every core to the server and the jobs off them.)
    let off = ev
        .iter()
        .find(|e| matches!(e.what, What::Idle { on: false, .. }) && e.t_s > 0.0)
        .expect("idle off");
    assert!(off.t_s >= 3.0 - 1e-9 && off.t_s < 6.0, "{}", off.t_s);
    assert!(ev
        .iter()
        .any(|e| matches!(e.what, What::Idle { on: true, .. }) && e.t_s >= 6.0));
    assert!(ev
        .iter()
        .any(|e| matches!(e.what, What::Resume { .. }) && e.t_s >= 6.0));
    assert_eq!(at(&cores, 9.9), 1, "{cores:?}");
}

#[test]
fn a_pause_that_does_not_bring_the_latency_back_ends_and_waits_before_the_next() {
    // From 2 s to 12 s the machine adds 2 ms to every p95 whatever runs: pausing the jobs
    // cannot help. Each pause is judged by its first hold (10 samples) and ended; the next
    // waits 2, 4, 8 s: three pauses in the ten seconds, not one lasting all of them.
    let calm = |_: f64| 10_000.0;
    let slow = |t: f64| {
        if (2.0..12.0).contains(&t) {
            2_000.0
        } else {
            0.0
        }
    };
    let (c, _) = drive_on(
        reactive(),
        ONE_JOB,
        &[100.0],
        calm,
        15.0,
        View::Client,
        true,
        slow,
    );
    let ev = &c.log.events;
    let pauses: Vec<f64> = ev
        .iter()
        .filter(|e| matches!(e.what, What::Pause { .. }))
        .map(|e| e.t_s)
        .collect();
    let useless = ev
        .iter()
        .filter(|e| e.reason.starts_with("pausing the jobs did not help"))
        .count();
    assert_eq!(pauses.len(), 3, "{pauses:?}");
    assert_eq!(useless, 3);
    let paused = c.queue.entries[0].paused.as_secs_f64();
    assert!(
        paused < 3.5,
        "paused {paused} s of the 10 s the machine was slow"
    );
    // The same run with pauses that help (the 88k step) keeps its pause: see
    // `with_idle_jobs_the_reactive_policy_pauses_only_when_slack_runs_out`.
}
