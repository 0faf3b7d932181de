//! The control workflow as an experiment: a server under a random rate trace, the batch
//! jobs, and `kvlab control` moving cores between them — for every trace seed × trace
//! interval × policy × system (policies interleaved, A B C A B C), then a report.
//!
//! ```text
//! control experiment (TOML) ─► for each run:
//!   system::Instance::start (the server, pinned to the shared CPUs)
//!   taskset -c <generator_cpus> kvlab bench --qps-min/max/interval/seed --interval 0.1
//!       --live runs/NNNN/live.jsonl                     (the load, a child process)
//!   kvlab_control::app::control (this thread; log runs/NNNN/control.jsonl)
//!       until every job ended (or the trace plus `grace` passed); then the load is stopped
//!   ─► raw/NNNN.json (the run's figures)  ─► report/ (plots per run, tables per policy)
//! ```
//!
//! The file:
//!
//! ```toml
//! name = "control-workflow"
//! description = ""
//! jobs = "control-jobs"          # a job file: a path (relative to this file) or a
//!                                # shipped one (control-jobs, control-jobs-quick)
//! seeds = [1, 2, 3]              # trace seeds
//! qps_min = 5000                 # the trace: a rate drawn in [qps_min, qps_max] ...
//! qps_max = 100000
//! qps_intervals = [10, 5, 1]     # ... every interval seconds (one study per interval)
//! duration = 300                 # the longest a trace lasts, s
//! grace = 60                     # how long jobs may run on after the trace, s
//! slo_p95_us = 1000              # the p95 bound, µs
//! slo_window = 1.0               # the SLO is also judged per window of this many seconds
//! cpus = "0-1"                   # shared by the server and the jobs
//! generator_cpus = "1"           # the load generator's CPUs, the same for every policy
//! cpu_method = "auto"            # as kvlab control's --cpu-method / --pause-method
//! pause_method = "auto"
//! [workload]                     # more kvlab bench flags (keys, value_size, mix, …)
//! [[system]]                     # as in lab experiments (name, kind, args, binary, …)
//! [[policy]]                     # name (default: the policy), policy = "static" |
//! policy = "static"              # "reactive" | "predictive"; cores (static); capacity,
//! cores = 1                      # headroom (predictive); grow_slack, shrink_slack, hold,
//!                                # latency ("auto" | "client" | "server"), max_queued;
//!                                # idle_jobs = true: jobs also on the server's CPUs at
//!                                # SCHED_IDLE (kvlab control --idle-jobs)
//! ```
//!
//! The SLO is judged over the jobs' span three ways (`kvlab_control::summary`): per trace
//! segment (the headline: each segment's p95 over all its requests, as the generator
//! reports it), per 100 ms interval (each on its own p95: stricter), and per `slo_window`
//! (the p95 over all of a window's requests). The load's 100 ms rows carry their
//! histograms, so the segments' and windows' p95 are exact.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kvlab_bench::run::IntervalRow;
use kvlab_control::app::{self, Outcome};
use kvlab_control::event::{read_log, What};
use kvlab_control::sensor::LiveFile;
use kvlab_control::summary::{self, Segment};
use kvlab_control::{CpuSet, JobFile, PolicySpec, Share, Slack, DEFAULT_HEADROOM, DEFAULT_SLACK};
use kvlab_report::{Item, LinePlot, Mark, Point, Report, Row, Section, Series, Table, Y2};
use serde::{Deserialize, Serialize};

use crate::spec::{Flags, SystemSpec};
use crate::system::Instance;

/// The shipped job files: (name, text).
pub const SHIPPED_JOBS: &[(&str, &str)] = &[
    (
        "control-jobs",
        include_str!("../../../experiments/control-jobs.toml"),
    ),
    (
        "control-jobs-quick",
        include_str!("../../../experiments/control-jobs-quick.toml"),
    ),
];

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct PolicyEntry {
    name: Option<String>,
    policy: String,
    cores: Option<usize>,
    capacity: Option<Vec<f64>>,
    headroom: Option<f64>,
    grow_slack: Option<f64>,
    shrink_slack: Option<f64>,
    hold: Option<u32>,
    latency: Option<String>,
    max_queued: Option<f64>,
    #[serde(default)]
    idle_jobs: bool,
}

/// A control experiment as written.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WorkflowSpec {
    name: Option<String>,
    description: Option<String>,
    jobs: String,
    #[serde(default = "default_seeds")]
    seeds: Vec<u64>,
    qps_min: f64,
    qps_max: f64,
    qps_intervals: Vec<f64>,
    duration: f64,
    grace: Option<f64>,
    slo_p95_us: Option<f64>,
    slo_window: Option<f64>,
    cpus: Option<String>,
    generator_cpus: Option<String>,
    cpu_method: Option<String>,
    pause_method: Option<String>,
    #[serde(default)]
    workload: toml::Table,
    #[serde(rename = "system")]
    systems: Vec<SystemSpec>,
    #[serde(rename = "policy")]
    policies: Vec<PolicyEntry>,
}

fn default_seeds() -> Vec<u64> {
    vec![1, 2, 3]
}

/// Whether an experiment text is a control experiment (it names a job file).
pub fn is_workflow(text: &str) -> bool {
    toml::from_str::<toml::Table>(text).is_ok_and(|t| t.contains_key("jobs"))
}

impl WorkflowSpec {
    /// Parses and checks a control experiment.
    pub fn parse(text: &str) -> anyhow::Result<WorkflowSpec> {
        let s: WorkflowSpec = toml::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))?;
        if s.seeds.is_empty() || s.qps_intervals.is_empty() || s.policies.is_empty() {
            bail!("give at least one seed, one of qps_intervals and one [[policy]]");
        }
        if s.systems.is_empty() {
            bail!("no systems: add a [[system]]");
        }
        if !(s.qps_min > 0.0 && s.qps_max >= s.qps_min && s.duration > 0.0) {
            bail!("need 0 < qps_min <= qps_max and duration > 0");
        }
        for p in &s.policies {
            s.policy(p)?;
        }
        for k in s.workload.keys() {
            if !crate::spec::WORKLOAD_KEYS.contains(&k.as_str())
                || ["qps", "qps_list", "qps_interval", "interval"].contains(&k.as_str())
            {
                bail!("[workload] {k:?}: a kvlab bench key other than the trace's and interval");
            }
        }
        Ok(s)
    }

    /// Its name (default: `stem`).
    pub fn name(&self, stem: &str) -> String {
        self.name.clone().unwrap_or_else(|| stem.to_string())
    }

    /// Its description.
    pub fn description(&self) -> Option<String> {
        self.description.clone()
    }

    fn slo(&self) -> f64 {
        self.slo_p95_us.unwrap_or(DEFAULT_SLACK.slo_p95_us)
    }

    /// The window the SLO is also judged per, ms.
    fn window_ms(&self) -> u64 {
        (self.slo_window.unwrap_or(1.0) * 1000.0).max(1.0) as u64
    }

    /// A `[[policy]]`: its name, the policy, and whether jobs also use the server's CPUs
    /// at idle priority.
    fn policy(&self, p: &PolicyEntry) -> anyhow::Result<(String, PolicySpec, bool)> {
        let slack = Slack {
            slo_p95_us: self.slo(),
            grow_slack: p.grow_slack.unwrap_or(DEFAULT_SLACK.grow_slack),
            shrink_slack: p.shrink_slack.unwrap_or(DEFAULT_SLACK.shrink_slack),
            hold: p.hold.unwrap_or(DEFAULT_SLACK.hold),
            latency: match &p.latency {
                Some(l) => l.parse().map_err(|e: String| anyhow::anyhow!(e))?,
                None => DEFAULT_SLACK.latency,
            },
            max_queued: p.max_queued,
        };
        let spec = match p.policy.as_str() {
            "static" => PolicySpec::Static {
                cores: p.cores.context("a static [[policy]] needs cores")?,
            },
            "reactive" => PolicySpec::Reactive { slack },
            "predictive" => PolicySpec::Predictive {
                slack,
                capacity: p
                    .capacity
                    .clone()
                    .context("a predictive [[policy]] needs capacity = [req/s per core count]")?,
                headroom: p.headroom.unwrap_or(DEFAULT_HEADROOM),
            },
            o => bail!("policy {o:?}: static, reactive or predictive"),
        };
        let name = p.name.clone().unwrap_or_else(|| spec.name().to_string());
        Ok((name, spec, p.idle_jobs))
    }

    /// The job file it names, resolved next to `base` (the experiment file's folder) or
    /// shipped.
    fn job_file(&self, base: &Path) -> anyhow::Result<(String, JobFile)> {
        job_file(&self.jobs, base)
    }
}

/// The job file `name`: a shipped one (`control-jobs`, `control-jobs-quick`) or a path
/// relative to `base` (the experiment file's folder); its text and its jobs.
pub fn job_file(name: &str, base: &Path) -> anyhow::Result<(String, JobFile)> {
    if let Some((_, text)) = SHIPPED_JOBS.iter().find(|(n, _)| *n == name) {
        return Ok((text.to_string(), JobFile::parse(text)?));
    }
    let p = base.join(name);
    let text = std::fs::read_to_string(&p)
        .with_context(|| format!("reading the job file {}", p.display()))?;
    Ok((text.clone(), JobFile::parse(&text)?))
}

/// One run as stored in `raw/NNNN.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkflowRun {
    /// Its number.
    pub index: usize,
    /// The system's name.
    pub system: String,
    /// The policy's name.
    pub policy: String,
    /// Seconds between the trace's rate changes.
    pub qps_interval: f64,
    /// The trace's seed.
    pub seed: u64,
    /// What the controller did and the run's figures.
    pub outcome: Option<Outcome>,
    /// Windows of `slo_window` s while jobs ran (0 when the load's rows carry no
    /// histograms).
    #[serde(default)]
    pub slo_windows: usize,
    /// Of those, windows whose p95 over all their requests is above the SLO.
    #[serde(default)]
    pub slo_window_violations: usize,
    /// The run's files, relative to the results directory.
    pub control_log: String,
    /// The load's intervals (JSON lines).
    pub live: String,
    /// What went wrong, if anything.
    pub error: Option<String>,
}

/// What `meta.json` of a control experiment holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkflowMeta {
    /// Marks the directory as a control experiment's.
    pub workflow: bool,
    /// The experiment text.
    pub text: String,
    /// The job file's text.
    pub jobs_text: String,
    /// kvlab's version and commit, the date.
    pub facts: Vec<(String, String)>,
}

/// Whether `dir` holds a control experiment's results.
pub fn is_workflow_dir(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("meta.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<WorkflowMeta>(&t).ok())
        .is_some_and(|m| m.workflow)
}

/// The runs' figures as text (what `kvlab lab` prints).
pub fn summary_text(dir: &Path) -> anyhow::Result<String> {
    let mut out = String::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("raw"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    files.sort();
    out.push_str(
        "run  system     policy           interval  seed  jobs' total s  viol. % (segments)  \
         viol. % (100 ms)  viol. % (windows)\n",
    );
    for f in files {
        let r: WorkflowRun = serde_json::from_str(&std::fs::read_to_string(&f)?)?;
        let (total, seg, viol) =
            r.outcome
                .as_ref()
                .map_or(("failed".to_string(), String::new(), String::new()), |o| {
                    let s = &o.summary;
                    (
                        s.total_s.map_or("-".into(), |t| format!("{t:.1}")),
                        s.segment_violation_ratio.map_or("-".into(), |v| {
                            format!(
                                "{:.2} ({}/{})",
                                v * 100.0,
                                s.segment_violations,
                                s.segments.len()
                            )
                        }),
                        format!("{:.2}", s.violation_ratio * 100.0),
                    )
                });
        let w = if r.slo_windows > 0 {
            format!(
                "{:.2}",
                r.slo_window_violations as f64 / r.slo_windows as f64 * 100.0
            )
        } else {
            "-".into()
        };
        out.push_str(&format!(
            "{:<4} {:<10} {:<16} {:>8} {:>5} {:>14} {:>19} {:>17} {:>18}\n",
            r.index, r.system, r.policy, r.qps_interval, r.seed, total, seg, viol, w
        ));
    }
    Ok(out)
}

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
    let work = out.join("work");
    std::fs::create_dir_all(out.join("raw"))?;
    std::fs::create_dir_all(out.join("runs"))?;
    std::fs::create_dir_all(&work)?;
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
    let total = spec.seeds.len() * spec.qps_intervals.len() * policies.len() * spec.systems.len();
    'all: for &seed in &spec.seeds {
        for &interval in &spec.qps_intervals {
            for (si, sys) in spec.systems.iter().enumerate() {
                for (pname, policy, idle_jobs) in &policies {
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
        .args(["--interval", "0.1", "--warmup", "0"])
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

/// The static split the others are compared with: among the static policies whose every
/// run finished its jobs, the one that gives the server the most cores; (its name, its mean
/// jobs' total time).
fn static_reference(runs: &[WorkflowRun], system: &str, interval: &str) -> Option<(String, f64)> {
    let mut by: Vec<(String, usize, Vec<Option<f64>>)> = Vec::new();
    for r in runs
        .iter()
        .filter(|r| r.system == system && format!("{}", r.qps_interval) == interval)
    {
        let Some(o) = &r.outcome else { continue };
        if o.policy != "static" {
            continue;
        }
        let cores = o.server_cores_max;
        match by.iter_mut().find(|(n, _, _)| *n == r.policy) {
            Some((_, _, v)) => v.push(o.summary.total_s.filter(|_| o.summary.jobs.len() == o.jobs)),
            None => by.push((
                r.policy.clone(),
                cores,
                vec![o.summary.total_s.filter(|_| o.summary.jobs.len() == o.jobs)],
            )),
        }
    }
    by.into_iter()
        .filter(|(_, _, v)| v.iter().all(Option::is_some))
        .max_by_key(|(_, c, _)| *c)
        .map(|(n, _, v)| (n, mean_sd(&v.into_iter().flatten().collect::<Vec<_>>()).0))
}

/// Mean and sample standard deviation (NaN for none, sd 0 for one).
pub fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let m = v.iter().sum::<f64>() / n;
    let sd = if v.len() > 1 {
        (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    (m, sd)
}

fn pm(v: &[f64], digits: usize) -> String {
    let (m, sd) = mean_sd(v);
    if m.is_nan() {
        "-".into()
    } else {
        format!("{m:.digits$} ± {sd:.digits$}")
    }
}

/// Reads a control experiment's results and writes its report (`report/`); returns the
/// index page's path.
pub fn analyse(dir: &Path) -> anyhow::Result<PathBuf> {
    let meta: WorkflowMeta = serde_json::from_str(
        &std::fs::read_to_string(dir.join("meta.json")).context("reading meta.json")?,
    )?;
    let spec = WorkflowSpec::parse(&meta.text)?;
    let slo = spec.slo();
    let mut runs: Vec<WorkflowRun> = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("raw"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    for f in files {
        runs.push(serde_json::from_str(&std::fs::read_to_string(&f)?)?);
    }
    let mut report = Report {
        title: format!(
            "kvlab control: {}",
            spec.name
                .clone()
                .unwrap_or_else(|| "control workflow".into())
        ),
        subtitle: spec.description.clone(),
        metadata: meta.facts.clone(),
        sections: Vec::new(),
    };
    report.metadata.push((
        "trace".into(),
        format!(
            "{}..{} req/s, new rate every {:?} s, seeds {:?}, at most {} s",
            spec.qps_min, spec.qps_max, spec.qps_intervals, spec.seeds, spec.duration
        ),
    ));
    let window = spec.window_ms() as f64 / 1000.0;
    report.metadata.push((
        "SLO".into(),
        format!(
            "p95 ≤ {slo} µs per trace segment of the load (over all its requests); also per \
             100 ms interval and per {window} s window"
        ),
    ));
    // Summary per system × interval × policy.
    let mut summary = Section {
        title: "Policies compared".into(),
        text: vec![
            "Each row: the runs of one policy (one per seed). The jobs' total time is the \
             first job's start to the last job's end. Violations are counted over the \
             jobs' span three ways: the trace segments (one data point per segment of the \
             load's rate trace, its p95 over all its requests, as the generator reports \
             it; a segment partly inside the span counts) — the headline; the load's \
             100 ms intervals, each judged on its own p95, which is stricter (a burst \
             that a segment's p95 absorbs still counts); and windows, each on the p95 of \
             all its requests. Each job's runtime excludes its paused time."
                .into(),
        ],
        items: Vec::new(),
    };
    let mut rows = Vec::new();
    let mut job_rows = Vec::new();
    let mut keys: Vec<(String, String, String)> = Vec::new();
    for r in &runs {
        let k = (
            r.system.clone(),
            format!("{}", r.qps_interval),
            r.policy.clone(),
        );
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    for (system, interval, policy) in &keys {
        let of: Vec<&WorkflowRun> = runs
            .iter()
            .filter(|r| {
                &r.system == system
                    && &format!("{}", r.qps_interval) == interval
                    && &r.policy == policy
            })
            .collect();
        let ok: Vec<&Outcome> = of.iter().filter_map(|r| r.outcome.as_ref()).collect();
        let total: Vec<f64> = ok.iter().filter_map(|o| o.summary.total_s).collect();
        let ratio = static_reference(&runs, system, interval)
            .map(|(name, b)| match mean_sd(&total).0 {
                a if a.is_finite() && b > 0.0 => format!("{:.2} (vs {name})", a / b),
                _ => "-".into(),
            })
            .unwrap_or_else(|| "-".into());
        let seg: Vec<f64> = ok
            .iter()
            .filter_map(|o| o.summary.segment_violation_ratio.map(|v| v * 100.0))
            .collect();
        let worst: Vec<f64> = ok
            .iter()
            .filter_map(|o| {
                o.summary
                    .segments
                    .iter()
                    .map(|s| s.p95_us)
                    .max_by(f64::total_cmp)
            })
            .collect();
        let viol: Vec<f64> = ok
            .iter()
            .map(|o| o.summary.violation_ratio * 100.0)
            .collect();
        let wviol: Vec<f64> = of
            .iter()
            .filter(|r| r.outcome.is_some() && r.slo_windows > 0)
            .map(|r| r.slo_window_violations as f64 / r.slo_windows as f64 * 100.0)
            .collect();
        let changes: Vec<f64> = ok.iter().map(|o| o.summary.core_changes as f64).collect();
        let pauses: Vec<f64> = ok.iter().map(|o| o.summary.pauses as f64).collect();
        rows.push(Row::new([
            system.clone(),
            interval.clone(),
            policy.clone(),
            format!("{}/{}", ok.len(), of.len()),
            pm(&total, 1),
            ratio,
            pm(&seg, 2),
            pm(&worst, 0),
            pm(&viol, 2),
            pm(&wviol, 2),
            pm(&changes, 0),
            pm(&pauses, 0),
        ]));
        // Each job's runtime.
        let mut names: Vec<String> = Vec::new();
        for o in &ok {
            for j in &o.summary.jobs {
                if !names.contains(&j.name) {
                    names.push(j.name.clone());
                }
            }
        }
        for n in names {
            let rt: Vec<f64> = ok
                .iter()
                .flat_map(|o| o.summary.jobs.iter().filter(|j| j.name == n))
                .map(|j| j.runtime_s)
                .collect();
            let paused: Vec<f64> = ok
                .iter()
                .flat_map(|o| o.summary.jobs.iter().filter(|j| j.name == n))
                .map(|j| j.paused_s)
                .collect();
            job_rows.push(Row::new([
                system.clone(),
                interval.clone(),
                policy.clone(),
                n,
                pm(&rt, 2),
                pm(&paused, 2),
            ]));
        }
    }
    let window_column = format!("violations (% of {window} s windows)");
    summary.items.push(Item::Table(Table {
        title: "Jobs' total time and SLO violations by policy".into(),
        columns: [
            "system",
            "trace interval (s)",
            "policy",
            "runs ok",
            "jobs' total time (s, mean ± sd)",
            "total time / static's",
            "violations (% of trace segments)",
            "highest segment p95 (µs)",
            "violations (% of 100 ms intervals)",
            window_column.as_str(),
            "core changes",
            "pauses",
        ]
        .map(String::from)
        .to_vec(),
        rows,
        caption: None,
    }));
    summary.items.push(Item::Table(Table {
        title: "Each job's runtime without pauses".into(),
        columns: [
            "system",
            "trace interval (s)",
            "policy",
            "job",
            "runtime (s)",
            "paused (s)",
        ]
        .map(String::from)
        .to_vec(),
        rows: job_rows,
        caption: None,
    }));
    let failed: Vec<String> = runs
        .iter()
        .filter_map(|r| r.error.as_ref().map(|e| format!("run {}: {e}", r.index)))
        .collect();
    if !failed.is_empty() {
        summary.items.push(Item::Note(kvlab_report::Note::warning(
            "failed runs",
            failed.join("; "),
        )));
    }
    report.sections.push(summary);
    // Per run: the time plots.
    for r in &runs {
        let title = format!(
            "Run {}: {} {} interval {} s seed {}",
            r.index, r.system, r.policy, r.qps_interval, r.seed
        );
        let mut sec = Section {
            title: title.clone(),
            text: Vec::new(),
            items: Vec::new(),
        };
        if let Some(e) = &r.error {
            sec.text.push(format!("failed: {e}"));
            report.sections.push(sec);
            continue;
        }
        let rows = LiveFile::new(dir.join(&r.live)).poll();
        let events = read_log(&dir.join(&r.control_log)).unwrap_or_default();
        let t0 = events
            .first()
            .map_or(0, |e| e.unix_ms.saturating_sub((e.t_s * 1000.0) as u64));
        let t = |ms: u64| (ms as f64 - t0 as f64) / 1000.0;
        let measured: Vec<&IntervalRow> = rows.iter().filter(|x| !x.warmup).collect();
        let p95: Vec<Point> = measured
            .iter()
            .filter(|x| x.counters.completed > 0)
            .map(|x| Point::new(t(x.ts_end), x.latency.p95_us))
            .collect();
        let qps: Vec<Point> = measured
            .iter()
            .map(|x| Point::new(t(x.ts_end), x.target_qps.unwrap_or(x.achieved_qps)))
            .collect();
        // Each trace segment's p95 as a step over its span.
        let segments: Vec<Segment> = summary::segments(&rows).unwrap_or_default();
        let seg_p95: Vec<Point> = segments
            .iter()
            .flat_map(|g| {
                [
                    Point::new(t(g.ts_start), g.p95_us),
                    Point::new(t(g.ts_end), g.p95_us),
                ]
            })
            .collect();
        let span = p95
            .iter()
            .map(|p| p.x)
            .chain(events.iter().map(|e| e.t_s))
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
                (a.min(x), b.max(x))
            });
        let mut marks: Vec<Mark> = events
            .iter()
            .filter_map(|e| {
                let label = match &e.what {
                    What::Start { job, .. } => format!("start {job}"),
                    What::End { job, .. } => format!("end {job}"),
                    What::Pause { job } => format!("pause {job}"),
                    What::Resume { job, .. } => format!("resume {job}"),
                    _ => return None,
                };
                Some(Mark { x: e.t_s, label })
            })
            .collect();
        if marks.len() > 80 {
            marks.retain(|m| m.label.starts_with("start") || m.label.starts_with("end"));
        }
        let x_range = (span.0.is_finite() && span.1 > span.0).then_some((span.0.min(0.0), span.1));
        let slo_line = vec![
            Point::new(x_range.map_or(0.0, |r| r.0), slo),
            Point::new(x_range.map_or(1.0, |r| r.1), slo),
        ];
        sec.items.push(Item::LinePlot(LinePlot {
            title: format!("{title}: p95 per 100 ms and per trace segment, offered rate"),
            x_label: "time (s)".into(),
            y_label: "p95 latency (µs)".into(),
            x_range,
            y_from_zero: true,
            series: vec![
                Series {
                    name: "p95 per 100 ms".into(),
                    points: p95,
                    ..Series::default()
                },
                Series {
                    name: "p95 per trace segment".into(),
                    points: seg_p95,
                    ..Series::default()
                },
                Series {
                    name: "SLO".into(),
                    style: kvlab_report::LineStyle::Dashed,
                    points: slo_line,
                    ..Series::default()
                },
            ],
            y2: Some(Y2 {
                label: "offered rate (req/s)".into(),
                series: vec![Series {
                    name: "offered rate".into(),
                    points: qps.clone(),
                    ..Series::default()
                }],
            }),
            marks: marks.clone(),
            caption: Some("Marks: job start, pause, resume and end.".into()),
            ..LinePlot::default()
        }));
        let mut cores: Vec<Point> = Vec::new();
        for e in &events {
            if let What::Sample { cores: c, .. } = e.what {
                cores.push(Point::new(e.t_s, c as f64));
            }
        }
        sec.items.push(Item::LinePlot(LinePlot {
            title: format!("{title}: the server's cores"),
            x_label: "time (s)".into(),
            y_label: "server cores".into(),
            x_range,
            y_from_zero: true,
            series: vec![Series {
                name: "server cores".into(),
                points: cores,
                ..Series::default()
            }],
            y2: Some(Y2 {
                label: "offered rate (req/s)".into(),
                series: vec![Series {
                    name: "offered rate".into(),
                    points: qps,
                    ..Series::default()
                }],
            }),
            marks,
            ..LinePlot::default()
        }));
        if let Some(o) = &r.outcome {
            sec.text
                .push(format!("{} — stopped: {}", o.method, o.stopped));
        }
        report.sections.push(sec);
    }
    let files = kvlab_report::write_report(dir.join("report"), &report)?;
    Ok(files.index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_entry_with_idle_jobs_is_that_policy_with_jobs_at_idle_priority() {
        // reactive-idle, like static-2-idle and predictive-idle: the policy's rule, and
        // the jobs also on the server's CPUs at SCHED_IDLE.
        let text = r#"
jobs = "control-jobs-quick"
qps_min = 10000
qps_max = 80000
qps_intervals = [1]
duration = 10
[[system]]
name = "kvlab"
[[policy]]
name = "reactive-idle"
policy = "reactive"
idle_jobs = true
"#;
        let spec = WorkflowSpec::parse(text).unwrap();
        let (name, policy, idle) = spec.policy(&spec.policies[0]).unwrap();
        assert_eq!(name, "reactive-idle");
        assert!(idle);
        assert!(matches!(policy, PolicySpec::Reactive { slack } if slack == DEFAULT_SLACK));
        assert_eq!(spec.window_ms(), 1000);
    }

    #[test]
    fn the_shipped_workflow_names_a_shipped_job_file() {
        let (_, text) = crate::SHIPPED
            .iter()
            .find(|(n, _)| *n == "control-workflow")
            .unwrap();
        assert!(is_workflow(text));
        let spec = WorkflowSpec::parse(text).unwrap();
        let (_, jobs) = spec.job_file(Path::new("/nonexistent")).unwrap();
        assert_eq!(jobs.jobs.len(), 7);
        // The issue's matrix in one file: 3 seeds x {10, 5, 1} s x {the static split that
        // meets the SLO at the peak (static-2), reactive, predictive} x {kvlab, memcached},
        // plus static-1 and the idle-priority variants.
        assert_eq!(spec.seeds, [1, 2, 3]);
        assert_eq!(spec.qps_intervals, [10.0, 5.0, 1.0]);
        let systems: Vec<&str> = spec.systems.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(systems, ["kvlab", "memcached"]);
        let policies: Vec<(String, PolicySpec, bool)> = spec
            .policies
            .iter()
            .map(|p| spec.policy(p).unwrap())
            .collect();
        let names: Vec<&str> = policies.iter().map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "static-2",
                "static-1",
                "reactive",
                "predictive",
                "static-2-idle",
                "reactive-idle",
                "predictive-idle"
            ]
        );
        assert!(matches!(policies[0].1, PolicySpec::Static { cores: 2 }) && !policies[0].2);
        assert!(policies[4].2 && policies[5].2 && policies[6].2);
        assert!(
            WorkflowSpec::parse(&text.replace("policy = \"reactive\"", "policy = \"fast\""))
                .is_err()
        );
    }
}
