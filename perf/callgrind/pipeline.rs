//! Callgrind driver for the pipeline (issue 2): instructions per packet, which, unlike wall
//! clock, is stable on a shared 2-core VM.
//!
//! Usage: `callgrind-pipeline established|new_flow K`
//!
//! Sets up the scenario of `perf/callgrind/scenario.rs` (the same tables and 1,000,000
//! established flows as `dataplane/benches/pipeline.rs`), then processes `K` packets of one
//! profile:
//! - `established`: ACKs of established flows `0..K` (wrapping at 1,000,000);
//! - `new_flow`: SYNs of `K` distinct flows not in conntrack (`K` ≤ 200,000, the room the
//!   conntrack capacity leaves).
//!
//! Run it under `valgrind --tool=callgrind --instr-atstart=no` twice, with `K` and `2K`:
//! the driver switches instrumentation on just before the packet loop and off after it
//! (callgrind client requests), so the setup is not even simulated in detail, and the
//! difference `(I(2K) - I(K)) / K` cancels whatever fixed cost remains.
//! `perf/callgrind/run.sh` does exactly that. Outside valgrind the client requests are
//! no-ops, so the driver also runs natively (it then prints the wall time per packet).

use std::hint::black_box;
use std::process::ExitCode;
use std::time::Instant;

use dataplane::process::Verdict;

#[path = "scenario.rs"]
#[allow(dead_code, reason = "shared with the criterion bench, which uses other items")]
mod scenario;

use scenario::{BATCH, FLOWS, NOW_MS, Templates};

/// Callgrind client requests (`valgrind/callgrind.h`).
mod callgrind {
    /// `VG_USERREQ_TOOL_BASE('C', 'T')`.
    const BASE: u64 = ((b'C' as u64) << 24) | ((b'T' as u64) << 16);
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
}

/// Processes templates `0..k` (wrapping), one `begin_batch` per [`BATCH`] packets, and
/// returns the number of packets that were not forwarded.
#[inline(never)]
fn measured(w: &mut scenario::World, tpl: &Templates, k: usize) -> usize {
    let len = tpl.frame_len();
    let mut not_tx = 0;
    callgrind::start();
    for i in 0..k {
        if i.is_multiple_of(BATCH) {
            w.pipeline.begin_batch(&w.tables, NOW_MS);
        }
        let v = w.buf.run(&mut w.pipeline, &w.tables, tpl.slot(i % tpl.count()), len);
        not_tx += usize::from(!matches!(v, Verdict::Tx { .. }));
    }
    callgrind::stop();
    black_box(not_tx)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (profile, k) = match args.as_slice() {
        [_, p, k] => match k.parse::<usize>() {
            Ok(k) if k > 0 => (p.as_str(), k),
            _ => return usage(),
        },
        _ => return usage(),
    };
    let room = scenario::CT_CAPACITY - FLOWS;
    let acks = scenario::ack_templates(FLOWS);
    let mut w = scenario::World::new(&acks);
    let tpl = match profile {
        "established" => acks,
        "new_flow" if k <= room => scenario::new_syn_templates(k),
        "new_flow" => {
            eprintln!("new_flow: K must be at most {room} (conntrack room)");
            return ExitCode::from(2);
        }
        _ => return usage(),
    };
    let start = Instant::now();
    let not_tx = measured(&mut w, &tpl, k);
    let ns = start.elapsed().as_nanos() as f64 / k as f64;
    if not_tx != 0 {
        eprintln!("{profile}: {not_tx} of {k} packets were not forwarded");
        return ExitCode::FAILURE;
    }
    eprintln!("{profile}: {k} packets forwarded, {ns:.1} ns/packet (wall clock; meaningless under valgrind)");
    ExitCode::SUCCESS
}

fn usage() -> ExitCode {
    eprintln!("usage: callgrind-pipeline established|new_flow K");
    ExitCode::from(2)
}
