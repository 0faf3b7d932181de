//! kvlab's fault-injection harness, in the manner of Jepsen: clients record every operation
//! they make against a cache (invoke and complete times, key, a unique value, outcome), a
//! seeded nemesis kills, pauses, adds, removes, partitions and delays nodes while they run, and a checker judges
//! the whole history, key by key.
//!
//! - [`history`]: the records (client operations and nemesis actions on one timeline),
//!   written and read as JSON lines.
//! - [`checker`]: per key, a register of unique values: lost writes, stale reads, values
//!   never written; and [`linear`], the full linearizability search of each key's history.
//! - [`schedule`]: the nemesis's faults, drawn from a seed (kill, pause, add, remove,
//!   coordinator and etcd member kills, …) over a run's duration.
//! - [`clients`]: client threads that write unique values and read a small set of keys,
//!   cluster-aware or through `kvlab proxy --cluster`, recording every operation.
//! - [`system`]: the system under test — nodes, topology store (file or etcd), proxy,
//!   coordinators — started through the kvlab binary, controlled by signals, always
//!   stopped; on loopback, or each in a network namespace of its own ([`netns`]); nodes
//!   memory-only, or durable (a data directory each, kept across `kill -9`).
//! - [`netns`]: a run's network of namespaces (`scripts/cluster-netns.sh`, built in):
//!   partitions and delays between any two of its hosts.
//! - [`nemesis`]: carries out a schedule on the system, and heals it afterwards.
//! - [`runner`]: one seeded run end to end (start, load and faults, heal, final reads,
//!   check, files), and the summary of a soak of many.
//!
//! This crate stands above `kvlab-client` and `kvlab-cluster`; nothing but the kvlab
//! binary and the lab may use it.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod checker;
pub mod clients;
pub mod history;
pub mod linear;
pub mod nemesis;
pub mod netns;
pub mod runner;
pub mod schedule;
pub mod system;

pub use checker::{check, Anomaly, AnomalyKind, Report};
pub use history::{Clock, History, NemesisEvent, Op, OpKind, Outcome, Record};
pub use runner::{run, ClientKind, RunConfig, RunSummary};
pub use schedule::{Capabilities, Fault, FaultKind, Mix, RingBounds, Schedule};
pub use system::{Durable, TopologyKind};

/// What can go wrong in the harness itself (not in the system under test: that is what
/// the checker reports).
#[derive(Debug, thiserror::Error)]
pub enum FaultsError {
    /// Reading or writing a file failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// A history line is not a record.
    #[error("{what}: line {line}: {source}")]
    Json {
        /// The file.
        what: String,
        /// Its line number (from 1).
        line: usize,
        /// What was wrong.
        source: serde_json::Error,
    },
}
