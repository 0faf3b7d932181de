//! The control workflow as an experiment: a server under a random rate trace, the batch
//! jobs, and `kvlab control` moving cores between them — for every trace seed × trace
//! interval × policy × system (policies interleaved, A B C A B C), then a report.
//!
//! ```text
//! control experiment (TOML) ─► for each run:
//!   system::Instance::start (the server, pinned to the shared CPUs)
//!   taskset -c <generator_cpus> kvlab bench --qps-min/max/interval/seed --interval 0.1
//!       --live runs/NNNN/live.jsonl                     (the load, a child process;
//!       rows of 50 ms for a trace interval that is not a whole number of 100 ms)
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
//!                                # shipped one (control-jobs, control-jobs-medium, control-jobs-quick)
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
//! work_dir = "/dev/shm"          # the jobs' files ({work}) go to a new directory there,
//!                                # removed afterwards (default: the results' `work`)
//! cpu_method = "auto"            # as kvlab control's --cpu-method / --pause-method
//! pause_method = "auto"
//! baseline = true                # each run set ends with its trace run with no jobs ...
//! baselines = 1                  # ... this many times (from 2: the later ones compared
//!                                # with the first, the machine's own spread)
//! calibrate_time = 30            # a predictive policy without `capacity`: the server's
//! calibrate_from = <qps_max>     # capacity per core count measured first (s a core count;
//!                                # the search's first rate, req/s)
//! [workload]                     # more kvlab bench flags (keys, value_size, mix, …)
//! [[system]]                     # as in lab experiments (name, kind, args, binary, …)
//! [[restrict]]                   # optional: one system's runs limited to some policies
//! system = "memcached"           # (by name) and trace intervals; the rest of the cross
//! policies = ["predictive-idle"] # product is not run for it
//! qps_intervals = [10]
//! agents = ["c1"]                # optional: the load from a kvlab bench agent on each of
//!                                # these hosts (the lab's process only collects the rows the
//!                                # controller reads); every [[system]] then has a `host`
//!                                # whose `address` the agents reach. The controller and the
//!                                # jobs run beside the server: here on a `local = true`
//!                                # host, over ssh (`kvlab control` there) on an ssh one
//! [[host]]                       # the hosts, as in lab experiments (name, ssh, local, dir,
//! [ssh]                          # clock, address); `--hosts FILE` replaces them
//! [[policy]]                     # name (default: the policy), policy = "static" |
//! policy = "static"              # "reactive" | "predictive"; cores (static); capacity,
//! cores = 1                      # headroom (predictive); grow_slack, shrink_slack, hold,
//!                                # latency ("auto" | "client" | "server"), max_queued,
//!                                # latency_window (s: the load's p95 over that span);
//!                                # segment_budget (share of the trace segment's
//!                                # requests the guard lets go over the SLO);
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

use anyhow::{bail, Context};
use kvlab_control::app::Outcome;
use kvlab_control::summary::{Cost, IdleBound};
use kvlab_control::{JobFile, PolicySpec, Slack, DEFAULT_HEADROOM, DEFAULT_SLACK};
use serde::{Deserialize, Serialize};

use crate::spec::{HostFile, HostTable, SshSpec, SystemSpec};

mod analyse;
mod run;
mod there;

pub use analyse::{analyse, mean_sd};
pub use run::run;

/// The shipped job files: (name, text).
pub const SHIPPED_JOBS: &[(&str, &str)] = &[
    (
        "control-jobs",
        include_str!("../../../../experiments/control-jobs.toml"),
    ),
    (
        "control-jobs-medium",
        include_str!("../../../../experiments/control-jobs-medium.toml"),
    ),
    (
        "control-jobs-quick",
        include_str!("../../../../experiments/control-jobs-quick.toml"),
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
    latency_window: Option<f64>,
    segment_budget: Option<f64>,
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
    /// Where the jobs make their inputs and write their outputs (`{work}`); default: the
    /// results directory's `work`.
    work_dir: Option<String>,
    cpu_method: Option<String>,
    pause_method: Option<String>,
    /// Every controlled run gets a baseline: the same trace and seed with no jobs, after
    /// the run set's controlled runs (default: true).
    baseline: Option<bool>,
    /// No-jobs runs per run set (default 1). From 2, each later one is compared with the
    /// first as a run with jobs is: the machine's own spread between two runs of the same
    /// trace, the noise floor of the jobs' cost.
    baselines: Option<usize>,
    /// The longest one core count's capacity calibration may take, s (default 30).
    calibrate_time: Option<f64>,
    /// The calibration's first rate, req/s (default: `qps_max`, the trace's highest: the
    /// search grows from a rate the load brings, not from one where this kind of machine's
    /// wake-ups decide the latency).
    calibrate_from: Option<f64>,
    #[serde(default)]
    workload: toml::Table,
    #[serde(rename = "system")]
    systems: Vec<SystemSpec>,
    #[serde(rename = "policy")]
    policies: Vec<PolicyEntry>,
    #[serde(default, rename = "restrict")]
    restricts: Vec<Restrict>,
    /// The load's hosts: a `kvlab bench agent` on each (default: `kvlab bench` here).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    agents: Vec<String>,
    #[serde(default, rename = "host", skip_serializing_if = "Vec::is_empty")]
    hosts: Vec<HostFile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ssh: Option<SshSpec>,
}

/// The hosts a control experiment's roles name, resolved.
struct PlacedHosts {
    hosts: Vec<kvlab_hosts::Host>,
    pools: Vec<crate::spec::AgentPool>,
    ssh: SshSpec,
}

/// A `[[restrict]]`: the runs of one system limited to some policies and trace intervals
/// (the rest of the cross product is not run for it).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct Restrict {
    system: String,
    policies: Option<Vec<String>>,
    qps_intervals: Option<Vec<f64>>,
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
        if let Some(q) = s.calibrate_from.filter(|q| !(*q >= 10.0 && q.is_finite())) {
            bail!("calibrate_from = {q}: requests/s, at least 10");
        }
        if !(s.qps_min > 0.0 && s.qps_max >= s.qps_min && s.duration > 0.0) {
            bail!("need 0 < qps_min <= qps_max and duration > 0");
        }
        let mut names = Vec::new();
        for p in &s.policies {
            names.push(s.policy(p)?.0);
        }
        for i in &s.qps_intervals {
            row_interval(*i)?;
        }
        for r in &s.restricts {
            if !s.systems.iter().any(|x| x.name == r.system) {
                bail!("[[restrict]] system {:?} is not a [[system]]", r.system);
            }
            for p in r.policies.iter().flatten() {
                if !names.contains(p) {
                    bail!("[[restrict]] policy {p:?} is not a [[policy]]'s name");
                }
            }
            for i in r.qps_intervals.iter().flatten() {
                if !s.qps_intervals.contains(i) {
                    bail!("[[restrict]] interval {i} is not one of qps_intervals");
                }
            }
        }
        s.placed_hosts()?;
        for k in s.workload.keys() {
            if !crate::spec::WORKLOAD_KEYS.contains(&k.as_str())
                || ["qps", "qps_list", "qps_interval", "interval"].contains(&k.as_str())
            {
                bail!("[workload] {k:?}: a kvlab bench key other than the trace's and interval");
            }
        }
        Ok(s)
    }

    /// The hosts its roles name, resolved, and how ssh reaches them (none: everything
    /// here). Checks the roles against the table: the agents' hosts defined, and with
    /// agents every system on a host — one: the controller and the jobs run beside the
    /// server they control (here for a `local` host, over ssh on an ssh one).
    fn placed_hosts(&self) -> anyhow::Result<PlacedHosts> {
        let (hosts, pools, ssh) =
            crate::spec::resolve_hosts(self.hosts.clone(), self.ssh.clone(), None)?;
        for a in &self.agents {
            crate::spec::check_agent_host(&hosts, &pools, "agents", a)?;
        }
        for s in &self.systems {
            let names = s.hosts();
            if names.len() > 1 {
                bail!(
                    "system {:?}: one host (the controller runs beside it)",
                    s.name
                );
            }
            if !s.backend_hosts.is_empty() {
                bail!(
                    "system {:?}: backend_hosts: the control workflow runs one server",
                    s.name
                );
            }
            for h in &names {
                crate::spec::check_defined(&hosts, &format!("system {:?}", s.name), h)?;
            }
            if names.is_empty() && !self.agents.is_empty() {
                bail!(
                    "system {:?}: the load comes from agents on other hosts: give the system a \
                     host (an ssh one, or this machine as local = true with the address they \
                     reach it at)",
                    s.name
                );
            }
        }
        let mut used: Vec<String> = self.agents.clone();
        used.extend(self.systems.iter().flat_map(SystemSpec::hosts));
        Ok(PlacedHosts {
            hosts: hosts
                .into_iter()
                .filter(|h| used.contains(&h.name))
                .collect(),
            pools: pools
                .into_iter()
                .filter(|p| used.contains(&p.name))
                .collect(),
            ssh,
        })
    }

    /// Takes `--hosts FILE`'s table in place of its own.
    fn use_hosts(&mut self, table: &HostTable) -> anyhow::Result<()> {
        let (hosts, ssh) = table.parse()?;
        (self.hosts, self.ssh) = (hosts, ssh);
        self.placed_hosts().map(|_| ())
    }

    /// Its name (default: `stem`).
    pub fn name(&self, stem: &str) -> String {
        self.name.clone().unwrap_or_else(|| stem.to_string())
    }

    /// Its description.
    pub fn description(&self) -> Option<String> {
        self.description.clone()
    }

    fn baseline(&self) -> bool {
        self.baseline.unwrap_or(true)
    }

    /// No-jobs runs per run set (0 without baselines).
    fn baselines(&self) -> usize {
        match self.baseline() {
            true => self.baselines.unwrap_or(1).max(1),
            false => 0,
        }
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
            latency_window_ms: match p.latency_window {
                Some(w) if (0.0..=3600.0).contains(&w) => (w * 1000.0).round() as u64,
                Some(w) => bail!("[[policy]] latency_window {w}: 0 to 3600 seconds"),
                None => 0,
            },
            segment_budget: match p.segment_budget {
                Some(b) if b > 0.0 && b <= 1.0 => Some(b),
                Some(b) => bail!("[[policy]] segment_budget {b}: a share above 0, at most 1"),
                None => None,
            },
        };
        let spec = match p.policy.as_str() {
            "static" => PolicySpec::Static {
                cores: p.cores.context("a static [[policy]] needs cores")?,
            },
            "reactive" => PolicySpec::Reactive { slack },
            // Without capacity: empty until the run set's calibration fills it in.
            "predictive" => PolicySpec::Predictive {
                slack,
                capacity: p.capacity.clone().unwrap_or_default(),
                headroom: p.headroom.unwrap_or(DEFAULT_HEADROOM),
            },
            o => bail!("policy {o:?}: static, reactive or predictive"),
        };
        let name = p.name.clone().unwrap_or_else(|| spec.name().to_string());
        Ok((name, spec, p.idle_jobs))
    }

    /// Whether `system` runs under `policy` at trace interval `interval` (every
    /// `[[restrict]]` naming the system allows it).
    fn runs(&self, system: &str, policy: &str, interval: f64) -> bool {
        self.restricts
            .iter()
            .filter(|r| r.system == system)
            .all(|r| {
                r.policies
                    .as_ref()
                    .is_none_or(|p| p.iter().any(|n| n == policy))
                    && r.qps_intervals
                        .as_ref()
                        .is_none_or(|q| q.contains(&interval))
            })
    }

    /// The job file it names, resolved next to `base` (the experiment file's folder) or
    /// shipped.
    fn job_file(&self, base: &Path) -> anyhow::Result<(String, JobFile)> {
        job_file(&self.jobs, base)
    }
}

/// The length of the load's rows (`kvlab bench --interval`) for a trace interval: 100 ms,
/// or 50 ms when the trace interval is not a whole number of 100 ms (0.25 s), so that
/// every row lies within one trace segment and a segment's p95 is over its own requests.
pub fn row_interval(qps_interval: f64) -> anyhow::Result<f64> {
    let whole = |step: f64| {
        let n = qps_interval / step;
        n >= 1.0 - 1e-9 && (n - n.round()).abs() < 1e-6
    };
    if whole(0.1) {
        Ok(0.1)
    } else if whole(0.05) {
        Ok(0.05)
    } else {
        bail!("qps interval {qps_interval} s: a trace interval is a multiple of 50 ms")
    }
}

/// The job file `name`: a shipped one (`control-jobs`, `control-jobs-medium`, `control-jobs-quick`) or a path
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
    /// The baseline of its run set: the same trace and seed with no jobs.
    #[serde(default)]
    pub baseline: bool,
    /// What the jobs cost: its violated segments beside the baseline's same segments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<Cost>,
    /// The jobs' idle-capacity bound: from their start, the time the idle cores the load
    /// left in the baseline take to add up to the jobs' work alone on one core.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_bound: Option<IdleBound>,
    /// The run's files, relative to the results directory.
    pub control_log: String,
    /// The load's intervals (JSON lines).
    pub live: String,
    /// What went wrong, if anything.
    pub error: Option<String>,
    /// The run's processes on hosts (the server's, the agents'), with agents.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placed: Vec<crate::placement::PlacedProcess>,
    /// Each host's CPU and the lab's processes' on it over the run (load to its end), with
    /// agents.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<crate::placement::HostCpu>,
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
    /// The hosts, with their clocks at the start and the end (none: all here).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<crate::placement::HostMeta>,
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
    let mut hosts = Vec::new();
    out.push_str(
        "run  system     policy           interval  seed  jobs' total s  viol. % (segments)  \
         viol. % (100 ms)  viol. % (windows)  segments with/without jobs  jobs' cost  \
         idle bound s  total/bound\n",
    );
    for f in files {
        let r: WorkflowRun = serde_json::from_str(&std::fs::read_to_string(&f)?)?;
        hosts.extend(r.hosts.clone());
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
        let (pair, cost) = r.cost.as_ref().map_or(("-".into(), "-".into()), |c| {
            (
                format!("{}/{} of {}", c.with_jobs, c.without_jobs, c.segments),
                format!(
                    "{} ({})",
                    c.difference,
                    c.ratio.map_or("-".into(), |x| format!("{:.2}%", x * 100.0))
                ),
            )
        });
        let (bound, ratio) = match (
            &r.idle_bound,
            r.outcome.as_ref().and_then(|o| o.summary.total_s),
        ) {
            (Some(b), Some(t)) => (format!("{:.1}", b.bound_s), format!("{:.2}", t / b.bound_s)),
            (Some(b), None) => (format!("{:.1}", b.bound_s), "-".into()),
            _ => ("-".into(), "-".into()),
        };
        out.push_str(&format!(
            "{:<4} {:<10} {:<16} {:>8} {:>5} {:>14} {:>19} {:>17} {:>18} {:>27} {:>11} {:>13} {:>12}\n",
            r.index, r.system, r.policy, r.qps_interval, r.seed, total, seg, viol, w, pair, cost,
            bound, ratio
        ));
    }
    let meta = std::fs::read_to_string(dir.join("meta.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<WorkflowMeta>(&t).ok());
    if let Some(m) = meta.filter(|m| !m.hosts.is_empty()) {
        let readings: Vec<&crate::placement::HostCpu> = hosts.iter().collect();
        crate::analyse::hosts::hosts_table(&m.hosts, &readings, "load", &mut out);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The runs of `system` in one seed, as `policy@interval`, among policies `names`.
    fn runs_of(spec: &WorkflowSpec, system: &str, names: &[&str]) -> Vec<String> {
        let mut v = Vec::new();
        for &i in &spec.qps_intervals {
            for p in names {
                if spec.runs(system, p, i) {
                    v.push(format!("{p}@{i}"));
                }
            }
        }
        v
    }

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
    fn a_restrict_limits_one_systems_runs_to_its_policies_and_intervals() {
        let text = r#"
jobs = "control-jobs-quick"
qps_min = 10000
qps_max = 80000
qps_intervals = [10, 5, 1]
duration = 10
[[system]]
name = "kvlab"
[[system]]
name = "memcached"
[[policy]]
name = "static-1"
policy = "static"
cores = 1
[[policy]]
name = "predictive-idle"
policy = "predictive"
capacity = [40000, 80000]
idle_jobs = true
[[restrict]]
system = "memcached"
policies = ["predictive-idle"]
qps_intervals = [10]
"#;
        let spec = WorkflowSpec::parse(text).unwrap();
        let runs = |sys: &str| runs_of(&spec, sys, &["static-1", "predictive-idle"]);
        assert_eq!(runs("kvlab").len(), 6);
        assert_eq!(runs("memcached"), ["predictive-idle@10"]);
        // The experiment as run (written back into meta.json) keeps its restriction.
        let again = WorkflowSpec::parse(&toml::to_string(&spec).unwrap()).unwrap();
        assert_eq!(again.restricts.len(), 1);
        // A restriction naming what the experiment does not have is an error.
        for (from, to) in [
            (
                "system = \"memcached\"\npolicies",
                "system = \"redis\"\npolicies",
            ),
            ("[\"predictive-idle\"]", "[\"predictive\"]"),
            ("qps_intervals = [10]\n", "qps_intervals = [2]\n"),
        ] {
            let bad = text.replace(from, to);
            assert_ne!(bad, text);
            assert!(WorkflowSpec::parse(&bad).is_err(), "{to}");
        }
    }

    #[test]
    fn control_hosts_places_the_load_on_one_host_and_the_server_and_controller_on_another() {
        let (_, text) = crate::SHIPPED
            .iter()
            .find(|(n, _)| *n == "control-hosts")
            .unwrap();
        let spec = WorkflowSpec::parse(text).unwrap();
        assert_eq!(spec.agents, ["c1"]);
        let placed = spec.placed_hosts().unwrap();
        let names: Vec<&str> = placed.hosts.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["s1", "c1"]);
        assert!(!placed.hosts[0].is_local() && placed.hosts[0].address() == "10.77.40.12");
        assert_eq!(placed.hosts[1].address(), "10.77.40.11");
        // Written back (meta.json) as it ran, hosts included.
        let again = WorkflowSpec::parse(&toml::to_string(&spec).unwrap()).unwrap();
        assert_eq!(again.placed_hosts().unwrap().hosts, placed.hosts);
        // --hosts FILE replaces the table: the same experiment elsewhere.
        let mut other = spec.clone();
        other
            .use_hosts(&HostTable {
                file: "k8s.toml".into(),
                text: "[[host]]\nname = \"c1\"\npool = \"kvlab-bench-agent:5556\"\n\
                       [[host]]\nname = \"s1\"\nlocal = true\naddress = \"10.1.2.3\"\n"
                    .into(),
            })
            .unwrap();
        let placed = other.placed_hosts().unwrap();
        assert_eq!(placed.pools.len(), 1);
        assert_eq!(placed.hosts[0].address(), "10.1.2.3");
        // Or the server (and with it the controller and the jobs) here, where the lab runs.
        let here = text.replace(
            "name = \"s1\"\nssh = \"root@10.77.40.12\"",
            "name = \"s1\"\nlocal = true\naddress = \"10.77.40.1\"",
        );
        let placed = WorkflowSpec::parse(&here).unwrap().placed_hosts().unwrap();
        assert!(placed.hosts[0].is_local() && placed.hosts[0].address() == "10.77.40.1");
        // The agents must reach the server: it has a host.
        for (from, to, says) in [
            ("host = \"s1\"\n", "", "give the system a host"),
            (
                "agents = [\"c1\"]",
                "agents = [\"c9\"]",
                "host \"c9\" is not defined",
            ),
        ] {
            let bad = text.replace(from, to);
            assert_ne!(&bad, text, "{from}");
            let e = WorkflowSpec::parse(&bad).unwrap_err();
            assert!(format!("{e:#}").contains(says), "{to}: {e:#}");
        }
    }

    #[test]
    fn the_loads_rows_lie_within_one_trace_segment() {
        assert_eq!(row_interval(10.0).unwrap(), 0.1);
        assert_eq!(row_interval(0.5).unwrap(), 0.1);
        assert_eq!(row_interval(0.1).unwrap(), 0.1);
        assert_eq!(row_interval(0.25).unwrap(), 0.05);
        assert_eq!(row_interval(0.05).unwrap(), 0.05);
        assert!(row_interval(0.33).is_err());
        assert!(row_interval(0.02).is_err());
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
        // The issue's matrix in one file: 3 seeds x {10, 5, 1} s x {static-1 (the jobs'
        // reference), static-2-idle, reactive-idle, predictive-idle} on kvlab's server, and
        // memcached under predictive-idle at 10 s only.
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
                "static-1",
                "static-2-idle",
                "reactive-idle",
                "predictive-idle"
            ]
        );
        assert!(matches!(policies[0].1, PolicySpec::Static { cores: 1 }) && !policies[0].2);
        assert!(policies[1].2 && policies[2].2 && policies[3].2);
        let runs = |sys: &str| runs_of(&spec, sys, &names).len() * spec.seeds.len();
        assert_eq!((runs("kvlab"), runs("memcached")), (36, 3));
        assert!(spec.runs("memcached", "predictive-idle", 10.0));
        // The smallest-interval study: predictive-idle at 1, 0.5, 0.25 and 0.1 s.
        let (_, text2) = crate::SHIPPED
            .iter()
            .find(|(n, _)| *n == "control-interval")
            .unwrap();
        let spec2 = WorkflowSpec::parse(text2).unwrap();
        assert_eq!(spec2.qps_intervals, [1.0, 0.5, 0.25, 0.1]);
        assert_eq!(spec2.policies.len(), 1);
        assert!(
            WorkflowSpec::parse(&text.replace("policy = \"reactive\"", "policy = \"fast\""))
                .is_err()
        );
    }
}
