//! The routing table a worker uses: pools chosen by key prefix, each with its ring, and the
//! global list of backends (with their shared [`Health`]) that workers index their
//! connections by. A reload builds a new table; backends that keep their name keep their
//! health.

use std::sync::Arc;

use crate::backend::Health;
use crate::config::{Pool, ProxyConfig, ReadPolicy};
use crate::ring::PoolRing;

/// One pool as routed: its settings, its ring, and where its backends start in the global
/// list.
#[derive(Debug)]
pub struct PoolRoute {
    /// The pool's settings.
    pub pool: Pool,
    /// Its key → backend map (indices local to the pool).
    pub ring: PoolRing,
    /// Global index of its first backend.
    pub base: usize,
}

/// Pools, rings and backends of one configuration.
#[derive(Debug)]
pub struct Routing {
    /// The configuration it was built from.
    pub config: ProxyConfig,
    /// Pools, longest prefix first.
    pub pools: Vec<PoolRoute>,
    /// Every backend of every pool, pool by pool.
    pub backends: Vec<Arc<Health>>,
    /// Per backend: its pool keeps more than one copy of a key (and is not a kvlab
    /// cluster's). The writes it misses are recorded, and repaired from a peer replica when it
    /// comes back; elsewhere a backend that comes back cannot hold a value newer writes
    /// replaced (they failed), and rejoins as it is.
    pub repair: Vec<bool>,
}

impl Routing {
    /// Builds the table; `previous` lends its health records to backends of the same name.
    pub fn new(config: ProxyConfig, previous: Option<&Routing>) -> Result<Routing, String> {
        config.check().map_err(|e| e.to_string())?;
        let mut pools = Vec::new();
        let mut backends = Vec::new();
        let mut repair = Vec::new();
        for pool in &config.pools {
            let ring = match &pool.cluster {
                Some(c) => PoolRing::of_cluster(c.clone()),
                None => {
                    PoolRing::new(&pool.backends, pool.distribution).map_err(|e| e.to_string())?
                }
            };
            let base = backends.len();
            for b in &pool.backends {
                let name = format!("{}:{}", b.host, b.port);
                let health = previous
                    .and_then(|p| p.backends.iter().find(|h| h.name == name))
                    .cloned()
                    .unwrap_or_else(|| Arc::new(Health::new(name)));
                backends.push(health);
                repair.push(pool.cluster.is_none() && pool.replicas > 1);
            }
            pools.push(PoolRoute {
                pool: pool.clone(),
                ring,
                base,
            });
        }
        pools.sort_by_key(|p| std::cmp::Reverse(p.pool.prefix.len()));
        Ok(Routing {
            config,
            pools,
            backends,
            repair,
        })
    }

    /// The pool of `key`: the one with the longest prefix of it.
    pub fn pool_of(&self, key: &[u8]) -> usize {
        self.pools
            .iter()
            .position(|p| key.starts_with(p.pool.prefix.as_bytes()))
            .unwrap_or(self.pools.len() - 1)
    }

    /// The global indices of the backends that hold `key` (primary first).
    pub fn replicas(&self, pool: usize, key: &[u8], out: &mut Vec<usize>) {
        let p = &self.pools[pool];
        p.ring.replicas(key, p.pool.replicas, out);
        for b in out.iter_mut() {
            *b += p.base;
        }
    }

    /// Every backend of `pool`, as global indices.
    pub fn pool_backends(&self, pool: usize, out: &mut Vec<usize>) {
        let p = &self.pools[pool];
        out.clear();
        out.extend(p.base..p.base + p.pool.backends.len());
    }

    /// The backend among `candidates` (not `except`, not ejected) that serves a read under
    /// `policy`; `turn` is the worker's round-robin counter.
    pub fn choose_read(
        &self,
        candidates: &[usize],
        except: Option<usize>,
        policy: ReadPolicy,
        turn: usize,
    ) -> Option<usize> {
        let usable = |b: &usize| Some(*b) != except && !self.backends[*b].is_ejected();
        match policy {
            ReadPolicy::RoundRobin => {
                let n = candidates.len();
                (0..n)
                    .map(|i| candidates[(turn + i) % n])
                    .find(|b| usable(b))
            }
            ReadPolicy::LeastOutstanding => {
                candidates.iter().copied().filter(usable).min_by_key(|&b| {
                    self.backends[b]
                        .outstanding
                        .load(std::sync::atomic::Ordering::Relaxed)
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_backend;

    fn routing(text: &str) -> Routing {
        Routing::new(ProxyConfig::parse(text).unwrap(), None).unwrap()
    }

    #[test]
    fn keys_go_to_the_pool_of_their_longest_prefix() {
        let r = routing(
            r#"
            [[pool]]
            backends = ["a:1"]
            [[pool]]
            prefix = "user:"
            backends = ["b:1", "c:1"]
            [[pool]]
            prefix = "user:vip:"
            backends = ["d:1"]
            "#,
        );
        let name = |key: &[u8]| {
            let mut out = Vec::new();
            r.replicas(r.pool_of(key), key, &mut out);
            r.backends[out[0]].name.clone()
        };
        assert_eq!(name(b"user:vip:1"), "d:1");
        assert!(["b:1", "c:1"].contains(&name(b"user:7").as_str()));
        assert_eq!(name(b"other"), "a:1");
        // One copy of each key: nothing a returning backend holds needs repair.
        assert_eq!(r.repair, [false; 4]);
    }

    #[test]
    fn reads_skip_ejected_and_excluded_backends() {
        let mut config = ProxyConfig::new(
            ["a:1", "b:1", "c:1"]
                .iter()
                .map(|b| parse_backend(b).unwrap())
                .collect(),
        );
        config.pools[0].replicas = 3;
        let r = Routing::new(config, None).unwrap();
        // Three copies: the writes a backend misses are repaired when it comes back.
        assert_eq!(r.repair, [true; 3]);
        let all = [0, 1, 2];
        let rr = ReadPolicy::RoundRobin;
        assert_eq!(r.choose_read(&all, None, rr, 4), Some(1));
        assert_eq!(r.choose_read(&all, Some(1), rr, 4), Some(2));
        r.backends[2].failed(1);
        assert_eq!(r.choose_read(&all, Some(1), rr, 4), Some(0));
        r.backends[1]
            .outstanding
            .store(5, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(
            r.choose_read(&all, None, ReadPolicy::LeastOutstanding, 0),
            Some(0)
        );
        r.backends[0].failed(1);
        assert_eq!(r.choose_read(&all, Some(1), rr, 0), None);
        // A reload keeps the health of a backend that stays.
        let again = Routing::new(r.config.clone(), Some(&r)).unwrap();
        assert!(again.backends[0].is_ejected());
    }
}
