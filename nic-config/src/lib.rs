//! Interface setup for xlb: the XDP steering program, neighbours, and interface facts.
//!
//! * [`Steering`]: our own small XDP program (`xdp/steer.c`, compiled by `build.rs` with
//!   `clang -target bpf`, loaded with aya 0.14). It redirects to the AF_XDP socket of the
//!   receive queue only what xlb must handle — listed service ports, SNAT replies, ICMP errors
//!   about them, fragments to VIPs — and passes everything else (ARP, NDP, SSH, kubelet, the
//!   API server) to the kernel, so the host stays reachable while xlb runs. AF_XDP sockets must
//!   then be created with libxdp's `XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD` so libxdp does not
//!   attach its own catch-all program, and be put into the map with [`Steering::set_xsk`].
//!   Map layouts: see `maps.rs` and the top of `xdp/steer.c`.
//! * [`L2Responder`]: L2 announcement of VIPs. The steering program answers ARP requests
//!   and Neighbor Solicitations for the addresses of its `l2_addrs` map itself (`XDP_TX`);
//!   the responder fills that map and sends gratuitous ARP / unsolicited Neighbor
//!   Advertisements from a packet socket.
//! * [`neighbours`]: the kernel's ARP/NDP table over rtnetlink — dump, watch, resolve.
//! * [`punt`]: the exception path, a TUN device through which frames that are not xlb's go
//!   back into the kernel.
//! * [`rules`]: policy rules that send the replies of backends reached through the kernel into
//!   the punt device.
//! * [`routes`]: the unicast routes of a routing table over rtnetlink (gateways, multipath).
//! * [`local_addresses`]: every address of every interface.
//! * [`interface_info`], [`set_channels`], [`set_tx_checksum_offload`]: interface facts and the
//!   two ethtool settings xlb needs.
//!
//! All of it needs root (CAP_NET_ADMIN, CAP_BPF) and acts in the network namespace of the
//! calling thread. Nothing is pinned or left behind: dropping [`Steering`] detaches the program
//! and frees its maps.
//!
//! This crate contains no `unsafe` code.

#![forbid(unsafe_code)]

mod error;
mod filter;
mod iface;
mod index;
mod l2;
mod maps;
pub mod neighbours;
mod nl;
pub mod punt;
pub mod routes;
pub mod rules;
mod steering;

pub use error::NicError;
pub use filter::l2_filter_bit;
pub use iface::{
    Channels, InterfaceAddress, InterfaceInfo, channels, ifindex, interface_info, local_addresses, set_channels,
    set_tx_checksum_offload, tx_checksum_offload,
};
pub use index::{
    endpoints4_index_home, endpoints6_index_home, services4_index_home, services6_index_home, snat4_index_home,
    snat6_index_home,
};
pub use l2::{L2Responder, gratuitous_arp, unsolicited_na};
pub use maps::{IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP, ServiceKey};
pub use neighbours::{Neighbour, NeighbourEvent, NeighbourState, NeighbourWatcher};
pub use steering::{
    MAX_ENDPOINTS, MAX_L2_ADDRS, MAX_QUEUES, MAX_SERVICES, MAX_SNAT_ADDRS, MAX_VIP_ADDRS, PROGRAM_NAME, Steering,
    SteeringStats, XdpMode, detach_leftover, program_holders,
};
