//! A blocking cluster-aware client for a kvlab cluster: fetches the ring a node serves by
//! ([`fetch_ring`]), routes each key to its node by it and follows the nodes' redirects.
//! The ring and the redirects themselves are `kvlab-ring`'s.

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use kvlab_ring::{Redirect, Ring};

use crate::blocking::{Answer, Client};
use crate::conn::ConnError;

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
    /// A ring given by the caller, never fetched (plain memcached servers).
    fixed: bool,
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
            fixed: false,
            redirects: 0,
        };
        c.refresh(None)?;
        Ok(c)
    }

    /// A client of plain servers (memcached, or kvlab servers that are no cluster's nodes)
    /// behind a client-side ring of `nodes`: each key goes to its owner by the same
    /// consistent hashing a cluster's ring uses (`vnodes` points per node), the ring
    /// fixed — nothing is fetched from the servers, and an answer is never a redirect to
    /// follow. Connects lazily: a server is first reached by the first key it owns.
    pub fn fixed(nodes: &[SocketAddr], vnodes: u32, timeout: Duration) -> ClusterClient {
        let names: Vec<String> = nodes.iter().map(|a| a.to_string()).collect();
        ClusterClient {
            ring: Ring::new(0, vnodes, &names),
            conns: HashMap::new(),
            seeds: Vec::new(),
            timeout,
            fixed: true,
            redirects: 0,
        }
    }

    /// The ring in use.
    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// Fetches the ring again: from `hint` (a node that just answered with a newer epoch)
    /// first, then from the ring's nodes and the seeds. Keeps the newest epoch seen.
    pub fn refresh(&mut self, hint: Option<&str>) -> Result<(), ConnError> {
        if self.fixed {
            return Ok(());
        }
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
                Answer::Line(_) if self.fixed => None,
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
