//! Parser throughput on the requests that dominate cache traffic.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use kvlab_protocol::{parse, Limits, Parsed};

fn bench(c: &mut Criterion) {
    let limits = Limits::default();
    let mut set = b"set key:000000123456 0 0 100\r\n".to_vec();
    set.extend_from_slice(&[b'x'; 100]);
    set.extend_from_slice(b"\r\n");
    let cases: [(&str, Vec<u8>); 4] = [
        ("get", b"get key:000000123456\r\n".to_vec()),
        (
            "get_10_keys",
            format!(
                "get {}\r\n",
                (0..10)
                    .map(|i| format!("key:{i:012}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            )
            .into_bytes(),
        ),
        ("set_100B", set),
        ("mg", b"mg key:000000123456 v f t c\r\n".to_vec()),
    ];
    let mut g = c.benchmark_group("parse");
    for (name, req) in &cases {
        g.throughput(Throughput::Elements(1));
        g.bench_function(*name, |b| {
            b.iter(|| match parse(black_box(req), &limits) {
                Parsed::Request { consumed, .. } => consumed,
                _ => unreachable!(),
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
