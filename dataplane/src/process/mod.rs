//! The per-packet pipeline.
//!
//! [`Pipeline::process_batch`] takes the frames of one RX batch (up to [`BATCH`]) and gives each
//! a [`Verdict`]; it never fails, allocates, locks, makes a syscall or panics. It works in
//! stages over the whole batch, in the style of VPP and DPDK, so that the cache misses of
//! different packets overlap instead of being paid one after the other:
//!
//! 1. **parse and hash**: the fast parser ([`wire::parse_fast`]: Ethernet, one optional
//!    802.1Q tag, IPv4 without options or IPv6 without extension headers, TCP or UDP, at fixed
//!    offsets) reads each frame, the flow key is hashed once, and the key's home bucket in the
//!    flow table is prefetched. Frames the fast parser does not take go to the slow path. The
//!    most common shapes, IPv4 or IPv6 TCP behind an untagged Ethernet header, have parsers of
//!    their own ([`wire::parse_fast_v4_tcp`], [`wire::parse_fast_v6_tcp`]): a batch whose
//!    frames all have one of them runs instances of stages 1 to 3 made for it, with the
//!    shape's offsets and protocol as constants (`Pipeline::batch_shaped`,
//!    `fast::stage_shaped`); at the first frame of another shape
//!    the batch starts again on the general path (the frames before it are parsed twice), and
//!    after such a batch the next 16 go to the general path at once. What each path costs is
//!    measured in `docs/benchmarks.md`;
//! 2. **tags**: the bucket's tags are compared and the record of the first match prefetched;
//! 3. **rewrite**: the key is checked against the record; a packet of a known flow whose
//!    record was stamped with the current tables generation is rewritten from the record's
//!    precomputed fields (addresses, ports, RFC 1624 checksum deltas with the TTL decrement
//!    folded in, next-hop MAC and port) and queued for TX (`fast`);
//! 4. **misses**: packets of unknown flows form a sub-batch: frontend lookup, then for Maglev
//!    services the lookup-table slot is computed and prefetched, then the chosen backend;
//!    Stage 4 also marks the new flows of the most common kind (a Maglev service without
//!    affinity in NAT mode, no source ranges, no SNAT, a backend with a route and one next hop)
//!    and keeps the hash of each one's reply tuple, which it computes for the prefetch anyway;
//! 5. **slow path**, in the order the packets arrived: new flows (affinity, scheduler, SNAT
//!    port, insert), flows whose record is stale (the tables changed: the backend is checked —
//!    gone means a TCP RST or a UDP re-selection — and the record refreshed), TCP connection
//!    reuse, ICMP errors, fragments, rejects, and every frame the fast parser left
//!    (`slow`). A new flow stage 4 marked takes a direct route (`slow::new_flow_direct`):
//!    the record and its rewrite are built for that kind alone and inserted under the reply
//!    hash stage 4 kept ([`Conntrack::insert_hashed`]); it gives what the general route gives
//!    (`dataplane/tests/direct_new_flow.rs` compares the two, [`Pipeline::set_direct_new_flows`]).
//!    While both flow tables have room for every packet left, consecutive new flows of one
//!    family on the direct routes are inserted through one borrow of their table
//!    ([`conntrack::Inserter`], `slow::run_direct`).
//!
//! The result is the same as processing the packets one at a time with [`Pipeline::process`]
//! (a batch of one), with one exception: under a full conntrack table a new flow may evict
//! a not-yet-established flow whose later packet in the same batch was already forwarded.
//! A packet whose flow waits for the slow path marks the record
//! ([`crate::conntrack::flow_flags::DEFERRED`]), so later packets of that flow in the batch
//! wait too and per-flow order is kept.
//!
//! [`Pipeline::begin_batch`] runs once per RX batch: it adopts a new tables snapshot (resizing
//! per-service state, off the per-packet path), advances the clock and runs one step of the
//! conntrack sweep when due.

#![deny(clippy::panic, clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod fast;
mod slow;
pub mod snapshot;

use std::sync::Arc;

use crate::addr::{Cidr, Family, V4, V6};
use crate::affinity::AffinityTable;
use crate::conntrack::{self, Conntrack, CtFamily, CtState, FlowKey, Timeouts, flow_flags};
use crate::counters::{DropReason, Event, WorkerCounters};
use crate::frag::FragTable;
use crate::nat::Packet;
use crate::sched::SchedState;
use crate::tables::{BackendRef, Tables};
use crate::wire::{self, Fast, FastFrame, proto};

/// Most frames [`Pipeline::process_batch`] works on at once (longer slices are cut).
pub const BATCH: usize = 64;

/// Most conntrack records of each family the sweep visits per [`Pipeline::begin_batch`]
/// ([`Conntrack::sweep_some`]). When all of them have expired, the slowest batch of a SYN
/// flood into a 1,048,576-flow table measured 122–150 µs against a median of 15 µs
/// (`callgrind-pipeline jitter`, docs/benchmarks.md); a whole step at once took up to
/// 6.2 ms. A worker begins a batch at least once a millisecond (it sleeps in `poll(2)` for
/// at most 1 ms), so a step of up to 25,600 records (a table of 1,638,400 flows) is done
/// within its 100 ms interval even when idle; steps of larger tables fall behind and a pass
/// takes longer.
pub const SWEEP_BUDGET: u32 = 256;

/// What to do with a frame after [`Pipeline::process`].
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Verdict {
    /// Transmit the (rewritten) frame `pkt.buf[pkt.head..pkt.head + pkt.len]` on this port.
    Tx {
        /// Port index (see [`crate::tables::TablesSpec::ports`]).
        port: u8,
    },
    /// Give the frame, unchanged, to the kernel's stack.
    Pass,
    /// Drop it; the reason is counted.
    Drop(DropReason),
    /// The frame (unchanged) is a reply of a flow another worker may own: hand it to that
    /// worker (SNAT replies go straight to the owner of the destination port's range; other
    /// replies from a backend visit the workers in turn).
    Handoff {
        /// Worker to hand it to.
        worker: u16,
    },
}

/// Worker configuration for the pipeline.
#[derive(Clone, Debug)]
pub struct PipelineConfig {
    /// Worker number, for logs and the SNAT port range.
    pub worker_id: u16,
    /// Maximum flows per address family.
    pub conntrack_capacity: usize,
    /// Conntrack timeouts.
    pub timeouts: Timeouts,
    /// New flows admitted per second (burst equal to the rate); 0 = unlimited.
    pub new_flows_per_s: u32,
    /// SNAT source ports of the whole node, inclusive. Worker `i` of `workers` owns the
    /// `i`-th of `workers` equal slices ([`PipelineConfig::snat_range_for`]), so a reply's
    /// destination port names the worker that made the flow.
    pub snat_ports: (u16, u16),
    /// Number of workers on the node (for SNAT port ownership and reply hand-off).
    pub workers: u16,
    /// Maximum recorded fragment series per family.
    pub frag_capacity: usize,
    /// How long a fragment series is remembered, in seconds.
    pub frag_timeout_s: u32,
    /// Maximum ClientIP affinity records (the table is shared by the node's workers).
    pub affinity_capacity: usize,
    /// Interval between conntrack sweep steps, in milliseconds (each step one
    /// [`conntrack::SHARDS`]th of the records, done [`SWEEP_BUDGET`] records per batch).
    pub sweep_interval_ms: u64,
    /// Service counter slots (largest service id + 1 that will be counted).
    pub max_services: usize,
    /// Backend counter slots (largest backend slot + 1 that will be counted).
    pub max_backends: usize,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            worker_id: 0,
            conntrack_capacity: 1 << 20,
            timeouts: Timeouts::default(),
            new_flows_per_s: 0,
            snat_ports: (1024, 65535),
            workers: 1,
            frag_capacity: 8192,
            frag_timeout_s: 5,
            affinity_capacity: 1 << 16,
            sweep_interval_ms: 100,
            max_services: 1 << 14,
            max_backends: 1 << 16,
        }
    }
}

impl PipelineConfig {
    /// Splits `lo..=hi` into `n` disjoint ranges and returns range `i` (for worker `i`).
    pub fn snat_range_for(lo: u16, hi: u16, n: u16, i: u16) -> (u16, u16) {
        let n = u32::from(n.max(1));
        let span = (u32::from(hi) - u32::from(lo) + 1) / n;
        let start = u32::from(lo) + span * u32::from(i);
        let end = if u32::from(i) + 1 == n { u32::from(hi) } else { start + span - 1 };
        (u16::try_from(start).unwrap_or(hi), u16::try_from(end).unwrap_or(hi))
    }

    /// This worker's SNAT port slice.
    pub fn own_snat_ports(&self) -> (u16, u16) {
        Self::snat_range_for(self.snat_ports.0, self.snat_ports.1, self.workers, self.worker_id)
    }

    /// The worker after this one, for a frame this worker holds no state for (a reply, an
    /// ICMP error or a later fragment of a flow another worker may hold): the workers are
    /// asked in turn, and the worker loop hands the frame to the kernel once every one has
    /// looked. `None` with one worker.
    pub fn next_worker(&self) -> Option<u16> {
        (self.workers > 1).then(|| (self.worker_id + 1) % self.workers)
    }

    /// The worker whose slice holds SNAT port `port`, if any.
    pub fn snat_owner(&self, port: u16) -> Option<u16> {
        let (lo, hi) = self.snat_ports;
        if port < lo || port > hi {
            return None;
        }
        let n = u32::from(self.workers.max(1));
        let span = ((u32::from(hi) - u32::from(lo) + 1) / n).max(1);
        let i = ((u32::from(port) - u32::from(lo)) / span).min(n - 1);
        u16::try_from(i).ok()
    }
}

/// A packet of the batch that the fast parser took: where it is, its key and hash, what the
/// tag stage found for it. Kept small (the slow path parses the frame again rather than
/// storing a [`Parsed`] per packet).
#[derive(Copy, Clone, Debug, Default)]
struct Lane<A> {
    /// The packet's tuple.
    key: FlowKey<A>,
    /// Its hash in the flow table.
    hash: u64,
    /// What the tag stage found in the home bucket.
    probe: conntrack::Probe,
    /// Length of the transport segment (the IP packet's payload): the packet ends at `l3` plus
    /// the IP header plus this. Kept rather than the end, which can pass `u16::MAX` where the
    /// segment cannot: the end clamped to a `u16` cost stage 1 a compare and a conditional move
    /// per packet.
    seg: u16,
    /// Index of the packet in the batch.
    pkt: u8,
    /// Offset of the IP header (14, or 18 behind an 802.1Q tag).
    l3: u8,
    /// TCP flags (0 for UDP).
    tcp_flags: u8,
    /// The flow table has no entry for it (set by the fast stage).
    miss: bool,
}

/// The fast-parsed packets of one family in the current batch.
#[derive(Debug)]
struct Lanes<A> {
    l: Box<[Lane<A>; BATCH]>,
    n: usize,
    /// The tag stage found the table full and set `victim` of every lane.
    victims: bool,
    /// When [`Lanes::victims`]: for lane `i` whose key matched no tag, the entry of the flow
    /// its insert would evict, as the tag stage found it ([`conntrack::Probe::NONE`]: none),
    /// for the miss stage's prefetch. (Beside the lanes, not in them: the fast stages read
    /// the lanes, and this is only for a full table's new flows.)
    victim: [u32; BATCH],
    /// The Maglev lookup-table slot of lane `i` (`flow_hash % M`, computed once for its
    /// prefetch and read in the next loop of the miss stage).
    maglev_slot: [usize; BATCH],
}

impl<A: Family> Lane<A> {
    /// End of the IP packet (offset from the frame start).
    #[inline]
    fn end(&self) -> usize {
        usize::from(self.l3) + A::HEADER_LEN + usize::from(self.seg)
    }
}

impl<A: Copy + Default + Family> Lanes<A> {
    fn new() -> Self {
        Self {
            l: Box::new([Lane::default(); BATCH]),
            n: 0,
            victims: false,
            victim: [conntrack::Probe::NONE; BATCH],
            maglev_slot: [0; BATCH],
        }
    }

    #[inline]
    fn as_slice(&self) -> &[Lane<A>] {
        self.l.get(..self.n).unwrap_or(&[])
    }

    #[inline]
    fn as_mut_slice(&mut self) -> &mut [Lane<A>] {
        self.l.get_mut(..self.n).unwrap_or(&mut [])
    }

    /// Appends a lane for packet `pkt` (its probe and miss flag are set by the later stages);
    /// returns its index ([`NO_LANE`] if full, which a batch of at most [`BATCH`] packets never
    /// is).
    #[inline]
    fn push(&mut self, key: FlowKey<A>, hash: u64, home: u32, pkt: usize, p: &Fast<A>) -> u8 {
        let i = self.n;
        let Some(x) = self.l.get_mut(i) else { return NO_LANE };
        Self::fill(x, key, hash, home, pkt, p);
        self.n = i + 1;
        #[expect(clippy::cast_possible_truncation, reason = "i < BATCH = 64")]
        let lane = i as u8;
        lane
    }

    /// Fills lane `x`; `home` (the key's home bucket, which stage 1 computed for its prefetch)
    /// goes into the probe's bucket, where the tag stage reads it.
    #[inline(always)]
    fn fill(x: &mut Lane<A>, key: FlowKey<A>, hash: u64, home: u32, pkt: usize, p: &Fast<A>) {
        x.key = key;
        x.hash = hash;
        x.probe.bucket = home;
        #[expect(
            clippy::cast_possible_truncation,
            reason = "pkt < BATCH, l3 14 or 18, the segment a u16 (IPv4 total length - 20, IPv6 payload length)"
        )]
        {
            x.seg = (p.end - p.l3 - A::HEADER_LEN) as u16;
            x.pkt = pkt as u8;
            x.l3 = p.l3 as u8;
        }
        x.tcp_flags = p.tcp_flags;
        x.miss = false;
    }
}

/// Per-family state of one worker.
#[derive(Debug)]
pub struct FamState<A: CtFamily> {
    /// Connection tracking.
    pub ct: Conntrack<A>,
    frag: FragTable<A>,
    /// Fast-parsed packets of the current batch.
    lanes: Lanes<A>,
    /// Records marked [`flow_flags::DEFERRED`] in the current batch, unmarked at its end.
    deferred: Vec<conntrack::RecId>,
    /// Stage 4's cache of frontend lookups.
    fe_cache: slow::FrontendCache,
}

impl<A: CtFamily> FamState<A> {
    /// Unmarks the records the batch deferred.
    fn end_batch(&mut self) {
        for id in self.deferred.drain(..) {
            if let Some(r) = self.ct.rec_mut(id) {
                r.flags &= !flow_flags::DEFERRED;
            }
        }
    }

    fn new(c: &PipelineConfig) -> Self {
        Self {
            ct: Conntrack::new(c.conntrack_capacity),
            frag: FragTable::new(c.frag_capacity),
            lanes: Lanes::new(),
            deferred: Vec::with_capacity(BATCH),
            fe_cache: slow::FrontendCache::new(),
        }
    }
}

/// Selects the per-family state and family-specific table fields.
trait Fam: CtFamily {
    fn state(w: &mut Families) -> &mut FamState<Self>;
    /// Empties the other family's lanes.
    fn clear_other(w: &mut Families);
    /// The common shape's parser of this family (TCP behind an untagged Ethernet header).
    fn parse_shaped(f: &[u8]) -> Option<Fast<Self>>;
    /// What marks this family's lanes in `Pipeline::lane_of` (0, or [`V6_LANE`]).
    const LANE_FLAG: u8;
    fn snat(t: &Tables) -> Option<Self>;
    fn dsr_prefix(t: &Tables) -> Option<Cidr>;
    const ICMP: u8;
    fn is_icmp_error(ty: u8) -> bool;
}

/// Both families' state.
#[derive(Debug)]
pub struct Families {
    /// IPv4.
    pub v4: FamState<V4>,
    /// IPv6.
    pub v6: FamState<V6>,
}

impl Fam for V4 {
    fn state(w: &mut Families) -> &mut FamState<Self> {
        &mut w.v4
    }
    fn clear_other(w: &mut Families) {
        w.v6.lanes.n = 0;
    }
    #[inline(always)]
    fn parse_shaped(f: &[u8]) -> Option<Fast<Self>> {
        wire::parse_fast_v4_tcp(f)
    }
    const LANE_FLAG: u8 = 0;
    fn snat(t: &Tables) -> Option<Self> {
        t.snat_v4.map(V4)
    }
    fn dsr_prefix(t: &Tables) -> Option<Cidr> {
        t.dsr_source_v4
    }
    const ICMP: u8 = proto::ICMP;
    fn is_icmp_error(ty: u8) -> bool {
        wire::is_icmpv4_error(ty)
    }
}

impl Fam for V6 {
    fn state(w: &mut Families) -> &mut FamState<Self> {
        &mut w.v6
    }
    fn clear_other(w: &mut Families) {
        w.v4.lanes.n = 0;
    }
    #[inline(always)]
    fn parse_shaped(f: &[u8]) -> Option<Fast<Self>> {
        wire::parse_fast_v6_tcp(f)
    }
    const LANE_FLAG: u8 = V6_LANE;
    fn snat(t: &Tables) -> Option<Self> {
        t.snat_v6.map(V6)
    }
    fn dsr_prefix(t: &Tables) -> Option<Cidr> {
        t.dsr_source_v6
    }
    const ICMP: u8 = proto::ICMPV6;
    fn is_icmp_error(ty: u8) -> bool {
        wire::is_icmpv6_error(ty)
    }
}

/// An xlb port as the per-packet path needs it (copied from the tables when they change).
#[derive(Copy, Clone, Debug, Default)]
struct PortInfo {
    mac: [u8; 6],
    mtu: u16,
    /// The tables have this port.
    known: bool,
}

/// ICMP errors (port unreachable, too big) one worker originates per second at most: the
/// budget of Linux's `net.ipv4.icmp_msgs_per_sec` (1000), per worker.
pub const ICMP_ERRORS_PER_S: u32 = 1000;

/// State shared by both families on one worker.
#[derive(Debug)]
struct Common {
    cfg: PipelineConfig,
    sched: SchedState,
    counters: Arc<WorkerCounters>,
    now_s: u32,
    now_ms: u64,
    last_sweep_ms: u64,
    /// New flows this worker may still admit this second ([`PipelineConfig::new_flows_per_s`]).
    new_flows: PerSecond,
    /// ICMP errors this worker may still originate this second ([`ICMP_ERRORS_PER_S`]).
    icmp_errors: PerSecond,
    snat_cursor: u16,
    own_snat: (u16, u16),
    affinity: Arc<AffinityTable>,
    /// Timeout per [`CtState`] number.
    timeout: [u32; 5],
    /// Expiry (worker seconds) of a flow seen now, per [`CtState`] number (`now_s` plus the
    /// state's timeout, saturating), computed once per batch in [`Pipeline::begin_batch`]; the
    /// last three entries are unused (the array is indexed by `state & 7`, so the fast stage
    /// needs no bounds check).
    expiry: [u32; 8],
    /// Low 32 bits of the adopted tables' generation (0 before the first).
    generation: u32,
    /// Ports of the adopted tables, by index (256 entries: any `u8` port index is valid).
    ports: Box<[PortInfo; 256]>,
    /// New flows of the most common kind take `slow::new_flow_direct` (see
    /// [`Pipeline::set_direct_new_flows`]): `direct_on`, unless the ports' MTUs differ
    /// (`mtu_mixed`; the direct routes check no packet's size against its out port).
    direct: bool,
    /// [`Pipeline::set_direct_new_flows`]'s setting.
    direct_on: bool,
    /// Two ports of the adopted tables have different MTUs (both known): a packet may arrive
    /// larger than the port it leaves on.
    mtu_mixed: bool,
    /// New flows `slow::new_flow_direct` made ([`Pipeline::direct_new_flows`]).
    direct_flows: u64,
}

/// A budget of events per second of the worker's clock: `left` of the second `second`.
#[derive(Debug, Default, Clone, Copy)]
struct PerSecond {
    left: u32,
    second: u32,
}

impl PerSecond {
    /// Takes one event from second `now_s`'s budget of `per_s`; `false` when it is spent.
    #[inline]
    fn take(&mut self, now_s: u32, per_s: u32) -> bool {
        if self.second != now_s {
            self.second = now_s;
            self.left = per_s;
        }
        if self.left == 0 {
            return false;
        }
        self.left -= 1;
        true
    }
}

impl Common {
    #[inline]
    fn admit_new_flow(&mut self) -> bool {
        let rate = self.cfg.new_flows_per_s;
        rate == 0 || self.new_flows.take(self.now_s, rate)
    }

    /// Whether this worker may originate one more ICMP error this second (and takes it from
    /// the budget): RFC 4443 §2.4(f) (MUST for ICMPv6) and RFC 1812 §4.3.2.8 limit the rate,
    /// so a flood of spoofed packets does not turn xlb into a reflector.
    #[inline]
    fn admit_icmp_error(&mut self) -> bool {
        self.icmp_errors.take(self.now_s, ICMP_ERRORS_PER_S)
    }

    #[inline]
    fn next_snat_port(&mut self) -> u16 {
        let (lo, hi) = self.own_snat;
        let p = self.snat_cursor;
        self.snat_cursor = if p >= hi || p < lo { lo } else { p + 1 };
        if p < lo || p > hi { lo } else { p }
    }

    #[inline]
    fn count_packet(&self, svc_id: u32, b: BackendRef) {
        let o = &self.counters.objects;
        if let Some(c) = o.service_packets.get(svc_id as usize) {
            c.inc();
        }
        if let Some(c) = o.backend_packets.get(b.index()) {
            c.inc();
        }
    }

    #[inline(always)]
    fn count_new_flow(&self, svc_id: u32, b: BackendRef) {
        self.counters.event(Event::NewFlow);
        let o = &self.counters.objects;
        if let Some(c) = o.service_flows.get(svc_id as usize) {
            c.inc();
        }
        if let Some(c) = o.backend_flows.get(b.index()) {
            c.inc();
        }
    }

    /// Prefetches what a new flow to backend `b` touches besides the tables: its connection
    /// counts and its packet and flow counters (arrays over every backend slot, so a new flow
    /// to a random backend of thousands misses in L1 on each).
    #[inline]
    fn prefetch_backend_state(&self, b: BackendRef) {
        self.sched.conns.prefetch(b);
        let o = &self.counters.objects;
        for a in [&o.backend_packets, &o.backend_flows] {
            if let Some(c) = a.get(b.index()) {
                crate::prefetch(c);
            }
        }
    }

    /// Expiry of a flow in state `s` seen now (as `now_s + timeout(s)`).
    #[inline]
    fn expiry(&self, s: CtState) -> u32 {
        #[expect(clippy::indexing_slicing, reason = "index < 8 = the array's length")]
        self.expiry[(s as usize) & 7]
    }

    #[inline]
    fn timeout(&self, s: CtState) -> u32 {
        self.timeout.get(s as usize).copied().unwrap_or(self.cfg.timeouts.tcp_close_s)
    }

    /// MAC of port `i` (zero if the tables have no such port).
    #[inline]
    fn port_mac(&self, i: u8) -> [u8; 6] {
        self.ports.get(usize::from(i)).map_or([0; 6], |p| p.mac)
    }

    /// MTU of port `i` (0, none known, if the tables have no such port).
    #[inline]
    fn port_mtu(&self, i: u8) -> u16 {
        self.ports.get(usize::from(i)).map_or(0, |p| p.mtu)
    }

    /// Whether ports `a` and `b` both have a known MTU and the two differ: a flow between
    /// them gets [`flow_flags::MTU_CHECK`].
    #[inline]
    fn mtu_differs(&self, a: u8, b: u8) -> bool {
        let (x, y) = (self.port_mtu(a), self.port_mtu(b));
        x != 0 && y != 0 && x != y
    }

    #[inline]
    fn port(&self, i: u8) -> PortInfo {
        self.ports.get(usize::from(i)).copied().unwrap_or_default()
    }

    /// Records that a flow of backend `b` was removed (expired or evicted).
    fn on_removed(&mut self, r: conntrack::Removed) {
        self.sched.conns.sub(r.backend, r.state.is_active());
        self.counters.event(if r.evicted { Event::ConntrackEvicted } else { Event::ConntrackExpired });
    }
}

/// Verdict tallies of one batch, added to the shared counters once per batch.
#[derive(Debug, Default)]
struct Tally {
    tx: u64,
    pass: u64,
    handoff: u64,
    drops: [u32; DropReason::ALL.len() + 1],
}

impl Tally {
    #[inline]
    fn add(&mut self, v: Verdict) {
        match v {
            Verdict::Tx { .. } => self.tx += 1,
            Verdict::Pass => self.pass += 1,
            Verdict::Drop(r) => {
                if let Some(d) = self.drops.get_mut(r as usize) {
                    *d += 1;
                }
            }
            Verdict::Handoff { .. } => self.handoff += 1,
        }
    }

    fn flush(&self, k: &WorkerCounters, rx: u64) {
        k.rx.add(rx);
        if self.tx > 0 {
            k.tx.add(self.tx);
        }
        if self.pass > 0 {
            k.pass.add(self.pass);
        }
        if self.handoff > 0
            && let Some(c) = k.events.get(Event::HandedOff as usize)
        {
            c.add(self.handoff);
        }
        for (i, n) in self.drops.iter().enumerate() {
            if *n > 0
                && let Some(c) = k.drops.get(i)
            {
                c.add(u64::from(*n));
            }
        }
    }
}

/// One worker's pipeline: conntrack, fragment and affinity tables, scheduler state, counters.
#[derive(Debug)]
pub struct Pipeline {
    fam: Families,
    c: Common,
    /// Packets of the current batch waiting for the slow path (bit `i` = packet `i`).
    slow: u64,
    /// Batches still to run on the general stages before [`Pipeline::batch_shaped`] is tried
    /// again.
    shaped_backoff: u8,
    /// Batches [`Pipeline::batch_shaped`] ran ([`Pipeline::shaped_batches`]), IPv4 and IPv6.
    shaped: [u64; 2],
    /// Packets stages 4 and 5 took ([`Pipeline::slow_packets`]).
    slow_packets: u64,
    /// Lane of each packet of the current batch (with [`V6_LANE`] set for an IPv6 packet), or
    /// [`NO_LANE`] if the fast parser did not take it, for the slow path.
    lane_of: [u8; BATCH],
}

/// A flow for `xlb conntrack`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlowDump {
    /// Client address.
    pub client: std::net::IpAddr,
    /// Client port.
    pub cport: u16,
    /// Frontend address.
    pub vip: std::net::IpAddr,
    /// Frontend port.
    pub vport: u16,
    /// IP protocol.
    pub proto: u8,
    /// Backend ref.
    pub backend: BackendRef,
    /// State.
    pub state: CtState,
    /// Seconds until expiry.
    pub expires_in_s: u32,
    /// SNAT port, if SNAT.
    pub snat_port: Option<u16>,
}

impl Pipeline {
    /// A pipeline with empty state and its own affinity table; `counters` is shared with
    /// metrics readers.
    pub fn new(cfg: PipelineConfig, seed: u64) -> Self {
        let affinity = Arc::new(AffinityTable::new(cfg.affinity_capacity));
        Self::with_affinity(cfg, seed, affinity)
    }

    /// A pipeline that shares `affinity` with the node's other workers.
    pub fn with_affinity(cfg: PipelineConfig, seed: u64, affinity: Arc<AffinityTable>) -> Self {
        let counters = Arc::new(WorkerCounters::new(cfg.max_services, cfg.max_backends));
        let fam = Families { v4: FamState::new(&cfg), v6: FamState::new(&cfg) };
        counters.ct_capacity.set(fam.v4.ct.capacity() as u64);
        Self {
            fam,
            c: Common {
                snat_cursor: cfg.own_snat_ports().0,
                own_snat: cfg.own_snat_ports(),
                timeout: cfg.timeouts.by_state(),
                expiry: expiry_at(1, cfg.timeouts.by_state()),
                cfg,
                sched: SchedState::new(seed),
                counters,
                now_s: 1,
                now_ms: 0,
                last_sweep_ms: 0,
                new_flows: PerSecond::default(),
                icmp_errors: PerSecond::default(),
                affinity,
                generation: 0,
                ports: Box::new([PortInfo::default(); 256]),
                direct: true,
                direct_on: true,
                mtu_mixed: false,
                direct_flows: 0,
            },
            slow: 0,
            shaped_backoff: 0,
            shaped: [0; 2],
            slow_packets: 0,
            lane_of: [NO_LANE; BATCH],
        }
    }

    /// Commits the memory of both families' flow tables now ([`Conntrack::prefault`]); returns
    /// the bytes committed. Workers call it once, before they take traffic.
    pub fn prefault(&mut self) -> usize {
        self.fam.v4.ct.prefault() + self.fam.v6.ct.prefault()
    }

    /// Conntrack records of both families' started sweep steps that [`Pipeline::begin_batch`]
    /// has not visited yet ([`Conntrack::sweep_pending`]): 0 once the steps are done.
    pub fn sweep_pending(&self) -> u32 {
        self.fam.v4.ct.sweep_pending() + self.fam.v6.ct.sweep_pending()
    }

    /// The counters this worker writes.
    pub fn counters(&self) -> &Arc<WorkerCounters> {
        &self.c.counters
    }

    /// Configuration.
    pub fn config(&self) -> &PipelineConfig {
        &self.c.cfg
    }

    /// Per-family state (for inspection and tests).
    pub fn families(&self) -> &Families {
        &self.fam
    }

    /// Call once per RX batch: adopt `t` (allocation happens here, if the generation changed),
    /// set the clock (`now_ms`, milliseconds of any monotonic clock) and run one conntrack sweep
    /// step per family when [`PipelineConfig::sweep_interval_ms`] has passed.
    pub fn begin_batch(&mut self, t: &Tables, now_ms: u64) {
        self.c.now_ms = now_ms;
        self.c.now_s = u32::try_from(now_ms / 1000).unwrap_or(u32::MAX).saturating_add(1);
        self.c.expiry = expiry_at(self.c.now_s, self.c.timeout);
        self.c.sched.sync(t);
        let generation = gen32(t);
        if self.c.generation != generation {
            self.c.generation = generation;
            for (i, slot) in self.c.ports.iter_mut().enumerate() {
                *slot = t.ports.get(i).map(|p| PortInfo { mac: p.mac, mtu: p.mtu, known: true }).unwrap_or_default();
            }
            let mut mtus = t.ports.iter().map(|p| p.mtu).filter(|m| *m != 0);
            let first = mtus.next();
            self.c.mtu_mixed = mtus.any(|m| Some(m) != first);
            self.c.direct = self.c.direct_on && !self.c.mtu_mixed;
        }
        if now_ms.saturating_sub(self.c.last_sweep_ms) >= self.c.cfg.sweep_interval_ms {
            self.c.last_sweep_ms = now_ms;
            self.fam.v4.ct.sweep_begin();
            self.fam.v6.ct.sweep_begin();
        }
        let (now, c) = (self.c.now_s, &mut self.c);
        self.fam.v4.ct.sweep_some(now, SWEEP_BUDGET, |r| c.on_removed(r));
        self.fam.v6.ct.sweep_some(now, SWEEP_BUDGET, |r| c.on_removed(r));
        self.c.counters.ct_entries.set((self.fam.v4.ct.len() + self.fam.v6.ct.len()) as u64);
    }

    /// Processes one frame that arrived on `in_port`: a batch of one. The frame may be
    /// rewritten in place, grown (encapsulation: into the headroom if there is some, else by
    /// moving the packet into the tailroom) or replaced by a reply in place (ICMP error, TCP
    /// RST); the result is `pkt.buf[pkt.head..pkt.head + pkt.len]`.
    pub fn process(&mut self, t: &Tables, pkt: &mut Packet<'_>, in_port: u8) -> Verdict {
        let mut v = [Verdict::Pass];
        self.process_batch(t, core::slice::from_mut(pkt), in_port, &mut v);
        let [v] = v;
        v
    }

    /// Processes a batch of frames that arrived on `in_port` (see the module docs):
    /// `verdicts[i]` is the verdict of `pkts[i]`, as [`Pipeline::process`] one after the other
    /// would give it. `verdicts` must be at least as long as `pkts` (extra frames get no verdict
    /// and are left alone); slices longer than [`BATCH`] are worked on [`BATCH`] at a time.
    pub fn process_batch(&mut self, t: &Tables, pkts: &mut [Packet<'_>], in_port: u8, verdicts: &mut [Verdict]) {
        let n = pkts.len().min(verdicts.len());
        let mut at = 0;
        while at < n {
            let end = (at + BATCH).min(n);
            if let (Some(p), Some(v)) = (pkts.get_mut(at..end), verdicts.get_mut(at..end)) {
                self.batch(t, p, in_port, v);
            }
            at = end;
        }
    }

    /// Stage 1: parse, hash, prefetch the home bucket; every other packet goes to the slow
    /// path.
    #[inline]
    fn stage1(&mut self, pkts: &[Packet<'_>], n: usize) {
        let Families { v4, v6 } = &mut self.fam;
        v4.ct.mark();
        v6.ct.mark();
        let (view4, lanes4) = (v4.ct.view(), &mut v4.lanes);
        let (view6, lanes6) = (v6.ct.view(), &mut v6.lanes);
        lanes4.n = 0;
        lanes6.n = 0;
        let mut slow = 0u64;
        let pkts = pkts.get(..n.min(BATCH)).unwrap_or(&[]);
        for (i, (pkt, lane_of)) in pkts.iter().zip(self.lane_of.iter_mut()).enumerate() {
            let f = pkt.frame();
            *lane_of = match wire::parse_fast_frame(f) {
                Some(FastFrame::V4(x)) => lane_for::<V4>(&view4, lanes4, i, &x),
                Some(FastFrame::V6(x)) => lane_for::<V6>(&view6, lanes6, i, &x) | V6_LANE,
                None => {
                    slow |= 1 << i;
                    NO_LANE
                }
            };
        }
        self.slow = slow;
    }

    /// Stage 1 for a batch of family `A`'s common shape alone (`Fam::parse_shaped`: TCP
    /// behind an untagged Ethernet header): parse, hash, prefetch the home bucket. Returns
    /// how many frames it took before one of another shape (`n` if none), whose lanes the
    /// general [`Pipeline::stage1`] then makes again: carrying on from that frame instead made
    /// every batch of the general path about 20 instructions per packet slower in callgrind.
    #[inline]
    fn stage1_shaped<A: Fam>(&mut self, pkts: &[Packet<'_>], n: usize) -> usize {
        let st = A::state(&mut self.fam);
        let (view, Lanes { l, n: count, .. }) = (st.ct.view(), &mut st.lanes);
        *count = 0;
        let pkts = pkts.get(..n.min(BATCH)).unwrap_or(&[]);
        // Packet `i` takes lane `i`, walked together (no index to check); the count is set
        // once, at the end, and so is each packet's lane (in a loop of its own: in this one it
        // kept a register, 2 instructions per packet, callgrind).
        for (i, (pkt, lane)) in pkts.iter().zip(l.iter_mut()).enumerate() {
            let Some(x) = A::parse_shaped(pkt.frame()) else {
                *count = i;
                return i;
            };
            let key = FlowKey { src: x.src, dst: x.dst, sport: x.sport, dport: x.dport, proto: x.proto };
            let hash = view.hash(&key);
            let home = view.prefetch_home(hash);
            Lanes::fill(lane, key, hash, home, i, &x);
        }
        for (i, lane_of) in self.lane_of.iter_mut().take(pkts.len()).enumerate() {
            #[expect(clippy::cast_possible_truncation, reason = "i < BATCH = 64")]
            let lane = i as u8;
            *lane_of = lane | A::LANE_FLAG;
        }
        *count = pkts.len();
        pkts.len()
    }

    /// A batch whose frames all have family `A`'s common shape, through stage 1's and stage
    /// 3's instances for it (the shape's offsets and protocol are constants there). `Err(k)`,
    /// with nothing done but parsing frames `..k`, when frame `k` has another shape. Out of
    /// line, as is [`Pipeline::batch`], so that each path is compiled on its own (with either
    /// inlined into the other, the general path measured 20 to 50 instructions per packet
    /// more).
    #[inline(never)]
    fn batch_shaped<A: Fam>(
        &mut self,
        t: &Tables,
        pkts: &mut [Packet<'_>],
        in_port: u8,
        verdicts: &mut [Verdict],
    ) -> Result<(), usize> {
        let n = pkts.len().min(BATCH);
        let k = self.stage1_shaped::<A>(pkts, n);
        if k < n {
            return Err(k);
        }
        self.fam.v4.ct.mark();
        self.fam.v6.ct.mark();
        A::clear_other(&mut self.fam);
        self.slow = 0;
        let st = A::state(&mut self.fam);
        stage_tags(st, self.c.now_s);
        let (slow, tx) = fast::stage_shaped::<A>(st, &mut self.c, pkts, verdicts);
        self.slow |= slow;
        if let Some(x) = self.shaped.get_mut(usize::from(A::LANE_FLAG != 0)) {
            *x += 1;
        }
        self.finish_batch(t, pkts, in_port, verdicts, n, tx);
        Ok(())
    }

    /// One batch of at most [`BATCH`] packets: [`Pipeline::batch_shaped`] when all its frames
    /// have one of the common shapes (IPv4 TCP, else IPv6 TCP, untagged), else the general
    /// stages. After a batch whose first frames had that shape and a later one did not (its
    /// first frames were parsed twice), the next [`SHAPED_BACKOFF`] batches take the general
    /// stages at once: with shapes mixed in the traffic, most batches would be parsed twice in
    /// part.
    #[inline(never)]
    fn batch(&mut self, t: &Tables, pkts: &mut [Packet<'_>], in_port: u8, verdicts: &mut [Verdict]) {
        if self.shaped_backoff > 0 {
            self.shaped_backoff -= 1;
        } else {
            let shaped = match self.batch_shaped::<V4>(t, pkts, in_port, verdicts) {
                Err(0) => self.batch_shaped::<V6>(t, pkts, in_port, verdicts),
                r => r,
            };
            match shaped {
                Ok(()) => return,
                Err(0) => {}
                Err(_) => self.shaped_backoff = SHAPED_BACKOFF,
            }
        }
        let n = pkts.len().min(BATCH);
        self.stage1(pkts, n);
        // Stage 2: tags, prefetch the record of the first match.
        stage_tags(&mut self.fam.v4, self.c.now_s);
        stage_tags(&mut self.fam.v6, self.c.now_s);
        // Stage 3: known flows with a current record: rewrite from the record.
        let (slow4, tx4) = fast::stage::<V4>(&mut self.fam.v4, &mut self.c, pkts, verdicts);
        let (slow6, tx6) = fast::stage::<V6>(&mut self.fam.v6, &mut self.c, pkts, verdicts);
        self.slow |= slow4 | slow6;
        self.finish_batch(t, pkts, in_port, verdicts, n, tx4 + tx6);
    }

    /// Stages 4 and 5 for the packets stage 3 left, then the deferred records' marks and the
    /// batch's counters (`tx`: packets stage 3 transmitted).
    #[inline(always)]
    fn finish_batch(
        &mut self,
        t: &Tables,
        pkts: &mut [Packet<'_>],
        in_port: u8,
        verdicts: &mut [Verdict],
        n: usize,
        tx: u64,
    ) {
        if self.slow != 0 {
            self.stages_slow(t, pkts, in_port, verdicts);
        }
        self.fam.v4.end_batch();
        self.fam.v6.end_batch();
        let mut tally = Tally { tx, ..Tally::default() };
        let mut rest = self.slow;
        while rest != 0 {
            let i = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            if let Some(v) = verdicts.get(i) {
                tally.add(*v);
            }
        }
        tally.flush(&self.c.counters, n as u64);
    }

    /// Stages 4 and 5 for the packets in `self.slow`. Kept out of line: the fast stages'
    /// code (the whole of an established packet's path) is then the same whatever is done
    /// here.
    #[inline(never)]
    fn stages_slow(&mut self, t: &Tables, pkts: &mut [Packet<'_>], in_port: u8, verdicts: &mut [Verdict]) {
        self.slow_packets += u64::from(self.slow.count_ones());
        // Stage 4: the misses' frontends and Maglev picks, prefetched.
        let mut m = slow::Misses::new();
        slow::stage_misses::<V4>(&mut self.fam.v4, &self.c, t, self.slow, &mut m);
        slow::stage_misses::<V6>(&mut self.fam.v6, &self.c, t, self.slow, &mut m);
        // Stage 5: everything else, in arrival order. When both flow tables have room for a
        // new flow per packet left, runs of new flows on the direct routes go through
        // `slow::run_direct`, which borrows the table once per run; otherwise (a full table,
        // where inserts evict) each packet goes alone, and that loop's code is what it was
        // before runs (a SYN flood into a full table measured 26 instructions more per packet
        // with the runs' checks in it, docs/benchmarks.md).
        let n = self.slow.count_ones() as usize;
        let (v4, v6) = (&self.fam.v4.ct, &self.fam.v6.ct);
        if v4.len() + n <= v4.capacity() && v6.len() + n <= v6.capacity() {
            self.stage_runs(t, pkts, in_port, verdicts, &m);
        } else {
            self.stage_each(t, pkts, in_port, verdicts, &m);
        }
    }

    /// Stage 5 when both flow tables have room for every packet left: runs of new flows on
    /// the direct routes through `slow::run_direct`, every other packet alone.
    #[inline(always)]
    fn stage_runs(
        &mut self,
        t: &Tables,
        pkts: &mut [Packet<'_>],
        in_port: u8,
        verdicts: &mut [Verdict],
        m: &slow::Misses<'_>,
    ) {
        let mut rest = self.slow;
        while rest != 0 {
            let i = rest.trailing_zeros() as usize & 63;
            let lane = self.lane_of.get(i).copied().unwrap_or(NO_LANE);
            if lane != NO_LANE && m.is_direct_or_drawn(i) {
                let before = rest;
                let v6 = lane & V6_LANE != 0;
                let (fam, c, lane_of) = (&mut self.fam, &mut self.c, &self.lane_of);
                let stop = if v6 {
                    slow::run_direct::<V6>(&mut fam.v6, c, t, pkts, verdicts, lane_of, m, &mut rest, in_port)
                } else {
                    slow::run_direct::<V4>(&mut fam.v4, c, t, pkts, verdicts, lane_of, m, &mut rest, in_port)
                };
                match stop {
                    slow::RunStop::General(j, drawn) => {
                        let (Some(pkt), Some(v)) = (pkts.get_mut(j), verdicts.get_mut(j)) else { continue };
                        let l = usize::from(self.lane_of.get(j).copied().unwrap_or(NO_LANE) & !V6_LANE);
                        let (fam, c) = (&mut self.fam, &mut self.c);
                        *v = if v6 {
                            slow::run_lane_general::<V6>(fam, c, t, pkt, l, m, j, in_port, drawn)
                        } else {
                            slow::run_lane_general::<V4>(fam, c, t, pkt, l, m, j, in_port, drawn)
                        };
                        continue;
                    }
                    // It handled packets: the loop goes on from where it stopped.
                    slow::RunStop::Left if rest != before => continue,
                    // It took none: this packet goes alone.
                    slow::RunStop::Left => {}
                }
            }
            rest &= rest - 1;
            self.stage_one(t, pkts, in_port, verdicts, m, i);
        }
    }

    /// Stage 5, each packet alone.
    #[inline(always)]
    fn stage_each(
        &mut self,
        t: &Tables,
        pkts: &mut [Packet<'_>],
        in_port: u8,
        verdicts: &mut [Verdict],
        m: &slow::Misses<'_>,
    ) {
        let mut rest = self.slow;
        while rest != 0 {
            let i = rest.trailing_zeros() as usize & 63;
            rest &= rest - 1;
            self.stage_one(t, pkts, in_port, verdicts, m, i);
        }
    }

    /// Stage 5 for packet `i` alone.
    #[inline(always)]
    fn stage_one(
        &mut self,
        t: &Tables,
        pkts: &mut [Packet<'_>],
        in_port: u8,
        verdicts: &mut [Verdict],
        m: &slow::Misses<'_>,
        i: usize,
    ) {
        let (Some(pkt), Some(v)) = (pkts.get_mut(i), verdicts.get_mut(i)) else { return };
        let lane = self.lane_of.get(i).copied().unwrap_or(NO_LANE);
        let l = usize::from(lane & !V6_LANE);
        let (fam, c) = (&mut self.fam, &mut self.c);
        *v = match lane {
            NO_LANE => slow::run_frame(fam, c, t, pkt, in_port),
            _ if lane & V6_LANE != 0 => slow::run_lane::<V6>(fam, c, t, pkt, l, m, i, in_port),
            _ => slow::run_lane::<V4>(fam, c, t, pkt, l, m, i, in_port),
        };
    }

    /// Lists tracked flows of both families (for `xlb conntrack`; allocates).
    pub fn dump_flows(&self) -> Vec<FlowDump> {
        let mut out = Vec::new();
        let now = self.c.now_s;
        fn push<A: CtFamily>(ct: &Conntrack<A>, now: u32, out: &mut Vec<FlowDump>) {
            ct.for_each(|_, r| {
                let (client, vip, backend, expires_s, flags) = (r.client, r.vip, r.backend, r.expires_s, r.flags);
                out.push(FlowDump {
                    client: client.to_ip(),
                    cport: r.cport,
                    vip: vip.to_ip(),
                    vport: r.vport,
                    proto: r.proto,
                    backend,
                    state: r.ct_state(),
                    expires_in_s: expires_s.saturating_sub(now),
                    snat_port: (flags & flow_flags::SNAT != 0).then_some(r.reply_dport),
                });
            });
        }
        push(&self.fam.v4.ct, now, &mut out);
        push(&self.fam.v6.ct, now, &mut out);
        out
    }

    /// Whether new flows of the most common kind (a fast-parsed packet to a Maglev service
    /// without affinity in NAT mode, no source ranges, no SNAT, a backend with one next hop)
    /// take the slow path's direct route for them (`true`, the default) or the general one,
    /// which gives the same verdicts, bytes, flows and counters: the differential tests
    /// (`dataplane/tests/direct_new_flow.rs`) and `callgrind-pipeline` compare the two.
    /// While the tables' ports differ in MTU, every new flow takes the general route, which
    /// checks a packet's size against the port it leaves on.
    pub fn set_direct_new_flows(&mut self, on: bool) {
        self.c.direct_on = on;
        self.c.direct = on && !self.c.mtu_mixed;
    }

    /// Replaces both families' flow tables with empty ones hashed with `seeds`
    /// ([`Conntrack::with_seeds`]) instead of random seeds. For tests that compare two workers
    /// packet by packet: which flow a full table evicts depends on where the entries lie, so
    /// two workers only agree when their tables share seeds. Call it on a new pipeline, before
    /// its first packet: the flows of a table in use would be dropped without their
    /// connection counts being taken back.
    pub fn set_flow_table_seeds(&mut self, seeds: [u64; 5]) {
        let cap = self.c.cfg.conntrack_capacity;
        self.fam.v4.ct = Conntrack::with_seeds(cap, seeds);
        self.fam.v6.ct = Conntrack::with_seeds(cap, seeds);
    }

    /// How many new flows took the direct route of [`Pipeline::set_direct_new_flows`] since
    /// the pipeline was made: tests check that their traffic reached it, and
    /// `callgrind-pipeline` that the `new_flow` profile measures it. Not a metric: the flows
    /// are counted in the `new_flow` event either way.
    pub fn direct_new_flows(&self) -> u64 {
        self.c.direct_flows
    }

    /// How many batches took the common shapes' stages (`Pipeline::batch_shaped`) since the
    /// pipeline was made, IPv4 and IPv6: tests check that their batches reached them. Not a
    /// metric.
    pub fn shaped_batches(&self) -> [u64; 2] {
        self.shaped
    }

    /// How many packets went to the slow path (stages 4 and 5) since the pipeline was made:
    /// tests check that known flows' packets are rewritten by the fast stage instead, from
    /// their records (the slow path gives the same frames). Counted in the slow path, so the
    /// fast stages carry nothing for it. Not a metric.
    pub fn slow_packets(&self) -> u64 {
        self.slow_packets
    }

    /// Active and inactive connection counts this worker holds for a backend.
    pub fn connections(&self, r: BackendRef) -> (u32, u32) {
        self.c.sched.conns.get(r)
    }
}

/// `now_s` plus each state's timeout (saturating), by [`CtState`] number; 8 entries so that
/// `state & 7` indexes it.
fn expiry_at(now_s: u32, timeout: [u32; 5]) -> [u32; 8] {
    let mut e = [now_s; 8];
    for (e, t) in e.iter_mut().zip(timeout) {
        *e = now_s.saturating_add(t);
    }
    e
}

/// The low 32 bits of the tables' generation, never 0 for real tables (0 marks a record whose
/// rewrite was never computed).
#[inline]
fn gen32(t: &Tables) -> u32 {
    #[expect(clippy::cast_possible_truncation, reason = "the low 32 bits, compared for equality")]
    let g = t.generation as u32;
    g | u32::from(g == 0 && t.generation != 0)
}

/// Batches that run on the general stages after one of mixed shapes (see [`Pipeline::batch`]):
/// traffic of mixed shapes then pays for the frames parsed twice in at most one batch of 17.
const SHAPED_BACKOFF: u8 = 16;

/// `lane_of` value of a packet the fast parser did not take.
const NO_LANE: u8 = u8::MAX;
/// `lane_of` bit of an IPv6 lane (lane indices are below [`BATCH`] = 64).
const V6_LANE: u8 = 0x40;

/// Stage 1 for one fast-parsed packet: its key, hash, a prefetch of its home bucket, and its
/// lane; returns the lane index.
#[inline]
fn lane_for<A: CtFamily>(view: &conntrack::View<'_, A>, lanes: &mut Lanes<A>, i: usize, x: &Fast<A>) -> u8 {
    let key = FlowKey { src: x.src, dst: x.dst, sport: x.sport, dport: x.dport, proto: x.proto };
    let hash = view.hash(&key);
    let home = view.prefetch_home(hash);
    lanes.push(key, hash, home, i, x)
}

/// Stage 2: compare the tags of each lane's home bucket, prefetch the record of the first match.
/// When the table is full, a lane with no matching tag is a new flow whose insert will evict:
/// prefetch the record of its victim (the miss stage then prefetches the victim's other
/// bucket, [`conntrack::View::prefetch_victim`]). Always inlined: with three callers
/// (the shaped path and both families of the general one) the compiler otherwise calls it.
#[inline(always)]
fn stage_tags<A: CtFamily>(st: &mut FamState<A>, now_s: u32) {
    let view = st.ct.view();
    for l in st.lanes.as_mut_slice() {
        let p = view.probe_at(l.probe.bucket, l.hash);
        // The bucket is stage 1's; `miss` was cleared there too.
        (l.probe.first, l.probe.slot, l.probe.more) = (p.first, p.slot, p.more);
    }
    st.lanes.victims = st.ct.len() >= st.ct.capacity();
    if st.lanes.victims {
        stage_victims(st, now_s);
    }
}

/// The full-table part of stage 2: each lane whose key matched no tag notes the victim its
/// insert would evict and prefetches its record. Out of line, so that the fast stages' code
/// (all of an established packet's path) does not carry it.
#[inline(never)]
fn stage_victims<A: CtFamily>(st: &mut FamState<A>, now_s: u32) {
    let (lanes, view) = (&mut st.lanes, st.ct.view());
    for (l, v) in lanes.l.get(..lanes.n).unwrap_or(&[]).iter().zip(lanes.victim.iter_mut()) {
        *v = if l.probe.first == conntrack::Probe::NONE {
            view.prefetch_victim(l.hash, now_s, 0)
        } else {
            conntrack::Probe::NONE
        };
    }
}
