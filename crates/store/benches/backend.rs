//! The durable store's engine paths: `persist` (one key, fsync), read-through
//! `load` of a key on disk, and `sync_all` of 100 dirty items. Engine choice
//! (fjall vs redb) is explained in `src/durable/backend.rs`.

use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use kvlab_store::{
    Durability, DurableConfig, SetMode, SetRequest, Store, StoreConfig, SystemClock,
};

fn open(dir: &std::path::Path) -> Store {
    let d = DurableConfig {
        dir: dir.to_path_buf(),
        durability: Durability::Sync,
        flush_interval: Duration::from_secs(3600),
    };
    Store::open(StoreConfig::default(), Arc::new(SystemClock), d).expect("open data dir")
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let s = open(dir.path());
    let value = [7u8; 100];
    let mut i = 0u64;
    c.bench_function("persist one 100B set (fsync)", |b| {
        b.iter(|| {
            i += 1;
            let k = format!("p:{i}");
            s.set(&SetRequest::new(SetMode::Set, k.as_bytes(), &value));
            s.persist(k.as_bytes()).expect("persist");
        })
    });
    c.bench_function("sync_all of 100 dirty 100B items", |b| {
        b.iter(|| {
            for _ in 0..100 {
                i += 1;
                let k = format!("p:{i}");
                s.set(&SetRequest::new(SetMode::Set, k.as_bytes(), &value));
            }
            s.sync_all().expect("sync");
        })
    });
    // 20 000 more on disk, then reopen with a cache of ~1 400 items, so cycling
    // through all keys loads from the engine every time.
    for _ in 0..20_000 {
        i += 1;
        let k = format!("p:{i}");
        s.set(&SetRequest::new(SetMode::Set, k.as_bytes(), &value));
    }
    drop(s);
    let small = StoreConfig {
        memory_limit: 256 << 10,
        ..StoreConfig::default()
    };
    let d = DurableConfig {
        dir: dir.path().to_path_buf(),
        durability: Durability::Sync,
        flush_interval: Duration::from_secs(3600),
    };
    let s = Store::open(small, Arc::new(SystemClock), d).expect("reopen");
    let n = i;
    let mut j = 0u64;
    c.bench_function("load of a key on disk (read-through)", |b| {
        b.iter(|| {
            j = j % n + 1;
            let k = format!("p:{j}");
            s.load(k.as_bytes()).expect("load")
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
