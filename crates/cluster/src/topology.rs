//! The cluster's topology: its nodes, the ring's points per node, the ring's epoch and the
//! migration under way, kept in a [`TopologyStore`] that every node and `kvlab cluster`
//! read, and that only compare-and-swap changes.
//!
//! A migration moves the cluster from `nodes` to `migration.to` in two phases:
//!
//! - `copy`: the ring is still that of `nodes`; every node that loses keys copies them to
//!   their new owners and then streams the changes made to them meanwhile.
//! - `handoff`: the ring is that of `to`; a node that lost keys redirects them, finishes
//!   streaming and tells each new owner it is done; a new owner answers `TRYAGAIN` for keys
//!   whose data is still arriving.
//!
//! When every losing node has handed off, `nodes` becomes `to` and the migration ends. Each
//! step is one epoch.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kvlab_ring::Ring;
use serde::{Deserialize, Serialize};

use crate::ClusterError;

/// `path` made absolute for a message (as it is when that fails): a path relative to
/// where the command ran says little once it is read elsewhere.
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// How often a node reads a topology file.
pub const POLL: Duration = Duration::from_millis(20);

/// The topology of one epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    /// Bumped by every change.
    pub epoch: u64,
    /// Ring points per node.
    pub vnodes: u32,
    /// The nodes (addresses `HOST:PORT`) whose ring serves outside a hand-off.
    pub nodes: Vec<String>,
    /// Copies of every key: its owner and the next `replicas - 1` distinct nodes along the
    /// ring, written through by the owner before it answers.
    #[serde(default = "one")]
    pub replicas: u32,
    /// When a write with copies is acknowledged (see [`CopyWritePolicy`]).
    #[serde(default, skip_serializing_if = "CopyWritePolicy::is_all")]
    pub write_policy: CopyWritePolicy,
    /// The migration under way, if any.
    #[serde(default)]
    pub migration: Option<Migration>,
    /// Nodes that recent migrations took out of the ring (newest last, a few kept). With
    /// copies, such a node may still hold items its keys' new nodes have not confirmed; a
    /// node that restarts empty asks these too before it serves (see `Node::rejoin`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leaving: Vec<String>,
}

fn one() -> u32 {
    1
}

/// When the owner of a key with copies (`replicas` > 1) acknowledges a write.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CopyWritePolicy {
    /// Once every copy holder confirmed it: an acknowledged write is on `replicas` nodes.
    #[default]
    All,
    /// Once the owner applied it; its copies follow in write order (batched while earlier
    /// ones are in flight), as a Redis Cluster primary's do. A write acknowledged less than
    /// a round trip before its owner dies may be lost; a read still never returns a value
    /// its holders do not have (it waits for their confirmation, as under `all`).
    Owner,
}

impl CopyWritePolicy {
    fn is_all(&self) -> bool {
        *self == CopyWritePolicy::All
    }
}

impl std::str::FromStr for CopyWritePolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "all" => Ok(CopyWritePolicy::All),
            "owner" => Ok(CopyWritePolicy::Owner),
            _ => Err(format!("write policy {s:?}: expected all or owner")),
        }
    }
}

impl std::fmt::Display for CopyWritePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CopyWritePolicy::All => "all",
            CopyWritePolicy::Owner => "owner",
        })
    }
}

/// A change of the node set under way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Migration {
    /// The epoch at which it began (names it on the wire).
    pub id: u64,
    /// The nodes after it.
    pub to: Vec<String>,
    /// Where it stands.
    pub phase: Phase,
    /// When it began, unix milliseconds.
    pub started_ms: u64,
}

/// A migration's phase (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Copying and streaming; the old ring serves.
    Copy,
    /// The new ring serves; losing nodes finish streaming.
    Handoff,
}

impl Topology {
    /// A new cluster of `nodes` at epoch 1.
    pub fn new(vnodes: u32, nodes: Vec<String>) -> Topology {
        Topology {
            epoch: 1,
            vnodes,
            nodes,
            replicas: 1,
            write_policy: CopyWritePolicy::All,
            migration: None,
            leaving: Vec::new(),
        }
    }

    /// The ring requests are served by in this epoch.
    pub fn serving(&self) -> Ring {
        match &self.migration {
            Some(m) if m.phase == Phase::Handoff => Ring::new(self.epoch, self.vnodes, &m.to),
            _ => Ring::new(self.epoch, self.vnodes, &self.nodes),
        }
    }

    /// The other ring of a migration: the next one while copying, the previous one
    /// during the hand-off.
    pub fn other(&self) -> Option<Ring> {
        let m = self.migration.as_ref()?;
        Some(match m.phase {
            Phase::Copy => Ring::new(self.epoch, self.vnodes, &m.to),
            Phase::Handoff => Ring::new(self.epoch, self.vnodes, &self.nodes),
        })
    }

    /// The same topology one epoch later.
    pub fn next(&self) -> Topology {
        Topology {
            epoch: self.epoch + 1,
            ..self.clone()
        }
    }
}

/// Where a cluster's topology lives. Every change is a compare-and-swap on the epoch, so
/// two coordinators can never both apply a change to the same epoch.
pub trait TopologyStore: Send + Sync {
    /// The current topology (`None`: no cluster was created here).
    fn load(&self) -> Result<Option<Topology>, ClusterError>;
    /// Replaces the topology with `new` if the stored one still has epoch `expected`
    /// (`None`: none is stored yet). False if another change came first.
    fn swap(&self, expected: Option<u64>, new: &Topology) -> Result<bool, ClusterError>;
    /// Where it is, for messages.
    fn describe(&self) -> String;
    /// Removes the cluster (`kvlab cluster down`).
    fn clear(&self) -> Result<(), ClusterError>;
    /// Blocks until the topology may have changed, or `timeout` (a file is polled: this
    /// sleeps a poll interval; etcd is watched).
    fn wait(&self, timeout: Duration) {
        std::thread::sleep(timeout.min(POLL));
    }
    /// Says node `node` is alive (called about once a second by every node); a store with
    /// leases lets the node's liveness lapse when the calls stop.
    fn heartbeat(&self, _node: &str) -> Result<(), ClusterError> {
        Ok(())
    }
    /// How long a liveness lasts without a heartbeat (`None`: the store has no leases).
    fn lease_ttl(&self) -> Option<Duration> {
        None
    }
    /// The nodes whose liveness has not lapsed (`None`: the store does not know).
    fn alive(&self) -> Result<Option<Vec<String>>, ClusterError> {
        Ok(None)
    }
}

/// The embedded store for one machine: a JSON file, changed under an exclusive `flock` and
/// replaced by an atomic rename, so readers never see half a file. Nodes poll it.
pub struct FileStore {
    path: PathBuf,
}

impl FileStore {
    /// The store at `path` (the file need not exist yet; its directory must).
    pub fn new(path: impl Into<PathBuf>) -> FileStore {
        FileStore { path: path.into() }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> Result<File, ClusterError> {
        let lock_path = self.path.with_extension("lock");
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| ClusterError::Store(format!("{}: {e}", lock_path.display())))?;
        // SAFETY: flock on a descriptor we own; released when `f` is closed.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(ClusterError::Store(format!(
                "lock {}: {}",
                lock_path.display(),
                std::io::Error::last_os_error()
            )));
        }
        Ok(f)
    }
}

impl TopologyStore for FileStore {
    fn load(&self) -> Result<Option<Topology>, ClusterError> {
        match fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                ClusterError::Store(format!(
                    "{} is not a kvlab cluster topology ({e}); one is the JSON that `kvlab \
                     cluster up` or `create` writes, e.g. {{\"epoch\": 1, \"vnodes\": 1024, \
                     \"nodes\": [\"127.0.0.1:7101\", \"127.0.0.1:7102\"]}}",
                    absolute(&self.path).display()
                ))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ClusterError::Store(format!("{}: {e}", self.path.display()))),
        }
    }

    fn swap(&self, expected: Option<u64>, new: &Topology) -> Result<bool, ClusterError> {
        let _lock = self.lock()?;
        if self.load()?.map(|t| t.epoch) != expected {
            return Ok(false);
        }
        let tmp = self.path.with_extension("tmp");
        let io = |e: std::io::Error| ClusterError::Store(format!("{}: {e}", tmp.display()));
        let mut f = File::create(&tmp).map_err(io)?;
        let json =
            serde_json::to_vec_pretty(new).map_err(|e| ClusterError::Store(e.to_string()))?;
        f.write_all(&json).map_err(io)?;
        f.sync_all().map_err(io)?;
        fs::rename(&tmp, &self.path).map_err(io)?;
        Ok(true)
    }

    fn describe(&self) -> String {
        format!("file {}", absolute(&self.path).display())
    }

    fn clear(&self) -> Result<(), ClusterError> {
        let _lock = self.lock()?;
        match fs::remove_file(&self.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(ClusterError::Store(format!("{}: {e}", self.path.display()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A topology written before write policies reads as `all`; `all` is not written (such
    /// a file stays as it was), `owner` is, and reads back.
    #[test]
    fn the_write_policy_defaults_to_all_and_round_trips() {
        let old = r#"{"epoch":3,"vnodes":16,"nodes":["a:1","b:2"],"replicas":2}"#;
        let t: Topology = serde_json::from_str(old).unwrap();
        assert_eq!(t.write_policy, CopyWritePolicy::All);
        assert!(!serde_json::to_string(&t).unwrap().contains("write_policy"));
        let owner = Topology {
            write_policy: CopyWritePolicy::Owner,
            ..t
        };
        let json = serde_json::to_string(&owner).unwrap();
        assert!(json.contains(r#""write_policy":"owner""#), "{json}");
        assert_eq!(serde_json::from_str::<Topology>(&json).unwrap(), owner);
        assert_eq!(
            "owner".parse::<CopyWritePolicy>(),
            Ok(CopyWritePolicy::Owner)
        );
        assert!("some"
            .parse::<CopyWritePolicy>()
            .unwrap_err()
            .contains("all or owner"));
    }

    #[test]
    fn swap_is_compare_and_swap_on_the_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path().join("topology.json"));
        assert_eq!(store.load().unwrap(), None);
        let t = Topology::new(16, vec!["a:1".into(), "b:2".into()]);
        assert!(!store.swap(Some(1), &t).unwrap(), "nothing stored yet");
        assert!(store.swap(None, &t).unwrap());
        assert!(!store.swap(None, &t).unwrap(), "already created");
        let mut t2 = t.next();
        t2.migration = Some(Migration {
            id: 2,
            to: vec!["a:1".into(), "b:2".into(), "c:3".into()],
            phase: Phase::Copy,
            started_ms: 0,
        });
        assert!(!store.swap(Some(7), &t2).unwrap(), "stale epoch");
        assert!(store.swap(Some(1), &t2).unwrap());
        assert_eq!(store.load().unwrap(), Some(t2.clone()));
        assert_eq!(t2.serving().nodes().len(), 2);
        assert_eq!(t2.other().unwrap().nodes().len(), 3);
    }
}
