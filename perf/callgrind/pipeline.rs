//! Callgrind driver for the pipeline: instructions and last-level cache misses per packet,
//! which, unlike wall clock, are stable on a shared 2-core VM (this VM has no PMU).
//!
//! Usage: `callgrind-pipeline batch|single PROFILE MIX K`
//!
//! Sets up the scenario of `perf/callgrind/scenario.rs` (the same worlds of 1,000 services and
//! 1,000,000 established flows as `dataplane/benches/pipeline.rs`), then processes `2K`
//! packets of one profile, the first `K` to warm the (simulated) caches and the last `K`
//! measured:
//! - `established`: ACKs of established DNAT flows;
//! - `new_flow`: SYNs of distinct flows not in conntrack (`2K` ≤ 200,000, the room the
//!   conntrack capacity leaves; MIX is ignored);
//! - `snat_reply`: replies from the backends of established SNAT flows to the SNAT address;
//! - `dsr_ipip`: ACKs of established IPIP DSR flows, in buffers without headroom (encapsulated
//!   into the tailroom: the IP packet moves);
//! - `dsr_ipip_headroom`: the same in buffers with the 256 bytes of headroom that the AF_XDP
//!   workers hand the pipeline (`XDP_PACKET_HEADROOM`; encapsulated into the headroom);
//! - `syn_flood`: SYNs of distinct new flows into a conntrack that earlier SYNs filled
//!   ([`SYN_FLOOD_CAPACITY`] flows, none established, as under a SYN flood): every one evicts
//!   the oldest half-open flow near its bucket. This world holds no established flows (MIX is
//!   ignored);
//! - `established6`, `new_flow6`: `established` and `new_flow` in the IPv6 DNAT world (the same
//!   services, backends and flows over IPv6, 74-byte frames).
//!
//! MIX (`uniform`, `zipf`, `hot`) picks the flow of each packet (see the scenario). `batch`
//! runs batches of 64 frames rotated over 4,096 buffers at headroom 0 (but `_headroom`) through
//! `Pipeline::process_batch`; `single` is the old loop: one buffer, `Pipeline::process` per
//! packet.
//!
//! Run it under `valgrind --tool=callgrind --instr-atstart=no --collect-atstart=no`: the driver
//! starts instrumentation before the warm-up packets (so the simulated caches hold what a
//! running worker's would) and collects only around the measured packets (callgrind client
//! requests), so `Collected` divided by `K` is per packet. `perf/callgrind/run.sh` does exactly
//! that. Outside valgrind the client requests are no-ops and the driver prints the wall time.
//!
//! With `CG_GENERAL_NEW_FLOWS` set, new flows take the slow path's general route instead of
//! its direct one (`Pipeline::set_direct_new_flows`), for comparing the two; the driver prints
//! how many new flows took the direct route. With `CG_SCHEDULER=random` every service uses the
//! random scheduler (as `make bench` configures xlb) instead of Maglev. With `CG_ONE_SERVICE`
//! set, the new flows of `new_flow` and `syn_flood` all go to one service (as `make bench`'s
//! SYN flood does) instead of taking turns over the 1,000. With `CG_BACKEND_MTU=N` the backends
//! are behind a second port of MTU `N` (the clients' keeps 1,500), so every flow is checked for
//! size (`flow_flags::MTU_CHECK`).
//!
//! `callgrind-pipeline jitter syn_flood uniform BATCHES` (natively, not under valgrind) times
//! each batch instead: the `syn_flood` world, then `BATCHES` batches of 64 new SYNs with the
//! clock moving `JITTER_STEP_US` (default 100 µs, 640,000 SYNs per second) per batch from
//! `JITTER_START_MS` (default the fill's time; 62,500 puts the run in the second when every
//! filling flow's SYN timeout has passed, so the sweep expires them), on a conntrack of
//! `JITTER_CAPACITY` flows (default 262,144), committed first as the workers commit theirs
//! (`JITTER_PREFAULT=0` leaves it to be faulted in by the packets). It prints the batches'
//! p50, p99, p99.9 and maximum (`syn_flood_batch_*_ns`) and the ten slowest: what a worker's
//! RX ring has to absorb.

use std::hint::black_box;
use std::process::ExitCode;
use std::time::Instant;

use dataplane::process::{Pipeline, PipelineConfig, Verdict};

#[path = "scenario.rs"]
#[allow(dead_code, reason = "shared with the criterion bench, which uses other items")]
mod scenario;

use scenario::{Arena, BATCH, FLOWS, Kind, Mix, NOW_MS, Stream, World};

/// Callgrind client requests (`valgrind/callgrind.h`).
mod callgrind {
    /// `VG_USERREQ_TOOL_BASE('C', 'T')`.
    const BASE: u64 = ((b'C' as u64) << 24) | ((b'T' as u64) << 16);
    /// `VG_USERREQ__TOGGLE_COLLECT`.
    const TOGGLE_COLLECT: u64 = BASE + 2;
    /// `VG_USERREQ__START_INSTRUMENTATION`.
    const START_INSTRUMENTATION: u64 = BASE + 4;
    /// `VG_USERREQ__STOP_INSTRUMENTATION`.
    const STOP_INSTRUMENTATION: u64 = BASE + 5;

    /// Sends a client request without arguments. Outside valgrind it does nothing.
    #[cfg(target_arch = "x86_64")]
    fn request(code: u64) {
        let args: [u64; 6] = [code, 0, 0, 0, 0, 0];
        let mut result: u64 = 0;
        // SAFETY: this is valgrind's "special instruction" sequence for amd64
        // (`valgrind.h`, `VALGRIND_DO_CLIENT_REQUEST_EXPR`): four rotates of rdi that add up
        // to 128 bits (rdi is unchanged) and `xchg rbx, rbx` (rbx is unchanged). Natively
        // it only changes flags and rdx (declared); under valgrind, valgrind reads the
        // argument block at rax (valid for the duration, 6 u64) and writes rdx.
        unsafe {
            core::arch::asm!(
                "rol rdi, 3",
                "rol rdi, 13",
                "rol rdi, 61",
                "rol rdi, 51",
                "xchg rbx, rbx",
                inout("rdx") result,
                in("rax") args.as_ptr(),
                inout("rdi") 0u64 => _,
                options(nostack),
            );
        }
        core::hint::black_box(result);
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn request(_code: u64) {}

    /// Starts callgrind's instrumentation (`CALLGRIND_START_INSTRUMENTATION`).
    pub(crate) fn start() {
        request(START_INSTRUMENTATION);
    }

    /// Stops it (`CALLGRIND_STOP_INSTRUMENTATION`).
    pub(crate) fn stop() {
        request(STOP_INSTRUMENTATION);
    }

    /// Toggles event collection (`CALLGRIND_TOGGLE_COLLECT`).
    pub(crate) fn toggle_collect() {
        request(TOGGLE_COLLECT);
    }
}

/// Processes `k` packets of `stream` starting at `*at`, in batches or one at a time (or, with
/// `copy_only`, only copies them into the buffers); returns how many were not forwarded.
#[inline(never)]
fn packets<const N: usize>(
    w: &mut World,
    arena: &mut Arena,
    stream: &Stream<N>,
    at: &mut usize,
    k: usize,
    mode: Mode,
) -> usize {
    let mut not_tx = 0;
    let n = stream.count();
    let mut done = 0;
    while done < k {
        let take = BATCH.min(k - done).min(n - *at);
        let frames = stream.frames(*at, take);
        w.pipeline.begin_batch(&w.tables, NOW_MS);
        match mode {
            Mode::Copy => {
                arena.run(None, frames, stream.frame_len());
            }
            Mode::Batch => not_tx += arena.run(Some((&mut w.pipeline, &w.tables)), frames, stream.frame_len()),
            Mode::Single => {
                for f in frames {
                    let v = w.buf.run(&mut w.pipeline, &w.tables, f, stream.frame_len());
                    not_tx += usize::from(!matches!(v, Verdict::Tx { .. }));
                }
            }
        }
        done += take;
        *at = (*at + take) % n;
    }
    not_tx
}

/// How packets go through the pipeline.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Mode {
    /// Batches of 64 through `process_batch`.
    Batch,
    /// One at a time through `process` (the old loop).
    Single,
    /// Only the harness: copy the frames into the buffers (the baseline to subtract).
    Copy,
}

/// Conntrack capacity of the `syn_flood` profile: the `maxPerCore` of `make bench`'s xlb
/// config (perf/bench), so the table is as full as in the live SYN-flood runs.
const SYN_FLOOD_CAPACITY: usize = 1 << 18;

/// The `syn_flood` world: the DNAT tables and a worker whose conntrack ([`SYN_FLOOD_CAPACITY`])
/// is full of half-open flows (one SYN each of new flows `0..SYN_FLOOD_CAPACITY`), and the
/// SYN templates of the next `n` new flows.
///
/// # Panics
/// If a filling SYN is not forwarded or the table is not full afterwards.
fn syn_flood_world(n: usize) -> (World, scenario::Templates) {
    syn_flood_world_of(SYN_FLOOD_CAPACITY, n)
}

/// [`syn_flood_world`] with a conntrack of `cap` flows (the `jitter` mode's
/// `JITTER_CAPACITY`).
fn syn_flood_world_of(cap: usize, n: usize) -> (World, scenario::Templates) {
    let (_, tables) = scenario::tables_of(Kind::Dnat);
    let cfg = PipelineConfig { conntrack_capacity: cap, ..scenario::config() };
    let mut pipeline = Pipeline::new(cfg, 0x5eed);
    let fill = scenario::new_syn_templates(cap);
    let not_tx = scenario::run_all(&mut pipeline, &tables, &fill, &mut Arena::new(0));
    assert_eq!(not_tx, 0, "the filling SYNs must be forwarded");
    assert_eq!(pipeline.families().v4.ct.len(), cap, "the table is full");
    let tpl = scenario::Templates::new(n, |i| {
        scenario::tcp_frame(scenario::new_flow(cap + i), dataplane::wire::tcp_flags::SYN)
    });
    (World { kind: Kind::Dnat, tables, pipeline, buf: scenario::PacketBuf::default() }, tpl)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let [_, mode, profile, mix, k] = args.as_slice() else { return usage() };
    let is_jitter = mode == "jitter";
    let mode = match mode.as_str() {
        "batch" | "jitter" => Mode::Batch,
        "single" => Mode::Single,
        "copy" => Mode::Copy,
        _ => return usage(),
    };
    let (Some(mix), Ok(k)) = (Mix::from_name(mix), k.parse::<usize>()) else { return usage() };
    if k == 0 {
        return usage();
    }
    if is_jitter {
        return if profile == "syn_flood" { jitter(k) } else { usage() };
    }
    if profile == "syn_flood" {
        let (mut w, tpl) = syn_flood_world(2 * k);
        let stream = Stream::new(&tpl, &scenario::in_order(2 * k));
        drop(tpl);
        return measure(&mut w, &stream, k, mode, profile, mix);
    }
    if let Some(base) = profile.strip_suffix('6') {
        return ipv6(base, k, mode, profile, mix);
    }
    let kind = match profile.as_str() {
        "established" | "new_flow" => Kind::Dnat,
        "snat_reply" => Kind::Snat,
        "dsr_ipip" | "dsr_ipip_headroom" => Kind::Dsr,
        _ => return usage(),
    };
    let acks = scenario::ack_templates(FLOWS);
    let mut w = World::of(kind, &acks);
    let room = scenario::CT_CAPACITY - FLOWS;
    let tpl = match profile.as_str() {
        "new_flow" if 2 * k <= room => scenario::new_syn_templates(2 * k),
        "new_flow" => {
            eprintln!("new_flow: 2K must be at most {room} (conntrack room)");
            return ExitCode::from(2);
        }
        "snat_reply" => scenario::snat_reply_templates(&w, FLOWS),
        _ => acks,
    };
    let seq =
        if profile == "new_flow" { scenario::in_order(2 * k) } else { scenario::sequence(mix, FLOWS, 0x5eed_0001) };
    let stream = Stream::new(&tpl, &seq);
    drop(seq);
    measure(&mut w, &stream, k, mode, profile, mix)
}

/// The IPv6 profiles (`established6`, `new_flow6`; `base` without the `6`).
fn ipv6(base: &str, k: usize, mode: Mode, profile: &str, mix: Mix) -> ExitCode {
    let acks = scenario::ack_templates6(FLOWS);
    let mut w = World::of6(&acks);
    let room = scenario::CT_CAPACITY - FLOWS;
    let (tpl, seq) = match base {
        "established" => (acks, scenario::sequence(mix, FLOWS, 0x5eed_0001)),
        "new_flow" if 2 * k <= room => (scenario::new_syn_templates6(2 * k), scenario::in_order(2 * k)),
        "new_flow" => {
            eprintln!("{profile}: 2K must be at most {room} (conntrack room)");
            return ExitCode::from(2);
        }
        _ => return usage(),
    };
    let stream = Stream::new(&tpl, &seq);
    drop((tpl, seq));
    measure(&mut w, &stream, k, mode, profile, mix)
}

/// Runs `2k` packets of `stream` through `w`, collecting only the last `k` under callgrind.
fn measure<const N: usize>(
    w: &mut World,
    stream: &Stream<N>,
    k: usize,
    mode: Mode,
    profile: &str,
    mix: Mix,
) -> ExitCode {
    if std::env::var_os("CG_GENERAL_NEW_FLOWS").is_some() {
        w.pipeline.set_direct_new_flows(false);
    }
    let mut arena = Arena::new(if profile.ends_with("_headroom") { scenario::HEADROOM } else { 0 });
    let mut at = 0;
    let direct_before = w.pipeline.direct_new_flows();
    callgrind::start();
    if std::env::var_os("CG_TOGGLE_FIRST").is_some() {
        callgrind::toggle_collect();
    }
    let warm = packets(w, &mut arena, stream, &mut at, k, mode);
    callgrind::toggle_collect();
    let start = Instant::now();
    let not_tx = packets(w, &mut arena, stream, &mut at, k, mode);
    let ns = start.elapsed().as_nanos() as f64 / k as f64;
    callgrind::toggle_collect();
    callgrind::stop();
    black_box(&arena);
    if warm + not_tx != 0 {
        let c = w.pipeline.counters();
        let why: Vec<String> = dataplane::counters::DropReason::ALL
            .iter()
            .filter(|r| c.drops_of(**r) != 0)
            .map(|r| format!("{} {}", r.name(), c.drops_of(*r)))
            .collect();
        eprintln!("{profile}: {} of {} packets were not forwarded (drops: {})", warm + not_tx, 2 * k, why.join(", "));
        return ExitCode::FAILURE;
    }
    eprintln!(
        "{mode:?} {profile} {}: {k} packets forwarded, {ns:.1} ns/packet (wall clock; meaningless under valgrind)",
        mix.name()
    );
    let direct = w.pipeline.direct_new_flows() - direct_before;
    eprintln!("new flows that took the direct route: {direct} of the {} packets", 2 * k);
    ExitCode::SUCCESS
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: callgrind-pipeline batch|single|copy established|new_flow|snat_reply|dsr_ipip|dsr_ipip_headroom|syn_flood|established6|new_flow6 uniform|zipf|hot K\n       callgrind-pipeline jitter syn_flood uniform BATCHES"
    );
    ExitCode::from(2)
}

/// The `jitter` mode: the wall time of each batch of a SYN flood into a full table while the
/// clock moves as it does live (see the module docs); prints the distribution and the ten
/// slowest batches. Not for valgrind.
fn jitter(batches: usize) -> ExitCode {
    let env = |name: &str, default: u64| std::env::var(name).ok().and_then(|s| s.parse().ok()).unwrap_or(default);
    let cap = usize::try_from(env("JITTER_CAPACITY", SYN_FLOOD_CAPACITY as u64)).unwrap_or(SYN_FLOOD_CAPACITY);
    let (start_ms, step_us, prefault) =
        (env("JITTER_START_MS", NOW_MS), env("JITTER_STEP_US", 100), env("JITTER_PREFAULT", 1));
    let n = batches * BATCH;
    let (mut w, tpl) = syn_flood_world_of(cap, n);
    let stream = Stream::new(&tpl, &scenario::in_order(n));
    drop(tpl);
    if prefault != 0 {
        let t0 = Instant::now();
        let bytes = w.pipeline.prefault();
        eprintln!("prefault: {bytes} bytes in {:.1} ms", t0.elapsed().as_secs_f64() * 1e3);
    }
    let mut arena = Arena::new(0);
    // Touch every frame buffer once (untimed), as a running worker's UMEM is.
    for _ in 0..scenario::BUFFERS / BATCH {
        arena.run(None, stream.frames(0, BATCH), stream.frame_len());
    }
    let at_ms = |b: usize| start_ms + (b as u64).saturating_mul(step_us) / 1000;
    let mut times: Vec<(u64, usize)> = Vec::with_capacity(batches);
    let mut not_tx = 0;
    for b in 0..batches {
        let t0 = Instant::now();
        w.pipeline.begin_batch(&w.tables, at_ms(b));
        not_tx += arena.run(Some((&mut w.pipeline, &w.tables)), stream.frames(b * BATCH, BATCH), stream.frame_len());
        times.push((u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX), b));
    }
    if not_tx != 0 {
        eprintln!("jitter: {not_tx} SYNs were not forwarded");
        return ExitCode::FAILURE;
    }
    let mut sorted: Vec<u64> = times.iter().map(|x| x.0).collect();
    sorted.sort_unstable();
    let q = |num: usize, den: usize| sorted.get((sorted.len() - 1) * num / den).copied().unwrap_or(0);
    println!("syn_flood_flows {cap} flows");
    println!("syn_flood_batch_p50_ns {} ns", q(1, 2));
    println!("syn_flood_batch_p99_ns {} ns", q(99, 100));
    println!("syn_flood_batch_p999_ns {} ns", q(999, 1000));
    println!("syn_flood_batch_max_ns {} ns", q(1, 1));
    times.sort_unstable_by_key(|&(ns, _)| core::cmp::Reverse(ns));
    for (ns, b) in times.iter().take(10) {
        eprintln!("  batch {b} at {} ms: {ns} ns", at_ms(*b));
    }
    ExitCode::SUCCESS
}
