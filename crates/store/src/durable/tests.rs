//! Durable store tests: round trips through the engine, recovery, tombstones,
//! write-behind read-back, expiry and flush across restarts, group commit, the
//! delay hook, the purge of dead records, and a model-based property test with
//! restarts and purges.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use proptest::prelude::*;

use crate::{
    Clock, Durability, DurableConfig, ManualClock, Policy, SetMode, SetRequest, SetStatus, Store,
    StoreConfig,
};

const T0: u64 = 1_700_000_000;

fn cfg(memory_limit: usize) -> StoreConfig {
    StoreConfig {
        memory_limit,
        item_size_max: 1 << 20,
        policy: Policy::Lru,
        shards: 1,
        max_items: 0,
    }
}

fn dcfg(dir: &std::path::Path, durability: Durability) -> DurableConfig {
    DurableConfig {
        dir: dir.to_path_buf(),
        durability,
        // Long: tests drive flushes with sync_all/persist, not time.
        flush_interval: Duration::from_secs(3600),
    }
}

fn open(dir: &std::path::Path, d: Durability, limit: usize, clock: &Arc<ManualClock>) -> Store {
    Store::open(cfg(limit), clock.clone(), dcfg(dir, d)).unwrap()
}

fn set_full(s: &Store, key: &[u8], value: &[u8], flags: u32, exptime: i64) -> u64 {
    let mut r = SetRequest::new(SetMode::Set, key, value);
    r.flags = flags;
    r.exptime = exptime;
    match s.set(&r) {
        SetStatus::Stored { cas } => cas,
        other => panic!("set {key:?}: {other:?}"),
    }
}

fn set(s: &Store, key: &[u8], value: &[u8]) -> u64 {
    set_full(s, key, value, 0, 0)
}

/// get, loading on a miss as the server does.
fn get_through(s: &Store, key: &[u8]) -> Option<Vec<u8>> {
    if let Some(v) = s.get(key) {
        return Some(v.value.to_vec());
    }
    s.load(key).unwrap();
    s.get(key).map(|v| v.value.to_vec())
}

fn key(i: usize) -> Vec<u8> {
    format!("key:{i:05}").into_bytes()
}

#[test]
fn durability_names() {
    for d in [Durability::None, Durability::Interval, Durability::Sync] {
        assert_eq!(d.to_string().parse::<Durability>(), Ok(d));
    }
    assert!("fast".parse::<Durability>().is_err());
    let clock = Arc::new(ManualClock::new(T0));
    assert_eq!(Store::new(cfg(1 << 20), clock).durability(), None);
}

#[test]
fn round_trip_through_disk_after_eviction() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let s = open(dir.path(), Durability::Interval, 16 << 10, &clock);
    let value = [b'v'; 200];
    let first_cas = set_full(&s, &key(0), &value, 77, 1000);
    for i in 1..200 {
        set(&s, &key(i), &value);
    }
    assert!(s.stats().evictions > 0);
    assert!(s.get(&key(0)).is_none(), "key 0 was evicted");
    assert!(s.load(&key(0)).unwrap());
    let v = s.get(&key(0)).unwrap();
    assert_eq!(&*v.value, &value[..]);
    assert_eq!(v.flags, 77);
    assert_eq!(v.exptime, T0 + 1000);
    assert_eq!(v.cas, first_cas);
    // Loaded clean: a key absent everywhere stays absent.
    assert!(!s.load(b"never-set").unwrap());
}

#[test]
fn restart_recovers_items_with_flags_exptime_and_cas() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let mut cases = Vec::new();
    {
        let s = open(dir.path(), Durability::Interval, 1 << 20, &clock);
        for i in 0..50 {
            let cas = set_full(&s, &key(i), &key(i + 1000), i as u32, (i as i64 + 1) * 100);
            cases.push(cas);
        }
        // Dropped without sync_all: drop writes and fsyncs.
    }
    let s = open(dir.path(), Durability::Interval, 1 << 20, &clock);
    for (i, &cas) in cases.iter().enumerate() {
        assert!(s.get(&key(i)).is_none(), "recovery is lazy");
        assert!(s.load(&key(i)).unwrap());
        let v = s.get(&key(i)).unwrap();
        assert_eq!(&*v.value, &key(i + 1000)[..]);
        assert_eq!(v.flags, i as u32);
        assert_eq!(v.exptime, T0 + (i as u64 + 1) * 100);
        assert_eq!(v.cas, cas);
    }
    // New CAS values lie above every recovered one.
    let max = cases.iter().copied().max().unwrap();
    assert!(set(&s, &key(0), b"new") > max);
    assert!(set(&s, b"other", b"new") > max);
}

#[test]
fn interval_flusher_writes_dirty_items_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let mut dc = dcfg(dir.path(), Durability::Interval);
    dc.flush_interval = Duration::from_millis(5);
    let s = Store::open(cfg(1 << 20), clock, dc).unwrap();
    for i in 0..10 {
        set(&s, &key(i), b"v");
    }
    // Wait for the flusher's round (a condition with a deadline, not a sleep).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let st = s.durable_stats().unwrap();
        if st.items_written >= 10 && st.queued_bytes == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "flusher never wrote");
        std::thread::yield_now();
    }
    let st = s.durable_stats().unwrap();
    assert!(st.fsyncs >= 1 && st.commits >= 1, "{st:?}");
}

#[test]
fn a_dirty_backlog_over_the_bound_goes_out_in_rounds_without_making_writers_wait() {
    // -m 32 MiB: the write-behind bound is 8 MiB. 20 MB of items turn dirty before the
    // flusher's tick; a writer keeps storing while the tick writes them back. Queued at
    // once they would push the queue over the bound and make that writer wait.
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let mut dc = dcfg(dir.path(), Durability::Interval);
    dc.flush_interval = Duration::from_millis(300);
    let s = Arc::new(Store::open(cfg(32 << 20), clock, dc).unwrap());
    let value = vec![b'v'; 10 * 1024];
    let n = 2000;
    for i in 0..n {
        set(&s, &key(i), &value);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writer = std::thread::spawn({
        let (s, stop) = (s.clone(), stop.clone());
        move || {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                set(&s, format!("small:{}", i % 100).as_bytes(), b"x");
                i += 1;
            }
        }
    });
    // Wait for the flusher's tick to write the backlog (a condition with a deadline).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = s.durable_stats().unwrap();
        if st.items_written >= n as u64 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the backlog never reached the disk: {st:?}"
        );
        std::thread::yield_now();
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let st = s.durable_stats().unwrap();
    assert_eq!(st.write_waits, 0, "a writer waited for the backlog: {st:?}");
    assert!(st.commits >= 3, "one round took the whole backlog: {st:?}");
}

#[test]
fn deletes_are_durable_including_non_resident_keys() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    {
        let s = open(dir.path(), Durability::Sync, 1 << 20, &clock);
        for i in 0..3 {
            set(&s, &key(i), b"v");
            s.persist(&key(i)).unwrap();
        }
    }
    {
        let s = open(dir.path(), Durability::Sync, 1 << 20, &clock);
        // Resident delete.
        assert!(s.load(&key(0)).unwrap());
        assert!(s.delete(&key(0)));
        s.persist(&key(0)).unwrap();
        // Non-resident delete, the server's way: miss, load, run again → hit.
        assert!(!s.delete(&key(1)));
        assert!(!s.load(&key(1)).unwrap());
        assert!(s.delete(&key(1)), "the re-run delete reports the disk hit");
        assert!(!s.delete(&key(1)), "only once");
        s.persist(&key(1)).unwrap();
        // Non-resident delete without any load: still durable.
        assert!(!s.delete(&key(2)));
        s.persist(&key(2)).unwrap();
        // A delete of a key that never existed stays a miss.
        assert!(!s.delete(b"nothing"));
        assert!(!s.load(b"nothing").unwrap());
        assert!(!s.delete(b"nothing"));
    }
    let s = open(dir.path(), Durability::Sync, 1 << 20, &clock);
    for i in 0..3 {
        assert!(!s.load(&key(i)).unwrap(), "key {i} came back");
    }
}

#[test]
fn a_second_delete_misses_while_the_first_tombstone_is_queued() {
    for durability in [Durability::None, Durability::Interval, Durability::Sync] {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::new(T0));
        let s = open(dir.path(), durability, 1 << 20, &clock);
        set(&s, b"k", b"on disk");
        s.persist(b"k").unwrap();
        assert!(s.delete(b"k"), "{durability}: resident delete");
        // The server's way for a miss: load, then run the delete again.
        assert!(!s.delete(b"k"), "{durability}: second delete");
        assert!(!s.load(b"k").unwrap(), "{durability}: load after delete");
        assert!(!s.delete(b"k"), "{durability}: re-run delete");
    }
}

/// The server's way: a delete that misses loads the key and runs again.
fn delete_through(s: &Store, key: &[u8]) -> bool {
    if s.delete(key) {
        return true;
    }
    s.load(key).unwrap();
    s.delete(key)
}

#[test]
fn a_delete_of_a_key_only_in_the_write_behind_queue_hits_once() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let s = open(dir.path(), Durability::None, 16 << 10, &clock);
    let value = [b'w'; 100];
    set(&s, &key(0), &value);
    for i in 1..100 {
        set(&s, &key(i), &value);
    }
    assert!(s.get(&key(0)).is_none(), "evicted, its put queued");
    assert!(delete_through(&s, &key(0)));
    assert!(!delete_through(&s, &key(0)));
    assert_eq!(get_through(&s, &key(0)), None);
}

#[test]
fn a_delete_of_an_expired_item_misses_even_with_an_older_live_version_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    {
        let s = open(dir.path(), Durability::None, 1 << 20, &clock);
        set(&s, b"k", b"immortal");
    }
    let s = open(dir.path(), Durability::None, 1 << 20, &clock);
    set_full(&s, b"k", b"short", 0, 1);
    clock.advance(1);
    assert!(!delete_through(&s, b"k"));
    assert_eq!(get_through(&s, b"k"), None);
}

#[test]
fn tombstone_hides_disk_value_without_a_disk_read() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let s = open(dir.path(), Durability::Interval, 1 << 20, &clock);
    set(&s, b"k", b"on disk");
    s.sync_all().unwrap();
    assert!(s.delete(b"k"));
    let reads = s.durable_stats().unwrap().reads;
    assert!(!s.load(b"k").unwrap());
    assert_eq!(
        s.durable_stats().unwrap().reads,
        reads,
        "tombstone answered"
    );
    // Also after the tombstone reached the engine.
    s.sync_all().unwrap();
    assert!(!s.load(b"k").unwrap());
    // A resident key costs no read either.
    set(&s, b"r", b"x");
    let reads = s.durable_stats().unwrap().reads;
    assert!(s.load(b"r").unwrap());
    assert_eq!(s.durable_stats().unwrap().reads, reads);
}

#[test]
fn write_behind_buffer_is_read_back_before_the_flusher_runs() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    // `none`: evictions are queued, the flusher only runs when kicked (queue over
    // 1 MiB) or hourly.
    let s = open(dir.path(), Durability::None, 16 << 10, &clock);
    let value = [b'w'; 100];
    set_full(&s, &key(0), &value, 5, 0);
    for i in 1..100 {
        set(&s, &key(i), &value);
    }
    assert!(s.get(&key(0)).is_none());
    let st = s.durable_stats().unwrap();
    assert_eq!(st.commits, 0, "nothing written yet");
    assert!(st.queued_bytes > 0);
    assert!(s.load(&key(0)).unwrap());
    assert_eq!(
        s.durable_stats().unwrap().reads,
        0,
        "answered from the queue"
    );
    let v = s.get(&key(0)).unwrap();
    assert_eq!((&*v.value, v.flags), (&value[..], 5));
}

#[test]
fn expired_items_are_not_resurrected() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    {
        let s = open(dir.path(), Durability::Interval, 1 << 20, &clock);
        set_full(&s, b"ttl", b"v", 0, 10);
        // An older, immortal version on disk, then a short-lived one in memory.
        set(&s, b"old", b"v1");
        s.sync_all().unwrap();
        set_full(&s, b"old", b"v2", 0, 5);
        clock.advance(6);
        assert!(s.get(b"old").is_none());
        assert!(!s.load(b"old").unwrap(), "v1 must not come back");
    }
    clock.advance(10);
    let s = open(dir.path(), Durability::Interval, 1 << 20, &clock);
    assert!(!s.load(b"ttl").unwrap());
    assert!(!s.load(b"old").unwrap());
}

#[test]
fn flush_all_is_not_undone_by_restart() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    {
        let s = open(dir.path(), Durability::Interval, 1 << 20, &clock);
        set(&s, b"a", b"1");
        set(&s, b"b", b"1");
        s.sync_all().unwrap();
        s.flush_all(0);
        assert!(!s.load(b"a").unwrap(), "flushed, also on disk");
        set(&s, b"c", b"after");
    }
    {
        let s = open(dir.path(), Durability::Interval, 1 << 20, &clock);
        assert!(!s.load(b"a").unwrap());
        assert!(!s.load(b"b").unwrap());
        assert!(s.load(b"c").unwrap());
        // A delayed flush that comes due while the server is down.
        s.flush_all(100);
        set(&s, b"d", b"1");
    }
    clock.advance(101);
    let s = open(dir.path(), Durability::Interval, 1 << 20, &clock);
    assert!(!s.load(b"c").unwrap());
    assert!(!s.load(b"d").unwrap());
    set(&s, b"e", b"1");
    assert_eq!(get_through(&s, b"e").as_deref(), Some(&b"1"[..]));
}

#[test]
fn concurrent_persists_share_fsyncs() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let s = Arc::new(open(dir.path(), Durability::Sync, 1 << 20, &clock));
    // A slow disk makes rounds overlap reliably.
    s.set_backend_delay(Duration::from_millis(2));
    const THREADS: usize = 8;
    const EACH: usize = 10;
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let s = s.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                for i in 0..EACH {
                    let k = key(t * 100 + i);
                    set(&s, &k, b"x");
                    s.persist(&k).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let st = s.durable_stats().unwrap();
    assert_eq!(st.persists, (THREADS * EACH) as u64);
    assert!(st.fsyncs < st.persists, "{st:?}");
    assert_eq!(st.items_written, (THREADS * EACH) as u64);
    s.set_backend_delay(Duration::ZERO);
    drop(s);
    let s = open(dir.path(), Durability::Sync, 1 << 20, &clock);
    for t in 0..THREADS {
        for i in 0..EACH {
            assert!(s.load(&key(t * 100 + i)).unwrap());
        }
    }
}

#[test]
fn delay_hook_slows_the_backend_but_not_memory_hits() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let s = Arc::new(open(dir.path(), Durability::Sync, 1 << 20, &clock));
    set(&s, b"hot", b"1");
    set(&s, b"cold", b"1");
    s.sync_all().unwrap();
    let d = Duration::from_millis(300);
    s.set_backend_delay(d);
    let done = Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel();
    let t = {
        let (s, done) = (s.clone(), done.clone());
        std::thread::spawn(move || {
            set(&s, b"cold", b"2");
            tx.send(()).unwrap();
            let start = Instant::now();
            s.persist(b"cold").unwrap();
            done.store(true, Ordering::SeqCst);
            start.elapsed()
        })
    };
    rx.recv().unwrap();
    // While the persist sits in the slow backend, memory hits are served.
    for _ in 0..1000 {
        assert!(s.get(b"hot").is_some());
    }
    assert!(
        !done.load(Ordering::SeqCst),
        "hits did not wait for the disk"
    );
    assert!(t.join().unwrap() >= d);
    s.set_backend_delay(Duration::ZERO);
    let start = Instant::now();
    s.persist(b"cold").unwrap();
    assert!(start.elapsed() < d, "delay removed");
}

#[test]
fn memory_only_store_ignores_durable_calls() {
    let clock = Arc::new(ManualClock::new(T0));
    let s = Store::new(cfg(1 << 20), clock);
    set(&s, b"k", b"v");
    assert!(s.load(b"k").unwrap());
    assert!(!s.load(b"x").unwrap());
    s.persist(b"k").unwrap();
    s.sync_all().unwrap();
    s.set_backend_delay(Duration::from_secs(1));
    assert!(s.durable_stats().is_none());
    assert!(s.delete(b"k"));
    assert!(!s.delete(b"k"));
}

/// Waits (bounded, no sleep) until the flusher completed `passes` purge passes.
fn no_background_purge(s: &Store) {
    let d = s.durable_state().unwrap();
    d.no_background_purge.store(true, Ordering::SeqCst);
}

fn wait_for_passes(s: &Store, passes: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.durable_stats().unwrap().purge_passes < passes {
        assert!(Instant::now() < deadline, "no purge pass");
        std::thread::yield_now();
    }
}

#[test]
fn purge_removes_every_record_of_an_older_flush_generation() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    {
        // Enough records for several purge steps.
        let n = super::background::PURGE_CHUNK * 2 + 100;
        let s = open(dir.path(), Durability::Interval, 8 << 20, &clock);
        no_background_purge(&s);
        for i in 0..n {
            set(&s, &key(i), b"old");
        }
        s.sync_all().unwrap();
        assert_eq!(s.disk_records().unwrap(), n as u64);
        s.flush_all(0);
        set(&s, b"new", b"after the flush");
        // Queued, not committed: the purge commits it (and the flush) first.
        assert!(s.write_behind(b"new"));
        assert_eq!(s.purge_disk().unwrap(), n as u64);
        assert_eq!(s.disk_records().unwrap(), 1, "only the new record is left");
        let st = s.durable_stats().unwrap();
        assert_eq!(st.purged, n as u64, "{st:?}");
        assert_eq!((st.purge_scanned, st.purge_passes), (n as u64 + 1, 1));
        assert_eq!(get_through(&s, &key(0)), None);
    }
    let s = open(dir.path(), Durability::Interval, 8 << 20, &clock);
    assert_eq!(
        get_through(&s, b"new").as_deref(),
        Some(&b"after the flush"[..])
    );
    assert_eq!(get_through(&s, &key(1)), None);
}

#[test]
fn purge_removes_expired_records_and_keeps_live_ones() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let s = open(dir.path(), Durability::Interval, 1 << 20, &clock);
    for i in 0..100 {
        set_full(&s, &key(i), b"short", 0, 10);
        set_full(&s, &key(1000 + i), b"long", 0, 1000);
        set(&s, &key(2000 + i), b"forever");
    }
    s.sync_all().unwrap();
    assert_eq!(s.purge_disk().unwrap(), 0, "nothing expired yet");
    clock.advance(10);
    assert_eq!(s.purge_disk().unwrap(), 100);
    assert_eq!(s.disk_records().unwrap(), 200);
    assert_eq!(get_through(&s, &key(0)), None);
    assert_eq!(get_through(&s, &key(1000)).as_deref(), Some(&b"long"[..]));
    clock.advance(1000);
    assert_eq!(s.purge_disk().unwrap(), 100);
    assert_eq!(s.disk_records().unwrap(), 100);
    assert_eq!(s.durable_stats().unwrap().purged, 200);
    assert_eq!(
        get_through(&s, &key(2000)).as_deref(),
        Some(&b"forever"[..])
    );
}

#[test]
fn load_of_a_dead_record_queues_its_deletion() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    {
        let s = open(dir.path(), Durability::Interval, 1 << 20, &clock);
        set_full(&s, b"ttl", b"v", 0, 10);
        set(&s, b"keep", b"v");
    }
    clock.advance(10);
    let s = open(dir.path(), Durability::Interval, 1 << 20, &clock);
    assert_eq!(s.disk_records().unwrap(), 2);
    assert!(!s.load(b"ttl").unwrap());
    assert!(
        s.durable_stats().unwrap().queued_bytes > 0,
        "deletion queued"
    );
    // Known absent now: no second disk read, and a delete misses.
    let reads = s.durable_stats().unwrap().reads;
    assert!(!s.load(b"ttl").unwrap());
    assert!(!s.delete(b"ttl"));
    assert_eq!(s.durable_stats().unwrap().reads, reads);
    s.sync_all().unwrap();
    assert_eq!(s.disk_records().unwrap(), 1);
    assert_eq!(s.durable_stats().unwrap().purged, 1);
    assert_eq!(get_through(&s, b"keep").as_deref(), Some(&b"v"[..]));
}

#[test]
fn a_key_rewritten_after_the_flush_survives_the_purge() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    {
        let s = Arc::new(open(dir.path(), Durability::Interval, 1 << 20, &clock));
        no_background_purge(&s);
        for k in [&b"dirty"[..], b"queued", b"persisted", b"gone"] {
            set(&s, k, b"old");
        }
        s.sync_all().unwrap();
        s.flush_all(0);
        // Resident and dirty (not yet written).
        set(&s, b"dirty", b"new");
        // Already on disk again.
        set(&s, b"persisted", b"new");
        s.persist(b"persisted").unwrap();
        // Written behind (a queued put, as an eviction leaves it) after the purge's
        // first commit, before its scan.
        let s2 = Arc::downgrade(&s);
        *s.durable_state().unwrap().after_scan.lock() = Some(Box::new(move || {
            let s = s2.upgrade().unwrap();
            set(&s, b"queued", b"new");
            assert!(s.write_behind(b"queued"));
        }));
        assert_eq!(s.purge_disk().unwrap(), 1, "only `gone` is dead and free");
        assert_eq!(s.disk_records().unwrap(), 3);
    }
    let s = open(dir.path(), Durability::Interval, 1 << 20, &clock);
    assert_eq!(get_through(&s, b"dirty").as_deref(), Some(&b"new"[..]));
    assert_eq!(get_through(&s, b"queued").as_deref(), Some(&b"new"[..]));
    assert_eq!(get_through(&s, b"persisted").as_deref(), Some(&b"new"[..]));
    assert_eq!(get_through(&s, b"gone"), None);
}

/// The race the purge must not lose: its scan sees a dead record, then, before it
/// deletes, a round commits a new version of the key that is not resident (written
/// behind after an eviction). The purge must notice and keep the new record.
#[test]
fn a_rewrite_committed_between_scan_and_delete_survives() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let s = Arc::new(open(dir.path(), Durability::Interval, 16 << 10, &clock));
    no_background_purge(&s);
    let value = [b'v'; 200];
    set(&s, &key(0), &value);
    s.sync_all().unwrap();
    s.flush_all(0);
    s.sync_all().unwrap();
    let hit = Arc::new(AtomicBool::new(false));
    {
        let (s2, hit) = (Arc::downgrade(&s), hit.clone());
        *s.durable_state().unwrap().after_scan.lock() = Some(Box::new(move || {
            let Some(s) = s2.upgrade() else { return };
            set(&s, &key(0), b"rewritten");
            // Evict it: its put is queued, then committed; it is no longer resident.
            for i in 1..200 {
                set(&s, &key(i), &value);
            }
            s.sync_all().unwrap();
            assert!(s.get(&key(0)).is_none(), "evicted");
            hit.store(true, Ordering::SeqCst);
        }));
    }
    s.purge_disk().unwrap();
    assert!(hit.load(Ordering::SeqCst), "the hook ran");
    assert_eq!(get_through(&s, &key(0)).as_deref(), Some(&b"rewritten"[..]));
}

#[test]
fn disk_stays_bounded_across_flushes() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let s = open(dir.path(), Durability::Interval, 8 << 20, &clock);
    const ROUND: usize = 2000;
    let mut max_records = 0;
    for round in 0..20 {
        for i in 0..ROUND {
            set(&s, &key(round * ROUND + i), b"0123456789");
        }
        s.sync_all().unwrap();
        max_records = max_records.max(s.disk_records().unwrap());
        let passes = s.durable_stats().unwrap().purge_passes;
        s.flush_all(0);
        // The flusher, kicked by the flush, purges by itself.
        wait_for_passes(&s, passes + 1);
    }
    assert!(max_records <= ROUND as u64 + 10, "{max_records} records");
    assert_eq!(s.disk_records().unwrap(), 0);
    assert_eq!(s.durable_stats().unwrap().purged, 20 * ROUND as u64);
}

#[derive(Clone, Debug)]
enum MOp {
    Set(u8, u8),
    /// A set with a TTL of 1 to 3 seconds.
    SetTtl(u8, u8, u8),
    Advance(u8),
    Purge,
    Delete(u8),
    Get(u8),
    Persist(u8),
    Flush,
    Restart,
}

/// `PROPTEST_CASES` if set, else `default` (an explicit `cases` in a config would
/// otherwise ignore the variable).
fn cases_or(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn mop() -> impl Strategy<Value = MOp> {
    prop_oneof![
        6 => (0u8..24, any::<u8>()).prop_map(|(k, v)| MOp::Set(k, v)),
        2 => (0u8..24, any::<u8>(), 1u8..4).prop_map(|(k, v, t)| MOp::SetTtl(k, v, t)),
        1 => (1u8..3).prop_map(MOp::Advance),
        1 => Just(MOp::Purge),
        3 => (0u8..24).prop_map(MOp::Delete),
        4 => (0u8..24).prop_map(MOp::Get),
        1 => (0u8..24).prop_map(MOp::Persist),
        1 => Just(MOp::Flush),
        1 => Just(MOp::Restart),
    ]
}

proptest! {
    // 32 cases by default (each opens several engines); PROPTEST_CASES overrides.
    #![proptest_config(ProptestConfig { cases: cases_or(32), ..ProptestConfig::default() })]

    /// Random sets (some with a TTL, with the clock moving), deletes, gets, flushes
    /// and purges (besides the flusher's own) with clean restarts (drop, reopen)
    /// under a memory limit that forces evictions, against a HashMap.
    #[test]
    fn matches_a_map_across_restarts(
        ops in proptest::collection::vec(mop(), 1..80),
        durability in prop_oneof![Just(Durability::None), Just(Durability::Interval), Just(Durability::Sync)],
    ) {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::new(T0));
        let limit = 4 << 10;
        let mut s = open(dir.path(), durability, limit, &clock);
        // Value and absolute expiry (0 never).
        let mut model: HashMap<u8, (Vec<u8>, u64)> = HashMap::new();
        for op in ops {
            let now = clock.now();
            model.retain(|_, (_, exp)| *exp == 0 || *exp > now);
            match op {
                MOp::Set(k, v) => {
                    let val = vec![v; 100 + usize::from(v)];
                    set(&s, &key(k.into()), &val);
                    model.insert(k, (val, 0));
                }
                MOp::SetTtl(k, v, t) => {
                    let val = vec![v; 100 + usize::from(v)];
                    set_full(&s, &key(k.into()), &val, 0, t.into());
                    model.insert(k, (val, now + u64::from(t)));
                }
                MOp::Advance(secs) => clock.advance(secs.into()),
                MOp::Purge => {
                    s.purge_disk().unwrap();
                }
                MOp::Delete(k) => {
                    let kk = key(k.into());
                    let mut hit = s.delete(&kk);
                    if !hit {
                        s.load(&kk).unwrap();
                        hit = s.delete(&kk);
                    }
                    prop_assert_eq!(hit, model.remove(&k).is_some(), "delete {}", k);
                }
                MOp::Get(k) => {
                    let want = model.get(&k).map(|(v, _)| v.clone());
                    prop_assert_eq!(get_through(&s, &key(k.into())), want, "get {}", k);
                }
                MOp::Persist(k) => s.persist(&key(k.into())).unwrap(),
                MOp::Flush => {
                    s.flush_all(0);
                    model.clear();
                }
                MOp::Restart => {
                    drop(s);
                    s = open(dir.path(), durability, limit, &clock);
                }
            }
        }
        let now = clock.now();
        model.retain(|_, (_, exp)| *exp == 0 || *exp > now);
        for k in 0..24u8 {
            let want = model.get(&k).map(|(v, _)| v.clone());
            prop_assert_eq!(get_through(&s, &key(k.into())), want, "final {}", k);
        }
        // Once everything is written and purged, the disk holds exactly the live keys.
        s.sync_all().unwrap();
        s.purge_disk().unwrap();
        prop_assert_eq!(s.disk_records().unwrap(), model.len() as u64);
    }
}

#[test]
fn largest_policy_writes_back_victims_from_any_shard() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let config = StoreConfig {
        policy: Policy::Largest,
        shards: 16,
        ..cfg(16 << 10)
    };
    let s = Store::open(
        config,
        clock.clone(),
        dcfg(dir.path(), Durability::Interval),
    )
    .unwrap();
    let value = |i: usize| vec![b'a' + (i % 26) as u8; 50 + (i * 131) % 1_500];
    for i in 0..100 {
        set(&s, &key(i), &value(i));
    }
    assert!(s.stats().evictions > 0);
    for i in 0..100 {
        assert_eq!(get_through(&s, &key(i)), Some(value(i)), "{i}");
    }
}

/// The crawler reclaims a dirty expired item the way an eviction does: its put is
/// queued first, so an older live version on disk never comes back, before or
/// after the queue is written and across a restart; live dirty items stay resident.
#[test]
fn crawled_expired_dirty_items_do_not_resurrect_older_disk_versions() {
    for d in [Durability::None, Durability::Interval, Durability::Sync] {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::new(T0));
        {
            let s = open(dir.path(), d, 1 << 20, &clock);
            set(&s, b"old", b"v1");
            s.sync_all().unwrap();
            set_full(&s, b"old", b"v2", 0, 5);
            set(&s, b"keep", b"k");
            clock.advance(6);
            let mut cursor = crate::CrawlCursor::default();
            let mut reclaimed = 0;
            loop {
                let step = s.crawl_step(&mut cursor, 1);
                reclaimed += step.reclaimed;
                if step.wrapped {
                    break;
                }
            }
            assert_eq!(reclaimed, 1, "{d}");
            let st = s.stats();
            assert_eq!((st.curr_items, st.crawler_reclaimed), (1, 1), "{d}");
            let reads = s.durable_stats().unwrap().reads;
            assert!(!s.load(b"old").unwrap(), "{d}: v1 must not come back");
            assert_eq!(s.durable_stats().unwrap().reads, reads, "{d}: queued");
            s.sync_all().unwrap();
            assert!(!s.load(b"old").unwrap(), "{d}: v1 must not come back");
            assert_eq!(s.get(b"keep").unwrap().value.to_vec(), b"k");
        }
        let s = open(dir.path(), d, 1 << 20, &clock);
        assert!(
            !s.load(b"old").unwrap(),
            "{d}: v1 came back after a restart"
        );
        assert_eq!(get_through(&s, b"keep"), Some(b"k".to_vec()));
    }
}

#[test]
fn a_durable_store_exports_its_resident_items_and_imports_durably() {
    use crate::{ExportedItem, ImportMode, ScanCursor};
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let clock = Arc::new(ManualClock::new(T0));
    let a = open(dir_a.path(), Durability::Interval, 16 << 10, &clock);
    for i in 0..200 {
        set_full(&a, &key(i), &[b'v'; 200], i as u32, 1000);
    }
    assert!(a.stats().evictions > 0);
    let resident = a.stats().curr_items as usize;
    let mut cursor = ScanCursor::default();
    let mut items: Vec<ExportedItem> = Vec::new();
    while !a.scan(&mut cursor, 7, &mut items).done {}
    assert_eq!(
        items.len(),
        resident,
        "the items in memory, not those on disk"
    );
    let b = open(dir_b.path(), Durability::Interval, 1 << 20, &clock);
    for it in &items {
        assert!(matches!(
            b.import(it, ImportMode::IfAbsent),
            SetStatus::Stored { .. }
        ));
    }
    b.sync_all().unwrap();
    drop(b);
    let b = open(dir_b.path(), Durability::Interval, 1 << 20, &clock);
    for it in &items {
        assert_eq!(get_through(&b, it.key()).as_deref(), Some(&[b'v'; 200][..]));
        let got = b.get(it.key()).unwrap();
        assert_eq!((got.flags, got.exptime), (it.flags(), T0 + 1000));
    }
}
