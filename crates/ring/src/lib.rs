//! A kvlab cluster's ring: which node owns which key, and the redirects a node answers
//! with when a key is not its to serve. Nodes, clients (`kvlab-client`'s cluster-aware
//! client), the load generator (`kvlab bench --cluster`) and the proxy (a pool that is a
//! cluster) all route by it, so it stands below every one of them and imports no other
//! kvlab crate.
//!
//! A cluster's ring places `vnodes` points per node on a 64-bit circle (xxh3 of
//! `"<node>#<i>"`); a key (xxh3 of its bytes) belongs to the node of the first point at or
//! after its hash, wrapping around. Nodes are named by their address (`HOST:PORT`). Every
//! change of the ring has a new *epoch*.
//!
//! A node answers `cluster ring` with the ring it serves by, as a retrieval any memcached
//! client can read: `VALUE ring 0 <len>` whose data is `<epoch> <vnodes> <node> <node>…`
//! ([`Ring::describe`], [`Ring::parse`]), then `END`. A request for a key the node does not
//! own is answered `SERVER_ERROR MOVED <epoch> <node>` (the owner under the node's ring);
//! one for a key the node owns but whose data is still arriving from its previous owner is
//! answered `SERVER_ERROR TRYAGAIN <epoch>` ([`Redirect`]). An ordinary client reads both
//! as errors; a cluster-aware one refreshes the ring and resends.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod redirect;

use xxhash_rust::xxh3::xxh3_64;

pub use redirect::Redirect;

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
