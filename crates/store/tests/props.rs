//! Property tests of the store's invariants:
//!
//! - for every policy, random operation sequences never take `stats().bytes` above
//!   the memory limit, and after reclaiming, `curr_items` and `bytes` match exactly
//!   the items that can be retrieved; crawler steps interleaved with them never
//!   remove an item that can be retrieved, and never examine more than they may;
//! - `lru` with one shard evicts exactly what a simple model says;
//! - several threads hammering one store never take `bytes` above the limit.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kvlab_store::{
    ArithRequest, CrawlCursor, ManualClock, MetaDeleteOpts, MetaGetOpts, Policy, SetMode,
    SetRequest, SetStatus, Store, StoreConfig, ITEM_OVERHEAD,
};
use proptest::prelude::*;

const T0: u64 = 1_700_000_000;
const KEYS: usize = 24;

fn key(k: usize) -> Vec<u8> {
    format!("key{k}").into_bytes()
}

fn peek(s: &Store, k: &[u8]) -> Option<usize> {
    let opts = MetaGetOpts {
        no_bump: true,
        ..Default::default()
    };
    s.meta_get(k, &opts).map(|m| m.item.value.len())
}

#[derive(Clone, Debug)]
enum Op {
    Set {
        mode: u8,
        key: usize,
        len: usize,
        ttl: i64,
    },
    Get(usize),
    Delete(usize),
    Incr(usize),
    Touch(usize, i64),
    Vivify(usize),
    Invalidate(usize),
    Advance(u64),
    Flush(i64),
    /// A crawler step of at most this many slots.
    Crawl(usize),
}

fn value_len() -> impl Strategy<Value = usize> {
    prop_oneof![8 => 0usize..200, 3 => 200usize..2_000, 1 => 2_000usize..9_000]
}

fn op() -> impl Strategy<Value = Op> {
    let k = 0..KEYS;
    prop_oneof![
        10 => (0u8..5, k.clone(), value_len(), prop_oneof![4 => Just(0i64), 1 => -1i64..30])
            .prop_map(|(mode, key, len, ttl)| Op::Set { mode, key, len, ttl }),
        6 => k.clone().prop_map(Op::Get),
        2 => k.clone().prop_map(Op::Delete),
        1 => k.clone().prop_map(Op::Incr),
        1 => (k.clone(), -1i64..30).prop_map(|(k, t)| Op::Touch(k, t)),
        1 => k.clone().prop_map(Op::Vivify),
        1 => k.prop_map(Op::Invalidate),
        1 => (0u64..20).prop_map(Op::Advance),
        1 => prop_oneof![Just(0i64), 1i64..10].prop_map(Op::Flush),
        2 => (0usize..12).prop_map(Op::Crawl),
    ]
}

fn apply(s: &Store, clock: &ManualClock, cursor: &mut CrawlCursor, op: &Op) {
    match *op {
        Op::Set {
            mode,
            key: k,
            len,
            ttl,
        } => {
            let mode = [
                SetMode::Set,
                SetMode::Add,
                SetMode::Replace,
                SetMode::Append,
                SetMode::Prepend,
            ][usize::from(mode)];
            let value = vec![b'7'; len];
            let k = key(k);
            s.set(&SetRequest {
                exptime: ttl,
                ..SetRequest::new(mode, &k, &value)
            });
        }
        Op::Get(k) => {
            s.get(&key(k));
        }
        Op::Delete(k) => {
            s.delete(&key(k));
        }
        Op::Incr(k) => {
            s.arith(
                &key(k),
                &ArithRequest {
                    vivify: Some((9, 0)),
                    ..ArithRequest::new(true, 1)
                },
            );
        }
        Op::Touch(k, t) => {
            s.touch(&key(k), t);
        }
        Op::Vivify(k) => {
            s.meta_get(
                &key(k),
                &MetaGetOpts {
                    vivify: Some(10),
                    ..Default::default()
                },
            );
        }
        Op::Invalidate(k) => {
            let opts = MetaDeleteOpts {
                invalidate: true,
                ttl: Some(5),
                ..Default::default()
            };
            s.meta_delete(&key(k), &opts);
        }
        Op::Advance(secs) => clock.advance(secs),
        Op::Flush(delay) => s.flush_all(delay),
        Op::Crawl(max) => {
            let step = s.crawl_step(cursor, max);
            assert!(step.examined <= max.max(1), "{step:?} over {max}");
            assert!(step.reclaimed <= step.checked && step.checked <= step.examined);
        }
    }
}

/// Lengths of the values of every key that can be retrieved.
fn retrievable(s: &Store) -> Vec<Option<usize>> {
    (0..KEYS).map(|k| peek(s, &key(k))).collect()
}

fn policy() -> impl Strategy<Value = Policy> {
    prop::sample::select(Policy::ALL.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    /// Also with an entry bound (`--cache-items`): the item count never passes it.
    fn bytes_stay_within_limit_and_match_items(
        policy in policy(),
        shards in prop::sample::select(vec![1usize, 2, 8]),
        limit in 1_000usize..30_000,
        max_items in prop::sample::select(vec![0usize, 1, 3, 12]),
        ops in prop::collection::vec(op(), 1..250),
    ) {
        let clock = Arc::new(ManualClock::new(T0));
        let config = StoreConfig { memory_limit: limit, item_size_max: 8_192, policy, shards, max_items };
        let s = Store::new(config, clock.clone());
        let mut cursor = CrawlCursor::default();
        for op in &ops {
            let before = matches!(op, Op::Crawl(_)).then(|| retrievable(&s));
            apply(&s, &clock, &mut cursor, op);
            if let Some(before) = before {
                prop_assert_eq!(before, retrievable(&s), "a crawl step removed a live item");
            }
            let st = s.stats();
            prop_assert!(st.bytes as usize <= limit, "{} > {limit} after {op:?}", st.bytes);
            prop_assert!(
                max_items == 0 || st.curr_items as usize <= max_items,
                "{} items > {max_items} after {op:?}", st.curr_items
            );
        }
        s.reclaim_expired();
        let st = s.stats();
        let mut items = 0;
        let mut bytes = 0;
        for k in 0..KEYS {
            let kb = key(k);
            if let Some(len) = peek(&s, &kb) {
                items += 1;
                bytes += kb.len() + len + ITEM_OVERHEAD;
            }
        }
        prop_assert_eq!(st.curr_items, items);
        prop_assert_eq!(st.bytes as usize, bytes);
    }
}

/// LRU model: keys from least to most recently used, with their charges.
struct Lru {
    order: VecDeque<(usize, usize)>,
    used: usize,
    limit: usize,
}

impl Lru {
    fn pos(&self, k: usize) -> Option<usize> {
        self.order.iter().position(|&(key, _)| key == k)
    }

    fn remove(&mut self, k: usize) -> Option<usize> {
        let i = self.pos(k)?;
        let (_, c) = self.order.remove(i)?;
        self.used -= c;
        Some(c)
    }

    fn get(&mut self, k: usize) -> bool {
        match self.pos(k) {
            Some(i) => {
                let e = self.order.remove(i).expect("position is in range");
                self.order.push_back(e);
                true
            }
            None => false,
        }
    }

    /// A plain set: evict least recently used items (never `k` itself) until the
    /// new charge fits in place of `k`'s old one.
    fn set(&mut self, k: usize, charge: usize) -> bool {
        if charge > self.limit {
            self.remove(k);
            return false;
        }
        let old = self.pos(k).map_or(0, |i| self.order[i].1);
        while self.used - old + charge > self.limit {
            // charge <= limit, so some other key is using the memory.
            let i = self
                .order
                .iter()
                .position(|&(key, _)| key != k)
                .expect("a victim");
            let (_, c) = self.order.remove(i).expect("position is in range");
            self.used -= c;
        }
        self.remove(k);
        self.order.push_back((k, charge));
        self.used += charge;
        true
    }
}

#[derive(Clone, Debug)]
enum LruOp {
    Set(usize, usize),
    Get(usize),
    Delete(usize),
}

fn lru_op() -> impl Strategy<Value = LruOp> {
    prop_oneof![
        5 => (0..KEYS, 0usize..1_500).prop_map(|(k, len)| LruOp::Set(k, len)),
        4 => (0..KEYS).prop_map(LruOp::Get),
        1 => (0..KEYS).prop_map(LruOp::Delete),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn lru_single_shard_matches_model(
        limit in 500usize..6_000,
        ops in prop::collection::vec(lru_op(), 1..300),
    ) {
        let clock = Arc::new(ManualClock::new(T0));
        let config = StoreConfig { memory_limit: limit, item_size_max: 1 << 20, policy: Policy::Lru, shards: 1, max_items: 0 };
        let s = Store::new(config, clock);
        let mut model = Lru { order: VecDeque::new(), used: 0, limit };
        for op in &ops {
            match *op {
                LruOp::Set(k, len) => {
                    let kb = key(k);
                    let stored = matches!(s.set(&SetRequest::new(SetMode::Set, &kb, &vec![0; len])), SetStatus::Stored { .. });
                    prop_assert_eq!(stored, model.set(k, kb.len() + len + ITEM_OVERHEAD));
                }
                LruOp::Get(k) => prop_assert_eq!(s.get(&key(k)).is_some(), model.get(k)),
                LruOp::Delete(k) => prop_assert_eq!(s.delete(&key(k)), model.remove(k).is_some()),
            }
            let present: Vec<usize> = (0..KEYS).filter(|&k| peek(&s, &key(k)).is_some()).collect();
            let mut expected: Vec<usize> = model.order.iter().map(|&(k, _)| k).collect();
            expected.sort_unstable();
            prop_assert_eq!(present, expected, "after {:?}", op);
            prop_assert_eq!(s.stats().bytes as usize, model.used);
        }
    }
}

/// Four threads store, read, delete and increment random keys in a small store while
/// a fifth keeps reading `stats()`: the charged bytes never exceed the limit.
#[test]
fn threads_never_exceed_the_limit() {
    use rand::{Rng, SeedableRng};
    for policy in [Policy::Lru, Policy::Lfu, Policy::Largest, Policy::None] {
        let limit = 64 * 1024;
        let config = StoreConfig {
            memory_limit: limit,
            item_size_max: 16 * 1024,
            policy,
            shards: 8,
            max_items: 0,
        };
        let s = Arc::new(Store::new(config, Arc::new(ManualClock::new(T0))));
        let done = Arc::new(AtomicBool::new(false));
        let monitor = {
            let (s, done) = (s.clone(), done.clone());
            std::thread::spawn(move || {
                let mut checks = 0u64;
                while !done.load(Ordering::Relaxed) {
                    let b = s.stats().bytes as usize;
                    assert!(b <= limit, "{policy}: {b} > {limit}");
                    checks += 1;
                }
                checks
            })
        };
        let workers: Vec<_> = (0..4u64)
            .map(|t| {
                let s = s.clone();
                std::thread::spawn(move || {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                    let value = vec![b'1'; 12 * 1024];
                    for _ in 0..20_000 {
                        let k = key(rng.gen_range(0..500));
                        match rng.gen_range(0..10) {
                            0..=3 => {
                                let len = if rng.gen_bool(0.05) {
                                    rng.gen_range(0..12 * 1024)
                                } else {
                                    rng.gen_range(0..300)
                                };
                                s.set(&SetRequest::new(SetMode::Set, &k, &value[..len]));
                            }
                            4..=7 => {
                                s.get(&k);
                            }
                            8 => {
                                s.delete(&k);
                            }
                            _ => {
                                s.arith(&k, &ArithRequest::new(true, 1));
                            }
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        done.store(true, Ordering::Relaxed);
        assert!(monitor.join().unwrap() > 0);
        let st = s.stats();
        assert!(st.bytes as usize <= limit);
        // Everything linked is accounted: bytes equal the sum over linked items.
        let mut items = 0;
        let mut bytes = 0;
        for k in 0..500 {
            let kb = key(k);
            if let Some(len) = peek(&s, &kb) {
                items += 1;
                bytes += kb.len() + len + ITEM_OVERHEAD;
            }
        }
        assert_eq!(
            (st.curr_items, st.bytes as usize),
            (items, bytes),
            "{policy}"
        );
        if policy != Policy::None {
            assert!(
                st.evictions > 0,
                "{policy}: the test should have forced evictions"
            );
        }
    }
}
