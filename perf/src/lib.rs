//! xlb benchmarks: the AF_XDP packet generator (`xlb-pktgen`, module [`pktgen`]) and the raw
//! AF_XDP MAC-rewriting forwarder (`xlb-macfwd`, module [`macfwd`]) that measures the I/O
//! ceiling of one xlb worker. Both use `dataplane::xsk::Xsk`, the same AF_XDP module as the
//! xlb workers, so this crate has no `unsafe` code.
#![forbid(unsafe_code)]

pub mod macfwd;
pub mod pktgen;
pub mod sys;
