//! Drop reasons, events and per-worker counters, each declared once (`declare_counters!`).
//!
//! Every drop has a stable number (never renumbered; new reasons are appended), a name for
//! metrics (`xlb_drops_total{reason="..."}`) and a per-worker counter. Counters are single
//! writer (the worker) and many readers (metrics, CLI): the worker does a relaxed load and
//! store — no read-modify-write, no lock prefix — and readers do relaxed loads.
#![deny(clippy::panic, clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Declares a numbered set of counters once: the enum (discriminant = stable number), its
/// `ALL` list in number order, `COUNT`, and for each its snake-case `name()` (metric or label
/// value), `help()` (also the variant's doc) and `kind()`. The worker counts by variant,
/// `/metrics` and the admin socket iterate `ALL`: adding a counter is one line here.
macro_rules! declare_counters {
    (
        $(#[$meta:meta])*
        $vis:vis enum $enum:ident {
            $( $id:ident = $num:literal, $name:literal, $kind:ident, $help:literal; )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
        #[repr(u8)]
        $vis enum $enum {
            $( #[doc = $help] $id = $num, )*
        }

        impl $enum {
            /// Every value, in number order.
            pub const ALL: &'static [Self] = &[$(Self::$id),*];
            /// How many there are.
            pub const COUNT: usize = Self::ALL.len();

            /// Snake-case name (metric name part or label value); stable.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Self::$id => $name,)*
                }
            }

            /// One-sentence description (metrics help text, admin docs).
            pub const fn help(self) -> &'static str {
                match self {
                    $(Self::$id => $help,)*
                }
            }

            /// Whether it only grows or is a level.
            pub const fn kind(self) -> Kind {
                match self {
                    $(Self::$id => Kind::$kind,)*
                }
            }
        }
    };
}

/// What a counter measures: a count that only grows or a level that is set.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Kind {
    /// Only grows (Prometheus counter, `_total`).
    Counter,
    /// Set to the current level (Prometheus gauge).
    Gauge,
}

declare_counters! {
    /// Why a packet was dropped. The discriminant is the stable reason number (never
    /// renumbered; new reasons are appended); `xlb_drops_total{reason=name}`.
    pub enum DropReason {
        MalformedL2 = 1, "malformed_l2", Counter, "Ethernet header truncated.";
        MalformedL3 = 2, "malformed_l3", Counter, "IP header truncated, wrong version, bad header or total length, or an extension header chain that runs past the packet.";
        MalformedL4 = 3, "malformed_l4", Counter, "L4 header truncated or with an impossible length (TCP data offset, UDP length), or an ICMP error to translate whose checksum is wrong.";
        TtlExceeded = 4, "ttl_exceeded", Counter, "TTL / hop limit would reach 0 (RFC 791, RFC 8200 §3).";
        SourceRangeDenied = 5, "source_range_denied", Counter, "Client outside the frontend's `loadBalancerSourceRanges` (LB-01).";
        NoNeighbour = 6, "no_neighbour", Counter, "Next hop MAC not resolved yet (the control side asks the kernel to resolve it).";
        ConntrackFull = 7, "conntrack_full", Counter, "Conntrack is full and nothing could be evicted.";
        NewFlowRateLimited = 8, "new_flow_rate_limited", Counter, "The worker's new-flow rate guard is exhausted.";
        SnatPortsExhausted = 9, "snat_ports_exhausted", Counter, "No free SNAT port in the worker's range.";
        FragmentUntracked = 10, "fragment_untracked", Counter, "A non-first fragment with no record of its first fragment.";
        NoRoom = 11, "no_room", Counter, "Not enough headroom in the frame buffer to encapsulate, or tailroom to build a reply.";
        IcmpUntracked = 12, "icmp_untracked", Counter, "ICMP error addressed to a VIP or SNAT address quoting no tracked flow.";
        FragmentTableFull = 13, "fragment_table_full", Counter, "Fragment table full: no longer counted (a full table forgets its oldest series for a new one, counted as the event fragment_evicted); the number stays reserved.";
        NoEndpointsDrop = 14, "no_endpoints_drop", Counter, "Service has no eligible backend and its policy is to drop (REJ-01, REJ-02).";
        SnatUntracked = 15, "snat_untracked", Counter, "An SNAT-address packet that matches no tracked flow.";
        TooBig = 16, "too_big", Counter, "Packet exceeds the MTU of the port it leaves on (encapsulated, or a port smaller than the one it arrived on) and may be fragmented (xlb does not), or an ICMP error could not be sent.";
        NoSourceAddress = 17, "no_source_address", Counter, "A backend's forwarding mode needs an address that is not configured (SNAT address, DSR source prefix).";
        UnsupportedProtocol = 18, "unsupported_protocol", Counter, "Protocol on a VIP that the pipeline does not balance (not TCP/UDP/SCTP/ICMP).";
        ReplyUntracked = 19, "reply_untracked", Counter, "A reply handed from worker to worker that no worker has a flow for, and no punt device to hand it to the kernel, or within 5 s of a start after a crash (its flow may not be picked up yet).";
        NoRoute = 20, "no_route", Counter, "A new flow's backend matches none of the kernel's routes; no conntrack entry is made.";
        ReplyTupleInUse = 21, "reply_tuple_in_use", Counter, "A new flow's reply tuple (its backend to its client address and port) is a live flow's, which came through another frontend: the live flow keeps it and the new flow gets no conntrack entry (Linux conntrack's clash, insert_failed).";
        IcmpErrorForbidden = 22, "icmp_error_forbidden", Counter, "A packet that would be answered with an ICMP error (port unreachable, too big), but whose source names no single host (unspecified, loopback, multicast, IPv4 class E or limited broadcast) or that came as a link-layer broadcast or multicast, or an IPv4 fragment other than the first: RFC 1122 §3.2.2, RFC 1812 §4.3.2.7 and RFC 4443 §2.4(e) forbid the error.";
        IcmpRateLimited = 23, "icmp_rate_limited", Counter, "A packet that would be answered with an ICMP error (port unreachable, too big) while the worker's budget of errors for this second is spent (1000 per second and worker: RFC 4443 §2.4(f), RFC 1812 §4.3.2.8).";
        FragmentUnrewritable = 24, "fragment_unrewritable", Counter, "A first fragment whose NAT rewrite would leave wrong a checksum that covers the whole datagram: SCTP's CRC32c when a port changes (RFC 9260 §6.8); xlb does not reassemble.";
        MartianSource = 25, "martian_source", Counter, "A packet that would start a flow from a source no host has (IPv4 0.0.0.0/8, 127.0.0.0/8, multicast, class E and 255.255.255.255; IPv6 ::, ::1, multicast): spoofed; a router drops it (RFC 1812 §5.3.7; Linux's martian sources).";
    }
}

declare_counters! {
    /// Events that are not drops but that operators want counted;
    /// `xlb_events_total{event=name}`.
    pub enum Event {
        RejectSent = 0, "reject_sent", Counter, "A VIP:port with no eligible endpoint answered with ICMP port unreachable.";
        RstBackendGone = 1, "rst_backend_gone", Counter, "A TCP RST sent because the flow's backend left the tables.";
        ReselectBackendGone = 2, "reselect_backend_gone", Counter, "A UDP/SCTP flow re-assigned because its backend left the tables.";
        IcmpTranslated = 3, "icmp_translated", Counter, "ICMP error translated and forwarded.";
        TooBigSent = 4, "too_big_sent", Counter, "ICMP \"fragmentation needed\" / \"packet too big\" sent for a packet over the MTU of the port it leaves on (an encapsulation, or a port smaller than the one it arrived on).";
        ConntrackEvicted = 5, "conntrack_evicted", Counter, "Conntrack entries evicted before expiry to make room.";
        ConntrackExpired = 6, "conntrack_expired", Counter, "Conntrack entries removed by expiry.";
        NewFlow = 7, "new_flow", Counter, "New flows created.";
        FlowReused = 8, "flow_reused", Counter, "A flow that reused the tuple of a closing flow (SYN on FIN/closed state).";
        FragmentForwarded = 9, "fragment_forwarded", Counter, "Fragments forwarded by the fragment table.";
        HandedOff = 10, "handed_off", Counter, "Replies handed to another worker (see `Verdict::Handoff`).";
        FlowRebound = 11, "flow_rebound", Counter, "A flow whose backend slot was freed kept its backend, found again by address and port in its frontend's service (the Service's external and internal specs merged or split).";
        FlowPickedUp = 12, "flow_picked_up", Counter, "A TCP packet without SYN, of no tracked flow, started a tracked flow (mid-stream pickup after a restart without hand-over or a crash). With the `mh` and `sh` schedulers it reaches the backend the flow had while the tables are the same; with the others the backend is chosen afresh and usually answers with a RST.";
        FlowImported = 13, "flow_imported", Counter, "Flows taken over from the previous xlb process at a hand-over (`xlb run --takeover`).";
        ReplyTupleReused = 14, "reply_tuple_reused", Counter, "A SYN from a backend on the reply tuple of a closing flow (FIN or RST seen): it answers a connection that did not come through xlb (a client's direct connection to the pod from the port of its earlier connection through the VIP), so the closing flow is forgotten and the packet handled as one of no flow (handed back to the kernel).";
        FragmentEvicted = 15, "fragment_evicted", Counter, "A fragment series' record forgotten before its timeout to record a newer series in a full fragment table (oldest first); a later fragment of it that still comes counts as the drop fragment_untracked. A steady rate means more fragmented datagrams in flight than the table holds, or a flood of first fragments.";
        TimeExceededSent = 16, "time_exceeded_sent", Counter, "ICMP \"time exceeded in transit\" sent, from the VIP, for a client's packet to a VIP whose TTL / hop limit would reach 0 (RFC 1812 §5.3.1; IPVS's decrement_ttl does the same); unanswered ones count as the drop ttl_exceeded.";
    }
}

declare_counters! {
    /// A worker's AF_XDP-level counters (frame accounting and the kernel's socket counters
    /// included); `xlb_xsk_<name>` (`_total` for counters) with label `worker`.
    pub enum XskCounter {
        TxRingFull = 0, "tx_ring_full", Counter, "Frames dropped because the AF_XDP TX ring stayed full after kicks and retries.";
        PassInUserspace = 1, "pass_in_userspace", Counter, "Frames steered to xlb that the tables did not own; each is then punted to the kernel (punted) or lost (punt_failed).";
        HandedOff = 2, "handed_off", Counter, "Frames handed to the worker that owns the flow.";
        HandoffDropped = 3, "handoff_dropped", Counter, "Hand-offs dropped: target inbox or buffer pool full.";
        UmemFrames = 4, "umem_frames", Gauge, "UMEM frames of the worker.";
        UmemFramesAccounted = 5, "umem_frames_accounted", Gauge, "UMEM frames found in the free list, fill and TX rings at the last batch (equal to umem_frames unless a frame leaked).";
        ZeroCopy = 6, "zero_copy", Gauge, "1 when the worker's sockets are zero-copy, 0 in copy mode.";
        UmemHugePages = 7, "umem_huge_pages", Gauge, "1 when the worker's UMEM is on huge pages (MAP_HUGETLB), 0 otherwise.";
        SocketRxDropped = 8, "socket_rx_dropped", Counter, "Kernel XDP_STATISTICS rx_dropped, summed over the worker's sockets.";
        SocketRxRingFull = 9, "socket_rx_ring_full", Counter, "Kernel XDP_STATISTICS rx_ring_full: frames lost because the worker did not keep up.";
        SocketRxFillRingEmpty = 10, "socket_rx_fill_ring_empty", Counter, "Kernel XDP_STATISTICS rx_fill_ring_empty_descs: frames lost for want of a free UMEM frame.";
        SocketRxInvalidDescs = 11, "socket_rx_invalid_descs", Counter, "Kernel XDP_STATISTICS rx_invalid_descs.";
        SocketTxInvalidDescs = 12, "socket_tx_invalid_descs", Counter, "Kernel XDP_STATISTICS tx_invalid_descs.";
        SocketTxRingEmpty = 13, "socket_tx_ring_empty", Counter, "Kernel XDP_STATISTICS tx_ring_empty_descs.";
        Punted = 14, "punted", Counter, "Frames that were not xlb's handed back to the kernel's stack through the punt device (the exception path).";
        PuntFailed = 15, "punt_failed", Counter, "Frames that were not xlb's and could not be punted (no punt device, not IP, or its queue full): dropped.";
        ToKernel = 16, "to_kernel", Counter, "Frames for backends reached through the kernel (pods behind a veth on this node) written into the punt device.";
        FromKernel = 17, "from_kernel", Counter, "Packets read from the punt device: replies of backends reached through the kernel, routed there by xlb's policy rules.";
        FromKernelUntracked = 18, "from_kernel_untracked", Counter, "Packets read from the punt device that belong to no flow (direct traffic of a pod on this node from a Service's target port): handed back to the kernel (counted punted), which routes them by the main table.";
    }
}

declare_counters! {
    /// Bytes of the frames a worker's pipeline saw, by verdict class: the byte counterparts of
    /// the packet counters `xlb_worker_{rx,tx,pass}_packets_total` and of the `handed_off`
    /// event; `xlb_worker_<name>_bytes_total{worker}`. Drops are counted by reason apart
    /// ([`WorkerCounters::drop_bytes`], `xlb_drop_bytes_total{worker,reason}`). A frame's bytes
    /// are its length from the Ethernet header on (no FCS), summed per RX batch by the worker
    /// loop (`worker::run`), outside the per-packet pipeline.
    pub enum ByteCounter {
        Rx = 0, "rx", Counter, "Bytes of the frames the worker's pipeline received (from its sockets, its punt queue and other workers' hand-offs), as received.";
        Tx = 1, "tx", Counter, "Bytes of the frames the pipeline sent on (DNAT/SNAT/DSR and replies, backends reached through the kernel included), as rewritten.";
        Pass = 2, "pass", Counter, "Bytes of the frames the pipeline passed to the kernel (not xlb's).";
        HandedOff = 3, "handed_off", Counter, "Bytes of the frames the pipeline handed to another worker (or, after every worker, to the kernel).";
    }
}

/// Help text of `xlb_drop_bytes_total{worker,reason}` (the bytes of [`DropReason`]'s drops,
/// [`WorkerCounters::drop_bytes`]).
pub const DROP_BYTES_HELP: &str =
    "Bytes of the frames dropped, by worker and reason (as the worker dropped them, Ethernet header included).";

/// A worker's [`XskCounter`] values: written by the worker (once per batch), read by
/// `/metrics` and the admin socket.
#[derive(Debug)]
pub struct XskCounters([Counter; XskCounter::COUNT]);

impl Default for XskCounters {
    fn default() -> Self {
        Self(core::array::from_fn(|_| Counter::default()))
    }
}

impl XskCounters {
    /// The counter `c`.
    #[inline]
    pub fn counter(&self, c: XskCounter) -> &Counter {
        // `c as usize < COUNT` by construction (dense numbers, pinned by a test).
        self.0.get(c as usize).unwrap_or(&ZERO)
    }

    /// Current value of `c`.
    pub fn get(&self, c: XskCounter) -> u64 {
        self.counter(c).get()
    }

    /// Every counter with its value, in number order.
    pub fn values(&self) -> impl Iterator<Item = (XskCounter, u64)> + '_ {
        XskCounter::ALL.iter().map(|c| (*c, self.get(*c)))
    }
}

/// A counter that stays 0 (what [`XskCounters::counter`] would return for a number out of
/// range, which the dense numbering rules out).
static ZERO: Counter = Counter(AtomicU64::new(0));

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
    pub drops: [Counter; DropReason::COUNT + 1],
    /// Events by number.
    pub events: [Counter; Event::COUNT],
    /// Conntrack forward entries (gauge), IPv4 + IPv6.
    pub ct_entries: Counter,
    /// Flows each family's conntrack table holds at most (gauge, set once when the pipeline
    /// is made): `conntrack.maxPerCore`. The IPv4 and IPv6 tables each have this capacity, so
    /// [`ct_entries`](Self::ct_entries) (both families) may exceed it on a dual-stack node.
    pub ct_capacity: Counter,
    /// Nanoseconds the worker spent in loop iterations that found work (frames received,
    /// read from the punt device or handed over), measured once per iteration by the worker
    /// loop from the iteration's start to its end; idle iterations and `poll(2)` waits are
    /// not counted. Its rate over time is the busy fraction of the worker's core.
    pub busy_ns: Counter,
    /// Loop iterations that found work (the iterations [`busy_ns`](Self::busy_ns) counts).
    pub busy_loops: Counter,
    /// The worker loop's clock, in milliseconds since the workers' epoch (at least 1), stored
    /// about once a second while the loop runs (0: not yet). It stops advancing when the loop
    /// does (a worker stuck, or whose thread ended): the control side reads its progress to
    /// tell a stalled worker (`/livez`, `/healthz`).
    pub heartbeat_ms: Counter,
    /// Bytes by verdict class (index = [`ByteCounter`] as usize), written by the worker loop
    /// once per batch ([`add_bytes`](Self::add_bytes)), not by the pipeline.
    pub bytes: [Counter; ByteCounter::COUNT],
    /// Bytes dropped by reason number (index = reason as usize; index 0 unused), written by
    /// the worker loop once per batch.
    pub drop_bytes: [Counter; DropReason::COUNT + 1],
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
            drops: core::array::from_fn(|_| Counter::default()),
            events: core::array::from_fn(|_| Counter::default()),
            ct_entries: Counter::default(),
            ct_capacity: Counter::default(),
            busy_ns: Counter::default(),
            busy_loops: Counter::default(),
            heartbeat_ms: Counter::default(),
            bytes: core::array::from_fn(|_| Counter::default()),
            drop_bytes: core::array::from_fn(|_| Counter::default()),
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

    /// Adds `n` bytes to class `b` (single writer: the worker loop).
    #[inline]
    pub fn add_bytes(&self, b: ByteCounter, n: u64) {
        if let Some(c) = self.bytes.get(b as usize) {
            c.add(n);
        }
    }

    /// Adds `n` dropped bytes to reason `r` (single writer: the worker loop).
    #[inline]
    pub fn add_drop_bytes(&self, r: DropReason, n: u64) {
        if let Some(c) = self.drop_bytes.get(r as usize) {
            c.add(n);
        }
    }

    /// Bytes counted for class `b`.
    pub fn bytes_of(&self, b: ByteCounter) -> u64 {
        self.bytes.get(b as usize).map_or(0, Counter::get)
    }

    /// Bytes dropped for reason `r`.
    pub fn drop_bytes_of(&self, r: DropReason) -> u64 {
        self.drop_bytes.get(r as usize).map_or(0, Counter::get)
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
        for (i, x) in XskCounter::ALL.iter().enumerate() {
            assert_eq!(*x as usize, i, "{}", x.name());
        }
        for (i, b) in ByteCounter::ALL.iter().enumerate() {
            assert_eq!(*b as usize, i, "{}", b.name());
        }
        assert_eq!(c.bytes.len(), ByteCounter::COUNT);
        assert_eq!(c.drop_bytes.len(), c.drops.len());
    }

    #[test]
    fn names_are_unique_snake_case_and_every_counter_has_help() {
        fn check(all: impl Iterator<Item = (&'static str, &'static str)>) {
            let mut seen = std::collections::HashSet::new();
            for (name, help) in all {
                assert!(seen.insert(name), "{name} declared twice");
                assert!(name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'), "{name}");
                assert!(help.ends_with('.') && help.len() > 10, "{name}: help {help:?}");
            }
        }
        check(DropReason::ALL.iter().map(|r| (r.name(), r.help())));
        check(Event::ALL.iter().map(|e| (e.name(), e.help())));
        check(XskCounter::ALL.iter().map(|x| (x.name(), x.help())));
        check(ByteCounter::ALL.iter().map(|b| (b.name(), b.help())));
    }
}
