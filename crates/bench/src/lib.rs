//! kvlab's load generator: the library behind `kvlab bench`.
//!
//! Its numbers must be trustworthy first and fast second. Every request is timed from its
//! *planned* send time (no coordinated omission) and, beside it, from its actual send.
//!
//! - [`dist`]: size and key distributions (uniform, sequential, gaussian, zipf, hot set; GEV,
//!   generalized Pareto, the Facebook ETC preset);
//! - [`workload`]: keys, values (verifiable), operation mix, request composition;
//! - [`schedule`]: open-loop arrival processes (Poisson, fixed) and rate plans (fixed, scan,
//!   random trace, list);
//! - [`config`]: one run's complete description (serde: agents receive it);
//! - [`clock`]: monotonic and thread-CPU clocks, the nanosecond timer of the event loop;
//! - [`engine`]: one generator thread: a mio event loop over many pipelined connections;
//! - [`stats`]: counters, HdrHistograms per thread and interval, percentiles, KS statistics;
//! - `local` (private): one participant's generator threads: spawn, wait until connected;
//! - [`run`]: starts threads and agents together, merges their reports, self-checks;
//! - [`populate`]: filling a server with the key space of a workload, and checking a sample;
//! - [`sustained`]: the search for the largest rate sustained within a latency bound;
//! - [`agent`]: `kvlab bench agent` and the master's link to it;
//! - [`report`]: terminal summary, JSON, CSV, and side-by-side comparison of targets.

pub mod agent;
pub mod clock;
pub mod config;
pub mod dist;
pub mod engine;
pub mod load;
mod local;
pub mod populate;
pub mod report;
pub mod run;
pub mod schedule;
pub mod stats;
pub mod sustained;
pub mod workload;

pub use config::{Config, Protocol};
pub use run::{run, RunResult};

use thiserror::Error;

/// Errors of the load generator.
#[derive(Debug, Error)]
pub enum BenchError {
    /// A flag or specification is invalid.
    #[error("{0}")]
    Spec(String),
    /// The target could not be reached.
    #[error("cannot connect to {0}: {1}")]
    Connect(String, String),
    /// A run failed.
    #[error("run failed: {0}")]
    Run(String),
    /// An agent failed or spoke out of turn.
    #[error("agent: {0}")]
    Agent(String),
    /// I/O.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// A bug: an internal invariant failed.
    #[error("internal error: {0}")]
    Internal(String),
}
