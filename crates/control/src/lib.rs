//! kvlab's SLO controller: keeps a latency-critical cache server inside its latency SLO
//! while batch jobs use the cores it does not need.
//!
//! ```text
//!  cache server ◄── load (kvlab bench: a trace; its intervals as JSON lines ─┐)
//!      │ /proc/PID/stat (CPU), `stats` (requests, connections)            │ p95 per interval
//!      ▼                                                                   ▼
//!  sensor::ServerSensor ──► policy::Policy (static | reactive | predictive) ──► cores
//!      controller::Controller ── Machine ──► machine::System
//!         │                                   ├─ cpus: cgroup cpuset (v1, v2) | sched_setaffinity
//!         │                                   └─ jobs: sh -c in their own process group;
//!         │                                      pause: cgroup freezer (v1, v2) | SIGSTOP/SIGCONT
//!         └─ queue::Queue (order, dependencies, runtime without paused spans)
//!         └─ event::EventLog (JSON lines: samples, cores, start, pause, resume, end)
//! ```
//!
//! Modules: [`app`] (one controlled run, start to figures), [`calibrate`] (the server's
//! capacity per core count, measured where it runs), [`cpus`] (CPU lists, the split), [`jobs`] (the job file), [`queue`] (which job
//! runs), [`policy`] (how many cores the server gets), [`probe`] (whether pausing the jobs helps), [`controller`] (one step per sample,
//! the loop), [`sensor`] (what a sample reads), [`machine`] (cgroups, affinity, signals),
//! [`event`] (the log), [`speedup`] (each job alone at each core count), [`summary`] (runtimes and SLO violations from a log and the load's
//! intervals), [`window`] (percentiles over a sample from the server's cumulative
//! histograms).

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod app;
pub mod calibrate;
pub mod controller;
pub mod cpus;
pub mod event;
pub mod jobs;
pub mod machine;
pub mod policy;
pub mod probe;
pub mod queue;
pub mod sensor;
pub mod speedup;
pub mod summary;
pub mod window;

#[cfg(test)]
mod sim;

pub use controller::{Controller, Machine, RunLimits, Sensor, Share};
pub use cpus::CpuSet;
pub use jobs::{JobFile, JobSpec};
pub use policy::{
    LatencySource, Policy, PolicySpec, Signal, Slack, DEFAULT_HEADROOM, DEFAULT_SLACK,
};

/// Why the controller could not do something.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// A bad job file, flag or value; says what was wrong.
    #[error("{0}")]
    Spec(String),
    /// A system call or file failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
}

impl ControlError {
    /// An I/O error with what was being done.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> ControlError {
        ControlError::Io {
            what: what.into(),
            source,
        }
    }
}
