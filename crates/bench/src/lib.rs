//! kvlab's load generator: the library behind `kvlab bench`, `kvlab populate` and the load
//! of `kvlab lab`.
//!
//! Its numbers must be trustworthy first and fast second. Every request is timed from its
//! *planned* send time (no coordinated omission) and, beside it, from its actual send.
//!
//! # How a run is put together
//!
//! ```text
//!  flags / [workload] ──► load::Options ──► load::Load ──► config::BenchConfig ──► run::run
//!                          (flat keys)      (description,   (one run; JSON     │
//!                                            defaults)       to agents)        │
//!   run ─┬─ local: generator threads ×T, each a mio loop (generator: many pipelined
//!        │         connections; schedule plans open-loop sends; workload composes)
//!        ├─ agent: the same threads on other machines, reporting over JSON lines
//!        └─ collector: stats (HdrHistograms per interval) merged ─► RunResult ─► report
//!
//!  sustained::Search  proposes rates, judges measured results (its own runs or a caller's)
//!  populate           the load phase alone: fill a server with a workload's key space
//! ```
//!
//! # Modules, from the description down
//!
//! - [`load`]: the one load description — open/closed loop, rate plan, workload, warm-up,
//!   duration, interval, seed, protocol, threads — with every default, its validation, and
//!   the one conversion to a [`BenchConfig`]; [`load::Options`] is its flat form (flags, files);
//! - [`workload`]: keys, values (verifiable), operation mix, request composition;
//! - [`data`]: real data sets (maildir, JSON lines, CSV) as the key space and values;
//! - [`dist`]: size and key distributions (uniform, sequential, gaussian, zipf, hot set; GEV,
//!   generalized Pareto, the Facebook ETC preset);
//! - [`schedule`]: open-loop arrival processes (Poisson, fixed) and rate plans (fixed, scan,
//!   random trace, list);
//! - [`config`]: one run's complete settings, derived from a [`load::Load`] (serde: agents
//!   receive it);
//! - [`clock`]: monotonic and thread-CPU clocks, the nanosecond timer of the event loop;
//! - [`generator`]: one generator thread: a mio event loop over many pipelined connections;
//! - `local` (private): one participant's generator threads: spawn, wait until connected;
//! - [`stats`]: counters, HdrHistograms per thread and interval, percentiles, KS statistics;
//! - [`run`](mod@run): starts local threads and agents together, merges their reports, self-checks;
//! - [`agent`]: `kvlab bench agent` and the master's link to it;
//! - [`populate`]: filling a server with the key space of a workload, and checking a sample;
//! - [`sustained`]: the largest rate sustained within a latency bound — the [`sustained::Search`]
//!   state machine and [`sustained::find_sustained`] on top of runs;
//! - [`report`]: terminal summary, JSON, CSV, and side-by-side comparison of targets.
//!
//! Imports go one way: `load` → `config` → `schedule`/`workload` → `dist`/`data`; `run` → `local`/
//! `agent` → `generator`; no two modules import each other.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod agent;
pub mod clock;
pub mod config;
pub mod data;
pub mod dist;
pub mod generator;
pub mod load;
mod local;
pub mod maildir;
pub mod populate;
pub mod report;
pub mod run;
pub mod schedule;
pub mod stats;
pub mod sustained;
pub mod workload;

pub use config::{BenchConfig, Protocol};
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
