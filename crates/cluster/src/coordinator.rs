//! What `kvlab cluster` does to a cluster: create it, add or remove a node (a migration
//! driven through its phases in the topology store), resume or abort a migration left
//! half-way, and read every node's status.
//!
//! The coordinator holds no state of its own: every step is an epoch in the topology
//! store, so a coordinator that dies can be replaced by another that reads where the
//! migration stands and resumes it (or, while it is still copying, rolls it back).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kvlab_client::cluster::resolve;
use kvlab_client::{Answer, Client, ConnError};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::clock::now_ms;
use crate::topology::{CopyWritePolicy, Migration, Phase, Topology, TopologyStore};
use crate::ClusterError;

/// How long a migration may go without any node making progress before the coordinator
/// gives up (the topology keeps its state: resume or abort it).
pub const STALL_LIMIT: Duration = Duration::from_secs(60);

/// What a finished migration did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MigrationReport {
    /// The migration's id (its first epoch).
    pub id: u64,
    /// Nodes before and after.
    pub from: Vec<String>,
    /// Nodes after.
    pub to: Vec<String>,
    /// Items copied by the snapshots.
    pub keys_copied: u64,
    /// Changes streamed after the snapshots.
    pub changes_sent: u64,
    /// Value bytes sent.
    pub bytes_sent: u64,
    /// Items a new owner refused.
    pub refused: u64,
    /// Seconds from the start until every snapshot was done.
    pub copy_s: f64,
    /// Seconds of the hand-off (new ring in force until every old owner drained).
    pub handoff_s: f64,
    /// Seconds from start to end.
    pub total_s: f64,
}

/// How long a node may take to accept a connection and to answer one request.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// A node's `cluster status`, parsed. Nothing listening at its address is
/// [`ClusterError::Unreachable`] (with the operating system's reason); a server that answers
/// but is no cluster node (a memcached, a kvlab server started without `--cluster`) is
/// [`ClusterError::NotANode`], which names what it is by its answer to `version`.
pub fn node_status(node: &str) -> Result<Value, ClusterError> {
    let unreachable = |reason: String| ClusterError::Unreachable {
        node: node.to_string(),
        reason,
    };
    let failed = |reason: String| ClusterError::Node {
        node: node.to_string(),
        reason,
    };
    let addr: SocketAddr = resolve(node).map_err(|e| unreachable(e.to_string()))?;
    let mut c = Client::connect(addr, ASK_TIMEOUT).map_err(|e| unreachable(e.to_string()))?;
    let reply = match c.call(b"cluster status\r\n") {
        Ok(Answer::Values(v)) if v.len() == 1 => {
            return serde_json::from_slice(&v[0].2)
                .map_err(|e| failed(format!("its \"cluster status\" is not JSON: {e}")));
        }
        Ok(Answer::Values(v)) => format!("{} values", v.len()),
        Ok(Answer::Line(line)) => printable(&line),
        Err(e) => return Err(failed(no_answer("cluster status", &e))),
    };
    Err(ClusterError::NotANode {
        node: node.to_string(),
        reply,
        server: what_answers(&mut c),
    })
}

/// What a server that is no cluster node is, from its `version`: kvlab says
/// `VERSION 1.6.21 kvlab-X`, memcached `VERSION 1.6.18`.
fn what_answers(c: &mut Client) -> String {
    match c.version() {
        Ok(v) => {
            if let Some(k) = v.split_whitespace().find_map(|w| w.strip_prefix("kvlab-")) {
                format!("kvlab {k} started without --cluster")
            } else if !v.is_empty() && v.chars().all(|ch| ch.is_ascii_digit() || ch == '.') {
                format!("memcached {v}")
            } else {
                format!("a server whose version is \"{}\"", printable(v.as_bytes()))
            }
        }
        Err(e) => format!("an unknown server: {}", no_answer("version", &e)),
    }
}

/// Why a request got no reply.
fn no_answer(request: &str, e: &ConnError) -> String {
    match e {
        ConnError::Io(io)
            if matches!(
                io.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            format!(
                "no answer to \"{request}\" within {} s (something accepts connections there \
                 but does not answer)",
                ASK_TIMEOUT.as_secs()
            )
        }
        ConnError::Closed => format!("it closed the connection on \"{request}\""),
        e => format!("\"{request}\" failed: {e}"),
    }
}

/// A reply line as text for a message, cut at 80 characters.
fn printable(line: &[u8]) -> String {
    let text = String::from_utf8_lossy(line);
    match text.char_indices().nth(80) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.into_owned(),
    }
}

/// Creates a cluster of `nodes` (each already running `kvlab server --cluster`, or about
/// to). Fails if one exists.
pub fn create(
    store: &dyn TopologyStore,
    vnodes: u32,
    replicas: u32,
    write_policy: CopyWritePolicy,
    nodes: Vec<String>,
) -> Result<Topology, ClusterError> {
    if nodes.is_empty() {
        return Err(ClusterError::Invalid("a cluster needs a node".into()));
    }
    if replicas == 0 || replicas as usize > nodes.len() {
        return Err(ClusterError::Invalid(format!(
            "replicas = {replicas}: must be 1..={} (the nodes)",
            nodes.len()
        )));
    }
    let t = Topology {
        replicas,
        write_policy,
        ..Topology::new(vnodes, nodes)
    };
    if !store.swap(None, &t)? {
        return Err(ClusterError::Invalid(format!(
            "a cluster already exists in {}",
            store.describe()
        )));
    }
    Ok(t)
}

fn load(store: &dyn TopologyStore) -> Result<Topology, ClusterError> {
    store
        .load()?
        .ok_or_else(|| ClusterError::Invalid(format!("no cluster in {}", store.describe())))
}

/// Adds `node` (running `kvlab server --cluster` on the same topology) and moves its keys
/// to it; `progress` is called with the migration's figures while it runs.
pub fn add(
    store: &dyn TopologyStore,
    node: &str,
    progress: &mut dyn FnMut(&MigrationReport),
) -> Result<MigrationReport, ClusterError> {
    let t = load(store)?;
    if t.nodes.iter().any(|n| n == node) {
        return Err(ClusterError::Invalid(format!("{node} is already a node")));
    }
    node_status(node)?; // it must be up and a cluster node
    let t = follows(store, node, t)?;
    let mut to = t.nodes.clone();
    to.push(node.to_string());
    migrate(store, t, to, progress)
}

/// How long `add` waits for a node to show the topology's epoch.
const FOLLOW_LIMIT: Duration = Duration::from_secs(3);

/// Whether `node` follows this topology: it shows the epoch and ring `store` holds (a node
/// reads its topology every 20 ms; a new one may lag by a poll). A node started on another
/// topology — another cluster's, or a typo in its `--cluster` — would be given keys that
/// this cluster's clients then never find; it is refused, naming what it follows.
/// Returns the topology as last read.
fn follows(
    store: &dyn TopologyStore,
    node: &str,
    mut t: Topology,
) -> Result<Topology, ClusterError> {
    let deadline = Instant::now() + FOLLOW_LIMIT;
    loop {
        if t.migration.is_some() {
            // Refused by `migrate`, which says why.
            return Ok(t);
        }
        let s = node_status(node)?;
        let epoch = s["epoch"].as_u64().unwrap_or(0);
        let mut ring: Vec<String> = s["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n.as_str().map(String::from))
            .collect();
        ring.sort_unstable();
        let mut ours = t.nodes.clone();
        ours.sort_unstable();
        if epoch == t.epoch && ring == ours {
            return Ok(t);
        }
        if Instant::now() >= deadline {
            return Err(ClusterError::Invalid(format!(
                "{node} follows another topology: it is at epoch {epoch} with the ring [{}], \
                 this cluster ({}) at epoch {} with [{}] — start it with this cluster's \
                 `--cluster` (a node of another cluster cannot join)",
                ring.join(" "),
                store.describe(),
                t.epoch,
                ours.join(" ")
            )));
        }
        // Waiting for the node's next read of the topology: a bounded poll.
        std::thread::sleep(Duration::from_millis(20));
        t = load(store)?;
    }
}

/// Removes `node`, moving its keys to the others first.
pub fn remove(
    store: &dyn TopologyStore,
    node: &str,
    progress: &mut dyn FnMut(&MigrationReport),
) -> Result<MigrationReport, ClusterError> {
    let t = load(store)?;
    if !t.nodes.iter().any(|n| n == node) {
        return Err(ClusterError::Invalid(format!(
            "{node} is not a member of the ring (members: {})",
            t.nodes.join(" ")
        )));
    }
    if t.nodes.len() == 1 {
        return Err(ClusterError::Invalid("cannot remove the last node".into()));
    }
    let to = t.nodes.iter().filter(|n| *n != node).cloned().collect();
    migrate(store, t, to, progress)
}

fn migrate(
    store: &dyn TopologyStore,
    t: Topology,
    to: Vec<String>,
    progress: &mut dyn FnMut(&MigrationReport),
) -> Result<MigrationReport, ClusterError> {
    if let Some(m) = &t.migration {
        return Err(ClusterError::Invalid(format!(
            "migration {} is under way ({:?}): resume or abort it first",
            m.id, m.phase
        )));
    }
    let mut next = t.next();
    next.migration = Some(Migration {
        id: next.epoch,
        to,
        phase: Phase::Copy,
        started_ms: now_ms(),
    });
    if !store.swap(Some(t.epoch), &next)? {
        return Err(ClusterError::Invalid(
            "the topology changed meanwhile; try again".into(),
        ));
    }
    drive(store, next, progress)
}

/// Takes up the migration the topology holds and drives it to its end.
pub fn resume(
    store: &dyn TopologyStore,
    progress: &mut dyn FnMut(&MigrationReport),
) -> Result<MigrationReport, ClusterError> {
    let t = load(store)?;
    if t.migration.is_none() {
        return Err(ClusterError::Invalid("no migration is under way".into()));
    }
    drive(store, t, progress)
}

/// Rolls back a migration that is still copying: the old ring stays, the new owners drop
/// what they received. A migration in its hand-off can only be resumed.
pub fn abort(store: &dyn TopologyStore) -> Result<Topology, ClusterError> {
    let t = load(store)?;
    match &t.migration {
        None => Err(ClusterError::Invalid("no migration is under way".into())),
        Some(m) if m.phase == Phase::Handoff => Err(ClusterError::Invalid(format!(
            "migration {} is in its hand-off: the new ring already serves; resume it",
            m.id
        ))),
        Some(_) => {
            let mut next = t.next();
            next.migration = None;
            if !store.swap(Some(t.epoch), &next)? {
                return Err(ClusterError::Invalid(
                    "the topology changed meanwhile; try again".into(),
                ));
            }
            Ok(next)
        }
    }
}

fn figures(
    t: &Topology,
    id: u64,
    report: &mut MigrationReport,
) -> Result<(bool, bool), ClusterError> {
    let (mut snap, mut handed) = (true, true);
    report.keys_copied = 0;
    report.changes_sent = 0;
    report.bytes_sent = 0;
    report.refused = 0;
    for n in &t.nodes {
        let s = node_status(n)?;
        let p = &s["progress"];
        if let Some(e) = p["error"].as_str() {
            return Err(ClusterError::Node {
                node: n.clone(),
                reason: format!("migration failed: {e}"),
            });
        }
        let this = p["migration"].as_u64() == Some(id);
        snap &= this && p["snapshot_done"].as_bool() == Some(true);
        handed &= p["handed_off"].as_u64() == Some(id);
        if this {
            report.keys_copied += p["keys_copied"].as_u64().unwrap_or(0);
            report.changes_sent += p["changes_sent"].as_u64().unwrap_or(0);
            report.bytes_sent += p["bytes_sent"].as_u64().unwrap_or(0);
            report.refused += p["refused"].as_u64().unwrap_or(0);
        }
    }
    Ok((snap, handed))
}

/// How long the coordinator keeps asking a node that does not answer before it gives up
/// on the migration (rolls it back while copying; leaves it for `resume` in the hand-off).
pub const STATUS_PATIENCE: Duration = Duration::from_secs(10);

/// Whether a node's answer says its side of the migration failed (as opposed to the node
/// not answering).
fn is_failed_migration(e: &ClusterError) -> bool {
    matches!(e, ClusterError::Node { reason, .. } if reason.starts_with("migration failed"))
}

/// Starts or continues a run of failures; true while it is shorter than
/// [`STATUS_PATIENCE`].
fn patient(failing_since: &mut Option<Instant>) -> bool {
    failing_since.get_or_insert_with(Instant::now).elapsed() < STATUS_PATIENCE
}

/// Fails when the topology is no longer at `t`'s epoch: someone else rolled the migration
/// back (a node restarted without its data does, while it copies) or drove it on (another
/// coordinator's `resume`); waiting on would only wait out the stall limit. A topology
/// that cannot be read now is let be (the nodes' answers decide).
fn moved_on(store: &dyn TopologyStore, t: &Topology) -> Result<(), ClusterError> {
    match store.load() {
        Ok(Some(now)) if now.epoch != t.epoch => Err(ClusterError::Migration(format!(
            "the topology moved on meanwhile (epoch {} → {}, migration {}): {}",
            t.epoch,
            now.epoch,
            now.migration
                .as_ref()
                .map_or("none".into(), |m| format!("{} {:?}", m.id, m.phase)),
            "see `kvlab cluster status`"
        ))),
        Ok(None) => Err(ClusterError::Migration("the cluster was removed".into())),
        _ => Ok(()),
    }
}

fn drive(
    store: &dyn TopologyStore,
    mut t: Topology,
    progress: &mut dyn FnMut(&MigrationReport),
) -> Result<MigrationReport, ClusterError> {
    let Some(m) = t.migration.clone() else {
        return Err(ClusterError::Invalid("no migration is under way".into()));
    };
    let start = Instant::now();
    let mut report = MigrationReport {
        id: m.id,
        from: t.nodes.clone(),
        to: m.to.clone(),
        ..MigrationReport::default()
    };
    let poll = Duration::from_millis(10);
    let mut failing_since: Option<Instant> = None;
    let mut last_change = Instant::now();
    let mut last_sent = u64::MAX;
    if m.phase == Phase::Copy {
        loop {
            // A node that fails while the old ring still serves: roll back (nothing has
            // moved for the clients yet; the new owners drop what they got).
            let (snap, _) = match figures(&t, m.id, &mut report) {
                Ok(f) => {
                    failing_since = None;
                    f
                }
                // A node that does not answer for a moment (paused, busy) is asked again.
                Err(e) if !is_failed_migration(&e) && patient(&mut failing_since) => {
                    std::thread::sleep(poll);
                    continue;
                }
                Err(e) => {
                    return Err(match abort(store) {
                        Ok(back) => ClusterError::Migration(format!(
                            "{e}; rolled back to the old ring (epoch {})",
                            back.epoch
                        )),
                        Err(a) => {
                            ClusterError::Migration(format!("{e}; and the roll-back failed: {a}"))
                        }
                    });
                }
            };
            report.total_s = start.elapsed().as_secs_f64();
            progress(&report);
            if snap {
                break;
            }
            moved_on(store, &t)?;
            let sent = report.keys_copied;
            if sent != last_sent {
                last_sent = sent;
                last_change = Instant::now();
            } else if last_change.elapsed() > STALL_LIMIT {
                return Err(ClusterError::Migration(format!(
                    "no progress for {STALL_LIMIT:?}; `kvlab cluster resume` or `abort`"
                )));
            }
            std::thread::sleep(poll);
        }
        report.copy_s = start.elapsed().as_secs_f64();
        let mut next = t.next();
        if let Some(nm) = next.migration.as_mut() {
            nm.phase = Phase::Handoff;
        }
        if !store.swap(Some(t.epoch), &next)? {
            return Err(ClusterError::Migration(
                "the topology changed under the migration".into(),
            ));
        }
        t = next;
    }
    let handoff = Instant::now();
    failing_since = None;
    loop {
        let handed = match figures(&t, m.id, &mut report) {
            Ok((_, handed)) => {
                failing_since = None;
                handed
            }
            // A hand-off cannot go back: a node whose copier failed just before it copies
            // again once it sees the hand-off (its error then goes), so it is waited for
            // too.
            Err(_) if patient(&mut failing_since) => {
                std::thread::sleep(poll);
                continue;
            }
            Err(e) => return Err(e),
        };
        report.total_s = start.elapsed().as_secs_f64();
        progress(&report);
        if handed {
            break;
        }
        moved_on(store, &t)?;
        if handoff.elapsed() > STALL_LIMIT {
            return Err(ClusterError::Migration(format!(
                "hand-off not done after {STALL_LIMIT:?}; `kvlab cluster resume`"
            )));
        }
        std::thread::sleep(poll);
    }
    report.handoff_s = handoff.elapsed().as_secs_f64();
    let leavers: Vec<String> = t
        .nodes
        .iter()
        .filter(|n| !m.to.contains(n))
        .cloned()
        .collect();
    let mut done = t.next();
    done.nodes = m.to.clone();
    done.migration = None;
    done.leaving
        .retain(|n| !m.to.contains(n) && !leavers.contains(n));
    done.leaving.extend(leavers.iter().cloned());
    let keep = done.leaving.len().saturating_sub(LEAVING_KEPT);
    done.leaving.drain(..keep);
    if !store.swap(Some(t.epoch), &done)? {
        return Err(ClusterError::Migration(
            "the topology changed under the migration".into(),
        ));
    }
    if done.replicas > 1 {
        for node in &leavers {
            await_hand_over(node, done.epoch)?;
        }
    }
    report.total_s = start.elapsed().as_secs_f64();
    progress(&report);
    Ok(report)
}

/// How many nodes taken out of the ring the topology remembers (see
/// [`Topology::leaving`]).
const LEAVING_KEPT: usize = 8;

/// With copies: waits until `node`, just taken out of the ring at `epoch`, has handed what
/// it still holds to the keys' nodes (its clean-up's hand-over, retried while a node
/// catches up and refuses it), so that stopping it loses nothing. A node that does not
/// answer for [`STATUS_PATIENCE`] is gone (what it held went with it): nothing to wait for.
fn await_hand_over(node: &str, epoch: u64) -> Result<(), ClusterError> {
    let start = Instant::now();
    let mut failing_since: Option<Instant> = None;
    loop {
        match node_status(node) {
            Ok(s) => {
                failing_since = None;
                let p = &s["progress"];
                if p["handover_epoch"].as_u64().is_some_and(|e| e >= epoch) {
                    return Ok(());
                }
                if start.elapsed() > STALL_LIMIT {
                    return Err(ClusterError::Migration(format!(
                        "the migration is done, but {node} still holds {} items its keys' \
                         nodes have not taken (one may be catching up): keep it running \
                         until `kvlab cluster status` shows them handed over",
                        p["handover_pending"].as_u64().unwrap_or(0)
                    )));
                }
            }
            Err(_) if patient(&mut failing_since) => {}
            Err(_) => return Ok(()),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
