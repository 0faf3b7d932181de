//! One controlled run as a library call: the job file's inputs made, the machine set up
//! around a running server, the loop until the jobs end (or the time limit, or a stop),
//! and the run's figures. `kvlab control` and the lab's control experiments both call
//! [`control`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::controller::{self, Controller, RunLimits, Share};
use crate::event::{read_log, EventLog, What};
use crate::jobs::JobFile;
use crate::machine::{CpuMethod, PauseMethod, System};
use crate::policy::{Policy, PolicySpec};
use crate::sensor::{LiveFile, ServerSensor};
use crate::summary::{summarise, RunSummary};
use crate::ControlError;

/// The default time between samples.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(100);

/// Everything one controlled run needs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The server's process id.
    pub pid: u32,
    /// Where it answers `stats` (request rate, connections).
    pub stats: Option<SocketAddr>,
    /// The load's intervals as `kvlab bench --live` writes them (the latency signal).
    pub live: Option<PathBuf>,
    /// The jobs.
    pub jobs: JobFile,
    /// Where jobs run and their inputs and logs are (`{work}`).
    pub work: PathBuf,
    /// Run the job file's `prepare` commands first.
    pub prepare: bool,
    /// The policy.
    pub policy: PolicySpec,
    /// The CPUs shared and the server's minimum.
    pub share: Share,
    /// How CPUs move.
    pub cpu_method: CpuMethod,
    /// How jobs pause.
    pub pause_method: PauseMethod,
    /// Time between samples.
    pub interval: Duration,
    /// The longest the run may last.
    pub max: Duration,
    /// Stop when every job has ended (else run until `max` or a stop).
    pub until_jobs_done: bool,
    /// The control log (JSON lines).
    pub log: PathBuf,
    /// The SLO the summary counts violations against, µs.
    pub slo_p95_us: f64,
}

/// What a run did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Outcome {
    /// The policy's name.
    pub policy: String,
    /// How CPUs moved and jobs paused.
    pub method: String,
    /// Why the loop stopped.
    pub stopped: String,
    /// Jobs in the job file.
    pub jobs: usize,
    /// The most cores the server had.
    pub server_cores_max: usize,
    /// The figures.
    pub summary: RunSummary,
}

/// Runs the loop around the server until the jobs end, `max` passes or `stop` says so.
pub fn control(o: &Options, stop: &dyn Fn() -> bool) -> Result<Outcome, ControlError> {
    std::fs::create_dir_all(&o.work)
        .map_err(|e| ControlError::io(format!("creating {}", o.work.display()), e))?;
    if o.prepare {
        controller::prepare(&o.jobs.prepare, &o.work)?;
    }
    let system = System::new(o.pid, &o.share.cpus, o.cpu_method, o.pause_method, &o.work)?;
    let method = system.describe();
    let log = EventLog::file(&o.log)?;
    let mut c = Controller::new(
        system,
        Policy::new(o.policy.clone()),
        o.jobs.jobs.clone(),
        o.share.clone(),
        log,
    )?;
    let mut sensor = ServerSensor::new(o.pid, o.stats, o.live.clone());
    let limits = RunLimits {
        interval: o.interval,
        max: o.max,
        until_jobs_done: o.until_jobs_done && !o.jobs.jobs.is_empty(),
    };
    let stopped = controller::run(&mut c, &mut sensor, limits, stop)?;
    drop(c);
    let events = read_log(&o.log)?;
    let server_cores_max = events
        .iter()
        .filter_map(|e| match e.what {
            // The share after the run (every CPU back to the server) is not the policy's.
            What::Cores { to, .. } if e.signal.is_some() || e.reason.starts_with("initial") => {
                Some(to)
            }
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let rows = match &o.live {
        Some(p) => LiveFile::new(p.clone()).poll(),
        None => Vec::new(),
    };
    Ok(Outcome {
        policy: o.policy.name().into(),
        method,
        stopped,
        jobs: o.jobs.jobs.len(),
        server_cores_max,
        summary: summarise(&events, &rows, o.slo_p95_us),
    })
}
