//! The entry bound (`StoreConfig::max_items`, `kvlab server --cache-items`): the item count never
//! passes it under any eviction policy, the victim is the policy's, a replacement takes no
//! slot, and over a durable store the keys it pushes out stay readable from disk.

use std::sync::Arc;
use std::time::Duration;

use kvlab_store::{
    Durability, DurableConfig, ManualClock, Policy, SetMode, SetRequest, SetStatus, Store,
    StoreConfig,
};

const T0: u64 = 1_700_000_000;

fn store(policy: Policy, max_items: usize, shards: usize) -> Store {
    let config = StoreConfig {
        policy,
        shards,
        max_items,
        ..StoreConfig::default()
    };
    Store::new(config, Arc::new(ManualClock::new(T0)))
}

fn set(s: &Store, key: &str) {
    let r = SetRequest::new(SetMode::Set, key.as_bytes(), b"value");
    assert!(
        matches!(s.set(&r), SetStatus::Stored { .. }),
        "set {key} failed"
    );
}

fn has(s: &Store, key: &str) -> bool {
    s.peek(key.as_bytes()).is_some()
}

#[test]
fn the_count_never_passes_the_bound_under_any_policy() {
    for policy in [Policy::Fifo, Policy::Lru, Policy::Lfu, Policy::Largest] {
        for shards in [1, 8] {
            let s = store(policy, 50, shards);
            for i in 0..1000 {
                set(&s, &format!("k{i}"));
                let n = s.stats().curr_items;
                assert!(n <= 50, "{policy} with {shards} shards: {n} items");
            }
            let st = s.stats();
            assert_eq!(st.curr_items, 50, "{policy}: the bound is also reached");
            assert_eq!(st.evictions, 950, "{policy}: one eviction per new key");
            // Replacing a key takes no slot: nothing more goes.
            set(&s, "k999");
            assert_eq!(s.stats().evictions, 950, "{policy}: a replacement evicted");
        }
    }
}

#[test]
fn concurrent_writers_stay_within_the_bound() {
    for policy in [Policy::Fifo, Policy::Lru, Policy::Lfu] {
        let s = Arc::new(store(policy, 100, 8));
        let writers: Vec<_> = (0..4)
            .map(|t| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for i in 0..3000 {
                        set(&s, &format!("t{t}-k{}", i % 700));
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        let n = s.stats().curr_items;
        assert!((1..=100).contains(&n), "{policy}: {n} items");
    }
}

#[test]
fn the_victim_is_the_policys() {
    // fifo: the oldest stores go, reads or not.
    let s = store(Policy::Fifo, 10, 1);
    for i in 0..30 {
        set(&s, &format!("k{i}"));
        s.get(b"k0");
    }
    assert!(!has(&s, "k0") && has(&s, "k20") && has(&s, "k29"));
    // lru: a key read before every store stays.
    let s = store(Policy::Lru, 10, 1);
    for i in 0..30 {
        set(&s, &format!("k{i}"));
        s.get(b"k0");
    }
    assert!(has(&s, "k0") && !has(&s, "k1") && has(&s, "k29"));
    // lfu: a key read often stays, though it is the oldest.
    let s = store(Policy::Lfu, 10, 1);
    set(&s, "hot");
    for _ in 0..20 {
        s.get(b"hot");
    }
    for i in 0..30 {
        set(&s, &format!("k{i}"));
    }
    assert!(has(&s, "hot") && has(&s, "k29"));
    // none: a new key is refused at the bound, as beyond the memory limit.
    let s = store(Policy::None, 3, 1);
    for i in 0..3 {
        set(&s, &format!("k{i}"));
    }
    let r = SetRequest::new(SetMode::Set, b"k3", b"v");
    assert_eq!(s.set(&r), SetStatus::OutOfMemory);
    set(&s, "k0"); // a replacement still fits
}

#[test]
fn a_durable_cache_bounded_by_items_keeps_every_key_on_disk() {
    for policy in [Policy::Fifo, Policy::Lru, Policy::Lfu] {
        let dir = tempfile::tempdir().unwrap();
        let config = StoreConfig {
            policy,
            shards: 4,
            max_items: 20,
            ..StoreConfig::default()
        };
        let durable = DurableConfig {
            dir: dir.path().to_path_buf(),
            durability: Durability::Interval,
            flush_interval: Duration::from_secs(3600),
        };
        let s = Store::open(config, Arc::new(ManualClock::new(T0)), durable).unwrap();
        for i in 0..300 {
            set(&s, &format!("k{i}"));
        }
        assert!(s.stats().curr_items <= 20);
        for i in 0..300 {
            let key = format!("k{i}");
            // As the server reads a miss: through the disk, into the cache.
            assert!(s.load(key.as_bytes()).unwrap(), "{policy}: {key} lost");
            assert!(s.get(key.as_bytes()).is_some());
            let n = s.stats().curr_items;
            assert!(n <= 20, "{policy}: {n} items after loading {key}");
        }
    }
}

#[test]
fn a_small_bound_keeps_enough_items_per_shard() {
    let auto = |items| store(Policy::Lru, items, 0).config().shards;
    assert_eq!(auto(100), 1);
    assert_eq!(auto(300), 4);
    assert!(auto(1 << 20) >= 64.min(auto(0)));
    assert_eq!(
        store(Policy::Lru, 100, 8).config().shards,
        8,
        "an explicit count stays"
    );
}
