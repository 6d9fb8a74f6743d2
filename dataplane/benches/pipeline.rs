//! The whole per-packet pipeline at scale: 1,000 VIPs, 10,000 backends, 1,000,000 flows in
//! conntrack (issue 2, and issue 9's batched pipeline).
//!
//! Run: `cargo bench -p dataplane --bench pipeline` (or `make bench-pipeline`, which adds
//! the callgrind instruction and cache-miss counts and prints the summary). The scenario
//! (worlds, flows, streams, buffers) is `perf/callgrind/scenario.rs`, shared with the callgrind
//! driver.
//!
//! Group `batch` (one element = one packet): batches of 64 frames rotated over 4,096 buffers at
//! headroom 0 through `Pipeline::process_batch`, as the AF_XDP workers run it (they leave 256
//! bytes of headroom in front of a frame; at 0 an encapsulation moves the packet instead):
//! - `{mix}_established`: ACKs of established DNAT flows;
//! - `uniform_new_flow`: SYNs of flows not in conntrack (each flow once, so only the uniform
//!   mix exists), while the table holds 1,000,000 to 1,100,000 flows; after each pass over its
//!   100,000 SYNs the bench moves the clock past the SYN timeout and runs a whole sweep pass,
//!   outside the timed region, so every measured SYN is a true new flow;
//! - `{mix}_snat_reply`: replies from the backends of established SNAT flows;
//! - `{mix}_dsr_ipip`: ACKs of established IPIP DSR flows, encapsulated into the tailroom;
//! - `uniform_established6`, `uniform_new_flow6`: the same in the IPv6 DNAT world (74-byte
//!   frames);
//! - `copy_{dnat,snat,dsr,new,dnat6,new6}`: the same loops copying frames into the buffers and
//!   nothing else: the harness cost, subtracted in the `*_ns_per_packet` figures.
//!
//! mix is `uniform` (each packet of a uniformly chosen flow of the 1,000,000), `zipf` (Zipf, s =
//! 1, over them) or `hot` (uniform over 1,024 flows).
//!
//! Group `pipeline` (the old one-packet-at-a-time loop, kept for the ratio and for continuity
//! with earlier figures): `established` (ACKs cycling over the 1,000,000 flows in order),
//! `established_hot` (1,024 flows), `new_flow`, each with its `*_copy_only` baseline, one
//! buffer with 256 bytes of headroom, `Pipeline::process` per packet.
//!
//! Group `pipeline_tables`: `conntrack_sweep_step` (one sweep step with the flows in place),
//! `maglev_build_{100,1000}` (M = 65537), `table_publish` (a rebuild of the 1,000-service spec
//! and its publication).
//!
//! Every measured packet must be forwarded: setup asserts that every SYN and ACK of the
//! 1,000,000 flows gives `Verdict::Tx`, and each timed loop counts non-`Tx` verdicts and
//! panics if there was one. A counting global allocator checks that the per-packet paths do
//! not allocate; the flow table lives in its own anonymous mapping and reports its size
//! itself (`conntrack_*` facts).
//!
//! Lines starting with `fact: ` are figures that are not timings (`NAME VALUE UNIT`); the
//! `make bench-pipeline` summary picks them up. Judge changes A/B on the same machine: on the
//! shared 2-core VM wall-clock figures move by 10-60 % between runs with the load of other
//! processes, so compare the callgrind counts first.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use criterion::{BenchmarkGroup, Criterion, Throughput, measurement::WallTime};
use dataplane::addr::{V4, V6};
use dataplane::conntrack;
use dataplane::maglev::{DEFAULT_MAX_TABLE_SIZE, MaglevBackend, MaglevTable, backend_key};
use dataplane::process::{SWEEP_BUDGET, Verdict};
use dataplane::tables::TablesHandle;

#[path = "../../perf/callgrind/scenario.rs"]
#[allow(dead_code, reason = "shared with the callgrind driver, which uses other items")]
mod scenario;

use dataplane::process::Pipeline;
use scenario::{Arena, BATCH, FLOWS, Kind, Mix, NOW_MS, SLOT, SLOT6, Stream, Templates, World};

/// New-flow SYNs per pass; with the [`FLOWS`] established flows this stays below the
/// conntrack capacity.
const NEW_POOL: usize = 100_000;

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

fn allocs() -> usize {
    ALLOC_CALLS.load(Relaxed)
}

/// Prints a figure for the summary: `fact: NAME VALUE UNIT`.
fn fact(name: &str, value: impl std::fmt::Display, unit: &str) {
    println!("fact: {name} {value} {unit}");
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Resident memory of this process in bytes (`/proc/self/statm`, second field, in pages).
fn rss_bytes() -> usize {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<usize>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// A world with its streams: one per mix for its established packets (ACKs or replies), in
/// templates of `N` bytes ([`SLOT`] for IPv4, [`SLOT6`] for IPv6).
struct Bench<const N: usize = SLOT> {
    w: World,
    arena: Arena,
    /// Packets by mix: uniform, zipf, hot (the IPv6 world: uniform alone).
    streams: Vec<(Mix, Stream<N>)>,
    /// Allocations made inside timed packet loops (the pipeline must make none).
    timed_allocs: usize,
    /// The pipeline's clock (ms) after the last new-flow benchmark: the next one continues
    /// from it, so the conntrack sweep (which runs when the clock has moved on since its last
    /// step) still expires the SYN flows of that benchmark.
    clock: u64,
}

/// Builds `kind`'s world with `flows` flows and the streams of its established packets.
fn world(kind: Kind, flows: usize) -> (Bench, Templates) {
    let acks = scenario::ack_templates(flows);
    let rss0 = rss_bytes();
    let w = World::of(kind, &acks);
    if kind == Kind::Dnat {
        let ct = &w.pipeline.families().v4.ct;
        let n = ct.len();
        fact("conntrack_record_v4_bytes", conntrack::record_bytes::<V4>(), "bytes");
        fact("conntrack_record_v6_bytes", conntrack::record_bytes::<V6>(), "bytes");
        fact("conntrack_entry_bytes", conntrack::entry_bytes(), "bytes");
        fact("conntrack_v4_reserved_mib", format!("{:.1}", mib(ct.bytes_reserved())), "MiB");
        fact("conntrack_v4_bucket_mib", format!("{:.1}", mib(ct.bucket_bytes())), "MiB");
        fact("conntrack_v4_records_touched_mib", format!("{:.1}", mib(ct.record_bytes_touched())), "MiB");
        // All-in bytes per NAT flow as the table holds them: the whole index (every bucket is
        // touched by a busy table) plus the records handed out, over the flows in it.
        let per_flow = (ct.bucket_bytes() + ct.record_bytes_touched()) as f64 / n as f64;
        fact("conntrack_nat_flow_bytes", format!("{per_flow:.1}"), "bytes");
        fact("conntrack_huge_pages_advised", u8::from(ct.huge_pages_advised()), "bool");
        fact("flows_in_conntrack", n, "flows");
        fact("worker_rss_growth_mib", format!("{:.1}", mib(rss_bytes().saturating_sub(rss0))), "MiB");
    }
    let replies = (kind == Kind::Snat).then(|| scenario::snat_reply_templates(&w, flows));
    let tpl = replies.as_ref().unwrap_or(&acks);
    let streams = [Mix::Uniform, Mix::Zipf, Mix::Hot]
        .into_iter()
        .map(|m| (m, Stream::new(tpl, &scenario::sequence(m, flows, 0x5eed_0001))))
        .collect();
    drop(replies);
    (Bench { w, arena: Arena::new(0), streams, timed_allocs: 0, clock: NOW_MS }, acks)
}

/// The IPv6 DNAT world ([`Kind::Dnat6`]) with `flows` flows and the uniform stream of their
/// ACKs.
fn world6(flows: usize) -> Bench<SLOT6> {
    let acks = scenario::ack_templates6(flows);
    let w = World::of6(&acks);
    let streams = vec![(Mix::Uniform, Stream::new(&acks, &scenario::sequence(Mix::Uniform, flows, 0x5eed_0001)))];
    Bench { w, arena: Arena::new(0), streams, timed_allocs: 0, clock: NOW_MS }
}

/// Runs `iters` packets of `stream` from `*at` (wrapping), batch by batch; with `copy_only`,
/// only copies them into the buffers.
///
/// # Panics
/// If a packet was not forwarded.
fn run_stream<const N: usize>(b: &mut Bench<N>, mix: Mix, at: &mut usize, iters: u64, copy_only: bool) -> Duration {
    let Bench { w, arena, streams, timed_allocs, .. } = b;
    let Some((_, s)) = streams.iter().find(|(m, _)| *m == mix) else { return Duration::ZERO };
    let mut left = usize::try_from(iters).unwrap_or(usize::MAX);
    let mut not_tx = 0usize;
    let a0 = allocs();
    let start = Instant::now();
    while left > 0 {
        let take = BATCH.min(left).min(s.count() - *at);
        let frames = s.frames(*at, take);
        if copy_only {
            arena.run(None, frames, s.frame_len());
        } else {
            w.pipeline.begin_batch(&w.tables, NOW_MS);
            not_tx += arena.run(Some((&mut w.pipeline, &w.tables)), frames, s.frame_len());
        }
        left -= take;
        *at = (*at + take) % s.count();
    }
    let d = start.elapsed();
    *timed_allocs += allocs() - a0;
    assert_eq!(not_tx, 0, "established packets must be forwarded");
    d
}

/// The `batch` benchmarks of one world's established packets.
fn batch_world(g: &mut BenchmarkGroup<'_, WallTime>, b: &mut Bench, profile: &str, copy: &str) {
    let mut at = 0;
    g.bench_function(format!("copy_{copy}"), |x| x.iter_custom(|n| run_stream(b, Mix::Uniform, &mut at, n, true)));
    for mix in [Mix::Uniform, Mix::Zipf, Mix::Hot] {
        let mut at = 0;
        g.bench_function(format!("{}_{profile}", mix.name()), |x| {
            x.iter_custom(|n| run_stream(b, mix, &mut at, n, false))
        });
    }
}

/// `batch/uniform_established6` and its copy baseline, on the IPv6 DNAT world.
fn batch_world6(g: &mut BenchmarkGroup<'_, WallTime>, b: &mut Bench<SLOT6>) {
    let mut at = 0;
    g.bench_function("copy_dnat6", |x| x.iter_custom(|n| run_stream(b, Mix::Uniform, &mut at, n, true)));
    let mut at = 0;
    g.bench_function("uniform_established6", |x| x.iter_custom(|n| run_stream(b, Mix::Uniform, &mut at, n, false)));
}

/// `batch/uniform_new_flow` (`suffix` "") or `batch/uniform_new_flow6` (`suffix` "6") and its
/// copy baseline, on the DNAT world of that family: `syns` makes the SYNs of `n` new flows,
/// `tracked` counts the flows of the family's conntrack.
fn batch_new_flow<const N: usize>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    b: &mut Bench<N>,
    suffix: &str,
    syns: impl Fn(usize) -> Templates<N>,
    tracked: impl Fn(&Pipeline) -> usize,
) {
    let pool = NEW_POOL.min(tracked(&b.w.pipeline));
    let syns = Stream::new(&syns(pool), &scenario::in_order(pool));
    let mut at = 0;
    g.bench_function(format!("copy_new{suffix}"), |x| {
        x.iter_custom(|n| {
            let start = Instant::now();
            let mut left = usize::try_from(n).unwrap_or(usize::MAX);
            while left > 0 {
                let take = BATCH.min(left).min(syns.count() - at);
                b.arena.run(None, syns.frames(at, take), syns.frame_len());
                left -= take;
                at = (at + take) % syns.count();
            }
            start.elapsed()
        })
    });
    let flows = tracked(&b.w.pipeline);
    let mut clock = b.clock;
    let mut at = 0;
    g.bench_function(format!("uniform_new_flow{suffix}"), |x| {
        x.iter_custom(|n| {
            let mut total = Duration::ZERO;
            let mut left = usize::try_from(n).unwrap_or(usize::MAX);
            while left > 0 {
                if at == syns.count() {
                    // Untimed: forget this pass's flows so the next pass's SYNs are new again.
                    clock = scenario::expire_new_flows(&mut b.w.pipeline, &b.w.tables, clock);
                    assert_eq!(tracked(&b.w.pipeline), flows, "only the established flows remain");
                    at = 0;
                }
                let take = BATCH.min(left).min(syns.count() - at);
                let a0 = allocs();
                let start = Instant::now();
                b.w.pipeline.begin_batch(&b.w.tables, clock);
                let not_tx =
                    b.arena.run(Some((&mut b.w.pipeline, &b.w.tables)), syns.frames(at, take), syns.frame_len());
                total += start.elapsed();
                b.timed_allocs += allocs() - a0;
                assert_eq!(not_tx, 0, "new-flow SYNs must be forwarded");
                left -= take;
                at += take;
            }
            total
        })
    });
    // Leave only the established flows for the next benchmarks.
    b.clock = scenario::expire_new_flows(&mut b.w.pipeline, &b.w.tables, clock);
}

/// The old one-packet loop (`Pipeline::process`): `established` (in order over all flows),
/// `established_hot` (1,024 flows), `new_flow`, each with a copy-only baseline.
fn single(g: &mut BenchmarkGroup<'_, WallTime>, b: &mut Bench, acks: &Templates) {
    let flows = acks.count();
    let hot = scenario::HOT_FLOWS.min(flows);
    for (name, n) in [("established", flows), ("established_hot", hot)] {
        let mut cursor = 0;
        g.bench_function(format!("{name}_copy_only"), |x| {
            x.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    b.w.buf.load(acks.slot(cursor));
                    black_box(b.w.buf.bytes());
                    cursor = (cursor + 1) % n;
                }
                start.elapsed()
            })
        });
        let mut cursor = 0usize;
        g.bench_function(name, |x| {
            x.iter_custom(|iters| {
                let (w, len) = (&mut b.w, acks.frame_len());
                let mut not_tx = 0usize;
                let a0 = allocs();
                let start = Instant::now();
                for _ in 0..iters {
                    if cursor.is_multiple_of(BATCH) {
                        w.pipeline.begin_batch(&w.tables, NOW_MS);
                    }
                    let v = w.buf.run(&mut w.pipeline, &w.tables, acks.slot(cursor), len);
                    not_tx += usize::from(!matches!(v, Verdict::Tx { .. }));
                    cursor = (cursor + 1) % n;
                }
                let d = start.elapsed();
                b.timed_allocs += allocs() - a0;
                assert_eq!(not_tx, 0, "established packets must be forwarded");
                d
            })
        });
    }
    // The uniform stream of the batch benchmarks, one packet at a time: the ratio to
    // `batch/uniform_established` is what batching buys.
    let mut at = 0;
    g.bench_function("uniform_established", |x| {
        x.iter_custom(|iters| {
            let Bench { w, streams, timed_allocs, .. } = &mut *b;
            let Some((_, s)) = streams.iter().find(|(m, _)| *m == Mix::Uniform) else { return Duration::ZERO };
            let mut not_tx = 0usize;
            let a0 = allocs();
            let start = Instant::now();
            for _ in 0..iters {
                if at % BATCH == 0 {
                    w.pipeline.begin_batch(&w.tables, NOW_MS);
                }
                if let Some(f) = s.frames(at, 1).first() {
                    let v = w.buf.run(&mut w.pipeline, &w.tables, f, s.frame_len());
                    not_tx += usize::from(!matches!(v, Verdict::Tx { .. }));
                }
                at = (at + 1) % s.count();
            }
            let d = start.elapsed();
            *timed_allocs += allocs() - a0;
            assert_eq!(not_tx, 0, "established packets must be forwarded");
            d
        })
    });
    let mut at = 0;
    g.bench_function("uniform_established_copy_only", |x| {
        x.iter_custom(|iters| {
            let Some((_, s)) = b.streams.iter().find(|(m, _)| *m == Mix::Uniform) else { return Duration::ZERO };
            let start = Instant::now();
            for _ in 0..iters {
                if let Some(f) = s.frames(at, 1).first() {
                    b.w.buf.load(f);
                    black_box(b.w.buf.bytes());
                }
                at = (at + 1) % s.count();
            }
            start.elapsed()
        })
    });
    let pool = NEW_POOL.min(flows);
    let syns = scenario::new_syn_templates(pool);
    let mut cursor = 0;
    g.bench_function("new_flow_copy_only", |x| {
        x.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                b.w.buf.load(syns.slot(cursor));
                black_box(b.w.buf.bytes());
                cursor = (cursor + 1) % pool;
            }
            start.elapsed()
        })
    });
    let mut clock = b.clock;
    let mut cursor = 0;
    g.bench_function("new_flow", |x| {
        x.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                if cursor == pool {
                    clock = scenario::expire_new_flows(&mut b.w.pipeline, &b.w.tables, clock);
                    assert_eq!(b.w.pipeline.families().v4.ct.len(), flows, "only the established flows remain");
                    cursor = 0;
                }
                let n = usize::try_from(left).unwrap_or(usize::MAX).min(pool - cursor);
                let mut not_tx = 0usize;
                let a0 = allocs();
                let start = Instant::now();
                for i in cursor..cursor + n {
                    if i.is_multiple_of(BATCH) {
                        b.w.pipeline.begin_batch(&b.w.tables, clock);
                    }
                    let v = b.w.buf.run(&mut b.w.pipeline, &b.w.tables, syns.slot(i), syns.frame_len());
                    not_tx += usize::from(!matches!(v, Verdict::Tx { .. }));
                }
                total += start.elapsed();
                b.timed_allocs += allocs() - a0;
                assert_eq!(not_tx, 0, "new-flow SYNs must be forwarded");
                cursor += n;
                left -= n as u64;
            }
            total
        })
    });
    b.clock = scenario::expire_new_flows(&mut b.w.pipeline, &b.w.tables, clock);
}

/// One conntrack sweep step as the workers do it every `sweep_interval_ms`: one step of each
/// family, with the established flows in place, [`SWEEP_BUDGET`] records per `begin_batch`
/// (the figure is the whole step: every `begin_batch` until none of it is left). Each
/// iteration moves the clock by one interval (nothing expires: established flows time out
/// after 2^30 s).
fn sweep_step(g: &mut BenchmarkGroup<'_, WallTime>, b: &mut Bench) {
    let step = b.w.pipeline.config().sweep_interval_ms.max(1);
    let mut clock = b.clock;
    g.bench_function("conntrack_sweep_step", |x| {
        x.iter_custom(|iters| {
            let w = &mut b.w;
            let start = Instant::now();
            for _ in 0..iters {
                clock += step;
                w.pipeline.begin_batch(&w.tables, clock);
                while w.pipeline.sweep_pending() > 0 {
                    w.pipeline.begin_batch(&w.tables, clock);
                }
            }
            start.elapsed()
        })
    });
    b.clock = clock;
    fact("conntrack_sweep_interval_ms", step, "ms");
    fact("conntrack_sweep_budget_records", SWEEP_BUDGET, "records");
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
    // each benchmark once, in a debug build); small worlds keep that quick.
    let bench_mode = std::env::args().any(|a| a == "--bench");
    let flows = if bench_mode { FLOWS } else { 10_000 };
    let started = Instant::now();
    let (mut dnat, acks) = world(Kind::Dnat, flows);
    let mut allocs_timed = 0;
    {
        let mut g = c.benchmark_group("batch");
        g.throughput(Throughput::Elements(1));
        batch_world(&mut g, &mut dnat, "established", "dnat");
        batch_new_flow(&mut g, &mut dnat, "", scenario::new_syn_templates, |p| p.families().v4.ct.len());
        for (kind, profile, copy) in [(Kind::Snat, "snat_reply", "snat"), (Kind::Dsr, "dsr_ipip", "dsr")] {
            let (mut b, _) = world(kind, flows);
            batch_world(&mut g, &mut b, profile, copy);
            allocs_timed += b.timed_allocs;
        }
        let mut dnat6 = world6(flows);
        batch_world6(&mut g, &mut dnat6);
        batch_new_flow(&mut g, &mut dnat6, "6", scenario::new_syn_templates6, |p| p.families().v6.ct.len());
        allocs_timed += dnat6.timed_allocs;
        g.finish();
    }
    {
        let mut g = c.benchmark_group("pipeline");
        g.throughput(Throughput::Elements(1));
        single(&mut g, &mut dnat, &acks);
        g.finish();
    }
    fact("timed_allocations", allocs_timed + dnat.timed_allocs, "allocs");
    fact("setup_and_run_s", format!("{:.1}", started.elapsed().as_secs_f64()), "s");
    {
        let mut g = c.benchmark_group("pipeline_tables");
        g.sample_size(20);
        sweep_step(&mut g, &mut dnat);
        drop(dnat);
        maglev_build(&mut g);
        table_publish(&mut g);
        g.finish();
    }
    c.final_summary();
}
