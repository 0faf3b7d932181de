//! The topology in etcd (v3 API, the `etcd-client` crate): for clusters of several
//! machines.
//!
//! Keys under `/kvlab/<name>/`:
//!
//! - `topology`: the [`Topology`] as JSON. A change is a transaction that compares the
//!   key's modification revision with the one the stored epoch was read at, so two
//!   coordinators can never both apply a change to the same epoch.
//! - `alive/<node>`: one key per running node, attached to the node's lease (TTL
//!   [`LEASE_TTL_S`]); the node keeps the lease alive; a node that dies or is cut off loses
//!   its key when the lease expires.
//!
//! Nodes wait for a change with a watch on `topology` instead of polling.
//!
//! An etcd of several members is named by all of them (`etcd://A,B,C/NAME`) and the store
//! talks to one member at a time, whichever answers: a call that finds its member dead,
//! unreachable or cut off from the quorum (no leader) is made again on the next member, so
//! a node starts while one member of three is down, and a running node survives a member's
//! death — its calls, its watch (set up again on the next wait) and its lease's keep-alive
//! (resumed on another member, same lease, so its liveness key never lapses) move on.
//! One member at a time rather than a balanced channel over all of them: a balanced
//! channel hands each call to any member, dead ones included, and reports the dead one's
//! connect error instead of trying another.
//!
//! `etcd-client` is async; each store runs its calls on a small runtime of its own, so the
//! rest of kvlab (threads, blocking calls) stays as it is.

use std::future::Future;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp, WatchStream,
};
use parking_lot::Mutex;

use crate::topology::{Topology, TopologyStore};
use crate::ClusterError;

/// Seconds a node's liveness key outlives its last keep-alive.
pub const LEASE_TTL_S: i64 = 3;

/// How long one call to one member may take before the next member is tried. Short enough
/// that a keep-alive moved to a second member still lands within the lease's TTL.
const CALL_TIMEOUT: Duration = Duration::from_millis(1500);

/// How long a connection to a member may take to open (a partitioned member never
/// answers; a dead one on a reachable host refuses at once).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// HTTP/2 pings on an open connection, and how long one may go unanswered: a member that
/// vanished without closing its connections (a partition) is noticed within this.
const PING: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(1));

/// A cluster's topology in etcd (see the module docs).
pub struct EtcdStore {
    rt: tokio::runtime::Runtime,
    endpoints: Vec<String>,
    options: ConnectOptions,
    /// The member this store talks to (an index into `endpoints`) and its client, once
    /// connected.
    member: Mutex<(usize, Option<Client>)>,
    prefix: String,
    watch: Mutex<Option<WatchStream>>,
    /// This process's lease (a node's), once granted.
    lease: Mutex<Option<Lease>>,
}

/// A granted lease, its keeper and the stream of its keep-alive answers.
struct Lease {
    id: i64,
    keeper: etcd_client::LeaseKeeper,
    answers: etcd_client::LeaseKeepAliveStream,
}

fn err(e: impl std::fmt::Display) -> ClusterError {
    ClusterError::Store(format!("etcd: {e}"))
}

/// What went wrong in one call to one member.
enum Failure {
    /// The member did not answer (dead, unreachable, no leader, too slow): try another.
    Member(String),
    /// The member answered with an error: another would answer the same.
    Answer(etcd_client::Error),
}

/// gRPC status codes (fixed by the gRPC specification) that say the member could not
/// serve a call: CANCELLED, UNKNOWN, DEADLINE_EXCEEDED, ABORTED, INTERNAL, UNAVAILABLE.
const MEMBER_CODES: [i32; 6] = [1, 2, 4, 10, 13, 14];

/// Whether `e` says the member could not serve the call (rather than refusing it).
fn member_failed(e: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    match e {
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) => true,
        E::GRpcStatus(s) => MEMBER_CODES.contains(&i32::from(s.code())),
        _ => false,
    }
}

impl EtcdStore {
    /// Connects to `etcd://HOST:PORT[,HOST:PORT…]/NAME`. Connections open lazily: this
    /// succeeds while members are down, and the first call finds one that answers.
    pub fn open(spec: &str) -> Result<EtcdStore, ClusterError> {
        let rest = spec
            .strip_prefix("etcd://")
            .ok_or_else(|| err(format!("{spec}: expected etcd://HOST:PORT[,…]/NAME")))?;
        let (hosts, name) = rest.split_once('/').unwrap_or((rest, "default"));
        let name = if name.is_empty() { "default" } else { name };
        let endpoints: Vec<String> = hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| format!("http://{h}"))
            .collect();
        if endpoints.is_empty() {
            return Err(err(format!("{spec}: no endpoint")));
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("kvlab-etcd")
            .enable_all()
            .build()
            .map_err(err)?;
        let options = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_timeout(CALL_TIMEOUT)
            .with_keep_alive(PING.0, PING.1)
            .with_keep_alive_while_idle(true)
            // A member cut off from the quorum refuses at once (and ends its watches)
            // instead of serving nothing until the call times out.
            .with_require_leader(true);
        let store = EtcdStore {
            rt,
            endpoints,
            options,
            member: Mutex::new((0, None)),
            prefix: format!("/kvlab/{name}/"),
            watch: Mutex::new(None),
            lease: Mutex::new(None),
        };
        // A malformed address shows now rather than at the first call.
        store.client().map(|_| store)
    }

    fn key(&self, what: &str) -> String {
        format!("{}{what}", self.prefix)
    }

    /// The current member's client (connected, lazily, on first use).
    fn client(&self) -> Result<(usize, Client), ClusterError> {
        let mut m = self.member.lock();
        if let Some(c) = &m.1 {
            return Ok((m.0, c.clone()));
        }
        let endpoint = &self.endpoints[m.0];
        let c = self
            .rt
            .block_on(Client::connect([endpoint], Some(self.options.clone())))
            .map_err(|e| err(format!("{endpoint}: {e}")))?;
        m.1 = Some(c.clone());
        Ok((m.0, c))
    }

    /// Moves on from member `i` (if it is still the current one) to the next.
    fn next_member(&self, i: usize) {
        let mut m = self.member.lock();
        if m.0 == i {
            *m = ((i + 1) % self.endpoints.len(), None);
        }
    }

    /// Runs `f` on the current member, and on the next ones while members fail it (each
    /// member once, each try at most [`CALL_TIMEOUT`]).
    fn call<T, F, Fut>(&self, f: F) -> Result<T, ClusterError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut failures = Vec::new();
        for _ in 0..self.endpoints.len() {
            let (i, c) = self.client()?;
            match self.once(f(c)) {
                Ok(v) => return Ok(v),
                Err(Failure::Answer(e)) => return Err(err(e)),
                Err(Failure::Member(why)) => {
                    failures.push(format!("{}: {why}", self.endpoints[i]));
                    self.next_member(i);
                }
            }
        }
        Err(err(format!("no member answered ({})", failures.join("; "))))
    }

    /// One try of one call, bounded by [`CALL_TIMEOUT`].
    fn once<T>(
        &self,
        fut: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, Failure> {
        match self
            .rt
            .block_on(async { tokio::time::timeout(CALL_TIMEOUT, fut).await })
        {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) if member_failed(&e) => Err(Failure::Member(e.to_string())),
            Ok(Err(e)) => Err(Failure::Answer(e)),
            Err(_) => Err(Failure::Member(format!(
                "no answer in {} ms",
                CALL_TIMEOUT.as_millis()
            ))),
        }
    }

    /// The stored topology and the revision it was written at.
    fn read(&self) -> Result<Option<(Topology, i64)>, ClusterError> {
        let key = self.key("topology");
        let resp = self.call(|mut c| {
            let key = key.clone();
            async move { c.get(key, None).await }
        })?;
        match resp.kvs().first() {
            None => Ok(None),
            Some(kv) => {
                let t = serde_json::from_slice(kv.value()).map_err(err)?;
                Ok(Some((t, kv.mod_revision())))
            }
        }
    }

    /// Whether this node's liveness key is there.
    fn alive_key_present(&self, node: &str) -> Result<bool, ClusterError> {
        let key = self.key(&format!("alive/{node}"));
        let resp = self.call(|mut c| {
            let key = key.clone();
            async move { c.get(key, Some(GetOptions::new().with_count_only())).await }
        })?;
        Ok(resp.count() > 0)
    }

    /// One keep-alive of `lease` on its own stream: whether etcd answered that the lease
    /// lives. `false` when the stream's member is gone, or the lease expired.
    fn keep_alive(&self, lease: &mut Lease) -> bool {
        let sent = self.rt.block_on(async {
            tokio::time::timeout(CALL_TIMEOUT, async {
                lease.keeper.keep_alive().await?;
                lease.answers.message().await
            })
            .await
        });
        matches!(sent, Ok(Ok(Some(answer))) if answer.ttl() > 0)
    }

    /// A keep-alive stream for lease `id` on a member that answers (the lease is the
    /// cluster's, not a member's); `None` if the lease has expired.
    fn keeper(&self, id: i64) -> Result<Option<Lease>, ClusterError> {
        let r = self.call(|mut c| async move {
            match c.lease_keep_alive(id).await {
                Ok((keeper, answers)) => Ok(Some(Lease {
                    id,
                    keeper,
                    answers,
                })),
                // Said by the stream's first answer (TTL 0): the lease is gone.
                Err(etcd_client::Error::LeaseKeepAliveError(_)) => Ok(None),
                Err(e) => Err(e),
            }
        })?;
        Ok(r)
    }

    /// Grants a new lease, attaches this node's liveness key to it, and keeps it alive.
    fn new_lease(&self, node: &str) -> Result<Lease, ClusterError> {
        let granted = self.call(|mut c| async move { c.lease_grant(LEASE_TTL_S, None).await })?;
        let id = granted.id();
        let key = self.key(&format!("alive/{node}"));
        self.call(|mut c| {
            let (key, node) = (key.clone(), node.to_string());
            async move {
                c.put(key, node, Some(PutOptions::new().with_lease(id)))
                    .await
            }
        })?;
        self.keeper(id)?
            .ok_or_else(|| err(format!("lease {id} expired as it was granted")))
    }
}

impl TopologyStore for EtcdStore {
    fn load(&self) -> Result<Option<Topology>, ClusterError> {
        Ok(self.read()?.map(|(t, _)| t))
    }

    fn swap(&self, expected: Option<u64>, new: &Topology) -> Result<bool, ClusterError> {
        let key = self.key("topology");
        let json = serde_json::to_vec(new).map_err(err)?;
        let mut stored = self.read()?;
        let mut failures = Vec::new();
        for _ in 0..self.endpoints.len() {
            let compare = match (&stored, expected) {
                (None, None) => Compare::version(key.clone(), CompareOp::Equal, 0),
                (Some((t, rev)), Some(e)) if t.epoch == e => {
                    Compare::mod_revision(key.clone(), CompareOp::Equal, *rev)
                }
                _ => return Ok(false),
            };
            let txn =
                Txn::new()
                    .when([compare])
                    .and_then([TxnOp::put(key.clone(), json.clone(), None)]);
            let (i, mut c) = self.client()?;
            match self.once(async move { c.txn(txn).await }) {
                Ok(resp) => return Ok(resp.succeeded()),
                Err(Failure::Answer(e)) => return Err(err(e)),
                Err(Failure::Member(why)) => {
                    failures.push(format!("{}: {why}", self.endpoints[i]));
                    self.next_member(i);
                }
            }
            // The member failed after the transaction may have been applied: what is
            // stored now says whether it was (this very topology), or whether the epoch is
            // still the expected one (try again), or another change came first.
            stored = self.read()?;
            match &stored {
                Some((t, _)) if t == new => return Ok(true),
                _ => {}
            }
        }
        Err(err(format!("no member answered ({})", failures.join("; "))))
    }

    fn describe(&self) -> String {
        format!("etcd {} {}", self.endpoints.join(","), self.prefix)
    }

    fn clear(&self) -> Result<(), ClusterError> {
        let prefix = self.prefix.clone();
        self.call(|mut c| {
            let prefix = prefix.clone();
            async move {
                c.delete(
                    prefix,
                    Some(etcd_client::DeleteOptions::new().with_prefix()),
                )
                .await
            }
        })?;
        Ok(())
    }

    fn wait(&self, timeout: Duration) {
        let mut w = self.watch.lock();
        if w.is_none() {
            let key = self.key("topology");
            let made = self.call(|mut c| {
                let key = key.clone();
                async move { c.watch(key, None).await }
            });
            match made {
                Ok(stream) => *w = Some(stream),
                Err(_) => {
                    drop(w);
                    std::thread::sleep(timeout);
                    return;
                }
            }
        }
        let Some(stream) = w.as_mut() else { return };
        let got = self
            .rt
            .block_on(async { tokio::time::timeout(timeout, stream.message()).await });
        match got {
            Ok(Ok(Some(_))) | Err(_) => {} // a change, or nothing within the timeout
            // The watch broke (its member died or lost the quorum, etcd restarted): a new
            // one next time, on whichever member answers then.
            Ok(_) => *w = None,
        }
    }

    fn heartbeat(&self, node: &str) -> Result<(), ClusterError> {
        let mut lease = self.lease.lock();
        if let Some(l) = lease.as_mut() {
            let mut alive = self.keep_alive(l);
            if !alive {
                // The keep-alive stream's member is gone: the same lease, kept alive
                // through another member, if it has not expired meanwhile.
                // (A new stream's first answer is a keep-alive: the lease lives.)
                if let Some(again) = self.keeper(l.id)? {
                    *l = again;
                    alive = true;
                }
            }
            // The key may have gone with a lease that expired while etcd was away.
            if alive && self.alive_key_present(node)? {
                return Ok(());
            }
            *lease = None;
        }
        *lease = Some(self.new_lease(node)?);
        Ok(())
    }

    fn lease_ttl(&self) -> Option<Duration> {
        Some(Duration::from_secs(LEASE_TTL_S as u64))
    }

    fn alive(&self) -> Result<Option<Vec<String>>, ClusterError> {
        let key = self.key("alive/");
        let resp = self.call(|mut c| {
            let key = key.clone();
            async move { c.get(key, Some(GetOptions::new().with_prefix())).await }
        })?;
        let mut nodes: Vec<String> = resp
            .kvs()
            .iter()
            .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
            .collect();
        nodes.sort();
        Ok(Some(nodes))
    }
}
