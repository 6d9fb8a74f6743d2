//! The whole per-packet pipeline at scale (issue 2, "How it is proven"): 1,000 VIPs,
//! 10,000 backends, 1,000,000 flows in conntrack.
//!
//! Run: `cargo bench -p dataplane --bench pipeline` (or `make bench-pipeline`, which adds
//! the callgrind instruction counts and prints the summary). The scenario (tables, flows,
//! frame templates) is `perf/callgrind/scenario.rs`, shared with the callgrind driver.
//!
//! Benchmarks (group `pipeline`, one element = one packet):
//! - `established`: an ACK of one of the 1,000,000 established flows, cycling over all of
//!   them in order, so conntrack lookups miss the caches as they would with real traffic;
//!   `established_hot`: the same over 1,024 flows (the compute floor).
//! - `new_flow`: a SYN of a flow not in conntrack (distinct client address/port each, spread
//!   over the 1,000 services) while the table holds 1,000,000 to 1,100,000 flows. After each
//!   pass over its 100,000 templates the bench moves the clock past the SYN timeout and
//!   sweeps every shard, outside the timed region, so the table never fills and every
//!   measured SYN is a true new flow (see `expire_new_flows` in the scenario).
//! - `*_copy_only`: the same loops with only the 64-byte template copy, the harness cost
//!   included in the figures above; `make bench-pipeline` reports both and the difference.
//!
//! Group `pipeline_tables`:
//! - `conntrack_sweep_step`: one step of the incremental expiry sweep (`begin_batch` once
//!   `sweep_interval_ms` has passed: one shard of 64 per family) with the flows in place.
//! - `maglev_build_{100,1000}`: `MaglevTable::build` at M = 65537.
//! - `table_publish`: `TableBuilder::build` of the full 1,000-service spec plus
//!   `TablesHandle::publish` (which frees the previous snapshot).
//!
//! Every measured packet must be forwarded: setup asserts that every SYN and ACK of the
//! 1,000,000 flows gives `Verdict::Tx`, and each timed loop counts non-`Tx` verdicts and
//! panics if there was one. A counting global allocator reports how many bytes the conntrack
//! takes per flow and checks that the per-packet paths do not allocate.
//!
//! Lines starting with `fact: ` are figures that are not timings (`NAME VALUE UNIT`); the
//! `make bench-pipeline` summary picks them up. Judge changes A/B on the same machine: on the
//! shared 2-core VM wall-clock figures move by 10-60 % between runs with the load of other
//! processes, so compare the callgrind instruction counts first.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use criterion::{BenchmarkGroup, Criterion, Throughput, measurement::WallTime};
use dataplane::addr::{V4, V6};
use dataplane::conntrack::{self, Conntrack};
use dataplane::maglev::{DEFAULT_MAX_TABLE_SIZE, MaglevBackend, MaglevTable, backend_key};
use dataplane::process::{Pipeline, Verdict};
use dataplane::tables::TablesHandle;

#[path = "../../perf/callgrind/scenario.rs"]
#[allow(dead_code, reason = "shared with the callgrind driver, which uses other items")]
mod scenario;

use scenario::{BATCH, FLOWS, NOW_MS, PacketBuf, Templates};

/// New-flow templates per pass; with the [`FLOWS`] established flows this stays below the
/// conntrack capacity.
const NEW_POOL: usize = 100_000;
/// Flows of the `established_hot` loop.
const HOT_FLOWS: usize = 1_024;

/// Live heap bytes and allocation calls, counted by [`Counting`].
static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
static ALLOC_CALLS: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting live bytes and allocation calls (relaxed atomics: one
/// thread allocates here, and the counts are read between phases).
struct Counting;

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so
// `System`'s guarantees hold; the counters have no effect on the memory returned.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOC_CALLS.fetch_add(1, Relaxed);
        LIVE_BYTES.fetch_add(l.size(), Relaxed);
        // SAFETY: same contract as our caller's (non-zero size layout).
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        ALLOC_CALLS.fetch_add(1, Relaxed);
        LIVE_BYTES.fetch_add(l.size(), Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE_BYTES.fetch_sub(l.size(), Relaxed);
        // SAFETY: `p` was allocated by `System` with layout `l` (all our allocations are).
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        ALLOC_CALLS.fetch_add(1, Relaxed);
        LIVE_BYTES.fetch_add(new_size, Relaxed);
        LIVE_BYTES.fetch_sub(l.size(), Relaxed);
        // SAFETY: `p` was allocated by `System` with layout `l`; `new_size` is the caller's.
        unsafe { System.realloc(p, l, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn live() -> usize {
    LIVE_BYTES.load(Relaxed)
}

fn allocs() -> usize {
    ALLOC_CALLS.load(Relaxed)
}

/// Prints a figure for the summary: `fact: NAME VALUE UNIT`.
fn fact(name: &str, value: impl std::fmt::Display, unit: &str) {
    println!("fact: {name} {value} {unit}");
}

/// Everything the packet benchmarks share.
struct Bench {
    /// Tables, populated worker, packet buffer.
    w: scenario::World,
    /// ACK templates of the established flows.
    acks: Templates,
    /// SYN templates of flows not in conntrack.
    new_syns: Templates,
    /// Established flows in conntrack ([`FLOWS`], fewer in test mode).
    flows: usize,
    /// The worker clock (ms); only [`scenario::expire_new_flows`] and the sweep bench move it.
    clock_ms: u64,
    /// Allocations made inside timed packet loops (the pipeline must make none).
    timed_allocs: usize,
}

/// Builds the bench state with `flows` established flows and prints the conntrack size facts.
fn bench_state(flows: usize) -> Bench {
    let started = Instant::now();
    let (_, tables) = scenario::tables();
    let acks = scenario::ack_templates(flows);
    let new_syns = scenario::new_syn_templates(NEW_POOL.min(flows));

    // Bytes the tables reserve up front for CT_CAPACITY flows (forward + reverse, v4).
    let before = live();
    let ct = Conntrack::<V4>::new(scenario::CT_CAPACITY);
    let reserved_v4 = live() - before;
    drop(ct);
    let before = live();
    let empty = Pipeline::new(scenario::config(), 1);
    let worker_empty = live() - before;
    drop(empty);

    let before = live();
    let pipeline = scenario::populate(&tables, &acks, 0x5eed);
    let worker_full = live() - before;
    // Growth beyond the up-front reservation while the flows went in (a shard that outgrew
    // its share would rehash into a bigger allocation).
    let growth = worker_full.saturating_sub(worker_empty);
    let ct_v4_full = reserved_v4 + growth;

    fact("conntrack_fwd_entry_v4_bytes", conntrack::fwd_entry_bytes::<V4>(), "bytes");
    fact("conntrack_fwd_entry_v6_bytes", conntrack::fwd_entry_bytes::<V6>(), "bytes");
    fact("conntrack_rev_entry_v4_bytes", conntrack::rev_entry_bytes::<V4>(), "bytes");
    fact("conntrack_rev_entry_v6_bytes", conntrack::rev_entry_bytes::<V6>(), "bytes");
    fact("conntrack_v4_reserved_mib", format!("{:.1}", mib(reserved_v4)), "MiB");
    fact("conntrack_v4_growth_mib", format!("{:.1}", mib(growth)), "MiB");
    fact("conntrack_v4_bytes_per_flow", format!("{:.1}", ct_v4_full as f64 / flows as f64), "bytes");
    fact("worker_state_mib", format!("{:.1}", mib(worker_full)), "MiB");
    fact("flows_in_conntrack", flows, "flows");
    fact("setup_s", format!("{:.1}", started.elapsed().as_secs_f64()), "s");

    // One more sample packet, checked on its own: an ACK of an existing flow is forwarded.
    let mut w = scenario::World { tables, pipeline, buf: PacketBuf::default() };
    w.pipeline.begin_batch(&w.tables, NOW_MS);
    let v = w.buf.run(&mut w.pipeline, &w.tables, acks.slot(0), acks.frame_len());
    assert!(matches!(v, Verdict::Tx { port: 0 }), "sample established packet: {v:?}");
    Bench { w, acks, new_syns, flows, clock_ms: NOW_MS, timed_allocs: 0 }
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Copies `iters` templates `cursor, cursor + 1, ...` (wrapping at `n`) into the buffer and
/// nothing else: the harness part of the packet loops.
fn copy_only(w: &mut scenario::World, tpl: &Templates, n: usize, cursor: &mut usize, iters: u64) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        w.buf.load(tpl.slot(*cursor));
        black_box(w.buf.bytes());
        *cursor += 1;
        if *cursor == n {
            *cursor = 0;
        }
    }
    start.elapsed()
}

/// Processes `iters` ACKs of flows `cursor, cursor + 1, ...` (wrapping at `n`), one
/// `begin_batch` per [`BATCH`] packets.
///
/// # Panics
/// If a packet was not forwarded.
fn run_acks(b: &mut Bench, n: usize, cursor: &mut usize, iters: u64) -> Duration {
    let (w, acks, clock_ms) = (&mut b.w, &b.acks, b.clock_ms);
    let len = acks.frame_len();
    let mut not_tx = 0usize;
    let a0 = allocs();
    let start = Instant::now();
    for _ in 0..iters {
        if cursor.is_multiple_of(BATCH) {
            w.pipeline.begin_batch(&w.tables, clock_ms);
        }
        let v = w.buf.run(&mut w.pipeline, &w.tables, acks.slot(*cursor), len);
        not_tx += usize::from(!matches!(v, Verdict::Tx { .. }));
        *cursor += 1;
        if *cursor == n {
            *cursor = 0;
        }
    }
    let d = start.elapsed();
    b.timed_allocs += allocs() - a0;
    assert_eq!(not_tx, 0, "established packets must be forwarded");
    d
}

fn established(g: &mut BenchmarkGroup<'_, WallTime>, b: &mut Bench) {
    let (flows, hot) = (b.flows, HOT_FLOWS.min(b.flows));
    let mut cursor = 0;
    g.bench_function("established_copy_only", |x| {
        x.iter_custom(|n| copy_only(&mut b.w, &b.acks, flows, &mut cursor, n))
    });
    let mut cursor = 0;
    g.bench_function("established_hot_copy_only", |x| {
        x.iter_custom(|n| copy_only(&mut b.w, &b.acks, hot, &mut cursor, n))
    });

    b.timed_allocs = 0;
    let mut packets = 0u64;
    let mut cursor = 0;
    g.bench_function("established", |x| {
        x.iter_custom(|n| {
            packets += n;
            run_acks(b, flows, &mut cursor, n)
        })
    });
    let mut cursor = 0;
    g.bench_function("established_hot", |x| {
        x.iter_custom(|n| {
            packets += n;
            run_acks(b, hot, &mut cursor, n)
        })
    });
    fact("established_allocations", b.timed_allocs, "allocs");
    fact("established_packets_timed", packets, "packets");
}

fn new_flow(g: &mut BenchmarkGroup<'_, WallTime>, b: &mut Bench) {
    let pool = b.new_syns.count();
    let mut cursor = 0;
    g.bench_function("new_flow_copy_only", |x| {
        x.iter_custom(|n| copy_only(&mut b.w, &b.new_syns, pool, &mut cursor, n))
    });

    let len = b.new_syns.frame_len();
    let mut cursor = 0usize;
    b.timed_allocs = 0;
    let mut packets = 0u64;
    g.bench_function("new_flow", |x| {
        x.iter_custom(|iters| {
            let (w, tpl) = (&mut b.w, &b.new_syns);
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                if cursor == pool {
                    // Untimed: forget this pass's flows so the next pass's SYNs are new again.
                    b.clock_ms = scenario::expire_new_flows(&mut w.pipeline, &w.tables, b.clock_ms);
                    assert_eq!(w.pipeline.families().v4.ct.len(), b.flows, "only the established flows remain");
                    cursor = 0;
                }
                let n = usize::try_from(left).unwrap_or(usize::MAX).min(pool - cursor);
                let mut not_tx = 0usize;
                let a0 = allocs();
                let start = Instant::now();
                for i in cursor..cursor + n {
                    if i.is_multiple_of(BATCH) {
                        w.pipeline.begin_batch(&w.tables, b.clock_ms);
                    }
                    let v = w.buf.run(&mut w.pipeline, &w.tables, tpl.slot(i), len);
                    not_tx += usize::from(!matches!(v, Verdict::Tx { .. }));
                }
                total += start.elapsed();
                b.timed_allocs += allocs() - a0;
                assert_eq!(not_tx, 0, "new-flow SYNs must be forwarded");
                cursor += n;
                left -= n as u64;
                packets += n as u64;
            }
            total
        })
    });
    fact("new_flow_allocations", b.timed_allocs, "allocs");
    fact("new_flow_packets_timed", packets, "packets");
}

/// One conntrack sweep step as `begin_batch` runs it every `sweep_interval_ms` (10 ms by
/// default): one shard of each family, with the established flows in place. Each iteration
/// moves the clock by one interval (nothing expires: established flows time out after 2^30 s).
fn sweep_step(g: &mut BenchmarkGroup<'_, WallTime>, b: &mut Bench) {
    let step = b.w.pipeline.config().sweep_interval_ms.max(1);
    g.bench_function("conntrack_sweep_step", |x| {
        x.iter_custom(|iters| {
            let w = &mut b.w;
            let start = Instant::now();
            for _ in 0..iters {
                b.clock_ms += step;
                w.pipeline.begin_batch(&w.tables, b.clock_ms);
            }
            start.elapsed()
        })
    });
    fact("conntrack_sweep_interval_ms", step, "ms");
}

/// `n` equal-weight backends 10.x.y.1:80 (as `benches/maglev.rs`).
fn maglev_pool(n: u32) -> Vec<MaglevBackend> {
    (0..n)
        .map(|i| {
            let [_, _, hi, lo] = i.to_be_bytes();
            MaglevBackend { key: backend_key(IpAddr::V4(Ipv4Addr::new(10, hi, lo, 1)), 80), weight: 1 }
        })
        .collect()
}

fn maglev_build(g: &mut BenchmarkGroup<'_, WallTime>) {
    for n in [100, 1000] {
        let pool = maglev_pool(n);
        g.bench_function(format!("maglev_build_{n}"), |b| {
            b.iter(|| MaglevTable::build(black_box(&pool), DEFAULT_MAX_TABLE_SIZE))
        });
    }
}

fn table_publish(g: &mut BenchmarkGroup<'_, WallTime>) {
    let spec = scenario::spec();
    let (mut builder, first) = scenario::tables();
    let handle = TablesHandle::new(first);
    g.bench_function("table_publish", |b| {
        b.iter(|| match builder.build(black_box(&spec)) {
            Ok(t) => handle.publish(t),
            Err(e) => panic!("rebuild failed: {e}"),
        })
    });
    fact("table_services", handle.load().services.len(), "services");
}

fn main() {
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .noise_threshold(0.05)
        .configure_from_args();
    // `cargo test --all-targets` runs this binary without `--bench` (criterion's test mode:
    // each benchmark once, in a debug build); a small conntrack keeps that quick.
    let bench_mode = std::env::args().any(|a| a == "--bench");
    let mut b = bench_state(if bench_mode { FLOWS } else { 10_000 });
    {
        let mut g = c.benchmark_group("pipeline");
        g.throughput(Throughput::Elements(1));
        established(&mut g, &mut b);
        new_flow(&mut g, &mut b);
        g.finish();
    }
    {
        let mut g = c.benchmark_group("pipeline_tables");
        g.sample_size(20);
        sweep_step(&mut g, &mut b);
        drop(b);
        maglev_build(&mut g);
        table_publish(&mut g);
        g.finish();
    }
    c.final_summary();
}
