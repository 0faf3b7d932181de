//! Unit tests of the store's command semantics, driven by a `ManualClock`.

use super::*;
use crate::clock::{ManualClock, REALTIME_MAXDELTA};
use crate::item::{Value, ITEM_OVERHEAD};

const T0: u64 = 1_700_000_000;
const DAY: i64 = 86_400;

fn store_with(policy: Policy, memory_limit: usize, shards: usize) -> (Store, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(T0));
    let config = StoreConfig {
        memory_limit,
        item_size_max: 1 << 20,
        policy,
        shards,
        max_items: 0,
    };
    (Store::new(config, clock.clone()), clock)
}

fn store() -> (Store, Arc<ManualClock>) {
    store_with(Policy::Lru, 64 << 20, 4)
}

fn req<'a>(mode: SetMode, key: &'a [u8], value: &'a [u8]) -> SetRequest<'a> {
    SetRequest::new(mode, key, value)
}

fn set(s: &Store, key: &[u8], value: &[u8]) -> SetStatus {
    s.set(&req(SetMode::Set, key, value))
}

fn set_ttl(s: &Store, key: &[u8], value: &[u8], exptime: i64) -> SetStatus {
    s.set(&SetRequest {
        exptime,
        ..req(SetMode::Set, key, value)
    })
}

fn cas_of(st: SetStatus) -> u64 {
    match st {
        SetStatus::Stored { cas } => cas,
        other => panic!("expected Stored, got {other:?}"),
    }
}

fn val(s: &Store, key: &[u8]) -> Option<Vec<u8>> {
    s.get(key).map(|v| v.value.to_vec())
}

fn charge(key: &str, value_len: usize) -> usize {
    key.len() + value_len + ITEM_OVERHEAD
}

#[test]
fn set_get_basics() {
    let (s, _) = store();
    assert_eq!(val(&s, b"a"), None);
    let c1 = cas_of(s.set(&SetRequest {
        flags: 7,
        ..req(SetMode::Set, b"a", b"hello")
    }));
    let got = s.get(b"a").unwrap();
    assert_eq!(&*got.value, b"hello");
    assert_eq!(got.flags, 7);
    assert_eq!(got.cas, c1);
    assert_eq!(got.exptime, 0);
    let c2 = cas_of(set(&s, b"a", b"world"));
    assert_ne!(c1, c2);
    assert_eq!(val(&s, b"a").as_deref(), Some(&b"world"[..]));
    // A value handed out earlier is unaffected by the overwrite.
    assert_eq!(&*got.value, b"hello");
    let st = s.stats();
    assert_eq!((st.get_hits, st.get_misses), (2, 1));
    assert_eq!((st.curr_items, st.total_items), (1, 2));
    assert_eq!(st.bytes as usize, charge("a", 5));
    assert_eq!(st.limit_maxbytes, 64 << 20);
}

#[test]
fn cas_values_are_unique_across_shards() {
    let (s, _) = store_with(Policy::Lru, 64 << 20, 8);
    let mut seen = std::collections::HashSet::new();
    for i in 0..1000 {
        assert!(seen.insert(cas_of(set(&s, format!("k{i}").as_bytes(), b"v"))));
    }
    let c1 = cas_of(set(&s, b"k1", b"v"));
    let c2 = cas_of(set(&s, b"k1", b"v"));
    assert!(c2 > c1, "CAS increases per key");
}

#[test]
fn ttl_relative() {
    let (s, clock) = store();
    assert!(matches!(
        set_ttl(&s, b"k", b"v", 10),
        SetStatus::Stored { .. }
    ));
    assert_eq!(s.get(b"k").unwrap().exptime, T0 + 10);
    clock.advance(9);
    assert!(s.get(b"k").is_some());
    clock.advance(1);
    assert!(s.get(b"k").is_none());
    let st = s.stats();
    assert_eq!(
        (st.get_expired, st.get_misses, st.curr_items, st.bytes),
        (1, 1, 0, 0)
    );
}

#[test]
fn a_past_exptime_keeps_the_item_linked_expired() {
    let (s, _clock) = store();
    // Negative, and an absolute time before now: stored, counted, invisible.
    set_ttl(&s, b"neg", b"v", -1);
    set_ttl(&s, b"old", b"v", REALTIME_MAXDELTA + 1);
    set(&s, b"touched", b"v");
    assert!(s.touch(b"touched", -1));
    let st = s.stats();
    assert_eq!((st.curr_items, st.total_items), (3, 3));
    for key in [&b"neg"[..], b"old", b"touched"] {
        assert!(s.get(key).is_none());
    }
    let st = s.stats();
    assert_eq!(
        (st.get_expired, st.get_misses, st.curr_items, st.bytes),
        (3, 3, 0, 0)
    );
    // A set that takes the place of a dead item reclaims it.
    set_ttl(&s, b"neg", b"v", -1);
    set(&s, b"neg", b"w");
    let st = s.stats();
    assert_eq!((st.reclaimed, st.expired_unfetched), (1, 1));
    assert_eq!(val(&s, b"neg").unwrap(), b"w");
}

#[test]
fn ttl_thirty_days_is_relative_and_beyond_is_absolute() {
    let (s, clock) = store();
    set_ttl(&s, b"rel", b"v", REALTIME_MAXDELTA);
    assert_eq!(
        s.get(b"rel").unwrap().exptime,
        T0 + REALTIME_MAXDELTA as u64
    );
    // 30 days + 1 second is an absolute time in 1970: already expired.
    assert!(matches!(
        set_ttl(&s, b"old", b"v", REALTIME_MAXDELTA + 1),
        SetStatus::Stored { .. }
    ));
    assert!(s.get(b"old").is_none());
    // An absolute time in the future.
    set_ttl(&s, b"abs", b"v", (T0 + 100) as i64);
    assert_eq!(s.get(b"abs").unwrap().exptime, T0 + 100);
    clock.set(T0 + 99);
    assert!(s.get(b"abs").is_some());
    clock.set(T0 + 100);
    assert!(s.get(b"abs").is_none());
    assert!(s.get(b"rel").is_some());
    clock.set(T0 + 30 * DAY as u64);
    assert!(s.get(b"rel").is_none());
}

#[test]
fn negative_ttl_stores_invisibly_and_replaces() {
    let (s, _) = store();
    set(&s, b"k", b"old");
    assert!(matches!(
        set_ttl(&s, b"k", b"new", -1),
        SetStatus::Stored { .. }
    ));
    assert_eq!(val(&s, b"k"), None);
    let st = s.stats();
    assert_eq!((st.curr_items, st.bytes), (0, 0));
    // add sees nothing live, so it stores.
    assert!(matches!(
        s.set(&req(SetMode::Add, b"k", b"x")),
        SetStatus::Stored { .. }
    ));
}

#[test]
fn add_and_replace() {
    let (s, clock) = store();
    assert_eq!(
        s.set(&req(SetMode::Replace, b"k", b"v")),
        SetStatus::NotStored
    );
    assert!(matches!(
        s.set(&req(SetMode::Add, b"k", b"v1")),
        SetStatus::Stored { .. }
    ));
    assert_eq!(s.set(&req(SetMode::Add, b"k", b"v2")), SetStatus::NotStored);
    assert_eq!(val(&s, b"k").unwrap(), b"v1");
    assert!(matches!(
        s.set(&req(SetMode::Replace, b"k", b"v3")),
        SetStatus::Stored { .. }
    ));
    assert_eq!(val(&s, b"k").unwrap(), b"v3");
    // An expired item counts as absent.
    set_ttl(&s, b"e", b"v", 5);
    clock.advance(5);
    assert_eq!(
        s.set(&req(SetMode::Replace, b"e", b"v")),
        SetStatus::NotStored
    );
    assert!(matches!(
        s.set(&req(SetMode::Add, b"e", b"v")),
        SetStatus::Stored { .. }
    ));
}

#[test]
fn append_prepend_keep_flags_and_exptime() {
    let (s, _) = store();
    assert_eq!(
        s.set(&req(SetMode::Append, b"k", b"x")),
        SetStatus::NotStored
    );
    assert_eq!(
        s.set(&req(SetMode::Prepend, b"k", b"x")),
        SetStatus::NotStored
    );
    s.set(&SetRequest {
        flags: 5,
        exptime: 100,
        ..req(SetMode::Set, b"k", b"mid")
    });
    let c0 = s.get(b"k").unwrap().cas;
    let app = SetRequest {
        flags: 9,
        exptime: 0,
        ..req(SetMode::Append, b"k", b"-end")
    };
    let c1 = cas_of(s.set(&app));
    assert_ne!(c0, c1);
    cas_of(s.set(&SetRequest {
        flags: 9,
        exptime: 0,
        ..req(SetMode::Prepend, b"k", b"start-")
    }));
    let got = s.get(b"k").unwrap();
    assert_eq!(&*got.value, b"start-mid-end");
    assert_eq!(got.flags, 5);
    assert_eq!(got.exptime, T0 + 100);
    assert_eq!(s.stats().bytes as usize, charge("k", 13));
    // With a CAS: mismatch is Exists, match appends.
    let bad = SetRequest {
        compare_cas: Some(got.cas + 1),
        ..req(SetMode::Append, b"k", b"!")
    };
    assert_eq!(s.set(&bad), SetStatus::Exists);
    let good = SetRequest {
        compare_cas: Some(got.cas),
        ..req(SetMode::Append, b"k", b"!")
    };
    assert!(matches!(s.set(&good), SetStatus::Stored { .. }));
    assert_eq!(val(&s, b"k").unwrap(), b"start-mid-end!");
}

#[test]
fn append_beyond_item_size_max_is_not_stored() {
    let (s, _) = store();
    let half = vec![b'x'; 600_000];
    set(&s, b"k", &half);
    assert_eq!(
        s.set(&req(SetMode::Append, b"k", &half)),
        SetStatus::NotStored
    );
    assert_eq!(val(&s, b"k").unwrap().len(), 600_000);
}

#[test]
fn cas_semantics_and_stats() {
    let (s, _) = store();
    let cas_req = |c: u64| SetRequest {
        compare_cas: Some(c),
        ..req(SetMode::Set, b"k", b"new")
    };
    assert_eq!(s.set(&cas_req(1)), SetStatus::NotFound);
    let c = cas_of(set(&s, b"k", b"old"));
    assert_eq!(s.set(&cas_req(c + 1)), SetStatus::Exists);
    assert_eq!(val(&s, b"k").unwrap(), b"old");
    let c2 = cas_of(s.set(&cas_req(c)));
    assert_ne!(c2, c);
    assert_eq!(val(&s, b"k").unwrap(), b"new");
    // The old CAS no longer matches.
    assert_eq!(s.set(&cas_req(c)), SetStatus::Exists);
    // Replace + CAS behaves as cas.
    let r = SetRequest {
        compare_cas: Some(c2),
        ..req(SetMode::Replace, b"k", b"r")
    };
    assert!(matches!(s.set(&r), SetStatus::Stored { .. }));
    // Add ignores the CAS.
    let a = SetRequest {
        compare_cas: Some(12345),
        ..req(SetMode::Add, b"fresh", b"a")
    };
    assert!(matches!(s.set(&a), SetStatus::Stored { .. }));
    let st = s.stats();
    assert_eq!((st.cas_misses, st.cas_badval, st.cas_hits), (1, 2, 2));
}

#[test]
fn explicit_new_cas() {
    let (s, _) = store();
    let st = s.set(&SetRequest {
        new_cas: Some(999),
        ..req(SetMode::Set, b"k", b"v")
    });
    assert_eq!(st, SetStatus::Stored { cas: 999 });
    assert_eq!(s.get(b"k").unwrap().cas, 999);
    let next = SetRequest {
        compare_cas: Some(999),
        ..req(SetMode::Set, b"k", b"w")
    };
    assert!(matches!(s.set(&next), SetStatus::Stored { .. }));
}

#[test]
fn too_large_items() {
    let (s, _) = store();
    set(&s, b"k", b"small");
    // A value of exactly 1 MiB does not fit -I 1m, like memcached.
    let mib = vec![0u8; 1 << 20];
    assert_eq!(set(&s, b"k", &mib), SetStatus::TooLarge);
    // The failed set removed the old value.
    assert_eq!(val(&s, b"k"), None);
    let max_value = (1 << 20) - ITEM_OVERHEAD - 1;
    assert!(matches!(
        set(&s, b"k", &mib[..max_value]),
        SetStatus::Stored { .. }
    ));
    assert_eq!(set(&s, b"k", &mib[..max_value + 1]), SetStatus::TooLarge);
    // Other modes leave the old item alone.
    set(&s, b"k", b"small");
    assert_eq!(
        s.set(&req(SetMode::Replace, b"k", &mib)),
        SetStatus::TooLarge
    );
    assert_eq!(val(&s, b"k").unwrap(), b"small");
    let long_key = vec![b'k'; MAX_KEY_LEN + 1];
    assert_eq!(set(&s, &long_key, b"v"), SetStatus::TooLarge);
    assert!(matches!(
        set(&s, &long_key[..MAX_KEY_LEN], b"v"),
        SetStatus::Stored { .. }
    ));
}

#[test]
fn larger_than_memory_is_out_of_memory() {
    let (s, _) = store_with(Policy::Lru, 1000, 1);
    set(&s, b"k", b"v");
    assert_eq!(set(&s, b"k", &[0u8; 1000]), SetStatus::OutOfMemory);
    assert_eq!(val(&s, b"k"), None);
    assert_eq!(s.stats().bytes, 0);
}

fn incr(s: &Store, key: &[u8], delta: u64) -> ArithStatus {
    s.arith(key, &ArithRequest::new(true, delta))
}

fn decr(s: &Store, key: &[u8], delta: u64) -> ArithStatus {
    s.arith(key, &ArithRequest::new(false, delta))
}

fn arith_value(st: ArithStatus) -> u64 {
    match st {
        ArithStatus::Ok { value, .. } => value,
        other => panic!("expected Ok, got {other:?}"),
    }
}

#[test]
fn incr_decr() {
    let (s, _) = store();
    assert_eq!(incr(&s, b"n", 1), ArithStatus::NotFound);
    assert_eq!(decr(&s, b"n", 1), ArithStatus::NotFound);
    s.set(&SetRequest {
        flags: 3,
        exptime: 50,
        ..req(SetMode::Set, b"n", b"10")
    });
    let c0 = s.get(b"n").unwrap().cas;
    let ArithStatus::Ok { value, cas, ttl } = incr(&s, b"n", 5) else {
        panic!()
    };
    assert_eq!((value, ttl), (15, 50));
    assert_ne!(cas, c0);
    let got = s.get(b"n").unwrap();
    assert_eq!(
        (&*got.value, got.flags, got.exptime, got.cas),
        (&b"15"[..], 3, T0 + 50, cas)
    );
    // decr to a shorter number: space-padded to the old length, as memcached does.
    assert_eq!(arith_value(decr(&s, b"n", 6)), 9);
    assert_eq!(val(&s, b"n").unwrap(), b"9 ");
    // decr floors at 0.
    assert_eq!(arith_value(decr(&s, b"n", 100)), 0);
    assert_eq!(val(&s, b"n").unwrap(), b"0 ");
    set(&s, b"n", b"5");
    // incr wraps at 2^64.
    set(&s, b"n", b"18446744073709551615");
    assert_eq!(arith_value(incr(&s, b"n", 2)), 1);
    assert_eq!(
        val(&s, b"n").unwrap(),
        format!("1{}", " ".repeat(19)).as_bytes()
    );
    set(&s, b"n", b"18446744073709551615");
    assert_eq!(arith_value(incr(&s, b"n", u64::MAX)), u64::MAX - 1);
    let st = s.stats();
    assert_eq!(
        (st.incr_hits, st.incr_misses, st.decr_hits, st.decr_misses),
        (3, 1, 2, 1)
    );
}

#[test]
fn arith_non_numeric() {
    let (s, _) = store();
    for bad in [
        &b""[..],
        b"abc",
        b"12a",
        b"-1",
        b"18446744073709551616",
        b"x12",
    ] {
        set(&s, b"n", bad);
        assert_eq!(incr(&s, b"n", 1), ArithStatus::NonNumeric, "{bad:?}");
        assert_eq!(val(&s, b"n").unwrap(), bad);
    }
    set(&s, b"n", b"00000000000000000007");
    assert_eq!(arith_value(incr(&s, b"n", 1)), 8);
}

#[test]
fn arith_cas_vivify_touch() {
    let (s, clock) = store();
    let viv = ArithRequest {
        vivify: Some((42, 100)),
        ..ArithRequest::new(true, 5)
    };
    let ArithStatus::Ok { value, cas, ttl } = s.arith(b"v", &viv) else {
        panic!()
    };
    assert_eq!((value, ttl), (42, 100));
    assert_eq!(s.get(b"v").unwrap().cas, cas);
    assert_eq!(arith_value(s.arith(b"v", &viv)), 47);
    let bad = ArithRequest {
        compare_cas: Some(1),
        ..ArithRequest::new(true, 1)
    };
    assert_eq!(s.arith(b"v", &bad), ArithStatus::Exists);
    let c = s.get(b"v").unwrap().cas;
    let good = ArithRequest {
        compare_cas: Some(c),
        new_cas: Some(77),
        ..ArithRequest::new(false, 7)
    };
    assert_eq!(
        s.arith(b"v", &good),
        ArithStatus::Ok {
            value: 40,
            cas: 77,
            ttl: 100
        }
    );
    let t = ArithRequest {
        touch: Some(5),
        ..ArithRequest::new(true, 0)
    };
    assert!(matches!(
        s.arith(b"v", &t),
        ArithStatus::Ok {
            value: 40,
            ttl: 5,
            ..
        }
    ));
    clock.advance(5);
    assert_eq!(incr(&s, b"v", 1), ArithStatus::NotFound);
}

#[test]
fn touch_and_gat() {
    let (s, clock) = store();
    assert!(!s.touch(b"k", 10));
    assert!(s.get_and_touch(b"k", 10).is_none());
    set_ttl(&s, b"k", b"v", 10);
    assert!(s.touch(b"k", 100));
    clock.advance(50);
    let got = s.get_and_touch(b"k", 0).unwrap();
    assert_eq!((&*got.value, got.exptime), (&b"v"[..], 0));
    clock.advance(1000);
    assert!(s.get(b"k").is_some());
    // A negative TTL makes the item expire at once; gat still returns it.
    assert!(s.get_and_touch(b"k", -1).is_some());
    assert!(s.get(b"k").is_none());
    set(&s, b"k", b"v");
    assert!(s.touch(b"k", -1));
    assert!(s.get(b"k").is_none());
    let st = s.stats();
    // memcached counts gat in touch_* only.
    assert_eq!((st.touch_hits, st.touch_misses), (4, 2));
    assert_eq!((st.get_hits, st.get_misses), (1, 2));
    assert_eq!((st.curr_items, st.bytes), (0, 0));
}

#[test]
fn delete() {
    let (s, clock) = store();
    assert!(!s.delete(b"k"));
    set(&s, b"k", b"v");
    assert!(s.delete(b"k"));
    assert!(!s.delete(b"k"));
    set_ttl(&s, b"e", b"v", 1);
    clock.advance(1);
    assert!(!s.delete(b"e"));
    let st = s.stats();
    assert_eq!(
        (st.delete_hits, st.delete_misses, st.curr_items, st.bytes),
        (1, 3, 0, 0)
    );
}

#[test]
fn flush_all_now() {
    let (s, _) = store();
    for i in 0..10 {
        set(&s, format!("k{i}").as_bytes(), b"v");
    }
    s.flush_all(0);
    // Same second: a set right after the flush is visible, older items are not.
    set(&s, b"k0", b"new");
    assert_eq!(val(&s, b"k0").unwrap(), b"new");
    for i in 1..10 {
        assert_eq!(val(&s, format!("k{i}").as_bytes()), None);
    }
    let st = s.stats();
    assert_eq!(st.get_flushed, 9);
    // Unreached flushed items still count until reclaimed.
    set(&s, b"x", b"v");
    s.flush_all(-1);
    assert_eq!(s.reclaim_expired(), 2);
    let st = s.stats();
    // The two, and the flushed `k0` the set after the first flush took the place of.
    assert_eq!((st.curr_items, st.bytes, st.reclaimed), (0, 0, 3));
}

#[test]
fn flush_all_delayed() {
    let (s, clock) = store();
    set(&s, b"a", b"v");
    s.flush_all(10);
    clock.advance(5);
    set(&s, b"b", b"v");
    assert!(s.get(b"a").is_some());
    clock.advance(5);
    // The moment came: everything stored before it is gone.
    assert!(s.get(b"a").is_none());
    assert!(s.get(b"b").is_none());
    set(&s, b"c", b"v");
    assert!(s.get(b"c").is_some());
    clock.advance(100);
    assert!(s.get(b"c").is_some(), "a delayed flush happens once");
    // A later flush_all replaces a pending one.
    s.flush_all(10);
    s.flush_all(20);
    clock.advance(10);
    assert!(s.get(b"c").is_some());
    clock.advance(10);
    assert!(s.get(b"c").is_none());
    // Absolute moment.
    set(&s, b"d", b"v");
    s.flush_all((clock.now() + 3) as i64 + REALTIME_MAXDELTA);
    clock.advance(3);
    assert!(s.get(b"d").is_some());
    s.flush_all((clock.now() + 3) as i64);
    clock.advance(2);
    assert!(s.get(b"d").is_some());
    clock.advance(1);
    assert!(s.get(b"d").is_none());
}

#[test]
fn meta_get_vivify_and_win_tokens() {
    let (s, _) = store();
    let viv = MetaGetOpts {
        vivify: Some(30),
        ..Default::default()
    };
    let first = s.meta_get(b"k", &viv).unwrap();
    assert!(first.won && !first.win_already_sent && !first.stale && !first.hit_before);
    assert_eq!((first.item.value.len(), first.ttl), (0, 30));
    let second = s.meta_get(b"k", &viv).unwrap();
    assert!(!second.won && second.win_already_sent);
    let plain = s.meta_get(b"k", &MetaGetOpts::default()).unwrap();
    assert!(plain.win_already_sent && !plain.won);
    // A set replaces the placeholder and clears the token.
    set(&s, b"k", b"real");
    let after = s.meta_get(b"k", &viv).unwrap();
    assert!(!after.won && !after.win_already_sent);
    assert_eq!(&*after.item.value, b"real");
    assert!(s.meta_get(b"missing", &MetaGetOpts::default()).is_none());
    let st = s.stats();
    assert_eq!((st.get_hits, st.get_misses), (4, 1));
}

#[test]
fn meta_delete_invalidate_then_win_once() {
    let (s, _) = store();
    let c0 = cas_of(set(&s, b"k", b"v"));
    let inv = MetaDeleteOpts {
        invalidate: true,
        ttl: Some(30),
        ..Default::default()
    };
    assert_eq!(s.meta_delete(b"k", &inv), DeleteStatus::Deleted);
    let a = s.meta_get(b"k", &MetaGetOpts::default()).unwrap();
    assert!(a.stale && a.won && !a.win_already_sent);
    assert_eq!(a.ttl, 30);
    assert!(a.item.cas > c0, "invalidation bumps the CAS");
    let b = s.meta_get(b"k", &MetaGetOpts::default()).unwrap();
    assert!(b.stale && !b.won && b.win_already_sent);
    // Invalidating again resets the token.
    s.meta_delete(b"k", &inv);
    assert!(s.meta_get(b"k", &MetaGetOpts::default()).unwrap().won);
    // A plain set clears the stale state.
    set(&s, b"k", b"fresh");
    let c = s.meta_get(b"k", &MetaGetOpts::default()).unwrap();
    assert!(!c.stale && !c.won && !c.win_already_sent);
}

#[test]
fn meta_delete_cas_and_miss() {
    let (s, _) = store();
    let opts = |c| MetaDeleteOpts {
        compare_cas: Some(c),
        ..Default::default()
    };
    assert_eq!(
        s.meta_delete(b"k", &MetaDeleteOpts::default()),
        DeleteStatus::NotFound
    );
    let c = cas_of(set(&s, b"k", b"v"));
    assert_eq!(s.meta_delete(b"k", &opts(c + 1)), DeleteStatus::Exists);
    assert!(s.get(b"k").is_some());
    assert_eq!(s.meta_delete(b"k", &opts(c)), DeleteStatus::Deleted);
    assert!(s.get(b"k").is_none());
    let st = s.stats();
    assert_eq!((st.delete_hits, st.delete_misses), (1, 2));
}

#[test]
fn meta_set_invalidate_with_lower_cas_stores_stale() {
    let (s, clock) = store();
    let c1 = cas_of(set_ttl(&s, b"k", b"v1", 100));
    let inv = MetaDeleteOpts {
        invalidate: true,
        ..Default::default()
    };
    s.meta_delete(b"k", &inv);
    let stale = s.meta_get(b"k", &MetaGetOpts::default()).unwrap();
    assert!(stale.won);
    let c2 = stale.item.cas;
    assert!(c1 < c2);
    // Without invalidate a lower CAS is just a mismatch.
    let plain = SetRequest {
        compare_cas: Some(c1),
        ..req(SetMode::Set, b"k", b"v2")
    };
    assert_eq!(s.set(&plain), SetStatus::Exists);
    // With invalidate: stored, still stale, TTL and token kept.
    clock.advance(10);
    let ms = SetRequest {
        invalidate: true,
        exptime: 5000,
        ..plain.clone()
    };
    let c3 = cas_of(s.set(&ms));
    let m = s.meta_get(b"k", &MetaGetOpts::default()).unwrap();
    assert_eq!(&*m.item.value, b"v2");
    assert_eq!(m.item.cas, c3);
    assert!(m.stale && m.win_already_sent && !m.won);
    assert_eq!(m.ttl, 90);
    // A higher CAS with invalidate is a mismatch.
    let hi = SetRequest {
        compare_cas: Some(c3 + 1000),
        ..ms
    };
    assert_eq!(s.set(&hi), SetStatus::Exists);
}

#[test]
fn meta_get_recache() {
    let (s, clock) = store();
    set_ttl(&s, b"k", b"v", 100);
    let r = |secs| MetaGetOpts {
        recache: Some(secs),
        ..Default::default()
    };
    assert!(!s.meta_get(b"k", &r(30)).unwrap().won);
    clock.advance(75);
    let a = s.meta_get(b"k", &r(30)).unwrap();
    assert!(a.won && !a.win_already_sent);
    assert_eq!(a.ttl, 25);
    let b = s.meta_get(b"k", &r(30)).unwrap();
    assert!(!b.won && b.win_already_sent);
    // Items that never expire never trigger recache.
    set(&s, b"forever", b"v");
    let f = s.meta_get(b"forever", &r(u64::MAX)).unwrap();
    assert!(!f.won);
    assert_eq!(f.ttl, -1);
}

#[test]
fn meta_get_access_state_and_no_bump() {
    let (s, clock) = store();
    set(&s, b"k", b"v");
    clock.advance(7);
    let nb = MetaGetOpts {
        no_bump: true,
        ..Default::default()
    };
    let a = s.meta_get(b"k", &nb).unwrap();
    assert!(!a.hit_before);
    assert_eq!(a.last_access_age, 7);
    let b = s.meta_get(b"k", &MetaGetOpts::default()).unwrap();
    assert!(!b.hit_before, "no_bump left the item unfetched");
    assert_eq!(b.last_access_age, 7);
    clock.advance(3);
    let c = s.meta_get(b"k", &MetaGetOpts::default()).unwrap();
    assert!(c.hit_before);
    assert_eq!(c.last_access_age, 3);
    assert_eq!(s.meta_get(b"k", &nb).unwrap().last_access_age, 0);
    // peek counts nothing and changes nothing.
    let before = s.stats();
    clock.advance(4);
    let p = s.peek(b"k").unwrap();
    assert!(p.hit_before && !p.won);
    assert_eq!((p.last_access_age, p.ttl), (4, -1));
    assert!(s.peek(b"nope").is_none());
    assert_eq!(s.stats(), before);
}

#[test]
fn meta_get_touch() {
    let (s, clock) = store();
    let t = MetaGetOpts {
        touch: Some(20),
        ..Default::default()
    };
    assert!(s.meta_get(b"k", &t).is_none());
    set_ttl(&s, b"k", b"v", 5);
    let m = s.meta_get(b"k", &t).unwrap();
    assert_eq!((m.ttl, m.item.exptime), (20, T0 + 20));
    clock.advance(10);
    assert!(s.get(b"k").is_some());
    let st = s.stats();
    assert_eq!(
        (st.touch_hits, st.touch_misses, st.get_hits, st.get_misses),
        (1, 1, 1, 0)
    );
}

/// A shards=1 store that holds exactly `n` items with 1-byte keys and `vlen`-byte
/// values.
fn full_store(policy: Policy, n: usize, vlen: usize) -> (Store, Arc<ManualClock>) {
    store_with(policy, n * charge("k", vlen), 1)
}

fn keys_present(s: &Store, keys: &[&[u8]]) -> Vec<bool> {
    let peek = MetaGetOpts {
        no_bump: true,
        ..Default::default()
    };
    keys.iter()
        .map(|k| s.meta_get(k, &peek).is_some())
        .collect()
}

#[test]
fn lru_evicts_least_recently_used() {
    let (s, _) = full_store(Policy::Lru, 3, 10);
    for k in [b"a", b"b", b"c"] {
        set(&s, k, &[0; 10]);
    }
    s.get(b"a");
    set(&s, b"d", &[0; 10]);
    assert_eq!(
        keys_present(&s, &[b"a", b"b", b"c", b"d"]),
        [true, false, true, true]
    );
    let st = s.stats();
    assert_eq!(
        (st.evictions, st.evicted_unfetched, st.reclaimed),
        (1, 1, 0)
    );
    assert_eq!(st.bytes as usize, 3 * charge("k", 10));
}

#[test]
fn fifo_evicts_oldest_store() {
    let (s, _) = full_store(Policy::Fifo, 3, 10);
    for k in [b"a", b"b", b"c"] {
        set(&s, k, &[0; 10]);
    }
    s.get(b"a");
    s.get(b"a");
    set(&s, b"d", &[0; 10]);
    assert_eq!(
        keys_present(&s, &[b"a", b"b", b"c", b"d"]),
        [false, true, true, true]
    );
    assert_eq!(s.stats().evicted_unfetched, 0, "a had been fetched");
}

#[test]
fn lfu_evicts_least_frequently_used_ties_by_recency() {
    let (s, _) = full_store(Policy::Lfu, 4, 10);
    for k in [b"a", b"b", b"c", b"d"] {
        set(&s, k, &[0; 10]);
    }
    for k in [b"a", b"a", b"a", b"b", b"c", b"d", b"c"] {
        s.get(k);
    }
    // counts: a 3, b 1, c 2, d 1 (d more recent than b) → b goes first, then d.
    set(&s, b"e", &[0; 10]);
    assert_eq!(
        keys_present(&s, &[b"a", b"b", b"c", b"d", b"e"]),
        [true, false, true, true, true]
    );
    s.get(b"e");
    s.get(b"e");
    set(&s, b"f", &[0; 10]);
    assert_eq!(
        keys_present(&s, &[b"a", b"c", b"d", b"e", b"f"]),
        [true, true, false, true, true]
    );
}

#[test]
fn largest_evicts_largest_item() {
    let limit = charge("k", 10) + charge("k", 300) + charge("k", 20) + charge("k", 300);
    let (s, _) = store_with(Policy::Largest, limit, 1);
    set(&s, b"a", &[0; 10]);
    set(&s, b"b", &[0; 300]);
    set(&s, b"c", &[0; 20]);
    set(&s, b"d", &[0; 300]);
    s.get(b"b");
    set(&s, b"e", &[0; 50]);
    // b and d are the largest; b is the older one.
    assert_eq!(
        keys_present(&s, &[b"a", b"b", b"c", b"d", b"e"]),
        [true, false, true, true, true]
    );
}

#[test]
fn none_policy_fails_instead_of_evicting() {
    let (s, clock) = full_store(Policy::None, 3, 10);
    set_ttl(&s, b"a", &[0; 10], 5);
    set(&s, b"b", &[0; 10]);
    set(&s, b"c", &[0; 10]);
    assert_eq!(set(&s, b"d", &[0; 10]), SetStatus::OutOfMemory);
    assert_eq!(
        keys_present(&s, &[b"a", b"b", b"c", b"d"]),
        [true, true, true, false]
    );
    // Overwriting with the same size needs no new memory.
    assert!(matches!(set(&s, b"b", &[1; 10]), SetStatus::Stored { .. }));
    // A failed Set of an existing key unlinks it (memcached -M).
    assert_eq!(set(&s, b"c", &[1; 11]), SetStatus::OutOfMemory);
    assert_eq!(keys_present(&s, &[b"c"]), [false]);
    set(&s, b"c", &[0; 10]);
    // Expired items are reclaimed, live ones never evicted.
    clock.advance(5);
    assert!(matches!(set(&s, b"d", &[0; 10]), SetStatus::Stored { .. }));
    let st = s.stats();
    assert_eq!(
        (st.evictions, st.reclaimed, st.expired_unfetched),
        (0, 1, 1)
    );
    assert_eq!(incr(&s, b"x", 1), ArithStatus::NotFound);
    set_ttl(&s, b"d", b"9", 0);
    // Give the 9 bytes d freed to b: the store is exactly full again.
    assert!(matches!(set(&s, b"b", &[1; 19]), SetStatus::Stored { .. }));
    assert_eq!(s.stats().bytes as usize, s.config().memory_limit);
    // Growing "9" to "10" needs a byte the store can't free.
    assert_eq!(incr(&s, b"d", 1), ArithStatus::OutOfMemory);
    assert_eq!(val(&s, b"d").unwrap(), b"9");
    let viv = MetaGetOpts {
        vivify: Some(0),
        ..Default::default()
    };
    assert!(s.meta_get(b"v", &viv).is_none());
}

#[test]
fn expired_items_are_reclaimed_before_live_ones_are_evicted() {
    let (s, clock) = full_store(Policy::Lru, 3, 10);
    set_ttl(&s, b"a", &[0; 10], 5);
    set(&s, b"b", &[0; 10]);
    set(&s, b"c", &[0; 10]);
    s.get(b"a"); // a is now the most recently used …
    clock.advance(5); // … but expired.
    set(&s, b"d", &[0; 10]);
    assert_eq!(keys_present(&s, &[b"b", b"c", b"d"]), [true, true, true]);
    let st = s.stats();
    assert_eq!(
        (st.evictions, st.reclaimed, st.expired_unfetched),
        (0, 1, 0)
    );
}

#[test]
fn growing_overwrite_never_evicts_itself() {
    let (s, _) = full_store(Policy::Lru, 3, 10);
    for k in [b"a", b"b", b"c"] {
        set(&s, k, &[0; 10]);
    }
    // a is the LRU item; growing it must evict b, not a.
    let big = vec![1; 10 + charge("k", 10)];
    assert!(matches!(set(&s, b"a", &big), SetStatus::Stored { .. }));
    assert_eq!(keys_present(&s, &[b"a", b"b", b"c"]), [true, false, true]);
    assert_eq!(val(&s, b"a").unwrap(), big);
    let st = s.stats();
    assert_eq!(
        (st.curr_items, st.bytes as usize),
        (2, s.config().memory_limit)
    );
}

#[test]
fn eviction_crosses_shards_when_own_shard_is_empty() {
    let (s, _) = store_with(Policy::Lru, 20 * charge("key-00", 100), 16);
    for i in 0..200 {
        let st = set(&s, format!("key-{i:02}").as_bytes(), &[0; 100]);
        assert!(matches!(st, SetStatus::Stored { .. }), "{i}: {st:?}");
        assert!(s.stats().bytes as usize <= s.config().memory_limit);
    }
    // One item as large as the whole budget evicts everything else.
    let huge = vec![0; 20 * charge("key-00", 100) - ITEM_OVERHEAD - 3];
    assert!(matches!(set(&s, b"big", &huge), SetStatus::Stored { .. }));
    let st = s.stats();
    assert_eq!(
        (st.curr_items, st.bytes as usize),
        (1, s.config().memory_limit)
    );
}

#[test]
fn config_resolves_shards() {
    let (s, _) = store_with(Policy::Lru, 1 << 20, 5);
    assert_eq!(s.config().shards, 8);
    let auto = Store::new(StoreConfig::default(), Arc::new(ManualClock::new(0)));
    assert!(auto.config().shards >= 64 && auto.config().shards.is_power_of_two());
    // Large limits get enough shards for 24-bit slab indices.
    let big = Store::new(
        StoreConfig {
            memory_limit: 8 << 30,
            shards: 1,
            ..StoreConfig::default()
        },
        Arc::new(ManualClock::new(0)),
    );
    assert_eq!(big.config().shards, 16);
    let d = StoreConfig::default();
    assert_eq!(
        (d.memory_limit, d.item_size_max, d.policy, d.shards),
        (64 << 20, 1 << 20, Policy::Lru, 0)
    );
}

#[test]
fn clock_at_zero_works() {
    let clock = Arc::new(ManualClock::new(0));
    let s = Store::new(
        StoreConfig {
            shards: 1,
            ..StoreConfig::default()
        },
        clock.clone(),
    );
    set_ttl(&s, b"k", b"v", 1);
    assert!(s.get(b"k").is_some());
    clock.advance(1);
    assert!(s.get(b"k").is_none());
}

#[test]
fn parse_and_format_numbers() {
    let mut buf = [0; 20];
    for v in [0, 9, 10, 12345, u64::MAX] {
        let n = format_u64(v, &mut buf);
        assert_eq!(&buf[..n], v.to_string().as_bytes());
        assert_eq!(parse_counter(&buf[..n]), Some(v));
    }
}

#[test]
fn index_memory_per_item_is_small() {
    let (s, _) = store_with(Policy::Lru, 1 << 30, 1);
    let n = 100_000;
    for i in 0..n {
        set(&s, format!("key{i:07}").as_bytes(), b"v");
    }
    let per_item = s.index_bytes() as f64 / n as f64;
    // 32-byte entry + hash-table slot (5 bytes at 7/8 load ... 11 at 7/16).
    assert!(per_item < 50.0, "{per_item}");
}

/// The longest run of the newest keys `0..n` (newest = `n - 1`) all present.
fn newest_intact(s: &Store, n: usize) -> usize {
    (0..n)
        .rev()
        .take_while(|i| s.peek(format!("key{i}").as_bytes()).is_some())
        .count()
}

/// Issue 25 item 12: with 64 shards a 16 MiB store holds about 80 values of 200 KB,
/// one or two per shard, so evicting the coldest item of the storing key's shard
/// evicted items among the newest. `lru` evicts the store-wide coldest instead
/// (within `LRU_SLACK`, 1/64 of the limit): the newest items all stay.
#[test]
fn lru_evicts_store_wide_least_recently_used_large_values() {
    let limit = 16 << 20;
    let (s, _) = store_with(Policy::Lru, limit, 64);
    let value = vec![7u8; 200_000];
    let n = 400;
    for i in 0..n {
        let st = set(&s, format!("key{i}").as_bytes(), &value);
        assert!(matches!(st, SetStatus::Stored { .. }), "{st:?}");
    }
    let fits = limit / charge("key000", value.len());
    let items = s.stats().curr_items as usize;
    let run = newest_intact(&s, n);
    // Every item in memory is one of the newest (the slack is about one item).
    assert!(
        run >= items - 1 && items >= fits - 1,
        "newest intact run {run} of {items} items ({fits} fit)"
    );
}

/// memcached's t/lru.t, by shape: items fetched stay while unfetched older and
/// newer ones go, across shards.
#[test]
fn lru_keeps_fetched_large_values_across_shards() {
    let limit = 8 << 20;
    let (s, _) = store_with(Policy::Lru, limit, 64);
    let value = vec![7u8; 100_000];
    let fits = limit / charge("key000", value.len());
    for i in 0..fits - 2 {
        set(&s, format!("key{i}").as_bytes(), &value);
    }
    // Fetch the oldest ten, then store new items until all but the newest two
    // unfetched old ones went (the slack lets an eviction take an item up to
    // 1/256 of the limit younger than the coldest).
    for i in 0..10 {
        assert!(s.get(format!("key{i}").as_bytes()).is_some());
    }
    for i in 1000..1000 + fits - 14 {
        set(&s, format!("key{i}").as_bytes(), &value);
    }
    let kept: Vec<bool> = (0..10)
        .map(|i| s.peek(format!("key{i}").as_bytes()).is_some())
        .collect();
    assert_eq!(kept, [true; 10], "fetched items survive");
    // `fits` items fit: 10 fetched and `fits - 14` new ones leave room for 4 of
    // the unfetched old ones, which must be the newest of them.
    let unfetched_kept: Vec<usize> = (10..fits - 2)
        .filter(|i| s.peek(format!("key{i}").as_bytes()).is_some())
        .collect();
    assert!(
        unfetched_kept.len() <= 4 && unfetched_kept.iter().all(|&i| i + 6 >= fits),
        "unfetched old items kept: {unfetched_kept:?} ({fits} fit)"
    );
}

#[test]
fn big_item_evicts_many_small_ones_across_shards() {
    let (s, _) = store_with(Policy::Lru, 2 << 20, 64);
    let mut i = 0;
    while s.stats().evictions == 0 {
        set(&s, format!("small{i}").as_bytes(), &[0; 100]);
        i += 1;
    }
    let big = vec![1; (1 << 20) - ITEM_OVERHEAD - 3];
    assert!(matches!(set(&s, b"big", &big), SetStatus::Stored { .. }));
    assert_eq!(val(&s, b"big").unwrap().len(), big.len());
    assert!(s.stats().bytes as usize <= 2 << 20);
}

#[test]
fn shared_types_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Store>();
    check::<Value>();
    check::<ItemView>();
    check::<MetaView>();
}

/// A 2 MiB store with the default shard count is filled with 5000 64-byte values
/// (keys `s…`) and 16 values of 60–100 KB (keys `L…`, distinct sizes), without
/// eviction, then pushed past its limit by 2000 more small and 8 more large ones.
/// Returns the store and every store made (key, value length), in order.
fn mixed_workload(policy: Policy) -> (Store, Vec<(String, usize)>) {
    let (s, _) = store_with(policy, 2 << 20, 0);
    assert!(s.config().shards >= 64);
    let (mut sets, mut n_small, mut n_large) = (Vec::new(), 0, 0);
    for (small_n, large_n) in [(5_000, 16), (2_000, 8)] {
        let step = small_n / large_n;
        for j in 0..small_n {
            if j % step == 0 && j / step < large_n {
                sets.push((format!("L{n_large}"), 60_000 + (n_large * 7_919) % 40_001));
                n_large += 1;
            }
            sets.push((format!("s{n_small}"), 64));
            n_small += 1;
        }
        for (k, len) in &sets[sets.len() - small_n - large_n..] {
            let st = set(&s, k.as_bytes(), &vec![1; *len]);
            assert!(matches!(st, SetStatus::Stored { .. }), "{k}: {st:?}");
        }
        if small_n == 5_000 {
            assert_eq!(s.stats().evictions, 0, "phase 1 fits");
        }
    }
    assert!(s.stats().bytes <= 2 << 20);
    (s, sets)
}

/// Keys of `sets` with prefix `p` that are still stored, and how many were stored.
fn alive(s: &Store, sets: &[(String, usize)], p: &str) -> (Vec<String>, usize) {
    let keys: Vec<&String> = sets
        .iter()
        .map(|(k, _)| k)
        .filter(|k| k.starts_with(p))
        .collect();
    let n = keys.len();
    let live = keys.into_iter().filter(|k| s.peek(k.as_bytes()).is_some());
    (live.cloned().collect(), n)
}

#[test]
fn largest_evicts_store_wide_largest_first() {
    let (s, sets) = mixed_workload(Policy::Largest);
    let (lru, lru_sets) = mixed_workload(Policy::Lru);
    let ((small_ok, n_small), (large_ok, n_large)) = (alive(&s, &sets, "s"), alive(&s, &sets, "L"));
    let (lru_small_ok, _) = alive(&lru, &lru_sets, "s");
    let (lru_large_ok, _) = alive(&lru, &lru_sets, "L");
    eprintln!(
        "largest: small {}/{n_small}, large {}/{n_large}, {} evictions; \
         lru: small {}/{n_small}, large {}/{n_large}, {} evictions",
        small_ok.len(),
        large_ok.len(),
        s.stats().evictions,
        lru_small_ok.len(),
        lru_large_ok.len(),
        lru.stats().evictions,
    );
    // Every small item survives, and the large ones left are exactly those a single
    // store-wide largest-first order leaves (replayed on the charges: each store
    // evicts until it fits, then is linked).
    assert_eq!(small_ok.len(), n_small);
    let (mut live, mut bytes): (Vec<(&str, usize)>, usize) = (Vec::new(), 0);
    for (k, len) in &sets {
        let c = charge(k, *len);
        while bytes + c > 2 << 20 {
            let (i, _) = live
                .iter()
                .enumerate()
                .max_by_key(|(_, (_, c))| *c)
                .unwrap();
            bytes -= live.remove(i).1;
        }
        live.push((k, c));
        bytes += c;
    }
    let model: Vec<&str> = live
        .iter()
        .map(|(k, _)| *k)
        .filter(|k| k.starts_with('L'))
        .collect();
    assert_eq!(large_ok, model);
    let st = s.stats();
    assert_eq!(st.evictions as usize, n_large - large_ok.len());
    assert_eq!(st.evicted_unfetched, st.evictions);
    assert_eq!(st.bytes as usize, bytes);
    // Per-shard LRU loses many small items on the same sequence.
    assert!(
        lru_small_ok.len() < n_small * 9 / 10,
        "{}",
        lru_small_ok.len()
    );
}

#[test]
fn largest_growing_overwrite_never_evicts_itself_across_shards() {
    let (s, _) = store_with(Policy::Largest, 64 << 10, 64);
    // "big" is the store-wide largest item; then fill up with 1-4 KB items.
    set(&s, b"big", &[0; 20_000]);
    let mut i = 0;
    while s.stats().evictions == 0 {
        set(
            &s,
            format!("k{i}").as_bytes(),
            &vec![0; 1_000 + (i * 37) % 3_000],
        );
        i += 1;
    }
    // The store just evicted big, the largest item. Store it again, the largest.
    assert!(s.peek(b"big").is_none());
    set(&s, b"big", &[0; 20_000]);
    let before = s.stats();
    let mut sizes: Vec<usize> = (0..i)
        .filter_map(|j| s.peek(format!("k{j}").as_bytes()))
        .map(|v| v.item.value.len())
        .collect();
    sizes.sort_unstable();
    // Growing big (in its shard, the largest item there and store-wide) evicts the
    // largest other items, wherever they are, never big itself.
    let ext = [1; 5_000];
    let st = s.set(&req(SetMode::Append, b"big", &ext));
    assert!(matches!(st, SetStatus::Stored { .. }), "{st:?}");
    assert_eq!(val(&s, b"big").unwrap().len(), 25_000);
    let after = s.stats();
    let gone = (after.evictions - before.evictions) as usize;
    assert!(gone >= 1);
    let mut left: Vec<usize> = (0..i)
        .filter_map(|j| s.peek(format!("k{j}").as_bytes()))
        .map(|v| v.item.value.len())
        .collect();
    left.sort_unstable();
    assert_eq!(left, sizes[..sizes.len() - gone]);
    assert!(after.bytes as usize <= s.config().memory_limit);
}

#[test]
fn largest_reclaims_an_expired_largest_item() {
    let (s, clock) = store_with(Policy::Largest, 64 << 10, 64);
    set_ttl(&s, b"big", &[0; 30_000], 5);
    let mut i = 0;
    while s.stats().bytes as usize + charge("k000", 2_000) <= 64 << 10 {
        set(&s, format!("k{i:03}").as_bytes(), &[0; 2_000]);
        i += 1;
    }
    clock.advance(5);
    set(&s, b"new", &[0; 2_000]);
    let st = s.stats();
    assert_eq!((st.evictions, st.reclaimed), (0, 1));
    assert_eq!(st.curr_items as usize, i + 1);
}

/// Runs crawl steps of `max` slots from a fresh cursor until a pass wraps; checks
/// every step's bound and returns (steps, items reclaimed).
fn crawl_pass(s: &Store, max: usize) -> (usize, usize) {
    let mut cursor = CrawlCursor::default();
    let (mut steps, mut reclaimed) = (0, 0);
    loop {
        let step = s.crawl_step(&mut cursor, max);
        assert!(step.examined <= max.max(1), "{step:?} examined over {max}");
        assert!(step.reclaimed <= step.checked && step.checked <= step.examined);
        steps += 1;
        reclaimed += step.reclaimed;
        if step.wrapped {
            assert_eq!(cursor, CrawlCursor::default(), "a wrapped cursor restarts");
            return (steps, reclaimed);
        }
        assert!(steps < 1_000_000, "the pass never wrapped");
    }
}

#[test]
fn crawl_steps_reclaim_exactly_the_expired_items() {
    for policy in Policy::ALL {
        let (s, clock) = store_with(policy, 64 << 20, 4);
        for i in 0..300 {
            let ttl = match i % 3 {
                0 => 10,
                1 => 100,
                _ => 0,
            };
            set_ttl(&s, format!("k{i:03}").as_bytes(), b"value", ttl);
        }
        let full = s.stats();
        assert_eq!(full.curr_items, 300);
        // Nothing is dead yet: a pass examines everything and reclaims nothing.
        assert_eq!(crawl_pass(&s, 16).1, 0, "{policy}");
        clock.advance(10);
        // Still counted until something unlinks them.
        assert_eq!(s.stats().curr_items, 300);
        let (steps, reclaimed) = crawl_pass(&s, 16);
        assert_eq!(reclaimed, 100, "{policy}");
        assert!(steps >= 300 / 16, "{steps} steps of 16 slots for 300 items");
        let st = s.stats();
        assert_eq!(st.curr_items, 200, "{policy}");
        assert_eq!(st.bytes as usize, 200 * charge("k000", 5), "{policy}");
        assert_eq!((st.crawler_reclaimed, st.reclaimed), (100, 100));
        assert_eq!(st.crawler_items_checked, 300 + 300);
        assert_eq!(st.expired_unfetched, 100);
        // Found by the crawler, not by a get.
        assert_eq!((st.get_expired, st.get_misses), (0, 0));
        for i in 0..300 {
            let k = format!("k{i:03}");
            let want = (i % 3 != 0).then(|| b"value".to_vec());
            assert_eq!(val(&s, k.as_bytes()), want, "{policy} {k}");
        }
        // The eviction order lost the reclaimed items too: filling a small store
        // afterwards evicts only the items that are left, and the accounting holds.
        let (s, clock) = store_with(policy, 20 * charge("k000", 5), 1);
        for i in 0..20 {
            set_ttl(&s, format!("k{i:03}").as_bytes(), b"value", 1 + (i % 2));
        }
        clock.advance(1);
        assert_eq!(crawl_pass(&s, 3).1, 10);
        for i in 20..30 {
            let k = format!("k{i:03}");
            assert!(matches!(
                set(&s, k.as_bytes(), b"value"),
                SetStatus::Stored { .. }
            ));
        }
        let st = s.stats();
        assert_eq!((st.curr_items, st.evictions), (20, 0), "{policy}");
    }
}

#[test]
fn crawl_reclaims_flushed_items_and_keeps_newer_ones() {
    let (s, clock) = store();
    for i in 0..50 {
        set(&s, format!("old{i}").as_bytes(), b"v");
    }
    s.flush_all(0);
    set(&s, b"new", b"v");
    assert_eq!(crawl_pass(&s, 8).1, 50);
    let st = s.stats();
    assert_eq!((st.curr_items, st.bytes as usize), (1, charge("new", 1)));
    assert_eq!((st.crawler_reclaimed, st.get_flushed), (50, 0));
    assert_eq!(val(&s, b"new").unwrap(), b"v");
    // A delayed flush: nothing is dead before its moment, everything after.
    s.flush_all(5);
    assert_eq!(crawl_pass(&s, 8).1, 0);
    clock.advance(5);
    assert_eq!(crawl_pass(&s, 8).1, 1);
    assert_eq!(s.stats().curr_items, 0);
}

#[test]
fn a_crawl_step_stays_in_one_shard_and_a_pass_wraps() {
    let (s, clock) = store_with(Policy::Lru, 64 << 20, 4);
    // An empty store: one step per shard, the last one wraps.
    assert_eq!(crawl_pass(&s, 100), (4, 0));
    for i in 0..1000 {
        set_ttl(&s, format!("k{i}").as_bytes(), b"v", 1);
    }
    clock.advance(1);
    // Each shard has about 250 slots: with steps of 100 slots, 3 steps per shard,
    // never one that spans two shards.
    let mut cursor = CrawlCursor::default();
    let mut steps = Vec::new();
    loop {
        let step = s.crawl_step(&mut cursor, 100);
        steps.push(step);
        if step.wrapped {
            break;
        }
    }
    assert!(steps.iter().all(|st| st.examined <= 100));
    assert_eq!(steps.iter().filter(|st| st.wrapped).count(), 1);
    let slots: usize = steps.iter().map(|st| st.examined).sum();
    assert_eq!(slots, 1000, "every slot once");
    let reclaimed: usize = steps.iter().map(|st| st.reclaimed).sum();
    assert_eq!(reclaimed, 1000);
    assert!(steps.len() >= 1000 / 100, "{} steps", steps.len());
    // Step size 0 still makes progress, one slot at a time.
    let mut cursor = CrawlCursor::default();
    let st = s.crawl_step(&mut cursor, 0);
    assert_eq!(st.examined, 1);
    // A second pass over the now empty (but still allocated) slabs finds nothing,
    // and reclaim_expired is such a pass.
    assert_eq!(crawl_pass(&s, 64).1, 0);
    set_ttl(&s, b"late", b"v", 1);
    clock.advance(1);
    assert_eq!(s.reclaim_expired(), 1);
    let st = s.stats();
    assert_eq!(
        (st.curr_items, st.bytes, st.crawler_reclaimed),
        (0, 0, 1001)
    );
}

/// A whole export pass in steps of `max` slots: the items, and the steps taken.
fn scan_all(s: &Store, max: usize) -> (Vec<ExportedItem>, usize) {
    let mut cursor = ScanCursor::default();
    let mut out = Vec::new();
    let mut steps = 0;
    loop {
        let before = out.len();
        let step = s.scan(&mut cursor, max, &mut out);
        steps += 1;
        assert!(step.examined <= max.max(1));
        assert_eq!(step.exported, out.len() - before);
        assert!(step.exported <= step.examined);
        if step.done {
            return (out, steps);
        }
    }
}

fn keys_of(items: &[ExportedItem]) -> Vec<Vec<u8>> {
    let mut keys: Vec<_> = items.iter().map(|i| i.key().to_vec()).collect();
    keys.sort();
    keys
}

#[test]
fn a_scan_pass_exports_every_live_item_exactly_once() {
    let (s, _) = store_with(Policy::Lru, 64 << 20, 8);
    let mut want = Vec::new();
    for i in 0..1000 {
        let k = format!("key:{i:04}").into_bytes();
        set(&s, &k, format!("value {i}").as_bytes());
        want.push(k);
    }
    // Holes in the slabs: deleted items are not exported, their slots are examined.
    for i in (0..1000).step_by(10) {
        assert!(s.delete(&want[i]));
    }
    let want: Vec<_> = want
        .into_iter()
        .enumerate()
        .filter(|(i, _)| i % 10 != 0)
        .map(|(_, k)| k)
        .collect();
    let (items, steps) = scan_all(&s, 7);
    assert_eq!(keys_of(&items), want, "each live key once");
    assert!(steps > 1000 / 7, "bounded steps: {steps}");
    for it in &items {
        let i: usize = std::str::from_utf8(&it.key()[4..])
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(&**it.value(), format!("value {i}").as_bytes());
        let got = s.get(it.key()).unwrap();
        assert_eq!(
            (it.flags(), it.exptime(), it.cas()),
            (got.flags, got.exptime, got.cas)
        );
    }
    // A finished cursor stays finished.
    let mut cursor = ScanCursor::default();
    let mut out = Vec::new();
    while !s.scan(&mut cursor, 1000, &mut out).done {}
    assert_eq!(out.len(), 900);
    let again = s.scan(&mut cursor, 1000, &mut out);
    assert_eq!((again.examined, again.exported, again.done), (0, 0, true));
    // max_items 0 counts as 1; an empty store finishes in one step per shard.
    assert_eq!(scan_all(&s, 0).0.len(), 900);
    let (empty, _) = store_with(Policy::Lru, 1 << 20, 4);
    let (items, steps) = scan_all(&empty, 7);
    assert!(items.is_empty());
    assert_eq!(steps, 4);
}

#[test]
fn a_scan_skips_expired_and_flushed_items_and_changes_nothing() {
    let (s, clock) = store();
    for i in 0..100 {
        set_ttl(&s, format!("short:{i}").as_bytes(), b"v", 10);
        set(&s, format!("long:{i}").as_bytes(), b"v");
    }
    clock.advance(10);
    let before = s.stats();
    let (items, _) = scan_all(&s, 16);
    assert_eq!(items.len(), 100);
    assert!(items.iter().all(|it| it.key().starts_with(b"long:")));
    // Dead items are left to the crawler; no counter moved.
    assert_eq!(s.stats(), before);
    s.flush_all(0);
    set(&s, b"after", b"flush");
    let (items, _) = scan_all(&s, 16);
    assert_eq!(keys_of(&items), [b"after".to_vec()]);
    assert_eq!(
        s.stats().curr_items,
        201,
        "flushed items not reclaimed by the scan"
    );
}

#[test]
fn a_scan_does_not_fetch_mark_or_reorder() {
    // The same history with and without a scan evicts the same victim.
    for scan in [false, true] {
        let (s, _) = full_store(Policy::Lru, 3, 10);
        for k in [b"a", b"b", b"c"] {
            set(&s, k, &[0; 10]);
        }
        s.get(b"a");
        let before = s.stats();
        if scan {
            // Bumping in slab order (a, b, c) would make a the oldest: a victim.
            assert_eq!(scan_all(&s, 1).0.len(), 3);
        }
        assert_eq!(s.stats(), before);
        let peek = MetaGetOpts {
            no_bump: true,
            ..Default::default()
        };
        assert!(!s.meta_get(b"b", &peek).unwrap().hit_before, "scan={scan}");
        set(&s, b"d", &[0; 10]);
        assert_eq!(
            keys_present(&s, &[b"a", b"b", b"c", b"d"]),
            [true, false, true, true],
            "scan={scan}"
        );
        assert_eq!(s.stats().evicted_unfetched, 1, "scan={scan}");
    }
}

#[test]
fn scan_matching_filters_by_the_store_hash() {
    let (s, _) = store_with(Policy::Lru, 64 << 20, 8);
    for i in 0..500 {
        set(&s, format!("k{i}").as_bytes(), b"v");
    }
    let mid = u64::MAX / 2;
    let mut halves = [Vec::new(), Vec::new()];
    for (h, half) in halves.iter_mut().enumerate() {
        let mut cursor = ScanCursor::default();
        loop {
            let step = s.scan_matching(&mut cursor, 7, half, |hash, key| {
                assert_eq!(hash, s.key_hash(key));
                (hash > mid) == (h == 1)
            });
            if step.done {
                break;
            }
        }
    }
    let (lo, hi) = (keys_of(&halves[0]), keys_of(&halves[1]));
    assert!(!lo.is_empty() && !hi.is_empty());
    assert!(lo.iter().all(|k| s.key_hash(k) <= mid));
    let mut all = [lo, hi].concat();
    all.sort();
    assert_eq!(all, keys_of(&scan_all(&s, 64).0));
    assert_eq!(all.len(), 500);
}

#[test]
fn export_then_import_gives_equal_items_that_expire_together() {
    let (a, clock_a) = store();
    // Another epoch: expiry must survive as an absolute time.
    let clock_b = Arc::new(ManualClock::new(T0 + 5));
    let b = Store::new(a.config().clone(), clock_b.clone());
    clock_a.set(T0 + 5);
    for i in 0..50u32 {
        let k = format!("k{i}");
        s_set_full(
            &a,
            k.as_bytes(),
            format!("v{i}").as_bytes(),
            i,
            if i % 2 == 0 { 100 } else { 0 },
        );
    }
    set_ttl(&a, b"gone", b"x", 1);
    clock_a.advance(1);
    clock_b.advance(1);
    let (items, _) = scan_all(&a, 7);
    assert_eq!(items.len(), 50);
    for it in &items {
        assert!(matches!(
            b.import(it, ImportMode::IfAbsent),
            SetStatus::Stored { .. }
        ));
    }
    let same = |k: &[u8]| {
        let (x, y) = (a.get(k), b.get(k));
        assert_eq!(x.is_some(), y.is_some(), "{k:?}");
        if let (Some(x), Some(y)) = (&x, &y) {
            assert_eq!(
                (&x.value, x.flags, x.exptime),
                (&y.value, y.flags, y.exptime)
            );
        }
        y.is_some()
    };
    let keys: Vec<String> = (0..50).map(|i| format!("k{i}")).collect();
    assert!(keys.iter().all(|k| same(k.as_bytes())));
    assert!(!same(b"gone"));
    // One second before the expiry both still have the items; at it, both miss.
    clock_a.set(T0 + 5 + 99);
    clock_b.set(T0 + 5 + 99);
    assert!(keys.iter().all(|k| same(k.as_bytes())));
    clock_a.advance(1);
    clock_b.advance(1);
    let live: Vec<bool> = keys.iter().map(|k| same(k.as_bytes())).collect();
    assert!(live.iter().enumerate().all(|(i, &l)| l == (i % 2 == 1)));
}

fn s_set_full(s: &Store, key: &[u8], value: &[u8], flags: u32, exptime: i64) -> u64 {
    cas_of(s.set(&SetRequest {
        flags,
        exptime,
        ..req(SetMode::Set, key, value)
    }))
}

#[test]
fn import_modes_keep_or_replace_a_live_item() {
    let (s, clock) = store();
    let item = ExportedItem::new(b"k", b"imported", 9, T0 + 50, 12345).unwrap();
    assert_eq!(item.key(), b"k");
    assert_eq!(
        (item.flags(), item.exptime(), item.cas()),
        (9, T0 + 50, 12345)
    );
    assert!(ExportedItem::new(&[b'k'; MAX_KEY_LEN + 1], b"", 0, 0, 0).is_none());
    let mine = cas_of(set(&s, b"k", b"mine"));
    let before = s.stats();
    assert_eq!(s.import(&item, ImportMode::IfAbsent), SetStatus::NotStored);
    assert_eq!(s.stats(), before);
    assert_eq!(s.get(b"k").unwrap().cas, mine);
    let cas = cas_of(s.import(&item, ImportMode::Overwrite));
    assert_ne!(cas, 12345, "a fresh CAS of this store");
    let got = s.get(b"k").unwrap();
    assert_eq!(
        (&*got.value, got.flags, got.exptime, got.cas),
        (&b"imported"[..], 9, T0 + 50, cas)
    );
    assert_eq!(s.stats().total_items, before.total_items + 1);
    // Already expired: nothing visible (and an Overwrite removes the live item).
    clock.set(T0 + 50);
    set(&s, b"k", b"mine");
    assert!(matches!(
        s.import(&item, ImportMode::Overwrite),
        SetStatus::Stored { .. }
    ));
    assert!(s.get(b"k").is_none());
    assert!(matches!(
        s.import(&item, ImportMode::IfAbsent),
        SetStatus::Stored { .. }
    ));
    assert!(s.get(b"k").is_none());
}

#[test]
fn import_respects_the_memory_limit() {
    let items: Vec<ExportedItem> = (0..5)
        .map(|i| ExportedItem::new(format!("{i}").as_bytes(), &[0; 10], 0, 0, 0).unwrap())
        .collect();
    let (s, _) = full_store(Policy::None, 3, 10);
    let got: Vec<SetStatus> = items
        .iter()
        .map(|it| s.import(it, ImportMode::IfAbsent))
        .collect();
    assert!(got[..3]
        .iter()
        .all(|st| matches!(st, SetStatus::Stored { .. })));
    assert_eq!(got[3..], [SetStatus::OutOfMemory, SetStatus::OutOfMemory]);
    assert_eq!(s.stats().bytes as usize, 3 * charge("k", 10));
    let (s, _) = full_store(Policy::Lru, 3, 10);
    for it in &items {
        assert!(matches!(
            s.import(it, ImportMode::IfAbsent),
            SetStatus::Stored { .. }
        ));
    }
    let st = s.stats();
    assert_eq!((st.curr_items, st.evictions), (3, 2));
    let big = ExportedItem::new(b"big", &[0; 200], 0, 0, 0).unwrap();
    assert_eq!(s.import(&big, ImportMode::IfAbsent), SetStatus::OutOfMemory);
    let (s, _) = store_with(Policy::Lru, 64 << 20, 1);
    let huge = ExportedItem::new(b"huge", &vec![0; 1 << 20], 0, 0, 0).unwrap();
    assert_eq!(s.import(&huge, ImportMode::Overwrite), SetStatus::TooLarge);
}

#[test]
fn a_lowered_memory_limit_evicts_down_to_it_and_a_raised_one_admits_more() {
    let (s, _clock) = store_with(Policy::Lru, 1 << 20, 4);
    let value = vec![b'v'; 1000];
    for i in 0..800 {
        assert!(matches!(
            set(&s, format!("k{i}").as_bytes(), &value),
            SetStatus::Stored { .. }
        ));
    }
    let before = s.stats();
    assert_eq!(before.curr_items, 800);
    let limit = 200 * 1024;
    let used = s.set_memory_limit(limit);
    let after = s.stats();
    assert!(used <= limit, "{used} > {limit}");
    assert_eq!(after.limit_maxbytes, limit as u64);
    assert!(after.curr_items < 210, "{}", after.curr_items);
    assert_eq!(after.evictions - before.evictions, 800 - after.curr_items);
    // The most recently stored keys are the ones kept (lru, per shard).
    assert!(s.get(b"k799").is_some());
    assert!(s.get(b"k0").is_none());
    // Stores still work under the new limit, evicting as usual.
    for i in 800..1000 {
        assert!(matches!(
            set(&s, format!("k{i}").as_bytes(), &value),
            SetStatus::Stored { .. }
        ));
        assert!(s.stats().bytes <= limit as u64);
    }
    // Raised again: room for more without evicting.
    s.set_memory_limit(1 << 20);
    let ev = s.stats().evictions;
    for i in 0..300 {
        set(&s, format!("n{i}").as_bytes(), &value);
    }
    assert_eq!(s.stats().evictions, ev);
}

#[test]
fn counters_read_as_memcached_reads_them() {
    for (v, want) in [
        (&b"5"[..], Some(5)),
        (b" 5", Some(5)),
        (b"\t+5", Some(5)),
        (b"5  ", Some(5)),
        (b"5 x", Some(5)),
        (b"-0", Some(0)),
        (b"-5", None),
        (b"5x", None),
        (b"", None),
        (b"  ", None),
        (b"x5", None),
        (b"18446744073709551615", Some(u64::MAX)),
        (b"18446744073709551616", None),
        (b"00000000000000000000001", Some(1)),
    ] {
        assert_eq!(parse_counter(v), want, "{:?}", String::from_utf8_lossy(v));
    }
}
