//! `--cluster`: which node a request goes to, by the ring the cluster publishes.

use std::net::SocketAddr;
use std::time::Duration;

use kvlab_ring::Ring;

use super::STRIDE;
use crate::BenchError;

/// `--cluster`: which node each key goes to, by the ring the cluster publishes
/// (`kvlab_ring`); nodes keep their index for the whole run.
pub(super) struct Router {
    pub(super) ring: Ring,
    /// Per ring node, its index in `addrs`.
    of_ring: Vec<usize>,
    pub(super) addrs: Vec<SocketAddr>,
    names: Vec<String>,
    /// When the ring was last fetched because a node could not be reached (mono ns).
    pub(super) refreshed_ns: u64,
    /// Per node (as `addrs`), until when it is not connected to again after it refused a
    /// connection (mono ns).
    down_until: Vec<u64>,
}

impl Router {
    pub(super) fn new(seed: SocketAddr) -> Result<Router, BenchError> {
        let mut r = Router {
            ring: Ring::new(0, 1, &[]),
            of_ring: Vec::new(),
            addrs: Vec::new(),
            names: Vec::new(),
            refreshed_ns: 0,
            down_until: Vec::new(),
        };
        r.refresh(seed)?;
        if r.ring.nodes().is_empty() {
            return Err(BenchError::Connect(
                seed.to_string(),
                "the cluster has no nodes".into(),
            ));
        }
        Ok(r)
    }

    /// Fetches the ring from `from` and adopts it if it is newer.
    fn refresh(&mut self, from: SocketAddr) -> Result<(), BenchError> {
        let ring = kvlab_client::cluster::fetch_ring(from, Duration::from_secs(2))
            .map_err(|e| BenchError::Connect(from.to_string(), format!("cluster ring: {e}")))?;
        if ring.epoch() <= self.ring.epoch() && !self.of_ring.is_empty() {
            return Ok(());
        }
        let mut of_ring = Vec::with_capacity(ring.nodes().len());
        for name in ring.nodes() {
            let i = match self.names.iter().position(|n| n == name) {
                Some(i) => i,
                None => {
                    let addr = kvlab_client::cluster::resolve(name)
                        .map_err(|e| BenchError::Connect(name.clone(), e.to_string()))?;
                    if self.addrs.len() == STRIDE {
                        return Err(BenchError::Connect(
                            name.clone(),
                            format!("more than {STRIDE} cluster nodes"),
                        ));
                    }
                    self.addrs.push(addr);
                    self.names.push(name.clone());
                    self.addrs.len() - 1
                }
            };
            of_ring.push(i);
        }
        self.ring = ring;
        self.of_ring = of_ring;
        Ok(())
    }

    /// Fetches the ring from `first`, else from any other node it knows (the ring's first,
    /// then the rest, the seed among them): a node that left may be gone already.
    pub(super) fn refresh_any(&mut self, first: SocketAddr) -> Result<(), BenchError> {
        let mut last = match self.refresh(first) {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        let others: Vec<SocketAddr> = self
            .of_ring
            .iter()
            .map(|&i| self.addrs[i])
            .chain(self.addrs.iter().copied())
            .filter(|&a| a != first)
            .collect();
        for a in others {
            match self.refresh(a) {
                Ok(()) => return Ok(()),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Whether node `n` may be connected to at `now` (mono ns).
    pub(super) fn reachable(&self, n: usize, now: u64) -> bool {
        self.down_until.get(n).is_none_or(|&t| now >= t)
    }

    /// Node `n` refused a connection: not tried again before `until` (mono ns).
    pub(super) fn unreachable(&mut self, n: usize, until: u64) {
        if self.down_until.len() <= n {
            self.down_until.resize(n + 1, 0);
        }
        self.down_until[n] = until;
    }

    pub(super) fn node_of(&self, key: &[u8]) -> usize {
        self.ring.index_of(key).map_or(0, |i| self.of_ring[i])
    }
}

/// The key of a composed single-key request: its first line's second word.
pub(super) fn request_key(req: &[u8]) -> &[u8] {
    let line = &req[..req.iter().position(|&b| b == b'\r').unwrap_or(req.len())];
    line.split(|&b| b == b' ').nth(1).unwrap_or_default()
}
