//! Carrying out a control experiment: the runs in their order, each one a server, the
//! load as a child process and the controller on this thread.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kvlab_control::app;
use kvlab_control::event::read_log;
use kvlab_control::sensor::LiveFile;
use kvlab_control::summary;
use kvlab_control::{CpuSet, JobFile, PolicySpec, Share};

use super::{analyse, row_interval, WorkflowMeta, WorkflowRun, WorkflowSpec};
use crate::spec::{Flags, SystemSpec};
use crate::system::Instance;

fn cpu_list(s: &Option<String>) -> anyhow::Result<CpuSet> {
    Ok(match s {
        Some(l) => l.parse()?,
        None => CpuSet::allowed_now()?,
    })
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
        bail!("a control experiment takes --repetitions (seeds) and --duration only");
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
    let _emptied = spec.work_dir.is_some().then(|| RemoveOnDrop(work.clone()));
    let meta = WorkflowMeta {
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
    crate::runner::write_json(&out.join("meta.json"), &meta)?;
    eprintln!("making the jobs' inputs in {}", work.display());
    kvlab_control::controller::prepare(&jobs.prepare, &work)?;
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
                        policies
                            .iter()
                            .filter(|p| spec.runs(&s.name, &p.0, i))
                            .count()
                    })
                    .sum::<usize>()
            })
            .sum::<usize>();
    'all: for &seed in &spec.seeds {
        for &interval in &spec.qps_intervals {
            for (si, sys) in spec.systems.iter().enumerate() {
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
                    let run = one(
                        &spec, index, si, sys, pname, policy, *idle_jobs, interval, seed, &jobs,
                        &cpus, &generator, &work, out, kvlab_bin, &stopped,
                    );
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
                    crate::runner::write_json(
                        &out.join("raw").join(format!("{index:04}.json")),
                        &run,
                    )?;
                }
            }
        }
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

#[allow(clippy::too_many_arguments)]
fn one(
    spec: &WorkflowSpec,
    index: usize,
    si: usize,
    sys: &SystemSpec,
    pname: &str,
    policy: &PolicySpec,
    idle_jobs: bool,
    interval: f64,
    seed: u64,
    jobs: &JobFile,
    cpus: &CpuSet,
    generator: &str,
    work: &Path,
    out: &Path,
    kvlab_bin: &Path,
    stop: &dyn Fn() -> bool,
) -> WorkflowRun {
    let dir = format!("runs/{index:04}");
    let mut run = WorkflowRun {
        index,
        system: sys.name.clone(),
        policy: pname.to_string(),
        qps_interval: interval,
        seed,
        outcome: None,
        slo_windows: 0,
        slo_window_violations: 0,
        control_log: format!("{dir}/control.jsonl"),
        live: format!("{dir}/live.jsonl"),
        error: None,
    };
    if let Err(e) = one_inner(
        spec, &mut run, si, sys, policy, idle_jobs, jobs, cpus, generator, work, out, kvlab_bin,
        stop,
    ) {
        run.error = Some(format!("{e:#}"));
    }
    run
}

#[allow(clippy::too_many_arguments)]
fn one_inner(
    spec: &WorkflowSpec,
    run: &mut WorkflowRun,
    si: usize,
    sys: &SystemSpec,
    policy: &PolicySpec,
    idle_jobs: bool,
    jobs: &JobFile,
    cpus: &CpuSet,
    generator: &str,
    work: &Path,
    out: &Path,
    kvlab_bin: &Path,
    stop: &dyn Fn() -> bool,
) -> anyhow::Result<()> {
    let rdir = out.join(format!("runs/{:04}", run.index));
    std::fs::create_dir_all(&rdir)?;
    let flags = Flags {
        args: sys.render_args(&[]),
        backends: None,
        cpus: Some(cpus.to_string()),
    };
    let inst = Instance::start(
        si,
        sys,
        flags,
        false,
        &rdir.join("server.log"),
        Some(kvlab_bin),
    )?;
    let pid = inst
        .pid
        .context("the server's pid is not known (an external system?)")?;
    let live = out.join(&run.live);
    let mut bench = Command::new("taskset");
    bench
        .args(["-c", generator])
        .arg(kvlab_bin)
        .args(["bench", "-q", "-s", &inst.addr.to_string()])
        .args(["--qps-min", &spec.qps_min.to_string()])
        .args(["--qps-max", &spec.qps_max.to_string()])
        .args(["--qps-interval", &run.qps_interval.to_string()])
        .args(["--qps-seed", &run.seed.to_string()])
        .args(["--duration", &spec.duration.to_string()])
        .args(["--interval", &row_interval(run.qps_interval)?.to_string()])
        .args(["--warmup", "0"])
        .arg("--live")
        .arg(&live);
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
    // The controller starts with the trace (after the load phase fills the cache).
    let deadline = Instant::now() + Duration::from_secs(120);
    while std::fs::metadata(&live).map_or(true, |m| m.len() == 0) {
        if Instant::now() > deadline || stop() {
            end(child);
            bail!(
                "the load wrote no interval within 120 s (see {}/bench.log)",
                rdir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let options = app::Options {
        pid,
        stats: Some(inst.addr),
        live: Some(live.clone()),
        jobs: jobs.clone(),
        work: work.to_path_buf(),
        prepare: false,
        policy: policy.clone(),
        share: Share {
            cpus: cpus.clone(),
            min_server: 1,
            idle_jobs,
        },
        cpu_method: spec.cpu_method.as_deref().unwrap_or("auto").parse()?,
        pause_method: spec.pause_method.as_deref().unwrap_or("auto").parse()?,
        interval: app::DEFAULT_INTERVAL,
        // A static split that leaves the jobs no core runs the trace alone: no grace.
        max: Duration::from_secs_f64(match policy {
            PolicySpec::Static { cores } if *cores >= cpus.len() && !idle_jobs => spec.duration,
            _ => spec.duration + spec.grace.unwrap_or(60.0),
        }),
        until_jobs_done: true,
        log: out.join(&run.control_log),
        slo_p95_us: spec.slo(),
    };
    let outcome = app::control(&options, stop);
    end(child);
    inst.stop();
    let outcome = outcome?;
    let events = read_log(&options.log)?;
    let rows = LiveFile::new(live).poll();
    let (from, to) = summary::job_span(&events);
    (run.slo_windows, run.slo_window_violations) =
        summary::windows(&rows, from, to, spec.window_ms(), spec.slo()).unwrap_or((0, 0));
    run.outcome = Some(outcome);
    Ok(())
}
