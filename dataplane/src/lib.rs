//! xlb dataplane: the per-packet pipeline and the AF_XDP workers.
//!
//! Layers, bottom to top (each uses only the ones below it):
//! 1. [`addr`], [`csum`], [`wire`]: address families, RFC 1071/1624 checksums, header views.
//! 2. [`tables`], [`maglev`], [`conntrack`], [`counters`]: immutable service tables and
//!    Maglev lookup tables, per-worker flow state, per-worker counters.
//! 3. [`sched`], [`nat`], [`icmp`], [`frag`]: IPVS-style schedulers, NAT/DSR rewrites,
//!    ICMP error translation and generation, the fragment table.
//! 4. [`process`]: the pipeline, one call per frame returning a [`process::Verdict`].
//!
//! [`build`] makes frames for tests, benchmarks and fuzz seeds; it is not used per packet.
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
pub mod process;
pub mod sched;
pub mod tables;
pub mod tap;
pub mod wire;
pub mod worker;
pub mod xsk;
