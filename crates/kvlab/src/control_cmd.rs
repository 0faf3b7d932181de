//! `kvlab control`: keeps a cache server inside its latency SLO while batch jobs use the
//! cores it does not need. Starts the server (the command after `--`) or attaches to one
//! (`--pid`), runs the job file's queue, and moves cores and pauses jobs by the policy;
//! every action goes to the JSON-lines log. The work is in [`kvlab_control`].

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use kvlab_control::app::{self, Options, Outcome, DEFAULT_INTERVAL};
use kvlab_control::calibrate::{calibrate, load_of_pairs, CalibrateSpec};
use kvlab_control::machine::{CpuMethod, PauseMethod};
use kvlab_control::{CpuSet, JobFile, PolicySpec, Share, Slack, DEFAULT_HEADROOM, DEFAULT_SLACK};
use kvlab_process::{Output, Probe, Process, Spawn};

/// Flags of `kvlab control`.
#[derive(Debug, Args)]
pub struct ControlArgs {
    /// The server's address: its `stats` give the request rate (and readiness when started).
    #[arg(long, value_name = "HOST:PORT")]
    addr: Option<String>,
    /// Attach to this running server process instead of starting one.
    #[arg(long, conflicts_with = "server")]
    pid: Option<u32>,
    /// The job file (TOML; see docs/control.md). Without one, only the server's cores move.
    #[arg(long, value_name = "FILE")]
    jobs: Option<PathBuf>,
    /// Where jobs run, make their inputs and write their logs ({work} in the job file)
    /// [default: a new directory under the system's temp dir].
    #[arg(long, value_name = "DIR")]
    work_dir: Option<PathBuf>,
    /// Do not run the job file's `prepare` commands (the inputs are already in --work-dir).
    #[arg(long)]
    no_prepare: bool,
    /// Only run the job file's `prepare` commands in --work-dir, then exit.
    #[arg(long)]
    prepare_only: bool,
    /// Run each job alone at each of its core counts (threads = cores, pinned), print its
    /// runtime and CPU time, then exit (--summary writes them as JSON). Prepares first
    /// unless --no-prepare.
    #[arg(long)]
    speedup: bool,
    /// static (a fixed split), reactive (slack thresholds on the measured p95) or
    /// predictive (capacity per core count with headroom, plus the reactive guard).
    #[arg(long, default_value = "reactive")]
    policy: String,
    /// static: the server's cores.
    #[arg(long, value_name = "N")]
    static_cores: Option<usize>,
    /// The latency SLO: p95 below this, µs.
    #[arg(long, default_value_t = DEFAULT_SLACK.slo_p95_us)]
    slo_p95_us: f64,
    /// Give the server a core when the slack (1 - p95/SLO) falls below this.
    #[arg(long, default_value_t = DEFAULT_SLACK.grow_slack)]
    grow_slack: f64,
    /// Take a core back when the slack stays above this ...
    #[arg(long, default_value_t = DEFAULT_SLACK.shrink_slack)]
    shrink_slack: f64,
    /// ... for this many samples in a row.
    #[arg(long, default_value_t = DEFAULT_SLACK.hold)]
    hold: u32,
    /// The latency the slack is taken on: auto (the load's p95 from --live when there is a
    /// fresh one, else the server's own p95 over the sample from kvlab's `stats latency`),
    /// client (only the load's) or server (only the server's: attached to a server under
    /// someone else's load; it lacks network and client time, so give a tighter SLO).
    #[arg(long, default_value = "auto")]
    latency: String,
    /// Also give the server a core when more connections than this wait for its event loops
    /// on average over a sample (kvlab's `stats latency`) [default: the queue is only
    /// logged].
    #[arg(long, value_name = "N")]
    max_queued: Option<f64>,
    /// Take the load's p95 over its intervals of the last this many seconds, their
    /// histograms added up, rather than the newest interval's own (0): a burst then counts
    /// by the share of requests it slowed, as in a trace segment's p95.
    #[arg(long, value_name = "SECONDS", default_value_t = 0.0)]
    latency_window: f64,
    /// Judge the load's trace segment rather than its newest interval: keep the share of
    /// the current segment's requests slower than the SLO under this share (a p95 SLO
    /// allows 0.05; e.g. 0.025 leaves half for the load's own slow requests). Needs --live
    /// rows from kvlab bench (their step and histogram).
    #[arg(long, value_name = "SHARE")]
    segment_budget: Option<f64>,
    /// predictive: requests/s the server sustains within the SLO with 1, 2, … cores
    /// (comma-separated) [default: calibrated here before the jobs start: a sustained-rate
    /// search per core count against --slo-p95-us, with the server to itself].
    #[arg(long, value_name = "QPS,QPS,…")]
    capacity: Option<String>,
    /// The calibration's workload, as kvlab bench keys (repeatable), e.g. `--calibrate-load
    /// keys=50000 --calibrate-load value_size=100 --calibrate-load mix=get=9,set=1`: the
    /// real load's, so that its capacity is measured [default: kvlab bench's defaults].
    #[arg(long, value_name = "KEY=VALUE")]
    calibrate_load: Vec<String>,
    /// The CPUs the calibration's generator runs on (the real load's) [default: those this
    /// process may use].
    #[arg(long, value_name = "LIST")]
    generator_cpus: Option<String>,
    /// The longest one core count's calibration may take, s.
    #[arg(long, default_value_t = 30.0)]
    calibrate_time: f64,
    /// The first rate the calibration tries, req/s: it doubles from there until a rate fails
    /// (halves while the first ones fail), then bisects. On a virtual machine whose latency
    /// at low rates follows its CPUs' wake-ups, start near the rates the load will bring.
    #[arg(long, value_name = "QPS", default_value_t = 5000.0)]
    calibrate_from: f64,
    /// Calibrate (the server started or attached, no jobs), print the capacity per core
    /// count, write it with --summary, and exit.
    #[arg(long)]
    calibrate_only: bool,
    /// The load's intervals (a kvlab bench --live file) of the same trace and seed run with
    /// no jobs on this machine: the summary then gives the violated segments with the jobs,
    /// without them, and the difference (the jobs' cost).
    #[arg(long, value_name = "FILE")]
    baseline: Option<PathBuf>,
    /// predictive: plan for this fraction more than the measured rate.
    #[arg(long, default_value_t = DEFAULT_HEADROOM)]
    headroom: f64,
    /// The CPUs shared between the server and the jobs [default: those this process may
    /// use].
    #[arg(long, value_name = "LIST")]
    cpus: Option<String>,
    /// Jobs also run on the server's CPUs, at idle priority (SCHED_IDLE): the server
    /// preempts them, so they get its idle time; the policy's last step beyond every core
    /// to the server is then the jobs paused (`idle` events in the log).
    #[arg(long)]
    idle_jobs: bool,
    /// The fewest cores the server keeps.
    #[arg(long, default_value_t = 1)]
    min_server_cores: usize,
    /// How cores move: auto (cgroup v1 cpuset, else v2, else affinity), cgroup-v1,
    /// cgroup-v2, affinity.
    #[arg(long, default_value = "auto")]
    cpu_method: String,
    /// How jobs pause: auto (the cgroup freezer, else signals), freezer, signal.
    #[arg(long, default_value = "auto")]
    pause_method: String,
    /// The load's intervals as `kvlab bench --live FILE` appends them (the p95 signal).
    #[arg(long, value_name = "FILE")]
    live: Option<PathBuf>,
    /// Milliseconds between samples.
    #[arg(long, default_value_t = DEFAULT_INTERVAL.as_millis() as u64)]
    interval_ms: u64,
    /// Stop after this many seconds at the latest.
    #[arg(long, default_value_t = 3600.0)]
    duration: f64,
    /// Keep controlling after the jobs have ended (until --duration or a signal).
    #[arg(long)]
    keep_running: bool,
    /// The control log, JSON lines [default: WORK_DIR/control.jsonl].
    #[arg(long, value_name = "FILE")]
    log: Option<PathBuf>,
    /// Write the run's figures as JSON.
    #[arg(long, value_name = "FILE")]
    summary: Option<PathBuf>,
    /// This machine's clock minus the clock the log's and the load's rows' times are in,
    /// µs: subtracted from every time the controller reads. The lab gives it when it runs
    /// the controller on another host than its own, which writes the load's rows (the
    /// offset it measured to that host).
    #[arg(
        long,
        value_name = "US",
        default_value_t = 0,
        allow_hyphen_values = true
    )]
    clock_offset_us: i64,
    /// The server to start, with its arguments (after `--`), e.g.
    /// `-- memcached -p 11311 -t 2` (needs --addr to know when it is ready).
    #[arg(last = true, value_name = "SERVER")]
    server: Vec<String>,
}

fn policy(a: &ControlArgs) -> anyhow::Result<PolicySpec> {
    let slack = Slack {
        slo_p95_us: a.slo_p95_us,
        grow_slack: a.grow_slack,
        shrink_slack: a.shrink_slack,
        hold: a.hold,
        latency: a
            .latency
            .parse()
            .map_err(|e: String| anyhow::anyhow!("--latency: {e}"))?,
        max_queued: a.max_queued,
        latency_window_ms: (a.latency_window * 1000.0).round() as u64,
        segment_budget: a.segment_budget,
    };
    if a.segment_budget.is_some_and(|b| !(b > 0.0 && b <= 1.0)) {
        bail!("--segment-budget: a share of the segment's requests, above 0 and at most 1");
    }
    if !(a.latency_window >= 0.0 && a.latency_window <= 3600.0) {
        bail!("--latency-window: 0 to 3600 seconds");
    }
    if !(slack.slo_p95_us > 0.0 && slack.grow_slack < slack.shrink_slack) {
        bail!("need --slo-p95-us > 0 and --grow-slack < --shrink-slack");
    }
    if slack.max_queued.is_some_and(|q| q.is_nan() || q < 0.0) {
        bail!("--max-queued: a number of connections, 0 or more");
    }
    Ok(match a.policy.as_str() {
        "static" => PolicySpec::Static {
            cores: a
                .static_cores
                .context("--policy static needs --static-cores N")?,
        },
        "reactive" => PolicySpec::Reactive { slack },
        "predictive" => {
            // Without --capacity: empty until the calibration fills it in.
            let mut capacity = Vec::new();
            if let Some(text) = a.capacity.as_deref() {
                capacity = text
                    .split(',')
                    .map(|v| v.trim().parse::<f64>())
                    .collect::<Result<Vec<_>, _>>()
                    .with_context(|| format!("--capacity {text:?}: numbers, comma-separated"))?;
                if capacity.is_empty() || capacity.iter().any(|c| c.is_nan() || *c <= 0.0) {
                    bail!("--capacity {text:?}: positive requests/s per core count");
                }
            }
            if a.headroom.is_nan() || a.headroom < 0.0 {
                bail!("--headroom must be >= 0");
            }
            PolicySpec::Predictive {
                slack,
                capacity,
                headroom: a.headroom,
            }
        }
        p => bail!("--policy {p:?}: static, reactive or predictive"),
    })
}

fn resolve(a: &str) -> anyhow::Result<SocketAddr> {
    a.to_socket_addrs()
        .with_context(|| format!("bad address {a:?}"))?
        .next()
        .with_context(|| format!("{a:?} resolves to nothing"))
}

/// Runs `kvlab control`.
pub fn run(a: ControlArgs) -> anyhow::Result<()> {
    let spec = policy(&a)?;
    kvlab_control::event::set_clock_offset_us(a.clock_offset_us);
    let jobs = match &a.jobs {
        Some(p) => JobFile::load(p)?,
        None => JobFile::default(),
    };
    let work = match &a.work_dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("kvlab-control-{}", std::process::id())),
    };
    if a.prepare_only {
        std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
        kvlab_control::controller::prepare(&jobs.prepare, &work)?;
        eprintln!("kvlab control: inputs made in {}", work.display());
        return Ok(());
    }
    let cpus: CpuSet = match &a.cpus {
        Some(l) => l.parse()?,
        None => CpuSet::allowed_now()?,
    };
    if a.speedup {
        return run_speedup(&a, &jobs, &cpus, &work);
    }
    let stats = a.addr.as_deref().map(resolve).transpose()?;
    let calibrating = a.calibrate_only
        || matches!(&spec, PolicySpec::Predictive { capacity, .. } if capacity.is_empty());
    let calibrate_spec = calibrating.then(|| calibrate_spec(&a)).transpose()?;
    let (pid, started) = start_or_attach(&a, stats, &work)?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let calibration = match &calibrate_spec {
        Some(c) => {
            let addr = stats.context("calibrating needs --addr (the load's target)")?;
            eprintln!(
                "kvlab control: calibrating the capacity per core count on CPUs {cpus} (p95 < {} µs, at most {} s a core count)",
                c.slo_p95_us, c.max_time_s
            );
            let r = calibrate(pid, addr, &cpus, c, &|| stop.load(Ordering::Relaxed));
            match r {
                Ok(c) => Some(c),
                Err(e) => {
                    if let Some(p) = started {
                        p.stop();
                    }
                    return Err(e.into());
                }
            }
        }
        None => None,
    };
    if let Some(c) = &calibration {
        println!(
            "capacity calibrated here: {} (p95 < {} µs from the planned send; load average {} before, {} after{})",
            c.text(),
            c.spec.slo_p95_us,
            c.loadavg[0],
            c.loadavg[1],
            c.steal_pct.map_or(String::new(), |s| format!(", steal {s:.1} %"))
        );
    }
    if a.calibrate_only {
        if let Some(p) = started {
            p.stop();
        }
        if let (Some(p), Some(c)) = (&a.summary, &calibration) {
            std::fs::write(p, serde_json::to_string_pretty(c)?)
                .with_context(|| format!("writing {}", p.display()))?;
        }
        return Ok(());
    }
    let spec = match (spec, &calibration) {
        (
            PolicySpec::Predictive {
                slack, headroom, ..
            },
            Some(c),
        ) => PolicySpec::Predictive {
            slack,
            capacity: c.capacity.clone(),
            headroom,
        },
        (s, _) => s,
    };
    if let PolicySpec::Predictive { capacity, .. } = &spec {
        if calibration.is_none() {
            println!(
                "capacity given (--capacity): {}",
                capacity
                    .iter()
                    .enumerate()
                    .map(|(i, q)| format!("{} core(s) {q:.0} req/s", i + 1))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    let options = Options {
        pid,
        stats,
        live: a.live.clone(),
        jobs,
        log: a.log.clone().unwrap_or_else(|| work.join("control.jsonl")),
        work,
        prepare: !a.no_prepare,
        policy: spec,
        share: Share {
            cpus,
            min_server: a.min_server_cores,
            idle_jobs: a.idle_jobs,
        },
        cpu_method: a.cpu_method.parse::<CpuMethod>()?,
        pause_method: a.pause_method.parse::<PauseMethod>()?,
        interval: Duration::from_millis(a.interval_ms.max(1)),
        max: Duration::from_secs_f64(a.duration.max(0.0)),
        until_jobs_done: !a.keep_running,
        slo_p95_us: a.slo_p95_us,
        calibration,
        baseline: a.baseline.clone(),
    };
    eprintln!(
        "kvlab control: server pid {pid}, CPUs {}, policy {}, log {}",
        options.share.cpus,
        a.policy,
        options.log.display()
    );
    let outcome = app::control(&options, &|| stop.load(Ordering::Relaxed));
    if let Some(p) = started {
        p.stop();
    }
    let outcome = outcome?;
    print_outcome(&a, &outcome);
    if let Some(p) = &a.summary {
        let text = serde_json::to_string_pretty(&outcome)?;
        std::fs::write(p, text).with_context(|| format!("writing {}", p.display()))?;
    }
    if outcome.summary.jobs.iter().any(|j| j.exit != Some(0)) {
        bail!("a job did not exit with 0 (see its log in the work directory)");
    }
    Ok(())
}

/// The calibration as the flags ask for it.
fn calibrate_spec(a: &ControlArgs) -> anyhow::Result<CalibrateSpec> {
    let mut c = CalibrateSpec::new(a.slo_p95_us, load_of_pairs(&a.calibrate_load)?);
    c.generator_cpus = a.generator_cpus.as_deref().map(str::parse).transpose()?;
    if !(a.calibrate_time > 0.0 && a.calibrate_time.is_finite()) {
        bail!("--calibrate-time: seconds, above 0");
    }
    c.max_time_s = a.calibrate_time;
    if !(a.calibrate_from >= 10.0 && a.calibrate_from.is_finite()) {
        bail!("--calibrate-from: requests/s, at least 10");
    }
    c.start_qps = a.calibrate_from;
    Ok(c)
}

/// `--speedup`: runs every job alone at each core count `cpus` can give it, then prints (and
/// with `--summary` writes) each run's wall and CPU time.
fn run_speedup(a: &ControlArgs, jobs: &JobFile, cpus: &CpuSet, work: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(work).with_context(|| format!("creating {}", work.display()))?;
    if !a.no_prepare {
        kvlab_control::controller::prepare(&jobs.prepare, work)?;
    }
    let rows = kvlab_control::speedup::speedup(jobs, cpus, work)?;
    println!(
        "{:<24} {:>6} {:>10} {:>10} {:>5}",
        "job", "cores", "wall s", "CPU s", "exit"
    );
    for r in &rows {
        println!(
            "{:<24} {:>6} {:>10.2} {:>10.2} {:>5}",
            r.job,
            r.cores,
            r.wall_s,
            r.cpu_s,
            r.exit.map_or("-".into(), |c| c.to_string())
        );
    }
    if let Some(p) = &a.summary {
        std::fs::write(p, serde_json::to_string_pretty(&rows)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// The server's process id: the one given with `--pid`, or that of the server started from
/// the command after `--` (returned too, to be stopped at the end).
fn start_or_attach(
    a: &ControlArgs,
    stats: Option<SocketAddr>,
    work: &Path,
) -> anyhow::Result<(u32, Option<Process>)> {
    let mut started = None;
    let pid = match (a.pid, a.server.is_empty()) {
        (Some(p), _) => p,
        (None, false) => {
            let addr = stats.context("a server to start needs --addr (to see it ready)")?;
            std::fs::create_dir_all(work)
                .with_context(|| format!("creating {}", work.display()))?;
            let p = Spawn::new(&a.server[0])
                .args(&a.server[1..])
                .output(Output::File(work.join("server.log")))
                .ready(Probe::Version(addr))
                .timeout(Duration::from_secs(10))
                .start()
                .with_context(|| format!("starting {}", a.server.join(" ")))?;
            let pid = p.pid();
            started = Some(p);
            pid
        }
        (None, true) => bail!("give the server: --pid PID, or its command after `--`"),
    };
    Ok((pid, started))
}

/// Prints the run's outcome: each job's times, the totals and the SLO violations.
fn print_outcome(a: &ControlArgs, outcome: &Outcome) {
    let s = &outcome.summary;
    println!("{} — stopped: {}", outcome.method, outcome.stopped);
    println!(
        "{:<24} {:>10} {:>10} {:>7} {:>5}",
        "job", "runtime s", "paused s", "pauses", "exit"
    );
    for j in &s.jobs {
        println!(
            "{:<24} {:>10.2} {:>10.2} {:>7} {:>5}",
            j.name,
            j.runtime_s,
            j.paused_s,
            j.pauses,
            j.exit.map_or("-".into(), |c| c.to_string())
        );
    }
    println!(
        "jobs' total time {} s; core changes {}; pauses {}",
        s.total_s.map_or("-".into(), |t| format!("{t:.2}")),
        s.core_changes,
        s.pauses,
    );
    // The headline counts the load's trace segments (each on its p95 over all its
    // requests); the 100 ms intervals, each on its own p95, are the stricter figure.
    let segments = match s.segment_violation_ratio {
        Some(r) => format!(
            "{} of {} trace segments ({:.2}%, highest segment p95 {:.0} µs)",
            s.segment_violations,
            s.segments.len(),
            r * 100.0,
            s.segments.iter().map(|g| g.p95_us).fold(0.0, f64::max)
        ),
        None => "- of trace segments (no --live rows with histograms)".into(),
    };
    println!(
        "SLO violations (p95 > {} µs while jobs ran): {segments}; {} of {} 100 ms intervals ({:.2}%)",
        a.slo_p95_us,
        s.violations,
        s.intervals,
        s.violation_ratio * 100.0
    );
    if let Some(c) = &outcome.cost {
        println!(
            "the jobs' cost against the baseline: {} of {} segments violated with the jobs, {} without, difference {} ({}){}",
            c.with_jobs,
            c.segments,
            c.without_jobs,
            c.difference,
            c.ratio.map_or("-".into(), |r| format!("{:.2}%", r * 100.0)),
            if c.unmatched > 0 {
                format!("; {} segment(s) beyond the baseline left out", c.unmatched)
            } else {
                String::new()
            }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ControlArgs,
    }

    fn spec(argv: &[&str]) -> anyhow::Result<PolicySpec> {
        let cli = Cli::try_parse_from(std::iter::once("control").chain(argv.iter().copied()))?;
        policy(&cli.args)
    }

    #[test]
    fn flags_map_onto_policies() {
        assert_eq!(
            spec(&["--policy", "static", "--static-cores", "2"]).unwrap(),
            PolicySpec::Static { cores: 2 }
        );
        assert_eq!(
            spec(&[]).unwrap(),
            PolicySpec::Reactive {
                slack: DEFAULT_SLACK
            }
        );
        match spec(&["--policy", "predictive", "--capacity", "40000, 80000"]).unwrap() {
            PolicySpec::Predictive {
                capacity, headroom, ..
            } => {
                assert_eq!(capacity, vec![40000.0, 80000.0]);
                assert_eq!(headroom, DEFAULT_HEADROOM);
            }
            p => panic!("{p:?}"),
        }
    }

    #[test]
    fn a_policy_s_own_flags_give_it_back() {
        let slack = Slack {
            slo_p95_us: DEFAULT_SLACK.slo_p95_us,
            grow_slack: 0.07,
            shrink_slack: 0.31,
            hold: 7,
            latency: kvlab_control::policy::LatencySource::Client,
            max_queued: Some(1.5),
            latency_window_ms: 2500,
            segment_budget: Some(0.025),
        };
        for p in [
            PolicySpec::Static { cores: 3 },
            PolicySpec::Reactive {
                slack: DEFAULT_SLACK,
            },
            PolicySpec::Reactive { slack },
            PolicySpec::Predictive {
                slack,
                capacity: vec![12345.6, 0.1 + 0.2],
                headroom: 0.3,
            },
            PolicySpec::Predictive {
                slack,
                capacity: Vec::new(),
                headroom: DEFAULT_HEADROOM,
            },
        ] {
            let flags = p.flags();
            let argv: Vec<&str> = flags.iter().map(String::as_str).collect();
            assert_eq!(spec(&argv).unwrap(), p, "{flags:?}");
        }
    }

    #[test]
    fn predictive_without_capacity_is_calibrated() {
        match spec(&["--policy", "predictive"]).unwrap() {
            PolicySpec::Predictive { capacity, .. } => assert!(capacity.is_empty()),
            p => panic!("{p:?}"),
        }
    }

    #[test]
    fn bad_flags_are_refused() {
        for argv in [
            &["--policy", "static"][..],
            &["--policy", "predictive", "--capacity", "a,b"],
            &["--policy", "fast"],
            &["--grow-slack", "0.5", "--shrink-slack", "0.1"],
        ] {
            assert!(spec(argv).is_err(), "{argv:?}");
        }
    }
}
