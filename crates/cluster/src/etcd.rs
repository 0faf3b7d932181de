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
//! `etcd-client` is async; each store runs its calls on a small runtime of its own, so the
//! rest of kvlab (threads, blocking calls) stays as it is.

use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, WatchStream};
use parking_lot::Mutex;

use crate::topology::{Topology, TopologyStore};
use crate::ClusterError;

/// Seconds a node's liveness key outlives its last keep-alive.
pub const LEASE_TTL_S: i64 = 3;

/// How long one call may take before the store reports etcd unreachable.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// A cluster's topology in etcd (see the module docs).
pub struct EtcdStore {
    rt: tokio::runtime::Runtime,
    client: Mutex<Client>,
    endpoints: Vec<String>,
    prefix: String,
    watch: Mutex<Option<WatchStream>>,
    /// This process's lease (a node's), once granted.
    lease: Mutex<Option<Lease>>,
}

/// A granted lease, its keeper and the stream of its keep-alive answers (kept open).
struct Lease {
    keeper: etcd_client::LeaseKeeper,
    _answers: etcd_client::LeaseKeepAliveStream,
}

fn err(e: impl std::fmt::Display) -> ClusterError {
    ClusterError::Store(format!("etcd: {e}"))
}

impl EtcdStore {
    /// Connects to `etcd://HOST:PORT[,HOST:PORT…]/NAME`.
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
        let options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(CALL_TIMEOUT)
            .with_timeout(CALL_TIMEOUT);
        let client = rt
            .block_on(Client::connect(&endpoints, Some(options)))
            .map_err(err)?;
        Ok(EtcdStore {
            rt,
            client: Mutex::new(client),
            endpoints,
            prefix: format!("/kvlab/{name}/"),
            watch: Mutex::new(None),
            lease: Mutex::new(None),
        })
    }

    fn key(&self, what: &str) -> String {
        format!("{}{what}", self.prefix)
    }

    fn client(&self) -> Client {
        self.client.lock().clone()
    }

    /// The stored topology and the revision it was written at.
    fn read(&self) -> Result<Option<(Topology, i64)>, ClusterError> {
        let mut c = self.client();
        let key = self.key("topology");
        let resp = self.rt.block_on(c.get(key, None)).map_err(err)?;
        match resp.kvs().first() {
            None => Ok(None),
            Some(kv) => {
                let t = serde_json::from_slice(kv.value()).map_err(err)?;
                Ok(Some((t, kv.mod_revision())))
            }
        }
    }
}

impl TopologyStore for EtcdStore {
    fn load(&self) -> Result<Option<Topology>, ClusterError> {
        Ok(self.read()?.map(|(t, _)| t))
    }

    fn swap(&self, expected: Option<u64>, new: &Topology) -> Result<bool, ClusterError> {
        let key = self.key("topology");
        let json = serde_json::to_vec(new).map_err(err)?;
        let compare = match (self.read()?, expected) {
            (None, None) => Compare::version(key.clone(), CompareOp::Equal, 0),
            (Some((t, rev)), Some(e)) if t.epoch == e => {
                Compare::mod_revision(key.clone(), CompareOp::Equal, rev)
            }
            _ => return Ok(false),
        };
        let txn = Txn::new()
            .when([compare])
            .and_then([TxnOp::put(key, json, None)]);
        let mut c = self.client();
        let resp = self.rt.block_on(c.txn(txn)).map_err(err)?;
        Ok(resp.succeeded())
    }

    fn describe(&self) -> String {
        format!("etcd {} {}", self.endpoints.join(","), self.prefix)
    }

    fn clear(&self) -> Result<(), ClusterError> {
        let mut c = self.client();
        let prefix = self.prefix.clone();
        self.rt
            .block_on(c.delete(
                prefix,
                Some(etcd_client::DeleteOptions::new().with_prefix()),
            ))
            .map_err(err)?;
        Ok(())
    }

    fn wait(&self, timeout: Duration) {
        let mut w = self.watch.lock();
        if w.is_none() {
            let mut c = self.client();
            match self.rt.block_on(c.watch(self.key("topology"), None)) {
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
            // The watch broke (etcd restarted, connection lost): make a new one next time.
            Ok(_) => *w = None,
        }
    }

    fn heartbeat(&self, node: &str) -> Result<(), ClusterError> {
        let mut lease = self.lease.lock();
        if let Some(l) = lease.as_mut() {
            if self.rt.block_on(l.keeper.keep_alive()).is_ok() {
                // The key may have gone with a lease that expired while etcd was away.
                let mut c = self.client();
                let key = self.key(&format!("alive/{node}"));
                let present = self
                    .rt
                    .block_on(c.get(key, Some(GetOptions::new().with_count_only())))
                    .map(|r| r.count() > 0)
                    .map_err(err)?;
                if present {
                    return Ok(());
                }
            }
            *lease = None;
        }
        let mut c = self.client();
        let granted = self
            .rt
            .block_on(c.lease_grant(LEASE_TTL_S, None))
            .map_err(err)?;
        let id = granted.id();
        let key = self.key(&format!("alive/{node}"));
        self.rt
            .block_on(c.put(key, node, Some(PutOptions::new().with_lease(id))))
            .map_err(err)?;
        let (keeper, answers) = self.rt.block_on(c.lease_keep_alive(id)).map_err(err)?;
        *lease = Some(Lease {
            keeper,
            _answers: answers,
        });
        Ok(())
    }

    fn lease_ttl(&self) -> Option<Duration> {
        Some(Duration::from_secs(LEASE_TTL_S as u64))
    }

    fn alive(&self) -> Result<Option<Vec<String>>, ClusterError> {
        let mut c = self.client();
        let resp = self
            .rt
            .block_on(c.get(self.key("alive/"), Some(GetOptions::new().with_prefix())))
            .map_err(err)?;
        let mut nodes: Vec<String> = resp
            .kvs()
            .iter()
            .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
            .collect();
        nodes.sort();
        Ok(Some(nodes))
    }
}
