//! kvlab's elastic cluster: a ring of `kvlab server --cluster` nodes whose topology (nodes,
//! ring epoch, the migration under way) lives in a shared [`topology::TopologyStore`] (a
//! file here; etcd in the `kvlab-etcd` crate, so that a node's build needs no gRPC stack);
//! clients route keys by the ring (`kvlab_ring`); adding or removing a node moves
//! the keys that change owner while every node keeps serving.
//!
//! - [`topology`]: the topology, its phases, and where it is kept (a file on one machine).
//! - [`node`]: a node's side: the per-request ownership check (serve, `MOVED`,
//!   `TRYAGAIN`), the topology watcher, and the copy/stream/hand-off of leaving keys.
//! - [`serve`]: a node's service — the cache server's engine behind the node's gate (a
//!   decorator of `kvlab-server`'s service), and [`serve()`] that starts `kvlab server` as
//!   a node.
//! - [`copies`]: a node's write-through copies (`replicas` > 1): a sender thread per copy
//!   holder, so that no worker waits on another node.
//! - [`command_line`]: the command line that starts a node as a process.
//! - [`coordinator`]: what `kvlab cluster` does: create, add, remove, resume, abort, status.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod clock;
pub mod command_line;
pub mod coordinator;
pub mod copies;
pub mod node;
mod pipe;
pub mod serve;
pub mod topology;

pub use command_line::NodeCommand;
pub use kvlab_ring::Redirect;
pub use node::{Gate, Import, Node, Verdict};
pub use serve::{serve, ClusterConfig, NodeApp, NodeEngine};
pub use topology::{CopyWritePolicy, FileStore, Migration, Phase, Topology, TopologyStore};

/// What can go wrong in a cluster operation.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The topology store failed or holds something unexpected.
    #[error("topology: {0}")]
    Store(String),
    /// A node could not be reached or answered unexpectedly.
    #[error("node {node}: {reason}")]
    Node {
        /// The node.
        node: String,
        /// What happened.
        reason: String,
    },
    /// Nothing answers at a node's address.
    #[error("cannot reach {node}: {reason}")]
    Unreachable {
        /// The node.
        node: String,
        /// Why (the operating system's reason).
        reason: String,
    },
    /// Something answers at a node's address, but not as a kvlab cluster node.
    #[error(
        "{node} is not a kvlab cluster node: it answered \"cluster status\" with {reply} \
         ({server}) — start it with `kvlab server --cluster TOPOLOGY`"
    )]
    NotANode {
        /// The node.
        node: String,
        /// Its reply to `cluster status`.
        reply: String,
        /// What it is, from its reply to `version`.
        server: String,
    },
    /// A migration could not go on.
    #[error("migration: {0}")]
    Migration(String),
    /// The request makes no sense for this topology.
    #[error("{0}")]
    Invalid(String),
}

/// Opens the topology store a `--cluster` argument names. The binary passes one that knows
/// etcd (`kvlab_etcd::open_store`); [`open_store`] opens files only.
pub type OpenStore = fn(&str) -> Result<Box<dyn TopologyStore>, ClusterError>;

/// Opens the store a `--cluster` argument names when it is a file: `file:PATH` or a plain
/// path. An `etcd://` spec is refused with the reason: etcd is opened by
/// `kvlab_etcd::open_store`, which the `kvlab` binary uses.
pub fn open_store(spec: &str) -> Result<Box<dyn TopologyStore>, ClusterError> {
    if spec.starts_with("etcd://") {
        return Err(ClusterError::Invalid(format!(
            "{spec}: this program opens topology files only; an etcd topology needs a build \
             with kvlab-etcd (the kvlab binary has it)"
        )));
    }
    let path = spec.strip_prefix("file:").unwrap_or(spec);
    Ok(Box::new(topology::FileStore::new(path)))
}
