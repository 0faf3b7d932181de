//! Cluster-aware routing: the ring a kvlab cluster publishes, how a key maps to its node,
//! and how to read a node's redirect.
//!
//! A cluster's ring places `vnodes` points per node on a 64-bit circle (xxh3 of
//! `"<node>#<i>"`); a key (xxh3 of its bytes) belongs to the node of the first point at or
//! after its hash, wrapping around. Nodes are named by their address (`HOST:PORT`). Every
//! change of the ring has a new *epoch*.
//!
//! A node answers `cluster ring` with the ring it serves by, as a retrieval any memcached
//! client can read: `VALUE ring 0 <len>` whose data is `<epoch> <vnodes> <node> <node>…`,
//! then `END`. A request for a key the node does not own is answered
//! `SERVER_ERROR MOVED <epoch> <node>` (the owner under the node's ring); one for a key the
//! node owns but whose data is still arriving from its previous owner is answered
//! `SERVER_ERROR TRYAGAIN <epoch>`. An ordinary client reads both as errors;
//! [`ClusterClient`] (and `kvlab bench --cluster`) refresh the ring and resend.

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use xxhash_rust::xxh3::xxh3_64;

use crate::blocking::{Answer, Client};
use crate::conn::ConnError;
pub use crate::redirect::Redirect;

/// Points per node on the ring unless a cluster says otherwise: enough that 4 nodes each
/// hold within 10% of the mean (the relative spread of a node's share is about
/// 1/√vnodes).
pub const DEFAULT_VNODES: u32 = 1024;

/// A key's position on the ring.
pub fn key_hash(key: &[u8]) -> u64 {
    xxh3_64(key)
}

/// The ring of one epoch: which node owns which key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ring {
    epoch: u64,
    vnodes: u32,
    nodes: Vec<String>,
    /// (point, node index), sorted by point.
    points: Vec<(u64, u32)>,
}

impl Ring {
    /// The ring of `nodes` (addresses, in any order: the ring depends on the set only).
    pub fn new(epoch: u64, vnodes: u32, nodes: &[String]) -> Ring {
        let mut nodes = nodes.to_vec();
        nodes.sort();
        nodes.dedup();
        let vnodes = vnodes.max(1);
        let mut points = Vec::with_capacity(nodes.len() * vnodes as usize);
        let mut name = Vec::new();
        for (n, node) in nodes.iter().enumerate() {
            for i in 0..vnodes {
                name.clear();
                name.extend_from_slice(node.as_bytes());
                name.push(b'#');
                name.extend_from_slice(i.to_string().as_bytes());
                points.push((xxh3_64(&name), n as u32));
            }
        }
        points.sort_unstable();
        Ring {
            epoch,
            vnodes,
            nodes,
            points,
        }
    }

    /// The ring's epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Points per node.
    pub fn vnodes(&self) -> u32 {
        self.vnodes
    }

    /// The nodes, sorted.
    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// Index (into [`Ring::nodes`]) of the node that owns a key of hash `hash`; `None` for
    /// an empty ring.
    pub fn index_of_hash(&self, hash: u64) -> Option<usize> {
        if self.points.is_empty() {
            return None;
        }
        let i = self.points.partition_point(|&(p, _)| p < hash);
        let (_, n) = self.points[if i == self.points.len() { 0 } else { i }];
        Some(n as usize)
    }

    /// The `r` distinct nodes that hold a key of hash `hash` when keys are replicated: its
    /// owner, then the next distinct nodes along the ring (fewer if the ring has fewer).
    /// When the owner leaves the ring, its keys go to the first of the others — which
    /// already holds them.
    pub fn owners_of_hash(&self, hash: u64, r: usize, out: &mut Vec<usize>) {
        out.clear();
        let n = self.points.len();
        if n == 0 {
            return;
        }
        let start = self.points.partition_point(|&(p, _)| p < hash);
        for i in 0..n {
            if out.len() >= r {
                break;
            }
            let node = self.points[(start + i) % n].1 as usize;
            if !out.contains(&node) {
                out.push(node);
            }
        }
    }

    /// Index of the node that owns `key`.
    pub fn index_of(&self, key: &[u8]) -> Option<usize> {
        self.index_of_hash(key_hash(key))
    }

    /// The node that owns `key`.
    pub fn owner(&self, key: &[u8]) -> Option<&str> {
        self.index_of(key).map(|i| self.nodes[i].as_str())
    }

    /// The node that owns a key of hash `hash`.
    pub fn owner_of_hash(&self, hash: u64) -> Option<&str> {
        self.index_of_hash(hash).map(|i| self.nodes[i].as_str())
    }

    /// The data of a `cluster ring` reply: `<epoch> <vnodes> <node>…`.
    pub fn describe(&self) -> String {
        let mut s = format!("{} {}", self.epoch, self.vnodes);
        for n in &self.nodes {
            s.push(' ');
            s.push_str(n);
        }
        s
    }

    /// Reads [`Ring::describe`]'s form.
    pub fn parse(text: &[u8]) -> Result<Ring, String> {
        let text = std::str::from_utf8(text).map_err(|_| "ring is not UTF-8".to_string())?;
        let mut words = text.split_ascii_whitespace();
        let epoch = words.next().and_then(|w| w.parse().ok());
        let vnodes = words.next().and_then(|w| w.parse().ok());
        let (Some(epoch), Some(vnodes)) = (epoch, vnodes) else {
            return Err(format!("malformed ring {text:?}"));
        };
        let nodes: Vec<String> = words.map(str::to_string).collect();
        Ok(Ring::new(epoch, vnodes, &nodes))
    }
}

/// A key and its value, as a multi-get returns them.
pub type KeyValue = (Vec<u8>, Vec<u8>);

/// Asks the node at `addr` for its ring.
pub fn fetch_ring(addr: SocketAddr, timeout: Duration) -> Result<Ring, ConnError> {
    let mut c = Client::connect(addr, timeout)?;
    ring_of(&mut c)
}

fn ring_of(c: &mut Client) -> Result<Ring, ConnError> {
    match c.call(b"cluster ring\r\n")? {
        Answer::Values(v) if v.len() == 1 => Ring::parse(&v[0].2).map_err(unexpected),
        other => Err(unexpected(format!("{other:?}"))),
    }
}

fn unexpected(reply: String) -> ConnError {
    ConnError::Unexpected { reply, kind: None }
}

/// Resolves a node name (`HOST:PORT`).
pub fn resolve(node: &str) -> io::Result<SocketAddr> {
    node.to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no address for {node}")))
}

/// How long a [`ClusterClient`] keeps following redirects for one request before it gives
/// up (a migration's hand-off lasts milliseconds; a node that stays behind for longer is an
/// error worth reporting).
pub const REDIRECT_PATIENCE: Duration = Duration::from_secs(10);

/// A blocking cluster-aware client: routes each key to its node by the ring, follows
/// redirects (refreshing the ring, waiting out a hand-off) and splits multi-gets by node.
/// For tools and tests; `kvlab bench --cluster` does the same in its event loop.
pub struct ClusterClient {
    ring: Ring,
    conns: HashMap<String, Client>,
    seeds: Vec<SocketAddr>,
    timeout: Duration,
    /// Redirects followed so far (MOVED and TRYAGAIN).
    pub redirects: u64,
}

impl ClusterClient {
    /// Connects through any of `seeds` (cluster nodes) and fetches the ring.
    pub fn connect(seeds: &[SocketAddr], timeout: Duration) -> Result<ClusterClient, ConnError> {
        let mut c = ClusterClient {
            ring: Ring::new(0, 1, &[]),
            conns: HashMap::new(),
            seeds: seeds.to_vec(),
            timeout,
            redirects: 0,
        };
        c.refresh(None)?;
        Ok(c)
    }

    /// The ring in use.
    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// Fetches the ring again: from `hint` (a node that just answered with a newer epoch)
    /// first, then from the ring's nodes and the seeds. Keeps the newest epoch seen.
    pub fn refresh(&mut self, hint: Option<&str>) -> Result<(), ConnError> {
        let mut tried: Vec<String> = Vec::new();
        let mut candidates: Vec<String> = hint.into_iter().map(str::to_string).collect();
        candidates.extend(self.ring.nodes().iter().cloned());
        candidates.extend(self.seeds.iter().map(|s| s.to_string()));
        let mut last = None;
        for node in candidates {
            if tried.contains(&node) {
                continue;
            }
            tried.push(node.clone());
            match self.conn(&node).and_then(ring_of) {
                Ok(ring) => {
                    if ring.epoch() >= self.ring.epoch() {
                        self.ring = ring;
                    }
                    return Ok(());
                }
                Err(e) => {
                    self.conns.remove(&node);
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or(ConnError::Closed))
    }

    fn conn(&mut self, node: &str) -> Result<&mut Client, ConnError> {
        if !self.conns.contains_key(node) {
            let c = Client::connect(resolve(node)?, self.timeout)?;
            self.conns.insert(node.to_string(), c);
        }
        self.conns.get_mut(node).ok_or(ConnError::Closed)
    }

    /// Sends `req` (one request for keys of one node) to the owner of `key` and returns its
    /// answer, following redirects for up to [`REDIRECT_PATIENCE`].
    ///
    /// A request that was sent and not answered (a timeout, a connection lost) is sent
    /// again only if it is a retrieval: a write may still take effect — held up in the
    /// network, it could land after later writes — so its error is returned (the write's
    /// outcome is unknown), and its connection is reset so that it is not delivered later.
    pub fn call(&mut self, key: &[u8], req: &[u8]) -> Result<Answer, ConnError> {
        let resend = req.starts_with(b"get ") || req.starts_with(b"gets ");
        let start = Instant::now();
        let mut pause = Duration::from_micros(200);
        loop {
            let node = self
                .ring
                .owner(key)
                .ok_or_else(|| unexpected("the ring has no nodes".into()))?
                .to_string();
            let conn = match self.conn(&node) {
                Ok(c) => Ok(c),
                // Not sent: the node is not reachable.
                Err(e) => Err((e, false)),
            };
            let answer = match conn.and_then(|c| c.call(req).map_err(|e| (e, true))) {
                Ok(a) => a,
                Err((e, sent)) => {
                    // A node that went away: the ring may have changed without it.
                    if let Some(c) = self.conns.remove(&node) {
                        c.abort();
                    }
                    if sent && !resend {
                        return Err(e);
                    }
                    if start.elapsed() > REDIRECT_PATIENCE {
                        return Err(e);
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(50));
                    let _ = self.refresh(None);
                    continue;
                }
            };
            let redirect = match &answer {
                Answer::Line(line) => line
                    .strip_prefix(b"SERVER_ERROR ")
                    .and_then(Redirect::parse),
                Answer::Values(_) => None,
            };
            let Some(redirect) = redirect else {
                return Ok(answer);
            };
            self.redirects += 1;
            if start.elapsed() > REDIRECT_PATIENCE {
                return Err(unexpected(format!("still redirected: {redirect:?}")));
            }
            match redirect {
                Redirect::Moved { epoch, node } if epoch > self.ring.epoch() => {
                    self.refresh(Some(&node))?;
                }
                _ => {
                    // The node is behind us, or its data is still arriving: wait a little.
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(20));
                    let _ = self.refresh(None);
                }
            }
        }
    }

    /// `get key`.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, ConnError> {
        let mut req = Vec::with_capacity(key.len() + 6);
        kvlab_protocol::client::get(&mut req, key).map_err(compose)?;
        match self.call(key, &req)? {
            Answer::Values(mut v) => Ok(v.pop().map(|(_, _, d)| d)),
            Answer::Line(l) => Err(unexpected(String::from_utf8_lossy(&l).into_owned())),
        }
    }

    /// A multi-get split by node: the values found, as (key, data), in no particular order.
    pub fn get_many(&mut self, keys: &[&[u8]]) -> Result<Vec<KeyValue>, ConnError> {
        let mut by_node: HashMap<usize, Vec<&[u8]>> = HashMap::new();
        for k in keys {
            let i = self.ring.index_of(k).unwrap_or(0);
            by_node.entry(i).or_default().push(k);
        }
        let mut found = Vec::new();
        for (_, group) in by_node {
            let mut req = b"get".to_vec();
            for k in &group {
                req.push(b' ');
                req.extend_from_slice(k);
            }
            req.extend_from_slice(b"\r\n");
            // A group that straddles a ring change is redirected as a whole and falls back
            // to one key at a time.
            match self.call(group[0], &req) {
                Ok(Answer::Values(v)) => found.extend(v.into_iter().map(|(k, _, d)| (k, d))),
                _ => {
                    for k in group {
                        if let Some(d) = self.get(k)? {
                            found.push((k.to_vec(), d));
                        }
                    }
                }
            }
        }
        Ok(found)
    }

    /// `set key 0 0 <len>`: true when stored.
    pub fn set(&mut self, key: &[u8], value: &[u8]) -> Result<bool, ConnError> {
        let mut req = Vec::with_capacity(key.len() + value.len() + 32);
        kvlab_protocol::client::store(
            &mut req,
            kvlab_protocol::client::StoreCmd::Set,
            key,
            0,
            0,
            value,
            false,
        )
        .map_err(compose)?;
        self.line(key, &req, b"STORED")
    }

    /// `delete key`: true when something was deleted.
    pub fn delete(&mut self, key: &[u8]) -> Result<bool, ConnError> {
        let mut req = Vec::new();
        kvlab_protocol::client::delete(&mut req, key, false).map_err(compose)?;
        self.line(key, &req, b"DELETED")
    }

    fn line(&mut self, key: &[u8], req: &[u8], yes: &[u8]) -> Result<bool, ConnError> {
        match self.call(key, req)? {
            Answer::Line(l) if l == yes => Ok(true),
            Answer::Line(l) if l.starts_with(b"NOT_") => Ok(false),
            other => Err(unexpected(format!("{other:?}"))),
        }
    }
}

fn compose(e: kvlab_protocol::client::ComposeError) -> ConnError {
    ConnError::Io(io::Error::new(io::ErrorKind::InvalidInput, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("10.0.0.{}:11211", i + 1)).collect()
    }

    fn shares(ring: &Ring, keys: u64) -> Vec<u64> {
        let mut c = vec![0u64; ring.nodes().len()];
        for k in 0..keys {
            c[ring.index_of(format!("key:{k}").as_bytes()).unwrap()] += 1;
        }
        c
    }

    /// Four nodes with the default points: the busiest holds at most 1.1× the mean.
    #[test]
    fn four_nodes_are_balanced() {
        let keys = 200_000;
        for base in [7000, 11211, 21000] {
            let nodes: Vec<String> = (0..4).map(|i| format!("127.0.0.1:{}", base + i)).collect();
            let ring = Ring::new(1, DEFAULT_VNODES, &nodes);
            let c = shares(&ring, keys);
            let max = *c.iter().max().unwrap() as f64;
            let mean = keys as f64 / 4.0;
            assert!(
                max <= 1.1 * mean,
                "{c:?}: busiest {:.3}× the mean",
                max / mean
            );
        }
    }

    /// Adding a fifth node moves 1/5 of the keys (± 2 points), all of them to the new node.
    #[test]
    fn a_fifth_node_takes_a_fifth() {
        let keys = 200_000u64;
        let four = Ring::new(1, DEFAULT_VNODES, &nodes(4));
        let five = Ring::new(2, DEFAULT_VNODES, &nodes(5));
        let mut moved = 0;
        for k in 0..keys {
            let key = format!("key:{k}");
            let (a, b) = (four.owner(key.as_bytes()), five.owner(key.as_bytes()));
            if a != b {
                moved += 1;
                assert_eq!(b, Some("10.0.0.5:11211"), "a key moved between old nodes");
            }
        }
        let frac = moved as f64 / keys as f64;
        assert!((frac - 0.2).abs() <= 0.02, "moved {frac:.4}");
    }

    /// A key's second holder is the node that owns it once its owner leaves the ring.
    #[test]
    fn the_second_owner_takes_over() {
        let all = nodes(4);
        let ring = Ring::new(1, DEFAULT_VNODES, &all);
        let mut owners = Vec::new();
        for k in 0..2000 {
            let key = format!("key:{k}");
            ring.owners_of_hash(key_hash(key.as_bytes()), 2, &mut owners);
            assert_eq!(owners.len(), 2);
            assert_eq!(owners[0], ring.index_of(key.as_bytes()).unwrap());
            let dead = &ring.nodes()[owners[0]];
            let rest: Vec<String> = all.iter().filter(|n| *n != dead).cloned().collect();
            let healed = Ring::new(2, DEFAULT_VNODES, &rest);
            assert_eq!(
                healed.owner(key.as_bytes()),
                Some(ring.nodes()[owners[1]].as_str())
            );
        }
    }

    #[test]
    fn describe_and_parse_round_trip_and_order_does_not_matter() {
        let mut n = nodes(3);
        let ring = Ring::new(9, 64, &n);
        assert_eq!(Ring::parse(ring.describe().as_bytes()).unwrap(), ring);
        n.reverse();
        assert_eq!(Ring::new(9, 64, &n), ring);
        assert!(Ring::parse(b"x 1 a").is_err());
        assert_eq!(Ring::new(1, 4, &[]).owner(b"k"), None);
    }

    #[test]
    fn redirects_read_back() {
        for r in [
            Redirect::Moved {
                epoch: 7,
                node: "127.0.0.1:7001".into(),
            },
            Redirect::TryAgain { epoch: 3 },
        ] {
            let mut out = Vec::new();
            r.write(&mut out);
            let reason = out.strip_prefix(b"SERVER_ERROR ").unwrap();
            assert_eq!(Redirect::parse(&reason[..reason.len() - 2]), Some(r));
        }
        assert_eq!(Redirect::parse(b"out of memory"), None);
    }
}
