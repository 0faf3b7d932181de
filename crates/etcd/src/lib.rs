//! The topology in etcd (v3 API, through the tonic clients of `kvlab-etcd-proto`): for
//! clusters of several machines.
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
//! (resumed on another member, same lease, so its liveness key never lapses) move on. The
//! members are tried round after round for as long as trying each once may take at worst
//! ([`Tries`]): a dead member refuses at once, and a call made while the survivors elect a
//! new leader waits for it rather than failing.
//! One member at a time rather than a balanced channel over all of them: a balanced
//! channel hands each call to any member, dead ones included, and reports the dead one's
//! connect error instead of trying another.
//!
//! tonic is async; each store runs its calls on a small runtime of its own, so the rest of
//! kvlab (threads, blocking calls) stays as it is. The cluster crate and the server know
//! only [`TopologyStore`]: the `kvlab` binary hands them [`open_store`], so neither builds
//! gRPC, tokio or etcd's API.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use std::future::Future;
use std::time::{Duration, Instant};

use kvlab_etcd_proto::etcdserverpb::{
    compare::{CompareResult, CompareTarget, TargetUnion},
    kv_client::KvClient,
    lease_client::LeaseClient,
    request_op::Request as Op,
    watch_client::WatchClient,
    watch_request::RequestUnion,
    Compare, DeleteRangeRequest, LeaseGrantRequest, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    PutRequest, RangeRequest, RangeResponse, RequestOp, TxnRequest, WatchCreateRequest,
    WatchRequest, WatchResponse,
};
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Response, Status, Streaming};

use kvlab_cluster::{ClusterError, Topology, TopologyStore};

/// Opens the store a `--cluster` argument names: `etcd://HOST:PORT[,HOST:PORT…]/NAME`,
/// `file:PATH`, or a plain path (a [`kvlab_cluster::OpenStore`]).
pub fn open_store(spec: &str) -> Result<Box<dyn TopologyStore>, ClusterError> {
    if spec.starts_with("etcd://") {
        return Ok(Box::new(EtcdStore::open(spec)?));
    }
    kvlab_cluster::open_store(spec)
}

/// Seconds a node's liveness key outlives its last keep-alive.
pub const LEASE_TTL_S: i64 = 3;

/// How long one call to one member may take before the next member is tried. Short enough
/// that a keep-alive moved to a second member still lands within the lease's TTL.
const CALL_TIMEOUT: Duration = Duration::from_millis(1500);

/// The pause before the members are tried again when each has failed a call at once (a dead
/// member refuses the connection, and while the others elect a leader they answer "no
/// leader"): a leader election takes about a second.
const ROUND_PAUSE: Duration = Duration::from_millis(200);

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
    /// The member this store talks to (an index into `endpoints`) and its clients, once
    /// made.
    member: Mutex<(usize, Option<Member>)>,
    prefix: String,
    watch: Mutex<Option<Streaming<WatchResponse>>>,
    /// This process's lease (a node's), once granted.
    lease: Mutex<Option<Lease>>,
}

/// The channel to one member, with etcd's `hasleader` on every call.
type Chan =
    InterceptedService<Channel, fn(tonic::Request<()>) -> Result<tonic::Request<()>, Status>>;

/// One member's clients (cheap to clone: they share the member's channel).
#[derive(Clone)]
struct Member {
    kv: KvClient<Chan>,
    watch: WatchClient<Chan>,
    lease: LeaseClient<Chan>,
}

/// A granted lease, the sender of its keep-alives and the stream of their answers.
struct Lease {
    id: i64,
    keeper: mpsc::Sender<LeaseKeepAliveRequest>,
    answers: Streaming<LeaseKeepAliveResponse>,
}

fn err(e: impl std::fmt::Display) -> ClusterError {
    ClusterError::Store(format!("etcd: {e}"))
}

/// What went wrong in one call to one member.
enum Failure {
    /// The member did not answer (dead, unreachable, no leader, too slow): try another.
    Member(String),
    /// The member answered with an error: another would answer the same.
    Answer(Status),
}

/// gRPC status codes (fixed by the gRPC specification) that say the member could not
/// serve a call: CANCELLED, UNKNOWN, DEADLINE_EXCEEDED, ABORTED, INTERNAL, UNAVAILABLE.
/// (tonic reports a connection that failed or broke as UNAVAILABLE or UNKNOWN.)
const MEMBER_CODES: [i32; 6] = [1, 2, 4, 10, 13, 14];

impl From<Status> for Failure {
    fn from(s: Status) -> Failure {
        if MEMBER_CODES.contains(&i32::from(s.code())) {
            Failure::Member(s.to_string())
        } else {
            Failure::Answer(s)
        }
    }
}

/// The tries of one call: each member in turn from the current one, round after round (a
/// [`ROUND_PAUSE`] between rounds) while the call's budget lasts. The budget is what trying
/// each member once may take at worst ([`CALL_TIMEOUT`] each); a member that fails at once
/// does not spend it, so a call made while the survivors of a member's death elect a new
/// leader waits for that leader instead of failing.
struct Tries {
    members: usize,
    deadline: Instant,
    tried: usize,
    /// Why each member failed, the latest try last.
    failures: Vec<String>,
}

impl Tries {
    fn new(members: usize) -> Tries {
        Tries {
            members,
            // (`members` is a spec's handful of addresses.)
            deadline: Instant::now() + CALL_TIMEOUT * members as u32,
            tried: 0,
            failures: Vec::new(),
        }
    }

    /// How long the next try may take; `None` when the budget is spent.
    fn next(&mut self) -> Option<Duration> {
        if self.tried > 0 && self.tried.is_multiple_of(self.members) {
            std::thread::sleep(ROUND_PAUSE);
        }
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        self.tried += 1;
        Some(left.min(CALL_TIMEOUT))
    }

    fn failed(&mut self, member: &str, why: String) {
        self.failures.push(format!("{member}: {why}"));
    }

    /// The call's error: why each member failed its last try.
    fn error(self) -> ClusterError {
        let last = self.failures.len().saturating_sub(self.members);
        err(format!(
            "no member answered ({})",
            self.failures[last..].join("; ")
        ))
    }
}

/// Adds etcd's `hasleader` metadata to a call: a member cut off from the quorum refuses at
/// once (and ends its watches) instead of serving nothing until the call times out.
fn require_leader(mut call: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
    call.metadata_mut()
        .insert("hasleader", MetadataValue::from_static("true"));
    Ok(call)
}

/// The end of the range of the keys that start with `prefix` (etcd's "prefix plus one"):
/// its last byte below 0xff plus one, what follows it dropped; `\0` (every key from
/// `prefix` on) if there is none.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// A transaction's condition: `key`'s `target` (which `value` names again) is `value`.
fn equals(key: &str, target: CompareTarget, value: TargetUnion) -> Compare {
    Compare {
        result: CompareResult::Equal.into(),
        target: target.into(),
        key: key.as_bytes().to_vec(),
        target_union: Some(value),
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
        let store = EtcdStore {
            rt,
            endpoints,
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

    /// The current member's clients (made on first use; the connection opens with the
    /// first call).
    fn client(&self) -> Result<(usize, Member), ClusterError> {
        let mut m = self.member.lock();
        if let Some(c) = &m.1 {
            return Ok((m.0, c.clone()));
        }
        let endpoint = &self.endpoints[m.0];
        let channel = Endpoint::from_shared(endpoint.clone())
            .map_err(|e| err(format!("{endpoint}: {e}")))?
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(CALL_TIMEOUT)
            .http2_keep_alive_interval(PING.0)
            .keep_alive_timeout(PING.1)
            .keep_alive_while_idle(true);
        // The channel's connection task runs on this store's runtime.
        let channel = {
            let _rt = self.rt.enter();
            channel.connect_lazy()
        };
        let leader: fn(_) -> _ = require_leader;
        let c = Member {
            kv: KvClient::with_interceptor(channel.clone(), leader),
            watch: WatchClient::with_interceptor(channel.clone(), leader),
            lease: LeaseClient::with_interceptor(channel, leader),
        };
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

    /// Runs `f` on the current member, and on the next ones while members fail it (see
    /// [`Tries`]).
    fn call<T, F, Fut>(&self, f: F) -> Result<T, ClusterError>
    where
        F: Fn(Member) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let mut tries = Tries::new(self.endpoints.len());
        while let Some(limit) = tries.next() {
            let (i, c) = self.client()?;
            match self.once(f(c), limit) {
                Ok(v) => return Ok(v),
                Err(Failure::Answer(e)) => return Err(err(e)),
                Err(Failure::Member(why)) => {
                    tries.failed(&self.endpoints[i], why);
                    self.next_member(i);
                }
            }
        }
        Err(tries.error())
    }

    /// One try of one call, bounded by `limit`.
    fn once<T>(
        &self,
        fut: impl Future<Output = Result<T, Status>>,
        limit: Duration,
    ) -> Result<T, Failure> {
        match self
            .rt
            .block_on(async { tokio::time::timeout(limit, fut).await })
        {
            Ok(r) => r.map_err(Failure::from),
            Err(_) => Err(Failure::Member(format!(
                "no answer in {} ms",
                limit.as_millis()
            ))),
        }
    }

    /// The keys in `range` (a key, or a key and the end of a range).
    fn range(&self, range: RangeRequest) -> Result<RangeResponse, ClusterError> {
        self.call(|mut c| {
            let range = range.clone();
            async move { c.kv.range(range).await.map(Response::into_inner) }
        })
    }

    /// The stored topology and the revision it was written at.
    fn read(&self) -> Result<Option<(Topology, i64)>, ClusterError> {
        let resp = self.range(RangeRequest {
            key: self.key("topology").into_bytes(),
            ..Default::default()
        })?;
        match resp.kvs.first() {
            None => Ok(None),
            Some(kv) => {
                let t = serde_json::from_slice(&kv.value).map_err(err)?;
                Ok(Some((t, kv.mod_revision)))
            }
        }
    }

    /// Whether this node's liveness key is there.
    fn alive_key_present(&self, node: &str) -> Result<bool, ClusterError> {
        let resp = self.range(RangeRequest {
            key: self.key(&format!("alive/{node}")).into_bytes(),
            count_only: true,
            ..Default::default()
        })?;
        Ok(resp.count > 0)
    }

    /// One keep-alive of `lease` on its own stream: whether etcd answered that the lease
    /// lives. `false` when the stream's member is gone, or the lease expired.
    fn keep_alive(&self, lease: &mut Lease) -> bool {
        let answer = self.rt.block_on(async {
            tokio::time::timeout(CALL_TIMEOUT, async {
                let again = LeaseKeepAliveRequest { id: lease.id };
                lease.keeper.send(again).await.ok()?;
                lease.answers.message().await.ok().flatten()
            })
            .await
        });
        matches!(answer, Ok(Some(answer)) if answer.ttl > 0)
    }

    /// A keep-alive stream for lease `id` on a member that answers (the lease is the
    /// cluster's, not a member's); `None` if the lease has expired.
    fn keeper(&self, id: i64) -> Result<Option<Lease>, ClusterError> {
        self.call(|mut c| async move {
            // The stream's first keep-alive goes with it; the sender sends the next ones.
            let (keeper, next) = mpsc::channel(1);
            let keep_alives =
                tokio_stream::once(LeaseKeepAliveRequest { id }).chain(ReceiverStream::new(next));
            let mut answers = c.lease.lease_keep_alive(keep_alives).await?.into_inner();
            match answers.message().await? {
                Some(first) if first.ttl > 0 => Ok(Some(Lease {
                    id,
                    keeper,
                    answers,
                })),
                // TTL 0: the lease is gone.
                Some(_) => Ok(None),
                // The member closed the stream without a word: as if it had not answered
                // (UNAVAILABLE is a member's failure), so the next member is tried.
                None => Err(Status::unavailable(
                    "the keep-alive stream ended unanswered",
                )),
            }
        })
    }

    /// Grants a new lease, attaches this node's liveness key to it, and keeps it alive.
    fn new_lease(&self, node: &str) -> Result<Lease, ClusterError> {
        let grant = LeaseGrantRequest {
            ttl: LEASE_TTL_S,
            id: 0,
        };
        let granted = self.call(|mut c| async move {
            c.lease.lease_grant(grant).await.map(Response::into_inner)
        })?;
        let id = granted.id;
        let put = PutRequest {
            key: self.key(&format!("alive/{node}")).into_bytes(),
            value: node.as_bytes().to_vec(),
            lease: id,
        };
        self.call(|mut c| {
            let put = put.clone();
            async move { c.kv.put(put).await }
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
        let mut tries = Tries::new(self.endpoints.len());
        while let Some(limit) = tries.next() {
            let compare = match (&stored, expected) {
                (None, None) => equals(&key, CompareTarget::Version, TargetUnion::Version(0)),
                (Some((t, rev)), Some(e)) if t.epoch == e => {
                    equals(&key, CompareTarget::Mod, TargetUnion::ModRevision(*rev))
                }
                _ => return Ok(false),
            };
            let txn = TxnRequest {
                compare: vec![compare],
                success: vec![RequestOp {
                    request: Some(Op::RequestPut(PutRequest {
                        key: key.clone().into_bytes(),
                        value: json.clone(),
                        lease: 0,
                    })),
                }],
                failure: Vec::new(),
            };
            let (i, mut c) = self.client()?;
            match self.once(async move { c.kv.txn(txn).await }, limit) {
                Ok(resp) => return Ok(resp.into_inner().succeeded),
                Err(Failure::Answer(e)) => return Err(err(e)),
                Err(Failure::Member(why)) => {
                    tries.failed(&self.endpoints[i], why);
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
        Err(tries.error())
    }

    fn describe(&self) -> String {
        format!("etcd {} {}", self.endpoints.join(","), self.prefix)
    }

    fn clear(&self) -> Result<(), ClusterError> {
        let delete = DeleteRangeRequest {
            key: self.prefix.as_bytes().to_vec(),
            range_end: prefix_end(self.prefix.as_bytes()),
        };
        self.call(|mut c| {
            let delete = delete.clone();
            async move { c.kv.delete_range(delete).await }
        })?;
        Ok(())
    }

    fn wait(&self, timeout: Duration) {
        let mut w = self.watch.lock();
        if w.is_none() {
            let create = WatchRequest {
                request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                    key: self.key("topology").into_bytes(),
                    range_end: Vec::new(),
                })),
            };
            let made = self.call(|mut c| {
                // The request stream stays open (pending) as long as the watch does.
                let requests = tokio_stream::once(create.clone()).chain(tokio_stream::pending());
                async move { c.watch.watch(requests).await.map(Response::into_inner) }
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
            // A change (or the watch's creation), or nothing within the timeout.
            Ok(Ok(Some(answer))) if !answer.canceled => {}
            Err(_) => {}
            // The watch broke (its member died or lost the quorum, etcd restarted) or etcd
            // cancelled it: a new one next time, on whichever member answers then.
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
        let key = self.key("alive/").into_bytes();
        let resp = self.range(RangeRequest {
            range_end: prefix_end(&key),
            key,
            ..Default::default()
        })?;
        let mut nodes: Vec<String> = resp
            .kvs
            .iter()
            .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
            .collect();
        nodes.sort();
        Ok(Some(nodes))
    }
}

#[cfg(test)]
mod tests {
    use super::prefix_end;

    #[test]
    fn a_prefix_range_ends_at_the_prefix_plus_one() {
        assert_eq!(prefix_end(b"/kvlab/a/"), b"/kvlab/a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\0");
        assert_eq!(prefix_end(b""), b"\0");
    }
}
