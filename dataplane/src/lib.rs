//! xlb dataplane: the per-packet pipeline and the AF_XDP workers.
//!
//! Layers, bottom to top (each uses only the ones below it):
//! 1. [`addr`], [`csum`], [`wire`]: address families, RFC 1071/1624 checksums, header views.
//! 2. [`tables`], [`maglev`], [`conntrack`], [`counters`]: immutable service tables and
//!    Maglev lookup tables, per-worker flow state, per-worker counters.
//! 3. [`sched`], [`affinity`], [`nat`], [`icmp`], [`frag`]: IPVS-style schedulers, the node's
//!    ClientIP affinity records, NAT/DSR rewrites, ICMP error translation and generation, the
//!    fragment table.
//! 4. [`process`]: the pipeline, one call per frame returning a [`process::Verdict`].
//!
//! [`build`] makes frames for tests, benchmarks and fuzz seeds; [`par`] maps over Services on
//! a few threads for the table builds (layer 2) and the control crate's translation. Neither is
//! used per packet.
#![deny(unsafe_code)]

pub mod addr;
pub mod affinity;
pub mod build;
pub mod conntrack;
pub mod counters;
pub mod csum;
pub mod frag;
mod hash;
pub mod icmp;
pub mod maglev;
pub mod nat;
pub mod par;
pub mod process;
pub mod sched;
pub mod tables;
pub mod tap;
pub mod wire;
pub mod worker;
pub mod xsk;

/// Asks the CPU to bring the cache line holding `x` into the second-level cache and the levels
/// after it (`prefetcht1`: "temporal data with respect to first level cache", Intel SDM vol. 2B,
/// PREFETCHh); nothing on other architectures. A hint: it never faults and changes no result.
/// The batch stages issue it for a whole batch before they read, so the misses overlap; the read
/// a stage later then finds the line in the L2. `prefetcht1` rather than `prefetcht0` (into the
/// L1 as well): with `prefetcht0` the prefetches of a SYN flood's batch stalled the worker
/// themselves (most of a stage's samples on the instruction after one), and with `prefetcht1`
/// xlb forwarded 5–7 % more SYNs in three live A/Bs, established traffic within the noise
/// (docs/benchmarks.md, "Prefetching into the L2").
#[inline]
pub(crate) fn prefetch<T>(x: &T) {
    #[cfg(target_arch = "x86_64")]
    safe_arch::prefetch_t1(x);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}
