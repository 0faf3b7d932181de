//! Eviction policies and the per-shard structures that order items for them.
//!
//! Every structure is built from intrusive doubly-linked lists over slab indices
//! (links live in the slab entries), so insert, remove and access are O(1) apart
//! from the `largest` policy's size index:
//!
//! | policy    | lists                                  | on access          | victim                        |
//! |-----------|----------------------------------------|--------------------|-------------------------------|
//! | `lru`     | one, most recent at head               | move to head       | tail                          |
//! | `fifo`    | one, newest at head                    | nothing            | tail (oldest store)           |
//! | `none`    | one, newest at head (for reclaim scans)| nothing            | none: stores fail when full   |
//! | `lfu`     | one per access count 0..=255           | move to count+1    | tail of the lowest count      |
//! | `largest` | one per key+value size (`BTreeMap`)    | nothing            | tail of the largest size      |
//!
//! LFU counts saturate at 255 and never decay; within one count the least recently
//! accessed item goes first. An overwrite keeps the key's count and counts as an
//! access. Among equally large items `largest` evicts the oldest store first.
//!
//! These orders are per shard. `lru`, `lfu` and `fifo` use them as they are (exact
//! with one shard); `largest` also publishes each shard's largest size
//! (`Order::largest_size`, see `shard::LargestHints`) so that the store evicts the
//! store-wide largest item first (crate docs, "Eviction").

use std::collections::BTreeMap;
use std::fmt;
use std::ops::ControlFlow;
use std::str::FromStr;

use crate::slab::{Slab, NIL};

/// How a full store chooses what to evict. Chosen at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Policy {
    /// Least recently used first.
    #[default]
    Lru,
    /// Least frequently used first; ties broken by recency.
    Lfu,
    /// Oldest store first; reads do not matter.
    Fifo,
    /// Largest item (key + value) of the whole store first, across shards; among
    /// equal sizes in one shard the oldest store first. Exact without concurrent
    /// writers; see the crate docs ("Eviction") for what concurrency relaxes.
    Largest,
    /// Never evict live items: a store that does not fit fails with
    /// `SetStatus::OutOfMemory` (memcached `-M`).
    None,
}

impl Policy {
    /// All policies, in declaration order.
    pub const ALL: [Policy; 5] = [
        Policy::Lru,
        Policy::Lfu,
        Policy::Fifo,
        Policy::Largest,
        Policy::None,
    ];

    /// The policy's name as `FromStr` accepts it.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Lru => "lru",
            Policy::Lfu => "lfu",
            Policy::Fifo => "fifo",
            Policy::Largest => "largest",
            Policy::None => "none",
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An eviction policy name that is not one of `lru`, `lfu`, `fifo`, `largest`, `none`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown eviction policy {0:?}: expected one of lru, lfu, fifo, largest, none")]
pub struct ParsePolicyError(pub String);

impl FromStr for Policy {
    type Err = ParsePolicyError;

    fn from_str(s: &str) -> Result<Policy, ParsePolicyError> {
        Policy::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| ParsePolicyError(s.to_owned()))
    }
}

/// Head (hot end) and tail (cold end) of an intrusive list over slab entries.
#[derive(Clone, Copy, Debug)]
pub(crate) struct List {
    head: u32,
    tail: u32,
}

impl List {
    const EMPTY: List = List {
        head: NIL,
        tail: NIL,
    };

    fn is_empty(&self) -> bool {
        self.head == NIL
    }

    fn push_head(&mut self, slab: &mut Slab, idx: u32) {
        let old = self.head;
        {
            let e = slab.get_mut(idx);
            e.prev = NIL;
            e.next = old;
        }
        if old == NIL {
            self.tail = idx;
        } else {
            slab.get_mut(old).prev = idx;
        }
        self.head = idx;
    }

    fn unlink(&mut self, slab: &mut Slab, idx: u32) {
        let (prev, next) = {
            let e = slab.get_mut(idx);
            let pn = (e.prev, e.next);
            e.prev = NIL;
            e.next = NIL;
            pn
        };
        if prev == NIL {
            self.head = next;
        } else {
            slab.get_mut(prev).next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            slab.get_mut(next).prev = prev;
        }
    }

    fn move_to_head(&mut self, slab: &mut Slab, idx: u32) {
        if self.head != idx {
            self.unlink(slab, idx);
            self.push_head(slab, idx);
        }
    }

    /// Calls `f` on entries from the tail towards the head until it breaks.
    fn walk_cold<B>(
        &self,
        slab: &Slab,
        f: &mut impl FnMut(u32) -> ControlFlow<B>,
    ) -> ControlFlow<B> {
        let mut i = self.tail;
        while i != NIL {
            f(i)?;
            i = slab.get(i).prev;
        }
        ControlFlow::Continue(())
    }
}

const LFU_LEVELS: usize = 256;

/// LFU lists, one per access count, and a bitmap of the non-empty ones.
pub(crate) struct LfuLists {
    lists: [List; LFU_LEVELS],
    nonempty: [u64; LFU_LEVELS / 64],
}

impl LfuLists {
    fn push(&mut self, slab: &mut Slab, idx: u32, f: u8) {
        let f = usize::from(f);
        self.lists[f].push_head(slab, idx);
        self.nonempty[f / 64] |= 1 << (f % 64);
    }

    fn unlink(&mut self, slab: &mut Slab, idx: u32, f: u8) {
        let f = usize::from(f);
        self.lists[f].unlink(slab, idx);
        if self.lists[f].is_empty() {
            self.nonempty[f / 64] &= !(1 << (f % 64));
        }
    }

    /// Non-empty counts, lowest first.
    fn levels(&self) -> impl Iterator<Item = usize> + '_ {
        self.nonempty.iter().enumerate().flat_map(|(w, &bits)| {
            let mut bits = bits;
            std::iter::from_fn(move || {
                if bits == 0 {
                    return None;
                }
                let b = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                Some(w * 64 + b)
            })
        })
    }
}

/// The eviction order of one shard.
pub(crate) enum Order {
    /// `lru` (bump on access), `fifo` and `none` (no bump).
    Queue {
        list: List,
        bump: bool,
    },
    Lfu(Box<LfuLists>),
    Largest(BTreeMap<u64, List>),
}

impl Order {
    pub(crate) fn new(policy: Policy) -> Order {
        match policy {
            Policy::Lru => Order::Queue {
                list: List::EMPTY,
                bump: true,
            },
            Policy::Fifo | Policy::None => Order::Queue {
                list: List::EMPTY,
                bump: false,
            },
            Policy::Lfu => Order::Lfu(Box::new(LfuLists {
                lists: [List::EMPTY; LFU_LEVELS],
                nonempty: [0; LFU_LEVELS / 64],
            })),
            Policy::Largest => Order::Largest(BTreeMap::new()),
        }
    }

    /// Adds a newly stored (or re-stored) item at the hot end of its list.
    pub(crate) fn insert(&mut self, slab: &mut Slab, idx: u32) {
        match self {
            Order::Queue { list, .. } => list.push_head(slab, idx),
            Order::Lfu(l) => {
                let f = slab.get(idx).freq();
                l.push(slab, idx, f);
            }
            Order::Largest(by_size) => {
                let size = slab.get(idx).block().data_len();
                by_size
                    .entry(size)
                    .or_insert(List::EMPTY)
                    .push_head(slab, idx);
            }
        }
    }

    /// Removes an item; must be called while the entry still holds its block.
    pub(crate) fn remove(&mut self, slab: &mut Slab, idx: u32) {
        match self {
            Order::Queue { list, .. } => list.unlink(slab, idx),
            Order::Lfu(l) => {
                let f = slab.get(idx).freq();
                l.unlink(slab, idx, f);
            }
            Order::Largest(by_size) => {
                let size = slab.get(idx).block().data_len();
                if let Some(list) = by_size.get_mut(&size) {
                    list.unlink(slab, idx);
                    if list.is_empty() {
                        by_size.remove(&size);
                    }
                }
            }
        }
    }

    /// The coldest item of a `lru`/`fifo`/`none` list (`NIL` if empty or another
    /// policy).
    #[inline]
    pub(crate) fn tail(&self) -> u32 {
        match self {
            Order::Queue { list, .. } => list.tail,
            _ => NIL,
        }
    }

    /// Key + value size of the largest item (`largest` policy only).
    #[inline]
    pub(crate) fn largest_size(&self) -> Option<u64> {
        match self {
            Order::Largest(by_size) => by_size.last_key_value().map(|(&k, _)| k),
            _ => None,
        }
    }

    /// Records an access (a hit).
    #[inline]
    pub(crate) fn touch(&mut self, slab: &mut Slab, idx: u32) {
        match self {
            Order::Queue { list, bump: true } => list.move_to_head(slab, idx),
            Order::Queue { bump: false, .. } | Order::Largest(_) => {}
            Order::Lfu(l) => {
                let f = slab.get(idx).freq();
                l.unlink(slab, idx, f);
                let nf = f.saturating_add(1);
                slab.get_mut(idx).set_freq(nf);
                l.push(slab, idx, nf);
            }
        }
    }

    /// Calls `f` on items from the coldest (next victim) towards the hottest until
    /// it breaks.
    pub(crate) fn walk_cold<B>(
        &self,
        slab: &Slab,
        mut f: impl FnMut(u32) -> ControlFlow<B>,
    ) -> ControlFlow<B> {
        match self {
            Order::Queue { list, .. } => list.walk_cold(slab, &mut f),
            Order::Lfu(l) => {
                for level in l.levels() {
                    l.lists[level].walk_cold(slab, &mut f)?;
                }
                ControlFlow::Continue(())
            }
            Order::Largest(by_size) => {
                for list in by_size.values().rev() {
                    list.walk_cold(slab, &mut f)?;
                }
                ControlFlow::Continue(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::item::Block;
    use crate::slab::Entry;

    #[test]
    fn policy_names_roundtrip() {
        for p in Policy::ALL {
            assert_eq!(p.to_string().parse::<Policy>(), Ok(p));
        }
        assert_eq!("LRU".parse::<Policy>(), Ok(Policy::Lru));
        let err = "random".parse::<Policy>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown eviction policy \"random\": expected one of lru, lfu, fifo, largest, none"
        );
    }

    fn slab_with(n: usize, sizes: &[usize]) -> Slab {
        let mut s = Slab::new();
        for i in 0..n {
            let v = vec![b'x'; sizes.get(i).copied().unwrap_or(1)];
            let mut e = Entry::vacant(NIL);
            e.block = Some(Block::new(b"k", &[&v], 0));
            s.insert(e);
        }
        s
    }

    fn cold_order(o: &Order, s: &Slab) -> Vec<u32> {
        let mut v = Vec::new();
        let _ = o.walk_cold::<()>(s, |i| {
            v.push(i);
            ControlFlow::Continue(())
        });
        v
    }

    #[test]
    fn lru_and_fifo_orders() {
        for (policy, expect) in [(Policy::Lru, vec![1, 2, 0]), (Policy::Fifo, vec![0, 1, 2])] {
            let mut s = slab_with(3, &[]);
            let mut o = Order::new(policy);
            for i in 0..3 {
                o.insert(&mut s, i);
            }
            o.touch(&mut s, 0);
            assert_eq!(cold_order(&o, &s), expect, "{policy}");
            o.remove(&mut s, 1);
            assert_eq!(cold_order(&o, &s).len(), 2);
        }
    }

    #[test]
    fn lfu_order() {
        let mut s = slab_with(4, &[]);
        let mut o = Order::new(Policy::Lfu);
        for i in 0..4 {
            o.insert(&mut s, i);
        }
        o.touch(&mut s, 0);
        o.touch(&mut s, 0);
        o.touch(&mut s, 2);
        o.touch(&mut s, 1);
        // count 0: 3; count 1: 2 then 1 (1 more recent); count 2: 0.
        assert_eq!(cold_order(&o, &s), vec![3, 2, 1, 0]);
        for _ in 0..300 {
            o.touch(&mut s, 3);
        }
        assert_eq!(s.get(3).freq(), 255);
        assert_eq!(cold_order(&o, &s), vec![2, 1, 0, 3]);
        o.remove(&mut s, 3);
        assert_eq!(cold_order(&o, &s), vec![2, 1, 0]);
    }

    #[test]
    fn largest_order() {
        let mut s = slab_with(4, &[10, 30, 20, 30]);
        let mut o = Order::new(Policy::Largest);
        for i in 0..4 {
            o.insert(&mut s, i);
        }
        o.touch(&mut s, 1);
        assert_eq!(cold_order(&o, &s), vec![1, 3, 2, 0]);
        o.remove(&mut s, 1);
        o.remove(&mut s, 3);
        assert_eq!(cold_order(&o, &s), vec![2, 0]);
        if let Order::Largest(m) = &o {
            assert_eq!(m.len(), 2);
        }
    }
}
