//! Drop reasons and per-worker counters.
//!
//! Every drop has a stable number (never renumbered; new reasons are appended), a name for
//! metrics (`xlb_drops_total{reason="..."}`) and a per-worker counter. Counters are single
//! writer (the worker) and many readers (metrics, CLI): the worker does a relaxed load and
//! store — no read-modify-write, no lock prefix — and readers do relaxed loads.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Why a packet was dropped. The discriminant is the stable reason number.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
#[repr(u8)]
pub enum DropReason {
    /// Ethernet header truncated.
    MalformedL2 = 1,
    /// IP header truncated, wrong version, bad header or total length, or an extension
    /// header chain that runs past the packet.
    MalformedL3 = 2,
    /// L4 header truncated or with an impossible length (TCP data offset, UDP length).
    MalformedL4 = 3,
    /// TTL / hop limit would reach 0 (RFC 791, RFC 8200 §3).
    TtlExceeded = 4,
    /// Client outside the frontend's `loadBalancerSourceRanges` (LB-01).
    SourceRangeDenied = 5,
    /// Next hop MAC not resolved yet (the control side asks the kernel to resolve it).
    NoNeighbour = 6,
    /// Conntrack is full and nothing could be evicted.
    ConntrackFull = 7,
    /// The worker's new-flow rate guard is exhausted.
    NewFlowRateLimited = 8,
    /// No free SNAT port in the worker's range.
    SnatPortsExhausted = 9,
    /// A non-first fragment with no record of its first fragment.
    FragmentUntracked = 10,
    /// Not enough headroom in the frame buffer to encapsulate, or tailroom to build a reply.
    NoRoom = 11,
    /// ICMP error addressed to a VIP or SNAT address quoting no tracked flow.
    IcmpUntracked = 12,
    /// Fragment table full.
    FragmentTableFull = 13,
    /// Service has no eligible backend and its policy is to drop (REJ-01, REJ-02).
    NoEndpointsDrop = 14,
    /// An SNAT-address packet that matches no tracked flow.
    SnatUntracked = 15,
    /// Encapsulated packet exceeds the MTU and may not be fragmented; an ICMP error could
    /// not be sent either.
    TooBig = 16,
    /// A backend's forwarding mode needs an address that is not configured (SNAT address,
    /// DSR source prefix).
    NoSourceAddress = 17,
    /// Protocol on a VIP that the pipeline does not balance (not TCP/UDP/SCTP/ICMP).
    UnsupportedProtocol = 18,
    /// A reply handed from worker to worker that no worker has a flow for.
    ReplyUntracked = 19,
}

impl DropReason {
    /// Every reason, in number order.
    pub const ALL: [Self; 19] = [
        Self::MalformedL2,
        Self::MalformedL3,
        Self::MalformedL4,
        Self::TtlExceeded,
        Self::SourceRangeDenied,
        Self::NoNeighbour,
        Self::ConntrackFull,
        Self::NewFlowRateLimited,
        Self::SnatPortsExhausted,
        Self::FragmentUntracked,
        Self::NoRoom,
        Self::IcmpUntracked,
        Self::FragmentTableFull,
        Self::NoEndpointsDrop,
        Self::SnatUntracked,
        Self::TooBig,
        Self::NoSourceAddress,
        Self::UnsupportedProtocol,
        Self::ReplyUntracked,
    ];

    /// Snake-case name for metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            Self::MalformedL2 => "malformed_l2",
            Self::MalformedL3 => "malformed_l3",
            Self::MalformedL4 => "malformed_l4",
            Self::TtlExceeded => "ttl_exceeded",
            Self::SourceRangeDenied => "source_range_denied",
            Self::NoNeighbour => "no_neighbour",
            Self::ConntrackFull => "conntrack_full",
            Self::NewFlowRateLimited => "new_flow_rate_limited",
            Self::SnatPortsExhausted => "snat_ports_exhausted",
            Self::FragmentUntracked => "fragment_untracked",
            Self::NoRoom => "no_room",
            Self::IcmpUntracked => "icmp_untracked",
            Self::FragmentTableFull => "fragment_table_full",
            Self::NoEndpointsDrop => "no_endpoints_drop",
            Self::SnatUntracked => "snat_untracked",
            Self::TooBig => "too_big",
            Self::NoSourceAddress => "no_source_address",
            Self::UnsupportedProtocol => "unsupported_protocol",
            Self::ReplyUntracked => "reply_untracked",
        }
    }
}

/// Events that are not drops but that operators want counted.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
#[repr(u8)]
pub enum Event {
    /// A VIP:port with no eligible endpoint answered with ICMP port unreachable.
    RejectSent = 0,
    /// A TCP RST sent because the flow's backend left the tables.
    RstBackendGone = 1,
    /// A UDP/SCTP flow re-assigned because its backend left the tables.
    ReselectBackendGone = 2,
    /// ICMP error translated and forwarded.
    IcmpTranslated = 3,
    /// ICMP "fragmentation needed" / "packet too big" sent for an oversized encapsulation.
    TooBigSent = 4,
    /// Conntrack entries evicted before expiry to make room.
    ConntrackEvicted = 5,
    /// Conntrack entries removed by expiry.
    ConntrackExpired = 6,
    /// New flows created.
    NewFlow = 7,
    /// A flow that reused the tuple of a closing flow (SYN on FIN/closed state).
    FlowReused = 8,
    /// Fragments forwarded by the fragment table.
    FragmentForwarded = 9,
    /// Replies handed to another worker (see `Verdict::Handoff`).
    HandedOff = 10,
}

impl Event {
    /// Every event, in number order.
    pub const ALL: [Self; 11] = [
        Self::RejectSent,
        Self::RstBackendGone,
        Self::ReselectBackendGone,
        Self::IcmpTranslated,
        Self::TooBigSent,
        Self::ConntrackEvicted,
        Self::ConntrackExpired,
        Self::NewFlow,
        Self::FlowReused,
        Self::FragmentForwarded,
        Self::HandedOff,
    ];
    /// Snake-case name for metrics.
    pub fn name(self) -> &'static str {
        match self {
            Self::RejectSent => "reject_sent",
            Self::RstBackendGone => "rst_backend_gone",
            Self::ReselectBackendGone => "reselect_backend_gone",
            Self::IcmpTranslated => "icmp_translated",
            Self::TooBigSent => "too_big_sent",
            Self::ConntrackEvicted => "conntrack_evicted",
            Self::ConntrackExpired => "conntrack_expired",
            Self::NewFlow => "new_flow",
            Self::FlowReused => "flow_reused",
            Self::FragmentForwarded => "fragment_forwarded",
            Self::HandedOff => "handed_off",
        }
    }
}

/// A counter with one writer: increments are a relaxed load plus store.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n` (single writer only).
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.store(self.0.load(Relaxed).wrapping_add(n), Relaxed);
    }
    /// Adds one (single writer only).
    #[inline]
    pub fn inc(&self) {
        self.add(1);
    }
    /// Overwrites the value (single writer only); for gauges.
    #[inline]
    pub fn set(&self, v: u64) {
        self.0.store(v, Relaxed);
    }
    /// Current value.
    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// Per-service and per-backend packet counters, sized once.
#[derive(Debug)]
pub struct ObjectCounters {
    /// Packets per service id.
    pub service_packets: Box<[Counter]>,
    /// New flows per service id.
    pub service_flows: Box<[Counter]>,
    /// Packets per backend slot.
    pub backend_packets: Box<[Counter]>,
    /// New flows per backend slot.
    pub backend_flows: Box<[Counter]>,
}

/// All counters of one worker. Shared (`Arc`) between the worker and readers.
#[derive(Debug)]
pub struct WorkerCounters {
    /// Frames received.
    pub rx: Counter,
    /// Frames transmitted.
    pub tx: Counter,
    /// Frames passed to the kernel.
    pub pass: Counter,
    /// Drops by reason number (index = reason as usize; index 0 unused).
    pub drops: [Counter; 20],
    /// Events by number.
    pub events: [Counter; 11],
    /// Conntrack forward entries (gauge), IPv4 + IPv6.
    pub ct_entries: Counter,
    /// Per-service and per-backend counters.
    pub objects: ObjectCounters,
}

impl WorkerCounters {
    /// Counters for up to `services` service ids and `backends` backend slots.
    pub fn new(services: usize, backends: usize) -> Self {
        let mk = |n: usize| (0..n).map(|_| Counter::default()).collect::<Box<[_]>>();
        Self {
            rx: Counter::default(),
            tx: Counter::default(),
            pass: Counter::default(),
            drops: Default::default(),
            events: Default::default(),
            ct_entries: Counter::default(),
            objects: ObjectCounters {
                service_packets: mk(services),
                service_flows: mk(services),
                backend_packets: mk(backends),
                backend_flows: mk(backends),
            },
        }
    }

    /// Counts a drop.
    #[inline]
    pub fn count_drop(&self, r: DropReason) {
        if let Some(c) = self.drops.get(r as usize) {
            c.inc();
        }
    }

    /// Counts an event.
    #[inline]
    pub fn event(&self, e: Event) {
        if let Some(c) = self.events.get(e as usize) {
            c.inc();
        }
    }

    /// Drop count for `r`.
    pub fn drops_of(&self, r: DropReason) -> u64 {
        self.drops.get(r as usize).map_or(0, Counter::get)
    }

    /// Event count for `e`.
    pub fn events_of(&self, e: Event) -> u64 {
        self.events.get(e as usize).map_or(0, Counter::get)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_reason_numbers_are_stable_and_dense() {
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i + 1, "{}", r.name());
        }
        let c = WorkerCounters::new(1, 1);
        assert_eq!(c.drops.len(), DropReason::ALL.len() + 1);
        assert_eq!(c.events.len(), Event::ALL.len());
        for (i, e) in Event::ALL.iter().enumerate() {
            assert_eq!(*e as usize, i);
        }
    }
}
