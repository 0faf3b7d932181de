//! Carrying out a control experiment: the runs in their order, each one a server, the
//! load as a child process (or from agents on other hosts, collected on a thread here) and
//! the controller on this thread.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kvlab_control::app;
use kvlab_control::calibrate::{calibrate, load_of, CalibrateSpec, Calibration};
use kvlab_control::event::read_log;
use kvlab_control::sensor::LiveFile;
use kvlab_control::summary;
use kvlab_control::{CpuSet, JobFile, PolicySpec, Share};

use super::there::There;
use super::{analyse, row_interval, WorkflowMeta, WorkflowRun, WorkflowSpec};
use crate::placement::{host_cpu, Placement, Roles};
use crate::spec::{Flags, SystemSpec};
use crate::system::Instance;

fn cpu_list(s: &Option<String>) -> anyhow::Result<CpuSet> {
    Ok(match s {
        Some(l) => l.parse()?,
        None => CpuSet::allowed_now()?,
    })
}

/// The load of one run.
enum Load {
    /// `kvlab bench` as a child process, on the generator's CPUs.
    Child(Child),
    /// kvlab bench's master on a thread here, which only collects (and writes the rows the
    /// controller reads); the load comes from agents on their hosts.
    Agents {
        stop: kvlab_bench::config::Stop,
        thread: std::thread::JoinHandle<anyhow::Result<()>>,
    },
}

impl Load {
    /// Whether it ended by itself (the trace is over, or it failed).
    fn ended(&mut self) -> bool {
        match self {
            Load::Child(c) => matches!(c.try_wait(), Ok(Some(_))),
            Load::Agents { thread, .. } => thread.is_finished(),
        }
    }

    /// Stops it and waits for it; an error is the agents' run's.
    fn end(self) -> anyhow::Result<()> {
        match self {
            Load::Child(c) => {
                end(c);
                Ok(())
            }
            Load::Agents { stop, thread } => {
                stop.raise();
                thread
                    .join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("the load's thread panicked")))
            }
        }
    }
}

/// Stops a child (the load) and waits for it.
fn end(mut c: Child) {
    // SAFETY: kill has no memory preconditions; the child is ours.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = c.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = c.kill();
    let _ = c.wait();
}

/// Runs a control experiment (`text`, from a file in `base`) into `out`; returns the report's
/// index path. Of the overrides, `repetitions` keeps the first N seeds (or seeds 1..=N)
/// and `duration` sets the trace's length; the others do not apply.
pub fn run(
    text: &str,
    base: &Path,
    out: &Path,
    kvlab_bin: &Path,
    overrides: &crate::Overrides,
) -> anyhow::Result<PathBuf> {
    let mut spec = WorkflowSpec::parse(text)?;
    if overrides.warmup.is_some() || !overrides.set.is_empty() {
        bail!("a control experiment takes --repetitions (seeds), --duration and --hosts only");
    }
    if let Some(t) = &overrides.hosts {
        spec.use_hosts(t)?;
    }
    if let Some(n) = overrides.repetitions {
        spec.seeds = if n <= spec.seeds.len() {
            spec.seeds[..n].to_vec()
        } else {
            (1..=n as u64).collect()
        };
    }
    if let Some(d) = overrides.duration {
        spec.duration = d;
    }
    let text = &toml::to_string(&spec).context("writing the experiment as run")?;
    let (jobs_text, jobs) = spec.job_file(base)?;
    let cpus = cpu_list(&spec.cpus)?;
    let generator = match &spec.generator_cpus {
        Some(g) => g.clone(),
        None => cpus.to_string(),
    };
    // The jobs' files in a directory of their own (`work_dir`, e.g. in memory: /dev/shm)
    // are removed afterwards; by default they stay with the results.
    let work = match &spec.work_dir {
        Some(dir) => std::path::Path::new(dir).join(format!("kvlab-{}", std::process::id())),
        None => out.join("work"),
    };
    std::fs::create_dir_all(out.join("raw"))?;
    std::fs::create_dir_all(out.join("runs"))?;
    std::fs::create_dir_all(&work)?;
    // Absolute: the jobs run in it and name it ({work}).
    let work = work.canonicalize()?;
    let _emptied = spec.work_dir.is_some().then(|| RemoveOnDrop(work.clone()));
    let mut meta = WorkflowMeta {
        hosts: Vec::new(),
        workflow: true,
        text: text.to_string(),
        jobs_text,
        facts: vec![
            ("kvlab version".into(), env!("CARGO_PKG_VERSION").into()),
            ("commit".into(), crate::runner::commit().into()),
            (
                "date".into(),
                crate::runner::rfc3339(std::time::SystemTime::now()),
            ),
            (
                "command".into(),
                std::env::args().collect::<Vec<_>>().join(" "),
            ),
        ],
    };
    // The roles on hosts: the agents' (and the server's, on a local host with the address
    // they reach it at) connected, checked and prepared before anything starts.
    let placed = spec.placed_hosts()?;
    let logs = out.join("logs");
    std::fs::create_dir_all(&logs)?;
    // Ctrl-C ends the run in progress cleanly (below), then everything on the hosts.
    let roles = Roles {
        hosts: &placed.hosts,
        pools: &placed.pools,
        ssh: &placed.ssh,
        systems: &spec.systems,
        exit_on_interrupt: false,
    };
    let placement = Placement::open_hosts(
        &roles,
        Some(kvlab_bin),
        &crate::placement::run_name(out),
        &logs,
    )?;
    if let Some(pl) = &placement {
        meta.hosts = pl.meta(&Default::default());
    }
    crate::runner::write_json(&out.join("meta.json"), &meta)?;
    // The controller beside each server on an ssh host: its job file there, its inputs made.
    let mut there: Vec<There> = Vec::new();
    if let Some(pl) = &placement {
        let rows = spec
            .qps_intervals
            .iter()
            .map(|&i| row_interval(i))
            .collect::<anyhow::Result<Vec<f64>>>()?
            .into_iter()
            .fold(f64::INFINITY, f64::min);
        let mut far: Vec<String> = Vec::new();
        for h in spec.systems.iter().flat_map(SystemSpec::hosts) {
            if !pl.remote(&h)?.host().is_local() && !far.contains(&h) {
                far.push(h);
            }
        }
        // The jobs' programs on each of those hosts, said before anything starts there.
        let programs = super::there::programs(&jobs);
        let needs: Vec<(&str, Vec<&str>)> = far
            .iter()
            .map(|h| (h.as_str(), programs.iter().map(String::as_str).collect()))
            .collect();
        pl.check_tools(&needs)
            .context("the jobs' programs on the controller's hosts")?;
        for h in &far {
            there.push(There::open(pl, h, &jobs, Duration::from_secs_f64(rows))?);
        }
    }
    if spec.systems.iter().any(|s| there_for(&there, s).is_none()) {
        eprintln!("making the jobs' inputs in {}", work.display());
        kvlab_control::controller::prepare(&jobs.prepare, &work)?;
    }
    let policies: Vec<(String, PolicySpec, bool)> = spec
        .policies
        .iter()
        .map(|p| spec.policy(p))
        .collect::<anyhow::Result<_>>()?;
    // SIGINT or SIGTERM ends the run in progress cleanly (jobs killed, cgroups removed, the
    // server and the load stopped) and then the experiment.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let stopped = || stop.load(std::sync::atomic::Ordering::Relaxed);
    let mut index = 0;
    let total = spec.seeds.len()
        * spec
            .qps_intervals
            .iter()
            .map(|&i| {
                spec.systems
                    .iter()
                    .map(|s| {
                        let n = policies
                            .iter()
                            .filter(|p| spec.runs(&s.name, &p.0, i))
                            .count();
                        n + if n > 0 { spec.baselines() } else { 0 }
                    })
                    .sum::<usize>()
            })
            .sum::<usize>();
    let ctx = Ctx {
        spec: &spec,
        cpus: &cpus,
        generator: &generator,
        work: &work,
        out,
        kvlab_bin,
        stop: &stopped,
        placement: placement.as_ref(),
        there: &there,
    };
    // The predictive policies without capacity: calibrated once per system, where it runs.
    let calibrations = calibrate_systems(&ctx, &policies)?;
    let work_alone = jobs_alone(&ctx, &jobs)?;
    let no_jobs = JobFile::default();
    'all: for &seed in &spec.seeds {
        for &interval in &spec.qps_intervals {
            for (si, sys) in spec.systems.iter().enumerate() {
                let mut group: Vec<WorkflowRun> = Vec::new();
                for (pname, policy, idle_jobs) in &policies {
                    if !spec.runs(&sys.name, pname, interval) {
                        continue;
                    }
                    if stopped() {
                        eprintln!("stopped by a signal");
                        break 'all;
                    }
                    index += 1;
                    eprintln!(
                        "[{index}/{total}] {} {pname} interval {interval} s seed {seed}",
                        sys.name
                    );
                    let calibration = calibrations
                        .iter()
                        .find(|(n, _)| *n == sys.name)
                        .map(|(_, c)| c);
                    let policy = match (policy, calibration) {
                        (
                            PolicySpec::Predictive {
                                slack,
                                capacity,
                                headroom,
                            },
                            Some(c),
                        ) if capacity.is_empty() => PolicySpec::Predictive {
                            slack: *slack,
                            capacity: c.capacity.clone(),
                            headroom: *headroom,
                        },
                        (p, _) => p.clone(),
                    };
                    let calibration = match &policy {
                        PolicySpec::Predictive { capacity, .. }
                            if calibration.is_some_and(|c| &c.capacity == capacity) =>
                        {
                            calibration.cloned()
                        }
                        _ => None,
                    };
                    let point = Point {
                        index,
                        si,
                        sys,
                        name: pname,
                        policy: &policy,
                        idle_jobs: *idle_jobs,
                        interval,
                        seed,
                        jobs: &jobs,
                        calibration,
                        limit: None,
                    };
                    let run = one(&ctx, &point);
                    report_run(&run);
                    crate::runner::write_json(&raw_path(out, index), &run)?;
                    group.push(run);
                }
                if group.is_empty() || !spec.baseline() {
                    continue;
                }
                let Some(limit) = baseline_length(out, &group, interval) else {
                    eprintln!("        no baseline: no controlled run of this set measured");
                    continue;
                };
                if stopped() {
                    eprintln!("stopped by a signal");
                    break 'all;
                }
                index += 1;
                eprintln!(
                    "[{index}/{total}] {} no jobs (the baseline) interval {interval} s seed {seed}, {limit:.0} s",
                    sys.name
                );
                let policy = PolicySpec::Static { cores: cpus.len() };
                let mut point = Point {
                    index,
                    si,
                    sys,
                    name: BASELINE,
                    policy: &policy,
                    idle_jobs: false,
                    interval,
                    seed,
                    jobs: &no_jobs,
                    calibration: None,
                    limit: Some(limit),
                };
                let mut base = one(&ctx, &point);
                base.baseline = true;
                report_run(&base);
                crate::runner::write_json(&raw_path(out, index), &base)?;
                // The same trace with no jobs again: its "cost" against the first is the
                // machine's own spread.
                for _ in 1..spec.baselines() {
                    if stopped() || base.outcome.is_none() {
                        break;
                    }
                    index += 1;
                    eprintln!(
                        "[{index}/{total}] {} no jobs again (the machine's spread) interval {interval} s seed {seed}, {limit:.0} s",
                        sys.name
                    );
                    point.index = index;
                    point.name = BASELINE_AGAIN;
                    let mut again = one(&ctx, &point);
                    again.baseline = true;
                    report_run(&again);
                    pair(out, &mut again, &base, None, spec.slo());
                    if let Some(c) = &again.cost {
                        eprintln!(
                            "        run {}: {} of {} segments violated with no jobs, {} in the first no-jobs run: the machine's spread {} ({} differ)",
                            again.index, c.with_jobs, c.segments, c.without_jobs, c.difference, c.differing
                        );
                    }
                    crate::runner::write_json(&raw_path(out, index), &again)?;
                }
                if base.outcome.is_some() {
                    let at = there_for(ctx.there, sys).map(|t| t.host().to_string());
                    let work_core_s = work_alone.iter().find(|(h, _)| *h == at).map(|w| w.1);
                    for r in &mut group {
                        pair(out, r, &base, work_core_s, spec.slo());
                        if let Some(c) = &r.cost {
                            eprintln!(
                                "        run {} ({}): {} of {} segments violated with the jobs, {} without: the jobs' cost {}{}",
                                r.index,
                                r.policy,
                                c.with_jobs,
                                c.segments,
                                c.without_jobs,
                                c.difference,
                                r.idle_bound.as_ref().map_or(String::new(), |b| format!(
                                    "; idle-capacity bound {:.1} s",
                                    b.bound_s
                                ))
                            );
                        }
                        crate::runner::write_json(&raw_path(out, r.index), &*r)?;
                    }
                }
            }
        }
    }
    if let Some(pl) = placement {
        let end = pl.finish()?;
        meta.hosts = pl.meta(&end);
        crate::runner::write_json(&out.join("meta.json"), &meta)?;
    }
    analyse(out)
}

/// Removes a directory (the jobs' work directory outside the results) when dropped.
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            eprintln!(
                "cannot remove the jobs' work directory {}: {e}",
                self.0.display()
            );
        }
    }
}

/// The name of the baseline runs (no jobs) in the raw files and the report.
pub const BASELINE: &str = "no jobs";
/// The name of the further no-jobs runs (`baselines` ≥ 2), each compared with the first.
pub const BASELINE_AGAIN: &str = "no jobs (again)";

fn raw_path(out: &Path, index: usize) -> PathBuf {
    out.join("raw").join(format!("{index:04}.json"))
}

fn report_run(run: &WorkflowRun) {
    match (&run.error, &run.outcome) {
        (Some(e), _) => eprintln!("        failed: {e}"),
        (None, Some(o)) => eprintln!(
            "        jobs' total {} s, violations {}/{} trace segments, \
             {}/{} 100 ms intervals, {}/{} windows",
            o.summary.total_s.map_or("-".into(), |t| format!("{t:.1}")),
            o.summary.segment_violations,
            o.summary.segments.len(),
            o.summary.violations,
            o.summary.intervals,
            run.slo_window_violations,
            run.slo_windows
        ),
        _ => {}
    }
}

/// Where `sys`'s controller runs, when not here: on its ssh host.
fn there_for<'a>(there: &'a [There], sys: &SystemSpec) -> Option<&'a There> {
    let hosts = sys.hosts();
    there
        .iter()
        .find(|t| hosts.first().is_some_and(|h| h == t.host()))
}

/// The jobs' work alone on one core, core-seconds, where each system's controller runs
/// (`None`: here; else its host): what the idle-capacity bound divides. Kept in
/// `jobs-alone.json` (here) and `jobs-alone-HOST.json`.
fn jobs_alone(ctx: &Ctx, jobs: &JobFile) -> anyhow::Result<Vec<(Option<String>, f64)>> {
    let mut out = Vec::new();
    if !ctx.spec.baseline() || jobs.jobs.is_empty() {
        return Ok(out);
    }
    let mut one = jobs.clone();
    for j in &mut one.jobs {
        j.cores = vec![1];
    }
    for sys in &ctx.spec.systems {
        let at = there_for(ctx.there, sys);
        let key = at.map(|t| t.host().to_string());
        if out.iter().any(|(k, _)| *k == key) {
            continue;
        }
        let rows = match at {
            Some(t) => {
                eprintln!(
                    "the jobs alone on one core on host {} (their work for the idle-capacity bound)",
                    t.host()
                );
                let file = ctx.out.join(format!("jobs-alone-{}.json", t.host()));
                t.speedup(&one, ctx.cpus, &file)?
            }
            None => {
                eprintln!("the jobs alone on one core (their work for the idle-capacity bound)");
                let rows = kvlab_control::speedup::speedup(&one, ctx.cpus, ctx.work)?;
                crate::runner::write_json(&ctx.out.join("jobs-alone.json"), &rows)?;
                rows
            }
        };
        out.push((key, rows.iter().map(|r| r.wall_s).sum::<f64>()));
    }
    Ok(out)
}

/// What every run of the experiment shares.
struct Ctx<'a> {
    spec: &'a WorkflowSpec,
    cpus: &'a CpuSet,
    generator: &'a str,
    work: &'a Path,
    out: &'a Path,
    kvlab_bin: &'a Path,
    stop: &'a dyn Fn() -> bool,
    /// The hosts the roles are placed on, if any.
    placement: Option<&'a Arc<Placement>>,
    /// The controllers on ssh hosts (beside their servers).
    there: &'a [There],
}

/// One run: which system, policy, trace.
struct Point<'a> {
    index: usize,
    si: usize,
    sys: &'a SystemSpec,
    name: &'a str,
    policy: &'a PolicySpec,
    idle_jobs: bool,
    interval: f64,
    seed: u64,
    jobs: &'a JobFile,
    calibration: Option<Calibration>,
    /// The run's length, s, instead of the trace's and its grace (the baseline's).
    limit: Option<f64>,
}

/// Starts `sys` alone pinned to the shared CPUs (`log` its output).
fn start_system(ctx: &Ctx, si: usize, sys: &SystemSpec, log: &Path) -> anyhow::Result<Instance> {
    let flags = Flags {
        args: sys.render_args(&[]),
        backends: None,
        cpus: Some(ctx.cpus.to_string()),
    };
    Instance::start_in(
        si,
        sys,
        flags,
        false,
        log,
        Some(ctx.kvlab_bin),
        ctx.placement,
    )
}

/// Calibrates each system that runs a predictive policy without capacity, once, on this
/// machine: its capacity per core count under the experiment's workload, the generator
/// on its CPUs; kept in `calibration-<system>.json` and each such run's raw file.
fn calibrate_systems(
    ctx: &Ctx,
    policies: &[(String, PolicySpec, bool)],
) -> anyhow::Result<Vec<(String, Calibration)>> {
    let spec = ctx.spec;
    let mut out = Vec::new();
    for (si, sys) in spec.systems.iter().enumerate() {
        let needs = policies.iter().any(|(n, p, _)| {
            matches!(p, PolicySpec::Predictive { capacity, .. } if capacity.is_empty())
                && spec
                    .qps_intervals
                    .iter()
                    .any(|&i| spec.runs(&sys.name, n, i))
        });
        if !needs {
            continue;
        }
        let mut c = CalibrateSpec::new(spec.slo(), load_of(spec.workload.clone())?);
        c.generator_cpus = Some(ctx.generator.parse()?);
        c.max_time_s = spec.calibrate_time.unwrap_or(c.max_time_s);
        c.start_qps = spec.calibrate_from.unwrap_or(spec.qps_max);
        eprintln!(
            "calibrating {} on CPUs {} (generator on {}): capacity per core count, p95 < {} µs",
            sys.name, ctx.cpus, ctx.generator, c.slo_p95_us
        );
        let log = ctx.out.join(format!("calibration-{}.log", sys.name));
        let inst = start_system(ctx, si, sys, &log)?;
        let pid = inst
            .pid
            .context("the server's pid is not known (an external system?)")?;
        let r = match there_for(ctx.there, sys) {
            Some(t) => {
                let file = ctx.out.join(format!("calibration-{}.json", sys.name));
                t.calibrate(pid, inst.addr, ctx.cpus, &c, &spec.workload, &file)
            }
            None => calibrate(pid, inst.addr, ctx.cpus, &c, ctx.stop).map_err(Into::into),
        };
        inst.stop();
        let cal = r.with_context(|| format!("calibrating {}", sys.name))?;
        eprintln!(
            "        capacity calibrated here: {} (load average {} before, {} after)",
            cal.text(),
            cal.loadavg[0],
            cal.loadavg[1]
        );
        crate::runner::write_json(
            &ctx.out.join(format!("calibration-{}.json", sys.name)),
            &cal,
        )?;
        out.push((sys.name.clone(), cal));
    }
    Ok(out)
}

/// How long the baseline of `group` runs, s: until the last trace segment any of its
/// runs judged has ended, and one interval more. `None` when none was measured.
fn baseline_length(out: &Path, group: &[WorkflowRun], interval: f64) -> Option<f64> {
    group
        .iter()
        .filter_map(|r| {
            let o = r.outcome.as_ref()?;
            let rows = LiveFile::new(out.join(&r.live)).poll();
            let start = summary::trace_start(&rows)?;
            let end = o.summary.segments.iter().map(|s| s.ts_end).max()?;
            Some(end.saturating_sub(start) as f64 / 1000.0)
        })
        .max_by(f64::total_cmp)
        .map(|s| s + interval.max(1.0) + 2.0)
}

/// Sets `run`'s jobs' cost and idle-capacity bound from the baseline `base` of its set.
fn pair(out: &Path, run: &mut WorkflowRun, base: &WorkflowRun, work: Option<f64>, slo: f64) {
    let Some(o) = &run.outcome else { return };
    let base_rows = LiveFile::new(out.join(&base.live)).poll();
    if let Some(b) = summary::segments(&base_rows) {
        run.cost = Some(summary::cost(&o.summary.segments, &b, slo));
    }
    let (Some(work), Some(b0)) = (work, summary::trace_start(&base_rows)) else {
        return;
    };
    let idle = summary::idle_samples(
        &read_log(&out.join(&base.control_log)).unwrap_or_default(),
        b0,
    );
    let rows = LiveFile::new(out.join(&run.live)).poll();
    let events = read_log(&out.join(&run.control_log)).unwrap_or_default();
    let (first, _) = summary::job_span(&events);
    if let (Some(r0), true) = (summary::trace_start(&rows), first > 0) {
        let from_s = (first as f64 - r0 as f64) / 1000.0;
        run.idle_bound = summary::idle_bound(work, &idle, from_s);
    }
}

fn one(ctx: &Ctx, p: &Point) -> WorkflowRun {
    let dir = format!("runs/{:04}", p.index);
    let mut run = WorkflowRun {
        index: p.index,
        system: p.sys.name.clone(),
        policy: p.name.to_string(),
        qps_interval: p.interval,
        seed: p.seed,
        outcome: None,
        slo_windows: 0,
        slo_window_violations: 0,
        baseline: false,
        cost: None,
        idle_bound: None,
        control_log: format!("{dir}/control.jsonl"),
        live: format!("{dir}/live.jsonl"),
        error: None,
        placed: Vec::new(),
        hosts: Vec::new(),
    };
    if let Err(e) = one_inner(ctx, p, &mut run) {
        run.error = Some(format!("{e:#}"));
    }
    run
}

fn one_inner(ctx: &Ctx, p: &Point, run: &mut WorkflowRun) -> anyhow::Result<()> {
    let Ctx {
        spec,
        cpus,
        work,
        out,
        stop,
        ..
    } = *ctx;
    let rdir = out.join(format!("runs/{:04}", run.index));
    std::fs::create_dir_all(&rdir)?;
    let inst = start_system(ctx, p.si, p.sys, &rdir.join("server.log"))?;
    let pid = inst
        .pid
        .context("the server's pid is not known (an external system?)")?;
    let live = out.join(&run.live);
    let (policy, idle_jobs) = (p.policy, p.idle_jobs);
    let there = there_for(ctx.there, p.sys);
    let methods = (
        spec.cpu_method.as_deref().unwrap_or("auto"),
        spec.pause_method.as_deref().unwrap_or("auto"),
    );
    let options = app::Options {
        pid,
        stats: Some(inst.addr),
        live: Some(live.clone()),
        jobs: p.jobs.clone(),
        work: there.map_or_else(|| work.to_path_buf(), |t| PathBuf::from(t.work())),
        prepare: false,
        policy: policy.clone(),
        share: Share {
            cpus: cpus.clone(),
            min_server: 1,
            idle_jobs,
        },
        cpu_method: methods.0.parse()?,
        pause_method: methods.1.parse()?,
        interval: app::DEFAULT_INTERVAL,
        // A static split that leaves the jobs no core runs the trace alone: no grace.
        max: Duration::from_secs_f64(match (p.limit, policy) {
            (Some(l), _) => l.min(spec.duration),
            (None, PolicySpec::Static { cores }) if *cores >= cpus.len() && !idle_jobs => {
                spec.duration
            }
            _ => spec.duration + spec.grace.unwrap_or(60.0),
        }),
        until_jobs_done: true,
        log: out.join(&run.control_log),
        slo_p95_us: spec.slo(),
        calibration: p.calibration.clone(),
        baseline: None,
    };
    // A controller on a host is started before the load, to become `kvlab control` at the
    // load's first row: ready when the trace begins, however long ssh takes.
    let running = match (there, ctx.placement) {
        (Some(t), Some(_)) => Some(t.start_control(run.index, &options, methods)?),
        _ => None,
    };
    let (mut load, procs) = match ctx.placement {
        Some(pl) if !spec.agents.is_empty() => {
            let (load, agents) = load_from_agents(ctx, pl, &inst, run, &live)?;
            let (mut procs, _) = inst.placed_processes();
            procs.extend(agents);
            run.placed = procs.iter().map(|p| pl.described(p)).collect();
            (load, procs)
        }
        _ => (load_here(ctx, &inst, run, &live, &rdir)?, Vec::new()),
    };
    let before = ctx.placement.map(|pl| pl.read(&procs));
    // The controller starts with the trace (after the load phase fills the cache).
    let deadline = Instant::now() + Duration::from_secs(120);
    while std::fs::metadata(&live).map_or(true, |m| m.len() == 0) {
        if Instant::now() > deadline || stop() || load.ended() {
            load.end()?;
            bail!(
                "the load wrote no interval within 120 s or ended (see {}/bench.log, or the \
                 agents' logs)",
                rdir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let outcome = match (running, ctx.placement) {
        (Some(r), Some(pl)) => r.finish(&options, stop).map(|(outcome, controller)| {
            run.placed.push(pl.described(&controller));
            outcome
        }),
        _ => app::control(&options, stop).map_err(Into::into),
    };
    let ended = load.end();
    if let (Some(pl), Some(before)) = (ctx.placement, &before) {
        run.hosts = host_cpu(before, &pl.read(&procs), &procs);
    }
    inst.stop();
    let mut outcome = outcome?;
    ended.context("the load")?;
    let events = read_log(&options.log)?;
    let rows = LiveFile::new(live).poll();
    if there.is_some() {
        outcome.summary = super::there::summary_here(&events, &rows, spec.slo());
    }
    let (from, to) = summary::job_span(&events);
    (run.slo_windows, run.slo_window_violations) =
        summary::windows(&rows, from, to, spec.window_ms(), spec.slo()).unwrap_or((0, 0));
    run.outcome = Some(outcome);
    Ok(())
}

/// The run's load as `kvlab bench` here: a child process on the generator's CPUs writing
/// the rows the controller reads to `live`.
fn load_here(
    ctx: &Ctx,
    inst: &Instance,
    run: &WorkflowRun,
    live: &Path,
    rdir: &Path,
) -> anyhow::Result<Load> {
    let spec = ctx.spec;
    let mut bench = Command::new("taskset");
    bench
        .args(["-c", ctx.generator])
        .arg(ctx.kvlab_bin)
        .args(["bench", "-q", "-s", &inst.addr.to_string()])
        .args(["--qps-min", &spec.qps_min.to_string()])
        .args(["--qps-max", &spec.qps_max.to_string()])
        .args(["--qps-interval", &run.qps_interval.to_string()])
        .args(["--qps-seed", &run.seed.to_string()])
        .args(["--duration", &spec.duration.to_string()])
        .args(["--interval", &row_interval(run.qps_interval)?.to_string()])
        .args(["--warmup", "0"])
        .arg("--live")
        .arg(live);
    for (k, v) in &spec.workload {
        let v = match v {
            toml::Value::String(s) => s.clone(),
            o => o.to_string(),
        };
        bench.arg(format!("--{}", k.replace('_', "-"))).arg(v);
    }
    let child = bench
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(rdir.join("bench.log"))?)
        .spawn()
        .context("starting the load (taskset kvlab bench)")?;
    Ok(Load::Child(child))
}

/// The run's load from the experiment's agents (one on each of its hosts, started once
/// through the placement, each its clock offset applied to the common start): the same
/// trace and workload as [`load_here`]'s flags say (the trace's rate is the total, split
/// over the agents; each runs the workload's threads and connections), filled from here
/// first when the workload loads, and kvlab bench's master on a thread here writing the
/// merged rows to `live`. Also the agents' processes.
fn load_from_agents(
    ctx: &Ctx,
    pl: &Placement,
    inst: &Instance,
    run: &WorkflowRun,
    live: &Path,
) -> anyhow::Result<(Load, Vec<kvlab_hosts::Started>)> {
    let spec = ctx.spec;
    let mut table = spec.workload.clone();
    for (k, v) in [
        ("qps_min", spec.qps_min),
        ("qps_max", spec.qps_max),
        ("qps_interval", run.qps_interval),
        ("duration", spec.duration),
        ("interval", row_interval(run.qps_interval)?),
        ("warmup", 0.0),
    ] {
        table.insert(k.into(), toml::Value::Float(v));
    }
    table.insert("qps_seed".into(), toml::Value::Integer(run.seed as i64));
    let load = load_of(table)?
        .to_load()
        .map_err(|e| anyhow::anyhow!("the load: {e}"))?;
    let cfg = load
        .config(inst.addr)
        .map_err(|e| anyhow::anyhow!("the load: {e}"))?;
    let agents = pl.agents(
        &spec.agents,
        &[inst.addr],
        Duration::from_nanos(cfg.interval_ns()),
    )?;
    let agents: Vec<kvlab_bench::run::Agent> = agents.into_iter().map(|(_, a)| a).collect();
    let mut file =
        std::fs::File::create(live).with_context(|| format!("creating {}", live.display()))?;
    let stop = cfg.stop.clone();
    let thread = std::thread::Builder::new()
        .name("kvlab-load".into())
        .spawn(move || {
            let mut rows = |row: &kvlab_bench::run::IntervalRow| {
                use std::io::Write as _;
                // Best effort, as kvlab bench --live: a full disk must not stop the load.
                let _ = writeln!(file, "{}", kvlab_bench::report::interval_json(row))
                    .and_then(|()| file.flush());
            };
            kvlab_bench::run::run_from(&cfg, false, &agents, &mut rows)
                .map(|_| ())
                .map_err(|e| anyhow::anyhow!("the load from the agents: {e}"))
        })
        .context("starting the load's thread")?;
    Ok((Load::Agents { stop, thread }, pl.agent_processes()))
}
