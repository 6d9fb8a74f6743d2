//! Maglev table build and lookup (`dataplane::maglev`).
//!
//! Run: `cargo bench -p dataplane --bench maglev`. Judge changes A/B on the
//! same machine (base branch vs PR), not against the figures in the module
//! docs; on the 2-core VM, differences under ~5 % are noise.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use dataplane::maglev::{DEFAULT_MAX_TABLE_SIZE, MaglevBackend, MaglevTable, backend_key, source_hash, table_size_for};

/// `n` backends 10.x.y.1:80 with weights from `weight(i)`.
fn pool(n: u32, weight: impl Fn(u32) -> u32) -> Vec<MaglevBackend> {
    (0..n)
        .map(|i| {
            let [_, _, hi, lo] = i.to_be_bytes();
            MaglevBackend { key: backend_key(IpAddr::V4(Ipv4Addr::new(10, hi, lo, 1)), 80), weight: weight(i) }
        })
        .collect()
}

fn build(c: &mut Criterion) {
    let big = table_size_for(1000, u32::MAX).unwrap_or(DEFAULT_MAX_TABLE_SIZE);
    let cases = [
        ("equal", 100, DEFAULT_MAX_TABLE_SIZE, pool(100, |_| 1)),
        ("weights_1_to_10", 100, DEFAULT_MAX_TABLE_SIZE, pool(100, |i| i % 10 + 1)),
        // One heavy backend: the heap fill loop.
        ("skewed", 100, DEFAULT_MAX_TABLE_SIZE, pool(100, |i| if i == 0 { 1000 } else { 1 })),
        ("equal", 1000, DEFAULT_MAX_TABLE_SIZE, pool(1000, |_| 1)),
        ("equal", 1000, big, pool(1000, |_| 1)),
    ];
    let mut g = c.benchmark_group("maglev_build");
    for (name, n, size, backends) in &cases {
        g.bench_with_input(BenchmarkId::new(format!("{name}/n={n}"), format!("M={size}")), backends, |b, backends| {
            b.iter(|| MaglevTable::build(black_box(backends), *size))
        });
    }
    g.finish();
}

fn lookup(c: &mut Criterion) {
    const FLOWS: u32 = 4096;
    let backends = pool(100, |_| 1);
    let Ok(table) = MaglevTable::build(&backends, DEFAULT_MAX_TABLE_SIZE) else {
        return;
    };
    let hashes: Vec<u64> = (0..FLOWS).map(|i| source_hash(&i.to_be_bytes(), Some(443))).collect();
    let mut g = c.benchmark_group("maglev_lookup");
    g.throughput(Throughput::Elements(u64::from(FLOWS)));
    g.bench_function("lookup/M=65537", |b| {
        b.iter(|| {
            let mut acc = 0u32;
            for &h in black_box(&hashes) {
                acc = acc.wrapping_add(table.lookup(h));
            }
            acc
        });
    });
    g.bench_function("source_hash+lookup/v4+port", |b| {
        b.iter(|| {
            let mut acc = 0u32;
            for i in black_box(0..FLOWS) {
                acc = acc.wrapping_add(table.lookup(source_hash(&i.to_be_bytes(), Some(443))));
            }
            acc
        });
    });
    g.finish();
}

criterion_group!(benches, build, lookup);
criterion_main!(benches);
