//! Hot paths of the store, single-threaded: get hit, get miss, set of 100-byte
//! values (overwriting, steady state) and a 90:10 get:set mix, over 100 000
//! preloaded items with 10-byte keys, read through the real `SystemClock`.
//!
//! ```text
//! cargo bench -p kvlab-store -- --warm-up-time 1 --measurement-time 3
//! ```

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kvlab_store::{SetMode, SetRequest, Store, StoreConfig, SystemClock};

const N: usize = 100_000;

fn keys(prefix: char) -> Vec<Vec<u8>> {
    // A multiplicative permutation so consecutive operations touch unrelated keys.
    (0..N)
        .map(|i| format!("{prefix}{:09}", (i * 7919) % N).into_bytes())
        .collect()
}

fn loaded() -> (Store, Vec<Vec<u8>>) {
    let s = Store::new(
        StoreConfig {
            memory_limit: 1 << 30,
            ..StoreConfig::default()
        },
        Arc::new(SystemClock),
    );
    let keys = keys('k');
    for k in &keys {
        s.set(&SetRequest::new(SetMode::Set, k, &[b'v'; 100]));
    }
    (s, keys)
}

fn benches(c: &mut Criterion) {
    let (s, hit) = loaded();
    let miss = keys('m');
    let value = [b'w'; 100];
    let mut g = c.benchmark_group("store");
    g.throughput(Throughput::Elements(1));

    let mut i = 0;
    g.bench_function("get_hit", |b| {
        b.iter(|| {
            i = (i + 1) % N;
            black_box(s.get(&hit[i]))
        })
    });
    g.bench_function("get_miss", |b| {
        b.iter(|| {
            i = (i + 1) % N;
            black_box(s.get(&miss[i]))
        })
    });
    g.bench_function("set_100B", |b| {
        b.iter(|| {
            i = (i + 1) % N;
            black_box(s.set(&SetRequest::new(SetMode::Set, &hit[i], &value)))
        })
    });
    g.bench_function("mixed_90get_10set", |b| {
        b.iter(|| {
            i = (i + 1) % N;
            if i % 10 == 0 {
                black_box(s.set(&SetRequest::new(SetMode::Set, &hit[i], &value)));
            } else {
                black_box(s.get(&hit[i]));
            }
        })
    });
    g.finish();
}

criterion_group!(store, benches);
criterion_main!(store);
