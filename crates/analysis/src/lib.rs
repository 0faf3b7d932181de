//! Turns measurements into conclusions for `kvlab lab`: statistics over repetitions,
//! the saturation knee, operational laws, queueing models and 2^k·r factorial designs.
//!
//! The crate takes plain numbers (no other kvlab crate is imported but `kvlab-procfs`, whose
//! readings of a process's CPU time `laws` re-exports) and returns
//! `serde`-serializable results, so the report can print them or write them to JSON.
//! Every public quantity states its unit in its doc comment; the functions are
//! unit-agnostic as long as the inputs agree (seconds with requests/second, etc.).
//!
//! - [`summary`]: mean, standard deviation, Student-t confidence intervals, percentiles;
//! - [`saturation`]: the knee of throughput vs clients, and N* from operational analysis;
//! - [`laws`]: interactive response-time law, utilization law, Little's law, CPU time
//!   from `/proc/<pid>/stat`;
//! - [`queueing`]: M/M/1, M/M/m (Erlang C), exact MVA of a closed network with think
//!   time, and its asymptotic bounds;
//! - [`factorial`]: 2^k·r designs — effects, allocation of variation, CIs of effects;
//! - [`compare`]: [`ModelCheck`], a prediction set beside a measurement with an explicit
//!   tolerance, so a disagreement is reported rather than hidden.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod compare;
pub mod error;
pub mod factorial;
pub mod laws;
pub mod queueing;
pub mod saturation;
pub mod summary;

pub use compare::ModelCheck;
pub use error::{AnalysisError, Result};
pub use summary::{summarize, Summary};
