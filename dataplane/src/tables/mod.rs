//! Service tables: the immutable snapshot that workers read without locks.
//!
//! The control thread describes the wanted state as a [`TablesSpec`] (plain data, built from
//! a config file or from Kubernetes objects), and a [`TableBuilder`] turns it into a
//! [`Tables`] snapshot: VIP map, per-service scheduler data (Maglev lookup tables included),
//! backend slots and next hops. [`TablesHandle`] publishes snapshots with `arc-swap`; a worker
//! loads the current one once per RX batch (crates.md §5).
//!
//! Backends are named by a [`BackendRef`]: a slot index plus a reuse generation, stable across
//! rebuilds for as long as the backend (service, address, port) stays in the tables. Conntrack
//! stores the ref, so an established flow keeps its backend across table changes, and notices
//! (ref mismatch) when its backend was removed.

#![deny(clippy::panic, clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::net::IpAddr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use hashbrown::HashMap;

use crate::addr::Cidr;
use crate::maglev::{self, MaglevTable};

mod build;
pub mod persist;

pub use build::{
    BuildKind, HASH_BUCKETS, MAGLEV_JOBS_PER_CLAIM, MAGLEV_JOBS_PER_THREAD, MaglevBuildStats, TableBuilder,
};
pub use persist::{Chunked, KeyMap, KeySet};

/// Layer-4 protocol of a service port (Kubernetes `ServicePort.protocol`, PORT-01).
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
#[repr(u8)]
pub enum L4Proto {
    /// TCP, IP protocol 6 (RFC 9293).
    Tcp = 6,
    /// UDP, IP protocol 17 (RFC 768).
    Udp = 17,
    /// SCTP, IP protocol 132 (RFC 9260).
    Sctp = 132,
}

impl L4Proto {
    /// From an IP protocol number; `None` for protocols a service cannot have.
    #[inline]
    pub fn from_ip_proto(p: u8) -> Option<Self> {
        match p {
            6 => Some(Self::Tcp),
            17 => Some(Self::Udp),
            132 => Some(Self::Sctp),
            _ => None,
        }
    }
    /// The Kubernetes spelling: `TCP`, `UDP` or `SCTP`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
            Self::Sctp => "SCTP",
        }
    }
}

/// How a new flow picks its backend. Names as IPVS names them (ipvsadm(8) `--scheduler`;
/// seed-features SCHED-01..10).
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub enum Scheduler {
    /// Uniform (weighted) random choice: kube-proxy iptables/nftables default (SCHED-01).
    Random,
    /// Maglev hashing (NSDI'16 §3.4) on the source address, plus the source port when
    /// `port` is set (IPVS `mh-port`, which kube-proxy always sets; SCHED-03).
    Maglev {
        /// Hash the source port too (`mh-port`).
        port: bool,
    },
    /// Round robin (SCHED-04).
    RoundRobin,
    /// Weighted round robin, smooth (nginx) variant (SCHED-05).
    WeightedRoundRobin,
    /// Least connections: fewest `active * 256 + inactive` (IPVS `ip_vs_lc.c`; SCHED-06).
    LeastConnection,
    /// Weighted least connections: least overhead / weight (SCHED-07).
    WeightedLeastConnection,
    /// Source hashing on the client address, weighted static table (SCHED-09).
    SourceHash,
    /// Destination hashing on the VIP address, weighted static table (SCHED-09).
    DestinationHash,
    /// Shortest expected delay: least `(active + 1) / weight` (SCHED-10).
    ShortestExpectedDelay,
    /// Never queue: an idle backend if any, else like `sed` (SCHED-10).
    NeverQueue,
}

impl Scheduler {
    /// The IPVS name (`random`, `mh`, `rr`, `wrr`, `lc`, `wlc`, `sh`, `dh`, `sed`, `nq`);
    /// `mh` without the port is printed `mh-noport`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Random => "random",
            Self::Maglev { port: true } => "mh",
            Self::Maglev { port: false } => "mh-noport",
            Self::RoundRobin => "rr",
            Self::WeightedRoundRobin => "wrr",
            Self::LeastConnection => "lc",
            Self::WeightedLeastConnection => "wlc",
            Self::SourceHash => "sh",
            Self::DestinationHash => "dh",
            Self::ShortestExpectedDelay => "sed",
            Self::NeverQueue => "nq",
        }
    }

    /// Every scheduler, in the order error messages list them.
    pub const ALL: [Self; 11] = [
        Self::Random,
        Self::Maglev { port: true },
        Self::Maglev { port: false },
        Self::RoundRobin,
        Self::WeightedRoundRobin,
        Self::LeastConnection,
        Self::WeightedLeastConnection,
        Self::SourceHash,
        Self::DestinationHash,
        Self::ShortestExpectedDelay,
        Self::NeverQueue,
    ];

    /// Parses an IPVS scheduler name (see [`Scheduler::name`]); `None` if unknown.
    pub fn from_name(s: &str) -> Option<Self> {
        Some(match s {
            "random" => Self::Random,
            "mh" => Self::Maglev { port: true },
            "mh-noport" => Self::Maglev { port: false },
            "rr" => Self::RoundRobin,
            "wrr" => Self::WeightedRoundRobin,
            "lc" => Self::LeastConnection,
            "wlc" => Self::WeightedLeastConnection,
            "sh" => Self::SourceHash,
            "dh" => Self::DestinationHash,
            "sed" => Self::ShortestExpectedDelay,
            "nq" => Self::NeverQueue,
            _ => return None,
        })
    }
}

/// How packets reach the chosen backend.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub enum ForwardingMode {
    /// Destination NAT (kube-proxy's mode); replies come back through xlb and are translated.
    /// Source NAT is added per frontend (see [`Frontend::masquerade`]).
    Nat,
    /// Direct server return by IP-in-IP (RFC 2003) or IPv6-in-IPv6 (RFC 2473) encapsulation,
    /// as Katran does; the backend decapsulates and answers the client directly.
    DsrIpip,
    /// Direct server return by MAC rewrite only; the backend must be on-link and hold the VIP.
    DsrL2,
}

impl ForwardingMode {
    /// Every mode, in the order error messages list them.
    pub const ALL: [Self; 3] = [Self::Nat, Self::DsrIpip, Self::DsrL2];

    /// Short name for tables and logs: `nat`, `dsr-ipip`, `dsr-l2`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Nat => "nat",
            Self::DsrIpip => "dsr-ipip",
            Self::DsrL2 => "dsr-l2",
        }
    }
}

/// A scheduler or forwarding-mode name that is not one ([`Scheduler`]'s and
/// [`ForwardingMode`]'s `FromStr`); the message lists the accepted names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {given:?}; use one of {accepted}")]
pub struct UnknownName {
    /// `scheduler` or `forwarding mode`.
    pub what: &'static str,
    /// The name given (trimmed).
    pub given: String,
    /// The accepted names, comma-separated.
    pub accepted: String,
}

impl core::str::FromStr for Scheduler {
    type Err = UnknownName;

    /// Parses an IPVS scheduler name as `ipvs.scheduler` and the annotation
    /// `xlb.dev/scheduler` give it (surrounding blanks ignored).
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        Self::from_name(s.trim()).ok_or_else(|| UnknownName {
            what: "scheduler",
            given: s.trim().to_owned(),
            accepted: Self::ALL.map(Self::name).join(", "),
        })
    }
}

impl core::str::FromStr for ForwardingMode {
    type Err = UnknownName;

    /// Parses `nat`, `dsr-ipip` or `dsr-l2` (`forwardingMode`, annotation
    /// `xlb.dev/forwarding-mode`; surrounding blanks ignored).
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        let t = s.trim();
        Self::ALL.into_iter().find(|m| m.name() == t).ok_or_else(|| UnknownName {
            what: "forwarding mode",
            given: t.to_owned(),
            accepted: Self::ALL.map(Self::name).join(", "),
        })
    }
}

/// What to do with a new flow when the service has no backend eligible for new flows.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub enum EmptyAction {
    /// Answer with ICMP port unreachable / ICMPv6 port unreachable, as kube-proxy's REJECT
    /// rule does (REJ-03, REJ-04).
    Reject,
    /// Drop silently: `internalTrafficPolicy: Local` / `externalTrafficPolicy: Local` with no
    /// local endpoint (REJ-01, REJ-02).
    Drop,
}

/// Which Kubernetes address a frontend comes from.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub enum FrontendKind {
    /// `spec.clusterIPs[]` (SVC-01).
    ClusterIp,
    /// A node address with `spec.ports[].nodePort` (SVC-02, NPA-01..07).
    NodePort,
    /// `status.loadBalancer.ingress[].ip` (SVC-06).
    LoadBalancer,
    /// `spec.externalIPs[]` (SVC-11).
    ExternalIp,
}

impl FrontendKind {
    /// Short name: `ClusterIP`, `NodePort`, `LoadBalancer`, `ExternalIP`.
    pub fn name(self) -> &'static str {
        match self {
            Self::ClusterIp => "ClusterIP",
            Self::NodePort => "NodePort",
            Self::LoadBalancer => "LoadBalancer",
            Self::ExternalIp => "ExternalIP",
        }
    }
}

/// One (address, protocol, port) on which a service is reached.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Frontend {
    /// Destination address (VIP, node address or ingress IP).
    pub addr: IpAddr,
    /// Protocol.
    pub proto: L4Proto,
    /// Destination port (host order).
    pub port: u16,
    /// Where the address comes from.
    pub kind: FrontendKind,
    /// Source-NAT new flows to the node's SNAT address (NAT-02, NAT-04); ignored for DSR.
    pub masquerade: bool,
    /// Allowed client prefixes (`loadBalancerSourceRanges`, LB-01); empty = everyone.
    pub source_ranges: Vec<Cidr>,
}

impl Frontend {
    /// A frontend open to every client (no `loadBalancerSourceRanges`).
    pub fn new(addr: IpAddr, proto: L4Proto, port: u16, kind: FrontendKind, masquerade: bool) -> Self {
        Self { addr, proto, port, kind, masquerade, source_ranges: Vec::new() }
    }
}

/// Endpoint conditions as the EndpointSlice reports them (EPS-05, EPS-06); kept for display.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug, Default)]
pub struct Conditions {
    /// `conditions.ready`.
    pub ready: bool,
    /// `conditions.serving`.
    pub serving: bool,
    /// `conditions.terminating`.
    pub terminating: bool,
}

/// One backend (endpoint) of a service.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct BackendSpec {
    /// Endpoint address (`endpoints[].addresses[0]`, EPS-11).
    pub addr: IpAddr,
    /// Target port (host order), resolved from the slice's `ports[]` (PORT-04).
    pub port: u16,
    /// Relative weight for weighted schedulers; Kubernetes has none, so 1 (G-08). 0 = none.
    pub weight: u16,
    /// Whether new flows may go here. `false` keeps the backend for its existing flows only
    /// (a serving terminating endpoint draining, TP-06).
    pub eligible: bool,
    /// Conditions from the EndpointSlice.
    pub conditions: Conditions,
    /// Endpoint is on this node (`nodeName` equals our Node's name, TP-05).
    pub node_local: bool,
}

impl BackendSpec {
    /// A ready endpoint (ready and serving, not terminating, EPS-05) that takes new flows with
    /// weight 1 (G-08), not on this node.
    pub fn ready(addr: IpAddr, port: u16) -> Self {
        Self {
            addr,
            port,
            weight: 1,
            eligible: true,
            conditions: Conditions { ready: true, serving: true, terminating: false },
            node_local: false,
        }
    }
}

/// One load-balanced service as the dataplane sees it: a set of frontends sharing a backend
/// set and policy. A Kubernetes Service port gives one spec per traffic class (internal,
/// external) when their endpoint selections differ.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct ServiceSpec {
    /// Unique name for counters and the CLI, e.g. `default/web:http` (with a suffix such
    /// as `/external` for a second traffic class).
    pub name: String,
    /// Frontends; each (addr, proto, port) must be unique across all services.
    pub frontends: Vec<Frontend>,
    /// Scheduler for new flows.
    pub scheduler: Scheduler,
    /// ClientIP session affinity timeout in seconds (`sessionAffinityConfig.clientIP.timeoutSeconds`,
    /// AFF-01..03); `None` = no affinity.
    pub affinity_timeout_s: Option<u32>,
    /// Forwarding mode.
    pub mode: ForwardingMode,
    /// What a new flow gets when no backend is eligible.
    pub when_empty: EmptyAction,
    /// Backends; (addr, port) must be unique within the service.
    pub backends: Vec<BackendSpec>,
}

/// A neighbour-table entry (the kernel's ARP/NDP cache, mirrored by the control side).
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub struct NeighbourSpec {
    /// Neighbour address.
    pub addr: IpAddr,
    /// Link-layer address.
    pub mac: [u8; 6],
    /// xlb port (index into [`TablesSpec::ports`]) on which it is reached.
    pub port: u8,
}

/// One xlb port: an interface the workers transmit on.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct PortSpec {
    /// Interface name, for display.
    pub name: String,
    /// The interface's own MAC, used as source MAC on transmit.
    pub mac: [u8; 6],
    /// MTU in bytes (L3). Encapsulated packets larger than this get ICMP "fragmentation
    /// needed" / "packet too big" back (RFC 1191, RFC 8201).
    pub mtu: u16,
}

/// A route for backends that are not on-link: prefix → gateway (which must be a neighbour).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct RouteSpec {
    /// Destination prefix.
    pub dst: Cidr,
    /// Gateway address.
    pub via: IpAddr,
}

/// A unicast route mirrored from the kernel's routing table (`RTM_GETROUTE`, read by the
/// control side): prefix → gateways, none for a directly connected network.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct KernelRouteSpec {
    /// Destination prefix.
    pub dst: Cidr,
    /// Gateways, in the kernel's order (several for a multipath route); empty = on-link.
    pub gateways: Vec<IpAddr>,
    /// Route metric (`RTA_PRIORITY`): of routes to the same prefix the lowest is used.
    pub metric: u32,
    /// The route leaves through an interface xlb does not serve (a pod's veth, a bridge such
    /// as `cni0`, another NIC): its backends are reached through the kernel
    /// ([`NextHop::Kernel`]).
    pub kernel: bool,
}

/// The hash that spreads flows over the paths of a multipath route, over the flow as it
/// leaves xlb (after NAT): source and destination address, and with `l4` also the protocol
/// and ports, like the kernel's `fib_multipath_hash_policy` 0 (L3) and 1 (L4)
/// (Documentation/networking/ip-sysctl.rst). FNV-1a: stable across builds and processes (the
/// kernel's own hash is seeded, so a flow may take another path than the kernel would give it;
/// the spread is what matters).
#[inline]
pub fn multipath_hash(l4: bool, src: &[u8], dst: &[u8], proto: u8, sport: u16, dport: u16) -> u32 {
    let fnv = |h: u32, b: &u8| (h ^ u32::from(*b)).wrapping_mul(0x0100_0193);
    let h = src.iter().chain(dst).fold(0x811c_9dc5, fnv);
    if !l4 {
        return h;
    }
    let (s, d) = (sport.to_be_bytes(), dport.to_be_bytes());
    [proto].iter().chain(&s).chain(&d).fold(h, fnv)
}

impl Backend {
    /// The next hop of a flow whose [`multipath_hash`] is `h`: one of [`Backend::paths`] when
    /// the backend is behind a multipath route, else [`Backend::hop`].
    #[inline]
    pub fn path(&self, h: u32) -> Option<Hop> {
        match self.paths.len() {
            0 => self.hop,
            n => self.paths.get(h as usize % n).copied(),
        }
    }
}

/// The port number of the kernel ("the punt device") in [`Hop::port`] and
/// `Verdict::Tx { port }`: the worker writes such frames' IP packets into its punt queue and
/// the kernel routes them (backends on this node behind a veth). Not an index into
/// [`TablesSpec::ports`].
pub const KERNEL_PORT: u8 = u8::MAX;

/// Where a backend's packets go next ([`TablesSpec::routes`], then
/// [`TablesSpec::kernel_routes`]).
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum NextHop {
    /// This neighbour (the backend itself when on-link, else a gateway).
    Via(IpAddr),
    /// The kernel's routes are known and none matches: the backend cannot be reached.
    NoRoute,
    /// The route leaves through an interface xlb does not serve: hand the packet to the kernel
    /// ([`KERNEL_PORT`]).
    Kernel,
}

/// Longest-prefix-match index over [`TablesSpec::kernel_routes`]: per address family and
/// prefix length present, a hash map from the masked prefix to its route (the lowest metric
/// of equal prefixes). A lookup costs one probe per distinct prefix length (at most 33 for
/// IPv4, 129 for IPv6) instead of a scan of every route, so a node with a large routing table
/// (a full BGP table) still builds its tables in time.
#[derive(Debug)]
pub struct RouteIndex<'a> {
    /// (IPv4?, prefix length) present, longest first.
    lens: Vec<(bool, u8)>,
    best: HashMap<(bool, u8, u128), &'a KernelRouteSpec>,
}

/// An address as (IPv4?, its bits in the low end of a u128).
fn route_bits(a: IpAddr) -> (bool, u128) {
    match a {
        IpAddr::V4(v) => (true, u128::from(u32::from(v))),
        IpAddr::V6(v) => (false, u128::from(v)),
    }
}

/// The first `len` of `width` bits of `v`.
fn route_mask(v: u128, width: u8, len: u8) -> u128 {
    let len = len.min(width);
    if len == 0 {
        return 0;
    }
    let all = u128::MAX >> (128 - u32::from(width));
    let low = (1u128 << (u32::from(width - len))).wrapping_sub(1);
    v & all & !low
}

impl<'a> RouteIndex<'a> {
    /// Indexes `routes`.
    pub fn new(routes: &'a [KernelRouteSpec]) -> Self {
        let mut best: HashMap<(bool, u8, u128), &'a KernelRouteSpec> = HashMap::with_capacity(routes.len());
        for r in routes {
            let (v4, bits) = route_bits(r.dst.addr);
            let width = if v4 { 32 } else { 128 };
            let key = (v4, r.dst.len.min(width), route_mask(bits, width, r.dst.len));
            let slot = best.entry(key).or_insert(r);
            if r.metric < slot.metric {
                *slot = r;
            }
        }
        let mut lens: Vec<(bool, u8)> = best.keys().map(|(v4, len, _)| (*v4, *len)).collect();
        lens.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        lens.dedup();
        Self { lens, best }
    }

    /// The route that decides `addr`'s next hop: longest prefix, then lowest metric.
    pub fn lookup(&self, addr: IpAddr) -> Option<&'a KernelRouteSpec> {
        let (v4, bits) = route_bits(addr);
        let width = if v4 { 32 } else { 128 };
        self.lens
            .iter()
            .filter(|(f, _)| *f == v4)
            .find_map(|(_, len)| self.best.get(&(v4, *len, route_mask(bits, width, *len))).copied())
    }
}

impl TablesSpec {
    /// [`TablesSpec::multipath_gateways_in`] with an index built for this one call.
    pub fn multipath_gateways(&self, addr: IpAddr) -> Vec<IpAddr> {
        self.multipath_gateways_in(&RouteIndex::new(&self.kernel_routes), addr).to_vec()
    }

    /// The gateways of the multipath route that reaches `addr` (two or more), when no
    /// `routes` entry overrides it; empty otherwise. Each flow to `addr` takes one of them
    /// ([`Backend::paths`]). `idx` indexes [`TablesSpec::kernel_routes`].
    pub fn multipath_gateways_in<'a>(&self, idx: &RouteIndex<'a>, addr: IpAddr) -> &'a [IpAddr] {
        if self.routes.iter().any(|r| r.dst.contains(addr)) {
            return &[];
        }
        match idx.lookup(addr) {
            Some(r) if !r.kernel && r.gateways.len() > 1 => &r.gateways,
            _ => &[],
        }
    }

    /// [`TablesSpec::next_hop_in`] with an index built for this one call.
    pub fn next_hop(&self, addr: IpAddr) -> NextHop {
        self.next_hop_in(&RouteIndex::new(&self.kernel_routes), addr)
    }

    /// The next hop of `addr`: the longest matching `routes` entry (the config's override);
    /// else the longest matching kernel route (lowest metric among equal prefixes), on-link →
    /// `addr` itself, one gateway → it, several (multipath) → one chosen by a hash of `addr`
    /// (the backend's default path; its flows are spread over all of them by
    /// [`Backend::paths`]), through an interface xlb does not serve → [`NextHop::Kernel`];
    /// else [`NextHop::NoRoute`] when kernel routes are known, and `addr` itself (assumed
    /// on-link) when they are not (standalone specs). `idx` indexes
    /// [`TablesSpec::kernel_routes`].
    pub fn next_hop_in(&self, idx: &RouteIndex<'_>, addr: IpAddr) -> NextHop {
        if let Some(r) = self.routes.iter().filter(|r| r.dst.contains(addr)).max_by_key(|r| r.dst.len) {
            return NextHop::Via(r.via);
        }
        if self.kernel_routes.is_empty() {
            return NextHop::Via(addr);
        }
        match idx.lookup(addr) {
            None => NextHop::NoRoute,
            Some(r) if r.kernel => NextHop::Kernel,
            Some(r) if r.gateways.is_empty() => NextHop::Via(addr),
            Some(r) => {
                // FNV-1a over the address: stable across builds and processes.
                let h = crate::addr::mapped(addr)
                    .iter()
                    .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3));
                let n = r.gateways.len() as u64;
                let i = usize::try_from(h % n).unwrap_or(0);
                r.gateways.get(i).copied().map_or(NextHop::NoRoute, NextHop::Via)
            }
        }
    }
}

/// Everything a table build needs. Plain data: built from YAML or Kubernetes objects.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Default)]
pub struct TablesSpec {
    /// Services. Shared (`Arc`) so that a translator can hand over the same spec from one
    /// build to the next without copying it (SYNC-03); edit one with [`Arc::make_mut`].
    pub services: Vec<Arc<ServiceSpec>>,
    /// Ports (interfaces) in index order.
    pub ports: Vec<PortSpec>,
    /// Neighbours (next hops) by address.
    pub neighbours: Vec<NeighbourSpec>,
    /// Routes from the config, longest prefix wins; they override [`TablesSpec::kernel_routes`].
    pub routes: Vec<RouteSpec>,
    /// The kernel's routes (main table), consulted after `routes`; see
    /// [`TablesSpec::next_hop`]. Empty = unknown: a backend with no `routes` entry is taken as
    /// on-link.
    pub kernel_routes: Vec<KernelRouteSpec>,
    /// Spread flows over a multipath route's paths by their ports too (the kernel's
    /// `net.ipv4.fib_multipath_hash_policy` = 1); false: by addresses only (policy 0, the
    /// kernel's default). See [`multipath_hash`].
    pub multipath_l4: bool,
    /// Source address for SNAT / masquerade of IPv4 flows.
    pub snat_v4: Option<IpAddr>,
    /// Source address for SNAT / masquerade of IPv6 flows.
    pub snat_v6: Option<IpAddr>,
    /// Prefix from which IPIP outer source addresses are drawn per flow (Katran-style, so the
    /// backend's RSS spreads flows); e.g. `172.16.0.0/16`. `None` = the SNAT address.
    pub dsr_source_v4: Option<Cidr>,
    /// Prefix for IPv6-in-IPv6 outer source addresses.
    pub dsr_source_v6: Option<Cidr>,
    /// Largest Maglev table size M allowed (a prime from [`maglev::TABLE_SIZES`]; 0:
    /// [`maglev::DEFAULT_MAX_TABLE_SIZE`]).
    pub maglev_max_size: u32,
    /// Smallest Maglev table size M ([`maglev::table_size_within`]; 0:
    /// [`maglev::DEFAULT_MIN_TABLE_SIZE`]); equal to `maglev_max_size`, every table has one M.
    pub maglev_min_size: u32,
    /// The cluster's pod CIDRs (kube-proxy `clusterCIDR`, NAT-06). When not empty, a new
    /// flow to a ClusterIP frontend of a NAT service from a source outside every one of them
    /// is masqueraded, as kube-proxy's `! -s <clusterCIDR> -j KUBE-MARK-MASQ` does: the
    /// backend's reply to an off-cluster client would otherwise not come back through xlb.
    pub cluster_cidrs: Vec<Cidr>,
}

/// Where a packet goes out: port plus the Ethernet addresses to write.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub struct Hop {
    /// xlb port to transmit on.
    pub port: u8,
    /// Destination MAC (the neighbour).
    pub dst_mac: [u8; 6],
    /// Source MAC (the port's own).
    pub src_mac: [u8; 6],
    /// MTU of the port in bytes.
    pub mtu: u16,
}

/// A backend reference: slot index (low 20 bits) plus a reuse generation (high 12 bits).
///
/// Slots are reused after a backend leaves the tables; the generation makes a stale ref held
/// by conntrack compare unequal to the slot's new occupant, so a removed backend is noticed
/// even if its slot was refilled.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(transparent)]
pub struct BackendRef(pub u32);

impl BackendRef {
    /// Largest number of backend slots: 2^20.
    pub const MAX_SLOTS: usize = 1 << 20;
    const INDEX_MASK: u32 = (1 << 20) - 1;
    /// Slot index, `< MAX_SLOTS`.
    #[inline]
    pub fn index(self) -> usize {
        (self.0 & Self::INDEX_MASK) as usize
    }
    fn new(index: usize, generation: u32) -> Self {
        let idx = u32::try_from(index).unwrap_or(Self::INDEX_MASK) & Self::INDEX_MASK;
        Self(idx | ((generation & 0xfff) << 20))
    }
}

/// A backend slot in the published tables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backend {
    /// The ref that names this slot's current occupant.
    pub this: BackendRef,
    /// Address.
    pub addr: IpAddr,
    /// Port (host order).
    pub port: u16,
    /// Weight (0 = no new flows via weighted schedulers).
    pub weight: u16,
    /// Eligible for new flows.
    pub eligible: bool,
    /// Owning service index in [`Tables::services`].
    pub service: u32,
    /// Next hop; `None` while the neighbour is unresolved (counted drop `NoNeighbour`) or when
    /// there is no route (`no_route`).
    pub hop: Option<Hop>,
    /// The kernel's routes are known and none reaches this backend ([`NextHop::NoRoute`]): new
    /// flows to it are dropped (`NoRoute`) without a conntrack entry.
    pub no_route: bool,
    /// Behind a multipath route: one hop per gateway whose MAC is known, in the route's order
    /// (empty otherwise). A flow takes `paths[multipath_hash(..) % len]` ([`Backend::path`]),
    /// as the kernel spreads flows over a multipath route; [`Backend::hop`] is then the first.
    pub paths: Box<[Hop]>,
    /// Conditions, for display.
    pub conditions: Conditions,
    /// On this node, for display.
    pub node_local: bool,
    /// `hop.is_some() && !no_route && paths.is_empty()`: one next hop, known, and no
    /// multipath route; set when the tables are built, so that a new flow asks one field
    /// whether its backend suits the direct route (`process`).
    pub single_hop: bool,
    /// This backend's half of a DNAT flow's checksum deltas: its address's and port's terms
    /// `m'` (RFC 1624 eqn. 3, [`crate::csum::DnatHalf::of_new`]), summed when the tables are
    /// built.
    pub dnat: crate::csum::DnatHalf,
}

/// Per-service data for the schedulers, built off the hot path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Service {
    /// Stable id (index in the per-worker service counters), stable across rebuilds while the
    /// name stays.
    pub id: u32,
    /// Name, e.g. `default/web:http`.
    pub name: Box<str>,
    /// Scheduler.
    pub scheduler: Scheduler,
    /// ClientIP affinity timeout in seconds.
    pub affinity_timeout_s: Option<u32>,
    /// Forwarding mode.
    pub mode: ForwardingMode,
    /// Action when no backend is eligible.
    pub when_empty: EmptyAction,
    /// All backends in the tables for this service (eligible and draining).
    pub members: Box<[BackendRef]>,
    /// `members` by (address, port), sorted, for [`Tables::member_at`].
    pub by_addr: Box<[(IpAddr, u16, BackendRef)]>,
    /// Backends eligible for new flows, with weight > 0.
    pub eligible: Box<[BackendRef]>,
    /// Weights of `eligible`, same order.
    pub weights: Box<[u16]>,
    /// Running sum of `weights` (for weighted random choice).
    pub cum_weights: Box<[u32]>,
    /// Maglev lookup table over `eligible` (for [`Scheduler::Maglev`]). Shared with the
    /// previous snapshot when this service's eligible backends and weights did not change
    /// (the builder keeps the last table per service, SYNC-03).
    pub maglev: Option<Arc<MaglevTable>>,
    /// Static 256-bucket hash table over `eligible` for `sh` / `dh` (IPVS `ip_vs_sh.c`).
    pub hash_buckets: Box<[u32]>,
    /// This service's keys in [`Tables::vips`] (its frontends), so the steering maps can be
    /// brought up to date for a few services without walking the whole table.
    pub frontend_keys: Box<[VipKey]>,
    /// The keys this service put into [`Tables::endpoints`] (other services may share them).
    pub endpoint_keys: Box<[VipKey]>,
}

/// Value of the VIP map: which service and how this frontend behaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrontendEntry {
    /// The service's id ([`Tables::services`]).
    pub service: u32,
    /// The service itself, the one [`Tables::services`] holds under that id: the per-packet
    /// path reaches it from the frontend without a second lookup.
    pub svc: Arc<Service>,
    /// Frontend kind.
    pub kind: FrontendKind,
    /// SNAT new flows.
    pub masquerade: bool,
    /// Allowed source prefixes; empty = all.
    pub source_ranges: Box<[Cidr]>,
    /// The service is in NAT mode without session affinity, and this frontend neither
    /// masquerades nor limits source ranges: a new flow through it may take the direct route
    /// (`process`), when its backend and client allow. Set when the tables are built.
    pub plain_nat: bool,
    /// This frontend's half of a DNAT flow's checksum deltas: its address's and port's terms
    /// `~m` (RFC 1624 eqn. 3, [`crate::csum::DnatHalf::of_old`]), summed when the tables are
    /// built.
    pub dnat: crate::csum::DnatHalf,
}

/// Key of the VIP map: 16-byte (v4-mapped) address, protocol number, port (host order).
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub struct VipKey {
    /// Address, IPv4 mapped into IPv6 (RFC 4291 §2.5.5.2).
    pub addr: [u8; 16],
    /// Port, host order.
    pub port: u16,
    /// IP protocol number.
    pub proto: u8,
}

/// How an address that carries frontends treats packets that match none of them. Ordered:
/// when an address has frontends of several kinds, the greatest kind wins.
#[derive(Copy, Clone, PartialEq, Eq, Debug, PartialOrd, Ord)]
pub enum VipAddrKind {
    /// A node address with NodePorts: the node's own traffic lives here too, so other ports
    /// and unparsable packets go to the kernel. An address with NodePorts has this kind
    /// whatever other frontends it has (a node address that is also an external or
    /// LoadBalancer IP).
    Node,
    /// A LoadBalancer ingress IP or external IP: other ports go to the kernel; malformed
    /// packets are dropped.
    Service,
    /// A cluster IP, which exists only in xlb (ROLE-09): other ports are rejected like
    /// kube-proxy's nftables mode does; malformed packets are dropped.
    ClusterIp,
}

/// The services of a snapshot by id ([`Service::id`], stable while the name stays): slots
/// in shared chunks ([`Chunked`]), `None` for ids not in use.
#[derive(Debug, Clone, Default)]
pub struct ServiceTable {
    slots: Chunked<Option<Arc<Service>>>,
}

impl ServiceTable {
    /// The service with id `id`.
    #[inline]
    pub fn get(&self, id: usize) -> Option<&Service> {
        self.slots.get(id)?.as_deref()
    }

    /// The services in id order.
    pub fn iter(&self) -> impl Iterator<Item = &Service> + '_ {
        self.slots.iter().filter_map(Option::as_deref)
    }

    /// One past the largest id (the size of per-service arrays indexed by id).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether there is no id.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Number of services (ids in use).
    pub fn count(&self) -> usize {
        self.iter().count()
    }

    /// Services whose `Arc` this table shares with `other` (the same build of the same
    /// service): what two consecutive snapshots share.
    pub fn shared_with(&self, other: &Self) -> usize {
        self.slots
            .iter()
            .zip(other.slots.iter())
            .filter(|(a, b)| matches!((a, b), (Some(a), Some(b)) if Arc::ptr_eq(a, b)))
            .count()
    }
}

impl core::ops::Index<usize> for ServiceTable {
    type Output = Service;
    /// The service with id `id`; panics when there is none (tests and tools; the per-packet
    /// path uses [`ServiceTable::get`]).
    #[expect(clippy::panic, reason = "Index has no other way to say there is none")]
    fn index(&self, id: usize) -> &Service {
        self.get(id).unwrap_or_else(|| panic!("no service with id {id}"))
    }
}

/// The immutable snapshot the workers read. Made of pieces shared with the previous snapshot
/// ([`persist`]): a change copies what it touches, the rest is shared.
#[derive(Debug, Clone)]
pub struct Tables {
    /// Increases by one per build; workers bring their per-service scheduler state up to date
    /// when it changes ([`crate::sched::SchedState::sync`]).
    pub generation: u64,
    /// Services by id ([`FrontendEntry::service`] and [`Backend::service`] are ids).
    pub services: ServiceTable,
    /// Frontends by (addr, proto, port) ([`Tables::frontend`] reads it per packet).
    pub vips: KeyMap<VipKey, FrontendEntry>,
    /// Addresses that carry at least one frontend, and how unmatched packets to them are
    /// treated (ICMP errors and fragments are matched by address only).
    pub vip_addrs: KeyMap<[u8; 16], VipAddrKind>,
    /// Backend slots, indexed by [`BackendRef::index`]; `None` for free slots.
    pub backends: Chunked<Option<Backend>>,
    /// Ports in index order.
    pub ports: Vec<PortSpec>,
    /// IPv4 SNAT address.
    pub snat_v4: Option<[u8; 4]>,
    /// IPv6 SNAT address.
    pub snat_v6: Option<[u8; 16]>,
    /// [`TablesSpec::cluster_cidrs`]: ClusterIP flows from outside them are masqueraded.
    pub cluster_cidrs: Box<[Cidr]>,
    /// IPIP outer source prefix.
    pub dsr_source_v4: Option<Cidr>,
    /// IP6IP6 outer source prefix.
    pub dsr_source_v6: Option<Cidr>,
    /// Next hops (backends on-link, or their gateways) whose neighbour is unresolved: the
    /// control side asks the kernel to resolve them. No particular order.
    pub unresolved: KeySet<IpAddr>,
    /// (address, protocol, port) of every backend of a NAT service with a frontend that does
    /// not always masquerade ([`Frontend::masquerade`] false), and of every backend reached
    /// through the kernel (never masqueraded): replies that keep the client's address come
    /// from these, the steering program sends them to xlb, and a worker without their flow
    /// hands them to the next.
    pub endpoints: KeySet<VipKey>,
    /// (address, IP protocol, port) of every backend of a NAT service reached through the
    /// kernel ([`NextHop::Kernel`]): the control side installs a policy rule per entry so
    /// their replies are routed into the punt device and come back through xlb.
    pub kernel_endpoints: Arc<std::collections::BTreeSet<(IpAddr, u8, u16)>>,
    /// [`TablesSpec::multipath_l4`].
    pub multipath_l4: bool,
}

impl Tables {
    /// An empty snapshot (generation 0): every packet passes to the kernel.
    pub fn empty() -> Self {
        Self {
            generation: 0,
            services: ServiceTable::default(),
            vips: KeyMap::new(),
            vip_addrs: KeyMap::new(),
            backends: Chunked::default(),
            ports: Vec::new(),
            snat_v4: None,
            snat_v6: None,
            cluster_cidrs: Box::default(),
            dsr_source_v4: None,
            dsr_source_v6: None,
            unresolved: KeySet::default(),
            endpoints: KeySet::default(),
            kernel_endpoints: Arc::default(),
            multipath_l4: false,
        }
    }

    /// The backend a ref names, if that ref is still current (not removed, not reused).
    #[inline]
    pub fn backend(&self, r: BackendRef) -> Option<&Backend> {
        match self.backends.get(r.index()) {
            Some(Some(b)) if b.this == r => Some(b),
            _ => None,
        }
    }

    /// The backend of service `service` (its id) at `addr`:`port`, whatever its slot: how a
    /// flow whose slot was freed finds its backend again when the backend itself stayed (the
    /// Service's external frontends merged into, or split from, its internal spec; the
    /// dataplane keys a flow on its backend's address and port, as kube-proxy's conntrack
    /// DNAT does). O(log n) in the service's backends.
    pub fn member_at(&self, service: u32, addr: IpAddr, port: u16) -> Option<&Backend> {
        let s = self.services.get(service as usize)?;
        let i = s.by_addr.binary_search_by(|(a, p, _)| (*a, *p).cmp(&(addr, port))).ok()?;
        let (_, _, r) = s.by_addr.get(i)?;
        self.backend(*r)
    }

    /// The frontend for (address, protocol, port). Always inlined: the batch's miss stage
    /// looks one up per new flow, and as a call (the compiler's choice with `#[inline]` once
    /// the map's hash took a second multiply) it cost a new flow about 35 instructions more
    /// (callgrind, docs/benchmarks.md).
    #[inline(always)]
    pub fn frontend(&self, addr: [u8; 16], proto: u8, port: u16) -> Option<&FrontendEntry> {
        self.vips.get(&VipKey { addr, port, proto })
    }

    /// [`Tables::frontend`] as a handle (for [`Tables::frontend_by_handle`]), or `None`.
    #[inline]
    pub fn frontend_handle(&self, addr: [u8; 16], proto: u8, port: u16) -> Option<u32> {
        self.vips.find(&VipKey { addr, port, proto })
    }

    /// The frontend a handle from [`Tables::frontend_handle`] names if it is the one for
    /// `(addr, proto, port)`; the handle may come from an earlier snapshot (a worker's cache
    /// of lookups): then `None` unless it names the same key in this one.
    #[inline(always)]
    pub fn frontend_by_handle(&self, handle: u32, addr: [u8; 16], proto: u8, port: u16) -> Option<&FrontendEntry> {
        self.vips.entry_if(handle, &VipKey { addr, port, proto })
    }
}

/// Why a [`TablesSpec`] cannot be built. The previous tables stay published.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// Two services claim the same frontend.
    #[error("frontend {addr} {proto}/{port} is claimed by both {first:?} and {second:?}")]
    DuplicateFrontend {
        /// Address.
        addr: IpAddr,
        /// Protocol name.
        proto: &'static str,
        /// Port.
        port: u16,
        /// First service name.
        first: String,
        /// Second service name.
        second: String,
    },
    /// Two services have the same name.
    #[error("service name {0:?} is used twice")]
    DuplicateService(String),
    /// A backend (addr, port) appears twice in one service.
    #[error("service {service:?}: backend {addr} port {port} is listed twice")]
    DuplicateBackend {
        /// Service name.
        service: String,
        /// Address.
        addr: IpAddr,
        /// Port.
        port: u16,
    },
    /// More backends than [`BackendRef::MAX_SLOTS`].
    #[error("too many backends: {0} (limit {max})", max = BackendRef::MAX_SLOTS)]
    TooManyBackends(usize),
    /// A Maglev table could not be built.
    #[error("service {service:?}: Maglev table: {source}")]
    Maglev {
        /// Service name.
        service: String,
        /// Cause.
        #[source]
        source: maglev::MaglevError,
    },
    /// A neighbour names a port that does not exist.
    #[error("neighbour {addr} names port {port}, but only {ports} ports exist")]
    BadNeighbourPort {
        /// Neighbour address.
        addr: IpAddr,
        /// Port index given.
        port: u8,
        /// Number of ports.
        ports: usize,
    },
    /// The SNAT address has the wrong family.
    #[error("snat address {0} has the wrong address family for its field")]
    SnatFamily(IpAddr),
    /// A weighted-random service's weights overflow u32.
    #[error("service {0:?}: sum of weights overflows")]
    WeightOverflow(String),
    /// A service mixes address families (each spec is one family; dual-stack Services give
    /// one spec per family).
    #[error("service {service:?}: {addr} is not of the family of its first frontend")]
    MixedFamilies {
        /// Service name.
        service: String,
        /// The offending address.
        addr: IpAddr,
    },
    /// A service port is 0 or a backend port is 0.
    #[error("service {service:?}: port 0 is not allowed ({what})")]
    ZeroPort {
        /// Service name.
        service: String,
        /// Which port.
        what: &'static str,
    },
}

/// Publication point for tables: the control thread stores, workers load once per batch.
#[derive(Debug, Clone)]
pub struct TablesHandle {
    inner: Arc<ArcSwap<Tables>>,
}

impl Default for TablesHandle {
    fn default() -> Self {
        Self::new(Tables::empty())
    }
}

impl TablesHandle {
    /// A handle publishing `t` first.
    pub fn new(t: Tables) -> Self {
        Self { inner: Arc::new(ArcSwap::from_pointee(t)) }
    }
    /// Publishes `t` atomically; readers see the old or the new snapshot, never a mix (SYNC-06).
    pub fn publish(&self, t: Tables) {
        self.inner.store(Arc::new(t));
    }
    /// The current snapshot (a reference-count increment: a shared atomic read-modify-write).
    /// Control-side readers use this; workers use [`TablesHandle::reader`].
    pub fn load(&self) -> Arc<Tables> {
        self.inner.load_full()
    }

    /// A per-worker reader ([`arc_swap::Cache`]): [`TablesReader::load`] checks the
    /// publication pointer with one relaxed load and writes nothing shared unless the tables
    /// changed since the last call (then it takes a reference to the new snapshot).
    pub fn reader(&self) -> TablesReader {
        TablesReader { cache: arc_swap::Cache::new(Arc::clone(&self.inner)) }
    }
}

/// A worker's view of the published tables: [`arc_swap::Cache`] over the [`TablesHandle`], so
/// the per-batch load does no shared atomic write (arc-swap docs, "Cache"). Owned by one
/// thread; it keeps the snapshot it last saw alive until the next [`TablesReader::load`].
#[derive(Debug)]
pub struct TablesReader {
    cache: arc_swap::Cache<Arc<ArcSwap<Tables>>, Arc<Tables>>,
}

impl TablesReader {
    /// The current snapshot: a relaxed pointer comparison when nothing was published since
    /// the last call; the newly published tables otherwise. Call once per RX batch.
    pub fn load(&mut self) -> &Arc<Tables> {
        self.cache.load()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic, reason = "tests")]
    use super::build::sh_buckets;
    use super::*;
    use crate::addr::mapped;

    #[test]
    fn scheduler_and_forwarding_mode_names_parse_back_and_unknown_ones_list_the_accepted() {
        for s in Scheduler::ALL {
            assert_eq!(s.name().parse::<Scheduler>(), Ok(s));
        }
        for m in ForwardingMode::ALL {
            assert_eq!(format!(" {} ", m.name()).parse::<ForwardingMode>(), Ok(m));
        }
        let e = "maglev".parse::<Scheduler>().unwrap_err().to_string();
        assert_eq!(
            e,
            "unknown scheduler \"maglev\"; use one of random, mh, mh-noport, rr, wrr, lc, wlc, sh, dh, sed, nq"
        );
        let e = "dsr".parse::<ForwardingMode>().unwrap_err().to_string();
        assert_eq!(e, "unknown forwarding mode \"dsr\"; use one of nat, dsr-ipip, dsr-l2");
    }

    #[test]
    fn next_hop_config_routes_override_kernel_routes_longest_prefix_and_metric_win() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let cidr = |s: &str| s.parse::<Cidr>().unwrap();
        let kr = |d: &str, gw: &[&str], metric: u32| KernelRouteSpec {
            dst: cidr(d),
            gateways: gw.iter().map(|g| ip(g)).collect(),
            metric,
            kernel: false,
        };
        let mut spec = TablesSpec::default();
        assert_eq!(spec.next_hop(ip("10.9.9.9")), NextHop::Via(ip("10.9.9.9")), "no routes known: on-link");
        spec.kernel_routes = vec![
            kr("0.0.0.0/0", &["192.168.0.1"], 0),
            kr("192.168.0.0/24", &[], 0),
            kr("10.244.1.0/24", &["192.168.0.11"], 100),
            kr("10.244.1.0/24", &["192.168.0.12"], 50),
            kr("10.244.2.0/24", &["192.168.0.21", "192.168.0.22"], 0),
            kr("fd00::/64", &[], 0),
        ];
        assert_eq!(spec.next_hop(ip("192.168.0.7")), NextHop::Via(ip("192.168.0.7")), "connected: on-link");
        assert_eq!(spec.next_hop(ip("10.244.1.5")), NextHop::Via(ip("192.168.0.12")), "lowest metric");
        assert_eq!(spec.next_hop(ip("8.8.8.8")), NextHop::Via(ip("192.168.0.1")), "default route");
        assert_eq!(spec.next_hop(ip("fd00::5")), NextHop::Via(ip("fd00::5")));
        assert_eq!(spec.next_hop(ip("fd01::5")), NextHop::NoRoute, "no IPv6 route matches");
        // Multipath: each backend keeps one path, and the backends are spread over both.
        let paths: std::collections::BTreeSet<IpAddr> = (1..=64)
            .map(|i| match spec.next_hop(ip(&format!("10.244.2.{i}"))) {
                NextHop::Via(v) => v,
                NextHop::NoRoute | NextHop::Kernel => panic!("multipath route lost"),
            })
            .collect();
        assert_eq!(paths, [ip("192.168.0.21"), ip("192.168.0.22")].into_iter().collect());
        assert_eq!(spec.next_hop(ip("10.244.2.9")), spec.next_hop(ip("10.244.2.9")), "stable");
        // A route out of an interface xlb does not serve: through the kernel.
        spec.kernel_routes.push(KernelRouteSpec { kernel: true, ..kr("10.244.9.0/24", &[], 0) });
        assert_eq!(spec.next_hop(ip("10.244.9.7")), NextHop::Kernel);
        // The config's routes override the kernel's.
        spec.routes = vec![RouteSpec { dst: cidr("10.244.0.0/16"), via: ip("192.168.0.99") }];
        assert_eq!(spec.next_hop(ip("10.244.1.5")), NextHop::Via(ip("192.168.0.99")));
    }

    fn svc(name: &str, vip: &str, backends: &[(&str, u16)]) -> ServiceSpec {
        ServiceSpec {
            name: name.into(),
            frontends: vec![Frontend::new(vip.parse().unwrap(), L4Proto::Tcp, 80, FrontendKind::ClusterIp, false)],
            scheduler: Scheduler::Maglev { port: true },
            affinity_timeout_s: None,
            mode: ForwardingMode::Nat,
            when_empty: EmptyAction::Reject,
            backends: backends.iter().map(|(a, p)| BackendSpec::ready(a.parse().unwrap(), *p)).collect(),
        }
    }

    #[test]
    fn reader_sees_each_publication_and_keeps_its_snapshot_until_the_next_load() {
        let h = TablesHandle::new(Tables::empty());
        let mut r = h.reader();
        let first = Arc::clone(r.load());
        assert!(Arc::ptr_eq(&first, r.load()), "no publication: the same snapshot");
        h.publish(Tables::empty());
        let second = Arc::clone(r.load());
        assert!(!Arc::ptr_eq(&first, &second), "a publication is seen at the next load");
        assert!(Arc::ptr_eq(&second, &h.load()));
    }

    #[test]
    fn backend_refs_survive_rebuilds_and_removed_refs_go_stale() {
        let mut b = TableBuilder::new();
        let spec = TablesSpec {
            services: vec![svc("a", "10.96.0.1", &[("10.0.0.1", 80), ("10.0.0.2", 80)]).into()],
            ..Default::default()
        };
        let t1 = b.build(&spec).unwrap();
        let r1 = t1.services[0].members[0];
        let r2 = t1.services[0].members[1];
        let spec2 = TablesSpec {
            services: vec![svc("a", "10.96.0.1", &[("10.0.0.2", 80), ("10.0.0.3", 80)]).into()],
            ..Default::default()
        };
        let t2 = b.build(&spec2).unwrap();
        assert!(t2.backend(r1).is_none(), "removed backend's ref must be stale");
        assert_eq!(t2.backend(r2).unwrap().addr, "10.0.0.2".parse::<IpAddr>().unwrap());
        // 10.0.0.3 reused r1's slot with a new generation.
        let r3 = t2.services[0].members[1];
        assert_eq!(r3.index(), r1.index());
        assert_ne!(r3, r1);
        assert!(t2.generation > t1.generation);
    }

    #[test]
    fn a_changed_service_keeps_each_backends_slot_whatever_the_order_and_frees_the_rest() {
        let mut b = TableBuilder::new();
        let spec = |backends: &[(&str, u16)]| TablesSpec {
            services: vec![svc("a", "10.96.0.1", backends).into()],
            ..Default::default()
        };
        let t1 = b.build(&spec(&[("10.0.0.1", 80), ("10.0.0.2", 80), ("10.0.0.3", 80), ("10.0.0.3", 81)])).unwrap();
        let slot = |t: &Tables, addr: &str, port: u16| {
            t.services[0]
                .by_addr
                .iter()
                .find(|(a, p, _)| *a == addr.parse::<IpAddr>().unwrap() && *p == port)
                .unwrap()
                .2
        };
        // Reversed, one backend gone and one new: the three left keep their refs.
        let t2 = b.build(&spec(&[("10.0.0.3", 81), ("10.0.0.9", 80), ("10.0.0.3", 80), ("10.0.0.1", 80)])).unwrap();
        for (addr, port) in [("10.0.0.3", 81), ("10.0.0.3", 80), ("10.0.0.1", 80)] {
            assert_eq!(slot(&t2, addr, port), slot(&t1, addr, port), "{addr}:{port}");
            assert_eq!(t2.backend(slot(&t2, addr, port)).unwrap().port, port);
        }
        // 10.0.0.2's slot was freed and given to 10.0.0.9 under a new generation.
        let (gone, new) = (slot(&t1, "10.0.0.2", 80), slot(&t2, "10.0.0.9", 80));
        assert!(t2.backend(gone).is_none());
        assert_eq!((new.index(), new == gone), (gone.index(), false));
        assert_eq!(b.slot_count(), 4, "no slot leaked or added");
    }

    #[test]
    fn a_small_maglev_service_keeps_its_table_size_and_its_flows_when_it_scales() {
        // Maglev paper §3.4: at one M, a backend joining takes about 1/n of the slots and
        // moves no other. The size rule alone (100 slots per backend) changed M from 251 to
        // 509 at the third backend, and with it half of the other flows.
        let spec = |n: usize, min: u32, max: u32| TablesSpec {
            services: vec![
                svc(
                    "a",
                    "10.96.0.1",
                    &(1..=n)
                        .map(|i| (["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"][i - 1], 80))
                        .collect::<Vec<_>>(),
                )
                .into(),
            ],
            maglev_min_size: min,
            maglev_max_size: max,
            ..Default::default()
        };
        let table = |t: &Tables| t.services[0].maglev.clone().unwrap();
        for (from, to) in [(2, 3), (5, 6)] {
            let (t1, t2) = (
                TableBuilder::new().build(&spec(from, 0, 0)).unwrap(),
                TableBuilder::new().build(&spec(to, 0, 0)).unwrap(),
            );
            let (m1, m2) = (table(&t1), table(&t2));
            assert_eq!((m1.size(), m2.size()), (1021, 1021), "{from} -> {to} backends");
            // Slots name backends in key order (address, then port): the new one is last.
            let new = to - 1;
            let (mut kept, mut moved) = (0u32, 0u32);
            for h in 0..20_000u64 {
                let h = h.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                let (a, b) = (m1.lookup(h), m2.lookup(h));
                if b as usize == new {
                    continue;
                }
                if a == b { kept += 1 } else { moved += 1 }
            }
            assert!(moved * 10 < kept + moved, "{from} -> {to}: {moved} of {} other flows moved", kept + moved);
        }
        // One M for every backend count when the floor is the cap.
        for n in [1, 6] {
            assert_eq!(table(&TableBuilder::new().build(&spec(n, 65_537, 65_537)).unwrap()).size(), 65_537);
        }
    }

    #[test]
    fn a_rebuild_computes_only_the_maglev_tables_whose_backends_changed() {
        let mut b = TableBuilder::new();
        let spec = |c_backends: &[(&str, u16)]| TablesSpec {
            services: vec![
                svc("a", "10.96.0.1", &[("10.0.0.1", 80), ("10.0.0.2", 80)]).into(),
                svc("b", "10.96.0.2", &[("10.0.1.1", 80)]).into(),
                svc("c", "10.96.0.3", c_backends).into(),
            ],
            ..Default::default()
        };
        let t1 = b.build(&spec(&[("10.0.2.1", 80)])).unwrap();
        assert_eq!(b.maglev_stats(), MaglevBuildStats { built: 3, reused: 0, threads: 1 });
        let t2 = b.build(&spec(&[("10.0.2.1", 80), ("10.0.2.2", 80)])).unwrap();
        assert_eq!(b.maglev_stats(), MaglevBuildStats { built: 1, reused: 2, threads: 1 });
        let table = |t: &Tables, i: usize| t.services[i].maglev.clone().unwrap();
        assert!(Arc::ptr_eq(&table(&t1, 0), &table(&t2, 0)) && Arc::ptr_eq(&table(&t1, 1), &table(&t2, 1)));
        assert!(!Arc::ptr_eq(&table(&t1, 2), &table(&t2, 2)));
        // The rebuilt table is the one a fresh builder makes: reuse changes nothing visible.
        let fresh = TableBuilder::new().build(&spec(&[("10.0.2.1", 80), ("10.0.2.2", 80)])).unwrap();
        for i in 0..3 {
            assert_eq!(*table(&t2, i), *table(&fresh, i), "service {i}");
        }
        // A weight change is a change; a failed build keeps the cache (nothing committed).
        let mut heavier = spec(&[("10.0.2.1", 80), ("10.0.2.2", 80)]);
        Arc::make_mut(&mut heavier.services[0]).backends[0].weight = 3;
        b.build(&heavier).unwrap();
        assert_eq!(b.maglev_stats(), MaglevBuildStats { built: 1, reused: 2, threads: 1 });
        let mut bad = heavier.clone();
        Arc::make_mut(&mut bad.services[1]).frontends[0].port = 0;
        assert!(b.build(&bad).is_err());
        b.build(&heavier).unwrap();
        assert_eq!(b.maglev_stats(), MaglevBuildStats { built: 0, reused: 3, threads: 1 });
    }

    #[test]
    fn parallel_maglev_builds_equal_serial_ones_table_for_table_and_fail_on_the_same_service() {
        // 400 Maglev services of 1..=12 backends: 6 chunks of MAGLEV_JOBS_PER_THREAD, so 4
        // threads take part.
        let services: Vec<Arc<ServiceSpec>> = (0..400u32)
            .map(|i| {
                let addrs: Vec<String> =
                    (0..=i % 12).map(|j| format!("10.{}.{}.{}", i / 250, i % 250, j + 1)).collect();
                let backends: Vec<(&str, u16)> = addrs.iter().map(|a| (a.as_str(), 8080)).collect();
                svc(&format!("s{i}"), &format!("10.96.{}.{}", i / 250, i % 250 + 1), &backends).into()
            })
            .collect();
        let spec = TablesSpec { services, ..Default::default() };
        let (mut serial, mut parallel) = (TableBuilder::new(), TableBuilder::new());
        serial.set_build_threads(1);
        parallel.set_build_threads(4);
        let (a, b) = (serial.build(&spec).unwrap(), parallel.build(&spec).unwrap());
        assert_eq!(serial.maglev_stats(), MaglevBuildStats { built: 400, reused: 0, threads: 1 });
        assert_eq!(parallel.maglev_stats(), MaglevBuildStats { built: 400, reused: 0, threads: 4 });
        assert_eq!(a.services.len(), 400);
        for (x, y) in a.services.iter().zip(b.services.iter()) {
            assert_eq!(x.name, y.name);
            let (tx, ty) = (x.maglev.as_deref().unwrap(), y.maglev.as_deref().unwrap());
            assert_eq!((tx.size(), tx.slots(), tx.checksum()), (ty.size(), ty.slots(), ty.checksum()), "{}", x.name);
            assert_eq!(x.members, y.members);
        }
        // Two services whose table cannot be built (more backends than the 251 slots of
        // maglevMaxSize 251): both builds name the first one, in service order.
        let mut bad = spec.clone();
        bad.maglev_max_size = 251;
        for i in [150, 300] {
            let addrs: Vec<String> = (0..300).map(|j| format!("10.200.{}.{}", j / 250, j % 250 + 1)).collect();
            let backends: Vec<(&str, u16)> = addrs.iter().map(|a| (a.as_str(), 8080)).collect();
            bad.services[i] = svc(&format!("s{i}"), &format!("10.96.{}.{}", i / 250, i % 250 + 1), &backends).into();
        }
        let (ea, eb) = (serial.build(&bad).unwrap_err().to_string(), parallel.build(&bad).unwrap_err().to_string());
        assert_eq!(ea, eb);
        assert!(ea.contains("\"s150\""), "{ea}");
    }

    #[test]
    fn duplicate_frontend_is_an_error_naming_both_services_and_keeps_builder_state() {
        let mut b = TableBuilder::new();
        let ok = TablesSpec { services: vec![svc("a", "10.96.0.1", &[("10.0.0.1", 80)]).into()], ..Default::default() };
        let t = b.build(&ok).unwrap();
        let bad = TablesSpec {
            services: vec![
                svc("a", "10.96.0.1", &[("10.0.0.1", 80)]).into(),
                svc("b", "10.96.0.1", &[("10.0.0.9", 80)]).into(),
            ],
            ..Default::default()
        };
        let e = b.build(&bad).unwrap_err().to_string();
        assert!(e.contains("\"a\"") && e.contains("\"b\"") && e.contains("10.96.0.1"), "{e}");
        let t2 = b.build(&ok).unwrap();
        assert_eq!(t.services[0].members, t2.services[0].members);
    }

    #[test]
    fn a_service_mixing_address_families_is_refused() {
        let mut s = svc("a", "10.96.0.1", &[("10.0.0.1", 80)]);
        s.backends[0].addr = "fd00::1".parse().unwrap();
        let e = TableBuilder::new().build(&TablesSpec { services: vec![s.into()], ..Default::default() }).unwrap_err();
        assert!(matches!(e, BuildError::MixedFamilies { .. }), "{e}");
    }

    #[test]
    fn sh_buckets_follow_weights() {
        let b = sh_buckets(&[1, 3]);
        assert_eq!(b.len(), HASH_BUCKETS);
        assert_eq!(b.iter().filter(|&&i| i == 1).count(), 192);
    }

    #[test]
    fn clusterip_address_kind_wins_over_other_kinds() {
        let mut s = svc("a", "10.96.0.1", &[("10.0.0.1", 80)]);
        let mut f = s.frontends[0].clone();
        f.port = 443;
        f.kind = FrontendKind::ExternalIp;
        s.frontends.insert(0, f);
        let t = TableBuilder::new().build(&TablesSpec { services: vec![s.into()], ..Default::default() }).unwrap();
        assert_eq!(*t.vip_addrs.get(&mapped("10.96.0.1".parse().unwrap())).unwrap(), VipAddrKind::ClusterIp);
    }

    #[test]
    fn only_backends_of_frontends_that_keep_the_client_address_are_steered_endpoints() {
        let kept = svc("kept", "10.96.0.1", &[("10.0.0.1", 80)]);
        let mut masq = svc("masq", "10.96.0.2", &[("10.0.0.2", 8080)]);
        masq.frontends[0].masquerade = true;
        let mut mixed = svc("mixed", "10.96.0.3", &[("10.0.0.3", 9090)]);
        let mut np = mixed.frontends[0].clone();
        (np.kind, np.port, np.masquerade) = (FrontendKind::NodePort, 30090, true);
        mixed.frontends.push(np);
        let spec = TablesSpec { services: vec![kept.into(), masq.into(), mixed.into()], ..Default::default() };
        let t = TableBuilder::new().build(&spec).unwrap();
        let ep = |a: &str, port: u16| VipKey { addr: mapped(a.parse().unwrap()), port, proto: 6 };
        assert!(t.endpoints.contains(&ep("10.0.0.1", 80)), "unmasqueraded ClusterIP: replies keep the client address");
        assert!(!t.endpoints.contains(&ep("10.0.0.2", 8080)), "always masqueraded: replies come to the SNAT address");
        assert!(t.endpoints.contains(&ep("10.0.0.3", 9090)), "one unmasqueraded frontend is enough");
        assert_eq!(t.endpoints.len(), 2);
    }

    #[test]
    fn route_index_agrees_with_a_scan_of_every_route_longest_prefix_then_lowest_metric() {
        // Deterministic pseudo-random routes and addresses (an LCG), both families, with
        // overlapping prefixes, equal prefixes of different metrics, and default routes.
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            x >> 16
        };
        let mut routes = Vec::new();
        for i in 0..400u32 {
            let (addr, len) = if i % 3 == 0 {
                let a = std::net::Ipv6Addr::from(
                    (u128::from(next()) << 64 | u128::from(next())) & (0xfd00u128 << 112 | (u128::MAX >> 16)),
                );
                (IpAddr::V6(a), u8::try_from(next() % 129).unwrap())
            } else {
                let a = std::net::Ipv4Addr::from(0x0a00_0000 | u32::try_from(next() & 0x00ff_ffff).unwrap());
                (IpAddr::V4(a), u8::try_from(next() % 33).unwrap())
            };
            let gw = IpAddr::V4(std::net::Ipv4Addr::from(u32::try_from(next() & 0xffff_ffff).unwrap()));
            routes.push(KernelRouteSpec {
                dst: Cidr { addr, len },
                gateways: vec![gw],
                metric: u32::try_from(next() % 4).unwrap(),
                kernel: false,
            });
        }
        routes.push(KernelRouteSpec { dst: "0.0.0.0/0".parse().unwrap(), gateways: vec![], metric: 9, kernel: false });
        let scan = |a: IpAddr| {
            routes
                .iter()
                .filter(|r| r.dst.contains(a))
                .max_by(|p, q| p.dst.len.cmp(&q.dst.len).then(q.metric.cmp(&p.metric)))
                .map(|r| (r.dst.len, r.metric))
        };
        let idx = RouteIndex::new(&routes);
        for r in routes.iter().take(200) {
            // Inside each prefix, and random addresses.
            let probe = [
                r.dst.addr,
                IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 | u32::try_from(next() & 0x00ff_ffff).unwrap())),
            ];
            for a in probe {
                assert_eq!(idx.lookup(a).map(|r| (r.dst.len, r.metric)), scan(a), "{a}");
            }
        }
        assert_eq!(idx.lookup("192.0.2.1".parse().unwrap()).map(|r| r.dst.len), Some(0), "the default route");
        assert!(idx.lookup("fe80::1".parse().unwrap()).is_none_or(|r| r.dst.addr.is_ipv6()), "families never mix");
    }

    #[test]
    fn a_backend_reached_through_the_kernel_gets_a_reply_rule_and_is_a_steered_endpoint_even_behind_masquerade() {
        let mut masq = svc("masq", "10.96.0.2", &[("10.244.0.5", 8080)]);
        masq.frontends[0].masquerade = true;
        let kernel =
            KernelRouteSpec { dst: "10.244.0.0/24".parse().unwrap(), gateways: vec![], metric: 0, kernel: true };
        let spec = TablesSpec { services: vec![masq.into()], kernel_routes: vec![kernel], ..Default::default() };
        let t = TableBuilder::new().build(&spec).unwrap();
        let pod: IpAddr = "10.244.0.5".parse().unwrap();
        assert_eq!(*t.kernel_endpoints, [(pod, 6, 8080)].into_iter().collect());
        assert!(t.endpoints.contains(&VipKey { addr: mapped(pod), port: 8080, proto: 6 }));
        let b = t.backends.iter().flatten().next().unwrap();
        assert_eq!(b.hop.map(|h| h.port), Some(KERNEL_PORT));
        assert!(t.unresolved.is_empty(), "nothing to resolve for the kernel port");
    }

    #[test]
    fn a_multipath_backend_with_one_gateway_resolved_uses_it_and_asks_for_the_other() {
        let ip = |a: &str| a.parse::<IpAddr>().unwrap();
        let kr = |d: &str, gw: &[&str]| KernelRouteSpec {
            dst: d.parse().unwrap(),
            gateways: gw.iter().map(|g| ip(g)).collect(),
            metric: 0,
            kernel: false,
        };
        let mut spec =
            TablesSpec { services: vec![svc("a", "10.96.0.1", &[("10.244.2.7", 80)]).into()], ..Default::default() };
        spec.ports = vec![PortSpec { name: "eth0".into(), mac: [2, 0, 0, 0, 0, 1], mtu: 1500 }];
        spec.kernel_routes = vec![kr("10.244.2.0/24", &["192.168.0.21", "192.168.0.22"]), kr("192.168.0.0/24", &[])];
        spec.neighbours = vec![NeighbourSpec { addr: ip("192.168.0.22"), mac: [2, 0, 0, 0, 0, 0x22], port: 0 }];
        let t = TableBuilder::new().build(&spec).unwrap();
        let b = t.backends.iter().flatten().next().unwrap();
        assert_eq!(b.hop.map(|h| h.dst_mac), Some([2, 0, 0, 0, 0, 0x22]), "the resolved gateway");
        assert!(b.paths.is_empty(), "one path is no spread");
        assert!(t.unresolved.contains(&ip("192.168.0.21")), "the other gateway is resolved through the kernel");
    }
}
