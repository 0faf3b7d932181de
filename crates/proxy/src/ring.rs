//! Which backend serves a key: twemproxy's and libmemcached's distributions.
//!
//! - [`Distribution::Ketama`]: consistent hashing on a continuum of 32-bit points. Each
//!   backend gets points in proportion to its weight (160 per backend when all weights are
//!   equal), four per MD5 digest of `"<name>-<i>"`, where the name is the server's own (a
//!   twemproxy `host:port:weight name` line), or else `host` when the port is 11211 and
//!   `host:port` otherwise (libmemcached's convention, which twemproxy keeps). A key
//!   goes to the first point at or after the MD5 hash of the key, wrapping around. Adding or
//!   removing a backend moves only the keys of the arcs it gains or loses.
//! - [`Distribution::Modula`]: `hash % total_weight` over a table holding each backend
//!   `weight` times, in the order of their names (as twemproxy sorts its servers); every key
//!   may move when the set changes.
//!
//! Both reproduce twemproxy (`hash: md5`) bit for bit, including its single-precision
//! arithmetic for the points of weighted backends, so a kvlab proxy and a nutcracker in front
//! of the same backends send every key to the same one (tested against Debian's nutcracker).

use md5::{Digest, Md5};
use std::sync::Arc;

/// Points per backend on the ketama continuum when all weights are equal.
pub const KETAMA_POINTS_PER_BACKEND: u32 = 160;

/// Points taken from one MD5 digest.
const POINTS_PER_HASH: u32 = 4;

/// How keys map to backends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Distribution {
    /// Consistent hashing (twemproxy `distribution: ketama`).
    #[default]
    Ketama,
    /// Hash modulo the total weight (twemproxy `distribution: modula`).
    Modula,
}

/// One backend as the distribution sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backend {
    /// Host name or address, as written in the configuration.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Relative share of the keys (at least 1).
    pub weight: u32,
    /// Its name, as twemproxy's `host:port:weight name`: hashed for its ketama points (and
    /// sorted by for modula) instead of its address, so keys stay where they are when a
    /// server moves to a new address under the same name.
    pub name: Option<String>,
}

impl Backend {
    /// A backend of weight 1.
    pub fn new(host: impl Into<String>, port: u16) -> Backend {
        Backend {
            host: host.into(),
            port,
            weight: 1,
            name: None,
        }
    }

    /// The name hashed for its ketama points: its own name if it has one, else `host`, or
    /// `host:port` unless the port is 11211.
    pub fn ketama_name(&self) -> String {
        if let Some(name) = &self.name {
            name.clone()
        } else if self.port == 11211 {
            self.host.clone()
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// Why a ring could not be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// No backends.
    #[error("a pool needs at least one backend")]
    Empty,
    /// A backend of weight 0.
    #[error("backend {0} has weight 0 (weights start at 1)")]
    ZeroWeight(String),
    /// Two backends hash alike (the same name, or the same address without names): their
    /// points would coincide.
    #[error("two backends are both named {0:?} (names, or addresses without one, must differ)")]
    SameName(String),
}

/// The key → backend map of one pool.
#[derive(Clone, Debug)]
pub struct PoolRing {
    distribution: Distribution,
    /// Ketama: points sorted by value; modula: one entry per unit of weight (value unused).
    points: Vec<Point>,
    /// A kvlab cluster's ring instead (`--cluster`): backends are its nodes, in its order.
    cluster: Option<Arc<kvlab_ring::Ring>>,
}

#[derive(Clone, Copy, Debug)]
struct Point {
    value: u32,
    backend: u32,
}

impl PoolRing {
    /// Builds the map for `backends` (indices into this slice are what [`PoolRing::backend_of`]
    /// returns).
    pub fn new(backends: &[Backend], distribution: Distribution) -> Result<PoolRing, RingError> {
        if backends.is_empty() {
            return Err(RingError::Empty);
        }
        if let Some(b) = backends.iter().find(|b| b.weight == 0) {
            return Err(RingError::ZeroWeight(format!("{}:{}", b.host, b.port)));
        }
        let mut names = std::collections::HashSet::new();
        for b in backends {
            let name = b.ketama_name();
            if !names.insert(name.clone()) {
                return Err(RingError::SameName(name));
            }
        }
        let points = match distribution {
            Distribution::Ketama => ketama_points(backends),
            Distribution::Modula => modula_table(backends),
        };
        Ok(PoolRing {
            distribution,
            points,
            cluster: None,
        })
    }

    /// A kvlab cluster's ring: backend `i` is its node `i`.
    pub fn of_cluster(ring: Arc<kvlab_ring::Ring>) -> PoolRing {
        PoolRing {
            distribution: Distribution::Ketama,
            points: Vec::new(),
            cluster: Some(ring),
        }
    }

    /// The index of the backend that serves `key`.
    pub fn backend_of(&self, key: &[u8]) -> usize {
        if let Some(c) = &self.cluster {
            return c.index_of(key).unwrap_or(0);
        }
        self.points
            .get(self.start(key_hash(key)))
            .map_or(0, |p| p.backend as usize)
    }

    /// Where the walk for `hash` starts: the first point at or after it (ketama, wrapping
    /// round), or its table entry (modula).
    fn start(&self, hash: u32) -> usize {
        match self.distribution {
            Distribution::Ketama => {
                let i = self.points.partition_point(|p| p.value < hash);
                if i == self.points.len() {
                    0
                } else {
                    i
                }
            }
            Distribution::Modula => hash as usize % self.points.len().max(1),
        }
    }

    /// The `r` distinct backends that hold `key` when it is replicated, primary first
    /// ([`PoolRing::backend_of`]), then the next distinct backends along the ring (ketama) or the
    /// table (modula). Fewer when the ring has fewer backends.
    pub fn replicas(&self, key: &[u8], r: usize, out: &mut Vec<usize>) {
        out.clear();
        if self.cluster.is_some() {
            // A cluster node owns its keys alone.
            out.push(self.backend_of(key));
            return;
        }
        let n = self.points.len();
        let start = self.start(key_hash(key));
        for i in 0..n {
            if out.len() == r {
                break;
            }
            let b = self.points[(start + i) % n].backend as usize;
            if !out.contains(&b) {
                out.push(b);
            }
        }
    }

    /// Points on the continuum (ketama) or entries in the table (modula).
    pub fn len(&self) -> usize {
        self.points.len()
    }

    /// Whether the ring has no points (never true for a ring built by [`PoolRing::new`]).
    pub fn is_empty(&self) -> bool {
        self.points.is_empty() && self.cluster.is_none()
    }
}

/// twemproxy's `hash: md5`: the first four bytes of the key's MD5 digest, little-endian.
pub fn key_hash(key: &[u8]) -> u32 {
    let d = Md5::digest(key);
    u32::from_le_bytes([d[0], d[1], d[2], d[3]])
}

/// twemproxy sorts a pool's servers by name (shorter first, then byte order) when it loads
/// its configuration, and builds the modula table in that order, each server `weight` times.
/// (Ketama does not depend on the order: each point carries its server.)
fn modula_table(backends: &[Backend]) -> Vec<Point> {
    let mut order: Vec<(String, usize)> = backends
        .iter()
        .enumerate()
        .map(|(i, b)| (b.ketama_name(), i))
        .collect();
    order.sort_by(|(a, _), (b, _)| a.len().cmp(&b.len()).then_with(|| a.cmp(b)));
    order
        .into_iter()
        .flat_map(|(_, i)| {
            (0..backends[i].weight).map(move |_| Point {
                value: 0,
                backend: i as u32,
            })
        })
        .collect()
}

fn ketama_points(backends: &[Backend]) -> Vec<Point> {
    let total: u64 = backends.iter().map(|b| u64::from(b.weight)).sum();
    let n = backends.len() as f32;
    let mut points = Vec::new();
    for (i, b) in backends.iter().enumerate() {
        // twemproxy computes this in single precision (the 1e-10 is a double, so the sum is,
        // then converted back to float for floorf); keeping its arithmetic keeps its points.
        let pct = b.weight as f32 / total as f32;
        let scaled = pct * KETAMA_POINTS_PER_BACKEND as f32 / POINTS_PER_HASH as f32 * n;
        let per_backend = ((f64::from(scaled) + 0.000_000_000_1) as f32).floor() as u32 * 4;
        let name = b.ketama_name();
        for h in 0..per_backend / POINTS_PER_HASH {
            let d = Md5::digest(format!("{name}-{h}").as_bytes());
            for x in 0..POINTS_PER_HASH as usize {
                let value =
                    u32::from_le_bytes([d[4 * x], d[4 * x + 1], d[4 * x + 2], d[4 * x + 3]]);
                points.push(Point {
                    value,
                    backend: i as u32,
                });
            }
        }
    }
    points.sort_by_key(|p| p.value);
    points
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(weights: &[u32]) -> Vec<Backend> {
        weights
            .iter()
            .enumerate()
            .map(|(i, &w)| Backend {
                host: "10.0.0.1".into(),
                port: 11211 + i as u16,
                weight: w,
                name: None,
            })
            .collect()
    }

    #[test]
    fn equal_weights_give_160_points_each_and_an_even_share() {
        let ring = PoolRing::new(&pool(&[1, 1, 1]), Distribution::Ketama).unwrap();
        assert_eq!(ring.len(), 3 * 160);
        let mut count = [0usize; 3];
        for k in 0..30_000 {
            count[ring.backend_of(format!("key:{k}").as_bytes())] += 1;
        }
        for c in count {
            assert!((7_000..13_000).contains(&c), "{count:?}");
        }
    }

    #[test]
    fn weights_share_points_in_proportion() {
        let ring = PoolRing::new(&pool(&[1, 3]), Distribution::Ketama).unwrap();
        // 0.25 * 40 * 2 = 20 hashes = 80 points; 0.75 * 40 * 2 = 60 hashes = 240 points
        assert_eq!(ring.len(), 80 + 240);
        let modula = PoolRing::new(&pool(&[1, 3]), Distribution::Modula).unwrap();
        assert_eq!(modula.len(), 4);
    }

    #[test]
    fn adding_a_backend_moves_only_keys_to_it() {
        let three = PoolRing::new(&pool(&[1, 1, 1]), Distribution::Ketama).unwrap();
        let four = PoolRing::new(&pool(&[1, 1, 1, 1]), Distribution::Ketama).unwrap();
        let mut moved = 0;
        for k in 0..10_000 {
            let key = format!("key:{k}");
            let (a, b) = (
                three.backend_of(key.as_bytes()),
                four.backend_of(key.as_bytes()),
            );
            if a != b {
                assert_eq!(b, 3, "a key moved between old backends");
                moved += 1;
            }
        }
        assert!((1_500..3_500).contains(&moved), "{moved} of 10000 moved");
    }

    #[test]
    fn replicas_are_distinct_and_start_with_the_primary() {
        for distribution in [Distribution::Ketama, Distribution::Modula] {
            let ring = PoolRing::new(&pool(&[1, 2, 1, 1]), distribution).unwrap();
            let mut out = Vec::new();
            let mut second = [0usize; 4];
            for k in 0..2_000 {
                let key = format!("key:{k}");
                ring.replicas(key.as_bytes(), 3, &mut out);
                assert_eq!(out.len(), 3);
                assert_eq!(out[0], ring.backend_of(key.as_bytes()));
                assert!(out[0] != out[1] && out[1] != out[2] && out[0] != out[2]);
                second[out[1]] += 1;
                ring.replicas(key.as_bytes(), 9, &mut out);
                assert_eq!(out.len(), 4, "all backends, once each");
            }
            // Second copies are spread, not all on one backend.
            assert!(
                second.iter().filter(|&&c| c > 100).count() >= 3,
                "{second:?}"
            );
        }
    }

    #[test]
    fn names_follow_libmemcached() {
        assert_eq!(Backend::new("cache1", 11211).ketama_name(), "cache1");
        assert_eq!(Backend::new("cache1", 11212).ketama_name(), "cache1:11212");
        let mut named = Backend::new("10.0.0.7", 11212);
        named.name = Some("shard-a".into());
        assert_eq!(named.ketama_name(), "shard-a");
        assert_eq!(key_hash(b""), 0xd98c_1dd4); // md5("") = d41d8cd9…, little-endian
    }

    #[test]
    fn bad_pools_are_refused() {
        assert_eq!(
            PoolRing::new(&[], Distribution::Ketama).unwrap_err(),
            RingError::Empty
        );
        let mut p = pool(&[1]);
        p[0].weight = 0;
        assert!(matches!(
            PoolRing::new(&p, Distribution::Modula),
            Err(RingError::ZeroWeight(_))
        ));
    }
}
