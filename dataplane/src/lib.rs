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

/// Asks the CPU to bring the cache line holding `x` into every cache level (`prefetcht0`);
/// nothing on other architectures. A hint: it never faults and changes no result. The batch
/// stages issue it for a whole batch before they read, so the misses overlap.
#[inline]
pub(crate) fn prefetch<T>(x: &T) {
    #[cfg(target_arch = "x86_64")]
    safe_arch::prefetch_t0(x);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}
